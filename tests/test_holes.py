"""The holes of issue 43, one scripted story each, with the real handlers
and syncs against the in-memory API (tests/sim): a class's resource edited
under a bound claim, claims bound before `status.resourceName`, and a
refused bare pod whose annotation was edited after its release."""

from __future__ import annotations

import json
from typing import Any

from gpuclaimctl.client.errors import ApiError
from gpuclaimctl.model import api
from tests.sim.fakeapi import CLAIMS, CLASSES, NODES, PODS
from tests.sim.harness import NS, RESOURCE
from tests.test_sync_scenarios import Story, settle_refusal

Obj = dict[str, Any]
R1 = RESOURCE
R2 = "example.com/other-gpu"


class TwoResources(Story):
    """Node n0 offers R1=4 and R2=4; class b counts R1, class a R2."""

    def _setup_cluster(self) -> None:
        self.fake.create(NODES, {
            "metadata": {"name": "n0"},
            "status": {"allocatable": {R1: "4", R2: "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        self.fake.create(CLASSES, {"metadata": {"name": "a"}, "spec": {"resourceName": R2}})
        self.fake.create(CLASSES, {"metadata": {"name": "b"}, "spec": {"resourceName": R1}})

    def bound(self, node: str, resource: str) -> int:
        return sum(c["spec"]["count"] for c in self.fake.list(CLAIMS).items
                   if (c.get("status") or {}).get("phase") == "Bound"
                   and c["status"].get("nodeName") == node and c["status"].get("resourceName") == resource)

    def place(self, name: str, entries: list[dict[str, Any]]) -> None:
        self.pod(name, entries)
        self.see_all()
        self.sync(f"pod:{NS}/{name}")
        self.see_all()
        self.sync(f"pod:{NS}/{name}")
        self.see_all()

    def edit_class(self, name: str, resource: str) -> None:
        self.fake.patch(CLASSES, "", name, lambda c: c["spec"].update(resourceName=resource))


def _retain_claim(s: Story, name: str, cls: str, count: int) -> None:
    s.fake.create(CLAIMS, {"metadata": {"name": name, "namespace": NS},
                           "spec": {"className": cls, "count": count, "reclaimPolicy": "Retain"}})


def test_a_kept_claim_keeps_the_resource_it_was_bound_with_when_its_class_is_edited() -> None:
    """Item 1: claim d (class b, R1) holds n0's 4 R1; a Retain claim of
    class a holds n0's 4 R2, its pod gone. An admin edits class a to R1.
    The next pod naming the Retain claim keeps it on n0 -- under R2, as
    bound: rewriting it to R1 made n0 hold 8 R1 of 4."""
    s = TwoResources(nodes=())
    s.place("pd", [{"name": "g", "className": "b", "count": 4}])
    _retain_claim(s, "keep", "a", 4)
    s.place("p1", [{"name": "g", "claim": "keep"}])
    assert s.bound("n0", R1) == 4 and s.bound("n0", R2) == 4
    s.fake.delete(PODS, NS, "p1")
    s.see_all()
    s.sync(f"claim:{NS}/keep")
    s.see_all()
    keep = s.fake.get(CLAIMS, NS, "keep")
    assert keep is not None and keep["status"]["phase"] == "Bound" and not keep["status"].get("reservedFor")

    s.edit_class("a", R1)
    s.place("p2", [{"name": "g", "claim": "keep"}])
    assert s.bound("n0", R1) == 4
    keep = s.fake.get(CLAIMS, NS, "keep")
    assert keep is not None and keep["status"]["resourceName"] == R2
    assert not s.gated("p2")  # it keeps its GPUs: released
    s.drain()
    s.check_quiet()


def test_a_claim_in_flight_under_the_old_resource_keeps_it_when_the_class_is_edited() -> None:
    """Item 1, in flight: p's bind under R2 is answered but not seen back,
    its release is refused (the pod changed), the class is edited to R1
    and seen; p's next sync keeps the claim where the in-flight entry
    counts it -- under R2."""
    s = TwoResources(nodes=())
    s.place("pd", [{"name": "g", "className": "b", "count": 4}])
    s.pod("p", [{"name": "g", "className": "a", "count": 4}])
    s.see_all()
    s.fake.inject("patch_pod", ApiError(409, "Conflict", "the pod changed"), landed=False)
    s.sync(f"pod:{NS}/p")   # makes the claim, binds it under R2; the release is refused
    assert s.gated("p") and s.ctl.view.in_flight(s.fake.get(CLAIMS, NS, "p-g")["metadata"]["uid"])
    s.edit_class("a", R1)
    s.ctl.informers[CLASSES].deliver(10)
    s.ctl.informers[PODS].deliver(10)   # the claim's bind is not seen yet
    s.sync(f"pod:{NS}/p")
    s.see_all()
    assert s.bound("n0", R1) == 4 and s.bound("n0", R2) == 4
    claim = s.fake.get(CLAIMS, NS, "p-g")
    assert claim is not None and claim["status"]["resourceName"] == R2
    s.drain()
    s.check_quiet()


def _legacy_bound(s: Story, name: str, cls: str, count: int, node: str = "n0",
                  pod: Obj | None = None) -> None:
    """A claim bound by a version that did not record status.resourceName."""
    claim = s.fake.create(CLAIMS, {
        "metadata": {"name": name, "namespace": NS, "finalizers": [api.CLAIM_FINALIZER]},
        "spec": {"className": cls, "count": count, "reclaimPolicy": "Retain"}})
    claim["status"] = {"phase": "Bound", "nodeName": node}
    if pod is not None:
        claim["status"]["reservedFor"] = [{"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
    s.fake.update_claim_status(claim)


def test_an_unrecorded_claim_whose_class_is_gone_keeps_its_node_from_taking_anything() -> None:
    """Item 2: a Retain claim bound before status.resourceName, its class
    deleted before any sync recorded it. Its node takes no new placement
    of any resource until something tells which it holds; the claim says
    so; recreating the class records it and lets the node work again."""
    s = TwoResources(nodes=())
    _legacy_bound(s, "old", "gone", 4)
    s.pod("p1", [{"name": "g", "className": "b", "count": 4}])   # R1: n0 has 4 free of it
    s.pod("p2", [{"name": "g", "className": "a", "count": 1}])   # R2
    s.see_all()
    s.sync(f"claim:{NS}/old")
    s.see_all()
    old = s.fake.get(CLAIMS, NS, "old")
    assert old is not None
    cond = next(c for c in old["status"]["conditions"] if c["type"] == api.CONDITION_RESOURCE_UNKNOWN)
    assert cond["status"] == "True" and "recreate the GPUClass" in cond["message"]
    for p in ("p1", "p2"):
        s.sync(f"pod:{NS}/{p}")
        s.see_all()
        assert s.gated(p)

    s.fake.create(CLASSES, {"metadata": {"name": "gone"}, "spec": {"resourceName": R2}})
    s.see_all()
    s.sync(f"claim:{NS}/old")
    s.see_all()
    old = s.fake.get(CLAIMS, NS, "old")
    assert old is not None and old["status"]["resourceName"] == R2
    assert not any(c["type"] == api.CONDITION_RESOURCE_UNKNOWN for c in old["status"].get("conditions") or ())
    s.drain()
    assert not s.gated("p1")   # R1 is free on n0
    assert s.gated("p2")       # R2 is all the old claim's
    s.check_quiet()


def test_an_unrecorded_claim_whose_class_is_gone_records_the_resource_its_pod_requests() -> None:
    """Item 2, next best evidence: the pod that reserves it requests R2."""
    s = TwoResources(nodes=())
    pod = s.fake.create(PODS, {
        "metadata": {"name": "runner", "namespace": NS,
                     "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "claim": "old"}])}},
        "spec": {"nodeName": "n0", "containers": [
            {"name": "c", "resources": {"requests": {R2: "2"}, "limits": {R2: "2"}}}]}})
    _legacy_bound(s, "old", "gone", 2, pod=pod)
    s.see_all()
    s.sync(f"claim:{NS}/old")
    s.see_all()
    old = s.fake.get(CLAIMS, NS, "old")
    assert old is not None and old["status"]["resourceName"] == R2
    assert s.ctl.view.used().get(R2, {}).get("n0") == 2
    assert s.ctl.view.used().get(R1, {}).get("n0", 0) == 0


def test_an_unrecorded_claim_counts_on_every_resource_of_its_node_before_any_sync() -> None:
    """Item 2, at start: before the first claim sync, the decision already
    counts the claim under every resource its node offers."""
    s = TwoResources(nodes=())
    _legacy_bound(s, "old", "gone", 3)
    s.see_all()
    used = s.ctl.view.used()
    assert used[R1]["n0"] == 3 and used[R2]["n0"] == 3


def test_a_refused_bare_pod_whose_annotation_was_edited_after_release_lets_go_of_its_claims() -> None:
    """Also found: the refusal is judged on the claims the pod was released
    with (those that reserve it), not on what its edited annotation names."""
    s = Story(nodes=(4,))
    s.pod("bare", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    for _ in range(2):
        s.sync(f"pod:{NS}/bare")
        s.see_all()
    assert not s.gated("bare")
    s.fake.patch(PODS, NS, "bare", lambda p: p["metadata"]["annotations"].update(
        {api.CLAIMS_ANNOTATION: json.dumps([{"name": "other", "className": "alpha", "count": 1}])}))
    s.fake.mark_unschedulable(NS, "bare", "0/1 nodes are available")
    s.see_all()
    settle_refusal(s, f"pod:{NS}/bare")
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and not claim["status"].get("reservedFor")
    assert any(e.reason == "NodeRefused" for e in s.fake.events)


def test_a_set_larger_than_any_node_is_unsatisfiable_until_a_large_enough_node_appears() -> None:
    """Issue 45 item 1: 12 GPUs where the largest node has 8 is not a wait
    for Capacity: its own reason and event; a node large enough turns it
    back into an ordinary wait (the node's event wakes it) and places it."""
    s = Story(nodes=(8, 4))
    s.pod("big", [{"name": "g", "className": "alpha", "count": 12}])
    s.see_all()
    s.sync(f"pod:{NS}/big")
    s.see_all()
    claim = s.fake.get(CLAIMS, NS, "big-g")
    assert claim is not None
    waiting = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    assert waiting["reason"] == "Unsatisfiable", waiting
    assert "no node it may use has that many allocatable (the largest: 8" in waiting["message"]
    assert [e.reason for e in s.fake.events if e.type == "Warning"] == ["Unsatisfiable"]
    s.node("n9", 16)
    s.see_all()   # the node's event wakes the pod
    assert f"pod:{NS}/big" in s.ctl.queue.ready
    s.sync(f"pod:{NS}/big")
    assert not s.gated("big")


def test_a_claim_kept_by_its_in_flight_entry_stays_counted_while_its_bind_is_written_again() -> None:
    """Simulation seed 3203: p's first bind of a shared claim is refused
    (409) at its finalizer; the next sync keeps the claim where that entry
    counts it and writes the bind again; meanwhile the claim's own sync
    reads it live (still at the old version: the refused write did not
    land) and settled the entry away. The new bind then landed counted
    nowhere until the informer showed it: n0's 4 GPUs were free for
    another pod."""
    s = Story(nodes=(4,))
    s.claim("shared", 4)
    s.pod("p", [{"name": "g", "claim": "shared"}])
    s.pod("q", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.fake.inject("update_claim", ApiError(409, "Conflict", "the object has been modified"), landed=False)
    s.sync(f"pod:{NS}/p")
    assert s.gated("p")

    def meanwhile() -> None:
        s.sync(f"claim:{NS}/shared")   # a live read: the refused write did not land
        s.sync(f"pod:{NS}/q")          # must not take n0's GPUs
    s.at_write("update_claim", meanwhile)
    s.sync(f"pod:{NS}/p")
    s.check_always("after the second bind")
    assert s.bound_on("n0") <= 4
    assert s.gated("q")
    s.drain()
    s.check_quiet()
