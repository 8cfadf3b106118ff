"""Is a node Ready, and since when not: read from its `Ready` condition.

One home for the rule, so the claim sync (Lost after the grace), the pod
sync (a refusal on a healthy node), the cluster view and the handlers that
end rejections early never disagree. Pure; never raises on a node the API
server serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpuclaimctl.model.snapshot import parse_time


def ready_condition(node: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The node's `Ready` condition; None for a missing node or one without it."""
    for c in ((node or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return c  # type: ignore[no-any-return]
    return None


def node_ready(node: Mapping[str, Any] | None) -> bool:
    """The node's Ready condition is True (a missing node is not Ready)."""
    return (ready_condition(node) or {}).get("status") == "True"


def not_ready_since(node: Mapping[str, Any] | None) -> datetime | None:
    """When a node whose Ready condition is not True last changed it; None
    when it is Ready, says nothing, or gives no time."""
    condition = ready_condition(node)
    if condition is None or condition.get("status") == "True":
        return None
    return parse_time(condition.get("lastTransitionTime"))
