"""AgeTurnstile: decisions in age order among pods being worked on."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from gpuclaimctl.state.turnstile import Age, AgeTurnstile

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def _gated(created: str) -> dict:
    """A gated pod as the tracker reads it from the cache."""
    from gpuclaimctl.model import api
    return {"metadata": {"creationTimestamp": created, "uid": created},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}]}}


def age(seconds: int, name: str = "p") -> Age:
    return (0, T0 + timedelta(seconds=seconds), "ns", name)


def test_a_younger_pod_decides_after_an_older_one_inside_leaves() -> None:
    gate = AgeTurnstile(max_wait=10)
    order: list[str] = []
    older_inside = threading.Event()
    release_older = threading.Event()

    def older() -> None:
        with gate.entered("old", age(1)):
            older_inside.set()
            release_older.wait(5)  # still creating its template claims
            assert gate.wait_turn("old", age(1))
            order.append("old")

    def younger() -> None:
        with gate.entered("young", age(2)):
            assert gate.wait_turn("young", age(2))
            order.append("young")

    t1 = threading.Thread(target=older)
    t1.start()
    assert older_inside.wait(5)
    t2 = threading.Thread(target=younger)
    t2.start()
    time.sleep(0.1)
    assert order == [], "the younger pod waits for the older one"
    release_older.set()
    t1.join(5)
    t2.join(5)
    assert order == ["old", "young"]
    assert len(gate) == 0


def test_an_older_pod_never_waits_for_a_younger_one() -> None:
    gate = AgeTurnstile(max_wait=10)
    with gate.entered("young", age(5)), gate.entered("old", age(1)):
        started = time.monotonic()
        assert gate.wait_turn("old", age(1))
        assert time.monotonic() - started < 0.5


def test_equal_times_are_ordered_by_namespace_and_name() -> None:
    gate = AgeTurnstile(max_wait=0.05)
    with gate.entered("a", age(1, "a")), gate.entered("b", age(1, "b")):
        assert gate.wait_turn("a", age(1, "a"))
        assert not gate.wait_turn("b", age(1, "b")), "b waits for a"


def test_the_wait_is_bounded_when_an_older_pod_is_stuck() -> None:
    gate = AgeTurnstile(max_wait=0.2)
    with gate.entered("stuck", age(1)), gate.entered("young", age(2)):
        started = time.monotonic()
        assert not gate.wait_turn("young", age(2))
        assert 0.15 < time.monotonic() - started < 2


def test_leaving_early_lets_the_others_through_and_the_block_end_is_harmless() -> None:
    gate = AgeTurnstile(max_wait=5)
    with gate.entered("old", age(1)):
        gate.leave("old")
        with gate.entered("young", age(2)):
            assert gate.wait_turn("young", age(2))
    assert len(gate) == 0


def test_a_pod_handed_out_first_holds_back_one_handed_out_after_it_whose_worker_is_faster() -> None:
    """The wake-up race make bench-controller found: two waiting pods handed
    out together to two workers; the younger's worker reached the decision
    first and took the room. Entering at hand-out (under the queue's lock)
    closes it: the younger waits although the older's worker has not run."""
    from gpuclaimctl.controller import TurnstileTracker
    from gpuclaimctl.model.snapshot import parse_time
    from workqueue import Queue

    pods = {"old": "2026-11-30T10:00:00Z", "young": "2026-11-30T10:00:01Z"}
    turnstile = AgeTurnstile(max_wait=5.0)
    q: Queue[str] = Queue(tracker=TurnstileTracker(
        turnstile, lambda ns, name: _gated(pods[name])))
    q.add("pod:team/old")
    q.add("pod:team/young")
    assert q.get()[0] == "pod:team/old"  # worker A, not yet running its sync
    assert q.get()[0] == "pod:team/young"  # worker B
    young_age = (0, parse_time(pods["young"]), "team", "young")
    done = threading.Event()

    def worker_b() -> None:
        turnstile.wait_turn("team/young", young_age)
        done.set()

    t = threading.Thread(target=worker_b)
    t.start()
    assert not done.wait(0.3)  # held back by the older pod handed out first
    turnstile.leave("team/old")  # A decided
    assert done.wait(5)
    t.join()


def test_a_pod_woken_after_it_decided_holds_back_a_younger_one_until_it_decides_again() -> None:
    """The raised-node wake-up of make bench-controller: the oldest waiting
    pod decided "no room" just before a node grew; the wake found it still
    in its worker (so it is handed out again only after done) and handed
    the younger pods it woke to the other workers, one of which took the
    room. Woken while processing, the older pod is back in the turnstile at
    once and stays there until its next decision."""
    from gpuclaimctl.controller import TurnstileTracker
    from gpuclaimctl.model.snapshot import parse_time
    from workqueue import Queue

    pods = {"old": "2026-11-30T10:00:00Z", "young": "2026-11-30T10:00:01Z"}
    turnstile = AgeTurnstile(max_wait=0.2)
    q: Queue[str] = Queue(order=lambda k: pods[k.split("/")[1]], tracker=TurnstileTracker(
        turnstile, lambda ns, name: _gated(pods[name])))
    young_age = (0, parse_time(pods["young"]), "team", "young")
    q.add("pod:team/old")
    assert q.get()[0] == "pod:team/old"  # worker A
    turnstile.leave("team/old")  # A decided: no room; it is writing why
    q.add_all(["pod:team/old", "pod:team/young"])  # the node grew: both woken
    assert q.get()[0] == "pod:team/young"  # worker B
    assert not turnstile.wait_turn("team/young", young_age)  # held back (till max_wait)
    q.done("pod:team/old")  # A is done: old is handed out again, still inside
    assert not turnstile.wait_turn("team/young", young_age)
    assert q.get()[0] == "pod:team/old"
    turnstile.leave("team/old")  # decided again, now with the room
    assert turnstile.wait_turn("team/young", young_age)
    q.done("pod:team/old")
    q.done("pod:team/young")
    assert len(turnstile) == 0


def test_a_pod_deleted_while_it_is_synced_holds_no_one_back() -> None:
    from gpuclaimctl.controller import TurnstileTracker
    from gpuclaimctl.model.snapshot import parse_time
    from workqueue import Queue

    pods = {"old": "2026-11-30T10:00:00Z", "young": "2026-11-30T10:00:01Z"}
    turnstile = AgeTurnstile(max_wait=5.0)
    q: Queue[str] = Queue(tracker=TurnstileTracker(
        turnstile, lambda ns, name: _gated(pods[name]) if name in pods else None))
    q.add("pod:team/old")
    assert q.get()[0] == "pod:team/old"
    del pods["old"]  # deleted; its delete event adds the key again
    q.add("pod:team/old")
    assert turnstile.wait_turn("team/young", (0, parse_time("2026-11-30T10:00:01Z"), "team", "young"))
    q.done("pod:team/old")
    q.shut_down()


def test_an_older_pod_queued_after_a_younger_ones_turn_came_overtakes_it() -> None:
    gate = AgeTurnstile(max_wait=5)
    with gate.entered("young", age(2)):
        assert gate.wait_turn("young", age(2))
        assert not gate.overtaken("young", age(2))
        gate.queue("older", age(1))  # woken by GPUs freed just now
        assert gate.overtaken("young", age(2))
        gate.enter("older", age(1))  # handed out: still ahead of the younger pod
        assert gate.overtaken("young", age(2))
        gate.leave("older")
        assert not gate.overtaken("young", age(2))


def test_a_younger_pod_queued_or_entering_overtakes_no_one() -> None:
    gate = AgeTurnstile(max_wait=5)
    with gate.entered("old", age(1)):
        assert gate.wait_turn("old", age(1))
        gate.queue("young", age(2))
        gate.enter("younger", age(3))
        assert not gate.overtaken("old", age(1))


def test_an_older_pod_the_wait_ran_out_on_does_not_overtake_even_when_woken_again() -> None:
    """A stuck older pod delays a younger one by `max_wait` once, not for
    as long as it stays stuck."""
    gate = AgeTurnstile(max_wait=0.05)
    with gate.entered("stuck", age(1)), gate.entered("young", age(2)):
        assert not gate.wait_turn("young", age(2))
        assert not gate.overtaken("young", age(2))
        gate.enter("stuck", age(1))  # added again while still in its worker
        assert not gate.overtaken("young", age(2))


def test_a_pod_that_left_and_is_queued_again_counts_again_and_the_heap_stays_small() -> None:
    gate = AgeTurnstile(max_wait=5)
    with gate.entered("young", age(10_000)):
        assert gate.wait_turn("young", age(10_000))
        for i in range(1000):
            gate.queue(f"p{i}", age(i))
            gate.enter(f"p{i}", age(i))
            gate.leave(f"p{i}")
        assert not gate.overtaken("young", age(10_000))
        assert len(gate._queued_heap) <= 2 * len(gate._queued) + 65
        gate.queue("p5", age(5))
        assert gate.overtaken("young", age(10_000))


def test_the_queue_tells_the_turnstile_of_gated_pods_it_makes_ready_not_released_ones() -> None:
    from gpuclaimctl.controller import TurnstileTracker
    from gpuclaimctl.model import api
    from gpuclaimctl.model.snapshot import parse_time
    from workqueue import Queue

    def pod(created: str, gated: bool = True, uid: str = "") -> dict:
        spec = {"schedulingGates": [{"name": api.SCHEDULING_GATE}]} if gated else {}
        return {"metadata": {"creationTimestamp": created, "uid": uid}, "spec": spec}

    pods = {"young": pod("2026-11-30T10:00:05Z"), "ungated": pod("2026-11-30T10:00:00Z", gated=False),
            "released": pod("2026-11-30T10:00:01Z", uid="u-released"),
            "old": pod("2026-11-30T10:00:02Z")}
    turnstile = AgeTurnstile(max_wait=5.0)
    q: Queue[str] = Queue(tracker=TurnstileTracker(
        turnstile, lambda ns, name: pods.get(name), lambda uid: uid == "u-released"))
    young = ("team/young", (0, parse_time("2026-11-30T10:00:05Z"), "team", "young"))
    q.add("pod:team/young")
    assert q.get()[0] == "pod:team/young"
    assert turnstile.wait_turn(*young)
    q.add_all(["pod:team/ungated", "pod:team/released", "claim:team/c", "pod:team/gone"])
    assert not turnstile.overtaken(*young)
    assert [q.get()[0] for _ in range(4)] == ["pod:team/ungated", "pod:team/released", "claim:team/c",
                                              "pod:team/gone"]
    assert len(turnstile) == 1, "handed out, none of them is waited for"
    q.add("pod:team/old")
    assert turnstile.overtaken(*young)
    q.shut_down()


def test_a_pod_entering_right_after_a_waiters_turn_came_counts_as_after_it() -> None:
    """The turn is taken in the same hold of the lock as the check that
    lets the waiter go: an older pod handed out between the two would be
    seen neither as queued nor as entering after the turn."""
    gate = AgeTurnstile(max_wait=5)
    real = gate._lock
    hook: dict[str, object] = {}

    class HookedLock:
        def __enter__(self) -> None:
            real.acquire()

        def __exit__(self, *_: object) -> None:
            real.release()
            if threading.current_thread() is hook.get("thread"):
                then = hook.pop("then", None)
                if callable(then):
                    then()

    gate._lock = HookedLock()  # type: ignore[assignment]
    gate.enter("first", age(0))
    gate.enter("young", age(2))
    went: list[bool] = []
    waiter = threading.Thread(target=lambda: went.append(gate.wait_turn("young", age(2))))
    hook["thread"] = waiter
    waiter.start()
    deadline = time.monotonic() + 5
    while "young" not in gate._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    hook["then"] = lambda: gate.enter("older", age(1))  # after the waiter's next hold
    gate.leave("first")
    waiter.join(5)
    assert went == [True]
    assert gate.overtaken("young", age(2)), "the older pod entered after the turn came"


def test_a_pod_ready_again_still_overtakes_a_younger_one_whose_wait_for_it_ran_out() -> None:
    from gpuclaimctl.controller import TurnstileTracker
    from gpuclaimctl.model.snapshot import parse_time

    pods = {"old": "2026-11-30T10:00:00Z", "young": "2026-11-30T10:00:01Z"}
    young = ("team/young", (0, parse_time(pods["young"]), "team", "young"))
    turnstile = AgeTurnstile(max_wait=0.05)
    tracker = TurnstileTracker(turnstile, lambda ns, name: _gated(pods[name]))
    tracker.handed_out("pod:team/young")
    tracker.handed_out("pod:team/old")
    tracker.added_while_processing("pod:team/old")
    tracker.finished("pod:team/old", True)  # ready again, no worker free
    assert not turnstile.wait_turn(*young)  # the wait for it ran out
    assert turnstile.overtaken(*young), "it is queued: the younger pod gives its turn up"
