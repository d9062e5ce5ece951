"""How a handler written for TorchServe reads SageMaker's request headers: from the request's
properties (``get_request_properties()``, a dict TorchServe fills with the client's spelling of
each name) and from ``context.get_request_header``. Answers one JSON object per request."""

import json

NAMES = (
    "X-Amzn-SageMaker-Custom-Attributes",
    "X-Amzn-SageMaker-Target-Model",
    "Content-Type",
    "Accept",
)


def handle(data, context):
    if data is None:  # TorchServe calls a module-level handle once at load, with None
        return None
    out = []
    for idx in range(len(data)):
        props = context.request_processor[idx].get_request_properties()
        out.append(
            json.dumps(
                {
                    "get": {name: props.get(name) for name in NAMES},
                    "item": {name: props[name] for name in NAMES if name in props},
                    "header": {name: context.get_request_header(idx, name) for name in NAMES},
                }
            )
        )
    return out
