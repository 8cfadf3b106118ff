"""Queue: the client-go guarantees, one test each."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import wait_for
from workqueue import Queue
from workqueue.queue import GetResult


def get_now(q: Queue[str]) -> GetResult[str]:
    """``q.get()`` when an item is known to be queued; fails instead of blocking."""
    assert q.len() > 0 or q.shutting_down(), "get would block"
    return q.get()


def test_items_are_handed_out_in_the_order_they_were_first_added() -> None:
    q: Queue[str] = Queue()
    for key in ["pod:ns/a", "pod:ns/b", "claim:ns/c"]:
        q.add(key)

    assert [get_now(q) for _ in range(3)] == [
        ("pod:ns/a", False),
        ("pod:ns/b", False),
        ("claim:ns/c", False),
    ]


def test_an_item_added_while_it_waits_is_queued_once() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    q.add("b")
    q.add("a")

    assert q.len() == 2
    assert get_now(q) == ("a", False)
    assert get_now(q) == ("b", False)
    assert q.len() == 0


def test_an_item_being_processed_is_not_handed_to_another_worker() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    assert get_now(q) == ("a", False)

    q.add("a")
    q.add("b")

    # "a" is in flight: the next worker gets "b", and nothing else is ready.
    assert q.len() == 1
    assert get_now(q) == ("b", False)
    assert q.len() == 0


def test_an_item_added_while_being_processed_is_handed_out_again_after_done() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    assert get_now(q) == ("a", False)
    q.add("a")

    q.done("a")

    assert q.len() == 1
    assert get_now(q) == ("a", False)
    q.done("a")
    assert q.len() == 0


def test_an_item_not_added_again_is_not_handed_out_again_after_done() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    get_now(q)
    q.done("a")

    assert q.len() == 0
    q.add("a")
    assert get_now(q) == ("a", False)


def test_get_blocks_until_an_item_is_added() -> None:
    q: Queue[str] = Queue()
    got: list[GetResult[str]] = []
    getter = threading.Thread(target=lambda: got.append(q.get()))
    getter.start()
    # _idle_getters counts getters parked in get(): the one observable sign of blocking.
    wait_for(lambda: q._idle_getters == 1, timeout=5, message="the getter to block")
    assert got == []

    q.add("a")
    getter.join(timeout=5)

    assert got == [("a", False)]


def test_after_shut_down_adds_are_ignored_and_get_drains_then_reports_shutdown() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    q.add("b")

    q.shut_down()
    q.add("c")

    assert q.shutting_down()
    assert get_now(q) == ("a", False)
    assert get_now(q) == ("b", False)
    assert q.get() == (None, True)
    assert q.get() == (None, True)


def test_shut_down_wakes_every_blocked_getter() -> None:
    q: Queue[str] = Queue()
    got: list[GetResult[str]] = []
    getters = [threading.Thread(target=lambda: got.append(q.get())) for _ in range(3)]
    for getter in getters:
        getter.start()
    wait_for(lambda: q._idle_getters == 3, timeout=5, message="three getters to block")

    q.shut_down()
    for getter in getters:
        getter.join(timeout=5)

    assert got == [(None, True)] * 3


def test_an_item_added_again_while_processing_is_still_handed_out_after_shut_down() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    get_now(q)
    q.add("a")
    q.shut_down()

    q.done("a")

    assert get_now(q) == ("a", False)
    q.done("a")
    assert q.get() == (None, True)


def test_shut_down_with_drain_waits_for_the_items_in_flight() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    q.add("b")
    get_now(q)
    get_now(q)
    events: list[str] = []

    def drain() -> None:
        q.shut_down_with_drain()
        events.append("drained")

    drainer = threading.Thread(target=drain)
    drainer.start()
    wait_for(q.shutting_down, timeout=5, message="the drain to start")

    events.append("done a")
    q.done("a")
    events.append("done b")
    q.done("b")
    drainer.join(timeout=5)

    assert events == ["done a", "done b", "drained"]
    assert q.get() == (None, True)


def test_shut_down_with_drain_returns_at_once_when_nothing_is_in_flight() -> None:
    q: Queue[str] = Queue()
    q.add("a")

    q.shut_down_with_drain()

    # Queued (not in flight) items are still drained by get.
    assert get_now(q) == ("a", False)
    assert q.get() == (None, True)


def test_shut_down_ends_a_drain_that_is_waiting() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    get_now(q)
    drainer = threading.Thread(target=q.shut_down_with_drain)
    drainer.start()
    wait_for(q.shutting_down, timeout=5, message="the drain to start")

    q.shut_down()
    drainer.join(timeout=5)

    assert not drainer.is_alive()


@pytest.mark.parametrize("period", [0, -0.5], ids=["zero", "negative"])
def test_a_queue_refuses_an_update_period_that_is_not_positive(period: float) -> None:
    with pytest.raises(ValueError):
        Queue("pods", unfinished_work_update_period=period)


def test_a_queue_without_metrics_starts_no_thread() -> None:
    before = threading.active_count()

    q: Queue[str] = Queue("pods")

    assert threading.active_count() == before
    q.shut_down()


# -- an ordered ready list ------------------------------------------------------------


def test_ordered_queue_hands_out_lowest_order_first_and_ties_first_in():
    q: Queue[str] = Queue(order=lambda item: item[0])
    for item in ["c1", "a1", "b1", "a2"]:
        q.add(item)
    got = [q.get()[0] for _ in range(4)]
    assert got == ["a1", "a2", "b1", "c1"]


def test_ordered_queue_keeps_the_dedup_and_processing_guarantees():
    q: Queue[str] = Queue(order=lambda item: -int(item))
    q.add("1")
    q.add("1")
    assert q.len() == 1
    item, _ = q.get()
    q.add("1")  # added while processing: handed out again after done
    q.add("2")
    assert q.get()[0] == "2"
    q.done("2")
    assert q.len() == 0
    q.done(item)
    assert q.get()[0] == "1"
    q.shut_down()
    assert q.get() == (None, True)


def test_ordered_delaying_queue_orders_what_became_ready_together():
    from workqueue import FakeClock, RateLimitingQueue, default_controller_rate_limiter

    clock = FakeClock()
    q: RateLimitingQueue[str] = RateLimitingQueue(default_controller_rate_limiter(), clock=clock,
                                                  order=lambda item: item)
    try:
        q.add_after("z", 1.0)
        q.add_after("m", 1.0)
        q.add("y")
        assert q.get()[0] == "y"
        clock.step(1.5)
        wait_for(lambda: q.len() == 2, timeout=5, interval=0.005, message="both due")
        assert [q.get()[0], q.get()[0]] == ["m", "z"]
    finally:
        q.shut_down()


def test_add_all_lets_a_waiting_getter_see_every_item_before_it_takes_one():
    """A worker idle in get() is woken by the first add; with one add per
    item it can take that item before a lower one is in. add_all holds the
    lock for the batch, so it gets the lowest."""
    import sys

    q: Queue[int] = Queue(order=lambda item: item)
    got: list[int] = []
    waiting = threading.Event()

    def getter() -> None:
        waiting.set()
        got.append(q.get()[0])  # type: ignore[arg-type]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        t = threading.Thread(target=getter)
        t.start()
        waiting.wait()
        wait_for(lambda: q._idle_getters == 1, timeout=5, interval=0.001, message="getter idle")
        q.add_all(range(2000, 0, -1))  # the lowest comes last
        t.join(5)
    finally:
        sys.setswitchinterval(old)
        q.shut_down()
    assert got == [1]


def test_a_tracker_sees_hand_outs_re_adds_and_dones_in_order():
    calls: list[tuple[str, str, bool | None]] = []

    class Tracker:
        def queued(self, item: str) -> None:
            calls.append(("ready", item, None))

        def handed_out(self, item: str) -> None:
            calls.append(("out", item, None))

        def added_while_processing(self, item: str) -> None:
            calls.append(("again", item, None))

        def finished(self, item: str, again: bool) -> None:
            calls.append(("done", item, again))

    q: Queue[str] = Queue(tracker=Tracker())
    q.add("a")
    assert get_now(q)[0] == "a"
    q.add("a")  # added while processing
    q.done("a")  # so handed out again
    assert get_now(q)[0] == "a"
    q.done("a")
    assert calls == [("ready", "a", None), ("out", "a", None), ("again", "a", None),
                     ("done", "a", True), ("out", "a", None), ("done", "a", False)]
    q.shut_down()
