"""`claim:` sync (DESIGN.md §5): stale reservations, reclaim, template claims
of finished pods, finalizers, Lost claims, expired rejections.

Gathers facts from the caches into plain values, asks `claimplan.plan_claim`
what to do, and performs the writes. A pod the cache does not show is
confirmed with a live GET before its reservation is dropped: the cache may
simply not have seen it yet.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

from gpuclaimctl.model import api
from gpuclaimctl.state import indexes
from gpuclaimctl.decide.claimplan import (
    NodeFacts,
    PodFacts,
    owner_name,
    plan_claim,
    template_owner_uid,
)
from gpuclaimctl.state.indexes import has_gate, node_ready
from gpuclaimctl.client.writer import NotFound

if TYPE_CHECKING:
    from gpuclaimctl.controller import Controller

log = logging.getLogger("gpuclaimctl.sync.claims")
Obj = dict[str, Any]


def sync_claim(ctl: Controller, key: str) -> None:
    ns, name = key.split("/", 1)
    claim = ctl.claims.get(ns, name)
    if claim is None:
        return
    meta = claim["metadata"]
    status = claim.get("status") or {}

    pods: dict[str, PodFacts | None] = {}
    for ref in status.get("reservedFor") or ():
        pods[ref.get("uid", "")] = _pod_facts(ctl, ns, ref.get("name", ""), ref.get("uid", ""))

    owner: PodFacts | None | bool = False
    owner_uid = template_owner_uid(claim)
    if owner_uid:
        owner = _pod_facts(ctl, ns, owner_name(claim), owner_uid)

    node = None
    if status.get("nodeName"):
        node_name = status["nodeName"]
        n = ctl.nodes.get(node_name)
        ready = node_ready(n)
        # A node that went while we were down has no delete event: its grace
        # period starts the first time a sync finds it missing or NotReady.
        since = None if ready else ctl.node_unhealthy_since.setdefault(node_name, ctl.now())
        node = NodeFacts(exists=n is not None, ready=ready, unhealthy_since=since)

    waited_for = any(has_gate(p) for p in ctl.pods.by_index(indexes.PODS_BY_CLAIM, key))
    plan = plan_claim(claim, pods, owner, node, ctl.now(),
                      node_lost_grace=ctl.options.node_lost_grace,
                      reject_for=ctl.options.reject_for, nodes_changed=ctl.node_changed_at,
                      waited_for=waited_for)

    current = claim
    if plan.status_changed:
        updated = copy.deepcopy(claim)
        updated["status"] = plan.status
        current = ctl.writer.update_claim_status(updated)
        for ref, why in plan.removed:
            if ctl.metrics is not None:
                ctl.metrics.stale_reservations_removed.labels(str(why)).inc()
            log.info("removed stale reservation (%s)", why,
                     extra={"claim": key, "pod": ref.get("name"), "reason": str(why)})
        if plan.lost:
            if ctl.metrics is not None:
                ctl.metrics.claims_lost.inc()
            log.warning("claim lost its node", extra={"claim": key, "node": status.get("nodeName")})
            ctl.writer.event(_claim_ref(claim), "Warning", "Lost",
                             f"node {status.get('nodeName')} has been gone or NotReady for more "
                             f"than {ctl.options.node_lost_grace:.0f}s; the claim will be placed "
                             "again when its pod next needs it")
    if plan.delete:
        ctl.writer.delete_claim(ns, name, meta["uid"])
        log.info("deleted template claim of a finished or vanished pod", extra={"claim": key})
    if plan.remove_finalizer:
        stripped = copy.deepcopy(current)
        stripped["metadata"]["finalizers"] = [
            f for f in stripped["metadata"].get("finalizers") or () if f != api.CLAIM_FINALIZER]
        try:
            ctl.writer.update_claim(stripped)
        except NotFound:
            pass
    if plan.requeue_after is not None:
        ctl.queue.add_after(f"claim:{key}", plan.requeue_after + 0.1)


def _pod_facts(ctl: Controller, ns: str, name: str, uid: str) -> PodFacts | None:
    """What is known of the pod a reservation names; None once it is surely gone."""
    if uid in ctl.deleted_pods:
        return None
    pod = ctl.pods.get(ns, name)
    if pod is not None and pod["metadata"].get("uid") == uid:
        return PodFacts.from_api(pod)
    # Not in the cache, or another pod of that name there: ask the API
    # server, since the cache may lag behind a pod that does exist.
    live = ctl.writer.get_pod(ns, name)
    if live is None:
        ctl.deleted_pods[uid] = True
        return None
    return PodFacts.from_api(live)


def _claim_ref(claim: Obj) -> Obj:
    return {"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": claim["metadata"]}

