import pstats
import sys

for f in sys.argv[1:]:
    s = pstats.Stats(f)
    st = s.stats
    reqs = sum(v[0] for k, v in st.items() if k[2] == "_checked_response")
    calls = sum(v[1] for v in st.values())
    py = sum(v[1] for k, v in st.items() if not k[0].startswith("~"))

    groups = {
        n: sum(v[1] for k, v in st.items() if n in k[0]) / reqs
        for n in (
            "observe/logs",
            "logwriter",
            "ts_families",
            "prometheus_client",
            "observe/metrics",
            "oip_stats",
        )
    }
    print(
        f,
        "requests",
        reqs,
        "calls/request",
        round(calls / reqs, 1),
        "python-function calls/request",
        round(py / reqs, 1),
        {k: round(v, 2) for k, v in groups.items()},
        "SimpleQueue.put/request",
        round(sum(v[1] for k, v in st.items() if "SimpleQueue" in k[2]) / reqs, 3),
        "time.time/request",
        round(sum(v[1] for k, v in st.items() if k[2] == "<built-in method time.time>") / reqs, 2),
    )
