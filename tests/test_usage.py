"""UsageTracker: GPUs in use per node, applied event by event.

The tracker must always agree with `capacity.used_capacity` over the
objects it was last shown; the randomized test checks that after every
event of many seeded sequences.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import pytest

from gpuclaimctl.decide.capacity import claim_usage, used_capacity
from gpuclaimctl.model.api import UNKNOWN_RESOURCE
from gpuclaimctl.state.usage import UsageTracker
from gpuclaimctl.state.view import ClusterView

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"
CLASSES = {"a100": GPU, "mi300": AMD}

Obj = dict[str, Any]


def claim(uid: str, count: int = 2, node: str | None = "node-a", phase: str | None = "Bound",
          cls: str = "a100", reserved: tuple[str, ...] = ()) -> Obj:
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
    if node:
        status["nodeName"] = node
    if reserved:
        status["reservedFor"] = [{"name": f"pod-{u}", "uid": u} for u in reserved]
    return {"metadata": {"name": f"claim-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"className": cls, "count": count}, "status": status}


def pod(uid: str, gpus: int = 1, node: str | None = "node-a", phase: str = "Running",
        resource: str = GPU) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "resources": {"requests": {resource: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": spec, "status": {"phase": phase}}


def normalized(usage: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Zero counts and empty per-resource maps mean the same as absent ones."""
    out = {r: {n: c for n, c in per_node.items() if c} for r, per_node in usage.items()}
    return {r: per_node for r, per_node in out.items() if per_node}


def tracker_for(classes: Mapping[str, str]) -> UsageTracker:
    t = UsageTracker()
    t.set_classes(classes)
    return t


@pytest.fixture
def tracker() -> UsageTracker:
    return tracker_for(CLASSES)


# --- behaviour, one case at a time ------------------------------------------------


def test_a_bound_claim_holds_its_count_on_its_node_for_its_class_resource(tracker: UsageTracker) -> None:
    tracker.set_claim(claim("c1", 2, "node-a"))
    tracker.set_claim(claim("c2", 4, "node-b", cls="mi300"))
    tracker.set_claim(claim("c3", 3, None, phase="Pending"))
    tracker.set_claim(claim("c4", 3, "node-a", phase="Lost"))
    assert normalized(tracker.totals) == {GPU: {"node-a": 2}, AMD: {"node-b": 4}}


def test_a_lost_claim_counts_while_a_pod_reserves_it_and_stops_when_the_reservation_goes(
        tracker: UsageTracker) -> None:
    tracker.set_pod(pod("p1", gpus=0))
    tracker.set_claim(claim("c1", 3, "node-a", phase="Lost", reserved=("p1",)))
    assert normalized(tracker.totals) == {GPU: {"node-a": 3}}
    tracker.set_claim(claim("c1", 3, "node-a", phase="Lost"))
    assert normalized(tracker.totals) == {}


def test_updating_a_claim_replaces_what_it_held(tracker: UsageTracker) -> None:
    tracker.set_claim(claim("c1", 2, "node-a"))
    tracker.set_claim(claim("c1", 2, "node-b"))
    assert normalized(tracker.totals) == {GPU: {"node-b": 2}}
    tracker.set_claim(claim("c1", 2, None, phase="Pending"))
    assert normalized(tracker.totals) == {}


def test_a_pod_a_claim_reserves_counts_once_whichever_arrives_first() -> None:
    claim_first, pod_first = tracker_for(CLASSES), tracker_for(CLASSES)
    claim_first.set_claim(claim("c1", 2, "node-a", reserved=("p1",)))
    claim_first.set_pod(pod("p1", gpus=2))
    pod_first.set_pod(pod("p1", gpus=2))
    pod_first.set_claim(claim("c1", 2, "node-a", reserved=("p1",)))
    assert normalized(claim_first.totals) == normalized(pod_first.totals) == {GPU: {"node-a": 2}}


