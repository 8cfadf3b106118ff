"""plan_claim: what a claim sync decides, as a decision table on literals.

Stale reservations, the reclaim policy, template claims of finished pods,
finalizers, Lost claims and expired rejections (DESIGN.md §5, `claim:`).
"""

from __future__ import annotations

import copy
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpuclaimctl.decide import podplan
from gpuclaimctl.decide.placement import ClaimWait
from gpuclaimctl.model import api
from gpuclaimctl.model.snapshot import Rejection
from gpuclaimctl.decide.claimplan import (
    ClaimPlan,
    NodeFacts,
    PodFacts,
    Stale,
    plan_claim,
    pod_done,
    reservation_verdict,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
GRACE = 300.0
REJECT_FOR = 600.0
OWNER_UID = "owner-uid"

Obj = dict[str, Any]


def ts(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def a_claim(
    *,
    phase: str | None = "Bound",
    node: str | None = "node-a",
    reserved: tuple[str, ...] = (),
    policy: str | None = None,
    template: bool = False,
    deleting: bool = False,
    finalizer: bool = True,
    rejected: tuple[tuple[str, str], ...] = (),
) -> Obj:
    meta: Obj = {"name": "c", "namespace": "ns", "uid": "claim-uid"}
    if finalizer:
        meta["finalizers"] = ["example.com/other", api.CLAIM_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = ts(ago(5))
    if template:
        meta["labels"] = {api.TEMPLATE_CLAIM_LABEL: api.TEMPLATE_CLAIM_LABEL_VALUE}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "owner",
                                    "uid": OWNER_UID, "controller": True}]
    spec: Obj = {"className": "a100", "count": 2}
    if policy is not None:
        spec["reclaimPolicy"] = policy
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
    if node is not None:
        status["nodeName"] = node
        if phase in (api.Phase.BOUND, api.Phase.LOST):
            status["resourceName"] = "nvidia.com/gpu"  # recorded at bind
    if reserved:
        status["reservedFor"] = [{"name": f"pod-{u}", "uid": u} for u in reserved]
    if rejected:
        status["rejectedNodes"] = [{"nodeName": n, "reason": "refused", "until": u} for n, u in rejected]
    return {"metadata": meta, "spec": spec, "status": status}


def waiting(**kw: Any) -> Obj:
    """A Pending claim, as it is while its set waits."""
    return a_claim(phase=api.Phase.PENDING, node=None, **kw)


def running(uid: str, node: str = "node-a") -> PodFacts:
    return PodFacts(uid=uid, phase="Running", node_name=node)


def plan(
    claim: Obj,
    pods: dict[str, PodFacts | None] | None = None,
    owner: PodFacts | None | bool = False,
    node: NodeFacts | None = None,
    nodes_changed: dict[str, datetime] | None = None,
) -> ClaimPlan:
    return plan_claim(claim, pods or {}, owner, node, NOW, node_lost_grace=GRACE,
                      reject_for=REJECT_FOR, nodes_changed=nodes_changed)


# --- stale reservations -------------------------------------------------------------


@pytest.mark.parametrize(
    "pod, verdict",
    [
        pytest.param(None, Stale.DELETED, id="pod-deleted"),
        pytest.param(running("other"), Stale.REPLACED, id="name-now-has-another-uid"),
        pytest.param(PodFacts("p1", "Succeeded", "node-a"), Stale.FINISHED, id="succeeded"),
        pytest.param(PodFacts("p1", "Failed", "node-a"), Stale.FINISHED, id="failed"),
        pytest.param(PodFacts("p1", "Pending", "", deleting=True), Stale.UNSCHEDULED,
                     id="deleted-before-scheduling"),
        pytest.param(running("p1"), None, id="running-kept"),
        pytest.param(PodFacts("p1", "Pending", ""), None, id="pending-gated-kept"),
        pytest.param(PodFacts("p1", "Pending", "node-a"), None, id="scheduled-not-started-kept"),
        pytest.param(PodFacts("p1", "Running", "node-a", deleting=True), None,
                     id="terminating-on-its-node-kept"),
    ],
)
def test_a_reservation_is_stale_only_when_its_pod_will_not_run_again(
    pod: PodFacts | None, verdict: Stale | None
) -> None:
    assert reservation_verdict("p1", pod) == verdict
    result = plan(a_claim(reserved=("p1",)), {"p1": pod})
    if verdict is None:
        assert result.removed == []
        assert result.status["reservedFor"] == [{"name": "pod-p1", "uid": "p1"}]
        assert not result.status_changed
    else:
        assert result.removed == [({"name": "pod-p1", "uid": "p1"}, verdict)]
        assert result.status["reservedFor"] == []
        assert result.status_changed


def test_only_the_stale_entries_are_dropped_and_the_claim_stays_bound() -> None:
    claim = a_claim(reserved=("gone", "alive"))
    result = plan(claim, {"gone": None, "alive": running("alive")})
    assert [(ref["uid"], why) for ref, why in result.removed] == [("gone", Stale.DELETED)]
    assert result.status["reservedFor"] == [{"name": "pod-alive", "uid": "alive"}]
    assert result.status["phase"] == api.Phase.BOUND
    assert result.status["nodeName"] == "node-a"
    # The input is a cache object: never changed in place.
    assert len(claim["status"]["reservedFor"]) == 2


def test_a_claim_with_nothing_to_do_plans_nothing() -> None:
    result = plan(a_claim(reserved=("p1",)), {"p1": running("p1")}, node=NodeFacts(exists=True))
    assert result == ClaimPlan(status=a_claim(reserved=("p1",))["status"])


# --- reclaim policy -----------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, phase, node",
    [
        pytest.param(None, api.Phase.PENDING, None, id="default-release-returns-to-pending"),
        pytest.param(api.ReclaimPolicy.RELEASE, api.Phase.PENDING, None, id="release-returns-to-pending"),
        pytest.param(api.ReclaimPolicy.RETAIN, api.Phase.BOUND, "node-a", id="retain-stays-bound"),
    ],
)
def test_when_the_last_user_goes_the_reclaim_policy_decides_the_phase(
    policy: str | None, phase: str, node: str | None
) -> None:
    result = plan(a_claim(reserved=("p1",), policy=policy), {"p1": None})
    assert result.status["phase"] == phase
    assert result.status.get("nodeName") == node
    assert result.status_changed


