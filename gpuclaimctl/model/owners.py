"""Who controls an object: its controller ownerReference (metav1.GetControllerOf).

One home for the walk over `metadata.ownerReferences`, so the cache index of
claims by owner pod, the template-claim checks and a pod's owner for
rejections never disagree. The API server lets at most one reference be the
controller. Pure; never raises, even on a malformed object, since index
functions call it on every cache write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, or None."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def controller_pod(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller ownerReference when it is a core/v1 Pod, or None."""
    ref = controller_ref(obj)
    if ref is None or ref.get("kind") != "Pod" or ref.get("apiVersion") != "v1":
        return None
    return ref
