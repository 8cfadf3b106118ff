"""What a `pod:` sync will write, as plain values (DESIGN.md §3, §5).

`resolve` turns a pod's annotation entries into the claims they name,
the claims to create first, or why an entry cannot be used; the bodies
below are the objects each write sends. Pure: no client, no clock (`now`
is passed in), no globals; `sync.pods` reads the caches, calls these and
`placement.decide`, and applies the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuclaimctl.decide.placement import ClaimWait
from gpuclaimctl.model import api
from gpuclaimctl.model.nodeaffinity import pin_to_node
from gpuclaimctl.model.owners import controller_ref
from gpuclaimctl.model.podclaims import (
    ClaimEntry,
    EntrySource,
    is_template_claim_of,
    template_claim,
    template_owner_name,
    template_owner_uid,
)
from gpuclaimctl.model.snapshot import ClaimState, ClassInfo, Rejection, UnresolvedClaim, format_time

Obj = dict[str, Any]
Lookup = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class Found:
    claim: Mapping[str, Any]


@dataclass(frozen=True)
class ToCreate:
    body: Obj
    entry: ClaimEntry


@dataclass(frozen=True)
class Outdated:
    """The pod's own claim of an inline entry, made from an earlier version
    of the entry (the annotation was edited while the pod was gated) and
    used by nobody: to delete, then to make again as `body` says. A claim's
    spec cannot change, so there is no other way to follow the edit."""
    claim: Mapping[str, Any]
    body: Obj
    message: str


Resolved = Found | ToCreate | UnresolvedClaim | Outdated


def resolve(pod: Mapping[str, Any], entries: Sequence[ClaimEntry], get_claim: Lookup,
            get_template: Lookup) -> list[Resolved]:
    """Each entry's claim: found, to be created, or why it cannot be used."""
    meta = pod["metadata"]
    ns, pod_name, pod_uid = meta["namespace"], meta["name"], meta.get("uid", "")
    out: list[Resolved] = []
    for entry in entries:
        name = entry.claim_name(pod_name)
        claim = get_claim(ns, name)
        if entry.source is EntrySource.CLAIM:
            out.append(_named_claim(claim, name, ns, pod_uid))
        elif claim is not None:
            out.append(_outdated(pod, claim, entry, pod_uid)
                       or _template_claim(claim, name, entry, pod_name, pod_uid))
        elif entry.source is EntrySource.TEMPLATE:
            template = get_template(ns, entry.template or "")
            if template is None:
                out.append(UnresolvedClaim(name, api.WaitReason.CLAIM_MISSING,
                                           f"GPUClaimTemplate {entry.template!r} does not exist in {ns}"))
            else:
                out.append(ToCreate(template_claim(pod, entry, template.get("spec") or {}), entry))
        else:
            out.append(ToCreate(template_claim(pod, entry, None), entry))
    return out


def _named_claim(claim: Mapping[str, Any] | None, name: str, ns: str, pod_uid: str) -> Resolved:
    if claim is None:
        return UnresolvedClaim(name, api.WaitReason.CLAIM_MISSING,
                               f"GPUClaim {name!r} does not exist in {ns}")
    owner = template_owner_uid(claim)
    if owner and owner != pod_uid:
        # A template claim belongs to its owner pod alone (DESIGN I2).
        return UnresolvedClaim(name, api.WaitReason.CLAIM_IN_USE,
                               f"GPUClaim {name!r} was made for pod {template_owner_name(claim)!r} "
                               "from its template or inline entry and serves that pod alone; "
                               "name a GPUClaim of your own")
    return Found(claim)


def _outdated(pod: Mapping[str, Any], claim: Mapping[str, Any], entry: ClaimEntry, pod_uid: str) -> Outdated | None:
    """`claim` if it is the pod's own claim of inline `entry` with another
    class or count than the entry has now, and holds nothing: Pending,
    reserved by nobody, not being deleted. One already reserved or bound
    is kept (the webhook refuses the edit then): its set is under way."""
    if entry.source is not EntrySource.INLINE or not is_template_claim_of(claim, pod_uid):
        return None
    spec, status = claim.get("spec") or {}, claim.get("status") or {}
    if (spec.get("className"), spec.get("count")) == (entry.class_name, entry.count):
        return None
    if status.get("reservedFor") or status.get("phase") not in (None, api.Phase.PENDING) \
            or claim["metadata"].get("deletionTimestamp"):
        return None
    return Outdated(claim, template_claim(pod, entry, None),
                    f"GPUClaim {claim['metadata']['name']!r} was made from an earlier version of entry "
                    f"{entry.name!r} ({spec.get('count')} × {spec.get('className')}); it is deleted and "
                    f"made again as the annotation says now ({entry.count} × {entry.class_name})")