def test_a_released_claim_keeps_its_rejections() -> None:
    rejected = (("node-b", ts(later(60))),)
    result = plan(a_claim(reserved=("p1",), rejected=rejected), {"p1": None})
    assert result.status["phase"] == api.Phase.PENDING
    assert [r["nodeName"] for r in result.status["rejectedNodes"]] == ["node-b"]


def test_a_pending_claim_nobody_uses_is_left_alone() -> None:
    result = plan(a_claim(phase=api.Phase.PENDING, node=None))
    assert not result.status_changed and not result.delete


# --- template claims ----------------------------------------------------------------


@pytest.mark.parametrize(
    "owner, deleted",
    [
        pytest.param(None, True, id="owner-vanished"),
        pytest.param(running("replacement"), True, id="owner-replaced-by-another-uid"),
        pytest.param(PodFacts(OWNER_UID, "Succeeded", "node-a"), True, id="owner-succeeded"),
        pytest.param(PodFacts(OWNER_UID, "Failed", "node-a"), True, id="owner-failed"),
        pytest.param(PodFacts(OWNER_UID, "Pending", "", deleting=True), True,
                     id="owner-deleted-before-scheduling"),
        pytest.param(running(OWNER_UID), False, id="owner-running"),
        pytest.param(PodFacts(OWNER_UID, "Pending", ""), False, id="owner-still-gated"),
        pytest.param(PodFacts(OWNER_UID, "Running", "node-a", deleting=True), False,
                     id="owner-terminating-on-its-node"),
    ],
)
def test_a_template_claim_is_deleted_once_its_owner_is_done_or_gone(
    owner: PodFacts | None, deleted: bool
) -> None:
    assert pod_done(owner, OWNER_UID) is deleted
    result = plan(a_claim(phase=api.Phase.PENDING, node=None, template=True), owner=owner)
    assert result.delete is deleted


def test_a_template_claim_whose_owner_finished_goes_once_its_reservation_is_dropped() -> None:
    finished = PodFacts(OWNER_UID, "Succeeded", "node-a")
    result = plan(a_claim(template=True, reserved=(OWNER_UID,)), {OWNER_UID: finished}, owner=finished)
    assert [why for _, why in result.removed] == [Stale.FINISHED]
    assert result.delete


def test_a_template_claim_still_reserved_by_a_live_pod_is_not_deleted() -> None:
    result = plan(a_claim(template=True, reserved=("p1",)), {"p1": running("p1")}, owner=None)
    assert not result.delete


