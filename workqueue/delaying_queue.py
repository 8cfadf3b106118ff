"""A work queue that can add an item after a delay (client-go ``delaying_queue.go``).

Items not yet due wait in a heap ordered by ready time. One background
thread moves due items into the queue and otherwise sleeps on a condition
until the earliest ready time (or indefinitely when nothing waits), through
the injected clock: it never polls. ``add_after`` wakes it only when the new
item becomes the earliest.

Like client-go: a delay <= 0 adds at once; an item that already waits keeps
the earlier of its two ready times; every ``add_after`` counts as a retry in
the metrics; items still waiting at shutdown are dropped.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from workqueue.clock import Clock
from workqueue.queue import UNFINISHED_WORK_UPDATE_PERIOD, HandOutTracker, Queue
from workqueue.queue_metrics import CounterMetric, MetricsProvider

T = TypeVar("T", bound=Hashable)

# (ready_at, sequence, item): the sequence breaks ties in add order and keeps
# items, which need not be orderable, out of the comparison.
_Entry = tuple[float, int, T]


class DelayingQueue(Queue[T]):
    """A ``Queue`` with ``add_after``."""

    __slots__ = ("_delay_cond", "_waiting", "_entries", "_sequence", "_retries")

    def __init__(
        self,
        name: str = "",
        *,
        metrics_provider: MetricsProvider | None = None,
        clock: Clock | None = None,
        unfinished_work_update_period: float = UNFINISHED_WORK_UPDATE_PERIOD,
        order: Callable[[T], Any] | None = None,
        tracker: HandOutTracker[T] | None = None,
    ) -> None:
        super().__init__(
            name,
            metrics_provider=metrics_provider,
            clock=clock,
            unfinished_work_update_period=unfinished_work_update_period,
            order=order,
            tracker=tracker,
        )
        # The waiting thread sleeps here; it shares the queue's lock so that
        # moving an item from the heap to the queue is one critical section.
        self._delay_cond = threading.Condition(self._lock)
        # Heap of entries. An entry is live only while ``_entries`` maps its
        # item to it; one superseded by an earlier ready time stays in the
        # heap until it comes up and is then skipped.
        self._waiting: list[_Entry[T]] = []
        self._entries: dict[T, _Entry[T]] = {}
        self._sequence = itertools.count()
        self._retries: CounterMetric | None = (
            metrics_provider.new_retries_metric(name)
            if metrics_provider is not None and name
            else None
        )
        self._start_thread(self._waiting_loop, "delay")

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed on the queue's clock."""
        with self._lock:
            if self._shutting_down:
                return
            if self._retries is not None:
                self._retries.inc()
            if not delay > 0:  # NaN too: it has no place in the heap's order
                self._add_locked(item)
                return
            ready_at = self._clock.monotonic() + delay
            known = self._entries.get(item)
            if known is not None and known[0] <= ready_at:
                return
            entry = (ready_at, next(self._sequence), item)
            self._entries[item] = entry
            heapq.heappush(self._waiting, entry)
            if self._waiting[0] is entry:
                # The waiting thread sleeps until a later time, or forever.
                self._delay_cond.notify()

    def waiting_len(self) -> int:
        """How many items wait for their delay to pass."""
        with self._lock:
            return len(self._entries)

    def _begin_shut_down_locked(self) -> None:
        super()._begin_shut_down_locked()
        self._waiting.clear()
        self._entries.clear()
        self._delay_cond.notify_all()

    def _waiting_loop(self) -> None:
        clock = self._clock
        waiting = self._waiting
        entries = self._entries
        with self._lock:
            while not self._shutting_down:
                now = clock.monotonic()
                while waiting and waiting[0][0] <= now:
                    entry = heapq.heappop(waiting)
                    item = entry[2]
                    if entries.get(item) is entry:
                        del entries[item]
                        self._add_locked(item)
                clock.wait_until(self._delay_cond, waiting[0][0] if waiting else None)
