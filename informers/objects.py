"""What the caches hold: raw API objects as plain dicts, their keys, tombstones.

Objects are the JSON the API server sent, decoded by orjson and never turned
into models. Everything the informers hand out is shared with the cache and
must be treated as read-only: copy (``copy.deepcopy``) before changing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeAlias

KubeObject: TypeAlias = dict[str, Any]
"""A Kubernetes object as decoded from JSON (read-only once cached)."""

KeyFunc: TypeAlias = Callable[[KubeObject], str]


def meta_namespace_key(obj: KubeObject) -> str:
    """client-go's MetaNamespaceKeyFunc: ``namespace/name``, or ``name`` when cluster-scoped."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    if namespace:
        return f"{namespace}/{meta['name']}"
    return str(meta["name"])


def split_key(key: str) -> tuple[str, str]:
    """``namespace/name`` → (namespace, name); a cluster-scoped key has namespace ``""``."""
    namespace, sep, name = key.partition("/")
    if not sep:
        return "", namespace
    return namespace, name


def resource_version(obj: KubeObject) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A delete the informer inferred rather than saw (client-go's tombstone).

    Handed to delete handlers when a relist shows an object gone whose delete
    event was missed (for example while the watch was down). ``obj`` is the
    last state the cache held; it may be stale.
    """

    key: str
    obj: KubeObject | None


def deletion_handling_key(obj: KubeObject | DeletedFinalStateUnknown) -> str:
    """The cache key of an object or of a tombstone (client-go's DeletionHandlingMetaNamespaceKeyFunc)."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    return meta_namespace_key(obj)
