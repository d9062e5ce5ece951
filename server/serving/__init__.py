"""The model pool: where a request waits and is dispatched.

``registry`` -> ``model`` (a ModelVersion) -> ``queue`` (the batching queue) -> ``slot`` (one
worker's batch loop) -> ``handle`` (the frontend's handle on a worker process) -> ``protocol`` (the
bytes on the socketpair). ``devices`` places slots on GPUs, ``fetch`` downloads archives,
``worker_env`` is the environment a worker starts with. Calls go only down this list; torch is
never imported here.
"""
