from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuclaimctl.model.api import OnCordon, Phase, ReclaimPolicy, Strategy, WaitReason
from gpuclaimctl.model.nodeaffinity import NodeSelector, PodNodeRules, Taint, VolumeConstraint
from gpuclaimctl.model.volumes import volume_constraints
from gpuclaimctl.decide.placement import (
    Action,
    Decision,
    Placed,
    Waiting,
    decide,
)
from gpuclaimctl.model.resources import parse_quantity
from gpuclaimctl.model.snapshot import (
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    PodInfo,
    PodRef,
    Rejection,
    UnresolvedClaim,
    Usage,
)

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def node(
    name: str,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    ready: bool = True,
    cordoned: bool = False,
    resources: dict[str, int] | None = None,
) -> NodeInfo:
    return NodeInfo(
        name=name,
        labels=labels or {},
        taints=taints,
        ready=ready,
        unschedulable=cordoned,
        allocatable=resources if resources is not None else {GPU: gpus, "cpu": 32},
    )


def gpu_class(
    name: str = "a100",
    selector: dict[str, str] | None = None,
    resource: str = GPU,
    on_cordon: OnCordon = OnCordon.MOVE,
    deleting: bool = False,
) -> ClassInfo:
    return ClassInfo(name, resource, selector or {}, on_cordon, deleting)


def claim(
    name: str = "c1",
    count: int = 1,
    class_name: str = "a100",
    phase: Phase = Phase.PENDING,
    on: str = "",
    policy: ReclaimPolicy = ReclaimPolicy.RELEASE,
    reserved: tuple[PodRef, ...] = (),
    rejected: tuple[Rejection, ...] = (),
    deleting: bool = False,
) -> ClaimState:
    return ClaimState(name, f"uid-{name}", class_name, count, phase, on, policy, reserved, rejected, deleting)


def bound(name: str, on: str, count: int = 1, class_name: str = "a100", **kw: Any) -> ClaimState:
    return claim(name, count, class_name, Phase.BOUND, on, **kw)


def pod(spec: dict[str, Any] | None = None, name: str = "p", created: datetime = NOW, uid: str = "pod-uid") -> PodInfo:
    return PodInfo("ns", name, uid, created, PodNodeRules.from_pod_spec(spec or {}))


def affinity(*exprs: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if exprs:
        term["matchExpressions"] = list(exprs)
    if fields:
        term["matchFields"] = list(fields)
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}


def req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


def rejection(node_name: str, minutes: int = 5) -> Rejection:
    return Rejection(node_name, NOW + timedelta(minutes=minutes), "Insufficient cpu")


@dataclass
class Case:
    nodes: list[NodeInfo]
    claims: list[ClaimState | UnresolvedClaim]
    expect: str  # a node name for Placed, or a WaitReason value
    classes: list[ClassInfo] = field(default_factory=lambda: [gpu_class()])
    used: Usage = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    strategy: Strategy = Strategy.BINPACK
    actions: dict[str, Action] | None = None


def run(case: Case) -> Decision:
    cluster = Cluster(case.nodes, case.classes)
    return decide(pod(case.spec), case.claims, cluster, case.used, NOW, case.strategy)


def check(case: Case) -> Decision:
    d = run(case)
    if isinstance(d, Placed):
        assert d.node == case.expect, d.message
        if case.actions is not None:
            assert {a.claim: a.action for a in d.claims} == case.actions
    else:
        assert d.reason.value == case.expect, d.message
        assert set(d.claims) == {c.name for c in case.claims}
    return d


# Two plain nodes where binpack prefers node-a (more allocated) by default,
# so every constraint below has to steer the set to node-b to pass.
A_FULLER: Usage = {GPU: {"node-a": 4, "node-b": 2}}
LABELLED = [
    node("node-a", labels={"tier": "1", "gen": "7", "zone": "x"}),
    node("node-b", labels={"tier": "2", "gen": "9", "fast": "yes"}),
]

TAINTS = {
    "untolerated-taint-waits-with-NodeAffinity": Case(
        [node("node-a", taints=(Taint("dedicated", "NoSchedule", "ml"),))], [claim()], "NodeAffinity"),
    "untolerated-NoExecute-taint-waits": Case(
        [node("node-a", taints=(Taint("dedicated", "NoExecute"),))], [claim()], "NodeAffinity"),
    "tolerated-taint-is-used": Case(
        [node("node-a", taints=(Taint("dedicated", "NoSchedule", "ml"),))], [claim()], "node-a",
        spec={"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]}),
    "toleration-of-other-value-does-not-help": Case(
        [node("node-a", taints=(Taint("dedicated", "NoSchedule", "ml"),))], [claim()], "NodeAffinity",
        spec={"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web"}]}),
    "exists-with-empty-key-tolerates-everything": Case(
        [node("node-a", taints=(Taint("a", "NoSchedule"), Taint("b", "NoExecute", "1")))], [claim()], "node-a",
        spec={"tolerations": [{"operator": "Exists"}]}),
    "PreferNoSchedule-taint-does-not-block": Case(
        [node("node-a", taints=(Taint("soft", "PreferNoSchedule"),))], [claim()], "node-a"),
    "tainted-fuller-node-skipped-for-the-other": Case(
        [node("node-a", taints=(Taint("x", "NoSchedule"),)), node("node-b")], [claim()], "node-b", used=A_FULLER),
    "cordon-taint-alone-is-not-a-taint-problem": Case(
        [node("node-a", taints=(Taint("node.kubernetes.io/unschedulable", "NoSchedule"),), cordoned=True)],
        [claim()], "Cordoned"),
}