def test_a_pod_counts_its_requests_beyond_its_claims_and_whole_when_they_go(tracker: UsageTracker) -> None:
    tracker.set_pod(pod("p1", gpus=3))
    tracker.set_claim(claim("c1", 1, "node-a", reserved=("p1",)))
    tracker.set_claim(claim("c2", 1, "node-a", reserved=("p1",)))
    assert normalized(tracker.totals) == {GPU: {"node-a": 3}}  # 2 claimed + 1 beyond them
    tracker.delete_claim("c1")
    assert normalized(tracker.totals) == {GPU: {"node-a": 3}}  # 1 claimed + 2 beyond
    tracker.set_claim(claim("c2", 1, "node-a"))  # reservation dropped, still bound
    assert normalized(tracker.totals) == {GPU: {"node-a": 4}}


@pytest.mark.parametrize(
    "the_pod",
    [
        pytest.param(pod("p1", phase="Succeeded"), id="succeeded"),
        pytest.param(pod("p1", phase="Failed"), id="failed"),
        pytest.param(pod("p1", node=None, phase="Pending"), id="no-node-name"),
        pytest.param(pod("p1", gpus=0), id="requests-no-gpus"),
    ],
)
def test_a_pod_that_holds_no_node_or_no_gpus_counts_nothing(tracker: UsageTracker, the_pod: Obj) -> None:
    tracker.set_pod(the_pod)
    assert normalized(tracker.totals) == {}


def test_a_pod_that_finishes_stops_counting_and_a_deleted_one_too(tracker: UsageTracker) -> None:
    tracker.set_pod(pod("p1", gpus=2))
    tracker.set_pod(pod("p2", gpus=1))
    tracker.set_pod(pod("p1", gpus=2, phase="Succeeded"))
    tracker.delete_pod("p2")
    tracker.delete_pod("never-seen")
    assert normalized(tracker.totals) == {}


def test_an_unrecorded_claim_of_a_class_the_tracker_does_not_know_counts_as_unknown(
    tracker: UsageTracker,
) -> None:
    tracker.set_claim(claim("c1", 2, "node-a", cls="vanished"))
    assert normalized(tracker.totals) == {UNKNOWN_RESOURCE: {"node-a": 2}}
    tracker.set_classes({**CLASSES, "vanished": AMD})  # recreated: its resource is known again
    assert normalized(tracker.totals) == {AMD: {"node-a": 2}}


def test_pods_count_for_every_extended_resource(tracker: UsageTracker) -> None:
    """Whichever class uses a resource now or later: no recount when classes change."""
    tracker.set_pod(pod("p1", gpus=2, resource=AMD))
    tracker.set_pod(pod("p2", gpus=1, resource="example.com/other"))  # no class uses it yet
    assert normalized(tracker.totals) == {AMD: {"node-a": 2}, "example.com/other": {"node-a": 1}}


# --- the invariant, over random event sequences ----------------------------------

NODES = ("node-a", "node-b", "node-c")
CLAIM_UIDS = tuple(f"c{i}" for i in range(6))
POD_UIDS = tuple(f"p{i}" for i in range(8))
CLASS_CHOICES = ("a100", "mi300", "vanished")
POD_RESOURCES = (GPU, AMD, "example.com/other")


def random_claim(rng: random.Random) -> Obj:
    c = claim(
        rng.choice(CLAIM_UIDS),
        count=rng.choice((1, 2, 3, 0)),
        node=rng.choice(NODES + (None,)),
        phase=rng.choice(("Bound", "Bound", "Pending", "Lost", None)),
        cls=rng.choice(CLASS_CHOICES),
        # Reservations may name pods never seen and the same pod twice.
        reserved=tuple(rng.choice(POD_UIDS + ("ghost",)) for _ in range(rng.choice((0, 0, 1, 1, 2)))),
    )
    if rng.random() < 0.5:
        c["status"]["resourceName"] = rng.choice((GPU, AMD, "example.com/other"))
    return c


