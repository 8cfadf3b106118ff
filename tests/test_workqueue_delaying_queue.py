"""DelayingQueue: add_after on a fake clock, one guarantee per test.

``FakeClock.wait_for_sleeper(t)`` returns once the queue's waiting thread
has gone to sleep until ``t`` (None: until woken), i.e. once it has acted
on everything that was due; the tests then look at the queue. A test waits
for the new sleep after every ``add_after`` that makes an earlier item and
after every ``step``: a thread woken by a notify still shows as asleep
until it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from workqueue import DelayingQueue, FakeClock

START = 1_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=START)


@pytest.fixture
def q(clock: FakeClock) -> Iterator[DelayingQueue[str]]:
    queue: DelayingQueue[str] = DelayingQueue("delayed", clock=clock)
    yield queue
    queue.shut_down()


def delay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("workqueue-delay-")]


def test_an_item_is_added_once_its_delay_has_passed(
    clock: FakeClock, q: DelayingQueue[str]
) -> None:
    q.add_after("a", 10)
    clock.wait_for_sleeper(START + 10)
    assert q.len() == 0

    clock.step(9.5)
    clock.wait_for_sleeper(START + 10)
    assert q.len() == 0

    clock.step(0.5)
    clock.wait_for_sleeper(None)
    assert q.len() == 1
    assert q.get() == ("a", False)


def test_items_become_ready_in_the_order_of_their_ready_times(
    clock: FakeClock, q: DelayingQueue[str]
) -> None:
    q.add_after("late", 30)
    q.add_after("early", 10)
    q.add_after("middle", 20)
    clock.wait_for_sleeper(START + 10)

    clock.step(30)
    clock.wait_for_sleeper(None)

    assert [q.get() for _ in range(3)] == [("early", False), ("middle", False), ("late", False)]


@pytest.mark.parametrize("delay", [0, -1.5], ids=["zero", "negative"])
def test_a_delay_of_zero_or_less_adds_at_once(q: DelayingQueue[str], delay: float) -> None:
    q.add_after("a", delay)

    assert q.len() == 1
    assert q.waiting_len() == 0


def test_adding_a_waiting_item_again_with_a_later_time_keeps_the_earlier(
    clock: FakeClock, q: DelayingQueue[str]
) -> None:
    q.add_after("a", 10)
    q.add_after("a", 20)
    assert q.waiting_len() == 1
    clock.wait_for_sleeper(START + 10)

    clock.step(10)
    clock.wait_for_sleeper(None)

    assert q.len() == 1
    assert q.waiting_len() == 0


def test_adding_a_waiting_item_again_with_an_earlier_time_moves_it_up_once(
    clock: FakeClock, q: DelayingQueue[str]
) -> None:
    q.add_after("a", 20)
    q.add_after("a", 5)
    assert q.waiting_len() == 1
    clock.wait_for_sleeper(START + 5)

    clock.step(5)
    clock.wait_for_sleeper(START + 20)  # the superseded entry is still in the heap
    assert q.get() == ("a", False)
    q.done("a")

    clock.step(15)
    clock.wait_for_sleeper(None)
    # The superseded ready time did not add "a" a second time.
    assert q.len() == 0


def test_the_waiting_thread_sleeps_until_the_earliest_ready_time_and_never_polls() -> None:
    waits: list[float | None] = []

    class CountingClock(FakeClock):
        def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
            waits.append(deadline)
            super().wait_until(cond, deadline)

    clock = CountingClock(monotonic=START)
    q: DelayingQueue[str] = DelayingQueue(clock=clock)
    clock.wait_for_sleeper(None)  # nothing waits: sleep until woken
    q.add_after("a", 30)
    clock.wait_for_sleeper(START + 30)
    q.add_after("b", 10)
    clock.wait_for_sleeper(START + 10)
    q.add_after("c", 20)  # not the earliest: the thread is not woken

    clock.step(10)
    clock.wait_for_sleeper(START + 20)
    clock.step(10)
    clock.wait_for_sleeper(START + 30)
    clock.step(10)
    clock.wait_for_sleeper(None)
    q.shut_down()

    assert q.len() == 3
    # One wait per change of the earliest ready time, none in between.
    assert waits == [None, START + 30, START + 10, START + 20, START + 30, None]


def test_add_after_is_ignored_after_shut_down(clock: FakeClock, q: DelayingQueue[str]) -> None:
    q.shut_down()

    q.add_after("a", 0)
    q.add_after("b", 1)

    assert q.len() == 0
    assert q.waiting_len() == 0


def test_shut_down_stops_the_waiting_thread_and_drops_waiting_items(clock: FakeClock) -> None:
    q: DelayingQueue[str] = DelayingQueue("stopping", clock=clock)
    q.add_after("a", 10)
    assert [t.name for t in delay_threads()] == ["workqueue-delay-stopping"]

    q.shut_down()

    assert delay_threads() == []
    assert q.waiting_len() == 0
    clock.step(10)
    assert q.get() == (None, True)


def test_shut_down_with_drain_stops_the_waiting_thread(clock: FakeClock) -> None:
    q: DelayingQueue[str] = DelayingQueue("draining", clock=clock)
    q.add_after("a", 10)

    q.shut_down_with_drain()

    assert delay_threads() == []


def test_add_after_waits_on_the_real_clock_by_default() -> None:
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("a", 0.01)

    # get blocks until the waiting thread adds the item.
    assert q.get() == ("a", False)
    q.shut_down()


def test_a_delay_of_centuries_does_not_kill_the_waiting_thread() -> None:
    # A GPUClaim whose status.rejectedNodes[].until is 9999-12-31 (valid for
    # the CRD's date-time format) requeued its keys ~2.5e11 s ahead; waiting
    # that long raised OverflowError in the waiting thread, which died, and
    # no delayed key (retries with backoff included) was ever added again.
    q: DelayingQueue[str] = DelayingQueue()
    try:
        q.add_after("far", 2.5e11)
        q.add_after("inf", float("inf"))
        deadline = threading.Event()
        deadline.wait(0.2)  # the waiting thread now sleeps until "far"
        assert [t for t in delay_threads() if t.is_alive()]
        q.add_after("soon", 0.01)
        for _ in range(100):
            if q.len():
                break
            deadline.wait(0.02)
        assert q.get() == ("soon", False)
    finally:
        q.shut_down()


def test_a_nan_delay_adds_at_once(q: DelayingQueue[str]) -> None:
    q.add_after("a", float("nan"))
    assert q.len() == 1
