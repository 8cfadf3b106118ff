"""GPUs served by DRA: what a node offers of a resource from its
ResourceSlices
(docs/dra.md §1; the rules are kube-scheduler 1.37's, each named below).

For a GPUClass whose resource is R, a node offers R from
`status.allocatable` when that is non-zero; otherwise from the devices of
its ResourceSlices that the DeviceClass kube-scheduler maps R to selects
(`filterExtendedResources`: `isBackedByDRA && allocatable == 0`):

1. `map_resources`: R -> the DeviceClass (extendedresourcecache: an
   explicit `extendedResourceName` of the newest class, ties to the lowest
   name; `deviceclass.resource.kubernetes.io/<class>` of that class).
2. `pools_on_node`: a driver's pools as the allocator gathers them for
   the node (GatherPools): only the newest generation, none from an
   incomplete pool (fewer slices than resourceSliceCount) or an invalid one
   (duplicate device names).
3. `node_offers`: the devices of those pools the class selects (its CEL
   selectors, `model.dracel`), untainted, counted on the one node they
   are tied to; each device or pool not counted is a `Note` saying why.
Who uses the offered devices is `decide/drausage.py`.

Built to be kept incrementally: a slice change recomputes the nodes its
pool reaches (`SliceIndex`).
Pure: no client, no clock, no globals; nothing here runs per decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpuclaimctl.model.dra import (
    DeviceClassInfo,
    DeviceID,
    DeviceInfo,
    PoolID,
    SliceInfo,
    TaintRule,
)
from gpuclaimctl.model.dracel import EvalError
from gpuclaimctl.model.snapshot import NodeInfo

# Devices a note names before "and N more": notes end up in messages and events.
_SHOWN = 5


class Skip(StrEnum):
    """Why devices are not counted (each a `Note`'s reason)."""

    # The pool's newest generation has fewer slices than resourceSliceCount:
    # the allocator takes nothing from it.
    POOL_INCOMPLETE = "PoolIncomplete"
    # Two devices of the pool's slices for the node share a name: the
    # allocator takes nothing from it.
    POOL_INVALID = "PoolInvalid"
    # Devices that consume shared counters (partitionable devices): what
    # is free depends on the counters, not on a count of devices.
    PARTITIONABLE = "PartitionableDevices"
    # Devices a nodeSelector or allNodes makes reachable from several nodes:
    # a per-node count would offer them once per node.
    NOT_NODE_LOCAL = "NotNodeLocal"
    # Devices several claims may be allocated at once (consumable capacity).
    MULTIPLE_ALLOCATIONS = "MultipleAllocations"
    # A NoSchedule or NoExecute taint (the slice's or a DeviceTaintRule's):
    # the claim kube-scheduler makes tolerates none.
    TAINTED = "Tainted"
    # The class's CEL selector is outside gpuclaimctl's subset.
    SELECTOR_UNSUPPORTED = "SelectorUnsupported"
    # The class's CEL selector fails on a device: so does the allocator.
    SELECTOR_ERROR = "SelectorError"
    # Devices offered under two resources on the node: GPU claims of each
    # would count them twice.
    SHARED_DEVICES = "SharedDevices"
    # deviceclass.resource.kubernetes.io/<class> of a class that lost an
    # extendedResourceName clash: whether kube-scheduler maps it depends on
    # the order it saw the classes in.
    MAPPING_UNCERTAIN = "MappingUncertain"


@dataclass(frozen=True)
class Note:
    """Devices not counted and why. `resource` is "" for a note about a pool
    (it holds for every resource)."""

    reason: Skip
    message: str
    resource: str = ""


@dataclass(frozen=True)
class ResourceOffer:
    """What a node offers of one resource through DRA: the devices, the
    DeviceClass that selected them, and why others were not counted. No
    devices and a note when the resource is refused on the node as a whole
    (selector unsupported or failing, devices shared, mapping uncertain)."""

    resource: str
    device_class: str
    devices: frozenset[DeviceID] = frozenset()
    notes: tuple[Note, ...] = ()

    @property
    def count(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class NodeDra:
    """One node's DRA offers: resource -> offer, only for the resources the
    node serves through DRA (allocatable zero and a DeviceClass mapping
    it); `notes` are about its pools."""

    node: str
    offers: Mapping[str, ResourceOffer] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()


# -- 1. which DeviceClass serves a resource ---------------------------------------


@dataclass(frozen=True)
class ClassMapping:
    """extended resource name -> the DeviceClass kube-scheduler maps it to;
    `uncertain`: resource -> why no count can be trusted for it."""

    by_resource: Mapping[str, DeviceClassInfo]
    uncertain: Mapping[str, Note] = field(default_factory=dict)

    def device_class(self, resource: str) -> DeviceClassInfo | None:
        return self.by_resource.get(resource)


def map_resources(classes: Iterable[DeviceClassInfo]) -> ClassMapping:
    """The mapping a freshly started kube-scheduler has
    (dynamic-resource-allocation deviceclass/extendedresourcecache):

    - `spec.extendedResourceName: R`: where several classes name R, the
      newest (creationTimestamp) wins, equal times go to the lowest name;
    - `deviceclass.resource.kubernetes.io/<class>`: that class, always; but
      for a class that lost a clash over its extendedResourceName the cache
      adds it only if it saw the class before the winner, so it is
      `uncertain` here (no count), never a guess.
    """
    explicit: dict[str, list[DeviceClassInfo]] = {}
    everyone = sorted(classes, key=lambda c: c.name)
    for c in everyone:
        if c.extended_resource_name:
            explicit.setdefault(c.extended_resource_name, []).append(c)
    by_resource: dict[str, DeviceClassInfo] = {}
    losers: dict[str, DeviceClassInfo] = {}
    for resource, group in explicit.items():
        winner = min(group, key=lambda c: (-c.created.timestamp(), c.name))
        by_resource[resource] = winner
        for c in group:
            if c is not winner:
                losers[c.name] = winner
    uncertain: dict[str, Note] = {}
    for c in everyone:
        implicit = c.implicit_resource_name
        if c.name in losers:
            uncertain[implicit] = Note(
                Skip.MAPPING_UNCERTAIN,
                f"DeviceClass {c.name} maps {c.extended_resource_name}, as does the newer (or "
                f"lower-named) DeviceClass {losers[c.name].name}, which kube-scheduler uses for it; "
                f"whether kube-scheduler maps {implicit} to {c.name} depends on the order it saw "
                "the classes in, so its devices are not counted", implicit)
            continue
        by_resource[implicit] = c
    return ClassMapping(by_resource, uncertain)


# -- 2. pools as the allocator gathers them for a node ------------------------------


class PoolState(StrEnum):
    USABLE = "Usable"
    INCOMPLETE = "Incomplete"
    INVALID = "Invalid"
    PARTITIONABLE = "Partitionable"


@dataclass(frozen=True)
class NodePool:
    """A pool with devices for the node: its slices of the generation the
    allocator uses, those reaching the node, sorted by name."""

    id: PoolID
    state: PoolState
    slices: tuple[SliceInfo, ...] = ()
    message: str = ""


def reaches(s: SliceInfo, node_name: str, labels: Mapping[str, str]) -> bool:
    """GatherPools' relevance test: the slice's own node selection, or with
    perDeviceNodeSelection any of its devices'. A slice with neither is some
    future kind the allocator skips, and so does this."""
    if s.selection.is_set:
        return s.selection.matches(node_name, labels)
    if s.per_device_node_selection:
        return any(d.selection.matches(node_name, labels) for d in s.devices)
    return False


def pool_on_node(pool_slices: Sequence[SliceInfo], node_name: str, labels: Mapping[str, str]) -> NodePool | None:
    """One pool as the allocator reads it for the node (GatherPools,
    incubating allocator, DRAPartitionableDevices on as in 1.37), or None
    when it has nothing for the node or its slices there are obsolete:

    - of the slices reaching the node, only the newest generation counts;
    - complete when that generation's slices reaching the node are
      resourceSliceCount; otherwise, if any slice of the pool anywhere has
      a newer generation the pool is being replaced and is ignored, else it
      is complete only if the whole pool has resourceSliceCount slices of
      that generation;
    - invalid when two devices of its slices for the node share a name.

    Devices consuming shared counters make the whole pool `PARTITIONABLE`
    (not counted; the allocator's counter checks are not modelled).
    """
    relevant = [s for s in pool_slices if s.readable and reaches(s, node_name, labels)]
    if not relevant:
        return None
    generation = max(s.generation for s in relevant)
    current = sorted((s for s in relevant if s.generation == generation), key=lambda s: s.name)
    pid = current[0].pool_id
    want = current[0].slice_count
    if len(current) != want:
        if any(s.generation > generation for s in pool_slices if s.readable):
            return None  # isObsolete: the driver is replacing this generation
        have = sum(1 for s in pool_slices if s.readable and s.generation == generation)
        if have != want:
            return NodePool(pid, PoolState.INCOMPLETE, (), (
                f"pool {pid} is incomplete: {have} of its {want} ResourceSlices of generation "
                f"{generation} exist, and the allocator takes no device from an incomplete pool"))
    seen: set[str] = set()
    for s in current:
        if s.shared_counters:
            continue  # a counter set slice has no devices (deviceSlices)
        for d in s.devices:
            if d.id.device in seen:
                return NodePool(pid, PoolState.INVALID, (), (
                    f"pool {pid} is invalid: duplicate device name {d.id.device}, and the "
                    "allocator takes no device from an invalid pool"))
            seen.add(d.id.device)
    if any(d.consumes_counters for s in current for d in s.devices):
        return NodePool(pid, PoolState.PARTITIONABLE, (), (
            f"pool {pid} has devices that consume shared counters (partitionable devices); "
            "gpuclaimctl does not count them"))
    return NodePool(pid, PoolState.USABLE, tuple(current))


def pools_on_node(node: NodeInfo, pools: Mapping[PoolID, Sequence[SliceInfo]],
                  candidates: Iterable[PoolID] | None = None) -> list[NodePool]:
    """Every pool with devices for the node, sorted by pool ID (the
    allocator's order). `candidates`: the pools worth looking at
    (`SliceIndex.candidates`); all by default."""
    out = []
    for pid in sorted(pools if candidates is None else set(candidates)):
        got = pool_on_node(pools.get(pid, ()), node.name, node.labels)
        if got is not None:
            out.append(got)
    return out


@dataclass(frozen=True)
class SliceIndex:
    """Slices by pool, and which pools may reach which node: the pools with
    a slice naming (or pinning) a node, and the `wide` ones whose slices
    reach nodes by labels or allNodes (rare: every node looks at them).
    A slice change touches its pool; the nodes to recompute are
    `nodes_touched`."""

    pools: Mapping[PoolID, tuple[SliceInfo, ...]]
    by_node: Mapping[str, frozenset[PoolID]]
    wide: frozenset[PoolID]

    @classmethod
    def build(cls, slices: Iterable[SliceInfo]) -> SliceIndex:
        pools: dict[PoolID, list[SliceInfo]] = {}
        by_node: dict[str, set[PoolID]] = {}
        wide: set[PoolID] = set()
        for s in slices:
            if not s.readable:
                continue
            pools.setdefault(s.pool_id, []).append(s)
            for n in s.named_nodes():
                by_node.setdefault(n, set()).add(s.pool_id)
            if s.reaches_by_labels():
                wide.add(s.pool_id)
        return cls({k: tuple(v) for k, v in pools.items()},
                   {k: frozenset(v) for k, v in by_node.items()}, frozenset(wide))

    def candidates(self, node_name: str) -> frozenset[PoolID]:
        return self.by_node.get(node_name, frozenset()) | self.wide

    def nodes_touched(self, pool: PoolID) -> frozenset[str] | None:
        """The nodes whose offer a change to `pool` can move, or None for
        every node (a wide pool)."""
        if pool in self.wide:
            return None
        return frozenset(n for n, ps in self.by_node.items() if pool in ps)


# -- 3. what a node offers ------------------------------------------------------------


class _Skipped:
    """Devices set aside per reason, told as one note each."""

    def __init__(self) -> None:
        self.by: dict[Skip, list[str]] = {}

    def add(self, reason: Skip, what: str) -> None:
        self.by.setdefault(reason, []).append(what)

    def notes(self, resource: str) -> tuple[Note, ...]:
        out = []
        for reason, items in self.by.items():
            shown = ", ".join(items[:_SHOWN]) + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")
            out.append(Note(reason, f"{len(items)} device(s) of {resource} not counted ({_WHY[reason]}): {shown}",
                            resource))
        return tuple(out)


_WHY = {
    Skip.NOT_NODE_LOCAL: "reachable from several nodes by nodeSelector or allNodes; a count per node "
                         "would offer them on each",
    Skip.MULTIPLE_ALLOCATIONS: "allowMultipleAllocations: several claims may share them",
    Skip.TAINTED: "tainted NoSchedule or NoExecute; the claim kube-scheduler makes tolerates no taint",
}


def _selected(cls: DeviceClassInfo, device: DeviceInfo) -> bool | Note:
    """Whether every selector of the class matches the device (as
    `selectorsMatch`: in order, the first false ends it), or the note
    refusing the resource when one fails."""
    cel = device.cel()
    for i, sel in enumerate(cls.selectors):
        got = sel.matches(cel)
        if isinstance(got, EvalError):
            if got.unsupported:
                return Note(Skip.SELECTOR_UNSUPPORTED, f"DeviceClass {cls.name}: selector #{i} on device "
                                                       f"{device.id}: {got.message}; no device of this class "
                                                       "is counted on the node")
            return Note(Skip.SELECTOR_ERROR, f"DeviceClass {cls.name}: selector #{i} ({sel.expression!r}) on "
                                             f"device {device.id}: {got.message}; kube-scheduler's allocator fails "
                                             "on it too, so no device of this class is counted on the node")
        if not got:
            return False
    return True


def _offer(node: NodeInfo, resource: str, cls: DeviceClassInfo, pools: Sequence[NodePool],
           taint_rules: Sequence[TaintRule]) -> ResourceOffer:
    for i, sel in enumerate(cls.selectors):
        if not sel.supported:
            return ResourceOffer(resource, cls.name, frozenset(), (Note(
                Skip.SELECTOR_UNSUPPORTED, f"DeviceClass {cls.name}: selector #{i}: {sel.unsupported}; "
                f"no device of {resource} is counted", resource),))
    devices: set[DeviceID] = set()
    skipped = _Skipped()
    for pool in pools:
        if pool.state is not PoolState.USABLE:
            continue
        for s in pool.slices:
            for d in s.devices:
                picked = _selected(cls, d)
                if isinstance(picked, Note):
                    return ResourceOffer(resource, cls.name, frozenset(),
                                         (Note(picked.reason, picked.message, resource),))
                if not picked:
                    continue
                selection = d.selection if s.per_device_node_selection else s.selection
                if s.per_device_node_selection and not selection.matches(node.name, node.labels):
                    continue  # isSelectable, after the selectors: not this node's device
                if selection.pinned_node() != node.name:
                    skipped.add(Skip.NOT_NODE_LOCAL, f"{d.id} ({selection})")
                elif d.allow_multiple_allocations:
                    skipped.add(Skip.MULTIPLE_ALLOCATIONS, str(d.id))
                elif taint := next((t for t in (*d.taints, *(r.taint for r in taint_rules if r.applies_to(d.id)))
                                    if t.blocks), None):
                    skipped.add(Skip.TAINTED, f"{d.id} ({taint})")
                else:
                    devices.add(d.id)
    return ResourceOffer(resource, cls.name, frozenset(devices), skipped.notes(resource))


_POOL_SKIP = {PoolState.INCOMPLETE: Skip.POOL_INCOMPLETE, PoolState.INVALID: Skip.POOL_INVALID,
              PoolState.PARTITIONABLE: Skip.PARTITIONABLE}


def node_offers(node: NodeInfo, resources: Iterable[str], pools: Sequence[NodePool], mapping: ClassMapping,
                taint_rules: Sequence[TaintRule] = ()) -> NodeDra:
    """What the node offers through DRA of each of `resources` (the
    GPUClasses' resources): only those it has zero of in allocatable and
    some DeviceClass maps. `pools`: `pools_on_node`. Devices offered under
    two resources are counted under neither (SHARED_DEVICES)."""
    offers: dict[str, ResourceOffer] = {}
    for resource in sorted(set(resources)):
        if node.allocatable.get(resource, 0) != 0:
            continue  # served by the device plugin: the scheduler never asks DRA for it here
        if resource in mapping.uncertain:
            offers[resource] = ResourceOffer(resource, "", frozenset(), (mapping.uncertain[resource],))
            continue
        cls = mapping.device_class(resource)
        if cls is None:
            continue
        offers[resource] = _offer(node, resource, cls, pools, taint_rules)
    shared: dict[str, list[str]] = {}
    names = sorted(offers)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = offers[a].devices & offers[b].devices
            if both:
                example = str(min(both))
                shared.setdefault(a, []).append(f"{b} ({len(both)} device(s), e.g. {example})")
                shared.setdefault(b, []).append(f"{a} ({len(both)} device(s), e.g. {example})")
    for resource, others in shared.items():
        o = offers[resource]
        offers[resource] = ResourceOffer(resource, o.device_class, frozenset(), o.notes + (Note(
            Skip.SHARED_DEVICES, f"devices of {resource} (DeviceClass {o.device_class}) are also offered under "
            f"{'; '.join(others)}: GPU claims of both would count them twice, so neither is counted on "
            f"{node.name}", resource),))
    notes = tuple(Note(_POOL_SKIP[p.state], p.message) for p in pools if p.state is not PoolState.USABLE)
    return NodeDra(node.name, MappingProxyType(offers), notes)


def cluster_offers(nodes: Iterable[NodeInfo], resources: Iterable[str], index: SliceIndex, mapping: ClassMapping,
                   taint_rules: Sequence[TaintRule] = ()) -> dict[str, NodeDra]:
    """`node_offers` for every node (the list-based path: tools and tests;
    the controller recomputes the nodes a change touches)."""
    wanted = tuple(set(resources))
    return {n.name: node_offers(n, wanted, pools_on_node(n, index.pools, index.candidates(n.name)), mapping,
                                taint_rules) for n in nodes}


def allocatable_with_dra(allocatable: Mapping[str, int], node_dra: NodeDra) -> dict[str, int]:
    """The node's allocatable with each DRA-served resource's device count
    in place of its zero: what placement compares GPU claims with."""
    out = dict(allocatable)
    for resource, offer in node_dra.offers.items():
        out[resource] = offer.count
    return out


def node_with_dra(node: NodeInfo, node_dra: NodeDra | None) -> NodeInfo:
    """The node as placement sees it: its allocatable with each DRA-served
    resource's device count (allocatable_with_dra), and which DeviceClass
    serves each (`NodeInfo.dra`); the node itself where DRA serves nothing.
    The controller's view (state.dra), `why`, `simulate` and `status` alike."""
    if node_dra is None or not node_dra.offers:
        return node
    return dataclasses.replace(node, allocatable=allocatable_with_dra(node.allocatable, node_dra),
                               dra={r: o.device_class for r, o in node_dra.offers.items()})