AFFINITY = {
    "In": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(req("tier", "In", "2", "3"))),
    "NotIn": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(req("tier", "NotIn", "1"))),
    "Exists": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(req("fast", "Exists"))),
    "DoesNotExist": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(req("zone", "DoesNotExist"))),
    "Gt": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(req("gen", "Gt", "8"))),
    "Lt": Case(LABELLED, [claim()], "node-a", used={GPU: {"node-b": 4}}, spec=affinity(req("gen", "Lt", "8"))),
    "matchFields-metadata.name": Case(
        LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(fields=(req("metadata.name", "In", "node-b"),))),
    "matchFields-NotIn": Case(
        LABELLED, [claim()], "node-b", used=A_FULLER, spec=affinity(fields=(req("metadata.name", "NotIn", "node-a"),))),
    "no-node-matches-waits-with-NodeAffinity": Case(
        LABELLED, [claim()], "NodeAffinity", spec=affinity(req("tier", "In", "9"))),
    "affinity-match-without-room-waits-for-Capacity": Case(
        LABELLED, [claim(count=7)], "Capacity", used=A_FULLER, spec=affinity(req("tier", "In", "2"))),
    "nodeSelector-steers": Case(LABELLED, [claim()], "node-b", used=A_FULLER, spec={"nodeSelector": {"fast": "yes"}}),
    "nodeSelector-matching-nothing-waits": Case(
        LABELLED, [claim()], "NodeAffinity", spec={"nodeSelector": {"fast": "no"}}),
    "nodeSelector-and-affinity-both-apply": Case(
        LABELLED, [claim()], "NodeAffinity", spec={"nodeSelector": {"fast": "yes"}, **affinity(req("tier", "In", "1"))}),
}

CLASSES = {
    "class-selector-steers": Case(
        LABELLED, [claim()], "node-b", used=A_FULLER, classes=[gpu_class(selector={"fast": "yes"})]),
    "class-selector-matching-no-node-is-Unsatisfiable": Case(
        LABELLED, [claim()], "Unsatisfiable", classes=[gpu_class(selector={"product": "h100"})]),
    "node-without-the-resource-does-not-offer-the-class": Case(
        [node("node-a", resources={"cpu": 8}), node("node-b", gpus=2)], [claim()], "node-b"),
    "node-with-zero-gpus-does-not-offer-the-class": Case([node("node-a", gpus=0)], [claim()], "Unsatisfiable"),
    "class-not-found": Case(LABELLED, [claim(class_name="h100")], "ClassNotFound"),
    "class-deleting": Case(LABELLED, [claim()], "ClassDeleting", classes=[gpu_class(deleting=True)]),
    "multi-class-set-needs-a-node-offering-both": Case(
        [node("node-a", labels={"p": "a100"}, resources={GPU: 8}),
         node("node-b", labels={"p": "mixed"}, resources={GPU: 8, AMD: 4}),
         node("node-c", labels={"p": "mi300"}, resources={AMD: 8})],
        [claim("n", 2, "a100"), claim("m", 2, "mi300")], "node-b",
        classes=[gpu_class("a100"), gpu_class("mi300", resource=AMD)]),
    "multi-class-set-checks-each-resource": Case(
        [node("node-b", resources={GPU: 8, AMD: 4})],
        [claim("n", 2, "a100"), claim("m", 5, "mi300")], "Unsatisfiable",
        classes=[gpu_class("a100"), gpu_class("mi300", resource=AMD)]),
    "multi-class-set-with-no-common-node": Case(
        [node("node-a", resources={GPU: 8}), node("node-c", resources={AMD: 8})],
        [claim("n", 1, "a100"), claim("m", 1, "mi300")], "Unsatisfiable",
        classes=[gpu_class("a100"), gpu_class("mi300", resource=AMD)]),
    "two-classes-on-one-resource-add-up": Case(
        [node("node-a", labels={"x": "1"}, gpus=8), node("node-b", labels={"x": "1"}, gpus=4)],
        [claim("n", 3, "a100"), claim("m", 3, "big")], "node-a",
        classes=[gpu_class("a100"), gpu_class("big", selector={"x": "1"})]),
}

NODE_STATE = {
    "cordoned-node-with-room-waits-Cordoned": Case([node("node-a", cordoned=True)], [claim()], "Cordoned"),
    "cordoned-fuller-node-is-skipped": Case(
        [node("node-a", cordoned=True), node("node-b")], [claim()], "node-b", used=A_FULLER),
    "not-ready-node-is-skipped": Case([node("node-a", ready=False), node("node-b")], [claim()], "node-b", used=A_FULLER),
    "only-not-ready-nodes-is-Capacity": Case([node("node-a", ready=False)], [claim()], "Capacity"),
    "rejected-node-is-skipped": Case(
        [node("node-a"), node("node-b")], [claim(rejected=(rejection("node-a"),))], "node-b", used=A_FULLER),
    "rejected-node-with-the-only-room-waits-NodeRejected": Case(
        [node("node-a"), node("node-b", gpus=1)], [claim(count=4, rejected=(rejection("node-a"),))], "NodeRejected"),
    "rejection-of-one-claim-applies-to-the-set": Case(
        [node("node-a"), node("node-b")], [claim("x"), claim("y", rejected=(rejection("node-a"),))], "node-b",
        used=A_FULLER),
    "expired-rejection-no-longer-counts": Case(
        [node("node-a"), node("node-b")], [claim(rejected=(rejection("node-a", minutes=-1),))], "node-a", used=A_FULLER),
}

