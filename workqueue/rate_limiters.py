"""Rate limiters: how long to wait before an item is retried (client-go ``default_rate_limiters.go``).

A limiter answers ``when(item)`` with a delay in seconds and counts the
item's failures until ``forget(item)``. All are safe to call from several
workers at once. Delays are floats in seconds; time comes from an injected
``Clock``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from workqueue.clock import Clock, RealClock

T = TypeVar("T", bound=Hashable)
T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)


class RateLimiter(Protocol[T_contra]):
    def when(self, item: T_contra) -> float:
        """The delay before ``item`` may be retried; counts one failure."""
        ...

    def forget(self, item: T_contra) -> None:
        """Stop tracking ``item``: it succeeded, or will not be retried."""
        ...

    def num_requeues(self, item: T_contra) -> int:
        """How many failures of ``item`` are being counted."""
        ...


class ItemExponentialFailureRateLimiter(Generic[T]):
    """``base_delay * 2**failures``, capped at ``max_delay``, per item."""

    def __init__(self, base_delay: float, max_delay: float) -> None:
        if base_delay < 0 or max_delay < 0:
            raise ValueError("delays must not be negative")
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._lock = threading.Lock()
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        with self._lock:
            exp = self._failures.get(item, 0)
            self._failures[item] = exp + 1
        try:
            # ldexp is exact for powers of two and raises, rather than
            # returning nonsense, once the result leaves the float range.
            backoff = math.ldexp(self._base_delay, exp)
        except OverflowError:
            return self._max_delay
        return min(backoff, self._max_delay)

    def num_requeues(self, item: T) -> int:
        with self._lock:
            return self._failures.get(item, 0)

    def forget(self, item: T) -> None:
        with self._lock:
            self._failures.pop(item, None)


class ItemFastSlowRateLimiter(Generic[T]):
    """``fast_delay`` for the first ``max_fast_attempts`` failures of an item, then ``slow_delay``."""

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        self._fast_delay = fast_delay
        self._slow_delay = slow_delay
        self._max_fast_attempts = max_fast_attempts
        self._lock = threading.Lock()
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        with self._lock:
            failures = self._failures.get(item, 0) + 1
            self._failures[item] = failures
        return self._fast_delay if failures <= self._max_fast_attempts else self._slow_delay

    def num_requeues(self, item: T) -> int:
        with self._lock:
            return self._failures.get(item, 0)

    def forget(self, item: T) -> None:
        with self._lock:
            self._failures.pop(item, None)


class BucketRateLimiter(Generic[T]):
    """A token bucket over all items: ``qps`` tokens a second, holding at most ``burst``.

    Each ``when`` reserves one token, as ``rate.Limiter.Reserve().Delay()``
    does in golang.org/x/time/rate: the bucket may go negative, and the
    delay is the time until the debt is repaid. It counts no failures.
    """

    def __init__(self, qps: float, burst: int, *, clock: Clock | None = None) -> None:
        if not qps > 0:
            raise ValueError("qps must be positive (math.inf for no limit)")
        if burst < 1 and qps != math.inf:
            raise ValueError("burst must be at least 1")
        self._qps = qps
        self._burst = float(burst)
        self._clock: Clock = clock if clock is not None else RealClock()
        self._lock = threading.Lock()
        # The bucket starts full.
        self._tokens = float(burst)
        self._last = self._clock.monotonic()

    def when(self, item: T) -> float:
        if self._qps == math.inf:
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            # x/time/rate's advance(): refill for the time since the last
            # reservation (never for time going back), up to the burst.
            elapsed = max(0.0, now - self._last)
            tokens = min(self._burst, self._tokens + elapsed * self._qps)
            tokens -= 1.0
            self._tokens = tokens
            self._last = now
        return -tokens / self._qps if tokens < 0 else 0.0

    def num_requeues(self, item: T) -> int:
        return 0

    def forget(self, item: T) -> None:
        pass


class MaxOfRateLimiter(Generic[T]):
    """The longest delay of several limiters; all of them count every call."""

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        if not limiters:
            raise ValueError("need at least one limiter")
        self._limiters = limiters

    def when(self, item: T) -> float:
        # Every limiter sees the call: each counts its own failures.
        return max(limiter.when(item) for limiter in self._limiters)

    def num_requeues(self, item: T) -> int:
        return max(limiter.num_requeues(item) for limiter in self._limiters)

    def forget(self, item: T) -> None:
        for limiter in self._limiters:
            limiter.forget(item)


# client-go DefaultControllerRateLimiter: per-item exponential backoff from
# 5 ms to 1000 s, and an overall 10 qps with bursts of 100.
DEFAULT_BASE_DELAY = 0.005
DEFAULT_MAX_DELAY = 1000.0
DEFAULT_QPS = 10.0
DEFAULT_BURST = 100


def default_controller_rate_limiter(*, clock: Clock | None = None) -> MaxOfRateLimiter[T]:
    """client-go's default for controllers: max of 5 ms..1000 s exponential and a 10 qps / 100 burst bucket."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY),
        BucketRateLimiter(DEFAULT_QPS, DEFAULT_BURST, clock=clock),
    )
