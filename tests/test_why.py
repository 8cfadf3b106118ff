"""`gpuclaimctl why`: each node's verdict beside THE decision, and the report a person reads.

The pure parts run on literal values: `decide.explain` (one table of
verdicts, and a seeded comparison with `decide` on random clusters: a node
said to fit is one the decision could pick), and the report `why` builds
from API objects. The real command runs against the real plane with the
controller at the end.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from gpuclaimctl.client import kube
from gpuclaimctl.cmd import cli, decisionview, why
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.decide.explain import Verdict, explain
from gpuclaimctl.decide.placement import Placed, Waiting, decide
from gpuclaimctl.decide.whatif import ClusterObjects
from gpuclaimctl.model.api import (
    CLAIMS_ANNOTATION,
    PLACED_NODE_ANNOTATION,
    SCHEDULING_GATE,
    TEMPLATE_CLAIM_LABEL,
    TEMPLATE_CLAIM_LABEL_VALUE,
    OnCordon,
    Phase,
    Strategy,
    WaitReason,
)
from gpuclaimctl.model.budgets import BudgetInfo, BudgetLimit, BudgetUse
from gpuclaimctl.model.nodeaffinity import NodeSelector, PodNodeRules, Taint, VolumeConstraint
from gpuclaimctl.model.snapshot import ClaimState, ClassInfo, Cluster, NodeInfo, PodInfo, PodRef, Rejection
from tests.controllerkit import RunningController
from tests.helpers import wait_for

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


# -- literal values --------------------------------------------------------------------


def node(name: str, gpus: int = 8, *, labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = (),
         ready: bool = True, cordoned: bool = False, resources: dict[str, int] | None = None) -> NodeInfo:
    return NodeInfo(name, labels or {}, taints, ready, cordoned,
                    resources if resources is not None else {GPU: gpus})


def claim(name: str = "c1", count: int = 1, class_name: str = "a100", *, on: str = "",
          rejected: tuple[Rejection, ...] = ()) -> ClaimState:
    phase = Phase.BOUND if on else Phase.PENDING
    reserved = (PodRef("p", "pod-uid"),) if on else ()
    return ClaimState(name, f"uid-{name}", class_name, count, phase, on, reserved_for=reserved, rejected=rejected)


def pod(spec: dict[str, Any] | None = None, volumes: tuple[VolumeConstraint, ...] = ()) -> PodInfo:
    return PodInfo("ns", "p", "pod-uid", NOW, PodNodeRules.from_pod_spec(spec or {}, volumes))


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


A100 = ClassInfo("a100", GPU, {"p": "a100"})
A = {"p": "a100"}


def verdicts(nodes: list[NodeInfo], claims: list[ClaimState], *, classes: tuple[ClassInfo, ...] = (A100,),
             used: dict[str, dict[str, int]] | None = None, spec: dict[str, Any] | None = None,
             budgets: list[BudgetInfo] | None = None, use: BudgetUse | None = None,
             volumes: tuple[VolumeConstraint, ...] = ()) -> dict[str, tuple[Verdict, str]]:
    e = explain(pod(spec, volumes), claims, Cluster(nodes, classes), used or {}, NOW,
                budgets=budgets or [], budget_use=use or BudgetUse({}, {}))
    return {r.node: (r.verdict, r.summary) for r in e.nodes}


# -- each verdict, with what it says ------------------------------------------------------

VERDICTS = {
    "fits": (dict(nodes=[node("n", labels=A)], claims=[claim(count=2)]), Verdict.FITS, "fits"),
    "not-Ready": (dict(nodes=[node("n", labels=A, ready=False)], claims=[claim()]),
                  Verdict.NOT_READY, "not Ready"),
    "cordoned": (dict(nodes=[node("n", labels=A, cordoned=True)], claims=[claim()]),
                 Verdict.CORDONED, "cordoned"),
    "rejected-until": (dict(nodes=[node("n", labels=A)], claims=[claim(rejected=(
        Rejection("n", NOW + timedelta(minutes=5), "Unschedulable: Insufficient cpu"),))]),
        Verdict.REJECTED, "rejected for the set until 2025-06-01T12:05:00+00:00: Unschedulable: Insufficient cpu"),
    "a-rejection-that-ran-out-is-no-verdict": (dict(nodes=[node("n", labels=A)], claims=[claim(rejected=(
        Rejection("n", NOW - timedelta(seconds=1)),))]), Verdict.FITS, "fits"),
    "taint-not-tolerated": (dict(nodes=[node("n", labels=A, taints=(Taint("team", "NoSchedule", "vision"),))],
                                 claims=[claim()]), Verdict.TAINT, "taint team=vision:NoSchedule not tolerated"),
    "PreferNoSchedule-is-no-verdict": (dict(nodes=[node("n", labels=A, taints=(Taint("s", "PreferNoSchedule"),))],
                                            claims=[claim()]), Verdict.FITS, "fits"),
    "affinity-term-fails": (dict(nodes=[node("n", labels={**A, "zone": "b"})], claims=[claim()],
                                 spec=affinity([{"key": "zone", "operator": "In", "values": ["a"]}])),
                            Verdict.AFFINITY, "affinity term 1 fails: zone In [a] (the node has zone=b)"),
    "no-affinity-term-matches": (dict(nodes=[node("n", labels=A)], claims=[claim()],
                                      spec=affinity([{"key": "zone", "operator": "In", "values": ["a"]}],
                                                    [{"key": "fast", "operator": "Exists"}])),
                                 Verdict.AFFINITY, "no required node affinity term matches: term 1 fails: zone "
                                 "In [a] (the node has no zone label); term 2 fails: fast Exists (the node has "
                                 "no fast label)"),
    "nodeSelector": (dict(nodes=[node("n", labels={**A, "disk": "hdd"})], claims=[claim()],
                          spec={"nodeSelector": {"disk": "ssd"}}),
                     Verdict.NODE_SELECTOR, "nodeSelector disk=ssd: the node has disk=hdd"),
    "volume": (dict(nodes=[node("n", labels=A)], claims=[claim()], volumes=(VolumeConstraint(
        "data", "data-p", "pv-1", NodeSelector.from_api({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n9"]}]}]})),)),
        Verdict.VOLUME, "PersistentVolume pv-1 (claim data-p) is reachable only from nodes matching "
        "kubernetes.io/hostname In [n9]"),
    "short": (dict(nodes=[node("n", labels=A)], claims=[claim(count=4)], used={GPU: {"n": 6}}),
              Verdict.SHORT, "short by 2 nvidia.com/gpu: the set needs 4, 2 free"),
    "short-on-an-overcommitted-node": (dict(nodes=[node("n", labels=A)], claims=[claim(count=1)],
                                            used={GPU: {"n": 9}}),
                                       Verdict.SHORT, "short by 2 nvidia.com/gpu: the set needs 1, -1 free"),
    "class-selector-of-a-multi-class-set": (
        dict(nodes=[node("n", labels=A)], claims=[claim("g"), claim("m", class_name="mi300")],
             classes=(A100, ClassInfo("mi300", AMD, {"p": "mi300"}))),
        Verdict.CLASS_SELECTOR, "does not offer GPUClass mi300: it selects p=mi300, the node has p=a100"),
    "class-resource-missing": (
        dict(nodes=[node("n", labels={"p": "mi300"}, resources={GPU: 8})],
             claims=[claim("g"), claim("m", class_name="mi300")],
             classes=(ClassInfo("a100", GPU, {}), ClassInfo("mi300", AMD, {"p": "mi300"}))),
        Verdict.CLASS_SELECTOR, "does not offer GPUClass mi300: the node has no amd.com/gpu"),
    "over-budget": (dict(nodes=[node("n", labels=A)], claims=[claim(count=2)],
                         budgets=[BudgetInfo("ns", "team", (BudgetLimit("a100", 4),))],
                         use=BudgetUse({"a100": 3}, {})),
                    Verdict.OVER_BUDGET, "over budget: GPUBudget ns/team allows 4 a100 GPUs; 3 are bound; "
                    "this set needs 2 more"),
    "bound-claim-on-a-node-that-is-gone": (
        dict(nodes=[node("n", labels=A)], claims=[claim(on="gone-node")]),
        Verdict.GONE, "the node is gone; the claims bound there move with the set"),
}


@pytest.mark.parametrize("kw,verdict,message", VERDICTS.values(), ids=VERDICTS.keys())
def test_each_node_says_what_keeps_the_set_off_it(kw: dict[str, Any], verdict: Verdict, message: str) -> None:
    rows = verdicts(**kw)
    name = "gone-node" if verdict is Verdict.GONE else "n"
    assert rows[name] == (verdict, message)


def test_a_node_lists_every_problem_and_its_first_is_the_verdict() -> None:
    e = explain(pod({"nodeSelector": {"disk": "ssd"}}), [claim(count=4)],
                Cluster([node("n", labels=A, ready=False, taints=(Taint("x", "NoExecute"),))], [A100]),
                {GPU: {"n": 6}}, NOW)
    (row,) = e.nodes
    assert [p.verdict for p in row.problems] == [Verdict.NOT_READY, Verdict.NODE_SELECTOR, Verdict.TAINT,
                                                 Verdict.SHORT]
    assert (row.free, row.need) == ({GPU: 2}, {GPU: 4})


def test_the_chosen_node_comes_first_then_those_that_fit_then_the_rest_by_name() -> None:
    nodes = [node("a", labels=A, cordoned=True), node("b", labels=A), node("c", labels=A), node("d", labels=A)]
    e = explain(pod(), [claim(count=2)], Cluster(nodes, [A100]), {GPU: {"c": 4}}, NOW)
    assert isinstance(e.decision, Placed) and e.decision.node == "c"
    assert [(r.node, r.verdict, r.chosen) for r in e.nodes] == [
        ("c", Verdict.FITS, True), ("b", Verdict.FITS, False), ("d", Verdict.FITS, False),
        ("a", Verdict.CORDONED, False)]


def test_nodes_offering_none_of_the_set_s_classes_are_not_listed() -> None:
    nodes = [node("a", labels=A), node("h", labels={"p": "h100"}), node("cpu", resources={})]
    assert set(verdicts(nodes, [claim()])) == {"a"}


def test_a_claim_bound_on_a_node_whose_class_no_longer_selects_it_says_so() -> None:
    rows = verdicts([node("n", labels={"p": "a100-old"})], [claim(on="n")])
    assert rows["n"] == (Verdict.CLASS_SELECTOR, "GPUClass a100 of GPUClaim c1, bound here, no longer selects "
                                                 "the node: it selects p=a100, the node has p=a100-old")


def test_an_anchor_needs_only_the_rest_of_the_set() -> None:
    e = explain(pod(), [claim("kept", 4, on="n"), claim("new", 3)],
                Cluster([node("n", labels=A), node("m", labels=A)], [A100]), {GPU: {"n": 4}}, NOW)
    rows = {r.node: r for r in e.nodes}
    assert isinstance(e.decision, Placed) and e.decision.node == "n"
    assert (rows["n"].need, rows["n"].holds, rows["n"].chosen) == ({GPU: 3}, ("kept",), True)
    assert rows["m"].need == {GPU: 7}


def test_a_cordoned_node_keeping_an_onCordon_Stay_set_is_not_held_against_it() -> None:
    stay = ClassInfo("a100", GPU, A, OnCordon.STAY)
    rows = verdicts([node("n", labels=A, cordoned=True)], [claim(on="n")], classes=(stay,))
    assert rows["n"] == (Verdict.FITS, "fits")
    rows = verdicts([node("n", labels=A, cordoned=True)], [claim(on="n"), claim("new")], classes=(stay,))
    assert rows["n"][0] is Verdict.CORDONED and "new cannot be bound on a cordoned node" in rows["n"][1]


def test_over_budget_is_said_only_of_the_nodes_that_would_otherwise_fit() -> None:
    rows = verdicts([node("roomy", labels=A), node("full", labels=A)], [claim(count=2)],
                    used={GPU: {"full": 8}}, budgets=[BudgetInfo("ns", "team", (BudgetLimit("*", 1),))])
    assert rows["roomy"][0] is Verdict.OVER_BUDGET and rows["full"][0] is Verdict.SHORT


def test_the_decision_is_decide_s_own() -> None:
    args = (pod(), [claim(count=3)], Cluster([node("a", labels=A), node("b", labels=A)], [A100]),
            {GPU: {"a": 6, "b": 2}}, NOW, Strategy.SPREAD)
    assert explain(*args).decision == decide(*args)


# -- a node said to fit is one the decision could pick: random clusters ------------------


def _random_case(rng: random.Random) -> dict[str, Any]:
    zones, teams = ["a", "b"], ["x", "y"]
    classes = [ClassInfo("a100", GPU, {"p": "a100"}), ClassInfo("mi300", AMD, {"p": "mi300"}),
               ClassInfo("any", GPU, {})]
    nodes, used = [], {GPU: {}, AMD: {}}  # type: ignore[var-annotated]
    for i in range(rng.randint(1, 8)):
        name = f"n{i}"
        labels = {"p": rng.choice(["a100", "mi300", "h100"]), "zone": rng.choice(zones)}
        resources = {GPU: rng.choice([0, 2, 4, 8])}
        if rng.random() < 0.3:
            resources[AMD] = rng.choice([2, 4])
        taints = (Taint("team", "NoSchedule", rng.choice(teams)),) if rng.random() < 0.3 else ()
        nodes.append(node(name, labels=labels, taints=taints, ready=rng.random() > 0.1,
                          cordoned=rng.random() < 0.1, resources=resources))
        for r in resources:
            used[r][name] = rng.choice([0, 0, 1, 2, resources[r], resources[r] + 1])
    names = [n.name for n in nodes]
    n_claims = rng.choice([1, 1, 2, 3])
    claims = []
    for j in range(n_claims):
        cls = rng.choice(["a100", "a100", "any", "mi300"])
        on = rng.choice(names + ["gone"]) if rng.random() < 0.25 else ""
        rejected = (Rejection(rng.choice(names), NOW + timedelta(minutes=rng.choice([-1, 5]))),) \
            if rng.random() < 0.2 else ()
        claims.append(claim(f"c{j}", rng.choice([1, 1, 2, 4]), cls, on=on, rejected=rejected))
    spec: dict[str, Any] = {}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"zone": rng.choice(zones)}
    if rng.random() < 0.3:
        spec.update(affinity([{"key": "zone", "operator": rng.choice(["In", "NotIn"]), "values": ["a"]}]))
    if rng.random() < 0.5:
        spec["tolerations"] = [{"key": "team", "value": rng.choice(teams), "effect": "NoSchedule"}]
    budgets = [BudgetInfo("ns", "b", (BudgetLimit("*", rng.randint(0, 12)),))] if rng.random() < 0.2 else []
    return dict(pod=pod(spec), claims=claims, cluster=Cluster(nodes, classes), used=used, now=NOW,
                strategy=rng.choice(list(Strategy)), budgets=budgets, budget_use=BudgetUse({}, {}))


def test_on_random_clusters_the_chosen_node_fits_and_a_set_waits_only_when_no_node_fits() -> None:
    rng = random.Random(15)
    seen = {"placed": 0, "waiting with a node that fits": 0, "waiting": 0}
    for _ in range(3000):
        case = _random_case(rng)
        e = explain(**case)
        assert e.decision == decide(**case)
        # The budget refuses the set as a whole, before any node is chosen.
        assert (e.budget is not None) == (getattr(e.decision, "reason", None) is WaitReason.BUDGET)
        fits = {r.node for r in e.nodes if r.verdict is Verdict.FITS}
        if isinstance(e.decision, Placed):
            seen["placed"] += 1
            assert e.decision.node in fits, (case, e)
            assert [r.node for r in e.nodes if r.chosen] == [e.decision.node]
            continue
        assert isinstance(e.decision, Waiting)
        # Only a set held by its own claims waits while another node fits:
        # a NotReady node they are bound to (they wait to be Lost first).
        held_not_ready = any(c.bound and c.node_name in case["cluster"].nodes
                             and not case["cluster"].nodes[c.node_name].ready
                             and not case["cluster"].nodes[c.node_name].unschedulable
                             for c in case["claims"])
        if fits:
            seen["waiting with a node that fits"] += 1
            assert held_not_ready, (case, e)
        else:
            seen["waiting"] += 1
    assert seen["placed"] > 300 and seen["waiting"] > 300 and seen["waiting with a node that fits"], seen


# -- the report -------------------------------------------------------------------------


def api_node(name: str, gpus: int, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": {"allocatable": {GPU: str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]}}


def api_pod(name: str, entries: list[dict[str, Any]], *, gated: bool = True, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "creationTimestamp": "2025-06-01T11:50:00Z",
                         "annotations": {CLAIMS_ANNOTATION: json.dumps(entries), **meta.pop("annotations", {})},
                         **meta},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}] if gated else [],
                     "containers": [{"name": "main"}]}}


CLASS = {"metadata": {"name": "a100"}, "spec": {"nodeSelector": {"p": "a100"}}}


def test_why_a_waiting_pod_shows_its_set_what_the_controller_said_the_decision_and_each_node() -> None:
    waiting = {"type": "Waiting", "status": "True", "reason": "Capacity", "message": "no room",
               "lastTransitionTime": "2025-06-01T11:58:00Z"}
    objects = ClusterObjects(
        nodes=[api_node("a0", 8, {"p": "a100"}), api_node("a1", 4, {"p": "a100"},
                                                         taints=[{"key": "t", "effect": "NoSchedule"}])],
        classes=[CLASS],
        claims=[{"metadata": {"name": "mine", "namespace": "team", "uid": "u1"},
                 "spec": {"className": "a100", "count": 2}, "status": {"conditions": [waiting]}},
                {"metadata": {"name": "other", "namespace": "team", "uid": "u2"},
                 "spec": {"className": "a100", "count": 7},
                 "status": {"phase": "Bound", "nodeName": "a0", "reservedFor": [{"name": "x", "uid": "x"}]}}],
        budgets=[{"metadata": {"name": "team", "namespace": "team"},
                  "spec": {"limits": [{"className": "a100", "gpus": 16}]}}])
    p = api_pod("trainer", [{"name": "gpu", "claim": "mine"}, {"name": "eval", "className": "a100", "count": 1}])
    report = why.build(p, objects, NOW)
    text = why.render_text(report)
    assert report.state == why.State.WAITING
    assert "Pod team/trainer waits for its GPU claims (gated by gpuclaimctl.io/claims, created 10m ago)." in text
    assert "The controller says (since 2025-06-01T11:58:00Z (2m ago)): Capacity: no room" in text
    assert "Decided now: waits, Capacity: GPUClaims mine (2 × a100), trainer-eval (1 × a100) needs 3" in text
    assert "trainer-eval  a100   1      Pending  -     not created yet: the controller creates it" in text
    rows = {line.split()[0]: line.split()[1:4] for line in text.splitlines() if line.startswith("a")}
    assert rows == {"a0": ["short", "nvidia.com/gpu=1", "nvidia.com/gpu=3"],
                    "a1": ["taint", "nvidia.com/gpu=4", "nvidia.com/gpu=3"]}
    assert "team    a100   16     7" in text  # the budget, and what the namespace's claims hold
    assert "in flight" in text

    doc = json.loads(why.render_json(report))
    assert doc["decision"]["result"] == "waiting" and doc["decision"]["reason"] == "Capacity"
    assert doc["controller"] == {"claim": "mine", "reason": "Capacity", "message": "no room",
                                 "since": "2025-06-01T11:58:00Z"}
    assert [(n["node"], n["verdict"], n["free"]) for n in doc["nodes"]] == [
        ("a0", "short", {GPU: 1}), ("a1", "taint", {GPU: 4})]
    assert [c["exists"] for c in doc["claims"]] == [True, False]


def test_why_a_pod_whose_claim_the_api_server_refuses_says_so_not_that_the_controller_makes_it() -> None:
    """A refused claim has no status to carry a condition: the pod's own
    Warning event is where the controller said it, and why reads it."""
    from gpuclaimctl.decide.podplan import refused_create_message
    objects = ClusterObjects(nodes=[api_node("a0", 8, {"p": "a100"})], classes=[CLASS])
    p = api_pod("trainer", [{"name": "gpu", "className": "a100", "count": 1}])
    said = refused_create_message("trainer-gpu", "entry 'gpu'", 422, "Invalid",
                                  "spec.count: Invalid value: 1: over the limit")
    events = [
        {"type": "Warning", "reason": "Capacity", "message": "older", "source": {"component": "gpuclaimctl"},
         "lastTimestamp": "2025-06-01T11:52:00Z"},
        {"type": "Warning", "reason": "ClaimMissing", "message": said, "reportingComponent": "gpuclaimctl",
         "source": {"component": "gpuclaimctl"}, "lastTimestamp": "2025-06-01T11:58:00Z"},
        {"type": "Warning", "reason": "FailedScheduling", "message": "not ours",
         "source": {"component": "default-scheduler"}, "lastTimestamp": "2025-06-01T11:59:00Z"}]
    report = why.build(p, objects, NOW, events=events)
    text = why.render_text(report)
    assert "not created: the API server refused it (see the warning)" in text
    assert "not created yet: the controller creates it" not in text
    assert f"Its latest warning event (2025-06-01T11:58:00Z (2m ago)): ClaimMissing: {said}" in text
    assert "as if GPUClaim trainer-gpu could be created" in text
    assert "The controller says: no Waiting condition on the claims (none it could write" in text
    assert "nothing yet" not in text
    doc = json.loads(why.render_json(report))
    assert doc["refused"] == ["trainer-gpu"]
    assert doc["lastWarning"] == {"reason": "ClaimMissing", "message": said, "time": "2025-06-01T11:58:00Z"}

    odd = why.build(p, objects, NOW, events=[{"type": "Warning", "source": "gpuclaimctl"}, {"type": "Warning"}])
    assert odd.warned is None  # an event not as the API server makes them: no crash
    quiet = why.build(p, objects, NOW, events=events[2:])  # only kube-scheduler's
    assert quiet.warned is None and why.refused(quiet) == []
    assert "not created yet: the controller creates it" in why.render_text(quiet)
    assert "The controller says: nothing yet" in why.render_text(quiet)
    # An older warning about a pod whose claims all exist now: not blamed on them.
    own = {"metadata": {"name": "trainer-gpu", "namespace": "team", "uid": "c1",
                        "labels": {TEMPLATE_CLAIM_LABEL: TEMPLATE_CLAIM_LABEL_VALUE},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                             "uid": "uid-trainer", "controller": True}]},
           "spec": {"className": "a100", "count": 1}, "status": {}}
    stale = why.build(p, ClusterObjects(nodes=objects.nodes, classes=[CLASS], claims=[own]), NOW,
                      events=events[:1])
    assert stale.warned is not None
    assert "The controller says: nothing yet" in why.render_text(stale)


def _too_big(said: tuple[str, str] | None = None) -> tuple[dict[str, Any], ClusterObjects]:
    """A pod whose claim of 9 GPUs waits on one node of 8, its claim carrying
    `said` (reason, message) as its Waiting condition."""
    status: dict[str, Any] = {} if said is None else {"conditions": [{
        "type": "Waiting", "status": "True", "reason": said[0], "message": said[1],
        "lastTransitionTime": "2025-06-01T11:58:00Z"}]}
    big = {"metadata": {"name": "big", "namespace": "team", "uid": "u1"},
           "spec": {"className": "a100", "count": 9}, "status": status}
    return (api_pod("trainer", [{"name": "gpu", "claim": "big"}]),
            ClusterObjects(nodes=[api_node("a0", 8, {"p": "a100"})], classes=[CLASS], claims=[big]))


def _decided_now() -> tuple[str, str]:
    """The reason and message a decision made now gives _too_big's pod."""
    outcome = why.build(*_too_big(), NOW).outcome
    assert outcome is not None and outcome.explanation is not None
    decision = outcome.explanation.decision
    assert isinstance(decision, Waiting)
    return str(decision.reason), decision.message


