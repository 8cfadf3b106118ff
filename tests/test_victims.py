"""Whom preemption may take, from lists of objects (decide.victims): the
rule's table, and the same units as the controller's view builds from the
same objects (state.view's Decider.units_on), on random clusters."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuclaimctl.decide import victims
from gpuclaimctl.decide.preempt import NodeUnits, Preemption, Unit
from gpuclaimctl.model.api import (
    GANG_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    TEMPLATE_CLAIM_LABEL,
    TEMPLATE_CLAIM_LABEL_VALUE,
    WaitReason,
)
from gpuclaimctl.model.snapshot import ClaimState
from gpuclaimctl.state.indexes import pods_by_gang
from gpuclaimctl.state.view import ClusterView

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
STUCK = 60.0
CLASSES = {"a100": GPU}

Obj = dict[str, Any]


def pod(name: str, node: str = "n0", *, priority: int = 0, phase: str = "Running", gang: str = "",
        podgroup: str = "", deleting: timedelta | None = None, age: int = 60) -> Obj:
    meta: Obj = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                 "creationTimestamp": (NOW - timedelta(minutes=age)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if gang:
        meta["annotations"] = {GANG_ANNOTATION: gang, GANG_SIZE_ANNOTATION: "2"}
    if deleting is not None:
        meta["deletionTimestamp"] = (NOW - deleting).strftime("%Y-%m-%dT%H:%M:%SZ")
    spec: Obj = {"priority": priority, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    if podgroup:
        spec["schedulingGroup"] = {"podGroupName": podgroup}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def claim(name: str, node: str, count: int, *for_pods: str, retain: bool = False, template_of: str = "",
          phase: str = "Bound") -> Obj:
    meta: Obj = {"name": name, "namespace": "ns", "uid": f"c-{name}"}
    if template_of:
        meta["labels"] = {TEMPLATE_CLAIM_LABEL: TEMPLATE_CLAIM_LABEL_VALUE}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": template_of,
                                    "uid": f"uid-{template_of}", "controller": True}]
    spec: Obj = {"className": "a100", "count": count}
    if retain:
        spec["reclaimPolicy"] = "Retain"
    status: Obj = {"phase": phase, "nodeName": node, "resourceName": GPU,
                   "reservedFor": [{"name": p, "uid": f"uid-{p}"} for p in for_pods]}
    return {"metadata": meta, "spec": spec, "status": status}


def units(claims: list[Obj], pods: list[Obj], evicted: frozenset[str] = frozenset()
          ) -> dict[str, tuple[Unit, ...]]:
    return victims.units_on(claims, pods, CLASSES, NOW, pods_by_gang, STUCK, evicted)  # type: ignore[arg-type]


def shown(got: dict[str, tuple[Unit, ...]]) -> dict[str, list[tuple[str, list[tuple[str, int, bool]]]]]:
    """node -> [(unit key, [(member, GPUs it frees, terminating)])]."""
    return {node: [(u.gang or u.members[0].name,
                    [(m.name, sum(m.frees.values()), m.terminating) for m in u.members]) for u in us]
            for node, us in got.items()}


# -- the rule, case by case ---------------------------------------------------------------


def test_a_pod_its_claims_hold_gpus_for_on_its_node_is_a_victim_freeing_them() -> None:
    got = units([claim("a", "n0", 3, "a"), claim("b", "n0", 1, "a")], [pod("a", priority=7)])
    assert shown(got) == {"n0": [("a", [("a", 4, False)])]}
    v = got["n0"][0].members[0]
    assert (v.key, v.uid, v.node, v.priority, v.frees, v.budget_frees) == (
        "ns/a", "uid-a", "n0", 7, {GPU: 4}, {"a100": 4})


@pytest.mark.parametrize("objects", [
    pytest.param(([], [pod("a")]), id="no-claim-kube-scheduler-placed-it"),
    pytest.param(([claim("a", "n1", 2, "a")], [pod("a")]), id="its-claim-holds-gpus-on-another-node"),
    pytest.param(([claim("a", "n0", 2, "a", phase="Pending")], [pod("a")]), id="its-claim-holds-nothing"),
    pytest.param(([claim("a", "n0", 2, "a")], [pod("a", phase="Succeeded")]), id="finished"),
    pytest.param(([claim("a", "n0", 2, "a")], [pod("a", node="")]), id="not-on-a-node"),
    pytest.param(([claim("a", "n0", 2, "a")], []), id="not-listed"),
    pytest.param(([claim("a", "n0", 2, "a")], [pod("a", deleting=timedelta(seconds=STUCK + 1))]),
                 id="terminating-too-long-frees-nothing-one-can-count-on"),
])
def test_no_victim(objects: tuple[list[Obj], list[Obj]]) -> None:
    assert units(*objects) == {}


def test_a_retain_claim_frees_nothing_unless_it_is_the_pod_s_own_template_claim() -> None:
    got = units([claim("kept", "n0", 4, "a", retain=True), claim("own", "n0", 2, "b", retain=True,
                                                                 template_of="b"),
                 claim("theirs", "n0", 1, "c", retain=True, template_of="a")],
                [pod("a"), pod("b"), pod("c")])
    assert shown(got) == {"n0": [("a", [("a", 0, False)]), ("b", [("b", 2, False)]), ("c", [("c", 0, False)])]}


def test_a_terminating_pod_is_waited_for_and_an_evicted_one_too() -> None:
    got = units([claim("a", "n0", 2, "a"), claim("b", "n0", 2, "b")],
                [pod("a", deleting=timedelta(seconds=STUCK - 1)), pod("b")], evicted=frozenset({"uid-b"}))
    assert shown(got) == {"n0": [("a", [("a", 2, True)]), ("b", [("b", 2, True)])]}


@pytest.mark.parametrize("key", ["gang", "podgroup"])
def test_a_gang_is_one_unit_on_every_node_a_member_holds_gpus_on(key: str) -> None:
    gang, group = ("train", "") if key == "gang" else ("", "train")
    pods = [pod("w0", "n0", gang=gang, podgroup=group), pod("w1", "n1", gang=gang, podgroup=group),
            pod("idle", "n2", gang=gang, podgroup=group), pod("solo", "n0")]
    got = units([claim("w0", "n0", 4, "w0"), claim("w1", "n1", 8, "w1"), claim("solo", "n0", 4, "solo")], pods)
    key = "ns/train" if gang else "ns/podgroup:train"
    whole = (key, [("w0", 4, False), ("w1", 8, False)])  # "idle" holds no GPUs: nothing to take
    assert shown(got) == {"n0": [whole, ("solo", [("solo", 4, False)])], "n1": [whole]}
    assert got["n0"][0].gang == got["n1"][0].gang == key


# -- the view's units are the same ---------------------------------------------------------


def _random_cluster(rng: random.Random) -> tuple[list[Obj], list[Obj]]:
    nodes = [f"n{i}" for i in range(rng.randint(1, 4))]
    pods, claims = [], []
    for i in range(rng.randint(0, 14)):
        name = f"p{i}"
        deleting = rng.choice([None, None, None, timedelta(seconds=10), timedelta(seconds=STUCK + 30)])
        pods.append(pod(name, rng.choice([*nodes, ""]), priority=rng.choice([0, 10, 1000]),
                        phase=rng.choice(["Running", "Running", "Pending", "Succeeded"]),
                        gang=rng.choice(["", "", "g1", "g2"]), deleting=deleting, age=rng.randint(1, 99)))
    for j in range(rng.randint(0, 16)):
        owner = rng.choice(pods)["metadata"]["name"] if pods and rng.random() < 0.9 else "gone"
        claims.append(claim(f"c{j}", rng.choice(nodes), rng.randint(1, 4), *([owner] if rng.random() < 0.9 else []),
                            retain=rng.random() < 0.3, template_of=owner if rng.random() < 0.3 else "",
                            phase=rng.choice(["Bound", "Bound", "Bound", "Pending", "Lost"])))
    return claims, pods


def test_the_units_from_lists_are_the_view_s_from_the_same_objects() -> None:
    """One rule, two readers: the controller's view (built as the informers
    tell it, Decider.units_on) and why/simulate's lists agree, node by node."""
    rng = random.Random(46)
    for case in range(300):
        claims, pods = _random_cluster(rng)
        view = ClusterView(lambda: NOW)
        view.apply_class({"metadata": {"name": "a100"}, "spec": {"resourceName": GPU}})
        for p in pods:
            view.apply_pod(None, p)
        for c in claims:
            view.apply_claim(None, c)
        evicted = {p["metadata"]["uid"] for p in pods if rng.random() < 0.1}
        with view.deciding() as d:
            live = d.units_on(NOW, STUCK, evicted)
            from_view = {node: _units(live[node]) for node in live if live[node]}
        assert units(claims, pods, frozenset(evicted)) == from_view, f"case {case}"


def _units(got: Sequence[Unit] | NodeUnits) -> tuple[Unit, ...]:
    return got.units if isinstance(got, NodeUnits) else tuple(got)


# -- the rules around the plan -------------------------------------------------------------


def test_a_preemptor_s_set_waits_preempting_as_the_pod_sync_writes_it() -> None:
    plan = Preemption("n0", (), (), (), "set: preempting 1 pod of lower priority on node n0: ns/a (priority 0)")
    claims = [ClaimState("g", "c-g", "a100", 2), ClaimState("h", "c-h", "a100", 1)]
    made = victims.preempting(plan, claims)
    assert (made.reason, made.message, sorted(made.claims)) == (WaitReason.PREEMPTING, plan.message, ["g", "h"])
