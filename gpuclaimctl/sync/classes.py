"""class: keys — a GPUClass's status, for `kubectl get gpuclasses -o wide`.

`status.nodes` and `status.allocatable` count the Ready nodes that offer the
class (its selector matches and they have its resource) and their GPUs;
`status.bound` the GPUs its Bound claims hold. All from the caches; the
status is written only when a figure changed. Nothing reads it back: it is
for people (placement reads nodes and claims themselves).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpuclaimctl.model.resources import QUANTITY_MAX
from gpuclaimctl.decide.capacity import claim_usage
from gpuclaimctl.model.snapshot import ClassInfo, NodeInfo
from gpuclaimctl.sync.context import SyncContext

log = logging.getLogger("gpuclaimctl.sync.classes")
Obj = dict[str, Any]


def bound_gpus(claims: Iterable[Mapping[str, Any]]) -> int:
    """The GPUs `claims` hold (decide.capacity.claim_usage's rule): what the
    view keeps per class as claims change (ClusterView.bound_in_class)."""
    return sum(held[2] for c in claims if (held := claim_usage(c, {})) is not None)


def class_figures(cls: ClassInfo, nodes: Iterable[NodeInfo], bound: int) -> dict[str, int]:
    """{nodes, allocatable, bound} for `cls`; `bound`: the GPUs its claims hold."""
    offering, allocatable = cls.allocatable(nodes)
    # The CRD's status fields are int64: a sum past it (two nodes reporting
    # "9223372036854775807", say) is refused with 422 on every retry, for ever.
    return {"nodes": offering, "allocatable": min(allocatable, QUANTITY_MAX), "bound": min(bound, QUANTITY_MAX)}


def sync_class(ctx: SyncContext, name: str) -> None:
    obj = ctx.classes.get(name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return
    cls = ClassInfo.from_api(obj)
    nodes = list(ctx.view.cluster().nodes.values())
    figures = class_figures(cls, nodes, ctx.view.bound_in_class(name))
    status = obj.get("status") or {}
    if all(status.get(k) == v for k, v in figures.items()):
        return
    updated = copy.deepcopy(obj)
    updated["status"] = {**status, **figures}
    ctx.writer.update_class_status(updated)
    log.debug("class status written", extra={"class": name, **figures})
