"""`pod:` sync (DESIGN.md §5): place a gated pod's set and release the pod,
or act on a pinned pod the scheduler refused.

Read, plan, apply, in at most two rounds: the caches give the pod and its
claims; `podplan.resolve` says which claims to create first (applied, then
read again from the answers); `placement.decide` chooses with the view's
lock held and records its placements in flight; the writes follow in an
order that makes every step idempotent:

1. create missing template claims (deterministic names: found again by name);
2. add our finalizer, then bind and reserve each claim (status, with its
   resourceVersion); the claims of a set are independent of each other;
3. release the pod in ONE patch that tests what the decision read of it.

A crash between any two writes leaves claims Bound and reserved for this
pod; the next sync sees them, decides Keep, and goes on from step 3.

What a placed pod costs, and why each write stays (issue 12):
- a template or inline claim: one create (the API server drops `status` on
  create, the CRD having a status subresource, so the bind cannot ride on
  it) and one status update (Bound, node, reservedFor: the bind itself).
  Our finalizer is in the create's body, so no update for it;
- a user claim: the finalizer update (only the first time: a claim that
  has it skips it) and the status update;
- the pod: one JSON patch (gate removed, node pinned) -- the release; a
  patch with tests rather than an update with the resourceVersion, which
  kube-scheduler's status write on every gated pod made fail (see
  podplan.release_patch);
- nothing else on this path: the Normal event goes to the recorder
  (client/events.py), off the write budget; a claim already bound as
  planned, and a Waiting condition that says the same, are not written.
A set's binds go one after another: under the client's rate limit sending
them at once would add no throughput, and in this order a crash leaves at
most the claims before it bound, which the next sync keeps.

Every write's fate reaches the view: its answered resourceVersion, or that
it failed (refused, or its answer lost); either way the GPUs stay counted
until the informer shows a version of the claim that accounts for it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson

from gpuclaimctl.client.errors import AlreadyExists, ApiError, Conflict, NotFound, surely_not_written
from gpuclaimctl.decide import podplan, preempt
from gpuclaimctl.decide.placement import Action, Placed, Waiting, decide
from gpuclaimctl.decide.preempt import Preemption
from gpuclaimctl.decide.podplan import Found, Outdated, ToCreate
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo
from gpuclaimctl.model.nodeaffinity import Taint, Toleration, untolerated_node_state_taint
from gpuclaimctl.model.nodes import node_ready
from gpuclaimctl.model.owners import controller_ref
from gpuclaimctl.model.podclaims import EntrySource, PodClaimsError, pod_claims
from gpuclaimctl.model.volumes import volume_constraints
from gpuclaimctl.model.snapshot import (
    Age,
    age_of,
    ClaimState,
    PodInfo,
    PodRef,
    Rejection,
    UnresolvedClaim,
    format_time,
    parse_time,
)
from gpuclaimctl.model.podclaims import has_gate
from gpuclaimctl.state import indexes
from gpuclaimctl.state.inflight import InFlight, may_still_land_for, parse_rv
from gpuclaimctl.state.view import Change, Decider, GangHold
from gpuclaimctl.sync import preemption
from gpuclaimctl.state.memories import NOT_GATED_TOLD, refused_create_told, told_key
from gpuclaimctl.sync.context import CLAIM, POD, SyncContext

log = logging.getLogger("gpuclaimctl.sync.pods")
Obj = dict[str, Any]

# Answers to a create that only a change by the user can turn around
# (Forbidden is what an exceeded ResourceQuota answers).
_REFUSED_BY_USER_INPUT = frozenset({400, 403, 422})
# Seconds before a set whose claim's earlier bind is not seen back yet is
# decided again (see _place), unless the claim's update wakes it first.
_UNSETTLED_RETRY = 1.0
# Seconds before a pod whose Waiting write met a newer version of its claim
# is decided again (see _waiting).
_WAITING_CONFLICT_RETRY = 1.0
# Seconds before a pod whose Warning the event recorder dropped (its queue
# full: at the default --event-qps of 20, a full queue of 1,000 drains in
# about 50 s) is synced again to tell it.
_TELL_AGAIN_AFTER = 30.0


# -- placing a gated pod ----------------------------------------------------------------


def _place(ctx: SyncContext, pod: Obj) -> None:
    uid = str(pod["metadata"].get("uid") or "")
    ctx.memories.placing[uid] = True
    try:
        _place_now(ctx, pod)
    finally:
        ctx.memories.placing.pop(uid, None)


def _place_now(ctx: SyncContext, pod: Obj) -> None:
    """Gather, decide, apply: the claims the set names (made first where
    they are missing), THE decision under the view's lock (what it takes is
    counted in flight there), then the writes that decision asks for."""
    doubt = _release_in_doubt(ctx, pod)
    if doubt is _Landed.RELEASED:
        return
    try:
        entries = pod_claims(pod)
    except PodClaimsError as e:
        # str(e) says which annotation and why ("annotation ... is invalid: ...").
        _warn_waiting(ctx, pod, api.WaitReason.INVALID_CLAIMS, str(e))
        return
    # Only nodes every bound volume reaches (the scheduler would refuse others).
    info = PodInfo.from_api(pod, volumes=volume_constraints(pod, ctx.pvcs.get, ctx.pvs.get))
    key, age = keys.key_of(pod), age_of(info.priority, info.created, info.namespace, info.name)
    # Oldest first where pods compete: see turnstile.
    with ctx.turnstile.entered(key, age):
        read = _gather(ctx, pod, info, entries, doubt if isinstance(doubt, tuple) else None)
        ctx.turnstile.wait_turn(key, age)
        verdict = _decide(ctx, read)
    _apply(ctx, read, verdict)


@dataclasses.dataclass(frozen=True)
class _SetRead:
    """What a placing sync gathered: the pod and its set's claims, as read
    (or as made by this sync), before deciding."""

    pod: Obj
    info: PodInfo
    key: str
    age: Age
    # claim name -> the claim as read or made (what the writes are based on).
    raw: Mapping[str, Mapping[str, Any]]
    states: Sequence[ClaimState | UnresolvedClaim]
    set_key: tuple[str, str]
    # An earlier release whose answer was lost may still pin the pod to
    # this node, for this many seconds more (_release_in_doubt).
    doubt: tuple[str, float] | None


def _gather(ctx: SyncContext, pod: Obj, info: PodInfo, entries: Sequence[Any],
            doubt: tuple[str, float] | None) -> _SetRead:
    """The set's claims from the caches; a template or inline claim that is
    missing is made first (its create's answer is the claim), one made from
    an earlier annotation is deleted (the set waits for it to go)."""
    resolved = podplan.resolve(pod, entries, ctx.claims.get, ctx.templates.get)
    created = {r.entry.name: _create(ctx, pod, r) for r in resolved if isinstance(r, ToCreate)}
    raw: dict[str, Mapping[str, Any]] = {}
    states: list[ClaimState | UnresolvedClaim] = []
    key = keys.key_of(pod)
    for entry, r in zip(entries, resolved):
        if isinstance(r, Outdated):
            # Made again once the delete is seen (the claim's delete
            # event brings the pod back); until then the set waits.
            # Only the version read: a bind of ours the cache does not
            # show yet makes it a 409, and the pod is synced again.
            meta = r.claim["metadata"]
            ctx.writer.delete_claim(info.namespace, meta["name"], meta["uid"], meta.get("resourceVersion"))
            log.info("deleted a claim made from an earlier annotation", extra={"pod": key})
            states.append(UnresolvedClaim(r.claim["metadata"]["name"], api.WaitReason.CLAIM_MISSING,
                                          r.message))
            continue
        claim = created.get(entry.name) if isinstance(r, ToCreate) else (
            r.claim if isinstance(r, Found) else None)
        if claim is None:
            assert isinstance(r, UnresolvedClaim)
            states.append(r)
        else:
            raw[claim["metadata"]["name"]] = claim
            states.append(ClaimState.from_api(claim))
    return _SetRead(pod, info, key, age_of(info.priority, info.created, info.namespace, info.name), raw, states,
                    podplan.set_key(pod, entries), doubt)


class _Step(enum.Enum):
    """What the sync does with its decision."""

    PLACE = "place"          # bind the claims and release the pod
    WAIT = "wait"            # say why it waits
    UNSETTLED = "unsettled"  # an earlier bind of a claim it would move is not seen back yet
    OVERTAKEN = "overtaken"  # an older pod was woken after this one's turn came
    HELD_BACK = "held back"  # an earlier release to another node may land yet
    PREEMPT = "preempt"      # evict pods of lower priority; their GPUs are held for it


@dataclasses.dataclass(frozen=True)
class _Verdict:
    decision: Placed | Waiting
    # The claims as decided on (in-flight placements and the set's
    # remembered rejections folded in).
    states: Sequence[ClaimState | UnresolvedClaim]
    step: _Step
    now: datetime
    unsettled: InFlight | None = None
    # An older waiting gang's hold the decision counted, if it waited.
    hold: GangHold | None = None
    preemption: Preemption | None = None
    # Nodes where GPUs held for this pod (its nomination) are no longer held.
    freed: frozenset[str] = frozenset()
    # Kept claims whose entries the decision put back on the wire (_resend_kept).
    resent: frozenset[str] = frozenset()


def _decide(ctx: SyncContext, read: _SetRead) -> _Verdict:
    """THE decision, with the view's lock held from reading usage to
    recording what it takes in flight (nothing else decides meanwhile)."""
    now = ctx.now()
    info = read.info
    me = PodRef(info.name, info.uid)
    budgets = _budgets(ctx, info.namespace)
    pinned = read.doubt[0] if read.doubt is not None else None
    with ctx.view.deciding() as d:
        states = [_with_inflight(d.in_flight(s.uid), s) if isinstance(s, ClaimState) else s
                  for s in read.states]
        states = _with_set_rejections(ctx, read.set_key, states, now)
        used, hold = d.used_by(read.age, me=info.uid, priority=info.priority)
        budget_use = d.budget_use(info.namespace) if budgets else NO_BUDGET_USE
        decision = decide(info, states, d.cluster, used, now, ctx.settings.strategy,
                          budgets=budgets, budget_use=budget_use)
        # Whatever comes of this decision, a turn given up last time is not
        # given up again now (Memories.gave_turn: once in a row at most).
        gave_turn_last_time = ctx.memories.gave_turn.pop(info.uid) is not None
        if isinstance(decision, Waiting):
            plan = preemption.plan_for(ctx, d, decision.reason, info.preempts, now) and preempt.plan(
                info, info.priority, states, d.cluster, used, now,
                d.units_on(now, preemption.STUCK_AFTER, ctx.memories.evicted.keys()), ctx.settings.strategy,
                budgets, budget_use, preemption.skip_nodes(ctx, info.uid, now))
            if plan:
                freed = d.nominate(preemption.nomination(info.uid, read.key, info.priority, plan, now))
                return _Verdict(preemption.preempting(plan, states), states, _Step.PREEMPT, now,
                                preemption=plan, freed=freed)
            return _Verdict(held_note(decision, hold), states, _Step.WAIT, now, hold=hold,
                            freed=d.drop_nomination(info.uid))
        if pinned is not None and decision.node != pinned:
            return _Verdict(decision, states, _Step.HELD_BACK, now)
        # A claim with a write of ours not seen back yet (answered, or
        # refused or lost and not settled) counts where that write puts
        # it: the decision sees it bound there (_with_inflight). Taking
        # new GPUs for it elsewhere -- the node went invalid for the set
        # meanwhile -- would replace that count while the claim may be
        # bound there on the server (I1). The move waits until the
        # informer shows what the write did (the entry ends).
        unsettled = next((e for e in (d.in_flight(a.uid) for a in decision.new_gpus()) if e is not None), None)
        if unsettled is not None:
            return _Verdict(decision, states, _Step.UNSETTLED, now, unsettled)
        # GPUs freed since this pod's turn came woke older pods (the
        # view and the queue change together: Handlers.woke_by); the
        # oldest that fits gets them first. Only when taking new GPUs:
        # a pod that waits takes nothing from anyone. Once in a row at
        # most (Memories.gave_turn).
        if not gave_turn_last_time and any(decision.new_gpus()) and ctx.turnstile.overtaken(read.key, read.age):
            ctx.memories.gave_turn[info.uid] = True
            return _Verdict(decision, states, _Step.OVERTAKEN, now)
        for a in decision.new_gpus():
            claim = read.raw[a.claim]
            d.record(a.uid, me, a.node, a.resource, a.count,
                     claim["metadata"].get("resourceVersion", ""), namespace=info.namespace,
                     class_name=str((claim.get("spec") or {}).get("className") or ""),
                     name=a.claim)
        resent = _resend_kept(d, read.pod, read.raw, decision)
        # What was held for it while its victims went is taken now (or, on
        # another node, free for others).
        freed = d.drop_nomination(info.uid) - {decision.node}
        return _Verdict(decision, states, _Step.PLACE, now, freed=freed, resent=resent)


def held_note(decision: Waiting, hold: GangHold | None) -> Waiting:
    """A Capacity wait under an older gang's hold says so."""
    if hold is None or decision.reason is not api.WaitReason.CAPACITY:
        return decision
    nodes = sorted({n for per in hold.usage.values() for n in per})
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    note = (f"; GPUs on {shown} are held for the older gang {hold.gang.rpartition('/')[2]} while it "
            "waits for the rest of its sets")
    claims = {name: dataclasses.replace(w, message=w.message + note) for name, w in decision.claims.items()}
    return dataclasses.replace(decision, message=decision.message + note, claims=claims)


def _resend_kept(d: Decider, pod: Obj, raw: Mapping[str, Mapping[str, Any]], decision: Placed) -> frozenset[str]:
    """A claim kept where an earlier write of ours put it (its in-flight
    entry: the cache does not show that bind) is written again: its entry
    goes back on the wire from the version read, so it ends only by this
    write's fate (InFlightPlacements.resend). The uids put back on the
    wire: each write is sent, or said never sent (ClusterView.not_sent)."""
    resent = set()
    for a in decision.claims:
        if a.action is Action.KEEP and d.in_flight(a.uid) is not None:
            claim = raw[a.claim]
            if not podplan.bound_as_planned(claim, pod, a.node, a.resource) and \
                    d.resend(a.uid, str(claim["metadata"].get("resourceVersion", ""))):
                resent.add(a.uid)
    return frozenset(resent)


def _apply(ctx: SyncContext, read: _SetRead, verdict: _Verdict) -> None:
    """The writes (or the retry) the verdict asks for."""
    pod, key, decision = read.pod, read.key, verdict.decision
    if verdict.freed:
        ctx.wake(lambda: Change(freed_on=verdict.freed))
    if verdict.step is _Step.PREEMPT:
        assert verdict.preemption is not None and isinstance(decision, Waiting)
        if preemption.evict(ctx, read.info.uid, pod, read.info.priority, verdict.preemption):
            _apply_waiting(ctx, read, decision, verdict.states)
            ctx.enqueue_after(POD + key, preemption.RENEW_EVERY)
        return
    if verdict.step is _Step.UNSETTLED:
        assert verdict.unsettled is not None
        # Woken by the claim's update once seen; the delay is the backstop
        # for an end no pod event brings (a refusal followed by another's
        # change of the claim, a lost answer settled by a live read).
        log.info("a claim's earlier bind is not seen back yet; the set moves once it is",
                 extra={"pod": key, "node": verdict.unsettled.node})
        ctx.enqueue_after(POD + key, max(_UNSETTLED_RETRY, verdict.unsettled.settle_after(verdict.now) + 0.1))
        return
    if verdict.step is _Step.OVERTAKEN:
        log.debug("an older pod was woken after this one's turn came; it decides first",
                  extra={"pod": key})
        ctx.enqueue(POD + key)  # handed out again once done, after the older pods
        return
    if verdict.step is _Step.HELD_BACK:
        # An earlier release to `pinned` may land yet: moving the claims now
        # could leave the pod on one node and its claims on another.
        assert read.doubt is not None
        log.info("a release whose answer was lost may still land; the set stays put until it cannot",
                 extra={"pod": key, "node": read.doubt[0]})
        ctx.enqueue_after(POD + key, read.doubt[1] + 0.1)
        return
    if isinstance(decision, Waiting):
        _apply_waiting(ctx, read, decision, verdict.states)
        if verdict.hold is not None:
            # Held GPUs free again when the hold ends, with no event to say so.
            ctx.enqueue_after(POD + key, max(0.0, (verdict.hold.until - verdict.now).total_seconds()) + 0.1)
        return
    _apply_placed(ctx, read, decision, verdict.resent)


def _apply_waiting(ctx: SyncContext, read: _SetRead, decision: Waiting,
                   states: Sequence[ClaimState | UnresolvedClaim]) -> None:
    pod, key = read.pod, read.key
    need = podplan.unbound_need(states, ctx.view.cluster().classes) \
        if decision.reason in (api.WaitReason.CAPACITY, api.WaitReason.UNSATISFIABLE,
                               api.WaitReason.PREEMPTING) else None
    if need:
        ctx.memories.capacity_needs[key] = need
    else:
        ctx.memories.capacity_needs.pop(key, None)
    if read.doubt is None and _let_go_of_deleted(ctx, pod, read.raw):
        # Its status changed: the Waiting conditions are written by the
        # sync its update brings (the delay is the backstop).
        ctx.enqueue_after(POD + key, _UNSETTLED_RETRY)
        return
    rejections = [r for s in states if isinstance(s, ClaimState) for r in s.rejected]
    _waiting(ctx, pod, decision, read.raw, rejections)


def _apply_placed(ctx: SyncContext, read: _SetRead, decision: Placed, resent: frozenset[str]) -> None:
    """Bind every claim of the set (in order), then release the pod in one
    patch; each write's fate reaches the view."""
    ctx.memories.capacity_needs.pop(read.key, None)
    _bind_set(ctx, read.pod, read.raw, decision, keep_unsent=False, resent=resent)
    _release(ctx, read.pod, decision)


def _bind_set(ctx: SyncContext, pod: Obj, raw: Mapping[str, Mapping[str, Any]], decision: Placed, *,
              keep_unsent: bool, resent: frozenset[str] = frozenset(), sent: set[str] | None = None) -> None:
    """The set's binds, one after another; `sent` (if given) gets the uid
    of each claim whose bind was sent (or found done already). A bind never
    sent (an earlier one failed) holds nothing, or, for an entry the
    decision put back on the wire (`resent`), settles again (one that was
    sent has its fate recorded) -- unless `keep_unsent`: a gang's decision
    stays in flight until its retry sends them, or the gang lets go of it
    (sync.gangs._let_go)."""
    sent = set() if sent is None else sent
    try:
        for action in decision.claims:
            sent.add(action.uid)
            _bind(ctx, pod, raw[action.claim], action.node, action.resource, action.uid)
    finally:
        if not keep_unsent:
            for uid in {a.uid for a in decision.new_gpus()} | resent:
                if uid not in sent:
                    ctx.wake(functools.partial(ctx.view.not_sent, uid))


def _release(ctx: SyncContext, pod: Obj, decision: Placed) -> None:
    """Release the pod pinned to the decision's node, in one patch; then
    remember it released, count it and tell it (a Placed event)."""
    meta = pod["metadata"]
    key, uid = keys.key_of(pod), str(meta.get("uid") or "")
    try:
        ctx.writer.patch_pod(meta["namespace"], meta["name"], podplan.release_patch(pod, decision.node))
    except Exception as e:
        if isinstance(e, ApiError) and e.status == 422:
            # A test of the patch failed: the pod changed since the cache
            # showed it (or an earlier sync released it already). Decided
            # again once the cache catches up, as after a 409.
            raise Conflict(f"pod {key} changed since it was read: {e}") from e
        if not surely_not_written(e):
            ctx.memories.release_in_doubt[uid] = (decision.node, ctx.now())
        raise
    ctx.memories.release_in_doubt.pop(uid, None)
    ctx.memories.released[uid] = True
    created_at = parse_time(meta.get("creationTimestamp"))
    if ctx.metrics is not None:
        ctx.metrics.placements.labels("placed", "").inc()
        if created_at is not None:
            ctx.metrics.observe_release(meta.get("namespace", ""),
                                        max(0.0, (ctx.now() - created_at).total_seconds()))
    ctx.memories.last_warning.pop(told_key(pod), None)
    ctx.memories.waiting_told.pop(told_key(pod), None)
    # Debug, not info: a line per pod was 3 % of the controller's CPU; the
    # Placed event and gpuclaimctl_placements_total tell the same.
    log.debug("released pod on node", extra={"pod": key, "node": decision.node})
    # The decision's message names the claims and the node ("GPUClaim ...
    # placed on node ...").
    ctx.writer.event(_pod_ref(pod), "Normal", "Placed", decision.message)


def _let_go_of_deleted(ctx: SyncContext, pod: Obj, raw: Mapping[str, Mapping[str, Any]]) -> bool:
    """Drop this waiting pod's reservations of claims being deleted; True
    if it dropped any.

    A deleted claim keeps its finalizer while something reserves it, and a
    set waits while one of its claims is being deleted: a claim the set had
    bound before the set failed to be released (a later bind refused, a
    crash) would keep both waiting for good. The pod is gated and no release
    of it may still land (the caller checks), so nothing runs with the
    claim: its reservation goes, the claim's sync then lets the finalizer
    go, and the set waits for the claim to be made again (a template's) or
    named anew (ClaimMissing)."""
    uid = pod["metadata"].get("uid", "")
    dropped = False
    for claim in raw.values():
        if not claim["metadata"].get("deletionTimestamp"):
            continue
        body = podplan.unreserved_claim(claim, uid)
        if body is None:
            continue
        ctx.writer.update_claim_status(body)
        ctx.enqueue(CLAIM + keys.key_of(claim))
        dropped = True
        log.info("a claim being deleted lets go of the waiting pod that reserved it",
                 extra={"pod": keys.key_of(pod), "claim": keys.key_of(claim)})
    return dropped


class _Landed(enum.Enum):
    RELEASED = "released"


def _release_in_doubt(ctx: SyncContext, pod: Obj) -> tuple[str, float] | _Landed | None:
    """The node an earlier release of `pod` whose answer was lost may still
    pin it to, and for how many seconds more (state.inflight.LOST_WRITE_WINDOW);
    RELEASED when a live read shows that it landed; None when no release is
    in doubt."""
    meta = pod["metadata"]
    uid = meta.get("uid", "")
    doubt = ctx.memories.release_in_doubt.get(uid)
    if doubt is None:
        return None
    node, lost_at = doubt
    live = ctx.writer.get_pod(meta["namespace"], meta["name"])
    if live is not None and live["metadata"].get("uid") == uid and not has_gate(live):
        ctx.memories.release_in_doubt.pop(uid, None)
        ctx.memories.released[uid] = True  # the cache will show it
        return _Landed.RELEASED
    left = may_still_land_for(lost_at, ctx.now())
    if live is None or live["metadata"].get("uid") != uid or left <= 0:
        ctx.memories.release_in_doubt.pop(uid, None)
        return None
    return node, left


def _create(ctx: SyncContext, pod: Obj, r: ToCreate) -> Mapping[str, Any]:
    body, entry = r.body, r.entry
    ns, claim_name = body["metadata"]["namespace"], body["metadata"]["name"]
    # Hashed only while some body is remembered refused (about 1 % of a placed
    # pod's CPU otherwise), and when one is refused.
    digest = _body_digest(body) if ctx.memories.refused_creates else ""
    refused = ctx.memories.refused_creates.get(digest) if digest else None
    if refused is not None:
        # The same body was refused as invalid a moment ago (the pod was
        # told): failing again without sending it (Memories.refused_creates).
        raise ApiError(*refused)
    made = ctx.memories.made_claims.get(f"{ns}/{claim_name}")
    if made is not None and _made_as(made, body) and \
            ctx.view.in_flight(str(made["metadata"].get("uid") or "")) is None:
        # Made by an earlier sync of this process, and the cache does not
        # show it yet (its create event woke this sync before the set's
        # other claims came): that sync's answer is the claim, at the
        # version it was made. A write based on it that meets a later one
        # is refused (409) and retried, as for any stale read. Not while a
        # placement of it is in flight: that one's writes and count are
        # another sync's, and a second writer of the claim could end the
        # count while the first write still lands (simulation seed
        # 1600634, two syncs of one pod at once); that sync decided from
        # the claim as made, and the informer brings its fate.
        return made
    try:
        created: Mapping[str, Any] = ctx.writer.create_claim(body)
    except AlreadyExists:
        # Made by an earlier sync whose result the cache does not show yet,
        # or by someone else: read it to know which.
        raise Conflict(f"claim {ns}/{claim_name} exists but is not in the cache yet")
    except ApiError as e:
        if e.status in (400, 422):  # the body itself: a quota (403) may let it in later
            ctx.memories.refused_creates[digest or _body_digest(body)] = (e.status, e.reason, e.message)
        if e.status in _REFUSED_BY_USER_INPUT:
            # A quota, or a template the API server finds invalid: retrying
            # (with backoff) is right, but only the user can fix it, so say why.
            source = (f"GPUClaimTemplate {entry.template!r}" if entry.source is EntrySource.TEMPLATE
                      else f"entry {entry.name!r}")
            _warn_waiting(ctx, pod, api.WaitReason.CLAIM_MISSING,
                          podplan.refused_create_message(claim_name, source, e.status, e.reason, e.message),
                          told=refused_create_told(e.status, claim_name))
        raise
    ctx.memories.made_claims[f"{ns}/{claim_name}"] = created
    if ctx.metrics is not None:
        ctx.metrics.claim_created(entry.source.value)
    log.debug("created claim", extra={"pod": keys.key_of(pod), "claim": claim_name,
                                      "source": entry.source.value})
    return created


def _body_digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _made_as(made: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the claim this process made is the one `body` asks for now:
    the same owner pod, class and count (the annotation may have been edited
    since)."""
    def what(c: Mapping[str, Any]) -> tuple[Any, ...]:
        spec, meta = c.get("spec") or {}, c.get("metadata") or {}
        return (spec.get("className"), spec.get("count"),
                tuple(r.get("uid") for r in meta.get("ownerReferences") or ()))
    return what(made) == what(body)


def _budgets(ctx: SyncContext, namespace: str) -> list[BudgetInfo] | None:
    """The namespace's GPUBudgets; None while they cannot be read."""
    if not ctx.budgets_synced():
        return None
    return [BudgetInfo.from_api(b) for b in ctx.budgets.list(namespace)]


def _with_inflight(pending: Any, state: ClaimState) -> ClaimState:
    """A claim this controller is placing counts as Bound there and reserved
    for the pod it was placed for (see decide): another pod naming it sees
    it in use, the same pod keeps it there."""
    if pending is None:
        return state
    return dataclasses.replace(state, phase=api.Phase.BOUND, node_name=pending.node,
                               reserved_for=(pending.pod,), resource_name=pending.resource)


def _with_set_rejections(ctx: SyncContext, set_key: tuple[str, str],
                         states: list[ClaimState | UnresolvedClaim],
                         now: datetime) -> list[ClaimState | UnresolvedClaim]:
    extra = [r for r in ctx.memories.set_rejections.get(set_key) or ()
             if r.until > now and not _node_changed_since(ctx, r)]
    if not extra:
        return states
    return [s if isinstance(s, UnresolvedClaim) else
            dataclasses.replace(s, rejected=tuple(s.rejected) + tuple(extra)) for s in states]


def _node_changed_since(ctx: SyncContext, r: Rejection) -> bool:
    changed = ctx.view.node_changed_at(r.node_name)
    return changed is not None and changed >= r.until - timedelta(seconds=ctx.settings.reject_for)


def _bind(ctx: SyncContext, pod: Obj, claim: Mapping[str, Any], node: str, resource: str,
          uid: str) -> None:
    """Finalizer, then Bound + reserved, each with the version it was read
    at. The view learns each write's fate."""
    if podplan.bound_as_planned(claim, pod, node, resource):
        return
    base = claim["metadata"].get("resourceVersion", "")
    try:
        finalized = podplan.with_finalizer(claim)
        if finalized is not None:
            claim = ctx.writer.update_claim(finalized)
            base = claim["metadata"].get("resourceVersion", "")
        written = ctx.writer.update_claim_status(podplan.bound_claim(claim, pod, node, resource))
    except Exception as e:
        ctx.memories.made_claims.pop(keys.key_of(claim))  # made again, or read from the cache
        if isinstance(e, NotFound):
            # A write by name found no claim: this uid is gone for good (one
            # with our finalizer would still be there) and holds nothing,
            # as after the informer's delete, which may never come (a claim
            # made and deleted while its watch was away).
            ctx.wake(lambda: ctx.view.claim_gone(uid))
        else:
            # Refused (nothing written) or its answer lost (it may have landed,
            # or land yet): either way the next version after `base` shows what
            # happened; a lost one is not settled by a read before the server
            # has given up on it (state.inflight.LOST_WRITE_WINDOW).
            lost_at = None if surely_not_written(e) else ctx.now()
            ctx.wake(lambda: ctx.view.write_failed(uid, base, lost_at=lost_at))
        ctx.enqueue(CLAIM + keys.key_of(claim))
        raise
    ctx.view.written(uid, written["metadata"].get("resourceVersion", ""))
    log.debug("bound claim", extra={"claim": keys.key_of(claim), "node": node,
                                    "pod": pod["metadata"]["name"]})


# -- waiting -------------------------------------------------------------------------------


def _waiting(ctx: SyncContext, pod: Obj, decision: Waiting, raw: Mapping[str, Mapping[str, Any]],
             rejections: Sequence[Rejection]) -> None:
    if ctx.metrics is not None:
        ctx.metrics.placements.labels("waiting", str(decision.reason)).inc()
    now = ctx.now()
    pod_uid = pod["metadata"].get("uid")
    for name, wait in decision.claims.items():
        claim = raw.get(name)
        body = None if claim is None else podplan.waiting_claim(claim, wait, now)
        if claim is None or body is None:
            continue
        if any(r.get("uid") != pod_uid for r in (claim.get("status") or {}).get("reservedFor") or ()):
            # Reserved by another pod, which it serves: its conditions are
            # that pod's (this one is told by its Warning event).
            continue
        if _older_gated_pod_names(ctx, claim, pod):
            # Named by an older gated pod too: the claim says why that one
            # waits, so it has one writer (this one is told by its Warning
            # event). Pods writing theirs in turn rewrote a shared claim
            # about once a second for as long as they waited (a real-plane
            # attack: about 1,100 writes per shared claim in 12 minutes).
            continue
        uid = claim["metadata"].get("uid", "")
        said = podplan.waiting_condition(claim) or {}
        wrote = ctx.memories.waiting_written.get(uid)
        if wrote is not None and wrote[0] == wait.reason and (
                (said.get("status"), said.get("reason")) == ("True", wait.reason)
                or parse_rv(claim["metadata"].get("resourceVersion")) < wrote[1]):
            # Only its figures changed, and they were written lately -- by
            # a write the cache may not show yet: the claim's own event
            # (the sync of a new pod's template claim) came before it.
            continue
        try:
            written = ctx.writer.update_claim_status(body)
        except NotFound:
            ctx.memories.made_claims.pop(keys.key_of(claim))
            continue
        except Conflict:
            # The cache lags a newer version (another pod's Waiting on a
            # shared claim, a write of ours it does not show yet). Nothing
            # was decided from it but what to say, and a claim's update
            # that changes only its Waiting syncs no pod: look again once
            # the cache has it, without failing the sync. Once only: a cache
            # still behind then (a watch down) fails the sync, to back off.
            if ctx.memories.waiting_conflicts.pop(uid) is not None:
                raise
            ctx.memories.waiting_conflicts[uid] = True
            log.debug("a claim changed since it was read; its Waiting is written again shortly",
                      extra={"pod": keys.key_of(pod), "claim": name})
            ctx.enqueue_after(POD + keys.key_of(pod), _WAITING_CONFLICT_RETRY)
            continue
        ctx.memories.waiting_conflicts.pop(uid)
        ctx.memories.waiting_written[uid] = (wait.reason, parse_rv(written["metadata"].get("resourceVersion")))
    _warn_waiting(ctx, pod, decision.reason, decision.message, counted=True)
    # A rejection that runs out can let the set fit: look again then. Those
    # kept in memory for template and inline sets count too: their claims
    # are new, and carry none.
    soonest = _next_rejection_end(rejections, now)
    if soonest is not None:
        ctx.enqueue_after(POD + keys.key_of(pod), soonest)


def _older_gated_pod_names(ctx: SyncContext, claim: Mapping[str, Any], pod: Obj) -> bool:
    """Whether a gated pod older than `pod` (creation, namespace, name) names `claim`."""
    meta = pod["metadata"]
    age = (meta.get("creationTimestamp") or "", meta.get("namespace", ""), meta.get("name", ""))
    for other in ctx.pods.by_index(indexes.PODS_BY_CLAIM, keys.key_of(claim)):
        m = other["metadata"]
        if m.get("uid") == meta.get("uid") or not has_gate(other) or m.get("deletionTimestamp") \
                or m.get("uid") in ctx.memories.released:
            continue
        if (m.get("creationTimestamp") or "", m.get("namespace", ""), m.get("name", "")) < age:
            return True
    return False


def _next_rejection_end(rejections: Iterable[Rejection], now: datetime) -> float | None:
    left = [(r.until - now).total_seconds() for r in rejections if r.until > now]
    return min(left) + 0.5 if left else None


def _warn_waiting(ctx: SyncContext, pod: Obj, reason: api.WaitReason, message: str,
                  counted: bool = False, told: str | None = None) -> None:
    """One Warning event each time the pod's waiting reason changes. An
    invalid annotation, which never gets as far as a decision, is counted
    in gpuclaimctl_placements_total here (`counted`: already done).
    `told` (default: the reason) is what is remembered as said: a cause
    under the same reason that needs telling apart (a template the API
    server refuses to make a claim of, after one that did not exist) has
    its own."""
    key = keys.key_of(pod)
    said = str(reason) if told is None else told
    ctx.memories.waiting_told[told_key(pod)] = (str(reason), message)
    if ctx.memories.last_warning.get(told_key(pod)) == said:
        return
    if reason is api.WaitReason.INVALID_CLAIMS and not counted and ctx.metrics is not None:
        ctx.metrics.placements.labels("waiting", str(reason)).inc()
    log.info("pod waits: %s", message, extra={"pod": key, "reason": str(reason)})
    if reason is api.WaitReason.PREEMPTING:
        # Told by the Normal Preempting event of each eviction round
        # (sync.preemption): nothing is wrong, and one event says it.
        ctx.memories.last_warning[told_key(pod)] = said
        return
    _tell_once(ctx, pod, said, str(reason), message)


def _tell_once(ctx: SyncContext, pod: Obj, said: str, reason: str, message: str) -> None:
    """A Warning event about `pod`, remembered as `said` (Memories.last_warning)
    only once the recorder took it: one dropped (its queue full under a
    flood of events) is told again by the pod's next sync, which comes
    within _TELL_AGAIN_AFTER (a pod that never changes would otherwise
    wait for a resync)."""
    if ctx.writer.event(_pod_ref(pod), "Warning", reason, message):
        ctx.memories.last_warning[told_key(pod)] = said
    else:
        ctx.enqueue_after(POD + keys.key_of(pod), _TELL_AGAIN_AFTER)


def _tell_not_gated(ctx: SyncContext, pod: Obj) -> None:
    """A Warning event, once: nothing places its claims, and kube-scheduler
    may run it without their GPUs (podclaims.names_claims_ungated)."""
    if ctx.memories.last_warning.get(told_key(pod)) == NOT_GATED_TOLD:
        return
    message = (f"the pod names GPU claims (annotation {api.CLAIMS_ANNOTATION}) but has no scheduling "
               f"gate {api.SCHEDULING_GATE}, so gpuclaimctl does not place them and kube-scheduler may "
               "run it without their GPUs: create it with the gate (the admission webhook adds it in "
               "the namespaces it serves)")
    log.info("pod names claims without the gate", extra={"pod": keys.key_of(pod)})
    _tell_once(ctx, pod, NOT_GATED_TOLD, NOT_GATED_TOLD, message)


def _pod_ref(pod: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


# -- refused pods ----------------------------------------------------------------------------


# A refusal younger than this may be kube-scheduler's cache lagging behind
# the node (one just added, or its allocatable just raised): the scheduler
# tries the pod again when the node reaches its cache and binds it there. Acting
# on such a refusal dropped a bare pod's reservations although the pod then
# ran on the node (its GPUs counted free: the live `simulate` test caught it
# in CI), and would delete a replica for nothing. Only a refusal that lasted
# this long is acted on.
REFUSAL_SETTLE = 5.0
# kube-scheduler tries a refused pod again when the node changes (added,
# taints, allocatable, readiness), but only once the pod's backoff ran out:
# up to podMaxBackoffSeconds, 10 s by default, after its last attempt. A
# refusal on a node that changed less than this ago (one just created, whose
# not-ready taint just went) may still be answered by a bind, so it is not
# acted on until the node has been still this long. (5 s alone let the
# live `simulate` test in CI see a bare pod's GPUs counted free while the
# scheduler, backing off, then bound it on its brand-new node.)
SCHEDULER_RETRY = 15.0


def _check_refused(ctx: SyncContext, pod: Obj) -> None:
    """A pod we pinned that the scheduler reports Unschedulable on a healthy
    node that still holds its whole set. One with a controller owner is
    deleted (something makes another) and the node rejected for the set; a
    bare pod is never deleted: it is told, and its reservations dropped."""
    meta = pod["metadata"]
    if (pod.get("spec") or {}).get("nodeName"):
        return
    cond = next((c for c in (pod.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "PodScheduled"), None)
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return
    node_name = (meta.get("annotations") or {}).get(api.PLACED_NODE_ANNOTATION, "")
    node = ctx.nodes.get(node_name)
    if node is None or (node.get("spec") or {}).get("unschedulable") or not node_ready(node):
        return
    taints = [Taint.from_api(t) for t in (node.get("spec") or {}).get("taints") or ()]
    tolerations = [Toleration.from_api(t) for t in (pod.get("spec") or {}).get("tolerations") or ()]
    if untolerated_node_state_taint(tolerations, taints) is not None:
        # The node's state explains the refusal (a not-ready taint that lags
        # behind Ready, say); the scheduler retries the pod when it clears.
        # Any other taint (added after the release) is a refusal like the
        # others: the set moves on, and the rejection ends early when the
        # node's taints change.
        return
    # The set it was released with: the claims that reserve it, whatever
    # its annotation says now (one edited after the release names other
    # claims, and reading it kept a refused bare pod's claims reserved for
    # good).
    ref = podplan.pod_ref(pod)
    held = [c for c in ctx.claims.by_index(indexes.CLAIMS_BY_RESERVED_POD, keys.key_of(pod))
            if ref in ((c.get("status") or {}).get("reservedFor") or ())]
    if not held:
        return
    for c in held:
        st = c.get("status") or {}
        if st.get("phase") != api.Phase.BOUND or st.get("nodeName") != node_name:
            return  # the set is not whole on that node: nothing to reject
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        entries = ()  # the rejection is still written on each claim
    # The refusal's age: from when this process first saw it, or from the
    # condition's lastTransitionTime if later. That time alone would not do:
    # it stays from SchedulingGated (False too) when only the reason changes,
    # so a pod that waited gated would be refused "long ago" at once.
    now = ctx.now()
    seen = ctx.memories.refusals_seen.update(meta["uid"], lambda first: first or now)
    since = parse_time(cond.get("lastTransitionTime"))
    left = REFUSAL_SETTLE - (now - (seen if since is None else max(seen, since))).total_seconds()
    still = _node_still_since(ctx, node)
    if still is not None:
        left = max(left, SCHEDULER_RETRY - (now - still).total_seconds())
    if left > 0:
        # Looked at again once the refusal has lasted (capped: the API
        # server's and the scheduler's clocks may run ahead of ours).
        ctx.enqueue_after(POD + keys.key_of(pod), min(left, SCHEDULER_RETRY))
        return
    message = cond.get("message") or "the scheduler refused the pod"
    if controller_ref(pod) is None:
        _release_bare_pod(ctx, pod, held, node_name, message)
        return
    if not ctx.writer.delete_pod(meta["namespace"], meta["name"], meta["uid"],
                                 meta["resourceVersion"]):
        return  # it changed or went: the next event decides again
    # Rejected only once the pod is surely gone: a rejection for a pod that
    # stays would move its set away from under it.
    until = ctx.now() + timedelta(seconds=ctx.settings.reject_for)
    rejection = Rejection(node_name, until, f"Unschedulable: {message}"[:1024])
    ctx.memories.set_rejections.update(podplan.set_key(pod, entries), lambda old: tuple(
        r for r in old or () if r.node_name != node_name) + (rejection,))
    for claim in held:
        _record_rejection(ctx, claim, rejection)
    if ctx.metrics is not None:
        ctx.metrics.refused_pods.inc()
    ctx.memories.deleted_pods[meta["uid"]] = True
    log.warning("deleted pod the scheduler refused; node rejected for its set",
                extra={"pod": keys.key_of(pod), "node": node_name, "reason": message})
    ctx.writer.event(_pod_ref(pod), "Warning", "NodeRejected",
                     f"kube-scheduler refused the pod on node {node_name} ({message}); deleted it "
                     f"so its GPU claims can be placed elsewhere; {node_name} is skipped for this "
                     f"set until {format_time(until)}")
    for claim in held:
        ctx.enqueue(CLAIM + keys.key_of(claim))


def _node_still_since(ctx: SyncContext, node: Mapping[str, Any]) -> datetime | None:
    """Since when the node has had its allocatable, taints and readiness:
    its last change this process saw, or its creation if later."""
    changed = ctx.view.node_changed_at(node["metadata"]["name"])
    created = parse_time((node.get("metadata") or {}).get("creationTimestamp"))
    times = [t for t in (changed, created) if t is not None]
    return max(times) if times else None


def _release_bare_pod(ctx: SyncContext, pod: Obj, held: Sequence[Mapping[str, Any]],
                      node_name: str, message: str) -> None:
    """Nothing would recreate a bare pod, so it is never deleted: its claims
    let go of it (their GPUs return to the pool) and the user is told."""
    for c in held:
        body = podplan.unreserved_claim(c, pod["metadata"]["uid"])
        if body is not None:
            ctx.writer.update_claim_status(body)
            ctx.enqueue(CLAIM + keys.key_of(c))
    key = keys.key_of(pod)
    if ctx.memories.last_warning.get(told_key(pod)) == "RefusedBare":
        return
    ctx.memories.last_warning[told_key(pod)] = "RefusedBare"
    log.warning("kube-scheduler refused a bare pod; its claims let go of it",
                extra={"pod": key, "node": node_name, "reason": message})
    ctx.writer.event(_pod_ref(pod), "Warning", "NodeRefused",
                     f"kube-scheduler refused the pod on node {node_name} ({message}); nothing "
                     "would recreate this pod, so it was not deleted: its GPU claims no longer "
                     "hold GPUs for it; delete it and create it again to be placed anew")


def _record_rejection(ctx: SyncContext, claim: Mapping[str, Any], rejection: Rejection) -> None:
    try:
        ctx.writer.update_claim_status(podplan.rejected_claim(claim, rejection))
    except (NotFound, Conflict) as e:
        # The in-memory rejection still holds; the claim is retried by its own sync.
        log.info("could not record rejection on claim: %s", e,
                 extra={"claim": claim["metadata"]["name"], "node": rejection.node_name})
