"""`claim:` sync (DESIGN.md §5): stale reservations, reclaim, template claims
of finished pods, finalizers, Lost claims, expired rejections.

Gathers facts from the caches into plain values, asks `claimplan.plan_claim`
what to do, and performs the writes. A pod the cache does not show is
confirmed with a live GET before its reservation is dropped: the cache may
simply not have seen it yet.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from gpuclaimctl.client.errors import Conflict, NotFound
from gpuclaimctl.decide.capacity import claim_usage, fits, free_on
from gpuclaimctl.decide.claimplan import NodeFacts, PodFacts, plan_claim
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.nodes import node_ready
from gpuclaimctl.model.resources import extended_resources, pod_request
from gpuclaimctl.state import indexes
from gpuclaimctl.model.podclaims import has_gate, template_owner_name, template_owner_uid
from gpuclaimctl.sync.context import AUDIT_INFLIGHT, CLAIM, SyncContext

log = logging.getLogger("gpuclaimctl.sync.claims")
Obj = dict[str, Any]


def sync_claim(ctx: SyncContext, key: str) -> None:
    ns, name = keys.split(key)
    claim = ctx.claims.get(ns, name)
    if claim is None:
        return
    meta = claim["metadata"]
    status = claim.get("status") or {}
    _settle_inflight(ctx, claim)

    pods: dict[str, PodFacts | None] = {}
    for ref in status.get("reservedFor") or ():
        pods[ref.get("uid", "")] = _pod_facts(ctx, ns, ref.get("name", ""), ref.get("uid", ""), name)

    owner: PodFacts | None | bool = False
    owner_uid = template_owner_uid(claim)
    if owner_uid:
        owner = _pod_facts(ctx, ns, template_owner_name(claim), owner_uid, name)

    resource = _class_resource(ctx, claim) or _pods_resource(ctx, claim)
    node = None
    if status.get("nodeName"):
        node_name = status["nodeName"]
        n = ctx.nodes.get(node_name)
        ready = node_ready(n)
        # A node that went while we were down has no delete event: its grace
        # period starts the first time a sync finds it missing or NotReady.
        since = None if ready else ctx.view.unhealthy_since(node_name)
        node = NodeFacts(exists=n is not None, ready=ready, unhealthy_since=since,
                         room=status.get("phase") == api.Phase.LOST and _room_for(ctx, claim, resource))

    waited_for = any(has_gate(p) for p in ctx.pods.by_index(indexes.PODS_BY_CLAIM, key))
    plan = plan_claim(claim, pods, owner, node, ctx.now(),
                      node_lost_grace=ctx.settings.node_lost_grace,
                      reject_for=ctx.settings.reject_for, nodes_changed=ctx.view.nodes_changed(),
                      waited_for=waited_for, class_resource=resource)

    current = claim
    if plan.status_changed:
        # Only the status is new; the rest is read, never edited, by the write.
        updated = {**claim, "status": plan.status}
        try:
            current = ctx.writer.update_claim_status(updated)
        except NotFound:
            # Deleted since the cache showed it (our own delete of a template
            # claim, say): its delete event comes, and with it nothing to do.
            log.debug("claim gone before its status write", extra={"claim": key})
            return
        except Conflict:
            # The cache lags a newer version. Its event syncs this claim
            # again (claim_updated: every new version does), from what the
            # newer version says: failing here would only count an error and
            # back off a retry that the event makes anyway (under churn,
            # most of the claim syncs' errors).
            log.debug("claim changed since it was read; its next version syncs it again",
                      extra={"claim": key})
            return
        for ref, why in plan.removed:
            if ctx.metrics is not None:
                ctx.metrics.stale_reservations_removed.labels(str(why)).inc()
            log.info("removed stale reservation (%s)", why,
                     extra={"claim": key, "pod": ref.get("name"), "reason": str(why)})
        if plan.lost:
            if ctx.metrics is not None:
                ctx.metrics.claims_lost.inc()
            log.warning("claim lost its node", extra={"claim": key, "node": status.get("nodeName")})
            ctx.writer.event(_claim_ref(claim), "Warning", "Lost",
                             f"node {status.get('nodeName')} has been gone or NotReady for more "
                             f"than {ctx.settings.node_lost_grace:.0f}s; the claim will be placed "
                             "again when its pod next needs it")
        if plan.found:
            pod_names = ", ".join(str(r.get("name")) for r in plan.status.get("reservedFor") or ())
            log.info("lost claim found again on its node", extra={"claim": key, "node": status.get("nodeName")})
            ctx.writer.event(_claim_ref(claim), "Normal", "Found",
                             f"node {status.get('nodeName')} is back and Ready, and pod {pod_names} "
                             "is still on it: the claim is Bound again")
    if plan.delete:
        ctx.writer.delete_claim(ns, name, meta["uid"])
        log.info("deleted template claim of a finished or vanished pod", extra={"claim": key})
    if plan.remove_finalizer:
        stripped = copy.deepcopy(current)
        stripped["metadata"]["finalizers"] = [
            f for f in stripped["metadata"].get("finalizers") or () if f != api.CLAIM_FINALIZER]
        try:
            ctx.writer.update_claim(stripped)
        except (NotFound, Conflict):
            pass  # gone; or a newer version, whose event syncs it again
    if plan.requeue_after is not None:
        ctx.enqueue_after(CLAIM + key, plan.requeue_after + 0.1)


def _settle_inflight(ctx: SyncContext, claim: Obj) -> None:
    """A bind whose answer was lost, that nothing has followed since: one
    live read tells whether it landed, once it can land no more (see
    state.inflight)."""
    uid = claim["metadata"].get("uid", "")
    entry = next((e for e in ctx.view.unresolved() if e.claim_uid == uid), None)
    if entry is None:
        return
    meta = claim["metadata"]
    wait = entry.settle_after(ctx.now())
    if wait > 0:
        # The server may still be working on it: a read now could show the
        # base version and the write land after it.
        ctx.enqueue_after(CLAIM + keys.key_of(claim), wait + 0.1)
        return
    live = ctx.writer.get_claim(meta["namespace"], meta["name"])
    if live is None or live["metadata"].get("uid") != uid:
        return  # gone: the informer's delete ends the entry
    rv = live["metadata"].get("resourceVersion", "")
    ctx.wake(lambda: ctx.view.settled(uid, rv))


# How often in-flight entries are audited, and how old an entry whose claim
# the cache does not hold must be to cost a live read: the informer shows a
# claim in well under a second, and only a relist that skipped both its
# create and its delete leaves an entry with no event to end it.
AUDIT_PERIOD = 60.0
AUDIT_MIN_AGE = 30.0


def audit_inflight(ctx: SyncContext) -> None:
    """End the in-flight entries of claims that are gone while the informer
    never showed them, then come back in AUDIT_PERIOD.

    A new leader counts the claims a consistent list shows bound before its
    cache does (Controller.catch_up), and a pod sync counts the template
    claim it just made; both entries end when the informer shows the claim,
    or its delete. A claim created and deleted while the watch was away is
    in neither the cache nor the relist, and nothing would end its entry:
    its GPUs would stay counted, stranded, until the process restarts. A
    live read by name is the evidence: not found, or another uid under the
    name, is the informer's delete (that uid can never come back; a claim
    is deleted only once nothing reserves it). A claim still there keeps its
    entry, as the informer will show it."""
    try:
        old = ctx.view.unseen(ctx.now() - timedelta(seconds=AUDIT_MIN_AGE), _cached_uid(ctx))
        for entry in old:
            live = ctx.writer.get_claim(entry.namespace, entry.name)
            if live is not None and live["metadata"].get("uid") == entry.claim_uid:
                continue
            log.info("a claim counted in flight is gone though its informer never showed it; "
                     "its GPUs are free", extra={"claim": keys.namespaced(entry.namespace, entry.name),
                                                 "node": entry.node})
            ctx.wake(functools.partial(ctx.view.claim_gone, entry.claim_uid))
    finally:
        ctx.enqueue_after(AUDIT_INFLIGHT, AUDIT_PERIOD)


def _cached_uid(ctx: SyncContext) -> Callable[[str, str], str | None]:
    def uid(namespace: str, name: str) -> str | None:
        claim = ctx.claims.get(namespace, name)
        return None if claim is None else claim["metadata"].get("uid")
    return uid


def _room_for(ctx: SyncContext, claim: Obj, class_resource: str | None) -> bool:
    """Whether the allocatable of the claim's node covers all that is
    counted on it, what the claim holds included (a Lost claim still
    reserved is counted there, decide.capacity.claim_usage).
    `class_resource`: its class's resourceName (None: the class is gone)."""
    cls = (claim.get("spec") or {}).get("className", "")
    held = claim_usage(claim, {cls: class_resource} if class_resource else {})
    if held is None:
        return False
    node_name, resource, _count = held
    info = ctx.view.cluster().nodes.get(node_name)
    # What is counted there, this claim's GPUs included, fits in it: nothing
    # more is needed.
    return info is not None and fits({resource: 0}, free_on(info.allocatable, ctx.view.used(), node_name))


