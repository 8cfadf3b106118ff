"""What counts against a node's GPUs, from objects (decide/capacity.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuclaimctl.decide.capacity import claim_usage, combine, used_capacity, with_unknown
from gpuclaimctl.model.resources import pod_request
from gpuclaimctl.model.api import CLAIMS_ANNOTATION, UNKNOWN_RESOURCE

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"


def claim(name: str, count: int, node: str | None, phase: str = "Bound", cls: str = "a100",
          reserved: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if node:
        status["nodeName"] = node
    if reserved:
        status["reservedFor"] = [{"name": reserved, "uid": reserved}]
    return {"metadata": {"name": name, "uid": name}, "spec": {"className": cls, "count": count}, "status": status}


def container(gpus: int | str | None = None, limits_only: bool = False, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if gpus is not None:
        res["limits" if limits_only else "requests"] = {GPU: str(gpus)}
    return {"name": "c", "resources": res, **extra}


def gpu_pod(uid: str, node: str | None = "node-a", phase: str = "Running", containers: list[dict[str, Any]] | None = None,
            init: list[dict[str, Any]] | None = None, annotated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers if containers is not None else [container(2)]}
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = init
    annotations = {CLAIMS_ANNOTATION: "[]"} if annotated else {}
    return {"metadata": {"uid": uid, "annotations": annotations}, "spec": spec, "status": {"phase": phase}}


CLASSES = {"a100": GPU, "mi300": AMD}


def test_bound_claims_count_on_their_node_in_every_namespace() -> None:
    claims = [claim("a", 2, "node-a"), claim("b", 1, "node-a"), claim("c", 4, "node-b", cls="mi300"),
              claim("pending", 3, None, phase="Pending"), claim("lost", 3, "node-a", phase="Lost")]
    assert used_capacity(claims, [], CLASSES) == {GPU: {"node-a": 3}, AMD: {"node-b": 4}}


def test_a_lost_claim_still_reserved_by_a_pod_holds_its_gpus_on_its_node() -> None:
    # Its node went NotReady, but the pod may run there still and use them
    # when the node comes back: counting them is what prevents an overcommit.
    assert claim_usage(claim("lost", 3, "node-a", phase="Lost", reserved="pod-1"), CLASSES) == ("node-a", GPU, 3)
    assert claim_usage(claim("lost", 3, "node-a", phase="Lost"), CLASSES) is None


def test_an_unrecorded_claim_of_a_vanished_class_holds_an_unknown_resource() -> None:
    """Bound by a version that did not record status.resourceName, its
    class gone: not the default resource (a node could reach 8 of 4 of
    another one) but one nothing else is counted under."""
    assert claim_usage(claim("a", 2, "node-a", cls="gone"), CLASSES) == ("node-a", UNKNOWN_RESOURCE, 2)


def test_gpus_of_an_unknown_resource_count_under_every_resource_their_node_offers() -> None:
    allocatable = {"node-a": {GPU: 8, AMD: 4}, "node-b": {GPU: 8}}
    used = {UNKNOWN_RESOURCE: {"node-a": 2}, GPU: {"node-a": 1, "node-b": 3}}
    assert with_unknown(used, allocatable.get) == {
        UNKNOWN_RESOURCE: {"node-a": 2}, GPU: {"node-a": 3, "node-b": 3}, AMD: {"node-a": 2}}


def test_usage_without_unknown_gpus_is_returned_as_it_is() -> None:
    used: dict[str, Any] = {GPU: {"node-a": 1}}
    assert with_unknown(used, lambda node: {GPU: 8}) is used


@pytest.mark.parametrize(
    "pod, counted",
    [
        pytest.param(gpu_pod("p"), True, id="running"),
        pytest.param(gpu_pod("p", phase="Pending"), True, id="bound-not-started"),
        pytest.param(gpu_pod("p", phase="Succeeded"), False, id="succeeded"),
        pytest.param(gpu_pod("p", phase="Failed"), False, id="failed"),
        pytest.param(gpu_pod("p", node=None, phase="Pending"), False, id="not-scheduled"),
        pytest.param(gpu_pod("p", annotated=True), True, id="names-claims-but-none-reserves-it"),
    ],
)
def test_pods_without_claims_count_while_they_hold_their_node(pod: dict[str, Any], counted: bool) -> None:
    expected = {GPU: {"node-a": 2}} if counted else {}
    assert used_capacity([], [pod], CLASSES) == expected


def test_a_pod_its_claims_reserve_is_counted_through_the_claims_only() -> None:
    claims = [claim("a", 2, "node-a", reserved="p")]
    pods = [gpu_pod("p", annotated=True), gpu_pod("q")]
    assert used_capacity(claims, pods, CLASSES) == {GPU: {"node-a": 4}}


@pytest.mark.parametrize(
    "containers, init, expected",
    [
        pytest.param([container(1), container(2)], None, 3, id="containers-add-up"),
        pytest.param([container(2, limits_only=True)], None, 2, id="limits-stand-for-requests"),
        pytest.param([container(None)], None, 0, id="no-gpus"),
        pytest.param([container(1)], [container(3)], 3, id="bigger-init-container-wins"),
        pytest.param([container(4)], [container(3)], 4, id="bigger-app-container-wins"),
        pytest.param([container(1)], [container(1, restartPolicy="Always")], 2, id="sidecar-adds"),
        pytest.param([container(0)], [container(1, restartPolicy="Always"), container(2)], 3,
                     id="init-after-sidecar-runs-beside-it"),
    ],
)
def test_pod_request_follows_the_schedulers_arithmetic(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None, expected: int
) -> None:
    assert pod_request(gpu_pod("p", containers=containers, init=init), GPU) == expected


def test_combine_sums_without_changing_its_inputs() -> None:
    base = {GPU: {"node-a": 1, "node-b": 2}, AMD: {"node-a": 1}}
    extra = {GPU: {"node-a": 2, "node-c": 1}}
    out = combine(base, extra)
    assert out == {GPU: {"node-a": 3, "node-b": 2, "node-c": 1}, AMD: {"node-a": 1}}
    assert base[GPU] == {"node-a": 1, "node-b": 2}
    assert out[AMD] is base[AMD]
    assert combine() == {}


def test_a_bound_claim_counts_under_the_resource_recorded_at_bind_time() -> None:
    """Deleting its class, or changing the class's resourceName, must not
    move what a bound claim holds (issue 10, item 2)."""
    c = claim("a", 4, "node-a", cls="gone")
    c["status"]["resourceName"] = AMD
    assert claim_usage(c, CLASSES) == ("node-a", AMD, 4)
    c["spec"]["className"] = "a100"
    assert claim_usage(c, CLASSES) == ("node-a", AMD, 4)


def test_a_pods_requests_beyond_what_its_claims_hold_count_too() -> None:
    """Issue 10, item 8: the scheduler counts the pod's own requests."""
    claims = [claim("a", 2, "node-a", reserved="p")]
    pods = [gpu_pod("p", annotated=True, containers=[container(3)])]
    assert used_capacity(claims, pods, CLASSES) == {GPU: {"node-a": 3}}


