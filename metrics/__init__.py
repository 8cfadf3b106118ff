"""Prometheus metrics of gpuclaimctl and its machinery.

Each module creates its metrics in a registry it is given, when asked;
importing this package registers nothing. ``metrics`` imports nothing of
ours: ``metrics.workqueue`` satisfies ``workqueue``'s ``MetricsProvider``
protocol structurally.
"""
