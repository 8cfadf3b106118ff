"""GPUs served by DRA, kept incrementally by the cluster view (state/dra.py,
state/view.py, state/usage.py; docs/dra.md §4).

Whatever order ResourceSlices, DeviceClasses, DeviceTaintRules,
ResourceClaims, nodes, GPUClasses, GPUClaims and pods change in, the view
must hold what the pure functions compute from the same objects listed
afresh: each node's offers (`decide.dra.cluster_offers`), its allocatable
as placement sees it (`allocatable_with_dra`), the GPUs used
(`decide.drausage.used_with_dra`), and a node index whose buckets equal
ones built anew. The randomized test checks all four after every event of
many seeded sequences; the others show one behaviour each.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import pytest

from gpuclaimctl.decide.dra import NodeDra, SliceIndex, allocatable_with_dra, cluster_offers, map_resources
from gpuclaimctl.decide.drausage import device_owners, dra_usage, used_with_dra
from gpuclaimctl.decide.nodeindex import NodeIndex
from gpuclaimctl.decide.placement import Placed, Waiting, decide
from gpuclaimctl.model.api import WaitReason
from gpuclaimctl.model.dra import EXTENDED_RESOURCE_CLAIM_ANNOTATION, ClaimInfo, DeviceClassInfo, SliceInfo, TaintRule
from gpuclaimctl.model.snapshot import ClaimState, NodeInfo, PodInfo
from gpuclaimctl.state.view import ClusterView

NOW = datetime(2026, 5, 1, tzinfo=timezone.utc)
DRIVER = "gpu.example.com"
GPU = "nvidia.com/gpu"
IMPLICIT = f"deviceclass.resource.kubernetes.io/{DRIVER}"
Obj = dict[str, Any]


# -- objects ----------------------------------------------------------------------------


def node_obj(name: str, gpus: int | None = None, **labels: str) -> Obj:
    allocatable = {"cpu": "32"}
    if gpus is not None:
        allocatable[GPU] = str(gpus)
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_class(name: str, resource: str = GPU) -> Obj:
    return {"metadata": {"name": name}, "spec": {"resourceName": resource}}


def device_class(name: str = DRIVER, ext: str | None = GPU, selector: str | None = None,
                 created: str = "2026-01-01T00:00:00Z") -> Obj:
    expr = selector or f"device.driver == '{DRIVER}'"
    spec: Obj = {"selectors": [{"cel": {"expression": expr}}]}
    if ext:
        spec["extendedResourceName"] = ext
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def gpu(name: str, product: str = "A100", **extra: Any) -> Obj:
    return {"name": name, "attributes": {"productName": {"string": product}}, **extra}


def rslice(name: str, node: str | None, devices: list[Obj], *, pool: str | None = None, gen: int = 1,
           count: int = 1, **spec: Any) -> Obj:
    body: Obj = {"driver": DRIVER, "pool": {"name": pool or node or name, "generation": gen,
                                            "resourceSliceCount": count}, "devices": devices, **spec}
    if node is not None:
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


def rclaim(uid: str, devices: list[tuple[str, str]] | None, *, pod: str = "", admin: bool = False) -> Obj:
    """A ResourceClaim allocated (pool, device) pairs, or not allocated
    (None); `pod`: kube-scheduler made it for that pod's extended requests."""
    meta: Obj = {"name": f"rc-{uid}", "namespace": "ns", "uid": uid}
    if pod:
        meta["annotations"] = {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": f"pod-{pod}", "uid": pod,
                                    "controller": True}]
    status: Obj = {}
    if devices is not None:
        status["allocation"] = {"devices": {"results": [
            {"request": "r", "driver": DRIVER, "pool": p, "device": d, **({"adminAccess": True} if admin else {})}
            for p, d in devices]}}
    return {"metadata": meta, "spec": {}, "status": status}


def taint_rule(name: str, pool: str, device: str | None = None, effect: str = "NoSchedule") -> Obj:
    sel: Obj = {"driver": DRIVER, "pool": pool}
    if device is not None:
        sel["device"] = device
    return {"metadata": {"name": name}, "spec": {"deviceSelector": sel,
                                                 "taint": {"key": "broken", "effect": effect}}}


