"""torchbay.handlers.runtime: what only the worker (and ``torchbay verify``) uses to run a handler.

A handler author imports ``torchbay.handlers`` (BaseHandler, Context, the built-in handlers,
errors, metrics, utils, streaming, testing); the worker imports this package: the Service
(``service.py``: a batch in, one response per request out), how a handler is found
(``resolve.py``, TorchServe's ``ts.*`` aliases included), the request envelopes and OIP codecs
(``envelopes.py``, ``oip*.py``), the responses (``responses.py``), the worker's side of streaming
(``streams.py``), and the model loaders and device path (``loading.py``, ``aoti_loader.py``,
``int8.py``, ``accel.py``, ``accel_cuda.py``).

Imports go one way: this package imports the author-facing modules, never the reverse, except
through two seams (tests/architecture checks both): ``base_handler`` loads its model and runs it
with ``loading`` and ``accel`` (BaseHandler's ``initialize`` and ``run_model``), and ``testing``
runs a handler through the ``Service`` exactly as the worker does.
"""