def _template_claim(claim: Mapping[str, Any], name: str, entry: ClaimEntry, pod_name: str,
                    pod_uid: str) -> Resolved:
    if is_template_claim_of(claim, pod_uid):
        return Found(claim)
    if template_owner_uid(claim) and template_owner_name(claim) == pod_name:
        # A pod recreated under the same name (a StatefulSet's): its
        # predecessor's claim goes first; the claim sync deletes it.
        return UnresolvedClaim(name, api.WaitReason.CLAIM_IN_USE,
                               f"GPUClaim {name!r} still belongs to an earlier pod named "
                               f"{pod_name!r}; waiting for it to be deleted")
    return UnresolvedClaim(name, api.WaitReason.NAME_TAKEN,
                           f"GPUClaim {name!r} exists and is not this pod's claim for "
                           f"entry {entry.name!r}; delete or rename it")


# -- write bodies -----------------------------------------------------------------------


def refused_create_message(claim_name: str, source: str, status: int, reason: str, message: str) -> str:
    """The Warning a pod is told when the API server refuses to create one
    of its claims (`source`: the template or entry it comes from);
    `refused_create_of` reads it back (gpuclaimctl why)."""
    return f"{_REFUSED_CREATE}{claim_name!r} from {source}: {status} {reason}: {message}"


def refused_create_of(message: str, claim_name: str) -> bool:
    """Whether `message` is the Warning of a refused create of `claim_name`."""
    return message.startswith(f"{_REFUSED_CREATE}{claim_name!r} from ")


_REFUSED_CREATE = "the API server refused to create GPUClaim "


