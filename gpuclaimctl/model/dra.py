"""resource.k8s.io/v1 objects as small frozen values: ResourceSlices,
DeviceClasses, ResourceClaims and DeviceTaintRules, read the way
kube-scheduler reads them for extended resources served by DRA
(docs/dra.md).

Parsing only: what a slice offers a node and who uses its devices is
decided in `decide/dra.py`. `from_api` never raises on a malformed object
(the API server validates them; a value that is not of the API's shape
reads as absent). Pure: no client, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from gpuclaimctl.model.celvalues import Quantity, parse_quantity_exact, parse_semver
from gpuclaimctl.model.dracel import BadValue, CelDevice, Selector, Value, compile_selector, qualify
from gpuclaimctl.model.nodeaffinity import NodeSelector
from gpuclaimctl.model.snapshot import parse_time

# k8s.io/api/resource/v1: a DeviceClass without spec.extendedResourceName
# still maps this prefix + its name (ResourceDeviceClassPrefix).
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
# The annotation kube-scheduler puts on the ResourceClaim it makes for a
# pod's extended-resource requests (ExtendedResourceClaimAnnotation); its
# only valid value is "true".
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# Device taint effects that keep the allocator off a device a request does
# not tolerate (taintPreventsAllocation); others, "None" included, do not.
BLOCKING_DEVICE_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# What a class's creationTimestamp reads as when it has none (never from the
# API server): older than any real class.
_NO_TIME = datetime.min.replace(tzinfo=timezone.utc)


class DeviceID(NamedTuple):
    """<driver>/<pool>/<device>: unique in the cluster."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


class PoolID(NamedTuple):
    driver: str
    pool: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}"


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = ""

    @property
    def blocks(self) -> bool:
        return self.effect in BLOCKING_DEVICE_TAINT_EFFECTS

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"

    @classmethod
    def from_api(cls, raw: Any) -> DeviceTaint:
        raw = raw if isinstance(raw, Mapping) else {}
        return cls(_str(raw.get("key")), _str(raw.get("value")), _str(raw.get("effect")))


