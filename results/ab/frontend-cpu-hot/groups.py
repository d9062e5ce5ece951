import collections
import pstats
import sys

for f in sys.argv[1:]:
    st = pstats.Stats(f).stats
    reqs = sum(v[0] for k, v in st.items() if k[2] == "_checked_response")
    tot = sum(v[2] for v in st.values())
    g = collections.Counter()
    rules = [
        ("uvicorn", "uvicorn (httptools protocol, ASGI cycle)"),
        ("server/http/limits", "our protocol subclass + coalesced send (incl. socket write)"),
        ("observe/logs", "access log"),
        ("logwriter", "access log"),
        ("SimpleQueue", "access log"),
        ("ts_families", "metrics (TorchServe families)"),
        ("prometheus_client", "metrics (Prometheus)"),
        ("observe/metrics", "metrics (Prometheus)"),
        ("ts_metrics", "metrics (Prometheus)"),
        ("oip_stats", "Triton statistics"),
        ("server/http/", "HTTP adapter (routing, body, wire request, response)"),
        ("server/plane", "plane (exchange, admission glue)"),
        ("admission", "admission / queue"),
        ("serving/queue", "admission / queue"),
        ("serving/requests", "admission / queue"),
        ("serving/protocol", "IPC framing (encode/decode)"),
        ("streams.py", "IPC socket writes"),
        ("handle.py", "worker handle (send/read batches)"),
        ("slot.py", "batching + dispatch"),
        ("batches.py", "batching + dispatch"),
        ("asyncio", "asyncio (events, futures, locks)"),
    ]
    for k, v in st.items():
        key = k[0] + ":" + k[2]
        for pat, name in rules:
            if pat in key:
                g[name] += v[2]
                break
        else:
            g["other (builtins, json, ...)"] += v[2]
    print(f, "requests", reqs)
    for name, t in g.most_common():
        print(f"  {name:60s} {100 * t / tot:5.1f} %")
