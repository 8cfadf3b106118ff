from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuclaimctl.model.api import CLAIMS_ANNOTATION
from gpuclaimctl.state.inflight import InFlightPlacements
from gpuclaimctl.decide.capacity import claim_usage, combine, pod_request, used_capacity

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def inflight(clock: FakeClock) -> InFlightPlacements:
    return InFlightPlacements(ttl=30.0, clock=clock)


def test_a_placement_counts_against_its_node_until_the_informer_shows_it_bound_there(
    inflight: InFlightPlacements,
) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    inflight.add("c2", "node-a", GPU, 1)
    assert inflight.usage() == {GPU: {"node-a": 3}}
    inflight.observe("c1", "Pending", None)  # an older version of the claim
    assert inflight.usage() == {GPU: {"node-a": 3}}
    inflight.observe("c1", "Bound", "node-a")
    assert inflight.usage() == {GPU: {"node-a": 1}}


def test_an_older_bound_version_on_another_node_does_not_end_a_move(inflight: InFlightPlacements) -> None:
    # The claim is moving from node-b to node-a; the informer still shows node-b.
    inflight.add("c1", "node-a", GPU, 2)
    inflight.observe("c1", "Bound", "node-b")
    assert inflight.usage() == {GPU: {"node-a": 2}}


def test_a_deleted_claim_holds_nothing(inflight: InFlightPlacements) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    inflight.observe_claim({"metadata": {"uid": "c1"}, "status": {"phase": "Pending"}}, deleted=True)
    assert inflight.usage() == {}


def test_observe_claim_reads_a_raw_claim(inflight: InFlightPlacements) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    inflight.observe_claim({"metadata": {"uid": "c1"}, "status": {"phase": "Bound", "nodeName": "node-a"}})
    assert len(inflight) == 0
    inflight.observe_claim(None)  # tombstone without an object: harmless


def test_a_placement_expires_after_the_ttl(inflight: InFlightPlacements, clock: FakeClock) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    clock.now += 29.9
    assert inflight.get("c1") is not None
    assert inflight.usage() == {GPU: {"node-a": 2}}
    clock.now += 0.1
    assert inflight.get("c1") is None
    assert inflight.usage() == {}
    assert len(inflight) == 0


def test_forget_drops_a_failed_write(inflight: InFlightPlacements) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    inflight.forget("c1")
    inflight.forget("never-added")
    assert inflight.usage() == {}


def test_adding_again_replaces_and_renews(inflight: InFlightPlacements, clock: FakeClock) -> None:
    inflight.add("c1", "node-a", GPU, 2)
    clock.now += 20
    inflight.add("c1", "node-b", GPU, 2)
    clock.now += 20
    assert inflight.usage() == {GPU: {"node-b": 2}}


def test_usage_can_leave_out_the_set_being_decided(inflight: InFlightPlacements) -> None:
    inflight.add("mine", "node-a", GPU, 2)
    inflight.add("other", "node-a", AMD, 1)
    assert inflight.usage(exclude={"mine"}) == {AMD: {"node-a": 1}}


def test_concurrent_adds_and_observes_keep_a_consistent_count(inflight: InFlightPlacements) -> None:
    def worker(w: int) -> None:
        for i in range(200):
            uid = f"{w}-{i}"
            inflight.add(uid, "node-a", GPU, 1)
            if i % 2:
                inflight.observe(uid, "Bound", "node-a")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inflight.usage() == {GPU: {"node-a": 8 * 100}}


# --- used capacity --------------------------------------------------------


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


def test_a_claim_of_a_vanished_class_still_holds_default_gpus() -> None:
    assert claim_usage(claim("a", 2, "node-a", cls="gone"), CLASSES) == ("node-a", GPU, 2)


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


def test_a_new_claim_without_a_phase_keeps_its_in_flight_placement() -> None:
    """The creation event of a template claim can arrive after its placement
    was decided; a claim with no phase yet is Pending, not gone."""
    flight = InFlightPlacements(ttl=60.0, clock=lambda: 0.0)
    flight.add("u1", "n1", "nvidia.com/gpu", 2)
    flight.observe_claim({"metadata": {"uid": "u1"}, "spec": {"count": 2}})
    assert flight.usage() == {"nvidia.com/gpu": {"n1": 2}}
    flight.observe_claim({"metadata": {"uid": "u1"}, "status": {"phase": "Bound", "nodeName": "n1"}})
    assert flight.usage() == {}
