"""RateLimitingQueue: retries go through the limiter, on a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workqueue import FakeClock, ItemExponentialFailureRateLimiter, RateLimitingQueue

START = 1_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=START)


@pytest.fixture
def q(clock: FakeClock) -> Iterator[RateLimitingQueue[str]]:
    queue: RateLimitingQueue[str] = RateLimitingQueue(
        ItemExponentialFailureRateLimiter(1, 60), "retries", clock=clock
    )
    yield queue
    queue.shut_down()


def test_add_rate_limited_adds_the_item_after_the_limiter_delay(
    clock: FakeClock, q: RateLimitingQueue[str]
) -> None:
    q.add_rate_limited("claim:ns/c")
    clock.wait_for_sleeper(START + 1)
    assert q.len() == 0

    clock.step(1)
    clock.wait_for_sleeper(None)

    assert q.get() == ("claim:ns/c", False)


def test_each_failure_doubles_the_wait_and_counts_a_requeue(
    clock: FakeClock, q: RateLimitingQueue[str]
) -> None:
    for expected_delay in [1, 2, 4]:
        q.add_rate_limited("a")
        ready_at = clock.monotonic() + expected_delay
        clock.wait_for_sleeper(ready_at)
        clock.step(expected_delay)
        clock.wait_for_sleeper(None)
        assert q.get() == ("a", False)
        q.done("a")

    assert q.num_requeues("a") == 3


def test_forget_resets_the_requeues_so_the_next_failure_waits_the_base_delay(
    clock: FakeClock, q: RateLimitingQueue[str]
) -> None:
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 2

    q.forget("a")

    assert q.num_requeues("a") == 0
    q.add_rate_limited("a")
    # The earlier waits (1 s, 2 s) and this one (1 s) collapse to the earliest.
    assert q.waiting_len() == 1
    clock.wait_for_sleeper(START + 1)


def test_forget_does_not_remove_a_queued_item(q: RateLimitingQueue[str]) -> None:
    q.add("a")

    q.forget("a")

    assert q.get() == ("a", False)


def test_add_rate_limited_is_ignored_after_shut_down(q: RateLimitingQueue[str]) -> None:
    q.shut_down()

    q.add_rate_limited("a")

    assert q.waiting_len() == 0
    assert q.get() == (None, True)
