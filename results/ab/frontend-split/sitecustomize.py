import os

exp = set(filter(None, os.environ.get("TB_EXP", "").split(",")))
if exp:
    if "metrics" in exp:
        from torchbay.server.observe import metrics as m

        m.ServerMetrics.request_done = lambda self, r: None
        m.ServerMetrics.batch_done = lambda self, mv, r: None
    if "stats" in exp:
        from torchbay.server.observe import oip_stats as o

        o.OipStats.request_done = lambda self, r: None
        o.OipStats.batch_done = lambda self, mv, r: None
    if "count" in exp:
        from torchbay.server.observe import ts_metrics as t

        t.counting = lambda app, metrics: app
        from torchbay.server.http import apps

        apps.counting = t.counting
    if "log" in exp:
        import logging

        logging.getLogger("torchbay.access").disabled = True
