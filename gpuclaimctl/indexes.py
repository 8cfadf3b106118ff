"""Cache indexes that turn one object's change into the keys it affects.

Index functions run on every cache write, so they are cheap and never raise
on a user's malformed object (they index it under nothing instead).
"""

from __future__ import annotations

from typing import Any

from gpuclaimctl import api
from gpuclaimctl.podclaims import PodClaimsError, pod_claims

# claims
CLAIMS_BY_OWNER_POD = "claims-by-owner-pod"      # "ns/pod" of the controller owner Pod
CLAIMS_BY_RESERVED_POD = "claims-by-reserved-pod"  # "ns/pod" of each reservedFor entry
CLAIMS_BY_REJECTED_NODE = "claims-by-rejected-node"
CLAIMS_BY_NODE = "claims-by-node"
# pods
PODS_BY_CLAIM = "pods-by-claim"                  # "ns/claim" for each claim a pod names
PODS_BY_NODE = "pods-by-node"
WAITING_PODS = "waiting-pods"                    # "" for every pod that carries our gate

Obj = dict[str, Any]


def has_gate(pod: Obj) -> bool:
    return any(g.get("name") == api.SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def claims_by_owner_pod(claim: Obj) -> list[str]:
    meta = claim.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return [f"{meta.get('namespace', '')}/{ref.get('name', '')}"]
    return []


def claims_by_reserved_pod(claim: Obj) -> list[str]:
    ns = (claim.get("metadata") or {}).get("namespace", "")
    return [f"{ns}/{r.get('name', '')}"
            for r in (claim.get("status") or {}).get("reservedFor") or ()]


def claims_by_rejected_node(claim: Obj) -> list[str]:
    return [r["nodeName"] for r in (claim.get("status") or {}).get("rejectedNodes") or ()
            if r.get("nodeName")]


def claims_by_node(claim: Obj) -> list[str]:
    node = (claim.get("status") or {}).get("nodeName")
    return [node] if node else []


def pods_by_claim(pod: Obj) -> list[str]:
    meta = pod.get("metadata") or {}
    if api.CLAIMS_ANNOTATION not in (meta.get("annotations") or {}):
        return []
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return []
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    return [f"{ns}/{e.claim_name(name)}" for e in entries]


def pods_by_node(pod: Obj) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def waiting_pods(pod: Obj) -> list[str]:
    return [""] if has_gate(pod) else []


CLAIM_INDEXERS = {
    CLAIMS_BY_OWNER_POD: claims_by_owner_pod,
    CLAIMS_BY_RESERVED_POD: claims_by_reserved_pod,
    CLAIMS_BY_REJECTED_NODE: claims_by_rejected_node,
    CLAIMS_BY_NODE: claims_by_node,
}
POD_INDEXERS = {
    PODS_BY_CLAIM: pods_by_claim,
    PODS_BY_NODE: pods_by_node,
    WAITING_PODS: waiting_pods,
}