@pytest.mark.parametrize(
    "claim, owner",
    [
        pytest.param(a_claim(phase=api.Phase.PENDING, node=None), None, id="not-a-template-claim"),
        pytest.param(a_claim(phase=api.Phase.PENDING, node=None, template=True, deleting=True), None,
                     id="already-being-deleted"),
    ],
)
def test_claims_that_are_not_ours_to_delete_are_not_deleted(claim: Obj, owner: PodFacts | None | bool) -> None:
    assert not plan(claim, owner=owner).delete


def test_a_user_claim_labelled_like_a_template_claim_but_owned_by_no_pod_is_kept() -> None:
    claim = a_claim(phase=api.Phase.PENDING, node=None, template=True)
    claim["metadata"]["ownerReferences"] = []
    assert not plan(claim, owner=None).delete


# --- finalizer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim, pods, removed",
    [
        pytest.param(a_claim(deleting=True), {}, True, id="deleted-and-unused"),
        pytest.param(a_claim(deleting=True, reserved=("p1",)), {"p1": None}, True,
                     id="deleted-and-its-last-user-just-went"),
        pytest.param(a_claim(deleting=True, reserved=("p1",)), {"p1": running("p1")}, False,
                     id="deleted-but-still-reserved"),
        pytest.param(a_claim(), {}, False, id="not-deleted"),
        pytest.param(a_claim(deleting=True, finalizer=False), {}, False, id="finalizer-already-gone"),
    ],
)
def test_a_deleted_claim_lets_go_of_its_finalizer_only_when_nothing_reserves_it(
    claim: Obj, pods: dict[str, PodFacts | None], removed: bool
) -> None:
    assert plan(claim, pods).remove_finalizer is removed


# --- Lost ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node, lost, requeue_after",
    [
        pytest.param(NodeFacts(exists=False, ready=False, unhealthy_since=ago(GRACE + 1)), True, None,
                     id="node-gone-past-grace"),
        pytest.param(NodeFacts(exists=True, ready=False, unhealthy_since=ago(GRACE)), True, None,
                     id="node-notready-exactly-the-grace"),
        pytest.param(NodeFacts(exists=False, ready=False, unhealthy_since=ago(100)), False, GRACE - 100,
                     id="node-gone-within-grace"),
        pytest.param(NodeFacts(exists=True, ready=False, unhealthy_since=ago(299)), False, 1.0,
                     id="node-notready-within-grace"),
        pytest.param(NodeFacts(exists=True, ready=False), False, GRACE,
                     id="notready-since-unknown-counts-from-now"),
        pytest.param(NodeFacts(exists=True, ready=True), False, None, id="node-ready"),
    ],
)
def test_a_bound_claim_is_lost_only_after_its_node_was_unhealthy_for_the_grace(
    node: NodeFacts, lost: bool, requeue_after: float | None
) -> None:
    result = plan(a_claim(reserved=("p1",)), {"p1": running("p1")}, node=node)
    assert result.lost is lost
    assert result.status["phase"] == (api.Phase.LOST if lost else api.Phase.BOUND)
    assert result.status_changed is lost
    assert result.requeue_after == (pytest.approx(requeue_after) if requeue_after is not None else None)


def test_a_retained_claim_nobody_uses_is_lost_with_its_node() -> None:
    node = NodeFacts(exists=False, ready=False, unhealthy_since=ago(GRACE + 1))
    result = plan(a_claim(policy=api.ReclaimPolicy.RETAIN), node=node)
    assert result.lost and result.status["phase"] == api.Phase.LOST


def test_a_released_claim_is_not_lost_with_the_node_it_no_longer_holds() -> None:
    node = NodeFacts(exists=False, ready=False, unhealthy_since=ago(GRACE + 1))
    result = plan(a_claim(reserved=("p1",)), {"p1": None}, node=node)
    assert not result.lost
    assert result.status["phase"] == api.Phase.PENDING