def gpu_claim(uid: str, cls: str, count: int, node: str | None, reserved: tuple[str, ...] = (),
              resource: str | None = None) -> Obj:
    status: Obj = {"phase": "Bound", "nodeName": node} if node else {"phase": "Pending"}
    if node and resource:
        status["resourceName"] = resource
    if reserved:
        status["reservedFor"] = [{"name": f"pod-{u}", "uid": u} for u in reserved]
    return {"metadata": {"name": f"claim-{uid}", "namespace": "ns", "uid": uid, "resourceVersion": "1"},
            "spec": {"className": cls, "count": count}, "status": status}


def pod(uid: str, gpus: int, node: str | None, phase: str = "Running", resource: str = GPU) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)},
                                                            "requests": {resource: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid,
                         "creationTimestamp": "2026-04-01T00:00:00Z"},
            "spec": spec, "status": {"phase": phase}}


def normalized(usage: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    out = {r: {n: c for n, c in per.items() if c} for r, per in usage.items()}
    return {r: per for r, per in out.items() if per}


def view_with(*nodes: Obj, classes: tuple[Obj, ...] = (gpu_class("a"),), synced: bool = True) -> ClusterView:
    view = ClusterView(lambda: NOW)
    for c in classes:
        view.apply_class(c)
    for n in nodes:
        view.apply_node(n, ready=True, not_ready_since=None, health_changed=False, recreated=False)
    if synced:
        view.dra_synced()
    return view


def free(view: ClusterView, node: str, resource: str = GPU) -> int:
    return view.free_on([node]).get(node, {}).get(resource, 0)


def placed(view: ClusterView, count: int, cls: str = "a") -> Placed | Waiting:
    p = PodInfo.from_api(pod("gated", count, None))
    with view.deciding() as d:
        return decide(p, [ClaimState("c", "c-uid", cls, count)], d.cluster, d.used(), NOW)


# -- one behaviour each ---------------------------------------------------------------------


def test_a_node_without_the_resource_offers_the_devices_its_slices_publish() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    change = view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1"), gpu("g2")]))
    info = view.cluster().nodes["dra-0"]
    assert info.allocatable[GPU] == 3 and info.dra == {GPU: DRIVER}
    assert change.freed_on == {"dra-0"} and change.nodes_changed == {"dra-0"}
    got = placed(view, 3)
    assert isinstance(got, Placed) and got.node == "dra-0"
    assert view.node_index.buckets(("a",)) == {(3, 3): ["dra-0"]}


def test_nothing_is_offered_until_the_dra_informers_have_listed() -> None:
    view = view_with(node_obj("dra-0"), synced=False)
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1")]))
    # A claim listed after the slices: until both are listed, nothing counts.
    view.apply_resource_claim(None, rclaim("r1", [("dra-0", "g0")]))
    assert view.cluster().nodes["dra-0"].allocatable.get(GPU, 0) == 0
    assert normalized(view.usage.totals) == {}
    change = view.dra_synced()
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 2
    assert free(view, "dra-0") == 1
    assert change.nodes_changed == {"dra-0"}


def test_a_node_the_device_plugin_serves_keeps_its_allocatable() -> None:
    view = view_with(node_obj("dp-0", 4))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dp-0", [gpu("g0")]))
    info = view.cluster().nodes["dp-0"]
    assert info.allocatable[GPU] == 4 and info.dra == {}


def test_a_direct_claim_takes_its_devices_and_its_deallocation_frees_them_and_says_where() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu(f"g{i}") for i in range(4)]))
    taken = view.apply_resource_claim(None, rclaim("r1", [("dra-0", "g0"), ("dra-0", "g1"), ("dra-0", "g2")]))
    assert free(view, "dra-0") == 1 and taken.freed_on == frozenset()
    got = placed(view, 2)
    assert isinstance(got, Waiting) and got.reason is WaitReason.CAPACITY
    assert "1 nvidia.com/gpu on dra-0" in got.message, got.message
    assert view.node_index.buckets(("a",)) == {(4, 1): ["dra-0"]}
    freed = view.apply_resource_claim(rclaim("r1", [("dra-0", "g0"), ("dra-0", "g1"), ("dra-0", "g2")]),
                                      rclaim("r1", None))
    assert free(view, "dra-0") == 4 and freed.freed_on == {"dra-0"}


def test_admin_access_results_and_devices_outside_the_offer_use_nothing() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class(selector="device.attributes['gpu.example.com'].productName == 'A100'"))
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1", "H100")]))
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 1
    view.apply_resource_claim(None, rclaim("admin", [("dra-0", "g0")], admin=True))
    view.apply_resource_claim(None, rclaim("other", [("dra-0", "g1")]))
    assert free(view, "dra-0") == 1


