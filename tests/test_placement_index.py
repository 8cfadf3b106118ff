"""The node index (decide/nodeindex.py): placement's search walks the nodes
in score order instead of scanning them all, and must choose what the scan
chooses -- the same node, the same tie-break by name, binpack and spread,
the same waits -- on the usage the view keeps, as every change reaches it.

The randomized tests decide every pod twice on the same snapshot: with the
view's usage and its index, and with the same usage as a plain map (which
placement scans); and check the index's buckets against one built afresh
after every change of a view fed random events.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuclaimctl.decide.capacity import combine, with_unknown
from gpuclaimctl.decide.nodeindex import IndexedUsage, NodeIndex
from gpuclaimctl.decide.placement import Placed, Waiting, decide
from gpuclaimctl.model.api import UNKNOWN_RESOURCE, Strategy, WaitReason
from gpuclaimctl.model.nodeaffinity import PodNodeRules, Taint
from gpuclaimctl.model.snapshot import (
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    PodInfo,
    PodRef,
    Rejection,
    Usage,
    age_of,
)
from gpuclaimctl.state.view import ClusterView, GangHold

GPU = "example.com/gpu"
GPU2 = "example.com/gpu2"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
ZONES = ("z0", "z1", "z2")
STRATEGIES = [pytest.param(Strategy.BINPACK, id="binpack"), pytest.param(Strategy.SPREAD, id="spread")]

Obj = dict[str, Any]


def pod(spec: Obj | None = None, name: str = "p") -> PodInfo:
    return PodInfo("ns", name, f"uid-{name}", NOW, PodNodeRules.from_pod_spec(spec or {}))


def pending(name: str, class_name: str, count: int, rejected: tuple[Rejection, ...] = ()) -> ClaimState:
    return ClaimState(name, f"uid-{name}", class_name, count, rejected=rejected)


def plain(used: Usage) -> dict[str, dict[str, int]]:
    """The same usage as a plain map: placement scans it."""
    return {r: dict(per) for r, per in used.items()}


def both(pod_: PodInfo, claims: list[ClaimState], cluster: Cluster, used: IndexedUsage,
         strategy: Strategy) -> tuple[object, object]:
    return (decide(pod_, claims, cluster, used, NOW, strategy),
            decide(pod_, claims, cluster, plain(used), NOW, strategy))


def answers(index: NodeIndex) -> list[tuple[str, str]]:
    """Record (index's node, scan's node) at every decision the index answers."""
    seen: list[tuple[str, str]] = []
    index.verify = lambda indexed, scanned, what: seen.append((indexed, scanned))
    return seen


def indexed(cluster: Cluster, used: Usage, in_flight: dict[str, dict[str, int]] | None = None) -> IndexedUsage:
    index = NodeIndex(used)
    return index.usage(cluster, in_flight or {}, lambda n: cluster.nodes[n].allocatable if n in cluster.nodes
                       else None)


# -- what it chooses ---------------------------------------------------------------------------


def test_binpack_takes_the_fullest_node_with_room_and_spread_the_emptiest() -> None:
    nodes = [NodeInfo(n, allocatable={GPU: 8}) for n in ("a", "b", "c", "d")]
    cluster = Cluster(nodes, [ClassInfo("k", GPU)])
    used = indexed(cluster, {GPU: {"a": 7, "b": 5, "c": 2}})
    claims = [pending("c1", "k", 2)]
    binpack = decide(pod(), claims, cluster, used, NOW, Strategy.BINPACK)
    spread = decide(pod(), claims, cluster, used, NOW, Strategy.SPREAD)
    assert isinstance(binpack, Placed) and binpack.node == "b"  # a has 1 free: no room
    assert isinstance(spread, Placed) and spread.node == "d"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nodes_scoring_the_same_from_different_buckets_tie_by_name(strategy: Strategy) -> None:
    # Filled up by the set, an 8-GPU node and a 4-GPU one score the same
    # (all allocated, none left) though they are in different buckets.
    nodes = [NodeInfo("n-big", allocatable={GPU: 8}), NodeInfo("n-small", allocatable={GPU: 4}),
             NodeInfo("n-mid", allocatable={GPU: 6})]
    cluster = Cluster(nodes, [ClassInfo("k", GPU)])
    used = indexed(cluster, {GPU: {"n-big": 6, "n-small": 2, "n-mid": 4}})
    seen = answers(used.index)
    d = decide(pod(), [pending("c1", "k", 2)], cluster, used, NOW, strategy)
    assert isinstance(d, Placed) and d.node == "n-big"
    rejected = (Rejection("n-big", NOW + timedelta(minutes=5)),)
    d = decide(pod(), [pending("c1", "k", 2, rejected)], cluster, used, NOW, strategy)
    assert isinstance(d, Placed) and d.node == "n-mid"
    assert seen == [("n-big", "n-big"), ("n-mid", "n-mid")]


def test_the_pods_rules_are_checked_only_on_nodes_that_would_win() -> None:
    names = [f"n{i}" for i in range(8)]
    cluster = Cluster([NodeInfo(n, allocatable={GPU: 8}) for n in names], [ClassInfo("k", GPU)])
    # Best first under binpack for 1 GPU: n7 (6 used), n6 (5), ... n0 (none).
    used = indexed(cluster, {GPU: {n: i - 1 for i, n in enumerate(names) if i > 1}})
    asked: list[str] = []

    def admits(name: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> bool:
        asked.append(name)
        return name not in ("n7", "n6")

    best = used.index.best(("k",), GPU, 1, False, used.extra(GPU), {}, admits)
    assert best == "n5"
    assert asked == ["n7", "n6", "n5"]


def test_a_node_with_placements_in_flight_is_scored_with_them() -> None:
    # The index has b fullest; what is in flight on a fills it, and on b
    # leaves no room: a wins under binpack.
    nodes = [NodeInfo(n, allocatable={GPU: 8}) for n in ("a", "b", "c")]
    cluster = Cluster(nodes, [ClassInfo("k", GPU)])
    used = indexed(cluster, {GPU: {"a": 1, "b": 5}}, {GPU: {"a": 4, "b": 2}})
    seen = answers(used.index)
    d = decide(pod(), [pending("c1", "k", 2)], cluster, used, NOW)
    assert isinstance(d, Placed) and d.node == "a"
    assert used[GPU] == {"a": 5, "b": 7}
    assert seen == [("a", "a")]


def test_an_older_gangs_hold_is_laid_over_the_index() -> None:
    view = ClusterView(lambda: NOW)
    for name in ("a", "b"):
        view.apply_node(node_obj(name, {GPU: 8}), ready=True, not_ready_since=None, health_changed=False,
                        recreated=False)
    view.apply_class(class_obj("k", GPU))
    view.apply_claim(None, claim_obj("x", "k", 6, "a"))
    view.gang_hold = GangHold("ns/train", age_of(0, NOW - timedelta(hours=1), "ns", "t-0"), {GPU: {"a": 2}},
                              NOW + timedelta(minutes=1))
    seen = answers(view.node_index)
    with view.deciding() as d:
        used, hold = d.used_by(age_of(0, NOW, "ns", "p"))
        assert hold is not None and isinstance(used, IndexedUsage)
        decision = decide(pod(), [pending("c1", "k", 2)], d.cluster, used, NOW)
    assert isinstance(decision, Placed) and decision.node == "b"  # a's last 2 GPUs are held
    assert seen == [("b", "b")]


def test_a_set_needing_two_resources_is_scanned() -> None:
    nodes = [NodeInfo("a", allocatable={GPU: 4, GPU2: 4}), NodeInfo("b", allocatable={GPU: 8, GPU2: 2})]
    cluster = Cluster(nodes, [ClassInfo("k", GPU), ClassInfo("k2", GPU2)])
    used = indexed(cluster, {GPU: {"a": 1}})
    seen = answers(used.index)
    claims = [pending("c1", "k", 2), pending("c2", "k2", 2)]
    got, want = both(pod(), claims, cluster, used, Strategy.BINPACK)
    assert isinstance(got, Placed) and got == want
    assert seen == []  # the index was not asked


def test_usage_read_before_a_change_is_not_answered_by_the_index() -> None:
    view = ClusterView(lambda: NOW)
    view.apply_node(node_obj("a", {GPU: 8}), ready=True, not_ready_since=None, health_changed=False,
                    recreated=False)
    view.apply_class(class_obj("k", GPU))
    used = view.used()
    cluster = view.cluster()
    assert used.current(cluster) is view.node_index
    view.apply_claim(None, claim_obj("x", "k", 2, "a"))
    assert used.current(cluster) is None  # stale: placement scans
    assert view.used().current(cluster) is view.node_index
    view.apply_node(node_obj("b", {GPU: 8}), ready=True, not_ready_since=None, health_changed=False,
                    recreated=False)
    assert view.used().current(cluster) is None  # another snapshot now
    assert view.used().current(view.cluster()) is view.node_index


def test_when_nothing_fits_the_set_waits_as_the_scan_says() -> None:
    nodes = [NodeInfo("a", allocatable={GPU: 4}), NodeInfo("b", allocatable={GPU: 4}, unschedulable=True)]
    cluster = Cluster(nodes, [ClassInfo("k", GPU)])
    used = indexed(cluster, {GPU: {"a": 3}})
    got, want = both(pod(), [pending("c1", "k", 2)], cluster, used, Strategy.BINPACK)
    assert isinstance(got, Waiting) and got.reason is WaitReason.CORDONED
    assert got == want


def test_indexed_usage_reads_as_usage_plus_in_flight_with_unknown_resources() -> None:
    rng = random.Random(7)
    nodes = {f"n{i}": {GPU: 8, GPU2: 4} if i % 2 else {GPU: 8} for i in range(12)}
    for _ in range(50):
        base = {r: {n: rng.randint(1, 3) for n in nodes if rng.random() < 0.5} for r in (GPU, GPU2, UNKNOWN_RESOURCE)
                if rng.random() < 0.8}
        flight = {r: {n: rng.randint(1, 2) for n in nodes if rng.random() < 0.2} for r in (GPU, UNKNOWN_RESOURCE)
                  if rng.random() < 0.6}
        want = with_unknown(combine(base, flight), nodes.get)
        index = NodeIndex(base)
        got = index.usage(Cluster((), ()), {r: dict(p) for r, p in flight.items()}, nodes.get)
        assert plain(got) == {r: dict(p) for r, p in want.items()}
        assert {r: got.get(r) for r in (GPU, GPU2, "other")} == {r: want.get(r) for r in (GPU, GPU2, "other")}


# -- the same as the scan, on random clusters ------------------------------------------------------


def random_cluster(rng: random.Random, n: int) -> tuple[Cluster, dict[str, dict[str, int]]]:
    nodes = []
    used: dict[str, dict[str, int]] = {GPU: {}, GPU2: {}}
    for i in range(n):
        allocatable = {GPU: rng.choice((1, 2, 4, 8, 8, 16))}
        if rng.random() < 0.3:
            allocatable[GPU2] = rng.choice((2, 4))
        taints = (Taint("dedicated", "NoSchedule", "ml"),) if rng.random() < 0.15 else ()
        nodes.append(NodeInfo(f"node-{i:03d}", {"zone": rng.choice(ZONES), "product": rng.choice("ab")}, taints,
                              ready=rng.random() > 0.05, unschedulable=rng.random() < 0.05,
                              allocatable=allocatable))
        for r, a in allocatable.items():
            if rng.random() < 0.8:
                used[r][f"node-{i:03d}"] = rng.randint(0, a + 1)  # one over now and then (allocatable lowered)
    classes = [ClassInfo("a", GPU, {"product": "a"}), ClassInfo("any", GPU), ClassInfo("two", GPU2)]
    return Cluster(nodes, classes), used


def random_request(rng: random.Random, i: int, nodes: list[str]) -> tuple[PodInfo, list[ClaimState]]:
    spec: Obj = {}
    roll = rng.random()
    if roll < 0.25:
        spec = {"nodeSelector": {"zone": rng.choice(ZONES)}}
    elif roll < 0.4:
        spec = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    elif roll < 0.45:
        spec = {"nodeSelector": {"zone": "nowhere"}}
    rejected = tuple(Rejection(n, NOW + timedelta(minutes=1)) for n in rng.sample(nodes, 3)) \
        if rng.random() < 0.3 else ()
    shape = rng.random()
    if shape < 0.6:
        claims = [pending(f"c{i}", rng.choice(("a", "any")), rng.randint(1, 6), rejected)]
    elif shape < 0.8:
        claims = [pending(f"c{i}", "a", rng.randint(1, 3), rejected), pending(f"d{i}", "any", rng.randint(1, 3))]
    elif shape < 0.9:
        claims = [pending(f"c{i}", "two", rng.randint(1, 3), rejected)]
    else:
        claims = [pending(f"c{i}", "any", 2, rejected), pending(f"d{i}", "two", 1)]
    return pod(spec, f"p{i}"), claims


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(20))
def test_indexed_decision_is_the_scans_on_random_clusters(seed: int, strategy: Strategy) -> None:
    rng = random.Random(seed)
    cluster, base = random_cluster(rng, rng.choice((5, 30, 120)))
    names = sorted(cluster.nodes)
    flight = {GPU: {n: rng.randint(1, 3) for n in rng.sample(names, 3)}}
    hold = {GPU: {n: 2 for n in rng.sample(names, 2)}}
    used = indexed(cluster, base, flight)
    seen = answers(used.index)
    for i in range(60):
        on = used.plus(hold) if i % 3 == 0 else used
        got, want = both(*random_request(rng, i, names), cluster, on, strategy)
        assert got == want
    assert seen and all(a == b for a, b in seen)
    assert any(a for a, _ in seen)


# -- kept with the view, change by change -------------------------------------------------------


def node_obj(name: str, allocatable: Mapping[str, int], labels: Mapping[str, str] | None = None,
             ready: bool = True, cordoned: bool = False) -> Obj:
    return {"metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {r: str(n) for r, n in allocatable.items()},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def class_obj(name: str, resource: str, selector: Mapping[str, str] | None = None) -> Obj:
    return {"metadata": {"name": name}, "spec": {"resourceName": resource, "nodeSelector": dict(selector or {})}}


def claim_obj(uid: str, class_name: str, count: int, node: str = "", rv: int = 1,
              resource: str | None = GPU) -> Obj:
    status: Obj = {"phase": "Bound", "nodeName": node, "reservedFor": [{"name": f"pod-{uid}", "uid": f"p-{uid}"}]} \
        if node else {"phase": "Pending"}
    if node and resource:
        status["resourceName"] = resource
    return {"metadata": {"name": f"claim-{uid}", "namespace": "ns", "uid": uid, "resourceVersion": str(rv)},
            "spec": {"className": class_name, "count": count}, "status": status}


def claimless_pod(uid: str, node: str, gpus: int) -> Obj:
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]},
            "status": {"phase": "Running"}}


class RandomView:
    """A view fed random events: nodes changed, cordoned, NotReady,
    deleted and back; classes edited (selector, resource) and deleted;
    claims bound, moved, freed, deleted, bound before status.resourceName;
    claimless pods; placements in flight and their endings."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.view = ClusterView(lambda: NOW)
        self.nodes: dict[str, Obj] = {}
        self.claims: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        self.flying: list[str] = []
        self.rv = 1
        self.serial = 0
        for i in range(12):
            self.put_node(f"n{i:02d}")
        for name, resource, selector in (("a", GPU, {"product": "a"}), ("any", GPU, {}), ("two", GPU2, {})):
            self.view.apply_class(class_obj(name, resource, selector))

    def put_node(self, name: str) -> None:
        rng = self.rng
        allocatable = {GPU: rng.choice((2, 4, 8))}
        if rng.random() < 0.4:
            allocatable[GPU2] = 4
        obj = node_obj(name, allocatable, {"product": rng.choice("ab"), "zone": rng.choice(ZONES)},
                       ready=rng.random() > 0.1, cordoned=rng.random() < 0.1)
        self.nodes[name] = obj
        self.view.apply_node(obj, ready=True, not_ready_since=None, health_changed=True, recreated=False)

    def step(self) -> str:
        rng, view = self.rng, self.view
        roll = rng.random()
        self.rv += 1
        names = sorted(self.nodes) or ["n00"]
        if roll < 0.12:
            name = rng.choice(names + ["n99"])
            self.put_node(name)
            return f"node {name} changed"
        if roll < 0.17 and self.nodes:
            name = rng.choice(names)
            del self.nodes[name]
            view.delete_node(name)
            return f"node {name} deleted"
        if roll < 0.21:
            name = rng.choice(("a", "any", "two"))
            if rng.random() < 0.2:
                view.delete_class(name)
                return f"class {name} deleted"
            view.apply_class(class_obj(name, rng.choice((GPU, GPU2)), rng.choice(({}, {"product": "b"}))))
            return f"class {name} edited"
        if roll < 0.55:
            self.serial += 1
            uid = rng.choice(list(self.claims)[-8:] + [f"c{self.serial}"]) if self.claims else f"c{self.serial}"
            node = rng.choice(names + [""])
            obj = claim_obj(uid, rng.choice(("a", "any", "two")), rng.randint(1, 3), node, self.rv,
                            rng.choice((GPU, GPU, GPU2, None)))
            old = self.claims.get(uid)
            self.claims[uid] = obj
            view.apply_claim(old, obj)
            return f"claim {uid} on {node or 'no node'}"
        if roll < 0.65 and self.claims:
            uid = rng.choice(sorted(self.claims))
            view.delete_claim(self.claims.pop(uid))
            return f"claim {uid} deleted"
        if roll < 0.75:
            self.serial += 1
            uid = f"pod{self.serial}"
            if self.pods and rng.random() < 0.4:
                uid = rng.choice(sorted(self.pods))
                view.delete_pod(self.pods.pop(uid))
                return f"pod {uid} deleted"
            self.pods[uid] = claimless_pod(uid, rng.choice(names), rng.randint(1, 2))
            view.apply_pod(None, self.pods[uid])
            return f"pod {uid} added"
        if roll < 0.88:
            self.serial += 1
            uid = f"f{self.serial}"
            with view.deciding() as d:
                d.record(uid, PodRef("p", "p"), rng.choice(names), rng.choice((GPU, GPU2)), rng.randint(1, 2),
                         str(self.rv))
            self.flying.append(uid)
            return f"in flight {uid}"
        if self.flying:
            uid = self.flying.pop(rng.randrange(len(self.flying)))
            view.not_sent(uid)
            return f"in flight {uid} ended"
        return "nothing"

    def check(self, step: int, what: str, strategy: Strategy) -> int:
        """Decide a few pods with the index and by the scan; compare the
        index's buckets with ones built afresh. How many it answered."""
        view, rng = self.view, self.rng
        seen = answers(view.node_index)
        with view.deciding() as d:
            used = d.used()
            assert isinstance(used, IndexedUsage)
            cluster = d.cluster
            names = sorted(cluster.nodes) or ["none"]
            for i in range(4):
                p, claims = random_request(rng, i, names)
                got, want = both(p, claims, cluster, used, strategy)
                assert got == want, f"step {step} ({what})"
            fresh = NodeIndex(view.usage.totals)
            fresh.follow(cluster)
            for key in {("a",), ("any",), ("two",), ("a", "any"), ("any", "two")}:
                built = view.node_index.buckets(key)
                if built is None or not all(k in cluster.classes for k in key):
                    continue
                fresh.best(key, cluster.classes[key[0]].resource_name, 1, False, {}, {}, lambda *a: False)
                assert built == fresh.buckets(key), f"step {step} ({what}): set {key}"
        view.node_index.verify = None
        assert all(a == b for a, b in seen), f"step {step} ({what})"
        return len(seen)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(12))
