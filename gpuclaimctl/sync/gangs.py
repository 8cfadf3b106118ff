"""`pod:` sync of a gang's member (DESIGN.md §4c): every member placed at
once, or none.

One member decides for its gang: the gated member first by name. The
other members' syncs hand the work to it (they queue its key), so the work
queue, which syncs a key on one worker at a time, takes one decision of a
gang at a time.

Gather, decide, apply, as for one pod (sync.pods), over every gated member:
1. gather each member's set (its missing template and inline claims made
   first: making a claim holds no GPUs);
2. decide with the view's lock held (`decide.gang.decide_gang`): all sets on
   one snapshot, each counting against the next, the budgets for the gang
   as a whole; on success every new placement is recorded in flight;
3. bind every member's claims, then release every member.

A write that fails midway: the binds not sent stay in flight, held for the
gang (Memories.gang_unsent), and the retry decides again over what is there
-- claims bound or in flight are kept where they are -- and finishes the
same decision; members already released count as placed. A gang that
waits instead (a member deleted meanwhile, a crash lost the decision and
its GPUs went elsewhere) holds nothing: the binds it never sent stop
counting, and its gated members' claims let go of them.

After release a member is a pod like any other: refused by kube-scheduler
or lost with its node, it is replaced and placed by itself while the other
members run (the README's gang section says why).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gpuclaimctl.decide import podplan, preempt
from gpuclaimctl.decide.gang import GangMember, GangPlaced, GangWaiting, decide_gang
from gpuclaimctl.decide.placement import ClaimWait, Placed, Waiting
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.budgets import NO_BUDGET_USE
from gpuclaimctl.model.gangs import Gang, GangError, PodGroupMissing, pod_gang
from gpuclaimctl.model.podclaims import PodClaimsError, has_gate, pod_claims
from gpuclaimctl.model.snapshot import ClaimState, PodInfo, PodRef, UnresolvedClaim
from gpuclaimctl.model.volumes import volume_constraints
from gpuclaimctl.state import indexes
from gpuclaimctl.state.view import HOLD_FOR, Change, GangHold
from gpuclaimctl.sync import preemption
from gpuclaimctl.sync.context import CLAIM, POD, SyncContext
from gpuclaimctl.sync.pods import (
    _bind_set,
    _budgets,
    _gather,
    _Landed,
    _release,
    _release_in_doubt,
    _resend_kept,
    _SetRead,
    _waiting,
    _warn_waiting,
    _with_inflight,
    _with_set_rejections,
)

log = logging.getLogger("gpuclaimctl.sync.gangs")
Obj = dict[str, Any]
# Seconds before a gang whose earlier bind is not seen back yet is decided again.
_UNSETTLED_RETRY = 1.0
# Seconds before a pod naming a PodGroup looks again while PodGroups are not
# read yet (its PodGroup's own event wakes it once they are, but not if the
# PodGroup does not exist). A third of the discovery period
# (controller.PODGROUP_DISCOVERY_PERIOD): soon after they appear, rarely.
_PODGROUPS_UNREAD_RETRY = 10.0


@dataclass(frozen=True)
class GangUnknown:
    """The pod names a PodGroup not known yet: it waits GangIncomplete."""

    message: str
    podgroups_read: bool


def place_gang(ctx: SyncContext, pod: Obj, gang: Gang | GangError | GangUnknown) -> None:
    """Sync a gated member of `gang`: the deciding member decides for all."""
    if isinstance(gang, GangError):
        _gang_waits(ctx, pod, api.WaitReason.GANG_INVALID, str(gang))
        return
    if isinstance(gang, GangUnknown):
        _gang_waits(ctx, pod, api.WaitReason.GANG_INCOMPLETE, gang.message)
        if not gang.podgroups_read:
            ctx.enqueue_after(POD + keys.key_of(pod), _PODGROUPS_UNREAD_RETRY)
        return
    members = _members(ctx, gang)
    problem = _disagreement(ctx, gang, members)
    if problem is not None:
        _gang_waits(ctx, pod, api.WaitReason.GANG_INVALID, problem)
        return
    released = ctx.memories.released
    gated = [m for m in members if has_gate(m) and m["metadata"].get("uid") not in released]
    decider = min(gated, key=lambda m: str(m["metadata"].get("name")))
    if decider["metadata"].get("uid") != pod["metadata"].get("uid"):
        ctx.enqueue(POD + keys.key_of(decider))  # it decides for the gang
        return
    uids = [str(m["metadata"].get("uid") or "") for m in gated]
    for uid in uids:
        ctx.memories.placing[uid] = True
    try:
        _place_gang_now(ctx, pod, gang, gated, len(members) - len(gated))
    finally:
        for uid in uids:
            ctx.memories.placing.pop(uid, None)


def _members(ctx: SyncContext, gang: Gang) -> list[Obj]:
    """The gang's pods the cache shows, not being deleted and not finished."""
    out = []
    for m in ctx.pods.by_index(indexes.PODS_BY_GANG, gang.key):
        if m["metadata"].get("deletionTimestamp") or (m.get("status") or {}).get("phase") in api.FINISHED_PHASES:
            continue
        out.append(m)
    return out


