"""What a placement decision looks at: one moment of the cluster, in plain values.

`NodeInfo`, `ClassInfo`, `ClaimState` and `PodInfo` are built from API
objects (`from_api`), `Cluster` holds the nodes and classes with per-class
node indexes built on first use, and `Usage` maps each resource and node to
the GPUs in use. Everything here is immutable and pure: `placement.decide`
takes these and nothing else.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from gpuclaimctl.model.api import (
    DEFAULT_RESOURCE_NAME,
    UNKNOWN_RESOURCE,
    OnCordon,
    Phase,
    ReclaimPolicy,
    WaitReason,
)
from gpuclaimctl.model.nodeaffinity import (
    BLOCKING_EFFECTS,
    NODE_STATE_TAINTS,
    PodNodeRules,
    Taint,
    VolumeConstraint,
)
from gpuclaimctl.model.resources import extended_resources, parse_quantity, pod_request

# resource name -> node name -> GPUs in use (bound claims, pods without
# claims, in-flight placements). A node missing from a map uses none.
Usage = Mapping[str, Mapping[str, int]]

# Read-only: shared by every lookup of a resource no node uses.
NO_USE: Mapping[str, int] = MappingProxyType({})
_NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=dict)
    # Resource -> the DeviceClass through which DRA serves it on this node
    # (docs/dra.md): its `allocatable` is then the devices DRA offers there,
    # as the view keeps them (state.dra); empty from `from_api`.
    dra: Mapping[str, str] = field(default_factory=dict)
    # The taints that can keep a pod off: NoSchedule/NoExecute, minus
    # NODE_STATE_TAINTS, which Ready and cordon checks stand for.
    blocking_taints: tuple[Taint, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        blocking = tuple(
            t for t in self.taints if t.effect in BLOCKING_EFFECTS and t.key not in NODE_STATE_TAINTS
        )
        object.__setattr__(self, "blocking_taints", blocking)

    @classmethod
    def from_api(cls, node: Mapping[str, Any]) -> NodeInfo:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        allocatable: dict[str, int] = {}
        for key, value in (status.get("allocatable") or {}).items():
            parsed = parse_quantity(value)
            if parsed is not None:
                allocatable[key] = parsed
        taints = tuple(Taint.from_api(t) for t in spec.get("taints") or ())
        # A node that reports Ready but still carries the not-ready or
        # unreachable taint (the node lifecycle controller removes it a moment
        # later) is refused by kube-scheduler: not Ready for placement either.
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
        ) and not any(t.key in _NOT_READY_TAINTS and t.effect in BLOCKING_EFFECTS for t in taints)
        return cls(
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            taints=taints,
            ready=ready,
            unschedulable=bool(spec.get("unschedulable")),
            allocatable=allocatable,
        )


@dataclass(frozen=True)
class ClassInfo:
    name: str
    resource_name: str = DEFAULT_RESOURCE_NAME
    node_selector: Mapping[str, str] = field(default_factory=dict)
    on_cordon: OnCordon = OnCordon.MOVE
    deleting: bool = False

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> ClassInfo:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        try:
            on_cordon = OnCordon(spec.get("onCordon") or OnCordon.MOVE)
        except ValueError:
            on_cordon = OnCordon.MOVE  # the CRD enum refuses others
        return cls(
            name=meta.get("name", ""),
            resource_name=spec.get("resourceName") or DEFAULT_RESOURCE_NAME,
            node_selector=dict(spec.get("nodeSelector") or {}),
            on_cordon=on_cordon,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    def selects(self, node: NodeInfo) -> bool:
        labels = node.labels
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def offered_by(self, node: NodeInfo) -> bool:
        return node.allocatable.get(self.resource_name, 0) > 0 and self.selects(node)

    def allocatable(self, nodes: Iterable[NodeInfo]) -> tuple[int, int]:
        """(Ready nodes offering this class, their GPUs of its resource)."""
        offering = [n for n in nodes if n.ready and self.offered_by(n)]
        return len(offering), sum(n.allocatable.get(self.resource_name, 0) for n in offering)


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str


@dataclass(frozen=True)
class Rejection:
    """A node that refused the set's pod; skipped for the set until `until`."""

    node_name: str
    until: datetime
    reason: str = ""


def holds_gpus(phase: object, node_name: object, reserved: bool) -> bool:
    """THE rule for "this claim holds GPUs on a node" (one home: placement's
    usage, budgets, class status and metrics all count by it). Bound on a
    node (a Retain claim with no pod too); or Lost while a pod still
    reserves it: its node went NotReady, but the pod may still run there
    and use them when it comes back (until the pod is gone and its
    reservation dropped, counting them is the only safe guess)."""
    return bool(node_name) and (phase == Phase.BOUND or (phase == Phase.LOST and reserved))


