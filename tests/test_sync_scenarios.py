"""The interleavings of issue 10, one scripted story each, with the real
handlers and syncs against the in-memory API (tests/sim): no API server,
each step chosen by the test. Names follow the issue's items."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpuclaimctl.client.errors import ApiError
from gpuclaimctl.decide.capacity import used_capacity
from gpuclaimctl.model import api
from gpuclaimctl.sync.pods import REFUSAL_SETTLE, SCHEDULER_RETRY
from tests.sim.fakeapi import CLAIMS, CLASSES, NODES, PODS, TEMPLATES, _Part, lost_answer
from tests.sim.harness import NS, RESOURCE, Sim

Obj = dict[str, Any]


NODE_AGE = 3600.0


class Story(Sim):
    """A Sim with no random schedule: the test says what happens."""

    def __init__(self, nodes: tuple[int, ...] = (4,)) -> None:
        super().__init__(seed=0, steps=0, nodes=nodes)
        self.fake.before_write = None

    def _setup_cluster(self) -> None:
        # Nodes there long before the story starts: a refusal on a node that
        # just changed waits for kube-scheduler's retry (SCHEDULER_RETRY).
        self.t -= NODE_AGE
        for i, gpus in enumerate(self.nodes):
            self.node(f"n{i}", gpus)
        self.t += NODE_AGE
        self._create_class("alpha")

    def node(self, name: str, gpus: int) -> Obj:
        return self.fake.create(NODES, {
            "metadata": {"name": name},
            "status": {"allocatable": {RESOURCE: str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}})

    def pod(self, name: str, entries: list[dict[str, Any]], *, owned: bool = True) -> Obj:
        meta: Obj = {"name": name, "namespace": NS,
                     "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries)}}
        if owned:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                        "uid": "rs-uid", "controller": True}]
        self.t += 1.0  # creation order is age order
        return self.fake.create(PODS, {"metadata": meta, "spec": {
            "schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}]}})

    def claim(self, name: str, count: int, cls: str = "alpha") -> Obj:
        return self.fake.create(CLAIMS, {"metadata": {"name": name, "namespace": NS},
                                         "spec": {"className": cls, "count": count}})

    def see_all(self) -> None:
        for inf in self.ctl.informers.values():
            inf.deliver(10_000)

    def sync(self, key: str) -> None:
        self.ctl.queue.ready.pop(key, None)
        self.ctl.sync(key)

    def gated(self, name: str) -> bool:
        pod = self.fake.get(PODS, NS, name)
        return pod is not None and bool(pod["spec"].get("schedulingGates"))

    def bound_on(self, node: str) -> int:
        return sum(c["spec"]["count"] for c in self.fake.list(CLAIMS).items
                   if (c.get("status") or {}).get("phase") == "Bound"
                   and c["status"].get("nodeName") == node)

    def at_write(self, method: str, then: Callable[[], None]) -> None:
        """Run `then` inside the next `method` write, once."""
        def hook(m: str, _body: Obj) -> None:
            if m == method:
                self.fake.before_write = None
                then()
        self.fake.before_write = hook


def test_a_user_claim_named_by_two_gated_pods_never_overcommits_a_node() -> None:
    """Item 1: P1 decides n1 for the shared claim; P2 is synced while P1's
    bind is on the wire; P3 (4 inline GPUs) comes next with no watch event
    delivered: n1 must count the shared claim whatever won."""
    s = Story(nodes=(4,))
    s.claim("shared", 4)
    s.pod("p1", [{"name": "g", "claim": "shared"}])
    s.pod("p2", [{"name": "g", "claim": "shared"}])
    s.pod("p3", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.at_write("update_claim_status", lambda: s.sync("pod:team/p2"))
    s.sync("pod:team/p1")
    s.sync("pod:team/p3")
    s.sync("pod:team/p3")
    assert s.bound_on("n0") <= 4
    assert s.gated("p3")
    s.drain()
    s.check_quiet()


def test_deleting_a_class_keeps_counting_the_gpus_its_claims_hold() -> None:
    """Item 2: a bound claim counts under the resource recorded at bind time."""
    s = Story(nodes=(4,))
    s._create_class("beta")
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/p1")
    s.see_all()
    assert s.bound_on("n0") == 4
    s.fake.delete(CLASSES, "", "alpha")
    s.pod("p2", [{"name": "g", "className": "beta", "count": 4}])
    s.see_all()
    s.sync("pod:team/p2")
    assert s.gated("p2") and s.bound_on("n0") == 4


def test_a_claim_recreated_under_its_name_during_a_watch_gap_leaks_no_gpus() -> None:
    """Item 4: the relist hands the handlers update(old, new) with another uid."""
    s = Story(nodes=(4,))
    s.claim("mine", 4)
    s.pod("p1", [{"name": "g", "claim": "mine"}])
    s.see_all()
    s.sync("pod:team/p1")
    s.see_all()
    # While the watch is away: the pod and the claim go, a new claim of that name comes.
    s.fake.delete(PODS, NS, "p1")
    s.fake.finish_pod_deletion(NS, "p1") if s.fake.get(PODS, NS, "p1") else None
    claim = s.fake.get(CLAIMS, NS, "mine")
    assert claim is not None
    claim["metadata"]["finalizers"] = []
    s.fake.update(CLAIMS, claim)
    if s.fake.get(CLAIMS, NS, "mine") is not None:
        s.fake.delete(CLAIMS, NS, "mine")
    s.claim("mine", 2)
    for inf in s.ctl.informers.values():
        inf.relist()
    assert _normalized(s.ctl.view.used()) == {}
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/p2")
    assert not s.gated("p2")


def test_a_pod_recreated_under_its_name_during_a_watch_gap_is_told_why_it_waits_again() -> None:
    """One Warning per change of reason is remembered per pod, not per name:
    the new pod, seen as an update with another uid, waits for the same
    reason as the old one and must be told so too."""
    s = Story(nodes=(4,))
    bad = [{"name": "g"}]  # no source: InvalidClaims
    s.pod("p1", bad)
    s.see_all()
    s.sync("pod:team/p1")
    assert [e.reason for e in s.fake.events] == ["InvalidClaims"]
    s.fake.delete(PODS, NS, "p1")  # gated: gone at once
    s.pod("p1", bad)
    s.ctl.informers[PODS].relist()  # update(old, new) with another uid
    s.sync("pod:team/p1")
    assert [e.reason for e in s.fake.events] == ["InvalidClaims", "InvalidClaims"]


def test_a_template_the_api_server_will_not_make_a_claim_of_is_told_after_a_missing_one() -> None:
    """Both are ClaimMissing: the pod was told the template did not exist,
    and must be told again, and why, when it exists but its claim is
    refused -- else its only event says something false for good."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "template": "t-x"}])
    s.see_all()
    s.sync("pod:team/p")
    assert [e.reason for e in s.fake.events] == ["ClaimMissing"]
    assert "does not exist" in s.fake.events[-1].message
    s.fake.create(TEMPLATES, {"metadata": {"name": "t-x", "namespace": NS},
                              "spec": {"spec": {"className": "alpha", "count": 1}}})
    s.see_all()
    s.fake.inject("create_claim", ApiError(422, "Invalid", 'metadata.labels: Invalid value: "bad key!"'),
                  landed=False)
    s.sync("pod:team/p")
    assert [e.reason for e in s.fake.events] == ["ClaimMissing", "ClaimMissing"]
    assert "the API server refused to create GPUClaim" in s.fake.events[-1].message
    assert 'Invalid value: "bad key!"' in s.fake.events[-1].message
    # Woken again (GPUs freed elsewhere, say): the same body is not sent
    # again to be refused again; a changed template makes another one.
    sent: list[str] = []
    s.fake.before_write = lambda m, _b: sent.append(m) if m == "create_claim" else None
    s.sync("pod:team/p")
    assert sent == [] and s.gated("p")
    s.fake.patch(TEMPLATES, NS, "t-x", lambda o: o["spec"]["spec"].update(count=2))
    s.see_all()
    s.sync("pod:team/p")
    assert sent == ["create_claim"] and not s.gated("p")


