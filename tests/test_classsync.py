"""A GPUClass's status figures (classsync.class_figures); written on the real plane in test_e2e."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from gpuclaimctl.sync.classes import bound_gpus, class_figures
from gpuclaimctl.model.snapshot import ClassInfo, NodeInfo
from gpuclaimctl.state.view import ClusterView

GPU = "nvidia.com/gpu"


def claim(count: Any, phase: str | None = "Bound", reserved: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "nodeName": "a"} if phase else {}
    if reserved:
        status["reservedFor"] = [{"name": "p", "uid": "p-uid"}]
    return {"spec": {"className": "a100", "count": count}, "status": status}


def test_ready_nodes_offering_the_class_and_bound_claims_are_counted() -> None:
    cls = ClassInfo("a100", GPU, node_selector={"gpu": "a100"})
    nodes = [
        NodeInfo("a", labels={"gpu": "a100"}, allocatable={GPU: 8}),
        NodeInfo("b", labels={"gpu": "a100"}, allocatable={GPU: 4}, unschedulable=True),
        NodeInfo("down", labels={"gpu": "a100"}, allocatable={GPU: 8}, ready=False),
        NodeInfo("other", labels={"gpu": "h100"}, allocatable={GPU: 8}),
        NodeInfo("none", labels={"gpu": "a100"}, allocatable={GPU: 0}),
    ]
    claims = [claim(2), claim(1), claim(4, "Pending"), claim(3, "Lost"), claim(5, "Lost", reserved=True),
              claim("x")]
    # A cordoned node still offers the class (its GPUs may be bound there).
    # A Lost claim a pod still reserves holds its GPUs, as placement counts
    # them (model.snapshot.holds_gpus); one nobody reserves does not.
    assert class_figures(cls, nodes, bound_gpus(claims)) == {"nodes": 2, "allocatable": 12, "bound": 8}


def test_a_class_nobody_offers_has_zero_figures() -> None:
    assert class_figures(ClassInfo("h100", GPU), [], 0) == {"nodes": 0, "allocatable": 0, "bound": 0}


def test_figures_stay_within_the_int64_of_the_status_schema() -> None:
    # status.allocatable is an int64 in the CRD: a larger sum is refused
    # (422) on every write, so the class's key was retried for ever.
    huge = 2**63 - 1
    nodes = [NodeInfo(n, allocatable={GPU: huge}) for n in ("a", "b")]
    figures = class_figures(ClassInfo("a100", GPU), nodes, bound_gpus([claim(2**31 - 1)] * 5))
    assert figures == {"nodes": 2, "allocatable": huge, "bound": 5 * (2**31 - 1)}


def test_the_view_keeps_each_class_s_bound_gpus_as_bound_gpus_counts_them() -> None:
    view = ClusterView(lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))
    claims = [claim(2), claim(1), claim(4, "Pending"), claim(3, "Lost"), claim(5, "Lost", reserved=True)]
    for i, c in enumerate(claims):
        c["metadata"] = {"name": f"c{i}", "namespace": f"ns{i % 2}", "uid": f"u{i}", "resourceVersion": "1"}
        view.apply_claim(None, c)
    assert view.bound_in_class("a100") == bound_gpus(claims) == 8
    freed = {**claims[0], "status": {"phase": "Pending"}}
    view.apply_claim(claims[0], freed)
    view.delete_claim(claims[4])
    assert view.bound_in_class("a100") == bound_gpus([freed, *claims[1:4]]) == 1
    assert view.bound_in_class("h100") == 0
