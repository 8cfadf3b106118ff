"""How an object's key is spelled: `namespace/name`, or `name` for a
cluster-scoped object (client-go's MetaNamespaceKeyFunc). One home, so the
caches, the queue and the syncs never disagree."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
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


class Kind(StrEnum):
    """What a work queue key names, and so which sync runs it."""

    POD = "pod"
    CLAIM = "claim"
    CLASS = "class"
    BUDGET = "budget"
    AUDIT = "audit"  # the one `audit:inflight` (sync.claims.audit_inflight)


@dataclass(frozen=True)
class WorkKey:
    """A work queue key, `kind:object-key` (`pod:ns/name`, `class:name`),
    as the upstream resourceclaim controller spells them. The queue holds
    the spelled string (`str(key)`; equal keys collapse); code that needs
    the parts parses it here, in one place, rather than slicing prefixes."""

    kind: Kind
    key: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"

    @classmethod
    def parse(cls, text: str) -> WorkKey:
        """The key `text` spells; ValueError for one no sync runs."""
        kind, sep, key = text.partition(":")
        if not sep or kind not in _KINDS:
            raise ValueError(f"not a work key: {text!r}")
        return cls(Kind(kind), key)

    @classmethod
    def of_pod(cls, text: str) -> str | None:
        """The `ns/name` of a pod key; None for any other key."""
        kind, sep, key = text.partition(":")
        return key if sep and kind == Kind.POD else None


_KINDS = frozenset(k.value for k in Kind)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_label(value: str) -> bool:
    """An RFC 1123 label, as a namespace's name must be."""
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """An RFC 1123 subdomain, as most objects' names (a pod's) must be."""
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None
