"""How an object's key is spelled: `namespace/name`, or `name` for a
cluster-scoped object (client-go's MetaNamespaceKeyFunc). One home, so the
caches, the queue and the syncs never disagree."""

from __future__ import annotations

import re
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


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_label(value: str) -> bool:
    """An RFC 1123 label, as a namespace's name must be."""
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """An RFC 1123 subdomain, as most objects' names (a pod's) must be."""
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None
