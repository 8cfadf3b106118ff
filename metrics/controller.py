"""The controller's own metrics, `gpuclaimctl_*` (DESIGN.md §6).

Counters and histograms are updated by the controller as things happen.
Gauges of state (claims by phase and class, GPUs allocatable and bound per
class, GPUBudget limits and use, waiting pods by namespace and reason) are
computed at scrape time from callbacks over the caches, so they can never
drift from what the controller sees. Nothing is registered at import; the
registry is injected.

A `namespace` label is bounded: the first `max_namespaces` namespaces seen
(by any metric here, in the order seen) keep their own value for the life
of the process; every later one is counted under `other` (OTHER_NAMESPACE).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Seconds from a pod's creation to its release: a fast path takes well under
# a second; a pod waiting for capacity can wait hours.
RELEASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
# One sync: milliseconds normally, seconds when the API server is slow.
SYNC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Namespaces with a label value of their own, by default: one histogram of
# 15 series per namespace, so 100 stays well inside a Prometheus's budget.
MAX_NAMESPACES = 100
# The label value of every namespace past the limit. A namespace really
# named `other` shares it.
OTHER_NAMESPACE = "other"
# Where a claim the controller creates for a pod comes from: the values of
# model.podclaims.EntrySource that make one (a `claim:` entry names one).
CLAIM_SOURCES = ("template", "inline")


class NamespaceLabels:
    """The `namespace` label value for a namespace: its own name for the
    first `limit` distinct namespaces asked about, OTHER_NAMESPACE after.

    A namespace admitted keeps its value for the life of the process, even
    once deleted: a series never changes its label mid-way, and the set of
    series stays bounded by `limit` + 1. Thread-safe (the syncs and scrapes
    ask at once).
    """

    def __init__(self, limit: int = MAX_NAMESPACES) -> None:
        if limit < 0:
            raise ValueError(f"the namespace limit must not be negative, got {limit}")
        self._limit = limit
        self._admitted: set[str] = set()   # invariant: len <= limit
        self._lock = threading.Lock()

    def label(self, namespace: str) -> str:
        with self._lock:
            if namespace in self._admitted:
                return namespace
            if len(self._admitted) < self._limit:
                self._admitted.add(namespace)
                return namespace
            return OTHER_NAMESPACE


@dataclass(frozen=True)
class StateSample:
    """What the caches hold, for the state gauges."""

    claims: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (class, phase) -> n
    allocatable: Mapping[str, int] = field(default_factory=dict)         # class -> GPUs
    bound: Mapping[str, int] = field(default_factory=dict)               # class -> GPUs
    # (namespace, budget, class or "*", "limit" | "used") -> GPUs; used is
    # held plus being placed, the figure the placement checks.
    budgets: Mapping[tuple[str, str, str, str], int] = field(default_factory=dict)


class _StateCollector(Collector):
    def __init__(self, sample: Callable[[], StateSample], namespaces: NamespaceLabels) -> None:
        self._sample = sample
        self._namespaces = namespaces

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
        # Namespaces past the limit share `other`: their budgets' figures add up there.
        folded: dict[tuple[str, str, str, str], int] = {}
        for (ns, name, cls, kind), n in s.budgets.items():
            key = (self._namespaces.label(ns), name, cls, kind)
            folded[key] = folded.get(key, 0) + n
        budgets = GaugeMetricFamily(
            "gpuclaimctl_budget_gpus",
            "GPUBudget figures per limit: kind=limit, the GPUs the namespace may hold of the class "
            "(\"*\": all classes); kind=used, the GPUs held plus being placed.",
            labels=["namespace", "budget", "class", "kind"])
        for key in sorted(folded):
            budgets.add_metric(list(key), folded[key])
        yield claims
        yield alloc
        yield bound
        yield budgets


@dataclass(frozen=True)
class PodWait:
    """One pod held by the scheduling gate: why, and since when."""

    namespace: str
    reason: str      # its claims' Waiting reason, or Pending before the first sync
    seconds: float   # since the pod was created


class _WaitingCollector(Collector):
    def __init__(self, waits: Callable[[], Iterable[PodWait]], namespaces: NamespaceLabels) -> None:
        self._waits = waits
        self._namespaces = namespaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count: dict[tuple[str, str], int] = {}
        longest: dict[tuple[str, str], float] = {}
        for w in self._waits():
            key = (self._namespaces.label(w.namespace), w.reason)
            count[key] = count.get(key, 0) + 1
            longest[key] = max(longest.get(key, 0.0), w.seconds)
        waiting = GaugeMetricFamily(
            "gpuclaimctl_pods_waiting",
            "Pods held by the gpuclaimctl.io/claims gate, by namespace and why they wait.",
            labels=["namespace", "reason"])
        oldest = GaugeMetricFamily(
            "gpuclaimctl_pods_waiting_longest_seconds",
            "Seconds since the creation of the longest-waiting gated pod, by namespace and reason.",
            labels=["namespace", "reason"])
        for key in sorted(count):
            waiting.add_metric(list(key), count[key])
            oldest.add_metric(list(key), longest[key])
        yield waiting
        yield oldest


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry,
                 state: Callable[[], StateSample] | None = None,
                 *, max_namespaces: int = MAX_NAMESPACES) -> None:
        self.namespaces = NamespaceLabels(max_namespaces)
        self.claims_created = Counter(
            "gpuclaimctl_claims_created_total",
            "GPUClaims created for pods, by the entry they were made from: source=template "
            "(a GPUClaimTemplate) or inline (the entry's className and count).",
            ["source"], registry=registry)
        for source in CLAIM_SOURCES:  # both exported from the start, so rate() sees the first
            self.claims_created.labels(source)
        # The name it had before claims_created: kept so dashboards and rules
        # built on it keep working; it always counted inline claims too.
        self.template_claims_created = Counter(
            "gpuclaimctl_template_claims_created_total",
            "Deprecated, use gpuclaimctl_claims_created_total: the same total, GPUClaims created "
            "from a pod's template or inline entry.", registry=registry)
        self.placements = Counter(
            "gpuclaimctl_placements_total",
            "Placement decisions by result (placed, waiting) and reason.",
            ["result", "reason"], registry=registry)
        self.release_seconds = Histogram(
            "gpuclaimctl_pod_release_seconds",
            "Seconds from a pod's creation to its release by the controller, by namespace "
            "(past --metrics-max-namespaces, other).",
            ["namespace"], buckets=RELEASE_BUCKETS, registry=registry)
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
        self.preemptions = Counter(
            "gpuclaimctl_preemptions_total",
            "Preemptions started: a set or gang of higher priority evicting pods of lower priority, "
            "by the preemptor's namespace and priority.",
            ["namespace", "priority"], registry=registry)
        self.preempted_pods = Counter(
            "gpuclaimctl_preempted_pods_total",
            "Pods evicted by preemption, by the preemptor's namespace and priority.",
            ["namespace", "priority"], registry=registry)
        self.sync_seconds = Histogram(
            "gpuclaimctl_sync_duration_seconds", "Duration of one sync by key kind and result.",
            ["kind", "result"], buckets=SYNC_BUCKETS, registry=registry)
        self._registry = registry
        if state is not None:
            self.set_state(state)

    def set_state(self, state: Callable[[], StateSample]) -> None:
        """Export the gauges computed by `state` at scrape time (once)."""
        self._registry.register(_StateCollector(state, self.namespaces))

    def set_waiting(self, waits: Callable[[], Iterable[PodWait]]) -> None:
        """Export gpuclaimctl_pods_waiting and ..._longest_seconds, from the
        pods `waits` returns at scrape time (once)."""
        self._registry.register(_WaitingCollector(waits, self.namespaces))

    def claim_created(self, source: str) -> None:
        """A GPUClaim was created for a pod from an entry of `source`
        (CLAIM_SOURCES: "template" or "inline")."""
        self.claims_created.labels(source).inc()
        self.template_claims_created.inc()

    def preempted(self, namespace: str, priority: int, victims: int) -> None:
        """A preemptor of `namespace` and `priority` evicted `victims` pods."""
        labels = (self.namespaces.label(namespace), str(priority))
        self.preemptions.labels(*labels).inc()
        self.preempted_pods.labels(*labels).inc(victims)

    def observe_release(self, namespace: str, seconds: float) -> None:
        """A pod of `namespace` was released `seconds` after its creation."""
        self.release_seconds.labels(self.namespaces.label(namespace)).observe(seconds)


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
