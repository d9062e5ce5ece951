"""A handler whose initialization fails: every worker of its model fails to load."""


def handle(data, context):
    raise RuntimeError("fails to load on purpose")