@dataclass(frozen=True)
class NodeSelection:
    """Where a slice's (or, with perDeviceNodeSelection, a device's)
    devices are available: exactly one of these is set (API validation)."""

    node_name: str = ""
    node_selector: NodeSelector | None = None
    all_nodes: bool = False

    @property
    def is_set(self) -> bool:
        return bool(self.node_name) or self.node_selector is not None or self.all_nodes

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        """Upstream `NodeMatches`, in its order: nodeName, allNodes, nodeSelector."""
        if self.node_name:
            return self.node_name == node_name
        if self.all_nodes:
            return True
        if self.node_selector is not None:
            return self.node_selector.matches(node_name, labels)
        return False

    def pinned_node(self) -> str:
        """The one node these devices can be on, or "" when several can
        reach them: nodeName, or a selector each of whose terms requires
        `metadata.name In [<that one node>]`."""
        if self.node_name:
            return self.node_name
        sel = self.node_selector
        if sel is None or not sel.terms:
            return ""
        pinned: set[str] = set()
        for term in sel.terms:
            names = {r.values[0] for r in term.match_fields
                     if r.key == "metadata.name" and r.operator == "In" and len(r.values) == 1}
            if len(names) != 1:
                return ""
            pinned |= names
        return next(iter(pinned)) if len(pinned) == 1 else ""

    def __str__(self) -> str:
        if self.node_name:
            return f"nodeName {self.node_name}"
        if self.all_nodes:
            return "allNodes"
        if self.node_selector is not None:
            return f"nodeSelector {self.node_selector}"
        return "no node selection"

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> NodeSelection:
        sel = raw.get("nodeSelector")
        return cls(
            node_name=_str(raw.get("nodeName")),
            node_selector=NodeSelector.from_api(sel) if isinstance(sel, Mapping) else None,
            all_nodes=raw.get("allNodes") is True,
        )


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a slice, with what the allocator looks at."""

    id: DeviceID
    # Qualified (domain, name) -> value, bare names in the driver's domain.
    attributes: Mapping[tuple[str, str], Value | BadValue] = field(default_factory=dict)
    capacity: Mapping[tuple[str, str], Quantity] = field(default_factory=dict)
    taints: tuple[DeviceTaint, ...] = ()
    # Partitionable devices: the device consumes shared counters.
    consumes_counters: bool = False
    # Consumable capacity: several claims may be allocated the device.
    allow_multiple_allocations: bool = False
    binding_conditions: tuple[str, ...] = ()
    # Only with the slice's perDeviceNodeSelection.
    selection: NodeSelection = NodeSelection()

    def cel(self) -> CelDevice:
        return CelDevice(self.id.driver, self.attributes, self.capacity, self.allow_multiple_allocations)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], driver: str, pool: str) -> DeviceInfo:
        attributes: dict[tuple[str, str], Value | BadValue] = {}
        for name, attr in _map(raw.get("attributes")).items():
            attributes[qualify(str(name), driver)] = _attribute(str(name), attr)
        capacity: dict[tuple[str, str], Quantity] = {}
        for name, cap in _map(raw.get("capacity")).items():
            try:
                capacity[qualify(str(name), driver)] = parse_quantity_exact(str(_map(cap).get("value")))
            except ValueError:
                continue  # never from the API server: it parsed the quantity
        return cls(
            id=DeviceID(driver, pool, _str(raw.get("name"))),
            attributes=attributes,
            capacity=capacity,
            taints=tuple(DeviceTaint.from_api(t) for t in _list(raw.get("taints"))),
            consumes_counters=bool(_list(raw.get("consumesCounters"))),
            allow_multiple_allocations=raw.get("allowMultipleAllocations") is True,
            binding_conditions=tuple(str(c) for c in _list(raw.get("bindingConditions"))),
            selection=NodeSelection.from_api(raw),
        )


def _attribute(name: str, attr: Any) -> Value | BadValue:
    """The CEL value of a DeviceAttribute, in `getAttributeValue`'s order."""
    attr = _map(attr)
    if "ints" in attr or "bools" in attr or "strings" in attr:
        values = attr.get("ints", attr.get("bools", attr.get("strings")))
        return tuple(values) if isinstance(values, list) else BadValue(f"attribute {name}: unsupported attribute value")
    if "versions" in attr:
        try:
            return tuple(parse_semver(str(v)) for v in _list(attr["versions"]))
        except ValueError as e:
            return BadValue(f"attribute {name}: parse semantic version: {e}")
    if isinstance(attr.get("int"), int) and not isinstance(attr.get("int"), bool):
        return int(attr["int"])
    if isinstance(attr.get("bool"), bool):
        return bool(attr["bool"])
    if isinstance(attr.get("string"), str):
        return str(attr["string"])
    if isinstance(attr.get("version"), str):
        try:
            return parse_semver(attr["version"])
        except ValueError as e:
            return BadValue(f"attribute {name}: parse semantic version: {e}")
    return BadValue(f"attribute {name}: unsupported attribute value")


