"""The controller's own metrics, `gpuclaimctl_*` (DESIGN.md §6).

Counters and histograms are updated by the controller as things happen.
Gauges of state (claims by phase and class, GPUs allocatable and bound per
class) are computed at scrape time from a callback over the caches, so they
can never drift from what the controller sees. Nothing is registered at
import; the registry is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Seconds from a pod's creation to its release: a fast path takes well under
# a second; a pod waiting for capacity can wait hours.
RELEASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
# One sync: milliseconds normally, seconds when the API server is slow.
SYNC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class StateSample:
    """What the caches hold, for the state gauges."""

    claims: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (class, phase) -> n
    allocatable: Mapping[str, int] = field(default_factory=dict)         # class -> GPUs
    bound: Mapping[str, int] = field(default_factory=dict)               # class -> GPUs


class _StateCollector(Collector):
    def __init__(self, sample: Callable[[], StateSample]) -> None:
        self._sample = sample

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._sample()
        claims = GaugeMetricFamily("gpuclaimctl_claims", "GPUClaims by class and phase.",
                                   labels=["class", "phase"])
        for (cls, phase), n in sorted(s.claims.items()):
            claims.add_metric([cls, phase], n)
        alloc = GaugeMetricFamily("gpuclaimctl_gpus_allocatable",
                                  "GPUs allocatable on Ready nodes that offer the class.",
                                  labels=["class"])
        for cls, n in sorted(s.allocatable.items()):
            alloc.add_metric([cls], n)
        bound = GaugeMetricFamily("gpuclaimctl_gpus_bound", "GPUs held by Bound claims of the class.",
                                  labels=["class"])
        for cls, n in sorted(s.bound.items()):
            bound.add_metric([cls], n)
        yield claims
        yield alloc
        yield bound


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry,
                 state: Callable[[], StateSample] | None = None) -> None:
        self.template_claims_created = Counter(
            "gpuclaimctl_template_claims_created_total",
            "GPUClaims created from a pod's template or inline entry.", registry=registry)
        self.placements = Counter(
            "gpuclaimctl_placements_total",
            "Placement decisions by result (placed, waiting) and reason.",
            ["result", "reason"], registry=registry)
        self.release_seconds = Histogram(
            "gpuclaimctl_pod_release_seconds",
            "Seconds from a pod's creation to its release by the controller.",
            buckets=RELEASE_BUCKETS, registry=registry)
        self.stale_reservations_removed = Counter(
            "gpuclaimctl_stale_reservations_removed_total",
            "reservedFor entries removed because their pod was gone, replaced or finished.",
            ["cause"], registry=registry)
        self.refused_pods = Counter(
            "gpuclaimctl_refused_pods_total",
            "Pinned pods the scheduler refused, deleted so their set can go elsewhere.",
            registry=registry)
        self.claims_lost = Counter(
            "gpuclaimctl_claims_lost_total",
            "Bound claims marked Lost because their node was gone or NotReady too long.",
            registry=registry)
        self.sync_seconds = Histogram(
            "gpuclaimctl_sync_duration_seconds", "Duration of one sync by key kind and result.",
            ["kind", "result"], buckets=SYNC_BUCKETS, registry=registry)
        self._registry = registry
        if state is not None:
            self.set_state(state)

    def set_state(self, state: Callable[[], StateSample]) -> None:
        """Export the gauges computed by `state` at scrape time (once)."""
        self._registry.register(_StateCollector(state))


# What became of an event handed to the recorder (gpuclaimctl.client.events.Outcome).
EVENT_RESULTS = ("created", "updated", "aggregated", "filtered", "dropped", "failed")


class EventMetrics:
    """gpuclaimctl_events_total{result}: the event recorder's work.

    ``created`` + ``updated`` were sent; ``aggregated`` counts events
    folded into a combined event (which is then also created or updated).
    Every result starts at 0, so a rate of drops can be alerted on at once.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "gpuclaimctl_events_total",
            "Events by what became of them: created, updated (a repeat's count), aggregated "
            "(folded into a combined event), filtered (per-object spam filter), dropped (queue "
            "full, not the leader, or shut down), failed (refused, or no answer after retries).",
            ["result"], registry=registry)
        for result in EVENT_RESULTS:
            self.events.labels(result)

    def inc(self, result: str, amount: int = 1) -> None:
        self.events.labels(result).inc(amount)
