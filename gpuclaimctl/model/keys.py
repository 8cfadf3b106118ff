"""How an object's key is spelled: `namespace/name`, or `name` for a
cluster-scoped object (client-go's MetaNamespaceKeyFunc). One home, so the
caches, the queue and the syncs never disagree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def namespaced(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return namespaced(meta.get("namespace"), str(meta["name"]))


def split(key: str) -> tuple[str, str]:
    """`ns/name` -> (ns, name); `name` -> ("", name)."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else ("", ns)