CAPACITY = {
    "gpus-of-pods-without-claims-count": Case(
        [node("node-a"), node("node-b")], [claim(count=4)], "node-b", used={GPU: {"node-a": 6}}),
    "set-that-fits-no-single-node-waits": Case(
        [node("node-a"), node("node-b")], [claim("x", 5), claim("y", 4)], "Unsatisfiable"),
    "set-goes-whole-to-the-node-with-room-for-all": Case(
        [node("node-a"), node("node-b")], [claim("x", 3), claim("y", 3)], "node-b", used={GPU: {"node-a": 3}}),
    "exactly-full-node-fits": Case([node("node-a")], [claim(count=8)], "node-a"),
    "overcommitted-node-has-no-room": Case([node("node-a")], [claim()], "Capacity", used={GPU: {"node-a": 9}}),
    "no-nodes-at-all": Case([], [claim()], "Unsatisfiable"),
    # Issue 45: a set larger than any node the pod may use can never fit:
    # not a wait for Capacity, which frees nothing for it.
    "set-larger-than-any-node-is-Unsatisfiable": Case([node("node-a"), node("node-b")], [claim(count=12)],
                                                       "Unsatisfiable"),
    "set-that-fits-a-busy-node-is-Capacity": Case([node("node-a")], [claim(count=8)], "Capacity",
                                                  used={GPU: {"node-a": 1}}),
    "set-that-fits-only-a-node-not-ready-is-Capacity": Case(
        [node("node-a", gpus=4), node("node-b", gpus=16, ready=False)], [claim(count=12)], "Capacity"),
    "set-that-fits-only-a-node-the-pod-excludes-is-Unsatisfiable": Case(
        [node("node-a", gpus=4, labels={"fast": "yes"}), node("node-b", gpus=16, labels={"fast": "no"})],
        [claim(count=12)], "Unsatisfiable", spec={"nodeSelector": {"fast": "yes"}}),
}

STRATEGY = {
    "binpack-picks-most-allocated": Case(
        [node("node-a"), node("node-b"), node("node-c")], [claim()], "node-b", used={GPU: {"node-a": 1, "node-b": 5}}),
    "spread-picks-least-allocated": Case(
        [node("node-a"), node("node-b"), node("node-c")], [claim()], "node-c", used={GPU: {"node-a": 1, "node-b": 5}},
        strategy=Strategy.SPREAD),
    "binpack-tie-breaks-by-name": Case([node("node-b"), node("node-a")], [claim()], "node-a"),
    "spread-tie-breaks-by-name": Case([node("node-b"), node("node-a")], [claim()], "node-a", strategy=Strategy.SPREAD),
    "binpack-on-equal-fraction-leaves-the-big-node-whole": Case(
        [node("big", gpus=16), node("small", gpus=8)], [claim(count=2)], "small", used={GPU: {"big": 6, "small": 2}}),
    "binpack-prefers-a-fuller-fraction-over-fewer-free": Case(
        [node("big", gpus=16), node("small", gpus=8)], [claim(count=1)], "big", used={GPU: {"big": 12, "small": 4}}),
    "spread-on-equal-fraction-prefers-more-free": Case(
        [node("big", gpus=16), node("small", gpus=8)], [claim(count=2)], "big", strategy=Strategy.SPREAD,
        used={GPU: {"big": 6, "small": 2}}),
}

BOUND = {
    "bound-claim-keeps-the-set-on-its-node": Case(
        [node("node-a"), node("node-b")], [bound("r", "node-b", policy=ReclaimPolicy.RETAIN)], "node-b",
        used={GPU: {"node-a": 6, "node-b": 1}}, actions={"r": Action.KEEP}),
    "retained-claim-brings-new-claims-to-its-node": Case(
        [node("node-a"), node("node-b")], [bound("r", "node-b", policy=ReclaimPolicy.RETAIN), claim("new", 2)],
        "node-b", used={GPU: {"node-a": 6, "node-b": 1}}, actions={"r": Action.KEEP, "new": Action.BIND}),
    "retained-claims-node-without-room-for-the-rest-waits": Case(
        [node("node-a"), node("node-b")], [bound("r", "node-b", policy=ReclaimPolicy.RETAIN), claim("new", 4)],
        "Capacity", used={GPU: {"node-a": 6, "node-b": 6}}),  # nor room for all of it elsewhere
    "lost-claim-is-placed-again": Case(
        [node("node-b")], [claim("l", 2, phase=Phase.LOST, on="node-gone")], "node-b", actions={"l": Action.MOVE}),
    "claim-bound-to-a-vanished-node-moves": Case(
        [node("node-b")], [bound("g", "node-gone")], "node-b", actions={"g": Action.MOVE}),
    "claim-bound-to-a-not-ready-node-waits": Case(
        [node("node-a", ready=False), node("node-b")], [bound("x", "node-a")], "Capacity", used={GPU: {"node-a": 1}}),
    "claim-bound-to-a-rejected-node-moves": Case(
        [node("node-a"), node("node-b")], [bound("x", "node-a", rejected=(rejection("node-a"),))], "node-b",
        used={GPU: {"node-a": 1}}, actions={"x": Action.MOVE}),
    "claim-bound-to-a-node-the-pod-cannot-use-moves": Case(
        LABELLED, [bound("x", "node-a")], "node-b", spec={"nodeSelector": {"fast": "yes"}}, used={GPU: {"node-a": 1}},
        actions={"x": Action.MOVE}),
    "claims-bound-on-two-nodes-gather-where-there-is-room": Case(
        [node("node-a"), node("node-b")], [bound("x", "node-a", 2), bound("y", "node-b", 1)], "node-a",
        used={GPU: {"node-a": 2, "node-b": 8}}, actions={"x": Action.KEEP, "y": Action.MOVE}),
    "claims-bound-on-two-nodes-prefer-more-gpus-in-place": Case(
        [node("node-a"), node("node-b")], [bound("x", "node-a", 1), bound("y", "node-b", 3)], "node-b",
        used={GPU: {"node-a": 1, "node-b": 3}}, actions={"x": Action.MOVE, "y": Action.KEEP}),
}