def _warning(said: tuple[str, str]) -> dict[str, Any]:
    return {"type": "Warning", "reason": said[0], "message": said[1], "source": {"component": "gpuclaimctl"},
            "lastTimestamp": "2025-06-01T11:59:00Z"}


def test_why_says_once_what_the_claims_the_warning_and_the_decision_made_now_all_say() -> None:
    """Issue 45: one message printed three times (controller says, latest
    warning event, decided now) when they agree."""
    reason, message = now = _decided_now()
    report = why.build(*_too_big(now), NOW, events=[_warning(now)])
    text = why.render_text(report)
    assert text.count(message) == 1, text
    assert f"The controller says (since 2025-06-01T11:58:00Z (2m ago)): {reason}: {message}\n" \
           "Its latest warning event (2025-06-01T11:59:00Z (60s ago)) and a decision made now say the same.\n" \
           in text
    assert "Decided now" not in text
    # -o json keeps each of them, for a script.
    doc = json.loads(why.render_json(report))
    assert doc["controller"]["message"] == doc["lastWarning"]["message"] == doc["decision"]["message"] == message


def test_why_shows_in_full_only_what_says_something_else() -> None:
    reason, message = now = _decided_now()
    older = ("ClassNotFound", "an older wait")
    # The warning event is older news: in full; the decision agrees with the claim.
    text = why.render_text(why.build(*_too_big(now), NOW, events=[_warning(older)]))
    assert text.count(message) == 1, text
    assert f"{reason}: {message}\nA decision made now says the same.\n" \
           "Its latest warning event (2025-06-01T11:59:00Z (60s ago)): ClassNotFound: an older wait\n" in text
    # The claim's condition is stale; the warning and the decision agree.
    text = why.render_text(why.build(*_too_big(older), NOW, events=[_warning(now)]))
    assert text.count(message) == 1, text
    assert f"ClassNotFound: an older wait\nIts latest warning event (2025-06-01T11:59:00Z (60s ago)): " \
           f"{reason}: {message}\nA decision made now says the same.\n" in text
    # Each says something else: each in full.
    text = why.render_text(why.build(*_too_big(older), NOW, events=[_warning((reason, "older still"))]))
    assert "ClassNotFound: an older wait" in text and f"{reason}: older still" in text
    assert f"Decided now: waits, {reason}: {message}" in text and "the same" not in text
    # No condition and no event: the decision in full, as before.
    text = why.render_text(why.build(*_too_big(), NOW))
    assert "The controller says: nothing yet" in text and f"Decided now: waits, {reason}: {message}" in text


