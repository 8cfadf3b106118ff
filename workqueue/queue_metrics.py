"""The metrics seam of the work queues (client-go ``util/workqueue/metrics.go``).

A queue is given an optional ``MetricsProvider``; the provider hands out one
metric per queue name and kind. ``workqueue`` knows only these protocols --
the Prometheus implementation lives in ``metrics.workqueue`` and satisfies
them structurally, so neither package imports the other. With no provider,
or a queue without a name, a queue records nothing and its hot path does not
call into this module at all.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from workqueue.clock import Clock

T = TypeVar("T", bound=Hashable)


class GaugeMetric(Protocol):
    def inc(self) -> None: ...

    def dec(self) -> None: ...


class SettableGaugeMetric(Protocol):
    def set(self, value: float) -> None: ...


class CounterMetric(Protocol):
    def inc(self) -> None: ...


class HistogramMetric(Protocol):
    def observe(self, amount: float) -> None: ...


class MetricsProvider(Protocol):
    """Makes the metrics of one named queue (client-go ``MetricsProvider``)."""

    def new_depth_metric(self, name: str) -> GaugeMetric: ...

    def new_adds_metric(self, name: str) -> CounterMetric: ...

    def new_latency_metric(self, name: str) -> HistogramMetric: ...

    def new_work_duration_metric(self, name: str) -> HistogramMetric: ...

    def new_unfinished_work_seconds_metric(self, name: str) -> SettableGaugeMetric: ...

    def new_longest_running_processor_seconds_metric(self, name: str) -> SettableGaugeMetric: ...

    def new_retries_metric(self, name: str) -> CounterMetric: ...


class QueueMetrics(Generic[T]):
    """What one named queue records; every method is called with the queue's lock held."""

    __slots__ = (
        "_clock",
        "_depth",
        "_adds",
        "_latency",
        "_work_duration",
        "_unfinished_work_seconds",
        "_longest_running_processor",
        "_add_times",
        "_processing_start_times",
    )

    def __init__(self, provider: MetricsProvider, name: str, clock: Clock) -> None:
        self._clock = clock
        self._depth = provider.new_depth_metric(name)
        self._adds = provider.new_adds_metric(name)
        self._latency = provider.new_latency_metric(name)
        self._work_duration = provider.new_work_duration_metric(name)
        self._unfinished_work_seconds = provider.new_unfinished_work_seconds_metric(name)
        self._longest_running_processor = provider.new_longest_running_processor_seconds_metric(
            name
        )
        # Monotonic time of the first add since the item was last handed out.
        self._add_times: dict[T, float] = {}
        # Monotonic time each item in processing was handed out.
        self._processing_start_times: dict[T, float] = {}

    def add(self, item: T) -> None:
        self._adds.inc()
        self._depth.inc()
        if item not in self._add_times:
            self._add_times[item] = self._clock.monotonic()

    def get(self, item: T) -> None:
        self._depth.dec()
        now = self._clock.monotonic()
        self._processing_start_times[item] = now
        added = self._add_times.pop(item, None)
        if added is not None:
            self._latency.observe(now - added)

    def done(self, item: T) -> None:
        started = self._processing_start_times.pop(item, None)
        if started is not None:
            self._work_duration.observe(self._clock.monotonic() - started)

    def update_unfinished_work(self) -> None:
        # client-go notes a summary would fit better, but Prometheus cannot
        # reset one; a total and a maximum are what it exports.
        now = self._clock.monotonic()
        total = 0.0
        oldest = 0.0
        for started in self._processing_start_times.values():
            age = now - started
            total += age
            if age > oldest:
                oldest = age
        self._unfinished_work_seconds.set(total)
        self._longest_running_processor.set(oldest)


def new_queue_metrics(
    provider: MetricsProvider | None, name: str, clock: Clock
) -> QueueMetrics[T] | None:
    """The metrics of a queue, or None when it records nothing (no provider or no name)."""
    if provider is None or not name:
        return None
    return QueueMetrics(provider, name, clock)