def _disagreement(ctx: SyncContext, gang: Gang, members: Sequence[Obj]) -> str | None:
    """Why the members do not make one gang, or None (a PodGroup's members
    name the one PodGroup: they agree)."""
    sizes: dict[int, str] = {}
    for m in members:
        name = str(m["metadata"].get("name"))
        try:
            theirs = pod_gang(m, ctx.podgroups)
        except GangError as e:
            return f"gang {gang.label}: member {name}: {e}"
        except PodGroupMissing:
            continue  # gone since this member's sync found it: its event comes
        if theirs is not None:
            sizes.setdefault(theirs.size, name)
    if len(sizes) > 1:
        said = ", ".join(f"{name} says {size}" for size, name in sorted(sizes.items()))
        return (f"the members of gang {gang.label} disagree on its size ({api.GANG_SIZE_ANNOTATION}): "
                f"{said}; none is placed until they agree")
    return None


def _place_gang_now(ctx: SyncContext, pod: Obj, gang: Gang, gated: Sequence[Obj], released: int) -> None:
    reads: list[_SetRead] = []
    invalid: list[GangMember] = []
    for m in sorted(gated, key=lambda p: str(p["metadata"].get("name"))):
        doubt = _release_in_doubt(ctx, m)
        if doubt is _Landed.RELEASED:
            released += 1
            continue
        if isinstance(doubt, tuple):
            # A release whose answer was lost may still land: decided again
            # once it has, or can no longer.
            ctx.enqueue_after(POD + keys.key_of(pod), doubt[1] + 0.1)
            return
        info = PodInfo.from_api(m, volumes=volume_constraints(m, ctx.pvcs.get, ctx.pvs.get))
        try:
            entries = pod_claims(m)
        except PodClaimsError as e:
            _warn_waiting(ctx, m, api.WaitReason.INVALID_CLAIMS, str(e))
            invalid.append(GangMember(keys.key_of(m), info, [UnresolvedClaim(
                api.CLAIMS_ANNOTATION, api.WaitReason.INVALID_CLAIMS, str(e))]))
            continue
        reads.append(_gather(ctx, m, info, entries, None))

    now = ctx.now()
    budgets = _budgets(ctx, gang.namespace)
    with ctx.view.deciding() as d:
        members = list(invalid)
        for r in reads:
            states: list[ClaimState | UnresolvedClaim] = [
                _with_inflight(d.in_flight(s.uid), s) if isinstance(s, ClaimState) else s for s in r.states]
            members.append(GangMember(r.key, r.info, _with_set_rejections(ctx, r.set_key, states, now)))
        age = min((r.age for r in reads), default=None)
        # A gang's priority is its members' highest; it preempts unless one
        # of them says Never (DESIGN.md §4d).
        priority = max((r.info.priority for r in reads), default=0)
        used, older_hold = d.used_by(age, gang.key, priority=priority) if age is not None \
            else (d.used(), None)
        budget_use = d.budget_use(gang.namespace) if budgets else NO_BUDGET_USE
        decision = decide_gang(gang.label, gang.size, members, released, d.cluster, used, now,
                               ctx.settings.strategy, budgets=budgets, budget_use=budget_use)
        plan = None
        if isinstance(decision, GangWaiting) and not released and preemption.plan_for(
                ctx, d, decision.reason, all(r.info.preempts for r in reads), now):
            plan = preempt.plan_gang(gang.label, gang.size, members, priority, d.cluster, used, now,
                                     d.units_on(now, preemption.STUCK_AFTER, ctx.memories.evicted.keys()),
                                     ctx.settings.strategy, budgets, budget_use,
                                     preemption.skip_nodes(ctx, gang.key, now))
        if plan is not None:
            nominated_away = d.nominate(preemption.nomination(gang.key, keys.key_of(pod), priority, plan, now))
        else:
            nominated_away = d.drop_nomination(gang.key)
        # The oldest waiting gang holds the GPUs its sets that fit would
        # take, against younger pods and gangs (view.GangHold); any other
        # outcome lets go of a hold of this gang's.
        hold = None
        if plan is None and isinstance(decision, GangWaiting) and decision.partial and age is not None:
            held: dict[str, dict[str, int]] = {}
            for _, placed in decision.partial:
                for a in placed.new_gpus():
                    per = held.setdefault(a.resource, {})
                    per[a.node] = per.get(a.node, 0) + a.count
            hold = GangHold(gang.key, age, held, now + timedelta(seconds=HOLD_FOR))
        freed = d.hold(hold, gang.key)
        unsettled = False
        if isinstance(decision, GangPlaced):
            taking = [(k, a) for k, p in decision.sets for a in p.new_gpus()]
            # As for one pod (sync.pods._decide): a claim with a write of
            # ours not seen back yet is not moved until it is.
            unsettled = any(d.in_flight(a.uid) is not None for _, a in taking)
            if not unsettled:
                by_key = {r.key: r for r in reads}
                for k, a in taking:
                    r = by_key[k]
                    claim = r.raw[a.claim]
                    d.record(a.uid, PodRef(r.info.name, r.info.uid), a.node, a.resource, a.count,
                             claim["metadata"].get("resourceVersion", ""), namespace=gang.namespace,
                             class_name=str((claim.get("spec") or {}).get("className") or ""), name=a.claim)
                # Entries put back on the wire are the decision's to send
                # too: never sent, they settle again (_let_go).
                took = frozenset(a.uid for _, a in taking).union(
                    *(_resend_kept(d, by_key[k].pod, by_key[k].raw, p) for k, p in decision.sets))
                ctx.memories.gang_unsent.update(gang.key, lambda old: (old or frozenset()) | took)

    if freed:
        ctx.wake(lambda: Change(freed_anywhere=True))  # what this gang held is free again
    if nominated_away:
        ctx.wake(lambda: Change(freed_on=nominated_away))
    if plan is not None:
        if preemption.evict(ctx, gang.key, pod, priority, plan, [r.pod for r in reads]):
            _let_go(ctx, gang, reads)
            for r in reads:
                _waiting(ctx, r.pod, preemption.preempting(plan, r.states), r.raw, ())
            ctx.enqueue_after(POD + keys.key_of(pod), preemption.RENEW_EVERY)
        return
    if unsettled:
        ctx.enqueue_after(POD + keys.key_of(pod), _UNSETTLED_RETRY)
        return
    if isinstance(decision, GangPlaced):
        _apply_placed(ctx, gang, reads, decision)
        return
    _let_go(ctx, gang, reads)
    for r in reads:
        wait = decision.members.get(r.key)
        if wait is not None:
            rejections = [x for s in r.states if isinstance(s, ClaimState) for x in s.rejected]
            _waiting(ctx, r.pod, wait, r.raw, rejections)
    if older_hold is not None:
        # An older gang's hold may be what keeps this one waiting; it ends
        # with no event to say so.
        ctx.enqueue_after(POD + keys.key_of(pod), max(0.0, (older_hold.until - now).total_seconds()) + 0.1)
    log.info("gang waits: %s", decision.message, extra={"pod": keys.key_of(pod), "reason": str(decision.reason)})


