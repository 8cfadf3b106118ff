"""Rate limiters: client-go's delays, on a fake clock where time matters."""

from __future__ import annotations

import threading

import pytest

from workqueue import (
    BucketRateLimiter,
    FakeClock,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    default_controller_rate_limiter,
)


def test_exponential_delay_doubles_per_failure_of_the_same_item() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )

    assert [limiter.when("a") for _ in range(5)] == [0.001, 0.002, 0.004, 0.008, 0.016]
    assert limiter.num_requeues("a") == 5


def test_exponential_delay_is_counted_per_item() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )
    limiter.when("a")
    limiter.when("a")

    assert limiter.when("b") == 0.001
    assert limiter.num_requeues("a") == 2
    assert limiter.num_requeues("b") == 1


def test_exponential_delay_is_capped_at_the_maximum() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(1, 10)

    assert [limiter.when("a") for _ in range(6)] == [1, 2, 4, 8, 10, 10]


def test_exponential_delay_does_not_overflow_after_very_many_failures() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.005, 1000
    )

    delays = [limiter.when("a") for _ in range(5000)]

    assert delays[-1] == 1000
    assert max(delays) == 1000
    assert limiter.num_requeues("a") == 5000


def test_forget_restarts_the_exponential_delay_from_the_base() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )
    limiter.when("a")
    limiter.when("a")

    limiter.forget("a")

    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.001


def test_exponential_failures_from_many_threads_are_all_counted() -> None:
    limiter: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )

    def fail_many() -> None:
        for _ in range(1000):
            limiter.when("a")

    threads = [threading.Thread(target=fail_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert limiter.num_requeues("a") == 4000


def test_fast_slow_gives_the_fast_delay_for_the_first_attempts_then_the_slow() -> None:
    limiter: ItemFastSlowRateLimiter[str] = ItemFastSlowRateLimiter(0.005, 10, 3)

    assert [limiter.when("a") for _ in range(5)] == [0.005, 0.005, 0.005, 10, 10]
    assert limiter.when("b") == 0.005
    assert limiter.num_requeues("a") == 5

    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.005


def test_bucket_lets_a_burst_through_then_spaces_requests_at_the_rate() -> None:
    clock = FakeClock()
    limiter: BucketRateLimiter[str] = BucketRateLimiter(10, 3, clock=clock)

    delays = [limiter.when(f"item-{i}") for i in range(6)]

    # Each reservation beyond the burst waits for one more token at 10/s.
    assert delays[:3] == [0, 0, 0]
    assert delays[3:] == pytest.approx([0.1, 0.2, 0.3])


def test_bucket_refills_with_time_up_to_the_burst() -> None:
    clock = FakeClock()
    limiter: BucketRateLimiter[str] = BucketRateLimiter(10, 3, clock=clock)
    for _ in range(3):
        limiter.when("a")

    clock.step(0.2)
    assert [limiter.when("a") for _ in range(3)] == pytest.approx([0, 0, 0.1])

    clock.step(3600)
    assert [limiter.when("a") for _ in range(4)] == pytest.approx([0, 0, 0, 0.1])


def test_bucket_repays_reservations_made_in_advance() -> None:
    clock = FakeClock()
    limiter: BucketRateLimiter[str] = BucketRateLimiter(10, 1, clock=clock)
    limiter.when("a")
    assert limiter.when("a") == pytest.approx(0.1)
    assert limiter.when("a") == pytest.approx(0.2)

    # 0.1 s later one reserved token is repaid; the next waits behind the other.
    clock.step(0.1)
    assert limiter.when("a") == pytest.approx(0.2)


def test_bucket_counts_no_requeues() -> None:
    limiter: BucketRateLimiter[str] = BucketRateLimiter(10, 1, clock=FakeClock())
    limiter.when("a")
    limiter.when("a")

    limiter.forget("a")

    assert limiter.num_requeues("a") == 0


@pytest.mark.parametrize(
    ("qps", "burst"), [(0, 10), (-1, 10), (10, 0)], ids=["zero-qps", "negative-qps", "zero-burst"]
)
def test_bucket_refuses_a_rate_that_would_never_let_anything_through(
    qps: float, burst: int
) -> None:
    with pytest.raises(ValueError):
        BucketRateLimiter(qps, burst)


def test_bucket_with_infinite_rate_never_delays() -> None:
    limiter: BucketRateLimiter[str] = BucketRateLimiter(float("inf"), 0, clock=FakeClock())

    assert [limiter.when("a") for _ in range(1000)] == [0.0] * 1000


def test_max_of_returns_the_longest_delay_and_the_most_requeues() -> None:
    fast_slow: ItemFastSlowRateLimiter[str] = ItemFastSlowRateLimiter(0.005, 3, 1)
    exponential: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )
    limiter = MaxOfRateLimiter(fast_slow, exponential)

    assert [limiter.when("a") for _ in range(3)] == [0.005, 3, 3]
    assert limiter.num_requeues("a") == 3
    # Both limiters counted every call.
    assert fast_slow.num_requeues("a") == 3
    assert exponential.num_requeues("a") == 3


def test_max_of_forget_forgets_in_every_limiter() -> None:
    fast_slow: ItemFastSlowRateLimiter[str] = ItemFastSlowRateLimiter(0.005, 3, 1)
    exponential: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        0.001, 1000
    )
    limiter = MaxOfRateLimiter(fast_slow, exponential)
    limiter.when("a")
    limiter.when("a")

    limiter.forget("a")

    assert fast_slow.num_requeues("a") == 0
    assert exponential.num_requeues("a") == 0
    assert limiter.when("a") == 0.005


def test_default_controller_limiter_backs_off_an_item_from_5ms_to_1000s() -> None:
    limiter: MaxOfRateLimiter[str] = default_controller_rate_limiter(clock=FakeClock())

    delays = [limiter.when("a") for _ in range(30)]

    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1000
    assert limiter.num_requeues("a") == 30


def test_default_controller_limiter_allows_a_burst_of_100_then_10_per_second() -> None:
    clock = FakeClock()
    limiter: MaxOfRateLimiter[str] = default_controller_rate_limiter(clock=clock)

    # Distinct items, each failing once: only the bucket can delay them.
    delays = [limiter.when(f"pod:ns/p{i}") for i in range(102)]

    assert delays[:100] == [0.005] * 100
    assert delays[100:] == pytest.approx([0.1, 0.2])
    clock.step(10)
    assert limiter.when("pod:ns/late") == pytest.approx(0.005)