def test_the_index_follows_every_change_of_the_view(seed: int, strategy: Strategy) -> None:
    rv = RandomView(random.Random(seed))
    answered = 0
    for step in range(150):
        what = rv.step()
        answered += rv.check(step, what, strategy)
    assert answered > 50


def test_a_class_edit_rebuilds_the_sets_and_a_node_edit_patches_them() -> None:
    view = ClusterView(lambda: NOW)
    for name, product in (("a", "x"), ("b", "y")):
        view.apply_node(node_obj(name, {GPU: 8}, {"product": product}), ready=True, not_ready_since=None,
                        health_changed=False, recreated=False)
    view.apply_class(class_obj("k", GPU, {"product": "x"}))

    def on() -> object:
        return decide(pod(), [pending("c1", "k", 1)], view.cluster(), view.used(), NOW)

    first = on()
    assert isinstance(first, Placed) and first.node == "a"
    assert view.node_index.buckets(("k",)) == {(8, 8): ["a"]}
    view.apply_node(node_obj("b", {GPU: 4}, {"product": "x"}), ready=True, not_ready_since=None,
                    health_changed=True, recreated=False)
    assert view.node_index.buckets(("k",)) == {(8, 8): ["a"], (4, 4): ["b"]}  # patched, not dropped
    view.apply_claim(None, claim_obj("x", "k", 3, "b"))
    assert view.node_index.buckets(("k",)) == {(8, 8): ["a"], (4, 1): ["b"]}
    second = on()
    assert isinstance(second, Placed) and second.node == "b"
    view.apply_class(class_obj("k", GPU, {"product": "nope"}))
    assert isinstance(on(), Waiting)
    assert view.node_index.buckets(("k",)) == {}


def test_the_view_tells_the_index_of_every_usage_change(monkeypatch: pytest.MonkeyPatch) -> None:
    view = ClusterView(lambda: NOW)
    told: list[tuple[str, str]] = []
    told_to: Callable[[str, str], None] = view.node_index.used_changed

    def on_change(resource: str, node: str) -> None:
        told.append((resource, node))
        told_to(resource, node)

    monkeypatch.setattr(view.usage, "on_change", on_change)
    view.apply_claim(None, claim_obj("x", "k", 3, "a"))
    view.apply_pod(None, claimless_pod("p1", "b", 1))
    view.delete_claim(claim_obj("x", "k", 3, "a"))
    assert told == [(GPU, "a"), (GPU, "b"), (GPU, "a")]