def _apply_placed(ctx: SyncContext, gang: Gang, reads: Sequence[_SetRead], decision: GangPlaced) -> None:
    """Every member's binds, then every member's release."""
    by_key = {r.key: r for r in reads}
    for key, placed in decision.sets:
        r = by_key[key]
        ctx.memories.capacity_needs.pop(key, None)
        # Only the binds sent leave the gang's unsent ones: after a failure
        # mid-set, the set's later claims were never sent, and must stay
        # there for the next sync to send or let go of (taken out with the
        # rest of their set, they counted in flight for ever: seed 5172).
        sent: set[str] = set()
        try:
            _bind_set(ctx, r.pod, r.raw, placed, keep_unsent=True, sent=sent)
        finally:
            ctx.memories.gang_unsent.update(gang.key, lambda old: frozenset((old or frozenset()) - sent))
    ctx.memories.gang_unsent.pop(gang.key, None)
    for key, placed in decision.sets:
        _release(ctx, by_key[key].pod, placed)
    log.info("gang placed: %d members released", len(decision.sets),
             extra={"pod": decision.sets[0][0] if decision.sets else gang.key})


def _let_go(ctx: SyncContext, gang: Gang, reads: Sequence[_SetRead]) -> None:
    """A waiting gang holds nothing: binds its last decision never sent stop
    counting (entries it put back on the wire settle again), and claims
    bound and reserved for its gated members let go of them (a Release
    claim returns to Pending through its claim sync)."""
    unsent = ctx.memories.gang_unsent.pop(gang.key) or frozenset()
    for uid in unsent:
        ctx.wake(functools.partial(ctx.view.not_sent, uid))
    for r in reads:
        uid = r.info.uid
        for claim in r.raw.values():
            status = claim.get("status") or {}
            if status.get("phase") != api.Phase.BOUND or not any(
                    ref.get("uid") == uid for ref in status.get("reservedFor") or ()):
                continue
            if ctx.view.in_flight(str(claim["metadata"].get("uid") or "")) is not None:
                continue  # a write of ours is not seen back yet: its sync comes again
            body = podplan.unreserved_claim(claim, uid)
            if body is not None:
                ctx.writer.update_claim_status(body)
                ctx.enqueue(CLAIM + keys.key_of(claim))
                log.info("a waiting gang's member lets go of a claim bound for it",
                         extra={"pod": r.key, "claim": keys.key_of(claim)})


