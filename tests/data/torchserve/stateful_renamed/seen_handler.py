"""A sequence model's handler that answers what it was given: the sequence id the context
reads, the context's three header keys, the request's sequence headers (the names holding
"seq" or "session"), and how many requests of that id it has run. Imports nothing but the
standard library, so the same file runs under TorchServe 0.12 and torchbay."""

import json

_counts = {}
_context = None


def handle(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    out = []
    for idx, _ in enumerate(data):
        sequence_id = context.get_sequence_id(idx)
        _counts[sequence_id] = _counts.get(sequence_id, 0) + 1
        headers = context.get_all_request_header(idx)
        seen = {
            str(k).lower(): v
            for k, v in headers.items()
            if "seq" in str(k).lower() or "session" in str(k).lower()
        }
        keys = [
            context.header_key_sequence_id,
            context.header_key_sequence_start,
            context.header_key_sequence_end,
        ]
        reply = {"id": sequence_id, "n": _counts[sequence_id], "headers": seen, "keys": keys}
        out.append(json.dumps(reply, sort_keys=True))
    return out
