"""Preemption's writes (DESIGN.md §4d, I6): evict the victims a plan chose,
through the Eviction API, and tell everyone.

The plan (decide.preempt) was made and its GPUs held for the preemptor (a
view.Nomination) under the view's lock; what is left is the API:

1. every victim's PodDisruptionBudgets are read live, and the plan is
   given up on this node if evicting all its victims would take any budget
   past what it allows: a node is never half-evicted by our own count;
2. each victim is evicted through the Eviction API (which checks the same
   budgets again, and may still refuse: then the rest are not evicted, and
   the node is given up);
3. an evicted victim gets condition DisruptionTarget (after the eviction,
   which writes its own) naming the preemptor, and a Warning event; the
   preemptor a Normal event; `gpuclaimctl_preemptions_total` and
   `gpuclaimctl_preempted_pods_total` count them.

A node given up is remembered for the preemptor (Memories.preemption_refused)
for REFUSED_FOR seconds, its nomination ends, and it decides again at once:
another node, or waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuclaimctl.client.errors import ApiError
from gpuclaimctl.decide.preempt import Preemption, Victim
from gpuclaimctl.decide.victims import WAITS_FOR_ROOM
from gpuclaimctl.decide.victims import preempting as preempting
from gpuclaimctl.model import api, keys
from gpuclaimctl.state import indexes
from gpuclaimctl.model.api import WaitReason
from gpuclaimctl.model.nodeaffinity import selector_matches
from gpuclaimctl.model.snapshot import NodeInfo, format_time
from gpuclaimctl.state.view import Change, Decider, Nomination
from gpuclaimctl.sync.context import POD, SyncContext

log = logging.getLogger("gpuclaimctl.sync.preemption")

# Seconds a node where an eviction was refused is given up by a preemptor.
REFUSED_FOR = 60.0
# Seconds before a preemptor whose victims the server shows otherwise than
# the caches decides again.
STALE_RETRY = 1.0
# How long GPUs stay held for a preemptor after its last decision, and how
# often it decides again while its victims terminate (it renews the hold).
NOMINATION_FOR = 60.0
RENEW_EVERY = 10.0
# A victim still terminating this long past its deletionTimestamp is
# stuck: it frees nothing one can count on, and is not waited for.
STUCK_AFTER = 60.0

DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTED_REASON = "PreemptionByGPUClaimController"


def plan_for(ctx: SyncContext, d: Decider, reason: WaitReason, preempts: bool, now: datetime) -> bool:
    """Whether a set (or gang) waiting for `reason` looks for a preemption:
    it waits for room (or for its namespace's budget: its own victims may
    give some back), it may preempt, preemption is on, and some node has
    pods this controller placed."""
    return (reason in WAITS_FOR_ROOM and preempts and ctx.settings.preemption
            and bool(d.units_on(now, STUCK_AFTER, ctx.memories.evicted.keys())))


def nomination(holder: str, who: str, priority: int, plan: Preemption, now: datetime) -> Nomination:
    return Nomination(holder, who, priority, plan.usage,
                      tuple(v.key for v in plan.victims + plan.waiting_for),
                      now + timedelta(seconds=NOMINATION_FOR))


def skip_nodes(ctx: SyncContext, holder: str, now: datetime) -> frozenset[str]:
    refused = ctx.memories.preemption_refused.get(holder) or {}
    return frozenset(n for n, until in refused.items() if until > now)


def evict(ctx: SyncContext, holder: str, preemptor: Mapping[str, Any], priority: int,
          plan: Preemption, preemptors: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Evict the plan's victims; False if the node was given up.
    `preemptors`: the pods it is for, as the cache shows them (a gang's
    members; by default `preemptor` alone)."""
    pkey = keys.key_of(preemptor)
    stale = _gone_or_replaced(ctx, preemptors or (preemptor,)) or _not_as_counted(ctx, plan)
    if stale is not None:
        # The caches lag behind the server (a standby just taking over, a
        # claim let go a moment ago): evict nothing on a count the server no
        # longer holds; decide again once they catch up.
        freed = ctx.view.drop_nomination(holder)
        ctx.wake(lambda: Change(freed_on=freed))
        log.info("preemption put off: %s", stale, extra={"pod": pkey, "node": plan.node})
        ctx.enqueue_after(POD + pkey, STALE_RETRY)
        return False
    refusal = _budgets_refuse(ctx, plan.victims)
    if refusal is None:
        for v in plan.victims:
            got = ctx.writer.evict_pod(v.namespace, v.name, v.uid)
            if got == "refused":
                refusal = f"the Eviction API refused to evict pod {v.key} (a PodDisruptionBudget)"
                break
            if got == "evicted":
                ctx.memories.evicted[v.uid] = True
                _tell_victim(ctx, v, pkey, priority, plan)
    if refusal is not None:
        now = ctx.now()
        until = now + timedelta(seconds=REFUSED_FOR)
        # Every node the plan takes GPUs on or takes victims from is given
        # up. A gang's plan spans several nodes (`plan.node` names them all,
        # "n1, n2": giving up that name gave up nothing, and the same plan
        # was refused again at once, for ever: simulation seed 5037). And a
        # victim taken for its namespace's budget runs on another node than
        # the one the set goes to: the plan is looked for from the victims'
        # nodes, which must be given up too (seed 10189).
        given_up = _nodes_of(plan) | {v.node for v in plan.victims + plan.waiting_for}
        ctx.memories.preemption_refused.update(
            holder, lambda old: {**{n: t for n, t in (old or {}).items() if t > now},
                                 **dict.fromkeys(given_up, until)})
        freed = ctx.view.drop_nomination(holder)
        ctx.wake(lambda: Change(freed_on=freed))
        ctx.writer.event(_ref(preemptor), "Warning", "PreemptionRefused",
                         f"preempting on node {plan.node} given up: {refusal}")
        log.info("preemption given up on a node: %s", refusal, extra={"pod": pkey, "node": plan.node})
        ctx.enqueue(POD + pkey)
        return False
    if plan.victims:
        if ctx.metrics is not None:
            ctx.metrics.preempted(str(preemptor["metadata"].get("namespace") or ""), priority,
                                  len(plan.victims))
        ctx.writer.event(_ref(preemptor), "Normal", "Preempting", plan.message)
        log.info("preempting: %s", plan.message, extra={"pod": pkey, "node": plan.node})
    return True


