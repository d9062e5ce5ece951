"""The ``slow`` parity archive's handler: loading takes a few seconds (the import sleeps), so a
request issued while its worker starts meets a model that is still loading."""

import time

time.sleep(4)


def handle(data, context):
    if data is None:
        return None
    return [{"ok": True} for _ in data]
