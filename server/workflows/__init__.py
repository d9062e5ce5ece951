"""TorchServe's workflows (``.war``): a DAG of model nodes and function nodes behind one
``/wfpredict`` request. ``archive`` finds and unpacks the ``.war`` (the model archives' safety
checks), ``spec`` reads its YAML and DAG as TorchServe 0.12 does, ``manager`` registers every node
as a model ``{workflow}__{node}`` (function nodes in workers of their own), ``executor`` runs the
DAG with each node request through the data plane's exchange, ``startup`` registers the
``load_workflows`` at start. The HTTP adapters are ``server/http/workflow_routes.py`` and
``server/http/wfpredict.py``. Torch-free."""