def _gang_waits(ctx: SyncContext, pod: Obj, reason: api.WaitReason, message: str) -> None:
    """The pod waits for a reason of its gang's found before any decision
    (GangInvalid, or GangIncomplete for a PodGroup not known yet): its
    Warning event, and the Waiting of the claims of its own that exist
    (nothing is made for a gang that cannot be placed yet)."""
    raw: dict[str, Mapping[str, Any]] = {}
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        entries = ()
    meta = pod["metadata"]
    for e in entries:
        claim = ctx.claims.get(str(meta.get("namespace") or ""), e.claim_name(str(meta["name"])))
        if claim is not None:
            raw[claim["metadata"]["name"]] = claim
    wait = ClaimWait(reason, message)
    _waiting(ctx, pod, Waiting(reason, message, {n: wait for n in raw}), raw, ())


def gang_of(ctx: SyncContext, pod: Mapping[str, Any]) -> Gang | None | GangError | GangUnknown:
    """The pod's gang (its annotations, else the PodGroup it names), None,
    what is wrong with its annotations, or why its PodGroup is not known."""
    try:
        return pod_gang(pod, ctx.podgroups)
    except GangError as e:
        return e
    except PodGroupMissing as e:
        if not ctx.podgroups_synced():
            return GangUnknown(
                f"the pod names PodGroup {e.name}, and PodGroups (scheduling.k8s.io/v1beta1) are not "
                "read yet (the API server does not serve them, or their cache is still filling); it "
                "waits until its PodGroup is known", podgroups_read=False)
        return GangUnknown(f"PodGroup {e.name}, which the pod names, is not found in namespace "
                           f"{e.namespace}; it waits until it exists", podgroups_read=True)


__all__ = ["place_gang", "gang_of", "GangUnknown", "Placed"]
