"""Which nodes a pod's bound volumes reach: its PersistentVolumeClaims, looked
up through listers, and the required node affinity of the volumes they are
bound to (a local disk holding a dataset, a zonal volume).

Mirrors the kube-scheduler's VolumeBinding filter for claims already bound,
so the controller does not pin a pod to a node its volumes cannot reach
(the scheduler would refuse it, the pod be deleted and recreated, and the
loop repeat). A claim that is missing or not yet bound does not constrain:
the scheduler's volume binding picks or provisions its volume on the node
the pod goes to. The PV's terms are matched by `nodeaffinity`'s selector
(`VolumeConstraint.reaches`); there is no second matcher here.

Pure: no client, no clock, no globals; the listers are passed in as
functions. Cache objects are only read. A malformed object never raises:
what cannot be read is ignored (a PV affinity that is not the API's shape
does not constrain; a term inside it that does not parse matches no node,
as upstream).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuclaimctl.model.owners import controller_ref
from gpuclaimctl.model.nodeaffinity import NodeSelector, VolumeConstraint

__all__ = ["GetPVC", "GetPV", "VolumeConstraint", "pvc_names", "volume_constraints"]

# NamespacedLister.get and ClusterLister.get of the PVC and PV informers.
GetPVC = Callable[[str, str], Mapping[str, Any] | None]
GetPV = Callable[[str], Mapping[str, Any] | None]


def pvc_names(pod: Mapping[str, Any]) -> tuple[tuple[str, str, bool], ...]:
    """(volume, claim, ephemeral) for each of the pod's volumes backed by a
    PersistentVolumeClaim in its namespace: `persistentVolumeClaim.claimName`,
    or `<pod>-<volume>` for a generic ephemeral volume (upstream's
    ephemeral.VolumeClaimName). For the pod sync and for finding the pods a
    claim event concerns."""
    meta, spec = _dict(pod.get("metadata")), _dict(pod.get("spec"))
    pod_name = meta.get("name")
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        return ()
    out = []
    for v in volumes:
        if not isinstance(v, Mapping) or not isinstance(v.get("name"), str) or not v["name"]:
            continue
        source = v.get("persistentVolumeClaim")
        if isinstance(source, Mapping):
            claim = source.get("claimName")
            if isinstance(claim, str) and claim:
                out.append((v["name"], claim, False))
        elif isinstance(v.get("ephemeral"), Mapping) and isinstance(pod_name, str) and pod_name:
            out.append((v["name"], f"{pod_name}-{v['name']}", True))
    return tuple(out)


def volume_constraints(pod: Mapping[str, Any], get_pvc: GetPVC, get_pv: GetPV) -> tuple[VolumeConstraint, ...]:
    """The node affinity of every PersistentVolume bound to one of the pod's
    claims, in the order of the pod's volumes, one per PV.

    A claim constrains once it is bound: `spec.volumeName` is set (by the PV
    controller, or pre-bound by its author) and that PV is in the cache, and
    the PV has `spec.nodeAffinity.required` with terms. A missing claim, an
    unbound one, one whose PV the cache does not hold yet, a PV without
    affinity, and an ephemeral volume's claim that the pod does not control
    (the scheduler refuses that pod until its own claim exists) do not.

    Pure: no client, no clock, no globals; `get_pvc(namespace, name)` and
    `get_pv(name)` are the listers' `get`, returning None for a miss.
    """
    meta = _dict(pod.get("metadata"))
    namespace, pod_uid = meta.get("namespace"), meta.get("uid")
    if not isinstance(namespace, str):
        return ()
    out: list[VolumeConstraint] = []
    seen: set[str] = set()
    for volume, claim, ephemeral in pvc_names(pod):
        pvc = get_pvc(namespace, claim)
        if not isinstance(pvc, Mapping):
            continue
        if ephemeral and not _controlled_by(pvc, pod_uid):
            continue
        pv_name = _dict(pvc.get("spec")).get("volumeName")
        if not isinstance(pv_name, str) or not pv_name or pv_name in seen:
            continue
        pv = get_pv(pv_name)
        if not isinstance(pv, Mapping):
            continue
        required = _dict(_dict(_dict(pv.get("spec")).get("nodeAffinity")).get("required"))
        terms = required.get("nodeSelectorTerms")
        if not isinstance(terms, list) or not terms:
            continue
        seen.add(pv_name)
        out.append(VolumeConstraint(volume, claim, pv_name, NodeSelector.from_api(required)))
    return tuple(out)


def _controlled_by(obj: Mapping[str, Any], uid: Any) -> bool:
    """metav1.IsControlledBy: the controller ownerReference names `uid`."""
    return isinstance(uid, str) and bool(uid) and (controller_ref(obj) or {}).get("uid") == uid


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