@pytest.mark.parametrize(
    "node, pod, found",
    [
        pytest.param(NodeFacts(exists=True, ready=True, room=True), running("p1"), True,
                     id="node-back-pod-still-there"),
        pytest.param(NodeFacts(exists=True, ready=True, room=True), PodFacts("p1", "Pending", "node-a"), True,
                     id="node-back-pod-bound-not-started"),
        pytest.param(NodeFacts(exists=True, ready=True, room=False), running("p1"), False,
                     id="node-back-smaller-than-what-counts-on-it"),
        pytest.param(NodeFacts(exists=True, ready=False, unhealthy_since=ago(GRACE + 1)), running("p1"), False,
                     id="node-still-notready"),
        pytest.param(NodeFacts(exists=False, ready=False, unhealthy_since=ago(GRACE + 1)), running("p1"), False,
                     id="node-still-gone"),
        pytest.param(NodeFacts(exists=True, ready=True, room=True), running("p1", node="node-b"), False,
                     id="pod-on-another-node"),
        pytest.param(NodeFacts(exists=True, ready=True, room=True), PodFacts("p1", "Pending", ""), False,
                     id="pod-gated-its-sync-places-the-set-anew"),
    ],
)
def test_a_lost_claim_is_bound_again_only_when_its_node_is_back_and_its_pod_still_on_it(
    node: NodeFacts, pod: PodFacts, found: bool
) -> None:
    result = plan(a_claim(phase=api.Phase.LOST, reserved=("p1",)), {"p1": pod}, node=node)
    assert result.found is found and not result.lost
    assert result.status["phase"] == (api.Phase.BOUND if found else api.Phase.LOST)
    assert result.status_changed is found


def test_a_lost_claim_nobody_reserves_stays_lost_when_its_node_comes_back() -> None:
    # Unreserved, it counted on no node while Lost: others may have been
    # placed on its GPUs since, so Bound again there could overcommit.
    result = plan(a_claim(phase=api.Phase.LOST, policy=api.ReclaimPolicy.RETAIN),
                  node=NodeFacts(exists=True, ready=True, room=True))
    assert not result.found and result.status["phase"] == api.Phase.LOST and not result.status_changed


@pytest.mark.parametrize(("policy", "phase"), [(None, api.Phase.PENDING), ("Retain", api.Phase.LOST)])
def test_a_lost_claim_whose_pod_finished_is_not_found_again(policy: str | None, phase: str) -> None:
    """Its last user went: Release returns it to Pending (DESIGN: "when its
    last user goes"), whatever became of its node; Retain keeps it."""
    result = plan(a_claim(phase=api.Phase.LOST, reserved=("p1",), policy=policy),
                  {"p1": PodFacts("p1", "Succeeded", "node-a")},
                  node=NodeFacts(exists=True, ready=True, room=True))
    assert not result.found and result.status["phase"] == phase
    assert result.status["reservedFor"] == []
    assert ("nodeName" in result.status) == (phase == api.Phase.LOST)


# --- rejections -----------------------------------------------------------------------


def test_expired_rejections_are_pruned_and_live_ones_kept() -> None:
    claim = waiting(rejected=(("node-old", ts(ago(1))), ("node-now", ts(NOW)), ("node-b", ts(later(120)))))
    result = plan(claim)
    assert [r["nodeName"] for r in result.status["rejectedNodes"]] == ["node-b"]
    assert result.status_changed
    assert result.requeue_after == pytest.approx(120)


def test_an_unreadable_rejection_time_is_pruned_rather_than_kept_forever() -> None:
    result = plan(waiting(rejected=(("node-b", "soon"),)))
    assert result.status["rejectedNodes"] == []
    assert result.status_changed


def rejected_at(made: datetime) -> Obj:
    """A waiting claim whose node-b was rejected at `made`, with `until`
    written as podsync writes it: whole seconds, the fraction cut off."""
    return waiting(rejected=(("node-b", ts(made + timedelta(seconds=REJECT_FOR))),))


@pytest.mark.parametrize(
    "made, changed_at, kept",
    [
        pytest.param(ago(60), ago(30), False, id="node-changed-after-the-rejection"),
        pytest.param(ago(60), ago(59), False, id="node-changed-a-second-after-the-written-time"),
        pytest.param(ago(60), ago(120), True, id="node-changed-before-the-rejection"),
        # Rejected at NOW-59.3 s; `until` says NOW+540 s, as if made at NOW-60 s.
        pytest.param(ago(59.3), ago(59.8), True, id="node-changed-before-it-within-the-cut-fraction"),
        pytest.param(ago(60), None, True, id="node-never-changed"),
    ],
)
def test_a_rejection_ends_early_only_when_its_node_changed_surely_after_it_was_made(
    made: datetime, changed_at: datetime | None, kept: bool
) -> None:
    changed = {"node-b": changed_at} if changed_at is not None else {"node-c": NOW}
    result = plan(rejected_at(made), nodes_changed=changed)
    assert bool(result.status["rejectedNodes"]) is kept
    assert result.status_changed is not kept


