"""A gang's decision (decide.gang) and its annotations (model.gangs), as
tables: all members placed at once or none; the gang's budget as a whole."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from gpuclaimctl.decide.gang import GangMember, GangPlaced, GangWaiting, decide_gang
from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION, WaitReason
from gpuclaimctl.model.budgets import BudgetInfo, BudgetLimit, BudgetUse
from gpuclaimctl.model.gangs import Gang, GangError, pod_gang
from gpuclaimctl.model.snapshot import Cluster, NodeInfo, UnresolvedClaim
from tests.test_placement import GPU, NOW, bound, claim, gpu_class, node, pod


def member(i: int, gpus: int = 8, *, claims: list[Any] | None = None) -> GangMember:
    info = pod(name=f"train-{i}", created=NOW + timedelta(seconds=i), uid=f"uid-{i}")
    return GangMember(f"ns/train-{i}", info, claims or [claim(f"train-{i}-g", gpus)])


def cluster(*gpus: int) -> Cluster:
    return Cluster([node(f"n{i}", g) for i, g in enumerate(gpus)], [gpu_class()])


def run(members: list[GangMember], *, size: int | None = None, nodes: tuple[int, ...] = (8, 8, 8, 8),
        used: dict[str, dict[str, int]] | None = None, released: int = 0,
        budgets: list[BudgetInfo] | None = None, budget_use: BudgetUse | None = None) -> Any:
    return decide_gang("train", size if size is not None else len(members) + released, members, released,
                       cluster(*nodes), used or {}, NOW, budgets=budgets or [],
                       budget_use=budget_use or BudgetUse({}, {}))


def test_four_members_of_eight_gpus_go_on_four_nodes_at_once() -> None:
    d = run([member(i) for i in range(4)])
    assert isinstance(d, GangPlaced)
    assert sorted(p.node for _, p in d.sets) == ["n0", "n1", "n2", "n3"]


def test_members_may_share_a_node() -> None:
    d = run([member(i, 2) for i in range(4)], nodes=(8,))
    assert isinstance(d, GangPlaced) and {p.node for _, p in d.sets} == {"n0"}


def test_a_gang_that_does_not_fit_whole_places_no_member_and_names_the_one_left_over() -> None:
    d = run([member(i) for i in range(4)], nodes=(8, 8, 8, 4))
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.GANG_CAPACITY
    assert "3 of 4 sets fit at once; member train-3" in d.message, d.message
    assert "the most free on a node the pod can use: 4 nvidia.com/gpu" in d.message, d.message
    assert set(d.members) == {f"ns/train-{i}" for i in range(4)}
    assert all(w.reason is WaitReason.GANG_CAPACITY for w in d.members.values())


def test_fewer_members_than_the_size_wait_incomplete() -> None:
    d = run([member(i) for i in range(3)], size=4)
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.GANG_INCOMPLETE
    assert "3 of 4 members exist" in d.message


def test_more_members_than_the_size_is_invalid() -> None:
    d = run([member(i) for i in range(3)], size=2)
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.GANG_INVALID


def test_members_already_released_count_and_the_rest_are_finished() -> None:
    """A decision being finished (a failed write, a crash): two members are
    out, the other two keep the claims already bound for them."""
    rest = [member(2, claims=[bound("train-2-g", "n2", 8)]), member(3, claims=[bound("train-3-g", "n3", 8)])]
    d = run(rest, released=2, used={GPU: {"n0": 8, "n1": 8, "n2": 8, "n3": 8}})
    assert isinstance(d, GangPlaced)
    assert {k: p.node for k, p in d.sets} == {"ns/train-2": "n2", "ns/train-3": "n3"}
    assert not any(list(p.new_gpus()) for _, p in d.sets)


def test_two_gangs_that_do_not_fit_together_one_runs_the_other_waits_whole() -> None:
    first = run([member(i) for i in range(3)], nodes=(8, 8, 8, 8))
    assert isinstance(first, GangPlaced)
    used: Counter[str] = Counter()
    for _, p in first.sets:
        for a in p.new_gpus():
            used[a.node] += a.count
    second = decide_gang("other", 3, [member(10 + i) for i in range(3)], 0, cluster(8, 8, 8, 8),
                         {GPU: dict(used)}, NOW)
    assert isinstance(second, GangWaiting) and second.reason is WaitReason.GANG_CAPACITY
    assert "1 of 3 sets fit at once" in second.message


def test_the_budget_is_checked_for_the_gang_as_a_whole() -> None:
    budget = [BudgetInfo("ns", "quota", (BudgetLimit("a100", 24),))]
    d = run([member(i) for i in range(4)], budgets=budget)  # 32 > 24, though each member fits alone
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.BUDGET
    assert "all 4 members together" in d.message
    assert isinstance(run([member(i) for i in range(3)], budgets=budget), GangPlaced)


def test_a_member_larger_than_any_node_makes_the_gang_unsatisfiable() -> None:
    d = run([member(0, 8), member(1, 16)])
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.UNSATISFIABLE
    assert "member train-1" in d.message


def test_a_members_missing_claim_is_its_own_reason_and_the_others_wait_for_it() -> None:
    missing = UnresolvedClaim("train-1-g", WaitReason.CLAIM_MISSING, "GPUClaim train-1-g does not exist")
    d = run([member(0), member(1, claims=[missing])])
    assert isinstance(d, GangWaiting) and d.reason is WaitReason.CLAIM_MISSING
    assert d.members["ns/train-1"].message == "GPUClaim train-1-g does not exist"
    assert "member train-1" in d.members["ns/train-0"].message


def test_the_largest_sets_are_placed_first_so_a_big_one_is_not_crowded_out() -> None:
    """First fit in creation order would put the two 4s on the two nodes and
    leave the 8 nowhere; largest first fits all three."""
    members = [member(0, 4), member(1, 4), member(2, 8)]
    d = run(members, nodes=(8, 8))
    assert isinstance(d, GangPlaced)


# -- the annotations ---------------------------------------------------------------------------


def annotated(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}}


def test_a_pod_without_the_gang_annotation_is_in_no_gang() -> None:
    assert pod_gang(annotated()) is None


def test_a_gang_is_named_and_sized_by_its_annotations() -> None:
    assert pod_gang(annotated(**{GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "4"})) == Gang("ns", "train", 4)


@pytest.mark.parametrize("annotations, says", [
    pytest.param({GANG_ANNOTATION: "Train_1", GANG_SIZE_ANNOTATION: "4"}, "not a DNS label", id="bad-name"),
    pytest.param({GANG_ANNOTATION: "train"}, "is missing", id="no-size"),
    pytest.param({GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "four"}, "not a whole number", id="words"),
    pytest.param({GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "0"}, "out of range", id="zero"),
    pytest.param({GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "-3"}, "out of range", id="negative"),
    pytest.param({GANG_SIZE_ANNOTATION: "4"}, "name the gang", id="size-without-name"),
])
def test_bad_gang_annotations_say_what_is_wrong(annotations: dict[str, str], says: str) -> None:
    with pytest.raises(GangError, match=says):
        pod_gang(annotated(**annotations))


def test_nodes_are_not_changed_by_a_decision() -> None:
    """The decision is pure: the usage map it is given is not written."""
    used = {GPU: {"n0": 0}}
    run([member(i) for i in range(2)], used=used)
    assert used == {GPU: {"n0": 0}}
    assert isinstance(NodeInfo("x"), NodeInfo)


# -- the sync, on the in-memory API ---------------------------------------------------------------


def gang_story(nodes: tuple[int, ...], size: int = 4, gpus: int = 4, create: int | None = None) -> Any:
    import json

    from gpuclaimctl.model import api
    from tests.sim.fakeapi import PODS
    from tests.sim.harness import NS
    from tests.test_sync_scenarios import Story

    s = Story(nodes=nodes)
    for i in range(size if create is None else create):
        s.t += 1.0
        s.fake.create(PODS, {"metadata": {
            "name": f"train-{i}", "namespace": NS,
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": gpus}]),
                            GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: str(size)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid",
                                 "controller": True}]},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}]}})
    s.see_all()
    return s


def sync_all(s: Any, rounds: int = 4) -> None:
    for _ in range(rounds):
        for key in sorted(k for k in s.ctl.queue.ready if k.startswith("pod:")):
            s.sync(key)
        s.see_all()


def sync_with_bind_refused(s: Any, nth: int) -> int:
    """Sync the deciding member train-0 with its `nth` bind refused (a 500:
    nothing written); how many binds it tried."""
    from gpuclaimctl.client.errors import ApiError

    calls = {"n": 0}

    def refuse_nth(method: str, _body: Any) -> None:
        if method == "update_claim_status":
            calls["n"] += 1
            if calls["n"] == nth:
                s.fake.inject(method, ApiError(500, "InternalError", "etcd is busy"), landed=False)
    s.fake.before_write = refuse_nth
    s.sync("pod:team/train-0")
    s.fake.before_write = None
    return calls["n"]


def released(s: Any, size: int = 4) -> list[bool]:
    return [not s.gated(f"train-{i}") for i in range(size)]


def test_a_gang_whose_sets_all_fit_is_released_whole() -> None:
    s = gang_story(nodes=(4, 4, 4, 4))
    sync_all(s)
    assert released(s) == [True] * 4
    assert {s.bound_on(f"n{i}") for i in range(4)} == {4}
    s.drain()
    s.check_quiet()


def test_a_gang_that_does_not_fit_releases_nobody_and_says_which_member_is_left_over() -> None:
    from gpuclaimctl.model import api
    from tests.sim.fakeapi import CLAIMS
    from tests.sim.harness import NS

    s = gang_story(nodes=(4, 4, 4))
    sync_all(s)
    assert released(s) == [False] * 4
    assert sum(s.bound_on(f"n{i}") for i in range(3)) == 0, "nothing held while the gang waits"
    for i in range(4):
        claim = s.fake.get(CLAIMS, NS, f"train-{i}-g")
        cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
        assert cond["reason"] == "GangCapacity" and "3 of 4 sets fit at once" in cond["message"], cond
    s.node("n9", 4)
    s.see_all()
    sync_all(s)
    assert released(s) == [True] * 4


def test_an_incomplete_gang_waits_and_is_placed_when_its_last_member_comes() -> None:
    import json

    from gpuclaimctl.model import api
    from tests.sim.fakeapi import CLAIMS, PODS
    from tests.sim.harness import NS

    s = gang_story(nodes=(4, 4, 4, 4), create=3)
    sync_all(s)
    assert released(s, 3) == [False] * 3
    claim = s.fake.get(CLAIMS, NS, "train-0-g")
    cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    assert cond["reason"] == "GangIncomplete" and "3 of 4 members exist" in cond["message"]
    s.fake.create(PODS, {"metadata": {
        "name": "train-3", "namespace": NS,
        "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": 4}]),
                        GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "4"}},
        "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}]}})
    s.see_all()
    sync_all(s)
    assert released(s) == [True] * 4


def test_members_that_disagree_on_the_size_are_told_gang_invalid() -> None:
    from tests.sim.fakeapi import PODS
    from tests.sim.harness import NS

    s = gang_story(nodes=(4, 4, 4, 4))
    s.fake.patch(PODS, NS, "train-2", lambda p: p["metadata"]["annotations"].update({GANG_SIZE_ANNOTATION: "3"}))
    s.see_all()
    sync_all(s)
    assert released(s) == [False] * 4
    assert {e.reason for e in s.fake.events if e.type == "Warning"} == {"GangInvalid"}
    assert any("disagree on its size" in e.message for e in s.fake.events)


def test_a_bind_that_fails_midway_is_finished_by_the_retry_from_the_same_decision() -> None:
    """The third bind is refused: the first two claims are bound, the rest
    stay counted in flight for the gang; the retry keeps what is bound and
    finishes. Meanwhile a single pod wanting the GPUs the gang holds waits."""
    s = gang_story(nodes=(4, 4, 4, 4))
    assert sync_with_bind_refused(s, 3) == 3
    assert released(s) == [False] * 4
    s.pod("single", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/single")
    assert s.gated("single"), "the GPUs the gang's decision took are held for it"
    sync_all(s)
    assert released(s) == [True] * 4
    assert s.gated("single")
    s.drain()
    s.check_quiet()


def test_a_bind_never_sent_after_a_failure_mid_set_stops_counting_once_the_gang_waits() -> None:
    """Member train-1 has two claims; the bind of its first is refused, so
    its second is never sent. Then its class is deleted: the gang waits and
    lets go of its decision. The unsent bind must stop counting with it
    (simulation seed 5172: it was taken out of the gang's unsent binds with
    the rest of its set, and counted in flight for ever)."""
    import json

    from gpuclaimctl.model import api
    from tests.sim.fakeapi import CLASSES, PODS
    from tests.sim.harness import NS
    from tests.test_sync_scenarios import Story

    s = Story(nodes=(4, 4))
    s._create_class("beta")
    for i, entries in enumerate(([{"name": "g", "className": "alpha", "count": 2}],
                                 [{"name": "a", "className": "beta", "count": 1},
                                  {"name": "b", "className": "beta", "count": 1}])):
        s.t += 1.0
        s.fake.create(PODS, {"metadata": {
            "name": f"train-{i}", "namespace": NS,
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries),
                            GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "2"}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}]}})
    s.see_all()
    assert sync_with_bind_refused(s, 2) == 2 and released(s, 2) == [False, False]
    s.fake.delete(CLASSES, "", "beta")
    s.see_all()
    sync_all(s)
    assert released(s, 2) == [False, False]
    s.drain()
    s.check_quiet()


# -- alike members share one ranking of the nodes, with the same result ----------------------


def _random_gang_case(rng: Any) -> dict[str, Any]:
    from gpuclaimctl.model.api import Strategy
    from gpuclaimctl.model.nodeaffinity import Taint
    from tests.test_placement import AMD

    nodes = []
    for i in range(rng.randint(1, 40)):
        resources = {GPU: rng.choice([0, 2, 4, 8, 8, 16])}
        if rng.random() < 0.3:
            resources[AMD] = rng.choice([0, 4, 8])
        taints = (Taint("team", "x", "NoSchedule"),) if rng.random() < 0.1 else ()
        nodes.append(node(f"n{i:02d}", labels={"zone": rng.choice("ab")}, taints=taints,
                          ready=rng.random() > 0.05, cordoned=rng.random() < 0.05, resources=resources))
    classes = [gpu_class("a100", selector={"zone": "a"} if rng.random() < 0.3 else None),
               gpu_class("mi300", resource=AMD)]
    used = {GPU: {n.name: rng.randint(0, 8) for n in nodes if rng.random() < 0.5},
            AMD: {n.name: rng.randint(0, 4) for n in nodes if rng.random() < 0.3}}
    shape = [("a100", rng.choice([1, 2, 4, 8]))] + ([("mi300", rng.choice([1, 2]))] if rng.random() < 0.2 else [])
    spec = {"nodeSelector": {"zone": "b"}} if rng.random() < 0.2 else None
    members = []
    for i in range(rng.randint(8, 40)):
        mine = shape if rng.random() < 0.85 else [("a100", rng.choice([1, 2]))]
        info = pod(spec, name=f"m{i}", created=NOW + timedelta(seconds=i), uid=f"uid-m{i}")
        members.append(GangMember(f"ns/m{i}", info, [claim(f"m{i}-{j}", n, cls) for j, (cls, n) in enumerate(mine)]))
    return dict(name="g", size=len(members), members=members, released=0, cluster=Cluster(nodes, classes),
                used=used, now=NOW, strategy=rng.choice(list(Strategy)))


def test_alike_members_are_placed_where_one_by_one_decisions_would_place_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import gpuclaimctl.decide.gang as gang_module

    rng = random.Random(44)
    seen = Counter[str]()
    for _ in range(300):
        case = _random_gang_case(rng)
        monkeypatch.setattr(gang_module, "ALIKE_FROM", 10**9)
        slow = decide_gang(**case)
        monkeypatch.setattr(gang_module, "ALIKE_FROM", 1)
        fast = decide_gang(**case)
        assert fast == slow, case
        seen[type(slow).__name__] += 1
    assert seen["GangPlaced"] > 30 and seen["GangWaiting"] > 30, seen


# -- no starvation: the oldest waiting gang holds what it could use -------------------------


def _starving() -> Any:
    """n0 busy with an older pod's 8 GPUs, n1 free; a gang of 2 x 8 waits
    (1 of 2 fits: n1); then a younger single pod of 8 comes."""
    from tests.sim.harness import NS
    from tests.test_sync_scenarios import Story

    s = Story(nodes=(8, 8))
    s.pod("busy", [{"name": "g", "className": "alpha", "count": 8}])
    s.see_all()
    s.sync(f"pod:{NS}/busy")
    s.see_all()
    assert not s.gated("busy")
    gang = gang_story_into(s, size=2, gpus=8)
    sync_all(gang)
    assert released(gang, 2) == [False, False]
    s.pod("small", [{"name": "g", "className": "alpha", "count": 8}])
    s.see_all()
    s.sync(f"pod:{NS}/small")
    s.see_all()
    return s


def gang_story_into(s: Any, size: int, gpus: int) -> Any:
    import json

    from gpuclaimctl.model import api
    from tests.sim.fakeapi import PODS
    from tests.sim.harness import NS

    for i in range(size):
        s.t += 1.0
        s.fake.create(PODS, {"metadata": {
            "name": f"train-{i}", "namespace": NS,
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": gpus}]),
                            GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: str(size)}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}]}})
    s.see_all()
    return s


def test_a_younger_pod_does_not_take_the_gpus_the_oldest_waiting_gang_could_use() -> None:
    """Issue 44 item 3: without the hold the single pod takes n1, and the
    gang waits again when n0 frees (for ever, under a stream of such pods)."""
    from gpuclaimctl.model import api
    from tests.sim.fakeapi import CLAIMS, PODS
    from tests.sim.harness import NS

    s = _starving()
    assert s.gated("small")
    claim = s.fake.get(CLAIMS, NS, "small-g")
    cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    assert cond["reason"] == "Capacity" and "held for the older gang train" in cond["message"], cond
    s.fake.delete(PODS, NS, "busy")
    s.fake.finish_pod_deletion(NS, "busy") if s.fake.get(PODS, NS, "busy") else None
    s.see_all()
    from gpuclaimctl.controller import key_order

    def age_order(key: str) -> tuple[str, ...]:
        return key_order(key, lambda ns, name: s.ctl.ctx.pods.get(ns, name))

    for _ in range(6):   # the claim lets go a second later; the freed GPUs wake the waiting pods,
        s.t += 1.0       # which the queue hands out oldest first (controller.key_order)
        s.ctl.queue.promote()
        for key in sorted((k for k in s.ctl.queue.ready if k.startswith(("claim:", "pod:"))), key=age_order):
            s.sync(key)
        s.see_all()
    assert released(s, 2) == [True, True]
    assert s.gated("small")
    s.drain()
    s.check_quiet()


def test_a_gang_s_hold_ends_when_nothing_moves_for_its_time() -> None:
    """The hold lasts HOLD_FOR after the gang's last decision: in a cluster
    where nothing frees, the gang could not complete anyway, and the
    younger pod gets the GPUs then."""
    from gpuclaimctl.state.view import HOLD_FOR
    from tests.sim.harness import NS

    s = _starving()
    assert s.gated("small")
    assert f"pod:{NS}/small" in s.ctl.queue.delayed or f"pod:{NS}/small" in s.ctl.queue.ready
    s.t += HOLD_FOR + 1.0
    s.ctl.queue.promote()
    s.sync(f"pod:{NS}/small")
    assert not s.gated("small")


def test_a_pod_older_than_the_waiting_gang_is_not_held_back() -> None:
    from tests.sim.harness import NS
    from tests.test_sync_scenarios import Story

    s = Story(nodes=(8, 8))
    s.pod("busy", [{"name": "g", "className": "alpha", "count": 8}])
    s.pod("older", [{"name": "g", "className": "alpha", "count": 8}])  # created before the gang
    s.see_all()
    s.sync(f"pod:{NS}/busy")
    s.see_all()
    gang = gang_story_into(s, size=2, gpus=8)
    sync_all(gang)   # the gang holds n1 ...
    s.sync(f"pod:{NS}/older")
    assert not s.gated("older")  # ... but not against an older pod