@pytest.mark.parametrize("claim_first", [False, True], ids=["pod-first", "claim-first"])
def test_a_pod_and_the_claim_kube_scheduler_made_for_its_request_count_once(claim_first: bool) -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu(f"g{i}") for i in range(4)]))
    p, rc = pod("p1", 2, "dra-0"), rclaim("r1", [("dra-0", "g0"), ("dra-0", "g1")], pod="p1")
    if claim_first:
        view.apply_resource_claim(None, rc)
        assert free(view, "dra-0") == 2
    view.apply_pod(None, p)
    assert free(view, "dra-0") == 2
    view.apply_resource_claim(None, rc)
    assert free(view, "dra-0") == 2
    view.delete_pod(p)  # its claim stays allocated until deallocated
    assert free(view, "dra-0") == 2
    view.delete_resource_claim(rc)
    assert free(view, "dra-0") == 4


def test_our_pods_gpu_claims_and_its_scheduler_made_claim_count_once() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu(f"g{i}") for i in range(4)]))
    view.apply_claim(None, gpu_claim("gc", "a", 2, "dra-0", reserved=("p1",), resource=GPU))
    view.apply_pod(None, pod("p1", 2, "dra-0"))
    view.apply_resource_claim(None, rclaim("r1", [("dra-0", "g0"), ("dra-0", "g1")], pod="p1"))
    assert free(view, "dra-0") == 2


def test_a_newer_generation_with_fewer_devices_lowers_the_count_while_the_old_one_is_listed() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("old", "dra-0", [gpu(f"g{i}") for i in range(4)], gen=1))
    view.apply_resource_claim(None, rclaim("r1", [("dra-0", "g3")]))
    assert free(view, "dra-0") == 3
    change = view.apply_resource_slice(rslice("new", "dra-0", [gpu(f"g{i}") for i in range(3)], gen=2))
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 3
    # g3 is gone from the offer: its claim no longer counts against it.
    assert free(view, "dra-0") == 3 and change.nodes_changed == {"dra-0"}
    view.delete_resource_slice("old")
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 3


def test_a_heartbeat_changes_nothing_and_a_label_change_reoffers() -> None:
    view = view_with(node_obj("dra-0", zone="a"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", None, [gpu("g0")], pool="by-zone",
                                     nodeSelector={"nodeSelectorTerms": [{"matchFields": [
                                         {"key": "metadata.name", "operator": "In", "values": ["dra-0"]}],
                                         "matchExpressions": [{"key": "zone", "operator": "In",
                                                               "values": ["a"]}]}]}))
    before = view.cluster()
    assert before.nodes["dra-0"].allocatable[GPU] == 1
    again = view.apply_node(node_obj("dra-0", zone="a"), ready=True, not_ready_since=None,
                            health_changed=False, recreated=False)
    assert again is False and view.cluster() is before
    moved = view.apply_node(node_obj("dra-0", zone="b"), ready=True, not_ready_since=None,
                            health_changed=False, recreated=False)
    assert moved is True and view.cluster().nodes["dra-0"].allocatable[GPU] == 0


def test_a_gpuclass_of_the_implicit_resource_is_offered_the_same_devices() -> None:
    view = view_with(node_obj("dra-0"), classes=(gpu_class("dc", IMPLICIT),))
    view.apply_device_class(device_class(ext=None))
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1")]))
    assert view.cluster().nodes["dra-0"].allocatable[IMPLICIT] == 2
    got = placed(view, 2, "dc")
    assert isinstance(got, Placed) and got.node == "dra-0"


