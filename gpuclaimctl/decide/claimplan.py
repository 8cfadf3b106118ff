"""What a claim sync should do (DESIGN.md §5, `claim:`): a pure decision.

Given a claim and plain facts about the pods it names, its owner pod and its
node, `plan_claim` returns the claim's new status and the writes to make.
No client, no clock (`now` is passed in), no globals: `claimsync` gathers
the facts from the caches (and a live GET where the cache cannot tell) and
performs the writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import has_gate, named_claims, template_owner_uid
from gpuclaimctl.model.snapshot import format_time, parse_time



class Stale(StrEnum):
    """Why a reservedFor entry no longer holds its claim."""

    DELETED = "deleted"
    REPLACED = "replaced"          # a pod of that name with another uid
    FINISHED = "finished"          # Succeeded or Failed
    UNSCHEDULED = "deleted-before-scheduling"
    NOT_NAMED = "no-longer-named"  # a gated pod whose annotation dropped the claim


@dataclass(frozen=True)
class PodFacts:
    uid: str
    phase: str = ""
    node_name: str = ""
    deleting: bool = False
    # Still gated by us, and no longer naming the claim in its annotation:
    # a sync reserved the claim, then the user edited the annotation before
    # the release. (A released pod may run with the GPUs whatever its
    # annotation says now, so only a gated one lets go.)
    gated_without_claim: bool = False

    @classmethod
    def from_api(cls, pod: Mapping[str, Any], claim_name: str = "") -> PodFacts:
        meta = pod.get("metadata") or {}
        return cls(uid=meta.get("uid", ""), phase=(pod.get("status") or {}).get("phase", ""),
                   node_name=(pod.get("spec") or {}).get("nodeName") or "",
                   deleting=bool(meta.get("deletionTimestamp")),
                   gated_without_claim=bool(claim_name) and has_gate(pod)
                   and claim_name not in named_claims(pod))


def reservation_verdict(ref_uid: str, pod: PodFacts | None) -> Stale | None:
    """None keeps the entry. `pod` is None only once the pod is known gone
    (a delete seen by the informer, or a live GET that found nothing)."""
    if pod is None:
        return Stale.DELETED
    if pod.uid != ref_uid:
        return Stale.REPLACED
    if pod.phase in api.FINISHED_PHASES:
        return Stale.FINISHED
    if pod.deleting and not pod.node_name:
        return Stale.UNSCHEDULED
    if pod.gated_without_claim:
        return Stale.NOT_NAMED
    return None


def pod_done(pod: PodFacts | None, owner_uid: str) -> bool:
    """The owner of a template claim has finished, is gone, or will never
    run (deleted before it was scheduled: upstream's isPodDone)."""
    return pod is None or reservation_verdict(owner_uid, pod) is not None


@dataclass(frozen=True)
class NodeFacts:
    exists: bool
    ready: bool = True
    # Since when the node has been NotReady or gone, as far as we know.
    unhealthy_since: datetime | None = None
    # Its allocatable covers everything counted on it, the claim's own GPUs
    # included (read for a Lost claim only: Bound again only then).
    room: bool = False


@dataclass
class ClaimPlan:
    status: dict[str, Any]
    status_changed: bool = False
    removed: list[tuple[dict[str, Any], Stale]] = field(default_factory=list)
    delete: bool = False
    remove_finalizer: bool = False
    lost: bool = False
    # A Lost claim Bound again: its node is back and its pod still there.
    found: bool = False
    # Look again after this many seconds (a grace period or a rejection ends).
    requeue_after: float | None = None

    def _soonest(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


def plan_claim(
    claim: Mapping[str, Any],
    pods: Mapping[str, PodFacts | None],
    owner: PodFacts | None | bool,
    node: NodeFacts | None,
    now: datetime,
    *,
    node_lost_grace: float,
    reject_for: float,
    nodes_changed: Mapping[str, datetime] | None = None,
    waited_for: bool = True,
    class_resource: str | None = None,
) -> ClaimPlan:
    """Decide a claim's cleanup.

    `pods` maps each reservedFor uid to what is known of the pod of that
    name. `owner` is the template claim's owner pod (None: gone), or False
    for a claim nobody owns. `node` describes status.nodeName (None when the
    claim names no node). `nodes_changed` maps node names to when their
    allocatable, taints or readiness last changed. `waited_for` is False
    when no pod that carries the gate names the claim. `class_resource` is
    the best evidence of the resource a claim that holds GPUs without
    `status.resourceName` (bound by an older version) holds: its class's
    resourceName, else the one resource its pods request (None: nothing
    tells). It is recorded, so what the claim holds no longer depends on
    the class; while nothing tells, condition ResourceUnknown says so (its
    node takes nothing new meanwhile: decide.capacity.with_unknown).
    """
    meta = claim.get("metadata") or {}
    # A new top level of the status: its fields are replaced whole below,
    # never edited in place, so the cached claim's parts can be shared.
    status: dict[str, Any] = dict(claim.get("status") or {})
    plan = ClaimPlan(status=status)
    spec = claim.get("spec") or {}

    # 1. Stale reservations.
    keep = []
    for ref in status.get("reservedFor") or ():
        verdict = reservation_verdict(ref.get("uid", ""), pods.get(ref.get("uid", "")))
        if verdict is None:
            keep.append(ref)
        else:
            plan.removed.append((ref, verdict))
    if plan.removed:
        status["reservedFor"] = keep
        plan.status_changed = True

    deleting = bool(meta.get("deletionTimestamp"))
    owner_uid = template_owner_uid(claim)

    # 2. A template claim whose pod is done goes with it.
    if owner is not False and owner_uid and not keep and not deleting:
        if pod_done(owner if isinstance(owner, PodFacts) else None, owner_uid):
            plan.delete = True

    # 3. Reclaim: the last user went. A Lost claim too: Release returns it
    #    to Pending whatever became of its node.
    phase = status.get("phase") or api.Phase.PENDING
    if not keep and phase in (api.Phase.BOUND, api.Phase.LOST):
        if spec.get("reclaimPolicy", api.ReclaimPolicy.RELEASE) == api.ReclaimPolicy.RELEASE:
            status["phase"] = api.Phase.PENDING
            status.pop("nodeName", None)
            status.pop("resourceName", None)
            phase = api.Phase.PENDING
            plan.status_changed = True

    # 4. A deleted claim nobody uses lets go of its finalizer.
    if deleting and not keep and api.CLAIM_FINALIZER in (meta.get("finalizers") or ()):
        plan.remove_finalizer = True

    # 5. A Bound claim on a node that is gone or NotReady past the grace is Lost.
    if phase == api.Phase.BOUND and node is not None and (not node.exists or not node.ready):
        since = node.unhealthy_since or now
        left = node_lost_grace - (now - since).total_seconds()
        if left <= 0:
            status["phase"] = api.Phase.LOST
            plan.lost = plan.status_changed = True
        else:
            plan._soonest(left)
    # 5b. A Lost claim whose node is back (it exists and is Ready) while a
    #     pod that reserves it is still bound there is Bound again: the pod
    #     runs with those GPUs. Nothing else changes: a Lost claim still
    #     reserved counts on its node as a Bound one does (decide.capacity).
    #     A gated pod (no node yet) does not: its sync places the set anew.
    #     Nor a node that came back smaller than what is counted on it:
    #     Bound GPUs never exceed a node's allocatable by our doing (I1).
    elif (phase == api.Phase.LOST and node is not None and node.exists and node.ready and node.room
          and any((p := pods.get(ref.get("uid", ""))) is not None and p.node_name == status.get("nodeName")
                  for ref in keep)):
        status["phase"] = api.Phase.BOUND
        plan.found = plan.status_changed = True

    # 6. Rejections end when they expire or the node changed after them.
    rejected = status.get("rejectedNodes") or []
    live = []
    for r in rejected:
        until = parse_time(r.get("until"))
        if until is None or until <= now:
            continue
        changed = (nodes_changed or {}).get(r.get("nodeName", ""))
        if changed is not None and changed >= rejection_made_by(until, reject_for):
            continue
        live.append(r)
        plan._soonest((until - now).total_seconds())
    if len(live) != len(rejected):
        status["rejectedNodes"] = live
        plan.status_changed = True

    # 7. Record the resource a claim bound by an older version holds, or
    #    say that nothing tells which.
    unrecorded = bool(status.get("nodeName") and status.get("phase") in (api.Phase.BOUND, api.Phase.LOST)
                      and not status.get("resourceName"))
    if unrecorded and class_resource:
        status["resourceName"] = class_resource
        plan.status_changed = True
    unknown = unrecorded and not class_resource
    said_unknown = any(c.get("type") == api.CONDITION_RESOURCE_UNKNOWN for c in status.get("conditions") or ())
    if unknown and not said_unknown:
        status["conditions"] = [*(status.get("conditions") or ()), {
            "type": api.CONDITION_RESOURCE_UNKNOWN, "status": "True", "reason": "ClassNotFound",
            "message": f"bound to node {status.get('nodeName')} by a version that did not record "
                       f"status.resourceName, and its GPUClass {spec.get('className')} is gone: which "
                       "resource it holds is unknown, so the node takes no new placement until it is "
                       "told; recreate the GPUClass (its resourceName is then recorded) or delete "
                       "the claim",
            "lastTransitionTime": format_time(now)}]
        plan.status_changed = True
    elif said_unknown and not unknown:
        status["conditions"] = [c for c in status.get("conditions") or ()
                                if c.get("type") != api.CONDITION_RESOURCE_UNKNOWN]
        plan.status_changed = True

    # 8. Waiting is there only while a pod waits for the claim: when its pod
    #    went (or was ungated by someone else), it goes, as it does when the
    #    claim is bound.
    conditions = status.get("conditions") or []
    if not waited_for and any(c.get("type") == api.CONDITION_WAITING for c in conditions):
        status["conditions"] = [c for c in conditions if c.get("type") != api.CONDITION_WAITING]
        plan.status_changed = True
    return plan


# `until` is written in whole seconds (podsync cuts the fraction off).
_UNTIL_PRECISION = timedelta(seconds=1)


def rejection_made_by(until: datetime, reject_for: float) -> datetime:
    """The latest moment a rejection lasting until `until` can have been
    made. A node change at or after it surely came after the rejection and
    ends it; an earlier one may have come before the rejection (may even be
    the change the node was refused for) and does not."""
    return until - timedelta(seconds=reject_for) + _UNTIL_PRECISION
