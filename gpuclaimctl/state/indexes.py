"""Cache indexes that turn one object's change into the keys it affects.

Index functions run on every cache write, so they are cheap and never raise
on a user's malformed object (they index it under nothing instead).
"""

from __future__ import annotations

from typing import Any

from gpuclaimctl.model import api, keys
from gpuclaimctl.model.gangs import pod_group_name, podgroup_gang_key
from gpuclaimctl.model.owners import controller_pod
from gpuclaimctl.model.podclaims import PodClaimsError, has_gate, pod_claims
from gpuclaimctl.model.volumes import pvc_names

# claims
CLAIMS_BY_OWNER_POD = "claims-by-owner-pod"      # "ns/pod" of the controller owner Pod
CLAIMS_BY_RESERVED_POD = "claims-by-reserved-pod"  # "ns/pod" of each reservedFor entry
CLAIMS_BY_REJECTED_NODE = "claims-by-rejected-node"
CLAIMS_BY_NODE = "claims-by-node"
CLAIMS_BY_CLASS = "claims-by-class"
# pods
PODS_BY_CLAIM = "pods-by-claim"                  # "ns/claim" for each claim a pod names
WAITING_PODS = "waiting-pods"                    # "" for every pod that carries our gate
PODS_BY_GANG = "pods-by-gang"                    # "ns/gang" of a pod's gpuclaimctl.io/gang annotation,
                                                 # else "ns/podgroup:<name>" of the PodGroup it names (Gang.key)
PODS_BY_PVC = "pods-by-pvc"                      # "ns/pvc" of each PersistentVolumeClaim a gated pod uses

Obj = dict[str, Any]


def claims_by_owner_pod(claim: Obj) -> list[str]:
    name = _str((controller_pod(claim) or {}).get("name"))
    ns = _str(_field(claim, "metadata").get("namespace"))
    return [keys.namespaced(ns, name)] if name else []


def claims_by_reserved_pod(claim: Obj) -> list[str]:
    ns = _str(_field(claim, "metadata").get("namespace"))
    names = (_str(r.get("name")) for r in _dicts(_field(claim, "status").get("reservedFor")))
    return [keys.namespaced(ns, name) for name in names if name]


def claims_by_rejected_node(claim: Obj) -> list[str]:
    nodes = (_str(r.get("nodeName")) for r in _dicts(_field(claim, "status").get("rejectedNodes")))
    return [node for node in nodes if node]


def claims_by_node(claim: Obj) -> list[str]:
    node = _str(_field(claim, "status").get("nodeName"))
    return [node] if node else []


def claims_by_class(claim: Obj) -> list[str]:
    name = _str(_field(claim, "spec").get("className"))
    return [name] if name else []


def pods_by_claim(pod: Obj) -> list[str]:
    meta = _field(pod, "metadata")
    ns, name = _str(meta.get("namespace")), _str(meta.get("name"))
    # pod_claims raises only PodClaimsError, given a string annotation.
    if not name or not isinstance(_field(meta, "annotations").get(api.CLAIMS_ANNOTATION), str):
        return []
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return []
    return [keys.namespaced(ns, e.claim_name(name)) for e in entries]


def pods_by_gang(pod: Obj) -> list[str]:
    """Any value of the gang annotation that is a string (a wrong one too:
    its members still find each other and are told); without one, the
    PodGroup the pod names, whatever its policy (its members are found
    when it changes, and the PodGroup may not be read yet)."""
    meta = _field(pod, "metadata")
    ns = _str(meta.get("namespace"))
    name = _field(meta, "annotations").get(api.GANG_ANNOTATION)
    if isinstance(name, str) and name:
        return [keys.namespaced(ns, name)]
    group = pod_group_name(pod)
    return [podgroup_gang_key(ns, group)] if group else []


def pods_by_pvc(pod: Obj) -> list[str]:
    """Gated pods only: a volume change matters to a pod not yet placed."""
    if not has_gate(pod):
        return []
    ns = _str(_field(pod, "metadata").get("namespace"))
    return [keys.namespaced(ns, claim) for _, claim, _ in pvc_names(pod)]


def waiting_pods(pod: Obj) -> list[str]:
    return [""] if has_gate(pod) else []


# The API server's schemas make the shapes below hold for every object it
# serves; these guards keep a hand-made or future-version object from
# breaking the informer that indexes it.


def _field(obj: Any, name: str) -> dict[str, Any]:
    """obj[name] if both are objects, else {}."""
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects in a list; nothing for anything else."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


CLAIM_INDEXERS = {
    CLAIMS_BY_OWNER_POD: claims_by_owner_pod,
    CLAIMS_BY_RESERVED_POD: claims_by_reserved_pod,
    CLAIMS_BY_REJECTED_NODE: claims_by_rejected_node,
    CLAIMS_BY_NODE: claims_by_node,
    CLAIMS_BY_CLASS: claims_by_class,
}
POD_INDEXERS = {
    PODS_BY_CLAIM: pods_by_claim,
    WAITING_PODS: waiting_pods,
    PODS_BY_PVC: pods_by_pvc,
    PODS_BY_GANG: pods_by_gang,
}