def _nodes_of(plan: Preemption) -> frozenset[str]:
    """The nodes a plan takes GPUs on (a gang's: every member's). Not
    `plan.node`: for a gang it names them all in one string."""
    return frozenset(n for per in plan.usage.values() for n in per)


def _live_pod(ctx: SyncContext, namespace: str, name: str, uid: object) -> Mapping[str, Any] | None:
    """The pod as the server has it, if it is still the one with `uid` and
    not terminating; else None."""
    live = ctx.writer.get_pod(namespace, name)
    if live is None or live["metadata"].get("uid") != uid or live["metadata"].get("deletionTimestamp"):
        return None
    return live


def _gone_or_replaced(ctx: SyncContext, pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the server does not show a pod the plan is for as the cache
    does (gone, replaced under its name, terminating), by live reads, or
    None. A pod deleted and made again with a lower priority, the cache
    still showing the old one, was preempting for a pod that no longer
    existed (simulation seed 15029)."""
    for pod in pods:
        meta = pod["metadata"]
        if _live_pod(ctx, str(meta.get("namespace") or ""), str(meta.get("name") or ""), meta.get("uid")) is None:
            return f"pod {keys.key_of(pod)}, which preempts, is gone, replaced or terminating on the server"
    return None


def _not_as_counted(ctx: SyncContext, plan: Preemption) -> str | None:
    """Why the server does not show the plan's nodes or victims as it
    counted them, by live reads, or None: a node the preemptor is to take
    GPUs on gone, or differing from the cache in what placement reads of it
    (a standby whose node cache lagged planned on GPUs the node no longer
    offers: simulation seed 5098); a victim gone, replaced, finished or
    terminating (it frees its GPUs without an eviction); its claims on its
    node holding fewer GPUs than it was to free. Preemption is rare: a read
    per node, victim and claim is cheap beside evicting on a stale cache."""
    for node in sorted(_nodes_of(plan)):
        differs = _node_differs(ctx, node)
        if differs is not None:
            return differs
    for v in plan.victims:
        live = _live_pod(ctx, v.namespace, v.name, v.uid)
        if live is None:
            return f"pod {v.key} is gone, replaced or terminating on the server"
        if (live.get("status") or {}).get("phase") in api.FINISHED_PHASES:
            return f"pod {v.key} has finished on the server"
        held: dict[str, int] = {}
        for cached in ctx.claims.by_index(indexes.CLAIMS_BY_RESERVED_POD, v.key):
            claim = ctx.writer.get_claim(v.namespace, cached["metadata"]["name"])
            status = (claim or {}).get("status") or {}
            if claim is None or status.get("phase") != "Bound" or status.get("nodeName") != v.node or \
                    not any(r.get("uid") == v.uid for r in status.get("reservedFor") or ()):
                continue
            resource = str(status.get("resourceName") or "")
            held[resource] = held.get(resource, 0) + int((claim.get("spec") or {}).get("count") or 0)
        short = {r: n for r, n in v.frees.items() if held.get(r, 0) < n}
        if short:
            return (f"the claims of pod {v.key} hold fewer GPUs on node {v.node} on the server than the "
                    f"caches show ({', '.join(f'{n} {r}' for r, n in sorted(short.items()))} counted)")
    return None


def _node_differs(ctx: SyncContext, name: str) -> str | None:
    """Why the server shows node `name` otherwise than the cache does, in
    what placement reads of it (NodeInfo: allocatable, cordon, readiness,
    taints, labels), or None. What DRA offers there (ResourceSlices) is not
    read again."""
    live = ctx.writer.get_node(name)
    if live is None:
        return f"node {name} is gone on the server"
    cached = ctx.nodes.get(name)
    was, now = NodeInfo.from_api(cached or {}), NodeInfo.from_api(live)
    changed = [f for f in ("allocatable", "unschedulable", "ready", "taints", "labels")
               if getattr(was, f) != getattr(now, f)]
    if changed:
        return f"node {name} on the server differs from the cache ({', '.join(changed)})"
    return None


def _budgets_refuse(ctx: SyncContext, victims: Sequence[Victim]) -> str | None:
    """Why evicting all `victims` would break a PodDisruptionBudget (each
    budget's disruptionsAllowed against the victims it selects), or None."""
    by_ns: dict[str, list[Victim]] = {}
    for v in victims:
        by_ns.setdefault(v.namespace, []).append(v)
    for ns, vs in sorted(by_ns.items()):
        try:
            budgets = ctx.writer.list_disruption_budgets(ns)
        except ApiError as e:
            return f"the PodDisruptionBudgets of namespace {ns} cannot be read ({e.status})"
        if not budgets:
            continue
        labels = {}
        for v in vs:
            live = ctx.writer.get_pod(v.namespace, v.name)
            if live is not None and live["metadata"].get("uid") == v.uid:
                labels[v.key] = live["metadata"].get("labels") or {}
        for pdb in budgets:
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:
                continue
            hit = [k for k, lb in labels.items() if selector_matches(selector, lb)]
            allowed = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
            if len(hit) > allowed:
                return (f"PodDisruptionBudget {ns}/{pdb['metadata']['name']} allows {allowed} "
                        f"disruption{'s' if allowed != 1 else ''} now; {len(hit)} of its pods would go "
                        f"({', '.join(sorted(hit))})")
    return None


def _tell_victim(ctx: SyncContext, v: Victim, preemptor: str, priority: int, plan: Preemption) -> None:
    message = (f"gpuclaimctl: preempting to accommodate a higher priority pod {preemptor} "
               f"(priority {priority}) on node {plan.node}")
    condition = {"type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTED_REASON,
                 "message": message, "lastTransitionTime": format_time(ctx.now())}
    try:
        # After the eviction, whose own DisruptionTarget it replaces.
        ctx.writer.patch_pod_status(v.namespace, v.name, {"status": {"conditions": [condition]}})
    except ApiError as e:
        if e.status != 404:
            log.info("could not mark a preempted pod: %s", e, extra={"pod": v.key})
    ctx.writer.event({"kind": "Pod", "metadata": {"namespace": v.namespace, "name": v.name, "uid": v.uid}},
                     "Warning", "Preempted", message)


def _ref(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid")}}