@dataclass(frozen=True)
class SliceInfo:
    """A ResourceSlice: one part of a driver's pool."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    selection: NodeSelection = NodeSelection()
    per_device_node_selection: bool = False
    devices: tuple[DeviceInfo, ...] = ()
    # Partitionable devices: this slice defines shared counters.
    shared_counters: bool = False

    @property
    def pool_id(self) -> PoolID:
        return PoolID(self.driver, self.pool)

    @property
    def readable(self) -> bool:
        return bool(self.driver and self.pool)

    def named_nodes(self) -> frozenset[str]:
        """The nodes this slice names or pins (its own selection, or its
        devices' with perDeviceNodeSelection): the nodes whose offer may
        change with it, besides those its label selectors or allNodes reach
        (`reaches_by_labels`)."""
        if self.per_device_node_selection:
            return frozenset(n for d in self.devices if (n := d.selection.pinned_node()))
        node = self.selection.pinned_node()
        return frozenset({node}) if node else frozenset()

    def reaches_by_labels(self) -> bool:
        """Whether nodes it does not name may see its devices (allNodes, or
        a selector that does not pin one node by name)."""
        selections = [d.selection for d in self.devices] if self.per_device_node_selection else [self.selection]
        return any(s.is_set and not s.pinned_node() for s in selections)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> SliceInfo:
        spec = _map(obj.get("spec"))
        pool = _map(spec.get("pool"))
        driver = _str(spec.get("driver"))
        pool_name = _str(pool.get("name"))
        return cls(
            name=_str(_map(obj.get("metadata")).get("name")),
            driver=driver,
            pool=pool_name,
            generation=_int(pool.get("generation")),
            slice_count=_int(pool.get("resourceSliceCount")),
            selection=NodeSelection.from_api(spec),
            per_device_node_selection=spec.get("perDeviceNodeSelection") is True,
            devices=tuple(DeviceInfo.from_api(_map(d), driver, pool_name) for d in _list(spec.get("devices"))),
            shared_counters=bool(_list(spec.get("sharedCounters"))),
        )


@dataclass(frozen=True)
class DeviceClassInfo:
    name: str
    created: datetime = _NO_TIME
    # spec.extendedResourceName, or "" when unset.
    extended_resource_name: str = ""
    # Compiled once; each a program or why it is outside the CEL subset.
    selectors: tuple[Selector, ...] = ()

    @property
    def implicit_resource_name(self) -> str:
        return DEVICE_CLASS_RESOURCE_PREFIX + self.name

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> DeviceClassInfo:
        meta = _map(obj.get("metadata"))
        spec = _map(obj.get("spec"))
        selectors = []
        for s in _list(spec.get("selectors")):
            expression = _map(_map(s).get("cel")).get("expression")
            selectors.append(compile_selector(expression) if isinstance(expression, str) else
                             Selector("", "a selector without a CEL expression (a kind of selector this "
                                          "version does not know)"))
        return cls(
            name=_str(meta.get("name")),
            created=parse_time(meta.get("creationTimestamp")) or _NO_TIME,
            extended_resource_name=_str(spec.get("extendedResourceName")),
            selectors=tuple(selectors),
        )


@dataclass(frozen=True)
class ClaimInfo:
    """A ResourceClaim's allocation: the devices it holds as the scheduler
    counts them (results with adminAccess are not "in use", as
    `foreachAllocatedDevice` skips them), and, for the claim kube-scheduler
    made for a pod's extended-resource requests, that pod's uid."""

    namespace: str
    name: str
    uid: str
    allocated: bool = False
    devices: tuple[DeviceID, ...] = ()
    # The pod whose extended-resource requests this claim serves (the
    # annotation "true" and a controller owner reference to a Pod), or "".
    extended_for_pod: str = ""
    reserved_for: tuple[str, ...] = ()

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> ClaimInfo:
        meta = _map(obj.get("metadata"))
        status = _map(obj.get("status"))
        allocation = status.get("allocation")
        devices: list[DeviceID] = []
        if isinstance(allocation, Mapping):
            for r in _list(_map(allocation.get("devices")).get("results")):
                r = _map(r)
                if r.get("adminAccess") is True:
                    continue
                devices.append(DeviceID(_str(r.get("driver")), _str(r.get("pool")), _str(r.get("device"))))
        pod = ""
        if _map(meta.get("annotations")).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true":
            for ref in _list(meta.get("ownerReferences")):
                ref = _map(ref)
                if ref.get("controller") is True and ref.get("kind") == "Pod":
                    pod = _str(ref.get("uid"))
        return cls(
            namespace=_str(meta.get("namespace")),
            name=_str(meta.get("name")),
            uid=_str(meta.get("uid")),
            allocated=isinstance(allocation, Mapping),
            devices=tuple(devices),
            extended_for_pod=pod,
            reserved_for=tuple(_str(_map(r).get("uid")) for r in _list(status.get("reservedFor"))),
        )


@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule: its taint on every device its selector matches
    (driver, pool, device: each, when set, must equal; without a selector
    it matches nothing), as the scheduler's ResourceSlice tracker applies it."""

    name: str
    taint: DeviceTaint
    has_selector: bool = False
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def applies_to(self, device: DeviceID) -> bool:
        return self.has_selector and all(want is None or want == have for want, have in (
            (self.driver, device.driver), (self.pool, device.pool), (self.device, device.device)))

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> TaintRule:
        spec = _map(obj.get("spec"))
        sel = spec.get("deviceSelector")
        sel_map = _map(sel)

        def opt(key: str) -> str | None:
            v = sel_map.get(key)
            return v if isinstance(v, str) else None

        return cls(
            name=_str(_map(obj.get("metadata")).get("name")),
            taint=DeviceTaint.from_api(spec.get("taint")),
            has_selector=isinstance(sel, Mapping),
            driver=opt("driver"), pool=opt("pool"), device=opt("device"),
        )


# -- parsing helpers -------------------------------------------------------------


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