def test_a_taint_rule_takes_its_devices_out_of_the_offer() -> None:
    view = view_with(node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1")]))
    change = view.apply_device_taint_rule(taint_rule("broken", "dra-0", "g1"))
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 1 and change.nodes_changed == {"dra-0"}
    view.delete_device_taint_rule("broken")
    assert view.cluster().nodes["dra-0"].allocatable[GPU] == 2


# -- random sequences against the pure reference --------------------------------------------


NODES = ("n0", "n1", "n2", "n3")


class RandomDra:
    """Random events on a view, and the objects they leave, as a fresh list would show them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.view = ClusterView(lambda: NOW)
        self.nodes: dict[str, Obj] = {}
        self.gpu_classes: dict[str, Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.device_classes: dict[str, Obj] = {}
        self.rules: dict[str, Obj] = {}
        self.claims: dict[str, Obj] = {}  # ResourceClaims by name
        self.gpu_claims: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        self.serial = 0
        self.synced = False

    def _devices(self) -> list[tuple[str, str]]:
        """(pool, device) pairs a claim may be allocated: mostly real ones."""
        real = [(s["spec"]["pool"]["name"], d["name"]) for s in self.slices.values() for d in s["spec"]["devices"]]
        return real + [("n9", "g0")]

    def step(self) -> str:  # noqa: C901 -- one branch per kind of event
        rng, view = self.rng, self.view
        self.serial += 1
        roll = rng.random()
        if not self.synced and (roll < 0.05 or self.serial > 30):
            self.synced = True
            view.dra_synced()
            return "DRA informers listed"
        if roll < 0.10:
            name = rng.choice(NODES)
            if name in self.nodes and rng.random() < 0.25:
                del self.nodes[name]
                view.delete_node(name)
                return f"node {name} deleted"
            obj = node_obj(name, rng.choice((None, None, 0, 4)), zone=rng.choice("ab"))
            self.nodes[name] = obj
            view.apply_node(obj, ready=True, not_ready_since=None, health_changed=True, recreated=False)
            return f"node {name} {obj['metadata']['labels']['zone']} {obj['status']['allocatable'].get(GPU)}"
        if roll < 0.14:
            name = rng.choice(("a", "b", "c"))
            if name in self.gpu_classes and rng.random() < 0.3:
                del self.gpu_classes[name]
                view.delete_class(name)
                return f"GPUClass {name} deleted"
            obj = gpu_class(name, rng.choice((GPU, GPU, IMPLICIT)))
            self.gpu_classes[name] = obj
            view.apply_class(obj)
            return f"GPUClass {name} {obj['spec']['resourceName']}"
        if roll < 0.20:
            name = rng.choice((DRIVER, "late"))
            if name in self.device_classes and rng.random() < 0.3:
                del self.device_classes[name]
                view.delete_device_class(name)
                return f"DeviceClass {name} deleted"
            obj = device_class(name, rng.choice((GPU, GPU, None)),
                               rng.choice((None, "device.attributes['gpu.example.com'].productName == 'A100'")),
                               created=rng.choice(("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")))
            self.device_classes[name] = obj
            view.apply_device_class(obj)
            return f"DeviceClass {name}"
        if roll < 0.45:
            node = rng.choice(NODES)
            name = f"{node}-s{rng.randint(0, 2)}"
            if name in self.slices and rng.random() < 0.25:
                del self.slices[name]
                view.delete_resource_slice(name)
                return f"slice {name} deleted"
            devices = [gpu(f"g{i}", rng.choice(("A100", "A100", "H100")),
                           **({"taints": [{"key": "x", "effect": "NoSchedule"}]} if rng.random() < 0.1 else {}))
                       for i in rng.sample(range(6), rng.randint(0, 4))]
            kind = rng.random()
            if kind < 0.8:
                obj = rslice(name, node, devices, pool=node, gen=rng.randint(1, 3), count=rng.choice((1, 1, 2)))
            elif kind < 0.9:
                obj = rslice(name, None, devices, pool=f"wide-{node}", gen=rng.randint(1, 2),
                             nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "zone", "operator": "In", "values": [rng.choice("ab")]}]}]})
            else:
                obj = rslice(name, None, devices, pool=f"pinned-{node}", gen=1,
                             nodeSelector={"nodeSelectorTerms": [{"matchFields": [
                                 {"key": "metadata.name", "operator": "In", "values": [node]}]}]})
            self.slices[name] = obj
            view.apply_resource_slice(obj)
            return f"slice {name}: pool {obj['spec']['pool']}, {len(devices)} devices"
        if roll < 0.48:
            name = f"rule-{rng.randint(0, 1)}"
            if name in self.rules and rng.random() < 0.4:
                del self.rules[name]
                view.delete_device_taint_rule(name)
                return f"rule {name} deleted"
            pool, device = rng.choice(self._devices())
            obj = taint_rule(name, pool, device, rng.choice(("NoSchedule", "NoExecute", "None")))
            self.rules[name] = obj
            view.apply_device_taint_rule(obj)
            return f"rule {name} on {pool}/{device}"
        if roll < 0.68:
            name = f"rc{rng.randint(0, 7)}"
            old = self.claims.get(name)
            if old is not None and rng.random() < 0.2:
                del self.claims[name]
                view.delete_resource_claim(old)
                return f"ResourceClaim {name} deleted"
            uid = name if rng.random() < 0.85 else f"{name}-{self.serial}"  # a relist may change uids
            picked = rng.sample(self._devices(), min(len(self._devices()), rng.randint(1, 3)))
            obj = rclaim(uid, None if rng.random() < 0.2 else picked,
                         pod=rng.choice(("", "", "p0", "p1", "p2")), admin=rng.random() < 0.1)
            obj["metadata"]["name"] = name
            self.claims[name] = obj
            view.apply_resource_claim(old, obj)
            return f"ResourceClaim {name} ({uid}) {picked}"
        if roll < 0.80:
            uid = f"gc{rng.randint(0, 4)}"
            old = self.gpu_claims.get(uid)
            if old is not None and rng.random() < 0.2:
                del self.gpu_claims[uid]
                view.delete_claim(old)
                return f"GPUClaim {uid} deleted"
            obj = gpu_claim(uid, rng.choice(("a", "b")), rng.randint(1, 3), rng.choice(NODES + (None,)),
                            reserved=tuple(rng.sample(("p0", "p1", "p2"), rng.randint(0, 1))),
                            resource=rng.choice((GPU, IMPLICIT, None)))
            self.gpu_claims[uid] = obj
            view.apply_claim(old, obj)
            return f"GPUClaim {uid}"
        uid = f"p{rng.randint(0, 3)}"
        old = self.pods.get(uid)
        if old is not None and rng.random() < 0.25:
            del self.pods[uid]
            view.delete_pod(old)
            return f"pod {uid} deleted"
        obj = pod(uid, rng.randint(1, 3), rng.choice(NODES + (None,)), rng.choice(("Running", "Running", "Succeeded")),
                  rng.choice((GPU, IMPLICIT)))
        self.pods[uid] = obj
        view.apply_pod(old, obj)
        return f"pod {uid}"

    def check(self, what: str) -> None:
        view = self.view
        raw = [NodeInfo.from_api(n) for n in self.nodes.values()]
        resources = {c["spec"]["resourceName"] for c in self.gpu_classes.values()}
        rules = [TaintRule.from_api(r) for r in self.rules.values()]
        if self.synced:
            want = cluster_offers(raw, resources, SliceIndex.build(SliceInfo.from_api(s) for s in self.slices.values()),
                                  map_resources(DeviceClassInfo.from_api(c) for c in self.device_classes.values()),
                                  rules)
        else:
            want = {n.name: NodeDra(n.name) for n in raw}
        got = view.dra.offers()
        assert sorted(got) == sorted(want), what
        for name, nd in want.items():
            assert _offers(got[name]) == _offers(nd), f"{what}: offers of {name}"
        with view.deciding() as d:
            cluster = d.cluster
            for n in raw:
                assert dict(cluster.nodes[n.name].allocatable) == allocatable_with_dra(n.allocatable, want[n.name]), what
                assert dict(cluster.nodes[n.name].dra) == {r: o.device_class for r, o in want[n.name].offers.items()}
            owners = device_owners(want.values())
            claims = [ClaimInfo.from_api(c) for c in self.claims.values()]
            expected = used_with_dra(self.gpu_claims.values(), self.pods.values(),
                                     {k: c["spec"]["resourceName"] for k, c in self.gpu_classes.items()},
                                     dra_usage(claims, owners))
            assert normalized(view.usage.totals) == normalized(expected), what
            d.used()  # the index follows the snapshot
            fresh = NodeIndex(view.usage.totals)
            fresh.follow(cluster)
            for key in (("a",), ("b",), ("c",)):
                if key[0] not in cluster.classes:
                    continue
                view.node_index.best(key, cluster.classes[key[0]].resource_name, 1, False, {}, {}, lambda *a: False)
                fresh.best(key, cluster.classes[key[0]].resource_name, 1, False, {}, {}, lambda *a: False)
                assert view.node_index.buckets(key) == fresh.buckets(key), f"{what}: index of {key}"


def _offers(nd: NodeDra) -> tuple[Any, ...]:
    return (tuple(sorted((r, o.device_class, tuple(sorted(o.devices)), o.notes) for r, o in nd.offers.items())),
            nd.notes)


@pytest.mark.parametrize("seed", range(40))
def test_the_view_always_holds_what_the_pure_functions_compute_from_the_objects_last_seen(seed: int) -> None:
    r = RandomDra(random.Random(seed))
    trace: list[str] = []
    for _ in range(200):
        trace.append(r.step())
        r.check(f"seed {seed}, after:\n  " + "\n  ".join(trace[-8:]))
    assert r.synced
