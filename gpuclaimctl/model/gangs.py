"""Which gang a pod is in (DESIGN.md §4c): annotations `gpuclaimctl.io/gang`
(a DNS label) and `gpuclaimctl.io/gang-size` (N >= 1), same namespace.

A gang is placed all at once or not at all: no member is released until N
members exist, are gated, and every member's set fits at the same moment
(decide.gang). Pure: parsing only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuclaimctl.model import keys
from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION

# More members than this is a typo, not a training job (the largest jobs
# run a few thousand pods); it also bounds one decision's work.
MAX_GANG_SIZE = 10_000


class GangError(ValueError):
    """A pod's gang annotations are wrong; the message says how."""


@dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    size: int

    @property
    def key(self) -> str:
        """`ns/name`: the PODS_BY_GANG index value."""
        return keys.namespaced(self.namespace, self.name)


def gang_name(pod: Mapping[str, Any]) -> str | None:
    """The gang annotation's value as written (None: not in a gang)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_ANNOTATION)
    return value if isinstance(value, str) else None


def pod_gang(pod: Mapping[str, Any]) -> Gang | None:
    """The pod's gang, None if it is in none; GangError if its annotations
    are wrong (a name that is not a DNS label, a size that is not a whole
    number from 1 to MAX_GANG_SIZE, a size without a name)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    name = annotations.get(GANG_ANNOTATION)
    size_text = annotations.get(GANG_SIZE_ANNOTATION)
    if name is None:
        if size_text is not None:
            raise GangError(f"annotation {GANG_SIZE_ANNOTATION} is set but {GANG_ANNOTATION} is not: "
                            "name the gang")
        return None
    if not isinstance(name, str) or not keys.is_dns_label(name):
        raise GangError(f"annotation {GANG_ANNOTATION}={name!r} is not a DNS label (lower-case letters, "
                        "digits and '-', at most 63)")
    if size_text is None:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION} is missing: say how many pods gang {name} has")
    try:
        size = int(str(size_text).strip())
    except ValueError:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION}={size_text!r} is not a whole number") from None
    if not 1 <= size <= MAX_GANG_SIZE:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION}={size} is out of range: from 1 to "
                        f"{MAX_GANG_SIZE}")
    return Gang(str(meta.get("namespace") or ""), name, size)