def test_each_claim_the_api_server_refuses_to_create_is_told_by_name() -> None:
    """A quota refuses a set's first claim, then (raised by one) its second:
    the second refusal is told too, or the pod's latest warning (which
    `why` reads) would name a claim that exists."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "a", "className": "alpha", "count": 1},
                {"name": "b", "className": "alpha", "count": 1}])
    s.see_all()
    quota = ApiError(403, "Forbidden", "exceeded quota: claims, requested: count/gpuclaims.gpuclaimctl.io=1")
    s.fake.inject("create_claim", quota, landed=False)
    s.sync("pod:team/p")
    s.fake.before_write = lambda m, body: s.fake.inject("create_claim", quota, landed=False) \
        if m == "create_claim" and body["metadata"]["name"] == "p-b" else None
    s.sync("pod:team/p")
    assert s.fake.get(CLAIMS, NS, "p-a") is not None and s.fake.get(CLAIMS, NS, "p-b") is None
    told = [e.message for e in s.fake.events if e.reason == "ClaimMissing"]
    assert len(told) == 2, told
    assert "'p-a'" in told[0] and "'p-b'" in told[1]


def test_a_quota_with_room_again_retries_at_once_the_pods_it_refused() -> None:
    """Room in a quota is no event of the pod's, whose backoff reaches
    1,000 s: the quota's own update (a limit raised, less used) or delete
    syncs the gated pods of its namespace it refused, and only those."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "a", "className": "alpha", "count": 1}])
    s.pod("big", [{"name": "a", "className": "alpha", "count": 8}])  # waits for Capacity
    s.see_all()
    s.fake.inject("create_claim", ApiError(403, "Forbidden", "exceeded quota: q"), landed=False)
    s.sync("pod:team/p")
    s.sync("pod:team/big")
    s.ctl.queue.ready.clear()

    def quota(hard: str, used: str) -> dict[str, Any]:
        return {"metadata": {"name": "q", "namespace": NS},
                "spec": {"hard": {"count/gpuclaims.gpuclaimctl.io": hard}},
                "status": {"hard": {"count/gpuclaims.gpuclaimctl.io": hard},
                           "used": {"count/gpuclaims.gpuclaimctl.io": used}}}

    s.ctl.handlers.quota_updated(quota("1", "0"), quota("1", "1"))  # more used: no room
    s.ctl.handlers.quota_updated(quota("1", "1"), quota("1", "1"))  # a resync
    assert not s.ctl.queue.ready
    s.ctl.handlers.quota_updated(quota("1", "1"), quota("2", "1"))  # raised
    assert list(s.ctl.queue.ready) == ["pod:team/p"]
    s.ctl.queue.ready.clear()
    s.ctl.handlers.quota_updated(quota("2", "2"), quota("2", "1"))  # less used
    s.ctl.handlers.quota_deleted(quota("2", "1"))
    assert list(s.ctl.queue.ready) == ["pod:team/p"]
    s.ctl.queue.ready.clear()
    s.ctl.handlers.quota_updated(
        quota("1", "1"), {**quota("1", "1"), "metadata": {"name": "q", "namespace": "elsewhere"},
                          "spec": {"hard": {}}})  # another namespace's
    assert not s.ctl.queue.ready
    s.sync("pod:team/p")
    assert not s.gated("p")


def test_an_in_flight_bind_counts_until_the_watch_shows_it_however_long_that_takes() -> None:
    """Item 5: no time-to-live; the watch lags ten minutes."""
    s = Story(nodes=(4,))
    s.claim("mine", 4)
    s.pod("p1", [{"name": "g", "claim": "mine"}])
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/p1")  # adds the finalizer, then binds
    s.t += 600
    # The watch shows the finalizer's version, not the bind's yet.
    s.ctl.informers[CLAIMS].deliver(1)
    s.sync("pod:team/p2")
    assert s.gated("p2") and s.bound_on("n0") == 4


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_a_bind_whose_answer_was_lost_counts_until_its_fate_is_known(landed: bool) -> None:
    s = Story(nodes=(4,))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 4}])
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.fake.inject("update_claim_status", lost_answer(), landed=landed)
    s.sync("pod:team/p1")  # creates the claim, binds: the answer is lost
    s.ctl.informers[CLAIMS].deliver(2)  # the creation and the finalizer
    s.sync("pod:team/p2")
    assert s.gated("p2")
    s.drain()
    s.check_quiet()
    assert s.bound_on("n0") == 4


@pytest.mark.parametrize("first_bind", ["answered", "answer lost"])
def test_a_set_whose_node_went_invalid_moves_only_once_its_earlier_bind_is_seen(first_bind: str) -> None:
    """The set's first sync binds c1 on n0 and fails before the release:
    c2's write refused (409: someone changed c2), or c1's bind answer lost
    after it landed. n0 is cordoned while the claim watch lags. Deciding
    the set again, c1 still counts on n0: moving it to n1 then would replace
    that count while c1 is Bound on n0, and a pod asking n0's two GPUs would
    overcommit it once n0 is uncordoned. The move waits until the watch
    shows what c1's bind did."""
    s = Story(nodes=(2, 4))  # binpack prefers n0 for the 2-GPU set
    s.claim("c1", 1)
    s.claim("c2", 1)
    s.pod("p", [{"name": "a", "claim": "c1"}, {"name": "b", "claim": "c2"}])
    s.see_all()

    def cordon() -> None:
        s.fake.patch(NODES, "", "n0", lambda o: o.setdefault("spec", {}).update(unschedulable=True))
        s.ctl.informers[NODES].deliver(10_000)

    def meanwhile(m: str, _body: Obj) -> None:
        if m != "update_claim" or not s.bound_on("n0"):
            return  # c1's finalizer; c2's comes after c1's bind
        s.fake.before_write = None
        s.fake.patch(CLAIMS, NS, "c2", lambda o: o["metadata"].setdefault("labels", {}).update(x="y"))
        cordon()

    if first_bind == "answered":
        s.fake.before_write = meanwhile
    else:
        s.fake.inject("update_claim_status", lost_answer(), landed=True)
    s.sync("pod:team/p")  # fails before the release, to be retried
    if first_bind == "answered":
        assert s.fake.before_write is None, "the story did not happen as written"
    else:
        cordon()
    assert s.bound_on("n0") == 1 and s.gated("p")
    s.sync("pod:team/p")  # the claim watch still lags: c1 must stay counted on n0
    assert s.ctl.view.used().get(RESOURCE, {}).get("n0", 0) >= 1
    assert s.gated("p") and s.bound_on("n1") == 0
    s.fake.patch(NODES, "", "n0", lambda o: o["spec"].update(unschedulable=False))
    s.ctl.informers[NODES].deliver(10_000)
    s.pod("q", [{"name": "g", "className": "alpha", "count": 2}])
    s.ctl.informers[PODS].deliver(10_000)
    s.sync("pod:team/q")
    s.sync("pod:team/q")
    assert s.bound_on("n0") <= 2
    s.drain()
    s.check_quiet()
    assert s.bound_on("n0") <= 2 and not s.gated("p") and not s.gated("q")


def test_a_claim_deleted_between_the_cache_read_and_the_decision_is_not_counted_for_good() -> None:
    """The set's inline claim is being created when the user deletes the
    user claim of the set and the informer shows it; the decision, made from
    what the sync read before, records a placement for the dead claim. No
    version of it will ever end that entry: it must count nothing (I4)."""
    s = Story(nodes=(4,))
    s.claim("u", 2)
    s.pod("p", [{"name": "x", "claim": "u"}, {"name": "y", "className": "alpha", "count": 1}])
    s.see_all()

    def user_deletes() -> None:
        s.fake.delete(CLAIMS, NS, "u")
        s.see_all()

    s.at_write("create_claim", user_deletes)
    s.sync("pod:team/p")
    s.pod("q", [{"name": "g", "className": "alpha", "count": 4}])
    s.drain()
    s.check_quiet()
    assert not s.gated("q")


def test_a_takeover_counts_a_claim_its_cache_shows_bound_at_an_older_version() -> None:
    """The standby's cache shows a claim bound on n0 at an old version; the
    consistent list shows it bound on n0 again after it was freed. Taken as
    counted already, the freeing version, replayed by the informer, left
    the GPU counted by no one until the rebind showed (an undercount the
    simulation found: seed 201203)."""
    from tests.sim.harness import Controller

    s = Story(nodes=(4,))
    s.claim("shared", 1)
    s.pod("p1", [{"name": "e", "claim": "shared"}], owned=False)
    s.see_all()
    s.sync("pod:team/p1")
    new = Controller(s)  # a standby, its caches filled up to here
    for inf in new.informers.values():
        inf.deliver(10_000)
    assert new.ctx.claims.get(NS, "shared")["status"]["phase"] == "Bound"

    def freed(c: Obj) -> None:
        c["status"] = {"phase": "Pending"}

    def bound_again(c: Obj) -> None:
        c["status"] = {"phase": "Bound", "nodeName": "n0", "resourceName": RESOURCE,
                       "reservedFor": [{"name": "p2", "uid": "uid-p2"}]}

    s.fake.patch(CLAIMS, NS, "shared", freed)  # the old leader lets p1's go ...
    s.fake.patch(CLAIMS, NS, "shared", bound_again)  # ... and binds it for another pod
    new.view.catch_up(s.fake.list_claims(), new.ctx.claims.get)
    while new.informers[CLAIMS].pending():
        new.informers[CLAIMS].deliver(1)
        assert new.view.used().get(RESOURCE, {}).get("n0", 0) >= 1  # bound all along on the server
    assert new.view.used()[RESOURCE]["n0"] == 1 and len(new.view.inflight) == 0


