"""Transforms applied to every object before it is cached (the informer's transform hook).

A transform receives the freshly decoded object, which nobody else holds
yet, so it may change it in place; it returns the object to cache.
"""

from __future__ import annotations

from typing import Callable

from informers.objects import KubeObject

Transform = Callable[[KubeObject], KubeObject]


def strip_managed_fields(obj: KubeObject) -> KubeObject:
    """Drop ``metadata.managedFields``: server-side-apply bookkeeping the
    controller never reads, often a third of a small object's JSON."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


def chain(*transforms: Transform) -> Transform:
    """One transform that applies ``transforms`` left to right."""
    if len(transforms) == 1:
        return transforms[0]

    def run(obj: KubeObject) -> KubeObject:
        for t in transforms:
            obj = t(obj)
        return obj

    return run