def claim_holds_gpus(claim: Mapping[str, Any]) -> bool:
    """`holds_gpus` of a GPUClaim as the API serves it."""
    status = claim.get("status") or {}
    return holds_gpus(status.get("phase"), status.get("nodeName"), bool(status.get("reservedFor")))


@dataclass(frozen=True)
class ClaimState:
    """A claim of the set as the informer shows it. A claim with an in-flight
    placement should be passed as Bound on that node: as far as anyone can
    tell, it is (see inflight.InFlightPlacements)."""

    name: str
    uid: str
    class_name: str
    count: int
    phase: Phase = Phase.PENDING
    node_name: str = ""
    reclaim_policy: ReclaimPolicy = ReclaimPolicy.RELEASE
    reserved_for: tuple[PodRef, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    deleting: bool = False
    # The resource the claim was bound with (`status.resourceName`, or
    # where an in-flight placement counts it): what it holds on its node
    # for as long as it stays there, whatever its class says now. Empty
    # for a claim bound by a version that did not record it.
    resource_name: str = ""

    @property
    def bound(self) -> bool:
        return self.phase is Phase.BOUND and bool(self.node_name)

    @property
    def holds_gpus(self) -> bool:
        return holds_gpus(self.phase, self.node_name, bool(self.reserved_for))

    def held_resource(self, classes: Mapping[str, ClassInfo]) -> str:
        """The resource the claim counts under on its node if it stays
        there: the one it was bound with; its class's for a claim that did
        not record one (the usage tracker counts it the same way). A claim
        that moves or binds anew takes its class's resource instead."""
        if self.resource_name and self.resource_name != UNKNOWN_RESOURCE:
            return self.resource_name
        return classes[self.class_name].resource_name

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> ClaimState:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        try:
            phase = Phase(status.get("phase") or Phase.PENDING)
        except ValueError:
            phase = Phase.PENDING
        try:
            policy = ReclaimPolicy(spec.get("reclaimPolicy") or ReclaimPolicy.RELEASE)
        except ValueError:
            policy = ReclaimPolicy.RELEASE
        rejected = []
        for r in status.get("rejectedNodes") or ():
            until = parse_time(r.get("until"))
            if r.get("nodeName") and until is not None:
                rejected.append(Rejection(r["nodeName"], until, r.get("reason") or ""))
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            class_name=spec.get("className", ""),
            count=int(spec.get("count") or 0),
            phase=phase,
            node_name=status.get("nodeName") or "",
            reclaim_policy=policy,
            reserved_for=tuple(
                PodRef(p.get("name", ""), p.get("uid", "")) for p in status.get("reservedFor") or ()
            ),
            rejected=tuple(rejected),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_name=str(status.get("resourceName") or ""),
        )


@dataclass(frozen=True)
class UnresolvedClaim:
    """An entry whose claim the caller could not use: reason is ClaimMissing,
    NameTaken or ClaimInUse, message says which claim and why."""

    name: str
    reason: WaitReason
    message: str


# The order in which pods compete for GPUs (DESIGN.md §4, §4d): higher
# priority first, then older, then namespace and name -- a total order.
Age = tuple[int, datetime, str, str]


def age_of(priority: int, created: datetime, namespace: str, name: str) -> Age:
    return (-priority, created, namespace, name)