def random_pod(rng: random.Random) -> Obj:
    p = pod(
        rng.choice(POD_UIDS),
        gpus=rng.choice((0, 1, 2, 4)),
        node=rng.choice(NODES + (None,)),
        phase=rng.choice(("Running", "Running", "Pending", "Succeeded", "Failed")),
        resource=rng.choice(POD_RESOURCES),
    )
    if rng.random() < 0.3:
        # A second container of another resource, and an init container that may dominate.
        p["spec"]["containers"].append(
            {"name": "d", "resources": {"limits": {rng.choice(POD_RESOURCES): str(rng.randint(1, 3))}}})
        p["spec"]["initContainers"] = [
            {"name": "i", "resources": {"requests": {rng.choice(POD_RESOURCES): str(rng.randint(0, 5))}}}]
    return p


@pytest.mark.parametrize("seed", range(60))
def test_totals_always_equal_used_capacity_of_the_objects_last_seen(seed: int) -> None:
    rng = random.Random(seed)
    classes: dict[str, str] = dict(CLASSES)
    tracker = tracker_for(classes)
    claims: dict[str, Obj] = {}
    pods: dict[str, Obj] = {}
    history: list[str] = []
    for step in range(250):
        roll = rng.random()
        if roll < 0.3:
            c = random_claim(rng)
            claims[c["metadata"]["uid"]] = c
            tracker.set_claim(c)
            history.append(f"set_claim {c['metadata']['uid']} {c['spec']} {c['status']}")
        elif roll < 0.4:
            uid = rng.choice(CLAIM_UIDS)
            claims.pop(uid, None)
            tracker.delete_claim(uid)
            history.append(f"delete_claim {uid}")
        elif roll < 0.75:
            p = random_pod(rng)
            pods[p["metadata"]["uid"]] = p
            tracker.set_pod(p)
            history.append(f"set_pod {p['metadata']['uid']} {p['spec']} {p['status']}")
        elif roll < 0.85:
            uid = rng.choice(POD_UIDS)
            pods.pop(uid, None)
            tracker.delete_pod(uid)
            history.append(f"delete_pod {uid}")
        elif roll < 0.88:
            # Classes change their resource or go.
            classes = rng.choice(({"a100": GPU, "mi300": AMD},
                                  {"a100": GPU, "mi300": "example.com/other"},
                                  {"a100": AMD}))
            tracker.set_classes(classes)
            history.append(f"set_classes {classes}")
        else:
            continue
        want = normalized(used_capacity(claims.values(), pods.values(), classes))
        assert normalized(tracker.totals) == want, (
            f"seed {seed} step {step}; last events:\n" + "\n".join(history[-8:]))
    # Deleting everything leaves nothing behind.
    for uid in list(claims):
        tracker.delete_claim(uid)
    for uid in list(pods):
        tracker.delete_pod(uid)
    assert normalized(tracker.totals) == {}


@pytest.mark.parametrize("seed", range(20))
def test_the_views_budget_sums_always_equal_the_claims_last_seen_summed_afresh(seed: int) -> None:
    """ClusterView keeps what counts against budgets per namespace and class
    as claims come and go; a decision reads it whole. It must equal the sum
    over the claims that hold GPUs (claim_usage), whatever the order."""
    rng = random.Random(seed)
    view = ClusterView(lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))
    claims: dict[str, Obj] = {}
    for step in range(200):
        if rng.random() < 0.75:
            c = random_claim(rng)
            c["metadata"]["namespace"] = rng.choice(("ns", "other"))
            old = claims.get(c["metadata"]["name"])
            if old is not None and rng.random() < 0.3:
                c["metadata"]["uid"] += f"-again{step}"  # recreated under the name
            view.apply_claim(old, c)
            claims[c["metadata"]["name"]] = c
        elif claims:
            name = rng.choice(sorted(claims))
            view.delete_claim(claims.pop(name))
        for ns in ("ns", "other"):
            want: dict[str, int] = {}
            for c in claims.values():
                if c["metadata"]["namespace"] == ns and claim_usage(c, {}) is not None:
                    cls = c["spec"]["className"]
                    want[cls] = want.get(cls, 0) + c["spec"]["count"]
            assert dict(view.budget_use(ns).bound) == want, f"seed {seed} step {step} {ns}"
