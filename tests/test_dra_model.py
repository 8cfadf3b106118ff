"""GPUs served by DRA (decide/dra.py, decide/drausage.py, model/dra.py; docs/dra.md): what a
node offers of a resource from its ResourceSlices, as kube-scheduler 1.37
reads them, and how devices allocated to ResourceClaims count, once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from gpuclaimctl.decide.dra import (
    ClassMapping,
    NodeDra,
    Skip,
    SliceIndex,
    allocatable_with_dra,
    cluster_offers,
    map_resources,
)
from gpuclaimctl.decide.drausage import claim_use, device_owners, dra_usage, pod_counted, used_with_dra
from gpuclaimctl.model.dra import (
    ClaimInfo,
    DeviceClassInfo,
    DeviceID,
    PoolID,
    SliceInfo,
    TaintRule,
)
from gpuclaimctl.model.snapshot import NodeInfo

NV = "gpu.nvidia.com"
GPU = "nvidia.com/gpu"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
GPU_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
EARLY = "2026-01-01T00:00:00Z"
LATE = "2026-03-01T00:00:00Z"


# -- builders ---------------------------------------------------------------------


def device(name: str, kind: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": kind}, "index": {"int": int(name[-1])}}, **extra}


def gpus(n: int, prefix: str = "gpu-") -> list[dict[str, Any]]:
    return [device(f"{prefix}{i}") for i in range(n)]


def rslice(name: str, node: str | None = "node-a", *, pool: str | None = None, gen: int = 1, count: int = 1,
           devices: Sequence[dict[str, Any]] | None = None, driver: str = NV, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"driver": driver, "pool": {"name": pool or node or name, "generation": gen,
                                                       "resourceSliceCount": count},
                            "devices": list(gpus(2) if devices is None else devices), **spec}
    if node is not None:
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


def dclass(name: str = NV, ext: str | None = GPU, selectors: Sequence[str] = (GPU_SELECTOR,),
           created: str = EARLY) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if ext:
        spec["extendedResourceName"] = ext
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def node(name: str = "node-a", allocatable: dict[str, str] | None = None, **labels: str) -> NodeInfo:
    return NodeInfo.from_api({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
                              "status": {"allocatable": allocatable or {"cpu": "8"},
                                         "conditions": [{"type": "Ready", "status": "True"}]}})


def selector(*, names: Sequence[str] = (), labels: dict[str, str] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if names:
        term["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": list(names)}]
    if labels:
        term["matchExpressions"] = [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]
    return {"nodeSelectorTerms": [term]}


def offers(slices: Iterable[dict[str, Any]], classes: Iterable[dict[str, Any]] = (dclass(),),
           nodes: Iterable[NodeInfo] = (node(),), resources: Iterable[str] = (GPU,),
           rules: Iterable[dict[str, Any]] = ()) -> dict[str, NodeDra]:
    index = SliceIndex.build(SliceInfo.from_api(s) for s in slices)
    mapping = map_resources(DeviceClassInfo.from_api(c) for c in classes)
    return cluster_offers(list(nodes), resources, index, mapping, [TaintRule.from_api(r) for r in rules])


def count(got: dict[str, NodeDra], node_name: str = "node-a", resource: str = GPU) -> int | None:
    """Devices offered, or None when the node serves no DRA offer of it."""
    offer = got[node_name].offers.get(resource)
    return None if offer is None else offer.count


def reasons(got: dict[str, NodeDra], node_name: str = "node-a", resource: str = GPU) -> set[Skip]:
    nd = got[node_name]
    notes = nd.notes + (nd.offers[resource].notes if resource in nd.offers else ())
    return {n.reason for n in notes}


def dev_id(name: str, pool: str = "node-a") -> DeviceID:
    return DeviceID(NV, pool, name)


# -- capacity: which node offers what ----------------------------------------------


def test_a_node_without_allocatable_offers_the_devices_its_classes_select() -> None:
    got = offers([rslice("a", devices=[device("gpu-0"), device("gpu-1"), device("mig-2", "mig")])])
    assert got["node-a"].offers[GPU].devices == {dev_id("gpu-0"), dev_id("gpu-1")}
    assert got["node-a"].offers[GPU].device_class == NV
    assert allocatable_with_dra({"cpu": 8}, got["node-a"]) == {"cpu": 8, GPU: 2}


@pytest.mark.parametrize(("allocatable", "want"), [
    pytest.param({GPU: "4"}, None, id="device-plugin-wins"),
    pytest.param({GPU: "0"}, 2, id="zero-allocatable-is-served-by-dra"),
    pytest.param({}, 2, id="no-allocatable"),
])
def test_allocatable_decides_before_dra(allocatable: dict[str, str], want: int | None) -> None:
    # filterExtendedResources: isBackedByDRA && allocatable == 0.
    assert count(offers([rslice("a")], nodes=[node(allocatable=allocatable)])) == want


def test_a_resource_no_device_class_maps_is_not_served_by_dra() -> None:
    assert count(offers([rslice("a")], classes=[dclass(ext="example.com/gpu")])) is None


def test_the_implicit_device_class_resource_is_served() -> None:
    got = offers([rslice("a")], classes=[dclass(ext=None)], resources=[IMPLICIT, GPU])
    assert count(got, resource=IMPLICIT) == 2
    assert count(got, resource=GPU) is None


def test_a_class_without_selectors_takes_every_device_of_every_driver() -> None:
    got = offers([rslice("a", devices=[device("gpu-0"), device("mig-1", "mig")]),
                  rslice("b", driver="gpu.example.com", devices=gpus(1))],
                 classes=[dclass(selectors=())])
    assert count(got) == 3


# -- pools: generations, completeness, validity --------------------------------------


@pytest.mark.parametrize(("slices", "want", "why"), [
    pytest.param([rslice("old", gen=1, devices=gpus(4)), rslice("new", gen=2, devices=gpus(2))], 2, set(),
                 id="newest-generation-only"),
    pytest.param([rslice("a", count=2, devices=gpus(2))], 0, {Skip.POOL_INCOMPLETE},
                 id="incomplete-pool-offers-nothing"),
    pytest.param([rslice("a1", count=2, devices=gpus(2)), rslice("a2", count=2, devices=gpus(2, "x-"))], 4, set(),
                 id="complete-pool-of-two-slices"),
    pytest.param([rslice("a1", gen=2, count=2, devices=gpus(2)), rslice("a2", gen=1, count=2, devices=gpus(2, "x-"))],
                 0, {Skip.POOL_INCOMPLETE}, id="a-slice-still-at-the-old-generation-leaves-it-incomplete"),
    pytest.param([rslice("a1", count=2, devices=gpus(2)), rslice("a2", count=2, devices=gpus(1))], 0,
                 {Skip.POOL_INVALID}, id="duplicate-device-names-invalidate-the-pool"),
    pytest.param([rslice("a", devices=[device("gpu-0", consumesCounters=[{"counterSet": "s", "counters": {}}])])],
                 0, {Skip.PARTITIONABLE}, id="partitionable-devices-are-refused"),
])
def test_pools_are_read_as_the_allocator_reads_them(slices: list[dict[str, Any]], want: int, why: set[Skip]) -> None:
    got = offers(slices)
    assert count(got) == want
    assert reasons(got) == why


def test_a_pool_complete_across_nodes_offers_each_node_its_own_devices() -> None:
    # Node a sees one slice of two; the pool's other slice is node b's:
    # complete, so each node offers its own devices.
    slices = [rslice("sa", pool="rack-1", count=2, devices=gpus(2)),
              rslice("sb", "node-b", pool="rack-1", count=2, devices=gpus(3, "b-"))]
    got = offers(slices, nodes=[node("node-a"), node("node-b")])
    assert (count(got, "node-a"), count(got, "node-b")) == (2, 3)


def test_a_pool_being_replaced_elsewhere_is_ignored_on_this_node() -> None:
    # Node a's slice is at generation 1 and incomplete; the pool's newer
    # generation has no slice for node a: isObsolete, nothing and no note.
    slices = [rslice("sa", pool="rack-1", gen=1, count=2), rslice("sb", "node-b", pool="rack-1", gen=2, count=1)]
    got = offers(slices, nodes=[node("node-a"), node("node-b")])
    assert (count(got, "node-a"), reasons(got, "node-a")) == (0, set())
    assert count(got, "node-b") == 2


def test_pool_notes_name_the_pool_and_the_gap() -> None:
    got = offers([rslice("a", gen=3, count=2)])
    (note,) = got["node-a"].notes
    assert "pool gpu.nvidia.com/node-a" in note.message and "1 of its 2 ResourceSlices of generation 3" in note.message


# -- slices not tied to one node -------------------------------------------------------


@pytest.mark.parametrize(("spec", "on_a", "on_b", "why"), [
    pytest.param({"nodeSelector": selector(names=["node-a"])}, 2, 0, set(), id="selector-pinning-one-node"),
    pytest.param({"nodeSelector": selector(names=["node-a"], labels={"zone": "z2"})}, 0, 0, set(),
                 id="pinned-selector-whose-labels-do-not-match"),
    pytest.param({"nodeSelector": selector(labels={"zone": "z1"})}, 0, 0, {Skip.NOT_NODE_LOCAL},
                 id="label-selector-is-refused"),
    pytest.param({"allNodes": True}, 0, 0, {Skip.NOT_NODE_LOCAL}, id="all-nodes-is-refused"),
])
def test_slices_are_counted_only_on_the_one_node_they_are_tied_to(
        spec: dict[str, Any], on_a: int, on_b: int, why: set[Skip]) -> None:
    got = offers([rslice("net", None, pool="fabric", **spec)],
                 nodes=[node("node-a", zone="z1"), node("node-b", zone="z1")])
    assert (count(got, "node-a"), count(got, "node-b")) == (on_a, on_b)
    assert reasons(got, "node-a") == why
    assert reasons(got, "node-b") == why


def test_per_device_node_selection_counts_each_device_on_its_own_node() -> None:
    slc = rslice("rack", None, pool="rack", perDeviceNodeSelection=True, devices=[
        device("gpu-0", nodeName="node-a"), device("gpu-1", nodeName="node-b"),
        device("gpu-2", nodeSelector=selector(names=["node-a"])), device("gpu-3", allNodes=True)])
    got = offers([slc], nodes=[node("node-a"), node("node-b")])
    assert got["node-a"].offers[GPU].devices == {dev_id("gpu-0", "rack"), dev_id("gpu-2", "rack")}
    assert got["node-b"].offers[GPU].devices == {dev_id("gpu-1", "rack")}
    assert reasons(got, "node-a") == {Skip.NOT_NODE_LOCAL}


def test_the_slice_index_tells_which_nodes_a_pool_change_touches() -> None:
    index = SliceIndex.build(SliceInfo.from_api(s) for s in [
        rslice("a"), rslice("b", "node-b"), rslice("net", None, pool="fabric", allNodes=True)])
    assert index.nodes_touched(PoolID(NV, "node-a")) == frozenset({"node-a"})
    assert index.nodes_touched(PoolID(NV, "fabric")) is None
    assert index.candidates("node-b") == {PoolID(NV, "node-b"), PoolID(NV, "fabric")}


# -- which DeviceClass maps the resource -----------------------------------------------


@pytest.mark.parametrize(("classes", "winner"), [
    pytest.param([dclass("a-gpus", created=EARLY), dclass("b-migs", selectors=["device.attributes['gpu.nvidia.com'].type == 'mig'"], created=LATE)],
                 "b-migs", id="newest-class-wins"),
    pytest.param([dclass("b-gpus", created=LATE), dclass("a-migs", selectors=["device.attributes['gpu.nvidia.com'].type == 'mig'"], created=EARLY)],
                 "b-gpus", id="newest-class-wins-whatever-its-name"),
    pytest.param([dclass("b-gpus"), dclass("a-migs", selectors=["device.attributes['gpu.nvidia.com'].type == 'mig'"])],
                 "a-migs", id="same-time-lowest-name-wins"),
])
def test_of_several_classes_mapping_a_resource_the_schedulers_choice_decides(
        classes: list[dict[str, Any]], winner: str) -> None:
    got = offers([rslice("a", devices=[device("gpu-0"), device("gpu-1"), device("mig-2", "mig")])], classes=classes)
    offer = got["node-a"].offers[GPU]
    assert offer.device_class == winner
    assert offer.count == (1 if "migs" in winner else 2)


def test_the_implicit_name_of_a_class_that_lost_a_clash_is_not_counted() -> None:
    mapping = map_resources(DeviceClassInfo.from_api(c) for c in [
        dclass("old", created=EARLY), dclass("new", created=LATE)])
    winner = mapping.device_class(GPU)
    assert winner is not None and winner.name == "new"
    loser = "deviceclass.resource.kubernetes.io/old"
    assert mapping.device_class(loser) is None and loser in mapping.uncertain
    got = offers([rslice("a")], classes=[dclass("old", created=EARLY), dclass("new", created=LATE)],
                 resources=[loser, "deviceclass.resource.kubernetes.io/new"])
    assert count(got, resource=loser) == 0 and reasons(got, resource=loser) == {Skip.MAPPING_UNCERTAIN}
    assert count(got, resource="deviceclass.resource.kubernetes.io/new") == 2


# -- selectors ----------------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "want", "why"), [
    pytest.param("device.attributes['gpu.nvidia.com'].index >= 1", 1, set(), id="matched-and-not-matched"),
    pytest.param("device.attributes['gpu.nvidia.com'].model == 'A100'", 0, {Skip.SELECTOR_ERROR},
                 id="failing-on-a-device-refuses-the-resource"),
    pytest.param("has(device.attributes['gpu.nvidia.com'].model) && device.attributes['gpu.nvidia.com'].model == 'A100'",
                 0, set(), id="has-guards-the-missing-attribute"),
    pytest.param("device.attributes['gpu.nvidia.com'].type.matches('^gpu$')", 0, {Skip.SELECTOR_UNSUPPORTED},
                 id="unsupported-refuses-the-resource"),
    pytest.param("'gpu.nvidia.com' in (device.attributes)", 0, {Skip.SELECTOR_UNSUPPORTED},
                 id="unsupported-found-only-when-evaluated"),
])
def test_class_selectors_decide_which_devices_count(expression: str, want: int, why: set[Skip]) -> None:
    got = offers([rslice("a")], classes=[dclass(selectors=[GPU_SELECTOR, expression])])
    assert count(got) == want
    assert reasons(got) == why
    for note in got["node-a"].offers[GPU].notes:
        assert expression in note.message


def test_bare_attribute_names_belong_to_the_drivers_domain() -> None:
    qualified = device("gpu-0")
    qualified["attributes"] = {"gpu.nvidia.com/type": {"string": "gpu"}}
    other = device("gpu-1")  # "gpu" in another domain, "mig" in the driver's
    other["attributes"] = {"example.com/type": {"string": "gpu"}, "type": {"string": "mig"}}
    assert count(offers([rslice("a", devices=[device("gpu-2"), qualified, other])])) == 2


# -- devices the claim kube-scheduler makes cannot have -----------------------------------


@pytest.mark.parametrize(("extra", "rules", "want", "why"), [
    pytest.param({"taints": [{"key": "broken", "effect": "NoSchedule"}]}, [], 1, {Skip.TAINTED}, id="no-schedule"),
    pytest.param({"taints": [{"key": "evict", "effect": "NoExecute"}]}, [], 1, {Skip.TAINTED}, id="no-execute"),
    pytest.param({"taints": [{"key": "note", "effect": "None"}]}, [], 2, set(), id="effect-none-is-no-taint"),
    pytest.param({}, [{"metadata": {"name": "r"}, "spec": {"deviceSelector": {"device": "gpu-0"},
                                                           "taint": {"key": "m", "effect": "NoSchedule"}}}],
                 1, {Skip.TAINTED}, id="device-taint-rule"),
    pytest.param({}, [{"metadata": {"name": "r"}, "spec": {"taint": {"key": "m", "effect": "NoSchedule"}}}],
                 2, set(), id="taint-rule-without-selector-matches-nothing"),
    pytest.param({"allowMultipleAllocations": True}, [], 1, {Skip.MULTIPLE_ALLOCATIONS}, id="shared-device"),
    pytest.param({"bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]}, [], 2, set(),
                 id="binding-conditions-are-allocatable-in-1.37"),
])
def test_devices_the_schedulers_claim_cannot_get_are_not_counted(
        extra: dict[str, Any], rules: list[dict[str, Any]], want: int, why: set[Skip]) -> None:
    got = offers([rslice("a", devices=[device("gpu-0", **extra), device("gpu-1")])], rules=rules)
    assert count(got) == want
    assert reasons(got) == why


def test_devices_offered_under_two_resources_count_under_neither() -> None:
    # Two GPUClasses, one on the explicit name and one on the implicit: the
    # same devices. GPU claims of both would take them twice.
    got = offers([rslice("a")], classes=[dclass(ext=GPU)], resources=[GPU, IMPLICIT])
    assert (count(got), count(got, resource=IMPLICIT)) == (0, 0)
    assert reasons(got) == reasons(got, resource=IMPLICIT) == {Skip.SHARED_DEVICES}


def test_disjoint_classes_offer_side_by_side() -> None:
    classes = [dclass(ext=GPU), dclass("mig.nvidia.com", ext="nvidia.com/mig",
                                       selectors=["device.attributes['gpu.nvidia.com'].type == 'mig'"])]
    got = offers([rslice("a", devices=[device("gpu-0"), device("mig-1", "mig")])], classes=classes,
                 resources=[GPU, "nvidia.com/mig"])
    assert (count(got), count(got, resource="nvidia.com/mig")) == (1, 1)


# -- use: allocated claims, each device once ------------------------------------------------

RESOURCE_OF_CLASS = {"a100": GPU}


def resource_claim(name: str, devices: Sequence[str], *, pod: str | None = None, extended: bool = False,
                   admin: Sequence[str] = (), pool: str = "node-a", allocated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": name}
    if extended:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    if pod:
        owner: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod, "controller": True}
        meta["ownerReferences"] = [owner]
    status: dict[str, Any] = {}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod}]
    if allocated:
        results: list[dict[str, Any]] = [{"request": "r", "driver": NV, "pool": pool, "device": d} for d in devices]
        results += [{"request": "r", "driver": NV, "pool": pool, "device": d, "adminAccess": True} for d in admin]
        status["allocation"] = {"devices": {"results": results}}
    return {"metadata": meta, "spec": {}, "status": status}


def gpu_claim(name: str, n: int, pod: str | None, node_name: str = "node-a") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Bound", "nodeName": node_name, "resourceName": GPU}
    if pod:
        status["reservedFor"] = [{"name": pod, "uid": pod}]
    return {"metadata": {"name": name, "uid": name}, "spec": {"className": "a100", "count": n}, "status": status}


def pod(uid: str, gpus_requested: int, node_name: str | None = "node-a", phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus_requested)}}
                                            if gpus_requested else {}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"uid": uid, "name": uid}, "spec": spec, "status": {"phase": phase}}


OFFERS = offers([rslice("a", devices=gpus(4)), rslice("b", "node-b", devices=gpus(4))],
                nodes=[node("node-a"), node("node-b")])
OWNERS = device_owners(OFFERS.values())


def used(gpu_claims: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]],
         claims: Sequence[dict[str, Any]]) -> dict[str, int]:
    usage = dra_usage((ClaimInfo.from_api(c) for c in claims), OWNERS)
    return used_with_dra(gpu_claims, pods, RESOURCE_OF_CLASS, usage).get(GPU, {})


@pytest.mark.parametrize(("gpu_claims", "pods", "claims", "want"), [
    pytest.param([], [pod("p", 2)], [resource_claim("p-er", ["gpu-0", "gpu-1"], pod="p", extended=True)],
                 {"node-a": 2}, id="other-pod-request-and-its-scheduler-claim-count-once"),
    pytest.param([], [pod("p", 2)], [], {"node-a": 2}, id="other-pod-before-its-claim-is-seen"),
    pytest.param([], [pod("p", 2, node_name=None)], [resource_claim("p-er", ["gpu-0", "gpu-1"], pod="p", extended=True)],
                 {"node-a": 2}, id="other-pod-claim-seen-before-the-pod-is-bound"),
    pytest.param([gpu_claim("c", 2, "p")], [pod("p", 2)],
                 [resource_claim("p-er", ["gpu-0", "gpu-1"], pod="p", extended=True)],
                 {"node-a": 2}, id="gpuclaimctl-pod-counts-its-gpu-claims-not-its-scheduler-claim"),
    pytest.param([gpu_claim("c", 4, "p")], [pod("p", 2)],
                 [resource_claim("p-er", ["gpu-0", "gpu-1"], pod="p", extended=True)],
                 {"node-a": 4}, id="gpuclaimctl-pod-holding-more-than-it-requests"),
    pytest.param([gpu_claim("c", 1, "p")], [pod("p", 1)],
                 [resource_claim("p-er", ["gpu-0"], pod="p", extended=True), resource_claim("direct", ["gpu-3"], pod="p")],
                 {"node-a": 2}, id="gpuclaimctl-pod-with-a-resourceclaim-of-its-own"),
    pytest.param([], [pod("p", 0)], [resource_claim("direct", ["gpu-0"], pod="p")],
                 {"node-a": 1}, id="pod-using-a-resourceclaim-directly"),
    pytest.param([], [], [resource_claim("unused", ["gpu-0", "gpu-1"])], {"node-a": 2},
                 id="allocated-claim-reserved-by-no-pod"),
    pytest.param([], [pod("p", 2, phase="Succeeded")],
                 [resource_claim("p-er", ["gpu-0", "gpu-1"], pod="p", extended=True)],
                 {"node-a": 2}, id="finished-pod-while-its-claim-is-still-allocated"),
    pytest.param([], [], [resource_claim("p-er", ["gpu-0"], pod="gone", extended=True)], {"node-a": 1},
                 id="claim-of-a-deleted-pod-until-it-is-deallocated"),
    pytest.param([], [], [resource_claim("p-er", ["gpu-0"], pod="gone", extended=True, allocated=False)], {},
                 id="deallocated-claim"),
    pytest.param([], [], [resource_claim("admin", [], admin=["gpu-0", "gpu-1"])], {},
                 id="admin-access-is-not-use"),
    pytest.param([], [], [resource_claim("far", ["gpu-0"], pool="node-b")], {"node-b": 1},
                 id="counted-on-the-devices-node"),
    pytest.param([], [], [resource_claim("unknown", ["gpu-9"])], {}, id="devices-no-offer-counts"),
])
def test_allocated_devices_count_once(gpu_claims: list[dict[str, Any]], pods: list[dict[str, Any]],
                                      claims: list[dict[str, Any]], want: dict[str, int]) -> None:
    assert used(gpu_claims, pods, claims) == want


def test_a_claims_devices_are_attributed_to_its_pod_only_when_the_scheduler_made_it() -> None:
    made = ClaimInfo.from_api(resource_claim("p-er", ["gpu-0"], pod="p", extended=True))
    named = ClaimInfo.from_api(resource_claim("mine", ["gpu-1"], pod="p"))
    assert claim_use(made, OWNERS).pod_uid == "p"
    assert claim_use(named, OWNERS).pod_uid == ""
    assert claim_use(named, OWNERS).held == (("node-a", GPU, 1),)


@pytest.mark.parametrize(("requested", "extended", "held", "want"), [
    (2, 0, 0, 2), (0, 2, 0, 2), (2, 2, 0, 2), (2, 2, 2, 0), (2, 2, 4, 0), (3, 2, 2, 1), (0, 3, 2, 1),
])
def test_pod_counted_is_the_larger_of_request_and_claim_beyond_gpu_claims(
        requested: int, extended: int, held: int, want: int) -> None:
    assert pod_counted(requested, extended, held) == want


def test_devices_outside_the_offer_are_not_use() -> None:
    # A claim on a MIG device: the class for nvidia.com/gpu does not select it.
    got = offers([rslice("a", devices=[device("gpu-0"), device("mig-1", "mig")])])
    owners = device_owners(got.values())
    usage = dra_usage([ClaimInfo.from_api(resource_claim("m", ["mig-1"]))], owners)
    assert usage.direct == {}


def test_an_empty_mapping_serves_nothing() -> None:
    assert offers([rslice("a")], classes=[])["node-a"].offers == {}
    assert ClassMapping({}).device_class(GPU) is None


def test_without_resource_claims_the_count_is_the_usual_one() -> None:
    gpu_claims = [gpu_claim("c", 2, "p"), gpu_claim("d", 1, None, "node-b")]
    pods = [pod("p", 3), pod("q", 1, "node-b")]
    assert used(gpu_claims, pods, []) == {"node-a": 3, "node-b": 2}