def pod_priority(pod: Mapping[str, Any]) -> int:
    """`spec.priority` (the admission plugin copies it from the pod's
    PriorityClass); 0 when it has none, as kube-scheduler reads it."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    created: datetime
    # Its nodeSelector, required affinity, tolerations and the node affinity
    # of its bound volumes: every check of a node goes through these.
    rules: PodNodeRules = PodNodeRules()
    # What its containers request of each extended resource, as the
    # scheduler counts it (model.resources.pod_request), as (resource,
    # count) pairs, sorted: placement refuses a set that holds less of a
    # class's resource than this.
    requests: tuple[tuple[str, int], ...] = ()
    # spec.priority (from its PriorityClass; 0 without one), and whether it
    # may preempt (spec.preemptionPolicy is not Never): DESIGN.md §4d.
    priority: int = 0
    preempts: bool = True

    @classmethod
    def from_api(cls, pod: Mapping[str, Any], volumes: Sequence[VolumeConstraint] = ()) -> PodInfo:
        """`volumes`: `model.volumes.volume_constraints(pod, ...)`, read from
        the PVC and PV listers by the caller; none by default."""
        meta = pod.get("metadata") or {}
        created = parse_time(meta.get("creationTimestamp"))
        if created is None:
            raise ValueError(f"pod {meta.get('name')!r} has no creationTimestamp")
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            created=created,
            rules=PodNodeRules.from_pod_spec(pod.get("spec") or {}, volumes),
            requests=tuple((r, n) for r in sorted(extended_resources(pod)) if (n := pod_request(pod, r)) > 0),
            priority=pod_priority(pod),
            preempts=(pod.get("spec") or {}).get("preemptionPolicy") != "Never",
        )


@dataclass(frozen=True)
class Offer:
    """The nodes offering every class of a set of classes."""

    # Every such node, by name and sorted by name.
    nodes: Mapping[str, NodeInfo]
    ordered: tuple[NodeInfo, ...]
    # The Ready, uncordoned ones as (name, allocatable of the first class's
    # resource, node), sorted by name so that ties break by name.
    usable: tuple[tuple[str, int, NodeInfo], ...]
    # The others: not Ready or cordoned.
    idle: tuple[NodeInfo, ...]


class Cluster:
    """Nodes and classes at one moment. Immutable; derive a new one with
    `with_node` and friends. Node indexes per class (and per combination of
    classes a set asks for) are built on first use, O(nodes), and shared by
    every decision made on this snapshot."""

    __slots__ = ("nodes", "classes", "_offers", "_lock")

    def __init__(self, nodes: Iterable[NodeInfo], classes: Iterable[ClassInfo]) -> None:
        self.nodes: Mapping[str, NodeInfo] = {n.name: n for n in nodes}
        self.classes: Mapping[str, ClassInfo] = {c.name: c for c in classes}
        self._offers: dict[tuple[str, ...], Offer] = {}
        self._lock = threading.Lock()

    def offer(self, class_names: tuple[str, ...]) -> Offer:
        """The nodes offering all of `class_names` (sorted, existing)."""
        got = self._offers.get(class_names)
        if got is not None:
            return got
        if len(class_names) == 1:
            cls = self.classes[class_names[0]]
            ordered = tuple(n for _, n in sorted((k, n) for k, n in self.nodes.items() if cls.offered_by(n)))
        else:
            parts = [self.offer((name,)) for name in class_names]
            smallest = min(parts, key=lambda o: len(o.nodes))
            ordered = tuple(n for n in smallest.ordered if all(n.name in p.nodes for p in parts))
        built = self._index(class_names, ordered)
        with self._lock:
            return self._offers.setdefault(class_names, built)

    def _index(self, class_names: tuple[str, ...], ordered: tuple[NodeInfo, ...]) -> Offer:
        resource = self.classes[class_names[0]].resource_name
        usable = tuple(
            (n.name, n.allocatable.get(resource, 0), n) for n in ordered if n.ready and not n.unschedulable
        )
        idle = tuple(n for n in ordered if not n.ready or n.unschedulable)
        return Offer({n.name: n for n in ordered}, ordered, usable, idle)

    def warm(self) -> None:
        """Build every class's index now rather than in the first decision."""
        for name in self.classes:
            self.offer((name,))

    def with_node(self, node: NodeInfo) -> Cluster:
        """This snapshot with `node` added or replaced. The same snapshot if
        nothing placement reads has changed (a heartbeat, say), so callers
        can pass every node event through without cost."""
        if self.nodes.get(node.name) == node:
            return self
        return self._patched({**self.nodes, node.name: node}, node.name)

    def without_node(self, name: str) -> Cluster:
        if name not in self.nodes:
            return self
        nodes = dict(self.nodes)
        del nodes[name]
        return self._patched(nodes, name)

    def _patched(self, nodes: dict[str, NodeInfo], changed: str) -> Cluster:
        # Patch the built indexes for one node instead of rebuilding them:
        # O(nodes) copies without the sort and the class selector checks.
        out = Cluster((), self.classes.values())
        out.nodes = nodes
        new = nodes.get(changed)
        for key, offer in self._offers.items():
            ordered = [n for n in offer.ordered if n.name != changed]
            if new is not None and all(self.classes[c].offered_by(new) for c in key):
                bisect.insort(ordered, new, key=lambda n: n.name)
            out._offers[key] = out._index(key, tuple(ordered))
        return out


# --- parsing helpers ----------------------------------------------------------

def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as the API server writes it, or None. One
    without an offset (the API server's date-time format also takes
    "2006-01-02T15:04:05") is read as UTC: a naive datetime compared with
    the controller's aware clock would raise in every sync that reads it."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


def format_time(value: datetime) -> str:
    """An RFC 3339 timestamp in whole seconds, as the API server writes them."""
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")
