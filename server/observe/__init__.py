"""Observability: where a request is counted.

``metrics`` (the Prometheus registry and the per-request/per-batch observers), ``custom_metrics``
(metrics handlers emit), ``system_metrics`` (host and GPU collectors), ``logs`` (access log and
JSON formatter). Observers are handed down to ``serving`` and ``http`` at construction; they read
from ``serving`` but nothing in ``serving`` imports observe.
"""