def test_a_claim_counted_at_takeover_and_deleted_unseen_is_freed_by_the_audit() -> None:
    """A new leader counts a claim its cache does not show yet (catch-up).
    If the claim goes (its finalizer taken off by hand) while a relist
    skips both its events, nothing else would end the entry: its GPUs stay
    counted. The in-flight audit reads it live and frees them; a claim
    still there keeps its entry."""
    from gpuclaimctl.sync.claims import AUDIT_MIN_AGE
    from gpuclaimctl.sync.context import AUDIT_INFLIGHT
    from tests.sim.harness import Controller

    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    s.sync("pod:team/p")
    assert s.bound_on("n0") == 2
    new = Controller(s)  # a standby whose claim watch lags: it has not seen the bind
    for kind, inf in new.informers.items():
        if kind != CLAIMS:
            inf.deliver(10_000)
    assert new.view.catch_up(s.fake.list_claims(), new.ctx.claims.get) == 1
    s.ctl = new

    def counted() -> int:
        return s.ctl.view.used().get(RESOURCE, {}).get("n0", 0)

    s.t += AUDIT_MIN_AGE + 1.0
    s.sync(AUDIT_INFLIGHT)
    assert counted() == 2  # still there: counted until the informer shows it
    s.fake.patch(CLAIMS, NS, "p-g", lambda c: c["metadata"].__setitem__("finalizers", []))
    s.fake.delete(CLAIMS, NS, "p-g")
    s.ctl.informers[CLAIMS].relist()  # the watch was away: neither event comes
    assert counted() == 2 and len(s.ctl.view.inflight) == 1
    s.sync(AUDIT_INFLIGHT)
    assert counted() == 0 and len(s.ctl.view.inflight) == 0
    assert AUDIT_INFLIGHT in s.ctl.queue.delayed  # and again later


def test_a_claim_deleted_while_a_waiting_pod_holds_it_lets_go_and_goes() -> None:
    """a was bound for p, then b's bind failed (500): p waits. The user
    deletes a: its finalizer stays while p reserves it, and p waits while a
    is being deleted -- for good, unless the waiting pod lets go of it."""
    s = Story(nodes=(4,))
    s.claim("a", 1)
    s.claim("b", 1)
    s.pod("p", [{"name": "x", "claim": "a"}, {"name": "y", "claim": "b"}])
    s.see_all()

    def b_refused(m: str, _body: Obj) -> None:
        if m == "update_claim_status" and s.bound_on("n0"):
            s.fake.before_write = None
            s.fake.inject("update_claim_status", ApiError(500, "boom"), landed=False)

    s.fake.before_write = b_refused
    s.sync("pod:team/p")
    assert s.fake.before_write is None and s.gated("p") and s.bound_on("n0") == 1
    s.fake.delete(CLAIMS, NS, "a")
    s.drain()
    assert s.fake.get(CLAIMS, NS, "a") is None, "the deleted claim stayed, reserved by the waiting pod"
    assert s.gated("p")
    assert [e.reason for e in s.fake.events][-1] == "ClaimMissing"
    s.check_quiet()


def test_a_bind_still_on_the_server_when_its_answer_was_lost_is_not_settled_free_by_a_read() -> None:
    """The client gave up on a bind the server was still working on: a live
    read at once shows the claim at its base version, and the bind lands
    after it. The read must not end the count before the server itself has
    given up on the request (LOST_WRITE_WINDOW), or the GPUs go to another
    pod and the late bind overcommits the node."""
    s = Story(nodes=(4,))
    s.claim("mine", 4)  # a user's claim: it outlives the pod
    s.pod("p1", [{"name": "g", "claim": "mine"}])
    s.see_all()
    s.fake.inject("update_claim_status", lost_answer(), landed=False, later=True)
    s.sync("pod:team/p1")  # the finalizer, then the bind: no answer, the server still has it
    late, = s.fake.late
    s.fake.delete(PODS, NS, "p1")  # gated: gone at once; nothing will bind the claim again
    s.see_all()
    s.sync("claim:team/mine")  # a live read would show the claim still at the bind's base
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/p2")
    assert s.gated("p2"), "the GPUs of a bind that may still land went to another pod"
    s.t += 10
    s.fake.resolve_late(late, land=True)
    s.see_all()
    assert s.bound_on("n0") <= 4
    s.drain()
    s.check_quiet()


def test_a_bind_whose_answer_was_lost_and_never_landed_frees_its_gpus_after_the_window() -> None:
    s = Story(nodes=(4,))
    s.claim("mine", 4)
    s.pod("p1", [{"name": "g", "claim": "mine"}])
    s.see_all()
    s.fake.inject("update_claim_status", lost_answer(), landed=False, later=True)
    s.sync("pod:team/p1")
    late, = s.fake.late
    s.fake.delete(PODS, NS, "p1")
    s.fake.resolve_late(late, land=False)
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/p2")
    assert s.gated("p2")
    s.drain()  # runs the claim's re-queued settle once the window has passed
    assert not s.gated("p2") and s.bound_on("n0") == 4


