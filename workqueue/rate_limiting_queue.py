"""A delaying queue that retries items through a rate limiter (client-go ``rate_limiting_queue.go``).

The worker loop calls ``add_rate_limited(key)`` when a sync fails (the
limiter picks the delay and counts the failure) and ``forget(key)`` when it
succeeds, so the next failure starts again from the shortest delay.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from workqueue.clock import Clock
from workqueue.delaying_queue import DelayingQueue
from workqueue.queue import UNFINISHED_WORK_UPDATE_PERIOD, HandOutTracker
from workqueue.queue_metrics import MetricsProvider
from workqueue.rate_limiters import RateLimiter

T = TypeVar("T", bound=Hashable)


class RateLimitingQueue(DelayingQueue[T]):
    """A ``DelayingQueue`` with ``add_rate_limited``, ``forget`` and ``num_requeues``."""

    __slots__ = ("_rate_limiter",)

    def __init__(
        self,
        rate_limiter: RateLimiter[T],
        name: str = "",
        *,
        metrics_provider: MetricsProvider | None = None,
        clock: Clock | None = None,
        unfinished_work_update_period: float = UNFINISHED_WORK_UPDATE_PERIOD,
        order: Callable[[T], Any] | None = None,
        tracker: HandOutTracker[T] | None = None,
    ) -> None:
        self._rate_limiter = rate_limiter
        super().__init__(
            name,
            metrics_provider=metrics_provider,
            clock=clock,
            unfinished_work_update_period=unfinished_work_update_period,
            order=order,
            tracker=tracker,
        )

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the delay the rate limiter gives it."""
        self.add_after(item, self._rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Reset ``item``'s failure count; it does not remove the item from the queue."""
        self._rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self._rate_limiter.num_requeues(item)
