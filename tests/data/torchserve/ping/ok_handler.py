"""A handler that loads and answers "ok" to every request."""


def handle(data, context):
    if data is None:  # TorchServe's initialization call of a module-level handler
        return None
    return ["ok" for _ in data]
