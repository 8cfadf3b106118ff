"""`pod:` sync (DESIGN.md §5): place a gated pod's set and release the pod,
or delete a pinned pod the scheduler refused and reject that node.

Read, decide, write: the caches give a snapshot, `placement.decide` chooses,
and the writes follow in an order that makes every step idempotent:

1. create missing template claims (deterministic names: found again by name);
2. add our finalizer, then bind and reserve each claim (status, with its
   resourceVersion);
3. release the pod in ONE update with the resourceVersion it was read at.

A crash between any two writes leaves claims Bound and reserved for this
pod; the next sync sees them, decides Keep, and goes on from step 3.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpuclaimctl.model import api
from gpuclaimctl.client import kube
from gpuclaimctl.state.indexes import has_gate, node_ready
from gpuclaimctl.state.inflight import InFlightPlacements
from gpuclaimctl.decide.capacity import combine
from gpuclaimctl.model.nodeaffinity import Taint, Toleration, pin_to_node, untolerated_node_state_taint
from gpuclaimctl.decide.placement import Action, Placed, Waiting, decide
from gpuclaimctl.model.podclaims import (
    ClaimEntry,
    EntrySource,
    PodClaimsError,
    is_template_claim_of,
    pod_claims,
    template_claim,
)
from gpuclaimctl.model.snapshot import ClaimState, PodInfo, Rejection, UnresolvedClaim, parse_time
from gpuclaimctl.client.writer import AlreadyExists, Conflict, NotFound

if TYPE_CHECKING:
    from gpuclaimctl.controller import Controller

log = logging.getLogger("gpuclaimctl.sync.pods")
Obj = dict[str, Any]


def sync_pod(ctl: Controller, key: str) -> None:
    ns, name = key.split("/", 1)
    pod = ctl.pods.get(ns, name)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return
    if has_gate(pod):
        _place(ctl, pod)
    elif api.PLACED_NODE_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        _check_refused(ctl, pod)


# -- placing a gated pod ----------------------------------------------------------------


def _place(ctl: Controller, pod: Obj) -> None:
    meta = pod["metadata"]
    try:
        entries = pod_claims(pod)
    except PodClaimsError as e:
        _tell(ctl, pod, api.WaitReason.INVALID_CLAIMS, f"the {api.CLAIMS_ANNOTATION} "
              f"annotation is invalid: {e}", claims=())
        return

    info = PodInfo.from_api(pod)
    key, age = f"{info.namespace}/{info.name}", (info.created, info.namespace, info.name)
    # Oldest first where pods compete: see turnstile.
    with ctl.turnstile.entered(key, age):
        states: list[ClaimState | UnresolvedClaim] = []
        raw: dict[str, Obj] = {}
        for entry in entries:
            resolved = _resolve(ctl, pod, entry)
            if isinstance(resolved, UnresolvedClaim):
                states.append(resolved)
            else:
                raw[resolved["metadata"]["name"]] = resolved
                states.append(ClaimState.from_api(resolved))

        set_key = _set_key(pod, entries)
        ctl.turnstile.wait_turn(key, age)
        now = ctl.now()
        with ctl.placement_lock:
            states = [_with_inflight(ctl, s) for s in states]
            states = _with_set_rejections(ctl, set_key, states, now)
            used = combine(ctl.usage.totals, ctl.inflight.usage())
            decision = decide(info, states, ctl.cluster(), used, now, ctl.options.strategy)
            if isinstance(decision, Placed):
                for a in decision.new_gpus():
                    ctl.inflight.add(a.uid, a.node, a.resource, a.count)

    if isinstance(decision, Waiting):
        rejections = [r for s in states if isinstance(s, ClaimState) for r in s.rejected]
        _waiting(ctl, pod, decision, raw, rejections)
        return
    written: set[str] = set()
    writing = ""
    try:
        for action in decision.claims:
            writing = action.uid
            _bind(ctl, pod, raw[action.claim], action.node, action.action)
            written.add(action.uid)
        writing = ""
        _release(ctl, pod, decision.node)
    except Exception as e:
        with ctl.placement_lock:
            free_unwritten(ctl.inflight, decision, written, writing, e)
        raise
    created = parse_time(meta.get("creationTimestamp"))
    if ctl.metrics is not None:
        ctl.metrics.placements.labels("placed", "").inc()
        if created is not None:
            ctl.metrics.release_seconds.observe(max(0.0, (ctl.now() - created).total_seconds()))
    ctl.told.pop(f"{meta['namespace']}/{meta['name']}", None)
    log.info("released pod on node", extra={"pod": f"{meta['namespace']}/{meta['name']}",
                                            "node": decision.node})
    ctl.writer.event(_pod_ref(pod), "Normal", "Placed",
                     f"GPU claims placed on node {decision.node}: {decision.message}")


def free_unwritten(inflight: InFlightPlacements, decision: Placed, written: set[str],
                   writing: str, error: Exception) -> None:
    """After a failed placement, free the in-flight GPUs of the claims whose
    bind surely did not happen. A written bind holds its GPUs: its entry
    stays until the informer shows it Bound. So does the bind that failed
    when the failure may hide a write that landed (a timeout, a dropped
    connection, a 5xx): counting GPUs that turn out free for a while (the
    entry's TTL at most) is safe, not counting GPUs in use is an overcommit."""
    for a in decision.new_gpus():
        if a.uid in written or (a.uid == writing and not surely_not_written(error)):
            continue
        inflight.forget(a.uid)


def surely_not_written(error: Exception) -> bool:
    """The API server answered and refused (a 4xx): nothing was written."""
    if isinstance(error, (Conflict, NotFound, AlreadyExists)):
        return True
    return isinstance(error, kube.ApiError) and 400 <= error.status < 500


def _resolve(ctl: Controller, pod: Obj, entry: ClaimEntry) -> Obj | UnresolvedClaim:
    """The claim an entry names, creating a template or inline claim if missing."""
    meta = pod["metadata"]
    ns, pod_name = meta["namespace"], meta["name"]
    claim_name = entry.claim_name(pod_name)
    claim = ctl.claims.get(ns, claim_name)
    if entry.source is EntrySource.CLAIM:
        if claim is None:
            return UnresolvedClaim(claim_name, api.WaitReason.CLAIM_MISSING,
                                   f"GPUClaim {claim_name!r} does not exist in {ns}")
        return claim
    if claim is not None:
        if is_template_claim_of(claim, meta["uid"]):
            return claim
        if _older_pods_claim(claim, pod_name):
            # A pod recreated under the same name (a StatefulSet's): its
            # predecessor's claim goes first; the claim sync deletes it.
            ctl.enqueue_claim(f"{ns}/{claim_name}")
            return UnresolvedClaim(claim_name, api.WaitReason.CLAIM_IN_USE,
                                   f"GPUClaim {claim_name!r} still belongs to an earlier pod named "
                                   f"{pod_name!r}; waiting for it to be deleted")
        return UnresolvedClaim(claim_name, api.WaitReason.NAME_TAKEN,
                               f"GPUClaim {claim_name!r} exists and is not this pod's claim for "
                               f"entry {entry.name!r}; delete or rename it")
    template_spec = None
    if entry.source is EntrySource.TEMPLATE:
        template = ctl.templates.get(ns, entry.template or "")
        if template is None:
            return UnresolvedClaim(claim_name, api.WaitReason.CLAIM_MISSING,
                                   f"GPUClaimTemplate {entry.template!r} does not exist in {ns}")
        template_spec = template.get("spec") or {}
    body = template_claim(pod, entry, template_spec)
    try:
        created = ctl.writer.create_claim(body)
    except AlreadyExists:
        # Made by an earlier sync whose result the cache does not show yet,
        # or by someone else: read it to know which.
        raise Conflict(f"claim {ns}/{claim_name} exists but is not in the cache yet")
    except kube.ApiError as e:
        if e.status in _REFUSED_BY_USER_INPUT:
            # A quota, or a template the API server finds invalid: retrying
            # (with backoff) is right, but only the user can fix it, so say why.
            source = (f"GPUClaimTemplate {entry.template!r}" if entry.source is EntrySource.TEMPLATE
                      else f"entry {entry.name!r}")
            _tell(ctl, pod, api.WaitReason.CLAIM_MISSING,
                  f"the API server refused to create GPUClaim {claim_name!r} from {source}: "
                  f"{e.status} {e.reason}: {e.message}", claims=[claim_name])
        raise
    if ctl.metrics is not None:
        ctl.metrics.template_claims_created.inc()
    log.info("created template claim", extra={"pod": f"{ns}/{pod_name}", "claim": claim_name})
    return created


# Answers to a create that only a change by the user can turn around
# (Forbidden is what an exceeded ResourceQuota answers).
_REFUSED_BY_USER_INPUT = frozenset({400, 403, 422})


def _older_pods_claim(claim: Obj, pod_name: str) -> bool:
    meta = claim["metadata"]
    if (meta.get("labels") or {}).get(api.TEMPLATE_CLAIM_LABEL) != api.TEMPLATE_CLAIM_LABEL_VALUE:
        return False
    return any(r.get("controller") and r.get("kind") == "Pod" and r.get("name") == pod_name
               for r in meta.get("ownerReferences") or ())


def _with_inflight(ctl: Controller, state: ClaimState | UnresolvedClaim) -> ClaimState | UnresolvedClaim:
    """A claim this controller just placed counts as Bound there (see decide)."""
    if isinstance(state, UnresolvedClaim) or state.bound:
        return state
    pending = ctl.inflight.get(state.uid)
    if pending is None:
        return state
    return dataclasses.replace(state, phase=api.Phase.BOUND, node_name=pending.node)


def _set_key(pod: Obj, entries: Sequence[ClaimEntry]) -> tuple[str, str]:
    """Who a rejection of template/inline claims applies to: the pod's owner
    (a Job's or ReplicaSet's next pod inherits it), or the pod itself."""
    meta = pod["metadata"]
    owner = next((r.get("uid", "") for r in meta.get("ownerReferences") or ()
                  if r.get("controller")), "")
    who = owner or f"pod/{meta['name']}"
    return meta["namespace"], who + "|" + ",".join(sorted(e.name for e in entries))


def _with_set_rejections(ctl: Controller, set_key: tuple[str, str],
                         states: list[ClaimState | UnresolvedClaim],
                         now: datetime) -> list[ClaimState | UnresolvedClaim]:
    extra = [r for r in ctl.set_rejections.get(set_key) or ()
             if r.until > now and not _node_changed_since(ctl, r)]
    if not extra:
        return states
    return [s if isinstance(s, UnresolvedClaim) else
            dataclasses.replace(s, rejected=tuple(s.rejected) + tuple(extra)) for s in states]


def _node_changed_since(ctl: Controller, r: Rejection) -> bool:
    changed = ctl.node_changed_at.get(r.node_name)
    return changed is not None and changed >= r.until - timedelta(seconds=ctl.options.reject_for)


def _bind(ctl: Controller, pod: Obj, claim: Obj, node: str, action: Action) -> None:
    meta = pod["metadata"]
    ref = {"name": meta["name"], "uid": meta["uid"]}
    status = claim.get("status") or {}
    done = (status.get("phase") == api.Phase.BOUND and status.get("nodeName") == node
            and status.get("reservedFor") == [ref] and not _waiting_condition(claim))
    if done:
        return
    if api.CLAIM_FINALIZER not in (claim["metadata"].get("finalizers") or ()):
        with_finalizer = copy.deepcopy(claim)
        with_finalizer["metadata"].setdefault("finalizers", []).append(api.CLAIM_FINALIZER)
        claim = ctl.writer.update_claim(with_finalizer)
    updated = copy.deepcopy(claim)
    st = updated.setdefault("status", {})
    st["phase"] = api.Phase.BOUND
    st["nodeName"] = node
    st["reservedFor"] = [ref]
    st["conditions"] = [c for c in st.get("conditions") or () if c.get("type") != api.CONDITION_WAITING]
    ctl.writer.update_claim_status(updated)
    log.info("bound claim", extra={"claim": f"{meta['namespace']}/{claim['metadata']['name']}",
                                   "node": node, "pod": meta["name"], "reason": str(action)})


def _release(ctl: Controller, pod: Obj, node: str) -> None:
    """Remove our gate and pin the node: one update, at the read resourceVersion."""
    ctl.writer.update_pod(released_pod(pod, node))


def released_pod(pod: Obj, node: str) -> Obj:
    """A copy of `pod` without our gate, pinned to `node` and marked as placed by us."""
    released = copy.deepcopy(pod)
    spec = released["spec"]
    spec["schedulingGates"] = [g for g in spec.get("schedulingGates") or ()
                               if g.get("name") != api.SCHEDULING_GATE]
    spec["affinity"] = pin_to_node(spec.get("affinity"), node)
    released["metadata"].setdefault("annotations", {})[api.PLACED_NODE_ANNOTATION] = node
    return released


# -- waiting -------------------------------------------------------------------------------


def _waiting_condition(claim: Obj) -> Obj | None:
    for c in (claim.get("status") or {}).get("conditions") or ():
        if c.get("type") == api.CONDITION_WAITING:
            return c  # type: ignore[no-any-return]
    return None


def _waiting(ctl: Controller, pod: Obj, decision: Waiting, raw: dict[str, Obj],
             rejections: Sequence[Rejection]) -> None:
    if ctl.metrics is not None:
        ctl.metrics.placements.labels("waiting", str(decision.reason)).inc()
    now = ctl.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, wait in decision.claims.items():
        claim = raw.get(name)
        if claim is None:
            continue
        current = _waiting_condition(claim)
        if (current is not None and current.get("reason") == wait.reason
                and current.get("message") == wait.message and current.get("status") == "True"):
            continue
        updated = copy.deepcopy(claim)
        st = updated.setdefault("status", {})
        conds = [c for c in st.get("conditions") or () if c.get("type") != api.CONDITION_WAITING]
        conds.append({"type": api.CONDITION_WAITING, "status": "True", "reason": str(wait.reason),
                      "message": wait.message[:32000], "lastTransitionTime": now,
                      "observedGeneration": claim["metadata"].get("generation", 1)})
        st["conditions"] = conds
        try:
            ctl.writer.update_claim_status(updated)
        except NotFound:
            pass
    _tell(ctl, pod, decision.reason, decision.message, claims=list(decision.claims))
    # A rejection that runs out can let the set fit: look again then. Those
    # kept in memory for template and inline sets count too: their claims
    # are new, and carry none.
    soonest = _next_rejection_end(rejections, ctl.now())
    if soonest is not None:
        ctl.queue.add_after(f"pod:{pod['metadata']['namespace']}/{pod['metadata']['name']}", soonest)


def _next_rejection_end(rejections: Iterable[Rejection], now: datetime) -> float | None:
    left = [(r.until - now).total_seconds() for r in rejections if r.until > now]
    return min(left) + 0.5 if left else None


def _tell(ctl: Controller, pod: Obj, reason: api.WaitReason, message: str, claims: Sequence[str]) -> None:
    """One Warning event each time the pod's waiting reason changes."""
    meta = pod["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    if ctl.told.get(key) == str(reason):
        return
    ctl.told[key] = str(reason)
    if reason is api.WaitReason.INVALID_CLAIMS and ctl.metrics is not None:
        ctl.metrics.placements.labels("waiting", str(reason)).inc()
    log.info("pod waits: %s", message, extra={"pod": key, "reason": str(reason)})
    ctl.writer.event(_pod_ref(pod), "Warning", str(reason), message)


def _pod_ref(pod: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


# -- refused pods ----------------------------------------------------------------------------


def _check_refused(ctl: Controller, pod: Obj) -> None:
    """A pod we pinned that the scheduler reports Unschedulable on a healthy
    node that still holds its whole set: delete it and reject the node."""
    meta = pod["metadata"]
    if (pod.get("spec") or {}).get("nodeName"):
        return
    cond = next((c for c in (pod.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "PodScheduled"), None)
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return
    node_name = (meta.get("annotations") or {}).get(api.PLACED_NODE_ANNOTATION, "")
    node = ctl.nodes.get(node_name)
    if node is None or (node.get("spec") or {}).get("unschedulable"):
        return
    if not node_ready(node):
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
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return
    claims = [ctl.claims.get(meta["namespace"], e.claim_name(meta["name"])) for e in entries]
    ref = {"name": meta["name"], "uid": meta["uid"]}
    for c in claims:
        st = (c or {}).get("status") or {}
        if c is None or st.get("phase") != api.Phase.BOUND or st.get("nodeName") != node_name \
                or ref not in (st.get("reservedFor") or ()):
            return  # the set is not whole on that node: nothing to reject
    message = cond.get("message") or "the scheduler refused the pod"
    until = ctl.now() + timedelta(seconds=ctl.options.reject_for)
    rejection = Rejection(node_name, until, f"Unschedulable: {message}"[:1024])
    set_key = _set_key(pod, entries)
    ctl.set_rejections.update(set_key, lambda old: tuple(
        r for r in old or () if r.node_name != node_name) + (rejection,))
    for c in claims:
        assert c is not None
        _record_rejection(ctl, c, rejection)
    if not ctl.writer.delete_pod(meta["namespace"], meta["name"], meta["uid"],
                                 meta["resourceVersion"]):
        return  # it changed or went: the next event decides again
    if ctl.metrics is not None:
        ctl.metrics.refused_pods.inc()
    ctl.deleted_pods[meta["uid"]] = True
    log.warning("deleted pod the scheduler refused; node rejected for its set",
                extra={"pod": f"{meta['namespace']}/{meta['name']}", "node": node_name,
                       "reason": message})
    ctl.writer.event(_pod_ref(pod), "Warning", "NodeRejected",
                     f"kube-scheduler refused the pod on node {node_name} ({message}); deleted it "
                     f"so its GPU claims can be placed elsewhere; {node_name} is skipped for this "
                     f"set until {until:%Y-%m-%dT%H:%M:%SZ}")
    for c in claims:
        assert c is not None
        ctl.enqueue_claim(f"{meta['namespace']}/{c['metadata']['name']}")


def _record_rejection(ctl: Controller, claim: Obj, rejection: Rejection) -> None:
    updated = copy.deepcopy(claim)
    st = updated.setdefault("status", {})
    rejected = [r for r in st.get("rejectedNodes") or () if r.get("nodeName") != rejection.node_name]
    rejected.append({"nodeName": rejection.node_name, "reason": rejection.reason,
                     "until": rejection.until.strftime("%Y-%m-%dT%H:%M:%SZ")})
    st["rejectedNodes"] = rejected
    try:
        ctl.writer.update_claim_status(updated)
    except (NotFound, Conflict) as e:
        # The in-memory rejection still holds; the claim is retried by its own sync.
        log.info("could not record rejection on claim: %s", e,
                 extra={"claim": claim["metadata"]["name"], "node": rejection.node_name})