def test_why_a_released_pod_says_where_it_went_and_when() -> None:
    p = api_pod("trainer", [{"name": "gpu", "className": "a100", "count": 1}], gated=False,
                annotations={PLACED_NODE_ANNOTATION: "a0"},
                managedFields=[
                    {"manager": "kubectl", "operation": "Update", "time": "2025-06-01T11:50:00Z",
                     "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{CLAIMS_ANNOTATION}": {}}}}},
                    {"manager": "gpuclaimctl", "operation": "Update", "time": "2025-06-01T11:51:00Z",
                     "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{PLACED_NODE_ANNOTATION}": {}}}}}])
    p["spec"]["nodeName"] = "a0"
    p["status"] = {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-06-01T11:51:01Z"}]}
    claims = [{"metadata": {"name": "trainer-gpu", "namespace": "team"}, "spec": {"className": "a100", "count": 1},
               "status": {"phase": "Bound", "nodeName": "a0"}}]
    events = [{"reason": "Placed", "message": "GPU claims placed on node a0: GPUClaim trainer-gpu (1 × a100) "
               "placed on node a0", "lastTimestamp": "2025-06-01T11:51:00Z"}]
    report = why.build(p, ClusterObjects(claims=claims), NOW, events=events)
    text = why.render_text(report)
    assert text.splitlines()[:3] == [
        "Pod team/trainer was released by gpuclaimctl to node a0 at 2025-06-01T11:51:00Z (9m ago).",
        "kube-scheduler bound it to a0 at 2025-06-01T11:51:01Z (8m59s ago); phase Running.",
        "Placed event (2025-06-01T11:51:00Z (9m ago)): GPU claims placed on node a0: GPUClaim trainer-gpu "
        "(1 × a100) placed on node a0"]
    assert "trainer-gpu  a100   1      Bound  a0" in text
    doc = json.loads(why.render_json(report))
    assert doc["release"]["releasedAt"] == "2025-06-01T11:51:00Z" and doc["release"]["boundNode"] == "a0"


def test_why_a_pod_without_claims_says_gpuclaimctl_does_not_place_it() -> None:
    plain = {"metadata": {"name": "web", "namespace": "team"}, "spec": {}}
    assert why.render_text(why.build(plain, ClusterObjects(), NOW)) == (
        "Pod team/web is not placed by gpuclaimctl: it has no gpuclaimctl.io/claims annotation: it does not "
        "use GPU claims.\n")
    ungated = api_pod("p", [{"name": "g", "className": "a100", "count": 1}], gated=False)
    assert "carries no gpuclaimctl.io/claims scheduling gate" in why.render_text(
        why.build(ungated, ClusterObjects(), NOW))


def test_why_an_invalid_annotation_says_InvalidClaims() -> None:
    p = api_pod("p", [])
    p["metadata"]["annotations"][CLAIMS_ANNOTATION] = "not json"
    text = why.render_text(why.build(p, ClusterObjects(), NOW))
    assert "InvalidClaims: annotation gpuclaimctl.io/claims is invalid: not valid JSON" in text


@pytest.mark.parametrize("arg,ns,expect", [
    ("team/trainer", None, ("team", "trainer")),
    ("trainer", "team", ("team", "trainer")),
    ("trainer", None, ("default", "trainer")),
])
def test_the_pod_is_named_namespace_slash_name_or_with_n(arg: str, ns: str | None,
                                                          expect: tuple[str, str]) -> None:
    assert why.target(arg, ns) == expect


@pytest.mark.parametrize("arg", ["", "kube-system/?watch=true", "team/a b", "Team/p", "team/P",
                                 "team/" + "p" * 254, "../x/p"])
def test_a_name_the_api_server_could_not_hold_is_refused_before_any_request(arg: str) -> None:
    """The names go into the request's path: an empty one read the pod
    list as if it were a pod, and `?watch=true` never ended."""
    result = CliRunner().invoke(cli.main, ["why", arg, "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "not a pod name" in result.output or "not a namespace name" in result.output \
        or "expected NAMESPACE/POD" in result.output


def test_a_namespace_given_twice_differently_is_refused_in_one_line() -> None:
    result = CliRunner().invoke(cli.main, ["why", "a/p", "-n", "b"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "-n says b" in result.output


# -- against the real plane ---------------------------------------------------------------


@pytest.fixture(scope="module")
def controller(full_plane: ControlPlane, crds: list[str]) -> Iterator[RunningController]:
    rc = RunningController(str(full_plane.kubeconfig)).start()
    yield rc
    rc.stop()


@pytest.mark.plane
def test_why_on_the_real_plane_explains_a_waiting_pod_then_where_the_released_one_went(
    full_plane: ControlPlane, controller: RunningController, api_client: Any, namespace: str, gpu_nodes: Any,
) -> None:
    from tests.test_e2e import Cluster

    cluster = Cluster(api_client, namespace)
    try:
        big = gpu_nodes("why-big", gpus=4, labels=cluster.label)["metadata"]["name"]
        tainted = gpu_nodes("why-tainted", gpus=8, labels=cluster.label, taints=[
            {"key": "team", "value": "vision", "effect": "NoSchedule"}])["metadata"]["name"]
        cls = cluster.gpu_class("a100")
        kubeconfig = str(full_plane.kubeconfig)
        cluster.pod("huge", [{"name": "g", "className": cls, "count": 6}])
        wait_for(lambda: cluster.waiting_reason("huge-g"), timeout=30, message="huge-g to wait")

        result = CliRunner().invoke(cli.main, ["why", f"{namespace}/huge", "--kubeconfig", kubeconfig,
                                               "-o", "json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        assert doc["state"] == "waiting"
        # 6 where the only node the pod may use has 4 in all (the tainted
        # one it does not tolerate has 8): never, as things are.
        assert doc["controller"]["reason"] == "Unsatisfiable" == doc["decision"]["reason"]
        assert "1 node that large the pod's nodeSelector, affinity or tolerations exclude" in \
            doc["decision"]["message"]
        assert {n["node"]: (n["verdict"], n["free"], [p["verdict"] for p in n["problems"]])
                for n in doc["nodes"]} == {
            big: ("too small", {GPU: 4}, ["too small"]),
            tainted: ("taint", {GPU: 8}, ["taint"])}
        assert "in flight" in doc["note"]

        text = CliRunner().invoke(cli.main, ["why", "huge", "-n", namespace, "--kubeconfig", kubeconfig]).output
        assert f"{tainted}  taint" in text and "taint team=vision:NoSchedule not tolerated" in text
        assert f"{big}" in text and "too small: the set needs 6 nvidia.com/gpu here, the node has 4 in all" in text

        cluster.pod("small", [{"name": "g", "className": cls, "count": 2}])
        wait_for(lambda: cluster.running_on("small", big), timeout=30,
                 message=lambda: f"small Running on {big}: {cluster.describe_pod('small')}")
        wait_for(lambda: cluster.events("Placed"), timeout=10, message="the Placed event")
        doc = json.loads(CliRunner().invoke(cli.main, ["why", f"{namespace}/small", "--kubeconfig", kubeconfig,
                                                       "-o", "json"]).output)
        assert doc["state"] == "released"
        rel = doc["release"]
        assert (rel["node"], rel["boundNode"], rel["phase"]) == (big, big, "Running")
        created = datetime.fromisoformat(doc["created"])
        released = datetime.fromisoformat(rel["releasedAt"])
        assert created <= released <= datetime.now(UTC)
        assert f"placed on node {big}" in rel["placedEvent"]["message"]
        assert doc["claims"] == [{"name": "small-g", "className": cls, "count": 2, "phase": "Bound",
                                  "node": big, "exists": True}]
        # The huge pod now sees 2 GPUs taken on the small node.
        doc = json.loads(CliRunner().invoke(cli.main, ["why", f"{namespace}/huge", "--kubeconfig", kubeconfig,
                                                       "-o", "json"]).output)
        assert {n["node"]: n["free"] for n in doc["nodes"]}[big] == {GPU: 2}

        # A claim the API server refuses to create (a quota full with the
        # two above): why tells it from the pod's Warning event.
        quota = f"/api/v1/namespaces/{namespace}/resourcequotas/claims"
        counted = "count/gpuclaims.gpuclaimctl.io"
        kube.request(api_client, "POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body={
            "metadata": {"name": "claims"}, "spec": {"hard": {counted: "2"}}})
        # Its status as kube-controller-manager's quota controller writes it
        # (admission reads the status; the controller may take minutes to
        # discover a custom resource to count).
        kube.request(api_client, "PATCH", f"{quota}/status", content_type="application/merge-patch+json",
                     body={"status": {"hard": {counted: "2"}, "used": {counted: "2"}}})
        cluster.pod("capped", [{"name": "g", "className": cls, "count": 1}])
        wait_for(lambda: cluster.events("ClaimMissing"), timeout=30,
                 message=lambda: f"a ClaimMissing warning: {cluster.describe_pod('capped')}")
        doc = json.loads(CliRunner().invoke(cli.main, ["why", f"{namespace}/capped", "--kubeconfig", kubeconfig,
                                                       "-o", "json"]).output)
        assert doc["refused"] == ["capped-g"], doc
        assert doc["lastWarning"]["reason"] == "ClaimMissing"
        assert "refused to create GPUClaim 'capped-g'" in doc["lastWarning"]["message"]
        assert "403 Forbidden" in doc["lastWarning"]["message"]
        # Room in the quota again: its update retries the refused pod (not
        # its backoff), and why says where it went.
        for sub, body in (("", {"spec": {"hard": {counted: "3"}}}), ("/status", {"status": {"hard": {counted: "3"}}})):
            kube.request(api_client, "PATCH", quota + sub, body=body, content_type="application/merge-patch+json")
        wait_for(lambda: cluster.running_on("capped", big), timeout=30,
                 message=lambda: f"capped Running on {big}: {cluster.describe_pod('capped')}")
        doc = json.loads(CliRunner().invoke(cli.main, ["why", f"{namespace}/capped", "--kubeconfig", kubeconfig,
                                                       "-o", "json"]).output)
        assert doc["state"] == "released" and doc["release"]["node"] == big
    finally:
        cluster.cleanup()


@pytest.mark.plane
def test_why_a_pod_that_is_not_there_fails_with_one_line(control_plane: ControlPlane, crds: list[str]) -> None:
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    result = CliRunner().invoke(cli.main, ["why", f"default/{name}",
                                           "--kubeconfig", str(control_plane.kubeconfig)])
    assert result.exit_code == 1 and result.output == f"gpuclaimctl why: pod default/{name} not found\n"


def test_why_does_not_say_what_another_pod_s_claim_waits_for() -> None:
    """Its Waiting condition tells that pod's wait, not this one's
    (status reads it the same way: statusview.waiting_pods)."""
    waiting = {"type": "Waiting", "status": "True", "reason": "Capacity", "message": "train's wait",
               "lastTransitionTime": "2025-06-01T11:58:00Z"}
    theirs = {"metadata": {"name": "train-gpu", "namespace": "team", "uid": "c1",
                           "labels": {TEMPLATE_CLAIM_LABEL: TEMPLATE_CLAIM_LABEL_VALUE},
                           "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train",
                                                "uid": "uid-train", "controller": True}]},
              "spec": {"className": "a100", "count": 5}, "status": {"conditions": [waiting]}}
    borrowed = {"metadata": {"name": "nb-gpu", "namespace": "team", "uid": "c2"},
                "spec": {"className": "a100", "count": 1},
                "status": {"phase": "Bound", "nodeName": "a0", "reservedFor": [{"name": "nb", "uid": "nb"}],
                           "conditions": [waiting]}}
    objects = ClusterObjects(nodes=[api_node("a0", 8, {"p": "a100"})], classes=[CLASS], claims=[theirs, borrowed])
    for entry in ({"name": "gpu", "claim": "train-gpu"}, {"name": "gpu", "claim": "nb-gpu"}):
        report = why.build(api_pod("steal", [entry]), objects, NOW)
        assert report.said is None, entry
        assert "train's wait" not in why.render_text(report)


def test_why_does_not_say_what_a_claim_other_pods_name_too_waits_for() -> None:
    """Found by a review: a claim two gated pods name carries the reason of
    the one decided last; why showed it as what the controller says of the
    other (status gives each its own: statusview.waiting_pods)."""
    waiting = {"type": "Waiting", "status": "True", "reason": "Capacity", "message": "b's wait",
               "lastTransitionTime": "2025-06-01T11:58:00Z"}
    shared = {"metadata": {"name": "shared", "namespace": "team", "uid": "c1"},
              "spec": {"className": "a100", "count": 2}, "status": {"conditions": [waiting]}}
    a = api_pod("a", [{"name": "g", "claim": "shared"}], uid="uid-a")
    b = api_pod("b", [{"name": "g", "claim": "shared"}], uid="uid-b")
    objects = ClusterObjects(nodes=[api_node("a0", 8, {"p": "a100"})], classes=[CLASS], claims=[shared],
                             pods=[a, b])
    assert why.build(a, objects, NOW).said is None
    alone = ClusterObjects(nodes=objects.nodes, classes=[CLASS], claims=[shared], pods=[a])
    said = why.build(a, alone, NOW).said
    assert said is not None and said.message == "b's wait"  # no other pod names it: its own


def test_why_a_gang_member_shows_the_gang_s_decision() -> None:
    """Issue 44 item 4: on 3 nodes of 8, each of 4 members of 8 fits alone,
    but the gang does not: why says GangCapacity, as the controller does; a
    fourth node places the member."""
    from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION

    gang = {GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "4"}
    members = [api_pod(f"train-{i}", [{"name": "g", "className": "a100", "count": 8}], annotations=dict(gang))
               for i in range(4)]
    nodes = [api_node(f"a{i}", 8, {"p": "a100"}) for i in range(3)]
    report = why.build(members[0], ClusterObjects(nodes=nodes, classes=[CLASS], pods=members), NOW)
    text = why.render_text(report)
    assert "Decided now: waits, GangCapacity: gang train: 3 of 4 sets fit at once" in text, text
    assert "member of gang train (size 4)" in text
    report = why.build(members[0], ClusterObjects(nodes=[*nodes, api_node("a3", 8, {"p": "a100"})],
                                                  classes=[CLASS], pods=members), NOW)
    assert "Decided now: placed on node" in why.render_text(report)
    member = {"metadata": {"name": "train-0", "namespace": "ns", "annotations": dict(gang)}}
    note = why.gang_note(member)
    assert "member of gang train (size 4)" in note and "all at once or none" in note
    assert why.gang_note({"metadata": {"name": "p", "namespace": "ns"}}) == ""
    bad = {"metadata": {"name": "p", "namespace": "ns", "annotations": {GANG_ANNOTATION: "Bad_Name"}}}
    assert "gang annotations are wrong" in why.gang_note(bad)


def test_why_a_podgroup_member_shows_the_gang_s_decision() -> None:
    members = [api_pod(f"train-{i}", [{"name": "g", "className": "a100", "count": 8}]) for i in range(4)]
    for m in members:
        m["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    group = {"metadata": {"name": "train", "namespace": "team"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}
    nodes = [api_node(f"a{i}", 8, {"p": "a100"}) for i in range(3)]
    report = why.build(members[0], ClusterObjects(nodes=nodes, classes=[CLASS], pods=members), NOW,
                       podgroups=lambda ns, name: group if (ns, name) == ("team", "train") else None)
    text = why.render_text(report)
    assert "Decided now: waits, GangCapacity" in text and "3 of 4 sets fit at once" in text, text
    assert "(size 4)" in text


# -- preemption (issue 46) ----------------------------------------------------------------


def running(name: str, node: str, gpus: int, priority: int = 0, *, deleting: str = "",
            annotations: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod gpuclaimctl placed on `node` and its claim holding `gpus` there."""
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}",
                            "creationTimestamp": "2025-06-01T10:00:00Z", "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = deleting
    pod = {"metadata": meta, "spec": {"nodeName": node, "priority": priority, "containers": [{"name": "main"}]},
           "status": {"phase": "Running"}}
    claim = {"metadata": {"name": f"{name}-g", "namespace": "team", "uid": f"c-{name}"},
             "spec": {"className": "a100", "count": gpus},
             "status": {"phase": "Bound", "nodeName": node, "resourceName": GPU,
                        "reservedFor": [{"name": name, "uid": f"uid-{name}"}]}}
    return pod, claim


def urgent(count: int = 6, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    p = api_pod("urgent", [{"name": "g", "className": "a100", "count": count}])
    p["spec"].update(priority=priority, **spec)
    return p


def cluster(*placed: tuple[str, str, int, int], nodes: int = 2, claims: list[dict[str, Any]] | None = None,
            deleting: str = "") -> ClusterObjects:
    """Nodes a0.. of 8 GPUs, and (name, node, GPUs, priority) pods placed there."""
    pods, held = [], []
    for name, node, gpus, priority in placed:
        p, c = running(name, node, gpus, priority, deleting=deleting)
        pods.append(p)
        held.append(c)
    return ClusterObjects(nodes=[api_node(f"a{i}", 8, {"p": "a100"}) for i in range(nodes)], classes=[CLASS],
                          claims=held + (claims or []), pods=pods)


def test_why_a_pod_that_waits_for_room_shows_the_preemption_the_controller_would_make() -> None:
    """Six GPUs wanted, none free: on a0 the two pods of lower priority give
    eight; a1's pod outranks it. Why shows the node, the victims and their
    priorities, and the decision as the controller's: Preempting. Nothing
    is evicted: the objects read are as they were."""
    objects = cluster(("nb-0", "a0", 4, 0), ("nb-1", "a0", 4, 10), ("big", "a1", 8, 5000))
    before = json.dumps(objects.__dict__, sort_keys=True, default=str)
    report = why.build(urgent(), objects, NOW)
    text = why.render_text(report)
    assert "Its priority 1000." in text
    assert ("Decided now: waits, Preempting: GPUClaim urgent-g (6 × a100): preempting 2 pods of lower priority "
            "on node a0: team/nb-0 (priority 0), team/nb-1 (priority 10)") in text, text
    lines = text.splitlines()
    at = lines.index("Preemption the controller would make now (at priority 1000), on node a0:")
    assert [line.split() for line in lines[at + 1:at + 4]] == [
        ["VICTIM", "PRIORITY", "NODE", "FREES", "ACTION"],
        ["team/nb-0", "0", "a0", "nvidia.com/gpu=4", "evict"],
        ["team/nb-1", "10", "a0", "nvidia.com/gpu=4", "evict"]]
    assert "Nothing is evicted here." in text
    assert json.dumps(objects.__dict__, sort_keys=True, default=str) == before

    doc = json.loads(why.render_json(report))
    assert (doc["priority"], doc["preemptionPolicy"]) == (1000, None)
    assert doc["decision"]["reason"] == "Preempting"
    assert doc["preemption"]["node"] == "a0" and doc["preemption"]["waitingFor"] == []
    assert [(v["pod"], v["priority"], v["frees"]) for v in doc["preemption"]["victims"]] == [
        ("team/nb-0", 0, {GPU: 4}), ("team/nb-1", 10, {GPU: 4})]


@pytest.mark.parametrize("pod, objects, rules, said", [
    pytest.param(urgent(), cluster(("boss", "a0", 8, 2000), ("peer", "a1", 8, 1000)), decisionview.PREEMPTION,
                 "Preemption (at priority 1000): none would make it fit: evicting pods of lower priority (below "
                 "1000) that gpuclaimctl placed would not free what it needs on one node.",
                 id="no-pod-of-lower-priority"),
    pytest.param(urgent(preemptionPolicy="Never"), cluster(("nb", "a0", 8, 0), nodes=1), decisionview.PREEMPTION,
                 "Preemption (at priority 1000): none: its preemptionPolicy is Never (it waits for room, "
                 "evicting nothing).", id="preemptionPolicy-Never"),
    pytest.param(urgent(), cluster(("nb", "a0", 8, 0), nodes=1), decisionview.preemption_rules(enabled=False),
                 "Preemption (at priority 1000): none: the controller's preemption is off (--no-preemption).",
                 id="controller-without-preemption"),
])
def test_why_says_why_no_pod_would_be_evicted(pod: dict[str, Any], objects: ClusterObjects, rules: Any,
                                              said: str) -> None:
    report = why.build(pod, objects, NOW, preemption=rules)
    text = why.render_text(report)
    assert said in text.splitlines(), text
    assert "Decided now: waits, Capacity" in text
    assert json.loads(why.render_json(report))["preemption"]["victims"] == []


def test_why_says_a_pod_never_preempts_and_shows_no_preemption_where_room_is_not_what_it_waits_for() -> None:
    report = why.build(urgent(preemptionPolicy="Never"), cluster(), NOW)
    text = why.render_text(report)
    assert "Its priority 1000, preemptionPolicy Never (it never preempts)." in text
    assert "Decided now: placed on node" in text and "Preemption" not in text
    assert json.loads(why.render_json(report))["preemptionPolicy"] == "Never"
    missing = why.build(api_pod("p", [{"name": "g", "claim": "nosuch"}]), cluster(("nb", "a0", 8, -5), nodes=1),
                        NOW)
    assert "Preemption" not in why.render_text(missing)
    full = cluster(("nb", "a0", 8, 0), ("x", "a1", 8, 0))
    assert "Preemption" in why.render_text(why.build(urgent(), full, NOW))
    assert "Preemption" not in why.render_text(why.build(urgent(), full, NOW, preemption=None))


def test_why_a_preempting_pod_is_explained_and_waits_for_its_terminating_victims() -> None:
    """The controller evicted a0's two pods for it and its claim says
    Preempting; while they terminate their GPUs still show in use, and
    the plan made now waits for them rather than evicting more."""
    message = ("GPUClaim urgent-g (6 × a100): preempting 2 pods of lower priority on node a0: team/nb-0 "
               "(priority 0), team/nb-1 (priority 0); the GPUs they free are held for it")
    mine = {"metadata": {"name": "urgent-g", "namespace": "team", "uid": "c-urgent",
                         "labels": {TEMPLATE_CLAIM_LABEL: TEMPLATE_CLAIM_LABEL_VALUE},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "urgent",
                                              "uid": "uid-urgent", "controller": True}]},
            "spec": {"className": "a100", "count": 6},
            "status": {"conditions": [{"type": "Waiting", "status": "True", "reason": "Preempting",
                                       "message": message, "lastTransitionTime": "2025-06-01T11:59:50Z"}]}}
    objects = cluster(("nb-0", "a0", 4, 0), ("nb-1", "a0", 4, 0), nodes=1, claims=[mine],
                      deleting="2025-06-01T11:59:50Z")
    text = why.render_text(why.build(urgent(), objects, NOW))
    assert f"The controller says (since 2025-06-01T11:59:50Z (10s ago)): Preempting: {message}" in text
    assert why.PREEMPTING_SAID in text
    assert "Decided now: waits, Preempting: GPUClaim urgent-g (6 × a100): waiting for 2 terminating pods there: " \
           "team/nb-0, team/nb-1" in text, text
    rows = [line.split()[:2] + [line.split()[-1]] for line in text.splitlines() if line.startswith("team/nb-")]
    assert rows == [["team/nb-0", "0", "for"], ["team/nb-1", "0", "for"]]  # terminating: waited for


def test_why_a_gang_member_shows_the_gang_s_preemption_at_its_highest_priority() -> None:
    from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION

    gang = {GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "2"}
    members = [api_pod(f"train-{i}", [{"name": "g", "className": "a100", "count": 8}], annotations=dict(gang))
               for i in range(2)]
    members[0]["spec"]["priority"], members[1]["spec"]["priority"] = 0, 1000
    objects = cluster(("nb-0", "a0", 8, 10), ("nb-1", "a1", 8, 20))
    objects = ClusterObjects(nodes=objects.nodes, classes=[CLASS], claims=objects.claims,
                             pods=[*objects.pods, *members])
    report = why.build(members[0], objects, NOW)
    text = why.render_text(report)
    assert "Its priority 0; its gang's is 1000 (its members' highest)." in text
    assert ("Decided now: waits, Preempting: gang train: preempting 2 pods of lower priority on node a0, a1: "
            "team/nb-0 (priority 10), team/nb-1 (priority 20)") in text, text
    assert "Preemption the controller would make now (at priority 1000), on node a0, a1:" in text
    # A member that says Never keeps the whole gang from preempting.
    members[1]["spec"]["preemptionPolicy"] = "Never"
    text = why.render_text(why.build(members[0], objects, NOW))
    assert "Decided now: waits, GangCapacity" in text
    assert "none: a member of its gang has preemptionPolicy Never" in text


@pytest.mark.parametrize("flags, preemption", [([], True), (["--no-preemption"], False), (["--preemption"], True)])
def test_why_is_told_whether_the_controller_preempts(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                     preemption: bool) -> None:
    seen: list[tuple[Any, ...]] = []

    def main(*args: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(why, "main", main)
    monkeypatch.delenv("GPUCLAIMCTL_PREEMPTION", raising=False)
    result = CliRunner().invoke(cli.main, ["why", "team/p", *flags])
    assert result.exit_code == 0, result.output
    assert seen[0][-1] is preemption


# -- GPUs served by DRA (docs/dra.md) --------------------------------------------------------


def _dra_cluster(*claims: dict[str, Any], selector: str | None = None) -> tuple[ClusterObjects, Any]:
    """Node dp-0 with 2 GPUs of its device plugin and dra-0 with none but 4
    devices its ResourceSlice publishes, mapped to nvidia.com/gpu by a
    DeviceClass (`selector`: its CEL); `claims`: allocated ResourceClaims."""
    from gpuclaimctl.cmd.statusview import DraObjects
    from tests.test_dra_state import device_class, gpu, gpu_class, node_obj, rslice

    objects = ClusterObjects(nodes=[node_obj("dp-0", 2), node_obj("dra-0")], classes=[gpu_class("a")])
    return objects, DraObjects(slices=[rslice("s0", "dra-0", [gpu(f"g{i}") for i in range(4)])],
                               device_classes=[device_class(selector=selector)], claims=list(claims))


def _node_rows(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines() if line.startswith(("dp-0 ", "dra-0 "))}


def test_why_counts_a_dra_node_like_a_device_plugin_node_and_says_which_way_each_serves() -> None:
    from tests.test_dra_state import DRIVER

    objects, dra = _dra_cluster()
    report = why.build(api_pod("train", [{"name": "gpu", "className": "a", "count": 3}]), objects, NOW, dra=dra)
    assert report.outcome is not None and report.outcome.explanation is not None
    decision = report.outcome.explanation.decision
    assert isinstance(decision, Placed) and decision.node == "dra-0"
    text = why.render_text(report)
    rows = _node_rows(text)
    assert rows["dra-0"].split()[:4] == ["dra-0", "fits", "(chosen)", "nvidia.com/gpu=4"]
    assert f"DRA, DeviceClass {DRIVER}" in rows["dra-0"]
    assert "device plugin" in rows["dp-0"] and "too small: the set needs 3 nvidia.com/gpu here, the node has 2" \
        in rows["dp-0"]
    assert "NODE   VERDICT        FREE              NEED              SERVED BY" in text
    doc = json.loads(why.render_json(report))
    assert {n["node"]: (n["free"], n["served"]) for n in doc["nodes"]} == {
        "dra-0": ({GPU: 4}, {GPU: f"DRA, DeviceClass {DRIVER}"}), "dp-0": ({GPU: 2}, {GPU: "device plugin"})}
    assert doc["draNotCounted"] == []


def test_why_counts_the_devices_a_direct_resource_claim_holds_on_a_dra_node() -> None:
    from tests.test_dra_state import DRIVER, rclaim

    objects, dra = _dra_cluster(rclaim("direct", [("dra-0", "g0"), ("dra-0", "g1"), ("dra-0", "g2")]))
    report = why.build(api_pod("train", [{"name": "gpu", "className": "a", "count": 3}]), objects, NOW, dra=dra)
    text = why.render_text(report)
    assert "Decided now: waits, Capacity" in text, text
    assert (f"short by 2 nvidia.com/gpu: the set needs 3, 1 free (served by DRA, DeviceClass {DRIVER})"
            in _node_rows(text)["dra-0"]), text


def test_without_resource_k8s_io_why_sees_each_node_s_allocatable_alone_as_before() -> None:
    objects, _ = _dra_cluster()
    report = why.build(api_pod("train", [{"name": "gpu", "className": "a", "count": 2}]), objects, NOW, dra=None)
    text = why.render_text(report)
    assert "Decided now: placed on node dp-0" in text
    assert "dra-0" not in text and decisionview.DRA_TITLE not in text
    assert "device plugin" in _node_rows(text)["dp-0"]


def test_a_device_class_selector_outside_the_cel_subset_is_refused_in_the_controller_s_words() -> None:
    """The controller counts no device of the class (DraState, the same
    decide.dra code): why shows that refusal, not a node with 0 GPUs."""
    from gpuclaimctl.model.snapshot import NodeInfo
    from gpuclaimctl.state.dra import DraState
    from tests.test_dra_state import node_obj

    objects, dra = _dra_cluster(selector='device.attributes["gpu.example.com"].productName.matches("A1.*")')
    controller = DraState()
    controller.set_resources([GPU])
    controller.set_node(NodeInfo.from_api(node_obj("dra-0")))
    controller.put_class(dra.device_classes[0])
    controller.put_slice(dra.slices[0])
    controller.enable()
    (refusal,) = controller.offers()["dra-0"].offers[GPU].notes
    assert "matches()" in refusal.message

    report = why.build(api_pod("train", [{"name": "gpu", "className": "a", "count": 3}]), objects, NOW, dra=dra)
    text = why.render_text(report)
    assert "Decided now: waits, Unsatisfiable" in text, text
    section = text.split(decisionview.DRA_TITLE)[1].split("\n\n")[0]
    (row,) = [line for line in section.splitlines() if line.startswith("dra-0 ")]
    assert row.split()[1:4] == [GPU, "gpu.example.com", "0"] and row.endswith(refusal.message), row
    doc = json.loads(why.render_json(report))
    assert doc["draNotCounted"] == [{"node": "dra-0", "resource": GPU, "deviceClass": "gpu.example.com",
                                     "devices": 0, "notCounted": refusal.message}]
