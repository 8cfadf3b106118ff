"""Rate-limited work queues of keys with client-go's ``util/workqueue`` guarantees.

Nothing here starts a thread or registers a metric at import time; queues
start their background threads when constructed and stop them on shutdown.
Metrics reach a queue only through an injected ``MetricsProvider``.
"""

from __future__ import annotations

from workqueue.clock import Clock, FakeClock, RealClock
from workqueue.delaying_queue import DelayingQueue
from workqueue.queue import GetResult, HandOutTracker, Queue
from workqueue.queue_metrics import MetricsProvider
from workqueue.rate_limiters import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)
from workqueue.rate_limiting_queue import RateLimitingQueue

__all__ = [
    "BucketRateLimiter",
    "Clock",
    "DelayingQueue",
    "FakeClock",
    "GetResult",
    "HandOutTracker",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "MetricsProvider",
    "Queue",
    "RateLimiter",
    "RateLimitingQueue",
    "RealClock",
    "default_controller_rate_limiter",
]
