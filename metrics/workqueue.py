"""Prometheus metrics of the work queues, as client-go's queues export them.

Names, help texts, the ``name`` label and the histogram buckets are those
of Kubernetes' workqueue metrics provider
(k8s.io/component-base v0.37.2, metrics/prometheus/workqueue/metrics.go),
so dashboards and alerts written for Kubernetes controllers work unchanged.

``PrometheusWorkqueueMetricsProvider`` satisfies ``workqueue``'s
``MetricsProvider`` protocol structurally; this module imports nothing of
ours. Metrics are created and registered in the given registry when the
provider is constructed, never at import.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SUBSYSTEM = "workqueue"
LABEL = "name"


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    """Go's ``prometheus.ExponentialBuckets``, computed the same way.

    Repeated multiplication, not ``start * factor**i``: the float rounding
    then matches Go's, and so do the ``le`` labels (``9.999999999999999e-06``).
    """
    if count < 1 or start <= 0 or factor <= 1:
        raise ValueError("need count >= 1, start > 0 and factor > 1")
    buckets = []
    bound = start
    for _ in range(count):
        buckets.append(bound)
        bound *= factor
    return buckets


# ExponentialBuckets(10e-9, 10, 10): 10 ns up to 10 s.
DURATION_BUCKETS = tuple(exponential_buckets(10e-9, 10, 10))


class PrometheusWorkqueueMetricsProvider:
    """Creates client-go's workqueue metric families in ``registry``; one label value per queue name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._depth = Gauge(
            "depth",
            "Current depth of workqueue",
            [LABEL],
            subsystem=SUBSYSTEM,
            registry=registry,
        )
        self._adds = Counter(
            "adds_total",
            "Total number of adds handled by workqueue",
            [LABEL],
            subsystem=SUBSYSTEM,
            registry=registry,
        )
        self._latency = Histogram(
            "queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            [LABEL],
            subsystem=SUBSYSTEM,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._work_duration = Histogram(
            "work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            [LABEL],
            subsystem=SUBSYSTEM,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._unfinished = Gauge(
            "unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't "
            "been observed by work_duration. Large values indicate stuck "
            "threads. One can deduce the number of stuck threads by observing "
            "the rate at which this increases.",
            [LABEL],
            subsystem=SUBSYSTEM,
            registry=registry,
        )
        self._longest_running_processor = Gauge(
            "longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            [LABEL],
            subsystem=SUBSYSTEM,
            registry=registry,
        )
        self._retries = Counter(
            "retries_total",
            "Total number of retries handled by workqueue",
            [LABEL],
            subsystem=SUBSYSTEM,
            registry=registry,
        )

    def new_depth_metric(self, name: str) -> Gauge:
        return self._depth.labels(name)

    def new_adds_metric(self, name: str) -> Counter:
        return self._adds.labels(name)

    def new_latency_metric(self, name: str) -> Histogram:
        return self._latency.labels(name)

    def new_work_duration_metric(self, name: str) -> Histogram:
        return self._work_duration.labels(name)

    def new_unfinished_work_seconds_metric(self, name: str) -> Gauge:
        return self._unfinished.labels(name)

    def new_longest_running_processor_seconds_metric(self, name: str) -> Gauge:
        return self._longest_running_processor.labels(name)

    def new_retries_metric(self, name: str) -> Counter:
        return self._retries.labels(name)