CORDON = {
    "move-class-set-leaves-a-cordoned-node": Case(
        [node("node-a", cordoned=True), node("node-b")], [bound("x", "node-a", 2)], "node-b",
        used={GPU: {"node-a": 2}}, actions={"x": Action.MOVE}),
    "move-class-set-with-nowhere-to-go-waits-Cordoned": Case(
        [node("node-a", cordoned=True), node("node-b", gpus=1)], [bound("x", "node-a", 2)], "Cordoned",
        used={GPU: {"node-a": 2}}),
    "stay-class-set-stays-on-its-cordoned-node": Case(
        [node("node-a", cordoned=True), node("node-b")], [bound("x", "node-a", 2)], "node-a",
        classes=[gpu_class(on_cordon=OnCordon.STAY)], used={GPU: {"node-a": 2}}, actions={"x": Action.KEEP}),
    "stay-class-set-with-new-claims-waits-Cordoned": Case(
        [node("node-a", cordoned=True), node("node-b")], [bound("x", "node-a", 2), claim("new")], "Cordoned",
        classes=[gpu_class(on_cordon=OnCordon.STAY)], used={GPU: {"node-a": 2}}),
    "stay-claims-on-two-cordoned-nodes-wait": Case(
        [node("node-a", cordoned=True), node("node-b", cordoned=True)], [bound("x", "node-a"), bound("y", "node-b")],
        "Cordoned", classes=[gpu_class(on_cordon=OnCordon.STAY)]),
    "stay-node-the-pod-cannot-use-is-NodeAffinity": Case(
        [node("node-a", cordoned=True, labels={"z": "1"})], [bound("x", "node-a")], "NodeAffinity",
        classes=[gpu_class(on_cordon=OnCordon.STAY)], spec={"nodeSelector": {"z": "2"}}),
    "stay-does-not-pull-pending-sets-onto-a-cordoned-node": Case(
        [node("node-a", cordoned=True)], [claim()], "Cordoned", classes=[gpu_class(on_cordon=OnCordon.STAY)]),
}

CLAIMS = {
    "missing-claim": Case(
        [node("node-a")], [claim("ok"), UnresolvedClaim("gone", WaitReason.CLAIM_MISSING, "GPUClaim gone does not exist")],
        "ClaimMissing"),
    "name-taken": Case(
        [node("node-a")], [UnresolvedClaim("p-gpu", WaitReason.NAME_TAKEN, "GPUClaim p-gpu is not this pod's")],
        "NameTaken"),
    "claim-in-use-by-another-pod": Case(
        [node("node-a")], [claim(reserved=(PodRef("other", "other-uid"),))], "ClaimInUse"),
    "claim-reserved-for-this-pod-is-fine": Case(
        [node("node-a")], [bound("x", "node-a", reserved=(PodRef("p", "pod-uid"),))], "node-a"),
    "claim-being-deleted-is-missing": Case([node("node-a")], [claim(deleting=True)], "ClaimMissing"),
    "missing-claim-outranks-a-missing-class": Case(
        [node("node-a")], [claim("x", class_name="nope"), UnresolvedClaim("y", WaitReason.CLAIM_MISSING, "gone")],
        "ClaimMissing"),
}


def table(*groups: dict[str, Case]) -> list[Any]:
    return [pytest.param(case, id=name) for group in groups for name, case in group.items()]


