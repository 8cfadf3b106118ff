"""The work queue (client-go ``util/workqueue/queue.go``).

Guarantees, the same as client-go's:

* items are handed out in the order they were first added (FIFO);
* an item added while it already waits is not added twice;
* an item is never handed to two workers at once: while it is being
  processed (between ``get`` and ``done``) it is not handed out again;
* an item added while it is being processed is handed out again after
  ``done``;
* after ``shut_down`` adds are ignored and ``get`` drains what is queued,
  then reports shutdown; ``shut_down_with_drain`` also waits for the items
  in flight.

Everything is guarded by one lock with one condition for getters, so the
hot path (``add``/``get``/``done``) is a lock round trip on a deque and two
sets. With metrics off it makes no calls beyond those.

With ``order`` (client-go's ``TypedQueueConfig.Queue``, a pluggable ready
list), items ready at the same time are handed out lowest ``order(item)``
first instead of first-in: a controller can hand its oldest waiting pods
to the first free worker. The other guarantees are unchanged; ``order`` is
evaluated once, when an item joins the ready list, outside nothing but the
queue's lock, so it must be quick and must not call back into the queue.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Hashable
from collections.abc import Iterable
from typing import Any, Generic, Literal, Protocol, TypeVar, Union

from workqueue.clock import Clock, RealClock
from workqueue.queue_metrics import MetricsProvider, QueueMetrics, new_queue_metrics

T = TypeVar("T", bound=Hashable)

# client-go's defaultUnfinishedWorkUpdatePeriod: how often the
# unfinished-work and longest-running gauges are refreshed.
UNFINISHED_WORK_UPDATE_PERIOD = 0.5

# What ``get`` returns: an item, or (None, True) once shut down and drained.
# Indexing narrows it (``got = q.get(); if got[1]: return``).
GetResult = Union[tuple[T, Literal[False]], tuple[None, Literal[True]]]

T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)


class HandOutTracker(Protocol[T_contra]):
    """Told, under the queue's lock, when an item is put in the ready list
    by an add, handed out, added again while it is processed, and done
    (``again``: it will be handed out once more). So a caller can keep a
    picture of its items that no hand-out can slip past (the controller's
    turnstile). Each call must be quick and must not call back into the
    queue."""

    def queued(self, item: T_contra) -> None: ...

    def handed_out(self, item: T_contra) -> None: ...

    def added_while_processing(self, item: T_contra) -> None: ...

    def finished(self, item: T_contra, again: bool) -> None: ...


class OrderedReady(Generic[T]):
    """The ready list as a heap on ``(order(item), arrival)``: the same
    ``append``/``popleft``/``len`` as the deque it replaces, so the queue's
    hot path does not branch on which one it has. Ties go first-in."""

    __slots__ = ("_order", "_heap", "_arrival")

    def __init__(self, order: Callable[[T], Any]) -> None:
        self._order = order
        self._heap: list[tuple[Any, int, T]] = []
        self._arrival = itertools.count()

    def append(self, item: T) -> None:
        heapq.heappush(self._heap, (self._order(item), next(self._arrival), item))

    def popleft(self) -> T:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


class Queue(Generic[T]):
    """A de-duplicating FIFO work queue of hashable items (keys)."""

    __slots__ = (
        "_lock",
        "_cond",
        "_queue",
        "_dirty",
        "_processing",
        "_idle_getters",
        "_shutting_down",
        "_drain",
        "_clock",
        "_name",
        "_metrics",
        "_updater_cond",
        "_update_period",
        "_threads",
        "_tracker",
    )

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
        if not unfinished_work_update_period > 0:
            raise ValueError("unfinished_work_update_period must be positive")
        self._lock = threading.Lock()
        # Getters wait here for an item; shut_down_with_drain waits here for
        # processing to empty.
        self._cond = threading.Condition(self._lock)
        # Items ready to be handed out, in order. Every item in it is in
        # ``_dirty`` and none is in ``_processing``. First-in first-out, or
        # lowest ``order`` first.
        self._queue: deque[T] | OrderedReady[T] = (
            deque() if order is None else OrderedReady(order))
        # Told of hand-outs, re-adds while processing and dones, under the
        # queue's lock, in the order they happen.
        self._tracker = tracker
        # Items that need processing: those in ``_queue`` plus those added
        # again while being processed.
        self._dirty: set[T] = set()
        # Items handed out and not yet ``done``.
        self._processing: set[T] = set()
        # Getters blocked in ``_cond.wait``: add and done notify only when
        # one exists, which spares the notify call on a busy queue.
        self._idle_getters = 0
        self._shutting_down = False
        # True while a shut_down_with_drain waits for processing to empty.
        self._drain = False
        self._clock: Clock = clock if clock is not None else RealClock()
        self._name = name
        self._metrics: QueueMetrics[T] | None = new_queue_metrics(
            metrics_provider, name, self._clock
        )
        self._updater_cond: threading.Condition | None = None
        self._update_period = unfinished_work_update_period
        # Background threads, joined on shutdown.
        self._threads: list[threading.Thread] = []
        if self._metrics is not None:
            # Like client-go, a queue that records metrics refreshes its
            # unfinished-work gauges periodically; one without starts nothing.
            self._updater_cond = threading.Condition(self._lock)
            self._start_thread(self._update_unfinished_work_loop, "unfinished-work")

    @property
    def name(self) -> str:
        return self._name

    def add(self, item: T) -> None:
        """Mark ``item`` as needing processing."""
        # The body of _add_locked, inlined: this is the hot path.
        with self._lock:
            if self._shutting_down or item in self._dirty:
                return
            metrics = self._metrics
            if metrics is not None:
                metrics.add(item)
            self._dirty.add(item)
            if item in self._processing:
                # Handed out again by done().
                if self._tracker is not None:
                    self._tracker.added_while_processing(item)
                return
            self._queue.append(item)
            if self._tracker is not None:
                self._tracker.queued(item)
            if self._idle_getters:
                self._cond.notify()

    def add_all(self, items: Iterable[T]) -> None:
        """``add`` each item, all under one hold of the lock: a getter woken
        by the first sees them all, so with ``order`` it gets the lowest of
        them, not whichever was added first."""
        with self._lock:
            for item in items:
                self._add_locked(item)

    def _add_locked(self, item: T) -> None:
        if self._shutting_down or item in self._dirty:
            return
        metrics = self._metrics
        if metrics is not None:
            metrics.add(item)
        self._dirty.add(item)
        if item in self._processing:
            if self._tracker is not None:
                self._tracker.added_while_processing(item)
            return
        self._queue.append(item)
        if self._tracker is not None:
            self._tracker.queued(item)
        if self._idle_getters:
            self._cond.notify()

    def len(self) -> int:
        """How many items wait to be handed out (client-go ``Len``).

        A method rather than ``__len__`` so that an empty queue is not falsy.
        """
        with self._lock:
            return len(self._queue)

    def get(self) -> GetResult[T]:
        """Block until an item can be handed out; return ``(item, False)``.

        After shutdown, returns what is still queued, then ``(None, True)``.
        The caller must call ``done(item)`` when it has processed the item.
        """
        with self._lock:
            queue = self._queue
            while not queue:
                if self._shutting_down:
                    return None, True
                self._idle_getters += 1
                try:
                    self._cond.wait()
                finally:
                    self._idle_getters -= 1
            item = queue.popleft()
            if self._tracker is not None:
                self._tracker.handed_out(item)
            metrics = self._metrics
            if metrics is not None:
                metrics.get(item)
            self._processing.add(item)
            self._dirty.discard(item)
            return item, False

    def done(self, item: T) -> None:
        """Mark ``item`` processed; if it was added meanwhile, queue it again."""
        with self._lock:
            metrics = self._metrics
            if metrics is not None:
                metrics.done(item)
            processing = self._processing
            processing.discard(item)
            again = item in self._dirty
            if again:
                self._queue.append(item)
                if self._idle_getters:
                    self._cond.notify()
            if self._tracker is not None:
                self._tracker.finished(item, again)
            if not processing and self._drain:
                self._cond.notify_all()

    def shut_down(self) -> None:
        """Ignore further adds; getters drain the queue, then see shutdown."""
        with self._lock:
            # A shut_down_with_drain waiting elsewhere stops waiting.
            self._drain = False
            self._begin_shut_down_locked()
        self._join_threads()

    def shut_down_with_drain(self) -> None:
        """Like ``shut_down``, then wait until every item handed out is ``done``.

        Must not be called from a worker that holds an item: it would wait
        for itself.
        """
        with self._lock:
            self._drain = True
            self._begin_shut_down_locked()
            while self._processing and self._drain:
                self._cond.wait()
        self._join_threads()

    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def update_unfinished_work(self) -> None:
        """Refresh the unfinished-work and longest-running gauges.

        Called every ``unfinished_work_update_period`` by the queue's updater
        thread when the queue records metrics; callable directly.
        """
        with self._lock:
            if self._metrics is not None and not self._shutting_down:
                self._metrics.update_unfinished_work()

    def _begin_shut_down_locked(self) -> None:
        self._shutting_down = True
        self._cond.notify_all()
        if self._updater_cond is not None:
            self._updater_cond.notify_all()

    def _start_thread(self, target: Callable[[], None], role: str) -> None:
        thread = threading.Thread(
            target=target,
            name=f"workqueue-{role}-{self._name or 'unnamed'}",
            # A queue nobody shuts down must not keep the process alive.
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()

    def _join_threads(self) -> None:
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()

    def _update_unfinished_work_loop(self) -> None:
        cond = self._updater_cond
        metrics = self._metrics
        assert cond is not None and metrics is not None
        clock = self._clock
        period = self._update_period
        with self._lock:
            next_tick = clock.monotonic() + period
            while not self._shutting_down:
                clock.wait_until(cond, next_tick)
                if self._shutting_down:
                    return
                now = clock.monotonic()
                if now < next_tick:
                    continue
                metrics.update_unfinished_work()
                # Like a Go ticker, skip the ticks that were missed.
                while next_tick <= now:
                    next_tick += period