def test_requeue_after_is_the_soonest_of_the_grace_and_the_rejections() -> None:
    claim = a_claim(reserved=("p1",), rejected=(("node-b", ts(later(400))), ("node-c", ts(later(250)))))
    notready = NodeFacts(exists=True, ready=False, unhealthy_since=ago(GRACE - 280))
    assert plan(claim, {"p1": running("p1")}, node=notready).requeue_after == pytest.approx(250)
    notready = NodeFacts(exists=True, ready=False, unhealthy_since=ago(GRACE - 200))
    assert plan(claim, {"p1": running("p1")}, node=notready).requeue_after == pytest.approx(200)
    assert plan(claim, {"p1": running("p1")}).requeue_after == pytest.approx(250)


# --- PodFacts from a raw pod --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, facts",
    [
        pytest.param({"metadata": {"uid": "u", "deletionTimestamp": "2030-01-01T00:00:00Z"},
                      "spec": {"nodeName": "n"}, "status": {"phase": "Running"}},
                     PodFacts("u", "Running", "n", deleting=True), id="full"),
        pytest.param({"metadata": {"uid": "u"}, "spec": {"nodeName": None}, "status": None},
                     PodFacts("u"), id="empty-parts"),
        pytest.param({}, PodFacts(""), id="nothing"),
    ],
)
def test_pod_facts_read_a_raw_pod(raw: Obj, facts: PodFacts) -> None:
    assert PodFacts.from_api(raw) == facts


# --- the Waiting condition ----------------------------------------------------------


def with_waiting(claim: Obj) -> Obj:
    claim["status"]["conditions"] = [
        {"type": "Other", "status": "True"},
        {"type": api.CONDITION_WAITING, "status": "True", "reason": "Capacity",
         "message": "no node has room", "lastTransitionTime": ts(ago(60))}]
    return claim


def test_waiting_goes_when_no_gated_pod_names_the_claim_any_more() -> None:
    p = plan_claim(with_waiting(waiting()), {}, False, None, NOW, node_lost_grace=GRACE,
                   reject_for=REJECT_FOR, waited_for=False)
    assert p.status_changed
    assert p.status["conditions"] == [{"type": "Other", "status": "True"}]


def test_waiting_stays_while_a_gated_pod_names_the_claim() -> None:
    assert not plan(with_waiting(waiting())).status_changed
    assert not plan_claim(waiting(), {}, False, None, NOW, node_lost_grace=GRACE,
                          reject_for=REJECT_FOR, waited_for=False).status_changed


@pytest.mark.parametrize("seed", range(30))
def test_plans_and_status_bodies_never_change_the_cached_claim_they_read(seed: int) -> None:
    """The plan and the status bodies share the cached claim's parts (no
    deep copy, issue 12): they must replace what they change, never edit
    it in place, or the informer's cache would change under every reader."""
    rng = random.Random(seed)
    claim = a_claim(phase=rng.choice(("Bound", "Pending", "Lost", None)),
                    node=rng.choice(("node-a", None)),
                    reserved=tuple(rng.sample(("p1", "p2", "p3"), rng.randint(0, 2))),
                    policy=rng.choice((None, "Retain")), template=rng.random() < 0.5,
                    deleting=rng.random() < 0.3, finalizer=rng.random() < 0.7,
                    rejected=tuple((n, ts(later(rng.choice((-60, 60))))) for n in
                                   rng.sample(("node-a", "node-b"), rng.randint(0, 2))))
    claim.setdefault("status", {})["conditions"] = [
        {"type": api.CONDITION_WAITING, "status": "True", "reason": "Capacity", "message": "m"}]
    before = copy.deepcopy(claim)
    pods = {uid: rng.choice((None, PodFacts(uid=uid, phase="Succeeded"), PodFacts(uid=uid)))
            for uid in ("p1", "p2", "p3")}
    plan_claim(claim, pods, rng.choice((None, False, PodFacts(uid=OWNER_UID, phase="Failed"))),
               rng.choice((None, NodeFacts(exists=False), NodeFacts(exists=True))), NOW,
               node_lost_grace=0.0, reject_for=REJECT_FOR, waited_for=rng.random() < 0.5,
               class_resource="nvidia.com/gpu")
    pod = {"metadata": {"name": "p9", "namespace": "ns", "uid": "p9"}}
    podplan.bound_claim(claim, pod, "node-b", "nvidia.com/gpu")
    podplan.waiting_claim(claim, ClaimWait(api.WaitReason.CAPACITY, "other message"), NOW)
    podplan.rejected_claim(claim, Rejection("node-a", later(60), "refused"))
    podplan.unreserved_claim(claim, "p1")
    assert claim == before
