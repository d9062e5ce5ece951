"""torchbay.server: the model server.

A request enters at ``http/`` (the listeners), waits in ``serving/`` (registry -> model version ->
queue -> slot -> worker handle), runs in ``worker/`` (the child process, the only place torch is
imported) and is counted in ``observe/``. ``config/`` and ``errors`` import nothing of ours above
them; ``serve`` wires the parts together and ``cli`` is the ``serve`` verb. See ARCHITECTURE.md.
"""