def test_a_release_whose_answer_was_lost_keeps_the_set_on_its_node_until_it_can_land_no_more() -> None:
    """The release patch got no answer and lands while the cache still shows
    the pod gated; the node is cordoned meanwhile (onCordon Move). Moving
    the claims elsewhere then would leave the pod pinned to one node and its
    claims bound on another. The set stays until the release is known."""
    s = Story(nodes=(4, 4))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.fake.inject("patch_pod", lost_answer(), landed=False, later=True)
    s.sync("pod:team/p1")  # create, bind, release: the release's answer is lost
    late, = s.fake.late
    claim = s.fake.get(CLAIMS, NS, "p1-g")
    assert claim is not None
    first = claim["status"]["nodeName"]
    node = s.fake.get(NODES, "", first)
    assert node is not None
    node.setdefault("spec", {})["unschedulable"] = True
    s.fake.update(NODES, node)
    s.see_all()  # the node is cordoned; the pod is still gated
    # If the claims move, the release lands just then.
    s.at_write("update_claim_status", lambda: s.fake.resolve_late(late, land=True))
    s.sync("pod:team/p1")
    if late in s.fake.late:
        s.fake.resolve_late(late, land=True)
    s.see_all()
    s.drain()
    pod = s.fake.get(PODS, NS, "p1")
    claim = s.fake.get(CLAIMS, NS, "p1-g")
    assert pod is not None and claim is not None and not s.gated("p1")
    assert pod["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] == first
    assert claim["status"]["nodeName"] == first, "the claims moved away from where the pod is pinned"


def test_a_release_whose_answer_was_lost_and_never_landed_is_placed_again_after_the_window() -> None:
    s = Story(nodes=(4, 4))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.fake.inject("patch_pod", lost_answer(), landed=False, later=True)
    s.sync("pod:team/p1")
    late, = s.fake.late
    s.fake.resolve_late(late, land=False)
    first = (s.fake.get(CLAIMS, NS, "p1-g") or {})["status"]["nodeName"]
    node = s.fake.get(NODES, "", first)
    assert node is not None
    node.setdefault("spec", {})["unschedulable"] = True
    s.fake.update(NODES, node)
    s.see_all()
    s.sync("pod:team/p1")
    assert s.gated("p1")  # held back: the lost release might still land
    s.drain()  # the window passes: a live read shows it gated, and it moves
    pod = s.fake.get(PODS, NS, "p1")
    assert pod is not None and not s.gated("p1")
    assert pod["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] != first
    assert (s.fake.get(CLAIMS, NS, "p1-g") or {})["status"]["nodeName"] != first


def settle_refusal(s: Story, key: str) -> None:
    """Sync a refused pod once (the refusal is seen), and again once it lasted."""
    s.sync(key)
    s.t += REFUSAL_SETTLE
    s.sync(key)


def test_a_refused_bare_pod_is_never_deleted_and_lets_go_of_its_claims() -> None:
    """Item 6."""
    s = Story(nodes=(4,))
    s.pod("bare", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    s.sync("pod:team/bare")
    s.see_all()
    s.sync("pod:team/bare")
    s.see_all()
    assert not s.gated("bare")
    s.fake.mark_unschedulable(NS, "bare", "0/1 nodes are available")
    s.see_all()
    settle_refusal(s, "pod:team/bare")
    assert s.fake.get(PODS, NS, "bare") is not None
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and not claim["status"].get("reservedFor")
    assert any(e.reason == "NodeRefused" for e in s.fake.events)


def test_a_refusal_is_acted_on_only_once_it_has_lasted() -> None:
    """kube-scheduler refuses a pinned pod while its cache has not seen the
    node yet (just added), then binds it there: a refusal younger than
    REFUSAL_SETTLE is looked at again later, not acted on. (Acting at once
    dropped a bare pod's reservations although it then ran on the node.)"""
    from gpuclaimctl.model.snapshot import format_time

    s = Story(nodes=(4,))
    s.pod("bare", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    for _ in range(2):
        s.sync("pod:team/bare")
        s.see_all()
    assert not s.gated("bare")
    s.fake.mark_unschedulable(NS, "bare", "0/1 nodes are available", since=format_time(s.now()))
    s.see_all()
    s.t += 1.0
    s.sync("pod:team/bare")
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and claim["status"].get("reservedFor")  # kept
    assert "pod:team/bare" in s.ctl.queue.delayed  # looked at again later
    assert not any(e.reason == "NodeRefused" for e in s.fake.events)
    s.t += REFUSAL_SETTLE
    s.sync("pod:team/bare")
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and not claim["status"].get("reservedFor")  # it lasted: let go
    assert any(e.reason == "NodeRefused" for e in s.fake.events)


def released_then_refused(s: Story, name: str) -> None:
    s.pod(name, [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    for _ in range(2):
        s.sync(f"pod:team/{name}")
        s.see_all()
    assert not s.gated(name)
    s.fake.mark_unschedulable(NS, name, "0/1 nodes are available")
    s.see_all()


def reserved(s: Story, claim_name: str) -> bool:
    claim = s.fake.get(CLAIMS, NS, claim_name)
    return claim is not None and bool(claim["status"].get("reservedFor"))


def test_a_refusal_on_a_node_just_created_waits_for_the_schedulers_retry() -> None:
    """kube-scheduler, backing off (up to 10 s), may bind a pod it refused
    on a node it did not have yet: the refusal is acted on only once the
    node has been there SCHEDULER_RETRY. (REFUSAL_SETTLE alone let a bare
    pod's GPUs go although it then ran there: the live `simulate` test.)"""
    s = Story(nodes=())
    created = s.t
    s.node("fresh", 4)
    released_then_refused(s, "bare")
    s.sync("pod:team/bare")
    s.t += REFUSAL_SETTLE
    s.sync("pod:team/bare")
    assert reserved(s, "bare-g"), "let go while the scheduler may still retry on the new node"
    assert "pod:team/bare" in s.ctl.queue.delayed  # looked at again later
    s.t = created + SCHEDULER_RETRY
    s.sync("pod:team/bare")
    assert not reserved(s, "bare-g")
    assert any(e.reason == "NodeRefused" for e in s.fake.events)


def test_a_refusal_right_after_the_node_changed_waits_for_the_schedulers_retry() -> None:
    """A change of the node's allocatable, taints or readiness makes
    kube-scheduler try the pod again (after its backoff): the wait for a
    refusal counts from the change too."""
    s = Story(nodes=(4,))
    released_then_refused(s, "bare")
    s.sync("pod:team/bare")
    s.fake.patch(NODES, "", "n0", lambda n: n["status"]["allocatable"].update({RESOURCE: "8"}))
    s.see_all()
    changed = s.t
    s.t += REFUSAL_SETTLE
    s.sync("pod:team/bare")
    assert reserved(s, "bare-g")
    s.t = changed + SCHEDULER_RETRY
    s.sync("pod:team/bare")
    assert not reserved(s, "bare-g")


def test_a_refusal_that_kept_the_gated_transition_time_still_waits_from_when_it_was_seen() -> None:
    """kube-scheduler keeps PodScheduled's lastTransitionTime when only the
    reason changes (SchedulingGated -> Unschedulable, both False): a pod that
    waited gated for minutes carries an old time on its first refusal. The
    refusal's age counts from when the controller first saw it. (Acting at
    once let a bare pod's GPUs go although kube-scheduler, a moment behind
    on a new node, then bound it there: the live `simulate` test in CI.)"""
    from gpuclaimctl.model.snapshot import format_time

    s = Story(nodes=(4,))
    s.pod("bare", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    gated_since = format_time(s.now())
    s.t += 600.0  # gated for ten minutes
    s.see_all()
    for _ in range(2):
        s.sync("pod:team/bare")
        s.see_all()
    assert not s.gated("bare")
    s.fake.mark_unschedulable(NS, "bare", "0/1 nodes are available", since=gated_since)
    s.see_all()
    s.sync("pod:team/bare")
    s.t += REFUSAL_SETTLE - 1.0
    s.sync("pod:team/bare")
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and claim["status"].get("reservedFor")  # kept
    assert not any(e.reason == "NodeRefused" for e in s.fake.events)
    s.t += 1.0
    s.sync("pod:team/bare")
    claim = s.fake.get(CLAIMS, NS, "bare-g")
    assert claim is not None and not claim["status"].get("reservedFor")  # it lasted: let go
    assert any(e.reason == "NodeRefused" for e in s.fake.events)


def test_a_refused_owned_pod_is_deleted_and_its_node_rejected_after_the_delete() -> None:
    """Item 6: the rejection is written only once the delete succeeded."""
    s = Story(nodes=(4, 4))
    s.pod("web", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    for _ in range(2):
        s.sync("pod:team/web")
        s.see_all()
    s.fake.mark_unschedulable(NS, "web", "0/2 nodes are available")
    s.see_all()
    s.sync("pod:team/web")
    assert s.fake.get(PODS, NS, "web") is not None, "deleted before the refusal lasted"
    s.t += REFUSAL_SETTLE
    order: list[str] = []
    orig_delete = s.fake.delete_pod

    def delete_pod(*a: Any) -> bool:
        order.append("delete")
        return orig_delete(*a)

    s.fake.delete_pod = delete_pod  # type: ignore[method-assign]
    s.fake.before_write = lambda m, b: order.append(m) if b.get("status", {}).get("rejectedNodes") else None
    s.sync("pod:team/web")
    assert order[:2] == ["delete", "update_claim_status"]


def test_a_pod_cannot_take_another_pods_template_claim_by_naming_it() -> None:
    """Item 9."""
    s = Story(nodes=(8,))
    s.pod("owner", [{"name": "g", "className": "alpha", "count": 1}])
    s.see_all()
    s.sync("pod:team/owner")  # creates owner-g
    s.see_all()
    s.fake.delete(PODS, NS, "owner")
    s.see_all()
    s.pod("thief", [{"name": "x", "claim": "owner-g"}])
    s.see_all()
    s.sync("pod:team/thief")
    assert s.gated("thief")
    assert any(e.reason == "ClaimInUse" and "serves that pod alone" in e.message for e in s.fake.events)


def test_a_gated_pod_that_drops_a_reserved_claim_from_its_annotation_lets_go_of_it() -> None:
    """Item 10: the binds landed, the release failed, the user edited the annotation."""
    s = Story(nodes=(8,))
    s.claim("keep", 1)
    s.claim("drop", 2)
    s.pod("p", [{"name": "a", "claim": "keep"}, {"name": "b", "claim": "drop"}])
    s.see_all()
    s.fake.inject("patch_pod", lost_answer(), landed=False)
    s.sync("pod:team/p")
    s.see_all()
    assert s.gated("p") and s.bound_on("n0") == 3

    def edit(pod: Obj) -> None:
        pod["metadata"]["annotations"][api.CLAIMS_ANNOTATION] = json.dumps([{"name": "a", "claim": "keep"}])
    s.fake.patch(PODS, NS, "p", edit)
    s.drain()
    dropped = s.fake.get(CLAIMS, NS, "drop")
    assert dropped is not None and not dropped["status"].get("reservedFor")
    assert dropped["status"].get("phase") == "Pending"


def test_freed_gpus_wake_the_pods_waiting_for_them() -> None:
    """Item 11: a dropped reservation frees GPUs; the waiting pod is synced
    again without a resync."""
    s = Story(nodes=(4,))
    s.pod("first", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/first")
    s.see_all()
    s.sync("pod:team/first")
    s.see_all()
    s.pod("second", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/second")
    s.see_all()
    s.ctl.queue.ready.clear()
    s.fake.bind_pod(NS, "first", "n0")
    s.fake.set_pod_phase(NS, "first", "Succeeded")
    s.drain()
    assert not s.gated("second")


def _normalized(usage: Any) -> dict[str, dict[str, int]]:
    out = {r: {n: c for n, c in per.items() if c} for r, per in usage.items()}
    return {r: per for r, per in out.items() if per}


def test_the_view_equals_a_recount_after_a_story() -> None:
    s = Story(nodes=(4, 2))
    s.pod("a", [{"name": "g", "className": "alpha", "count": 2}])
    s.pod("b", [{"name": "g", "className": "alpha", "count": 2}])
    s.drain()
    classes = {c["metadata"]["name"]: c["spec"]["resourceName"] for c in s.fake.list(CLASSES).items}
    recount = used_capacity(s.fake.list(CLAIMS).items, s.fake.list(PODS).items, classes)
    assert _normalized(s.ctl.view.used()) == _normalized(recount) == {RESOURCE: {"n0": 2, "n1": 2}}




def _fill_and_wait(s: Story, waiting: dict[str, int]) -> None:
    """n0 (4 GPUs) held by `first`; then the `waiting` pods (name -> GPUs)
    each synced once, so each waits with Capacity."""
    s.pod("first", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/first")
    s.see_all()
    for name, count in waiting.items():
        s.pod(name, [{"name": "g", "className": "alpha", "count": count}])
        s.see_all()
        s.sync(f"pod:team/{name}")
        s.see_all()
    s.ctl.queue.ready.clear()


def test_freed_gpus_wake_only_the_waiting_pods_that_could_fit_there() -> None:
    """Issue 12 item 5: a freed GPU is not a reason to sync every waiting
    pod; a pod needing more than the freed node now has free stays
    unqueued (its own events, or a resync, still wake it)."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {"big": 8, "small": 2})
    needs = s.ctl.ctx.memories.capacity_needs
    assert (needs.get("team/big"), needs.get("team/small")) == ({RESOURCE: 8}, {RESOURCE: 2})
    # `first` finishes: its claim lets go of it, 4 GPUs free on n0.
    s.fake.bind_pod(NS, "first", "n0")
    s.fake.set_pod_phase(NS, "first", "Succeeded")
    s.see_all()
    for _ in range(3):  # the claim syncs that drop the reservation
        for key in [k for k in s.ctl.queue.ready if k.startswith("claim:")]:
            s.sync(key)
        s.see_all()
    assert "pod:team/small" in s.ctl.queue.ready
    assert "pod:team/big" not in s.ctl.queue.ready
    s.drain()
    assert not s.gated("small") and s.gated("big")


def test_a_waiting_pod_whose_figures_changed_is_rewritten_at_most_every_refresh() -> None:
    """Issue 12 item 5: with the same reason, a message whose figures
    changed ("the most free ... 2" -> "1") costs no status write until
    WAITING_MESSAGE_REFRESH has passed; a changed reason is written at once."""
    s = Story(nodes=(4, 2))
    _fill_and_wait(s, {"second": 4})
    claim = next(c for c in s.fake.list(CLAIMS).items
                 if c["metadata"]["ownerReferences"][0]["name"] == "second")
    said = _waiting_message(claim)
    assert "2 " in said
    s.pod("taker", [{"name": "g", "className": "alpha", "count": 1}])
    s.see_all()
    s.sync("pod:team/taker")
    s.see_all()
    before = s.fake.resource_version
    s.sync("pod:team/second")
    assert s.fake.resource_version == before  # no write: only the figure changed
    s.ctl.ctx.memories.waiting_written.pop(claim["metadata"]["uid"])  # the refresh ran out
    s.sync("pod:team/second")
    claim = s.fake.get(CLAIMS, NS, claim["metadata"]["name"])
    assert claim is not None and _waiting_message(claim) != said


def test_a_new_waiting_pod_synced_again_before_the_cache_shows_its_waiting_sends_nothing() -> None:
    """A new pod's template claim: the sync that made it wrote its Waiting,
    and the claim's own create event syncs the pod again before the cache
    shows that write. Writing the same reason again from the cached version
    was refused (409) and failed the sync, twice for every new waiting pod."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {})
    s.pod("big", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/big")
    s.ctl.informers[CLAIMS].deliver(1)  # the create, not the Waiting write
    assert "pod:team/big" in s.ctl.queue.ready
    before = s.fake.resource_version
    s.sync("pod:team/big")
    assert s.fake.resource_version == before
    assert not s.ctl.queue.failures
    s.see_all()
    claim = s.fake.get(CLAIMS, NS, "big-g")
    assert claim is not None and "4" in _waiting_message(claim)


def test_a_set_s_claim_made_by_an_earlier_sync_is_not_made_again_while_the_cache_lacks_it() -> None:
    """Found by a real-plane attack: the first claim's create event synced
    the pod again before the second claim was in the cache; its create was
    AlreadyExists and failed the sync, for every new waiting pod of two
    entries. The sync that made a claim remembers it until the informer
    shows it."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {})
    s.pod("rep", [{"name": "g", "className": "alpha", "count": 7}, {"name": "h", "className": "alpha", "count": 1}])
    s.see_all()
    s.sync("pod:team/rep")
    s.ctl.informers[CLAIMS].deliver(1)  # rep-g's create, not rep-h's
    assert "pod:team/rep" in s.ctl.queue.ready
    creates = []
    s.fake.before_write = lambda m, b: creates.append(b["metadata"]["name"]) if m == "create_claim" else None
    s.sync("pod:team/rep")
    assert creates == [] and not s.ctl.queue.failures, s.log[-3:]
    s.fake.before_write = None
    s.see_all()
    assert not s.ctl.ctx.memories.made_claims.get(f"{NS}/rep-h")  # the informer showed it


def test_a_waiting_write_that_meets_a_newer_claim_is_tried_again_without_failing_the_sync() -> None:
    """The cache lags someone else's change of the claim, and the pod's
    reason changed: the Waiting write is refused (409). The sync does not
    fail; the pod is decided again shortly, from the newer version. A
    second 409 in a row fails the sync, which then backs off."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {"second": 4})
    claim = next(c for c in s.fake.list(CLAIMS).items
                 if c["metadata"]["ownerReferences"][0]["name"] == "second")
    name = claim["metadata"]["name"]
    s.fake.patch(CLAIMS, NS, name, lambda c: c["metadata"].setdefault("labels", {}).update(team="x"))
    s.fake.delete(CLASSES, "", "alpha")
    s.ctl.informers[CLASSES].deliver(10)
    s.sync("pod:team/second")
    assert not s.ctl.queue.failures
    assert "pod:team/second" in s.ctl.queue.delayed
    # Still behind a second later (a watch down): the sync fails, to back off.
    s.t += 2.0
    s.ctl.queue.promote()
    s.sync("pod:team/second")
    assert s.ctl.queue.failures == {"pod:team/second": 1}
    s.see_all()
    s.t += 2.0
    s.ctl.queue.promote()
    s.sync("pod:team/second")
    claim = s.fake.get(CLAIMS, NS, name)
    assert claim is not None
    cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    assert cond["reason"] == str(api.WaitReason.CLASS_NOT_FOUND), cond


def _waiting_message(claim: Obj) -> str:
    cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    return str(cond["message"])


def test_a_claim_stops_saying_waiting_when_someone_else_ungates_its_pod() -> None:
    """The Waiting condition is there only while a gated pod waits for the
    claim; a pod ungated by someone else (not by a release, whose bind
    writes the claim anyway) syncs the claims that still say Waiting."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {"second": 4})
    claim = next(c for c in s.fake.list(CLAIMS).items
                 if c["metadata"]["ownerReferences"][0]["name"] == "second")
    assert _waiting_message(claim)
    pod = s.fake.get(PODS, NS, "second")
    assert pod is not None
    pod["spec"]["schedulingGates"] = []
    s.fake.update(PODS, pod)
    s.see_all()
    key = "claim:" + NS + "/" + claim["metadata"]["name"]
    assert key in s.ctl.queue.ready
    s.sync(key)
    claim = s.fake.get(CLAIMS, NS, claim["metadata"]["name"])
    assert claim is not None
    assert not any(c["type"] == api.CONDITION_WAITING for c in claim["status"].get("conditions") or ())


def test_a_release_syncs_none_of_the_claims_it_bound() -> None:
    """Issue 12: a claim of a released pod that says nothing of waiting has
    nothing to do with the gate going; its own updates sync it."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    s.sync("pod:team/p")
    assert not s.gated("p")
    s.ctl.informers[CLAIMS].deliver(10_000)  # the claim's bind, seen
    s.ctl.queue.ready.clear()
    s.ctl.informers[PODS].deliver(10_000)  # the pod's release, seen
    assert not any(k.startswith("claim:") for k in s.ctl.queue.ready), s.ctl.queue.ready


def test_a_placements_claim_events_sync_only_the_pods_that_have_something_to_do() -> None:
    """Issue 12: the create and the bind of a placed pod's claim come back
    after its release; syncing the pod for them (2.5 pod syncs a pod) did
    nothing. A refused pod still is: its set may have become whole."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}], owned=False)
    s.see_all()
    # kube-scheduler's SchedulingGated condition, written before the release
    # and seen after it.
    s.fake.patch(PODS, NS, "p", lambda p: p.setdefault("status", {}).__setitem__("conditions", [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]))
    s.sync("pod:team/p")
    assert not s.gated("p")
    s.ctl.queue.ready.clear()
    s.ctl.informers[CLAIMS].deliver(10_000)  # before the release is seen: still gated here
    s.ctl.informers[PODS].deliver(1)  # the condition, still gated
    assert s.ctl.informers[PODS].store.get_by_key("team/p")["spec"].get("schedulingGates")
    assert "pod:team/p" not in s.ctl.queue.ready, s.ctl.queue.ready
    s.ctl.informers[PODS].deliver(10_000)
    s.ctl.queue.ready.clear()
    reject = [{"nodeName": "elsewhere", "until": "2099-01-01T00:00:00Z"}]
    s.fake.patch(CLAIMS, NS, "p-g", lambda c: c["status"].__setitem__("rejectedNodes", reject))
    s.ctl.informers[CLAIMS].deliver(10_000)  # a placement field changed; the pod is released
    assert "pod:team/p" not in s.ctl.queue.ready, s.ctl.queue.ready
    s.fake.mark_unschedulable(NS, "p", "0/1 nodes are available")
    s.ctl.informers[PODS].deliver(10_000)
    s.ctl.queue.ready.clear()
    s.fake.patch(CLAIMS, NS, "p-g", lambda c: c["status"].__setitem__("rejectedNodes", reject * 2))
    s.ctl.informers[CLAIMS].deliver(10_000)
    assert "pod:team/p" in s.ctl.queue.ready, s.ctl.queue.ready


def test_a_waiting_pod_synced_again_with_nothing_changed_costs_no_write() -> None:
    s = Story(nodes=(4,))
    _fill_and_wait(s, {"second": 4})
    before = s.fake.resource_version
    for _ in range(3):
        s.sync("pod:team/second")
    assert s.fake.resource_version == before


def test_oldest_first_holds_among_queued_pods_not_only_those_in_workers() -> None:
    """Issue 10 item 12: the controller's queue hands out claim and class
    keys first, then pods oldest first, whatever order they were added in;
    so when GPUs free up, the oldest waiting pod is looked at first."""
    from gpuclaimctl.controller import key_order
    from workqueue import RateLimitingQueue, default_controller_rate_limiter

    created = {"young": "2026-11-30T10:00:02Z", "old": "2026-11-30T10:00:00Z",
               "mid": "2026-11-30T10:00:01Z"}

    def get_pod(_ns: str, name: str) -> Obj | None:
        return {"metadata": {"creationTimestamp": created[name]}} if name in created else None

    q: RateLimitingQueue[str] = RateLimitingQueue(default_controller_rate_limiter(),
                                                  order=lambda k: key_order(k, get_pod))
    try:
        for key in ["pod:team/young", "pod:team/mid", "claim:team/c", "pod:team/gone",
                    "pod:team/old", "class:alpha"]:
            q.add(key)
        got = [q.get()[0] for _ in range(6)]
    finally:
        q.shut_down()
    assert got == ["claim:team/c", "class:alpha", "pod:team/gone", "pod:team/old", "pod:team/mid",
                   "pod:team/young"]


def test_a_status_write_on_the_gated_pod_does_not_cost_the_release_a_round_trip() -> None:
    """Issue 12 item 2: kube-scheduler writes a gated pod's status
    (SchedulingGated) soon after creation; the release is a JSON patch that
    tests what the decision read, so that write does not make it conflict."""
    s = Story(nodes=(4,))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()

    def scheduler_writes_status() -> None:
        pod = s.fake.get(PODS, NS, "p1")
        assert pod is not None
        pod["status"] = {"conditions": [{"type": "PodScheduled", "status": "False",
                                         "reason": "SchedulingGated"}]}
        s.fake._update(PODS, pod, _Part.STATUS, forced_ok=False)
    s.at_write("update_claim_status", scheduler_writes_status)
    s.sync("pod:team/p1")
    assert not s.gated("p1")
    pod = s.fake.get(PODS, NS, "p1")
    assert pod is not None and pod["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] == "n0"


def test_a_release_after_the_claims_annotation_changed_is_refused_and_decided_again() -> None:
    s = Story(nodes=(4,))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()

    def user_edits() -> None:
        pod = s.fake.get(PODS, NS, "p1")
        assert pod is not None
        pod["metadata"]["annotations"][api.CLAIMS_ANNOTATION] = json.dumps(
            [{"name": "g", "className": "alpha", "count": 3}])
        s.fake.update_pod(pod)
    s.at_write("update_claim_status", user_edits)
    s.sync("pod:team/p1")
    assert s.gated("p1")  # the patch's test failed (422): nothing released on the old reading
    s.drain()
    assert not s.gated("p1")


def test_a_pod_synced_again_before_the_cache_shows_its_release_sends_nothing() -> None:
    """Issue 12 item 2: a second sync of a pod this process released, while
    the cache still shows it gated, must not patch it again (the patch
    would be refused: 0.76 refused patches per pod in make bench-controller)."""
    s = Story(nodes=(4,))
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    s.sync("pod:team/p1")
    assert not s.gated("p1")
    calls = len(s.fake.writer_calls)
    s.sync("pod:team/p1")  # the pod informer has not delivered the release
    assert s.fake.writer_calls[calls:] == []


def _place_and_see(s: Story, *names: str) -> None:
    for _ in range(2):
        s.see_all()
        for name in names:
            s.sync(f"pod:{NS}/{name}")
    s.see_all()


def test_gpus_freed_after_a_younger_pods_turn_came_go_to_the_older_pod_they_woke(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake-up miss of make bench-controller (issue 12, item 5): a
    younger pod was in its worker, past its turn, when a node grew; the
    oldest pod that fits was only queued by that change, and the younger
    one took the GPUs. Now the change and the pods it wakes reach the
    turnstile together, and the younger pod gives its turn up."""
    from gpuclaimctl.controller import TurnstileTracker

    s = Story(nodes=(4,))
    s.pod("hog", [{"name": "g", "className": "alpha", "count": 4}])
    _place_and_see(s, "hog")
    s.pod("old", [{"name": "g", "className": "alpha", "count": 3}])
    s.pod("young", [{"name": "g", "className": "alpha", "count": 4}])
    _place_and_see(s, "old", "young")
    assert s.gated("old") and s.gated("young") and s.bound_on("n0") == 4

    # The real queue's tracker, fed as the real queue feeds it: the key in
    # a worker is added again "while processing", not made ready.
    ctx, q = s.ctl.ctx, s.ctl.queue
    tracker = TurnstileTracker(ctx.turnstile, ctx.pods.get, lambda uid: uid in ctx.memories.released)
    in_worker = f"pod:{NS}/young"
    real_add = q.add

    def add(key: str) -> None:
        assert s.ctl.view.lock._is_owned(), "woken under the view's lock, with the change"  # type: ignore[attr-defined]
        real_add(key)
        (tracker.added_while_processing if key == in_worker else tracker.queued)(key)

    monkeypatch.setattr(q, "add_all", lambda keys: [add(k) for k in keys])
    real_wait = ctx.turnstile.wait_turn

    def wait_turn(key: str, age: Any) -> bool:
        went = real_wait(key, age)
        if key == f"{NS}/young":  # its turn came; now the node grows by 4
            s.fake.patch(NODES, "", "n0",
                         lambda n: n["status"]["allocatable"].__setitem__(RESOURCE, "8"))
            s.ctl.informers[NODES].deliver(10)
        return went

    monkeypatch.setattr(ctx.turnstile, "wait_turn", wait_turn)
    s.ctl.queue.ready.clear()
    s.sync(in_worker)
    assert s.gated("young"), "the younger pod gave its turn up"
    assert f"pod:{NS}/old" in q.ready and in_worker in q.ready
    monkeypatch.setattr(q, "add_all", lambda keys: [real_add(k) for k in keys])
    s.sync(f"pod:{NS}/old")
    tracker.finished(f"pod:{NS}/old", False)
    assert not s.gated("old"), "the oldest pod that fits got the GPUs"
    s.see_all()
    s.sync(in_worker)
    assert s.gated("young") and s.bound_on("n0") == 7


def test_pods_of_one_second_are_handed_out_in_the_turnstiles_order() -> None:
    """The stress test's livelock: pods created in one second in namespaces
    `a` and `a-b`. The key string put `pod:a-b/…` first, the turnstile
    counts `a` older; the pod handed out kept giving its turn up to one
    the queue kept behind it."""
    from gpuclaimctl.controller import key_order
    from gpuclaimctl.model.snapshot import parse_time

    ts = "2026-11-30T10:00:00Z"
    pods = [("a-b", "x"), ("a", "y"), ("a", "x"), ("a-b", "a")]
    by_queue = sorted(pods, key=lambda p: key_order(f"pod:{p[0]}/{p[1]}",
                                                    lambda _ns, _n: {"metadata": {"creationTimestamp": ts}}))
    by_age = sorted(pods, key=lambda p: (parse_time(ts), p[0], p[1]))
    assert by_queue == by_age == [("a", "x"), ("a", "y"), ("a-b", "a"), ("a-b", "x")]


def test_a_pod_gives_its_turn_up_once_in_a_row_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the queue's order, a pod overtaken again on its next try
    goes ahead: one more sync, never a livelock."""
    s = Story(nodes=(4,))
    s.pod("young", [{"name": "g", "className": "alpha", "count": 1}])
    s.see_all()
    monkeypatch.setattr(s.ctl.ctx.turnstile, "overtaken", lambda key, age: True)
    s.sync(f"pod:{NS}/young")
    assert s.gated("young") and f"pod:{NS}/young" in s.ctl.queue.ready
    s.see_all()
    s.sync(f"pod:{NS}/young")
    assert not s.gated("young")
    pod = s.fake.get(PODS, NS, "young")
    assert pod is not None and s.ctl.ctx.memories.gave_turn.get(pod["metadata"]["uid"]) is None


def test_a_placements_claim_changes_are_synced_once_a_moment_later() -> None:
    """Issue 12: the create and the bind of one placement are two claim
    events a round trip apart; one claim sync after both does their work."""
    from gpuclaimctl.sync.handlers import CLAIM_SETTLE_DELAY
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    s.sync("pod:team/p")
    assert not s.gated("p")
    s.ctl.informers[CLAIMS].deliver(10_000)  # the create and the bind, seen
    keys = [k for k in s.ctl.queue.delayed if k.startswith("claim:")]
    assert len(keys) == 1, s.ctl.queue.delayed
    assert not any(k.startswith("claim:") for k in s.ctl.queue.ready), s.ctl.queue.ready
    assert s.ctl.queue.delayed[keys[0]] == pytest.approx(s.monotonic() + CLAIM_SETTLE_DELAY)


def test_a_claim_gone_before_its_status_write_is_not_retried() -> None:
    """The cache still shows a claim deleted meanwhile: its sync's status
    write finds it gone (404), which is not a failure to back off and log
    (an attack on the real plane saw 4-8 such retries a claim)."""
    s = Story(nodes=(4,))
    s.pod("bare", [{"name": "g", "className": "alpha", "count": 1}], owned=False)
    s.see_all()
    s.sync("pod:team/bare")
    s.see_all()
    s.fake.delete(PODS, NS, "bare")
    s.ctl.informers[PODS].deliver(10_000)
    s.fake.patch(CLAIMS, NS, "bare-g", lambda c: c["metadata"].__setitem__("finalizers", []))
    s.fake.delete(CLAIMS, NS, "bare-g")  # not delivered: the cache still shows it reserved
    assert s.fake.get(CLAIMS, NS, "bare-g") is None
    s.ctl.queue.failures.clear()
    s.sync("claim:team/bare-g")
    assert not s.ctl.queue.failures, s.log[-3:]


def test_a_claim_being_deleted_is_synced_at_once() -> None:
    """Someone waits for its delete: its finalizer goes without the delay."""
    s = Story(nodes=(4,))
    s.fake.create(CLAIMS, {"metadata": {"name": "shared", "namespace": NS,
                                        "finalizers": [api.CLAIM_FINALIZER]},
                           "spec": {"className": "alpha", "count": 1}})
    s.see_all()
    s.ctl.queue.ready.clear()
    s.ctl.queue.delayed.clear()
    s.fake.delete(CLAIMS, NS, "shared")
    s.ctl.informers[CLAIMS].deliver(10_000)
    assert "claim:team/shared" in s.ctl.queue.ready
    s.sync("claim:team/shared")
    assert s.fake.get(CLAIMS, NS, "shared") is None


def test_the_placed_and_invalid_annotation_events_say_each_thing_once() -> None:
    s = Story(nodes=(4,))
    s.pod("ok", [{"name": "g", "className": "alpha", "count": 1}])
    s.pod("bad", [{"name": "g", "className": "alpha", "count": 0}])
    s.see_all()
    s.sync("pod:team/ok")
    s.sync("pod:team/bad")
    said = {(e.involved, e.reason): e.message for e in s.fake.events}
    placed = said[f"Pod/{NS}/ok", "Placed"]
    assert placed.count("placed on node n0") == 1, placed
    assert placed.startswith("GPUClaim ok-g (1"), placed
    invalid = said[f"Pod/{NS}/bad", str(api.WaitReason.INVALID_CLAIMS)]
    assert invalid.count("is invalid") == 1 and invalid.startswith(f"annotation {api.CLAIMS_ANNOTATION}"), invalid


def _gone_unseen(s: Story, name: str) -> None:
    """Someone strips the claim's finalizer and deletes it while its watch
    is away: the relist never shows it."""
    c = s.fake.get(CLAIMS, NS, name)
    assert c is not None
    c["metadata"]["finalizers"] = []
    s.fake.update(CLAIMS, c)
    s.fake.delete(CLAIMS, NS, name)
    s.ctl.informers[CLAIMS].relist()


def test_a_claim_made_and_deleted_unseen_is_made_again_at_the_next_sync() -> None:
    """Found by a review of Memories.made_claims: the sync that made the
    claim remembers it; a bind of it that finds no claim (404) proves its uid
    gone, which ends both the memory and the bind's in-flight count."""
    s = Story(nodes=(4,))
    _fill_and_wait(s, {})
    s.pod("rep", [{"name": "g", "className": "alpha", "count": 3}])
    s.see_all()
    s.sync("pod:team/rep")  # makes rep-g; waits for Capacity
    _gone_unseen(s, "rep-g")
    s.node("n1", 4)
    s.ctl.informers[NODES].deliver(10)
    s.t += 5
    s.sync("pod:team/rep")  # the remembered rep-g: its bind is a 404
    assert not s.ctl.view.inflight
    assert s.ctl.view.used().get(RESOURCE, {}).get("n1", 0) == 0
    s.t += 1
    s.ctl.queue.promote()
    s.sync("pod:team/rep")  # made again, bound, released
    assert not s.gated("rep")


def test_a_claim_made_then_replaced_by_a_user_s_unseen_is_not_taken() -> None:
    s = Story(nodes=(4,))
    _fill_and_wait(s, {})
    s.pod("rep", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    s.sync("pod:team/rep")
    _gone_unseen(s, "rep-g")
    s.claim("rep-g", 3)  # a user's claim under the name, not shown yet
    s.node("n1", 4)
    s.ctl.informers[NODES].deliver(10)
    s.sync("pod:team/rep")
    c = s.fake.get(CLAIMS, NS, "rep-g")
    assert c is not None and not (c.get("status") or {}).get("reservedFor")
    assert s.gated("rep")
    s.drain()
    assert s.gated("rep") and not s.ctl.view.inflight


def test_a_pod_waiting_for_a_claim_another_pod_holds_writes_nothing_on_it() -> None:
    """Found by a review: p2's ClaimInUse was written on the claim p1 holds
    and runs with, so `kubectl get gpuclaims` showed a Bound claim waiting.
    p2 is told by its Warning event."""
    s = Story(nodes=(4,))
    s.claim("shared", 2)
    s.pod("p1", [{"name": "g", "claim": "shared"}])
    s.see_all()
    s.sync("pod:team/p1")
    s.see_all()
    s.pod("p2", [{"name": "g", "claim": "shared"}])
    s.see_all()
    before = s.fake.resource_version
    s.sync("pod:team/p2")
    assert s.fake.resource_version == before
    assert [e.reason for e in s.fake.events if e.involved == f"Pod/{NS}/p2"] == [str(api.WaitReason.CLAIM_IN_USE)]


def test_a_claim_being_placed_by_one_sync_is_not_written_by_another_from_the_made_claim_memory() -> None:
    """Simulation seed 1600634: a second sync of the pod, while the first
    was binding the set it had just made (the cache showing none of it),
    took the claims from Memories.made_claims and bound them itself; the
    first's bind was then refused and it let go of the set's other counts
    while the second's binds were not seen yet (I1: n0 held 6, counted 2).
    A claim with a placement in flight is not taken from the memory."""
    s = Story(nodes=(8,))
    s.pod("p2", [{"name": "e0", "className": "alpha", "count": 2}, {"name": "e1", "className": "alpha", "count": 3}])
    s.see_all()
    s.at_write("update_claim_status", lambda: s.sync("pod:team/p2"))
    s.sync("pod:team/p2")
    s.check_always("after both syncs")
    s.see_all()
    s.drain()
    assert not s.gated("p2") and s.bound_on("n0") == 5


def test_a_pod_first_seen_finished_lets_go_of_the_claim_a_live_read_kept_for_it() -> None:
    """Simulation seed 1900098 (I4): a new leader's claim sync found the
    reserving pod missing from its lagging cache and read it live: it still
    ran, so the reservation stayed. The pod then finished, and the cache's
    first sight of it was already Succeeded: an add, which synced none of
    its claims, so the reservation stayed for good."""
    s = Story(nodes=(4,))
    s.claim("shared", 2)
    s.pod("p1", [{"name": "g", "claim": "shared"}])
    s.see_all()
    s.sync("pod:team/p1")
    s.see_all()
    s.fake.bind_pod(NS, "p1", "n0")
    s.see_all()
    pods = s.ctl.informers[PODS]
    pods.store.pop(f"{NS}/p1")  # a lagging cache, as a standby's that just took over
    s.sync("claim:team/shared")  # reads p1 live: it runs; the reservation stays
    claim = s.fake.get(CLAIMS, NS, "shared")
    assert claim is not None and claim["status"].get("reservedFor")
    s.fake.set_pod_phase(NS, "p1", "Succeeded")
    s.ctl.queue.ready.clear()
    pods.deliver(10_000)  # first sight of p1: an add, already Succeeded
    assert "claim:team/shared" in s.ctl.queue.ready
    s.drain()
    claim = s.fake.get(CLAIMS, NS, "shared")
    assert claim is not None and not claim["status"].get("reservedFor")


def test_a_claim_sync_that_meets_a_newer_version_ends_quietly_and_the_version_syncs_it_again() -> None:
    """Under churn most claim-sync errors were 409s of a cache behind a
    newer version, whose own event syncs the claim anyway."""
    s = Story(nodes=(4,))
    s.claim("shared", 2)
    s.pod("p1", [{"name": "g", "claim": "shared"}])
    s.see_all()
    s.sync("pod:team/p1")
    s.see_all()
    s.fake.delete(PODS, NS, "p1")
    s.ctl.informers[PODS].deliver(10_000)
    s.fake.patch(CLAIMS, NS, "shared", lambda c: c["metadata"].setdefault("labels", {}).update(team="x"))
    s.sync("claim:team/shared")  # the stale reservation's removal meets the label's version
    assert not s.ctl.queue.failures
    claim = s.fake.get(CLAIMS, NS, "shared")
    assert claim is not None and claim["status"].get("reservedFor")
    s.ctl.queue.ready.clear()
    s.ctl.queue.delayed.clear()
    s.ctl.informers[CLAIMS].deliver(10_000)  # the label's version
    s.drain()
    claim = s.fake.get(CLAIMS, NS, "shared")
    assert claim is not None and not claim["status"].get("reservedFor")


def test_a_pod_naming_claims_without_the_gate_is_told_once_and_placed_never() -> None:
    """Made where no webhook adds the gate: nothing places its claims, and
    kube-scheduler may run it without their GPUs. It is told so once, when
    first seen; a pod that is gated, or released by us, is not."""
    s = Story(nodes=(4,))
    s.fake.create(PODS, {"metadata": {"name": "bare", "namespace": NS, "annotations": {
        api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": 1}])}},
        "spec": {"containers": [{"name": "c"}]}})
    s.pod("gated", [{"name": "g", "className": "alpha", "count": 1}])
    s.see_all()
    s.drain()
    assert [(e.reason, e.involved) for e in s.fake.events if e.type == "Warning"] == \
        [("NotGated", f"Pod/{NS}/bare")]
    assert "has no scheduling gate" in s.fake.events[0].message
    assert s.bound_on("n0") == 1 and not s.gated("gated")
    assert not [c for c in s.fake.list(CLAIMS).items if c["metadata"]["name"].startswith("bare")]
    bare = s.fake.get(PODS, NS, "bare")
    assert bare is not None
    bare["metadata"]["labels"] = {"touched": "yes"}
    s.fake.update_pod(bare)  # another version: not told again
    s.see_all()
    s.drain()
    assert [e.reason for e in s.fake.events if e.type == "Warning"] == ["NotGated"]
    # Not told: one released by us before (the placed-node annotation comes
    # with the release, in one patch), one already on a node, one finished.
    entries = json.dumps([{"name": "g", "className": "alpha", "count": 1}])
    for name, annotations, spec, status in (
            ("released", {api.PLACED_NODE_ANNOTATION: "n0"}, {}, {}),
            ("on-node", {}, {"nodeName": "n0"}, {}),
            ("finished", {}, {}, {"phase": "Succeeded"})):
        s.fake.create(PODS, {"metadata": {"name": name, "namespace": NS, "annotations": {
            api.CLAIMS_ANNOTATION: entries, **annotations}},
            "spec": {"containers": [{"name": "c"}], **spec}, "status": status})
    s.see_all()
    s.drain()
    assert [e.reason for e in s.fake.events if e.type == "Warning"] == ["NotGated"]
    s.check_quiet()


def test_a_claim_two_waiting_pods_name_says_why_the_older_waits_and_is_not_rewritten_in_turn() -> None:
    """Found by a real-plane attack: two gated pods waiting for different
    reasons on one shared claim wrote their Waiting on it in turn, about
    once a second each, for as long as they waited. The older pod's reason
    stands; the younger is told by its Warning event."""
    s = Story(nodes=(4,))
    s.claim("shared", 8)  # more than any node has: Unsatisfiable
    s.pod("old", [{"name": "g", "claim": "shared"}, {"name": "h", "className": "nosuch", "count": 1}])
    s.pod("young", [{"name": "g", "claim": "shared"}])
    s.see_all()
    writes: list[str] = []
    s.fake.before_write = lambda m, b: writes.append(b["metadata"]["name"]) \
        if m == "update_claim_status" else None
    for _ in range(3):
        s.sync("pod:team/old")
        s.sync("pod:team/young")
        s.see_all()
    assert writes.count("shared") == 1
    shared = s.fake.get(CLAIMS, NS, "shared")
    assert shared is not None
    waiting = next(c for c in shared["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
    assert waiting["reason"] == "ClassNotFound"
    assert [(e.reason, e.involved) for e in s.fake.events if e.type == "Warning"] == \
        [("ClassNotFound", f"Pod/{NS}/old"), ("Unsatisfiable", f"Pod/{NS}/young")]


def test_a_warning_the_recorder_dropped_is_told_again_by_the_next_sync() -> None:
    """Under a flood of events the recorder's queue is full and drops them:
    what a pod was told is remembered only once the recorder took it, so a
    pod told once (NotGated) or on a change of reason is not left untold."""
    s = Story(nodes=(4,))
    s.fake.inject("event", ApiError(503, "ServiceUnavailable", "the queue is full"), landed=False)
    s.pod("p", [{"name": "g"}])  # InvalidClaims
    s.see_all()
    s.sync("pod:team/p")
    assert s.fake.events == []
    s.sync("pod:team/p")
    assert [e.reason for e in s.fake.events] == ["InvalidClaims"]
    s.sync("pod:team/p")
    assert [e.reason for e in s.fake.events] == ["InvalidClaims"]
    # A pod without the gate never changes again: no event of its own would
    # sync it, so a drop brings a sync of its own, later.
    s.fake.inject("event", ApiError(503, "ServiceUnavailable", "the queue is full"), landed=False)
    s.fake.create(PODS, {"metadata": {"name": "bare", "namespace": NS, "annotations": {
        api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": 1}])}},
        "spec": {"containers": [{"name": "c"}]}})
    s.see_all()
    s.ctl.queue.ready.clear()
    s.sync("pod:team/bare")  # dropped
    assert [e.reason for e in s.fake.events] == ["InvalidClaims"]
    assert "pod:team/bare" in s.ctl.queue.delayed, "synced again later to tell it"
    s.drain()
    assert [e.reason for e in s.fake.events] == ["InvalidClaims", "NotGated"]


def test_the_echoes_of_a_pods_own_create_and_bind_do_not_sync_it_again() -> None:
    """Issue 12: a placing sync's claim create and bind come back from the
    watch while it still releases the pod; they are no news to it (0.6
    syncs per pod for nothing in make bench-controller). The same changes
    still wake another pod naming the claim."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    queued_meanwhile: list[bool] = []

    def echoes_arrive() -> None:  # inside the release's write
        s.ctl.informers[CLAIMS].deliver(10)  # p-g's create and bind
        queued_meanwhile.append("pod:team/p" in s.ctl.queue.ready)

    s.at_write("patch_pod", echoes_arrive)
    s.sync("pod:team/p")
    assert queued_meanwhile == [False]
    assert not s.gated("p")

    # Another gated pod naming that claim: the claim's changes are its news.
    s.pod("other", [{"name": "x", "claim": "p-g"}])
    s.see_all()
    s.ctl.queue.ready.clear()
    claim = s.fake.get(CLAIMS, NS, "p-g")
    claim["status"]["reservedFor"] = []
    s.fake.update(CLAIMS, claim)
    s.see_all()
    assert "pod:team/other" in s.ctl.queue.ready


def test_the_echo_of_a_bind_from_a_sync_that_has_ended_wakes_its_pod() -> None:
    """Only while the placing sync runs is its own bind's echo no news: a
    set whose second bind failed leaves the first in flight, and the next
    sync waits for that bind to be seen back (`unsettled`), woken by its
    echo, not by the backstop a second later."""
    s = Story(nodes=(4,))
    s.pod("p", [{"name": "g", "className": "alpha", "count": 2}, {"name": "h", "className": "alpha", "count": 1}])
    s.see_all()
    binds = []

    def second_bind_refused(m: str, _body: Obj) -> None:
        if m == "update_claim_status":
            binds.append(m)
            if len(binds) == 2:
                s.fake.inject("update_claim_status", ApiError(409, "Conflict", "changed"), landed=False)

    s.fake.before_write = second_bind_refused
    s.sync("pod:team/p")
    s.fake.before_write = None
    assert len(binds) == 2 and s.gated("p")
    s.ctl.informers[CLAIMS].deliver(2)  # the creates: news too, now that the sync has ended
    s.ctl.queue.ready.clear()
    s.ctl.informers[CLAIMS].deliver(10)  # the first bind
    assert "pod:team/p" in s.ctl.queue.ready