@pytest.mark.parametrize("case", table(TAINTS))
def test_taints_and_tolerations(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(AFFINITY))
def test_node_selector_and_required_affinity(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(CLASSES))
def test_classes(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(NODE_STATE))
def test_cordoned_not_ready_and_rejected_nodes(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(CAPACITY))
def test_free_gpus(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(STRATEGY))
def test_binpack_and_spread(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(BOUND))
def test_bound_and_lost_claims(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(CORDON))
def test_on_cordon(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", table(CLAIMS))
def test_claim_problems(case: Case) -> None:
    check(case)


# --- what the decision says ------------------------------------------------


def test_placed_actions_carry_what_the_writes_and_inflight_cache_need() -> None:
    d = run(Case([node("node-a"), node("node-b")],
                 [bound("r", "node-b", 1), claim("new", 2), claim("l", 1, phase=Phase.LOST, on="node-x")], "node-b"))
    assert isinstance(d, Placed)
    by_name = {a.claim: a for a in d.claims}
    assert by_name["new"].uid == "uid-new" and by_name["new"].resource == GPU and by_name["new"].count == 2
    assert by_name["l"].from_node == "node-x"
    assert [a.claim for a in d.new_gpus()] == ["new", "l"]


def test_capacity_message_says_what_is_needed_and_the_most_free() -> None:
    d = run(Case([node("node-a"), node("node-b", ready=False)], [claim("x", 3), claim("y", 3)], "Capacity",
                 used={GPU: {"node-a": 5}}))
    assert isinstance(d, Waiting)
    assert "needs 6 nvidia.com/gpu on one node" in d.message
    assert "of the 2 nodes offering GPUClass a100, 1 without enough free GPUs, 1 not Ready" in d.message
    assert "the most free on a node the pod can use: 3 nvidia.com/gpu on node-a" in d.message
    assert "GPUClaims x (3 × a100), y (3 × a100)" in d.message


def test_capacity_message_mentions_nodes_with_room_the_pod_excludes() -> None:
    d = run(Case(LABELLED, [claim(count=4)], "Capacity", used={GPU: {"node-b": 6}}, spec={"nodeSelector": {"fast": "yes"}}))
    assert isinstance(d, Waiting) and d.reason is WaitReason.CAPACITY
    assert "1 node with room the pod's nodeSelector, affinity or tolerations exclude" in d.message


def test_node_affinity_message_counts_what_excluded_each_node() -> None:
    nodes = [node("node-a", labels={"z": "1"}), node("node-b", labels={"z": "2"}, taints=(Taint("t", "NoSchedule", "v"),)),
             node("node-c", labels={"z": "2"}, taints=(Taint("t", "NoSchedule", "v"),))]
    d = run(Case(nodes, [claim()], "NodeAffinity", spec={"nodeSelector": {"z": "2"}}))
    assert isinstance(d, Waiting) and d.reason is WaitReason.NODE_AFFINITY
    assert "none of the 3 nodes offering GPUClass a100 suits the pod" in d.message
    assert "1 do not match its nodeSelector" in d.message
    assert "2 have a taint it does not tolerate (t=v:NoSchedule)" in d.message
    assert "t=v:NoSchedule" in d.message


def test_rejected_message_names_the_node_and_until() -> None:
    d = run(Case([node("node-a")], [claim(rejected=(rejection("node-a"),))], "NodeRejected"))
    assert isinstance(d, Waiting)
    assert "node-a until 2025-06-01T12:05:00+00:00: Insufficient cpu" in d.message


def test_a_claim_with_its_own_problem_gets_it_and_the_others_wait_for_it() -> None:
    d = run(Case([node("node-a")], [claim("ok"), claim("bad", class_name="h100")], "ClassNotFound"))
    assert isinstance(d, Waiting)
    assert d.claims["bad"].reason is WaitReason.CLASS_NOT_FOUND
    assert d.claims["bad"].message == "GPUClass h100 of GPUClaim bad does not exist"
    assert d.claims["ok"].reason is WaitReason.CLASS_NOT_FOUND
    assert d.claims["ok"].message.startswith("waits for the rest of its set:")


def test_retained_claim_waiting_message_names_the_holding_node() -> None:
    d = run(BOUND["retained-claims-node-without-room-for-the-rest-waits"])
    assert isinstance(d, Waiting)
    assert "GPUClaim r (1 × a100) (reclaimPolicy Retain) bound to node node-b keeps the set there" in d.message
    assert "node node-b has 2 free nvidia.com/gpu where 4 are needed" in d.message


def test_decide_needs_a_claim() -> None:
    with pytest.raises(ValueError):
        decide(pod(), [], Cluster([], []), {}, NOW)


def test_the_decision_does_not_depend_on_node_order() -> None:
    nodes = [node(f"n{i}", gpus=8) for i in range(20)]
    used: Usage = {GPU: {f"n{i}": i % 5 for i in range(20)}}
    first = decide(pod(), [claim(count=3)], Cluster(nodes, [gpu_class()]), used, NOW)
    again = decide(pod(), [claim(count=3)], Cluster(reversed(nodes), [gpu_class()]), used, NOW)
    assert isinstance(first, Placed) and first == again


# --- snapshot from API objects --------------------------------------------


def test_node_info_from_api_reads_readiness_cordon_taints_and_allocatable() -> None:
    n = NodeInfo.from_api({
        "metadata": {"name": "node-a", "labels": {"z": "1"}},
        "spec": {"unschedulable": True, "taints": [{"key": "t", "effect": "NoSchedule"},
                                                   {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        "status": {"allocatable": {GPU: "8", "cpu": "3800m", "memory": "64Gi", "bad": "x"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
    assert n.name == "node-a" and n.labels == {"z": "1"} and n.ready and n.unschedulable
    assert n.allocatable == {GPU: 8, "cpu": 3, "memory": 64 * 2**30}
    assert n.blocking_taints == (Taint("t", "NoSchedule"),)
    assert not NodeInfo.from_api({"metadata": {"name": "x"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown"}]}}).ready


def test_claim_state_from_api() -> None:
    c = ClaimState.from_api({
        "metadata": {"name": "c", "uid": "u", "deletionTimestamp": "2025-06-01T00:00:00Z"},
        "spec": {"className": "a100", "count": 2, "reclaimPolicy": "Retain"},
        "status": {"phase": "Bound", "nodeName": "node-a", "reservedFor": [{"name": "p", "uid": "pu"}],
                   "rejectedNodes": [{"nodeName": "node-b", "reason": "r", "until": "2025-06-01T12:10:00Z"}]},
    })
    assert c == ClaimState("c", "u", "a100", 2, Phase.BOUND, "node-a", ReclaimPolicy.RETAIN,
                           (PodRef("p", "pu"),), (Rejection("node-b", NOW + timedelta(minutes=10), "r"),), True)
    assert ClaimState.from_api({"metadata": {"name": "n"}, "spec": {"className": "a", "count": 1}}).phase is Phase.PENDING


def test_class_and_pod_from_api() -> None:
    cls = ClassInfo.from_api({"metadata": {"name": "a100"}, "spec": {"nodeSelector": {"p": "a"}, "onCordon": "Stay"}})
    assert cls == ClassInfo("a100", GPU, {"p": "a"}, OnCordon.STAY, False)
    p = PodInfo.from_api({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                                       "creationTimestamp": "2025-06-01T12:00:00Z"},
                          "spec": {"nodeSelector": {"p": "a"}}})
    assert p.created == NOW and p.rules.node_selector == (("p", "a"),)


def gpu_pod_info(*amounts: tuple[str, str]) -> PodInfo:
    """A pod from the API whose one container requests each (resource, amount)."""
    return PodInfo.from_api({"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid",
                                          "creationTimestamp": "2025-06-01T12:00:00Z"},
                             "spec": {"containers": [{"name": "c", "resources": {
                                 "limits": {r: n for r, n in amounts}, "requests": {"cpu": "1"}}}]}})


def test_a_pod_reads_its_requests_of_extended_resources_only() -> None:
    assert gpu_pod_info((GPU, "2"), ("example.com/fpga", "1")).requests == (("example.com/fpga", 1), (GPU, 2))
    assert gpu_pod_info().requests == ()


@pytest.mark.parametrize("requested, counts, expect", [
    ("1", (1,), "big"),
    ("3", (1, 2), "big"),      # the claims together hold what the containers ask
    ("2", (3,), "big"),        # asking for less than the claims hold is fine
    ("3", (1,), "InvalidClaims"),
    ("5", (2, 2), "InvalidClaims"),
])
def test_a_set_holding_less_than_the_pods_requests_waits_invalid(
        requested: str, counts: tuple[int, ...], expect: str) -> None:
    # Placing one claim of 1 on `small` would pin a pod that asks the device
    # plugin for 3 to a node with 2: kube-scheduler refuses it there.
    cluster = Cluster([node("big", gpus=4), node("small", gpus=3)], [gpu_class()])
    claims = [claim(f"c{i}", n) for i, n in enumerate(counts)]
    d = decide(gpu_pod_info((GPU, requested)), claims, cluster, {GPU: {"big": 1}}, NOW)
    if isinstance(d, Placed):
        assert d.node == expect, d.message
    else:
        assert d.reason.value == expect, d.message
        assert f"request {requested} {GPU} but its GPU claims hold {sum(counts)}" in d.message
        assert set(d.claims) == {c.name for c in claims}


def test_requests_of_a_resource_no_class_counts_are_not_the_claims_business() -> None:
    cluster = Cluster([node("n1", resources={GPU: 4, "example.com/fpga": 2})], [gpu_class()])
    d = decide(gpu_pod_info((GPU, "1"), ("example.com/fpga", "2")), [claim()], cluster, {}, NOW)
    assert isinstance(d, Placed) and d.node == "n1"


def test_requests_of_another_class_s_resource_need_claims_of_it() -> None:
    cluster = Cluster([node("n1", resources={GPU: 4, AMD: 4})], [gpu_class(), gpu_class("mi300", resource=AMD)])
    d = decide(gpu_pod_info((GPU, "1"), (AMD, "1")), [claim()], cluster, {}, NOW)
    assert isinstance(d, Waiting) and d.reason is WaitReason.INVALID_CLAIMS
    assert "none of its claims is of a class counted in it" in d.message
    d = decide(gpu_pod_info((GPU, "1"), (AMD, "1")), [claim(), claim("c2", class_name="mi300")], cluster, {}, NOW)
    assert isinstance(d, Placed)


@pytest.mark.parametrize(
    "text, value",
    [("8", 8), ("0", 0), ("1k", 1000), ("2Ki", 2048), ("1500m", 1), ("1e3", 1000), ("1.5", 1), ("x", None), ("", None),
     # The API server writes 10^18 as "1E" (exa) and 2^60 as "1Ei": not exponents.
     ("1E", 10**18), ("2E", 2 * 10**18), ("1Ei", 2**60), ("1E3", 1000), ("1e18", 10**18),
     ("0.5Ei", 2**59), ("1.5Ki", 1536), ("12345678901234567", 12345678901234567),
     # Exact (no 28-digit decimal context), and capped at int64 rather than raising.
     ("9223372036854775807", 2**63 - 1), ("9223372036854775808", 2**63 - 1), ("1e30", 2**63 - 1),
     ("1e1000000", 2**63 - 1), ("1e-1000000", 0), ("9" * 5000, 2**63 - 1),
     ("\u00b2", None), ("1e", None), (".", None)],
)
def test_parse_quantity(text: str, value: int | None) -> None:
    assert parse_quantity(text) == value


def test_a_node_with_an_exa_quantity_is_read_not_raised() -> None:
    # Any allocatable the API server canonicalised to an SI "E" suffix (here
    # memory) made NodeInfo.from_api raise: the node handler failed on every
    # event and the node never reached the view.
    info = NodeInfo.from_api({"metadata": {"name": "big"},
                              "status": {"allocatable": {GPU: "8", "memory": "1Ei", "example.com/x": "3E"},
                                         "conditions": [{"type": "Ready", "status": "True"}]}})
    assert info.allocatable == {GPU: 8, "memory": 2**60, "example.com/x": 3 * 10**18}
    assert isinstance(decide(pod(), [claim()], Cluster([info], [gpu_class()]), {}, NOW), Placed)


# --- cluster snapshots --------------------------------------------------------


def test_derived_clusters_see_node_and_class_changes() -> None:
    c1 = Cluster([node("node-a")], [gpu_class()])
    assert isinstance(decide(pod(), [claim()], c1, {}, NOW), Placed)
    c2 = c1.with_node(node("node-a", cordoned=True))
    assert isinstance(decide(pod(), [claim()], c2, {}, NOW), Waiting)
    c3 = c2.with_node(node("node-b"))
    d3 = decide(pod(), [claim()], c3, {}, NOW)
    assert isinstance(d3, Placed) and d3.node == "node-b"
    c4 = Cluster(c3.nodes.values(), [gpu_class(selector={"nope": "1"})])
    assert isinstance(decide(pod(), [claim()], c4, {}, NOW), Waiting)
    c5 = Cluster(c4.nodes.values(), [])
    d5 = decide(pod(), [claim()], c5, {}, NOW)
    assert isinstance(d5, Waiting) and d5.reason is WaitReason.CLASS_NOT_FOUND
    c6 = c3.without_node("node-b")
    assert isinstance(decide(pod(), [claim()], c6, {}, NOW), Waiting)


def test_most_free_is_reported_for_a_node_the_pod_can_use() -> None:
    nodes = [node("node-a", labels={"z": "1"}), node("node-b", labels={"z": "2"})]
    d = run(Case(nodes, [claim(count=6)], "Capacity", used={GPU: {"node-a": 5, "node-b": 3}},
                 spec={"nodeSelector": {"z": "1"}}))
    assert isinstance(d, Waiting) and d.reason is WaitReason.CAPACITY
    assert "the most free on a node the pod can use: 3 nvidia.com/gpu on node-a" in d.message


def test_patched_indexes_equal_indexes_built_from_scratch() -> None:
    import random

    rng = random.Random(7)
    classes = [gpu_class("a100", selector={"p": "a"}), gpu_class("any"), gpu_class("amd", resource=AMD)]
    keys = [("a100",), ("any",), ("amd",), ("a100", "any"), ("amd", "any")]

    def random_node(i: int) -> NodeInfo:
        return node(f"n{i:02d}", labels={"p": rng.choice("ab")}, ready=rng.random() > 0.2,
                    cordoned=rng.random() < 0.2, resources={GPU: rng.choice([0, 8]), AMD: rng.choice([0, 4])})

    cluster = Cluster([random_node(i) for i in range(30)], classes)
    for key in keys:
        cluster.offer(key)
    for _ in range(60):
        i = rng.randrange(35)
        if rng.random() < 0.2:
            cluster = cluster.without_node(f"n{i:02d}")
        else:
            cluster = cluster.with_node(random_node(i))
        fresh = Cluster(cluster.nodes.values(), classes)
        for key in keys:
            assert cluster.offer(key) == fresh.offer(key), key


def test_an_unchanged_node_keeps_the_snapshot() -> None:
    cluster = Cluster([node("node-a")], [gpu_class()])
    assert cluster.with_node(node("node-a")) is cluster
    assert cluster.without_node("node-x") is cluster


# --- bound volumes with node affinity (issue 10, item 13) ---------------------

HOST = "kubernetes.io/hostname"


def host(name: str, **kw: Any) -> NodeInfo:
    labels = {HOST: name, **kw.pop("labels", {})}
    return node(name, labels=labels, **kw)


def local_volume(*hosts: str, pv: str = "pv-data", claim_name: str = "data") -> VolumeConstraint:
    selector = NodeSelector.from_api({"nodeSelectorTerms": [{"matchExpressions": [req(HOST, "In", *hosts)]}]})
    return VolumeConstraint(claim_name, claim_name, pv, selector)


def decide_with(
    volumes: tuple[VolumeConstraint, ...],
    nodes: list[NodeInfo],
    claims: list[ClaimState | UnresolvedClaim],
    used: Usage | None = None,
    classes: list[ClassInfo] | None = None,
    spec: dict[str, Any] | None = None,
) -> Decision:
    p = PodInfo("ns", "p", "pod-uid", NOW, PodNodeRules.from_pod_spec(spec or {}, volumes))
    return decide(p, claims, Cluster(nodes, classes or [gpu_class()]), used or {}, NOW)


@pytest.mark.parametrize(
    "reaches, expect",
    [
        pytest.param(("node-b",), "node-b", id="only-the-node-the-volume-reaches"),
        pytest.param(("node-a", "node-b"), "node-a", id="a-volume-every-node-reaches-changes-nothing"),
    ],
)
def test_the_set_goes_only_where_its_bound_volume_is(reaches: tuple[str, ...], expect: str) -> None:
    # Binpack prefers the fuller node-a.
    d = decide_with((local_volume(*reaches),), [host("node-a"), host("node-b")], [claim()], used=A_FULLER)
    assert isinstance(d, Placed) and d.node == expect, d


def test_a_pod_read_from_the_api_goes_where_its_local_pv_is() -> None:
    raw_pod = {"metadata": {"name": "train-0", "namespace": "ns", "uid": "pod-uid",
                            "creationTimestamp": "2025-06-01T12:00:00Z"},
               "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}}]}}
    pvc = {"metadata": {"name": "dataset", "namespace": "ns"}, "spec": {"volumeName": "pv-local-b"}}
    pv = {"metadata": {"name": "pv-local-b"}, "spec": {"local": {"path": "/mnt/ds"}, "nodeAffinity": {"required": {
        "nodeSelectorTerms": [{"matchExpressions": [req(HOST, "In", "node-b")]}]}}}}
    volumes = volume_constraints(raw_pod, lambda ns, n: pvc if (ns, n) == ("ns", "dataset") else None,
                                 lambda n: pv if n == "pv-local-b" else None)
    info = PodInfo.from_api(raw_pod, volumes=volumes)
    d = decide(info, [claim()], Cluster([host("node-a"), host("node-b")], [gpu_class()]), A_FULLER, NOW)
    assert isinstance(d, Placed) and d.node == "node-b", d
    assert PodInfo.from_api(raw_pod).rules.volumes == (), "no volumes unless the caller passes them"


def test_no_gpu_node_the_volume_reaches_waits_NodeAffinity_naming_the_volume() -> None:
    d = decide_with((local_volume("cpu-1"),), [host("node-a"), host("node-b"), host("cpu-1", gpus=0)],
                    [claim("x"), claim("y")])
    assert isinstance(d, Waiting) and d.reason is WaitReason.NODE_AFFINITY, d
    assert d.message == (
        "GPUClaims x (1 × a100), y (1 × a100): PersistentVolume pv-data (claim data) is reachable only from "
        "nodes matching kubernetes.io/hostname In [cpu-1]; none of them offers GPUClass a100"
    )
    assert {c: w.reason for c, w in d.claims.items()} == {"x": WaitReason.NODE_AFFINITY, "y": WaitReason.NODE_AFFINITY}


def test_a_full_node_the_volume_reaches_makes_the_set_wait_for_capacity_there() -> None:
    d = decide_with((local_volume("node-b"),), [host("node-a"), host("node-b")], [claim()],
                    used={GPU: {"node-b": 8}})
    assert isinstance(d, Waiting) and d.reason is WaitReason.CAPACITY, d
    assert "the most free on a node the pod can use: 0 nvidia.com/gpu on node-b" in d.message
    assert "1 node with room the pod's nodeSelector, affinity, tolerations or volumes exclude" in d.message


def test_an_anchor_on_a_node_the_volume_cannot_reach_lets_the_set_move() -> None:
    nodes, claims, used = [host("node-a"), host("node-b")], [bound("x", "node-a", 2)], {GPU: {"node-a": 2}}
    stays = decide_with((), nodes, list(claims), used)
    assert isinstance(stays, Placed) and stays.node == "node-a"
    moves = decide_with((local_volume("node-b"),), nodes, list(claims), used)
    assert isinstance(moves, Placed) and moves.node == "node-b", moves
    assert [(a.claim, a.action, a.from_node) for a in moves.claims] == [("x", Action.MOVE, "node-a")]


def test_a_stay_anchor_the_volume_cannot_reach_waits_NodeAffinity_naming_the_volume() -> None:
    d = decide_with((local_volume("node-b"),), [host("node-a", cordoned=True), host("node-b")], [bound("x", "node-a")],
                    classes=[gpu_class(on_cordon=OnCordon.STAY)])
    assert isinstance(d, Waiting) and d.reason is WaitReason.NODE_AFFINITY, d
    assert d.message.endswith("stays on node node-a (onCordon Stay), which PersistentVolume pv-data (claim data) "
                              "cannot reach")


def test_nodes_excluded_by_the_pods_rules_and_by_its_volume_are_both_counted() -> None:
    nodes = [host("node-a", labels={"z": "1"}), host("node-b", labels={"z": "2"})]
    d = decide_with((local_volume("node-a"),), nodes, [claim()], spec={"nodeSelector": {"z": "2"}})
    assert isinstance(d, Waiting) and d.reason is WaitReason.NODE_AFFINITY, d
    assert d.message.endswith(
        "none of the 2 nodes offering GPUClass a100 suits the pod: 1 do not match its nodeSelector, "
        "1 cannot reach PersistentVolume pv-data (claim data), reachable only from nodes matching "
        "kubernetes.io/hostname In [node-a]"
    )


def test_two_volumes_on_different_nodes_name_both() -> None:
    volumes = (local_volume("node-a", pv="pv-1", claim_name="one"), local_volume("node-b", pv="pv-2", claim_name="two"))
    d = decide_with(volumes, [host("node-a"), host("node-b")], [claim()])
    assert isinstance(d, Waiting) and d.reason is WaitReason.NODE_AFFINITY, d
    assert "1 cannot reach PersistentVolume pv-1 (claim one)" in d.message
    assert "1 cannot reach PersistentVolume pv-2 (claim two)" in d.message