def test_the_search_s_inlined_comparison_is_the_fits_rule() -> None:
    """placement's search inlines `fits` for speed: on random nodes, the set
    is placed on a node exactly when `fits` says some usable node fits."""
    import random
    from datetime import UTC, datetime

    from gpuclaimctl.decide.capacity import fits, free_on
    from gpuclaimctl.decide.placement import Placed, decide
    from gpuclaimctl.model.snapshot import ClaimState, ClassInfo, Cluster, NodeInfo, PodInfo

    rng = random.Random(7)
    now = datetime(2025, 1, 1, tzinfo=UTC)
    for _ in range(500):
        nodes = [NodeInfo(f"n{i}", allocatable={GPU: rng.choice([1, 2, 4, 8]), AMD: rng.choice([0, 2, 4])})
                 for i in range(rng.randint(1, 6))]
        used = {GPU: {n.name: rng.randint(0, 8) for n in nodes}, AMD: {n.name: rng.randint(0, 4) for n in nodes}}
        claims = [ClaimState("a", "ua", "a100", rng.randint(1, 4))]
        if rng.random() < 0.5:
            claims.append(ClaimState("m", "um", "mi300", rng.randint(1, 2)))
        need: dict[str, int] = {}
        for c in claims:
            r = GPU if c.class_name == "a100" else AMD
            need[r] = need.get(r, 0) + c.count
        cluster = Cluster(nodes, [ClassInfo("a100", GPU), ClassInfo("mi300", AMD)])
        d = decide(PodInfo("ns", "p", "u", now), claims, cluster, used, now)
        offering = [n for n in nodes if all(n.allocatable.get(r, 0) > 0 for r in need)]
        assert isinstance(d, Placed) == any(fits(need, free_on(n.allocatable, used, n.name)) for n in offering)
        if isinstance(d, Placed):
            node = cluster.nodes[d.node]
            assert fits(need, free_on(node.allocatable, used, node.name))