def _class_resource(ctx: SyncContext, claim: Obj) -> str | None:
    cls = ctx.classes.get((claim.get("spec") or {}).get("className", ""))
    if cls is None:
        return None
    return str((cls.get("spec") or {}).get("resourceName") or api.DEFAULT_RESOURCE_NAME)


def _pods_resource(ctx: SyncContext, claim: Obj) -> str | None:
    """The one extended resource the cached pods reserving the claim
    request, if there is exactly one: the evidence of what a claim bound
    without `status.resourceName` holds when its class is gone (the
    device plugin counts the pod's request; its claims hold it)."""
    status = claim.get("status") or {}
    ns = claim["metadata"].get("namespace", "")
    found: set[str] = set()
    for ref in status.get("reservedFor") or ():
        pod = ctx.pods.get(ns, ref.get("name", ""))
        if pod is not None and pod["metadata"].get("uid") == ref.get("uid"):
            found |= {r for r in extended_resources(pod) if pod_request(pod, r) > 0}
    return next(iter(found)) if len(found) == 1 else None


def _pod_facts(ctx: SyncContext, ns: str, name: str, uid: str, claim_name: str) -> PodFacts | None:
    """What is known of the pod a reservation names; None once it is surely gone."""
    if uid in ctx.memories.deleted_pods:
        return None
    pod = ctx.pods.get(ns, name)
    if pod is not None and pod["metadata"].get("uid") == uid:
        return PodFacts.from_api(pod, claim_name)
    # Not in the cache, or another pod of that name there: ask the API
    # server, since the cache may lag behind a pod that does exist.
    live = ctx.writer.get_pod(ns, name)
    if live is None:
        ctx.memories.deleted_pods[uid] = True
        return None
    return PodFacts.from_api(live, claim_name)


def _claim_ref(claim: Obj) -> Obj:
    return {"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": claim["metadata"]}
