"""A handler whose initialization takes 15 s (a worker that loads slowly); it answers "ok"."""

import time


def handle(data, context):
    if data is None:  # TorchServe's initialization call of a module-level handler
        time.sleep(15)
        return None
    return ["ok" for _ in data]