def pod_ref(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod["metadata"]
    return {"name": meta["name"], "uid": meta["uid"]}


def waiting_condition(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (claim.get("status") or {}).get("conditions") or ():
        if c.get("type") == api.CONDITION_WAITING:
            return c  # type: ignore[no-any-return]
    return None


def bound_as_planned(claim: Mapping[str, Any], pod: Mapping[str, Any], node: str, resource: str) -> bool:
    """The claim already says what a bind would write (a resumed sync)."""
    status = claim.get("status") or {}
    return (status.get("phase") == api.Phase.BOUND and status.get("nodeName") == node
            and status.get("reservedFor") == [pod_ref(pod)]
            and status.get("resourceName") == resource and waiting_condition(claim) is None
            and api.CLAIM_FINALIZER in (claim["metadata"].get("finalizers") or ()))


def with_finalizer(claim: Mapping[str, Any]) -> Obj | None:
    """The claim with our finalizer, or None if it has it."""
    if api.CLAIM_FINALIZER in (claim["metadata"].get("finalizers") or ()):
        return None
    out = copy.deepcopy(dict(claim))
    out["metadata"].setdefault("finalizers", []).append(api.CLAIM_FINALIZER)
    return out


def bound_claim(claim: Mapping[str, Any], pod: Mapping[str, Any], node: str, resource: str) -> Obj:
    """The claim Bound on `node`, reserved for `pod`, counted under `resource`."""
    out = _with_own_status(claim)
    st = out["status"]
    st["phase"] = api.Phase.BOUND
    st["nodeName"] = node
    st["resourceName"] = resource
    st["reservedFor"] = [pod_ref(pod)]
    st["conditions"] = [c for c in st.get("conditions") or () if c.get("type") != api.CONDITION_WAITING]
    return out


def waiting_claim(claim: Mapping[str, Any], wait: ClaimWait, now: datetime) -> Obj | None:
    """The claim with Waiting=True for `wait`, or None if it says so already."""
    current = waiting_condition(claim)
    if (current is not None and current.get("reason") == wait.reason
            and current.get("message") == wait.message and current.get("status") == "True"):
        return None
    out = _with_own_status(claim)
    st = out["status"]
    conds = [c for c in st.get("conditions") or () if c.get("type") != api.CONDITION_WAITING]
    conds.append({"type": api.CONDITION_WAITING, "status": "True", "reason": str(wait.reason),
                  "message": wait.message[:32000], "lastTransitionTime": format_time(now),
                  "observedGeneration": claim["metadata"].get("generation", 1)})
    st["conditions"] = conds
    return out


def rejected_claim(claim: Mapping[str, Any], rejection: Rejection) -> Obj:
    out = _with_own_status(claim)
    st = out["status"]
    rejected = [r for r in st.get("rejectedNodes") or () if r.get("nodeName") != rejection.node_name]
    rejected.append({"nodeName": rejection.node_name, "reason": rejection.reason,
                     "until": format_time(rejection.until)})
    st["rejectedNodes"] = rejected
    return out


def unreserved_claim(claim: Mapping[str, Any], pod_uid: str) -> Obj | None:
    """The claim without `pod_uid` in reservedFor, or None if it is not there."""
    refs = (claim.get("status") or {}).get("reservedFor") or []
    keep = [r for r in refs if r.get("uid") != pod_uid]
    if len(keep) == len(refs):
        return None
    out = _with_own_status(claim)
    out["status"]["reservedFor"] = keep
    return out


def _with_own_status(claim: Mapping[str, Any]) -> Obj:
    """The claim to send in a status write: a new top level and status,
    all else shared with the cached object (the caller replaces status
    fields whole, never edits a shared part). A deep copy of a claim of
    the benchmark took 24.5 us, this 0.25 us (timeit)."""
    out = dict(claim)
    out["status"] = dict(claim.get("status") or {})
    return out


def release_patch(pod: Mapping[str, Any], node: str) -> list[Obj]:
    """The release as a JSON patch (RFC 6902): our gate removed, the pod
    pinned to `node` (nodeaffinity.pin_to_node) and marked placed there,
    with `test`s of what the decision read instead of the resourceVersion.

    An update with the resourceVersion fails with 409 whenever anything of
    the pod changed since the cache showed it -- and kube-scheduler writes
    a gated pod's status (PodScheduled=False, SchedulingGated) soon after it
    is created, so most releases lost a round trip and a sync to that. The
    patch fails (422) only if the pod is another (uid), is no longer gated
    as read, or its claims annotation, node selector, tolerations or
    node affinity changed: then the pod is decided again, as after a conflict.
    A field absent when read cannot be tested absent; one added meanwhile
    makes the scheduler refuse the pinned pod at worst, which the refused
    pod path handles."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    gates = list(spec.get("schedulingGates") or ())
    annotations = meta.get("annotations") or {}
    ops: list[Obj] = [{"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                      {"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    if api.CLAIMS_ANNOTATION in annotations:
        ops.append({"op": "test", "path": "/metadata/annotations/" + _pointer(api.CLAIMS_ANNOTATION),
                    "value": annotations[api.CLAIMS_ANNOTATION]})
    for field in ("nodeSelector", "tolerations"):
        if spec.get(field) is not None:
            ops.append({"op": "test", "path": f"/spec/{field}", "value": spec[field]})
    # Only the node affinity is read, tested and pinned: pod (anti-)affinity
    # is the scheduler's, and the controller's cache does not keep it
    # (model.podcache).
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if affinity is not None else None
    if node_affinity is not None:
        ops.append({"op": "test", "path": "/spec/affinity/nodeAffinity", "value": node_affinity})
    ops.append({"op": "replace", "path": "/spec/schedulingGates",
                "value": [g for g in gates if g.get("name") != api.SCHEDULING_GATE]})
    pinned = pin_to_node({"nodeAffinity": node_affinity} if node_affinity is not None else None, node)
    if affinity is None:
        ops.append({"op": "add", "path": "/spec/affinity", "value": pinned})
    else:
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": pinned["nodeAffinity"]})
    if annotations:
        ops.append({"op": "add", "path": "/metadata/annotations/" + _pointer(api.PLACED_NODE_ANNOTATION),
                    "value": node})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {api.PLACED_NODE_ANNOTATION: node}})
    return ops


def _pointer(key: str) -> str:
    """A map key as one JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def set_key(pod: Mapping[str, Any], entries: Sequence[ClaimEntry]) -> tuple[str, str]:
    """Who a rejection of template/inline claims applies to: the pod's owner
    (a Job's or ReplicaSet's next pod inherits it), or the pod itself."""
    meta = pod["metadata"]
    owner = controller_ref(pod)
    who = (owner or {}).get("uid") or f"pod/{meta['name']}"
    return meta["namespace"], who + "|" + ",".join(sorted(e.name for e in entries))


def unbound_need(states: Iterable[ClaimState | UnresolvedClaim],
                 classes: Mapping[str, ClassInfo]) -> dict[str, int] | None:
    """resource -> GPUs the set's claims not yet bound ask for: the least a
    node must have free for the set to fit there (a lower bound: the rest of
    the set may have to move too). None if a claim or its class is unknown."""
    need: dict[str, int] = {}
    for s in states:
        if not isinstance(s, ClaimState) or s.class_name not in classes:
            return None
        if not s.bound:
            r = classes[s.class_name].resource_name
            need[r] = need.get(r, 0) + s.count
    return need
