"""The time seam of the work queues (client-go's ``k8s.io/utils/clock``).

Every timed decision in ``workqueue`` -- when a delayed item becomes ready,
how long an item waited, when the unfinished-work gauges are refreshed, how
many tokens a bucket holds -- reads time through a ``Clock`` and blocks
through ``Clock.wait_until``. ``RealClock`` is the production default;
``FakeClock`` lets tests move time by hand and wakes the threads that wait
on it, so timing is tested deterministically without sleeping.

This module must not start threads or touch global state.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What the queues need from time."""

    def now(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified or ``monotonic() >= deadline``.

        ``deadline`` None waits for a notification only. Like ``Condition.wait``
        it may return early; callers re-check their state in a loop.
        """
        ...


class RealClock:
    """The system clocks; waiting is ``Condition.wait`` with a timeout."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        if deadline is None:
            cond.wait()
            return
        timeout = deadline - time.monotonic()
        if timeout > 0:
            # Condition.wait raises OverflowError past TIMEOUT_MAX (~292
            # years): a deadline that far off (an item added with a huge
            # delay) would kill the thread that waits for it. Waking once in
            # 292 years instead changes nothing.
            cond.wait(min(timeout, threading.TIMEOUT_MAX))


class _Sleeper:
    __slots__ = ("cond", "deadline")

    def __init__(self, cond: threading.Condition, deadline: float | None) -> None:
        self.cond = cond
        self.deadline = deadline


class FakeClock:
    """A clock that moves only when ``step`` is called.

    A thread in ``wait_until`` is registered as a sleeper; ``step`` wakes
    every sleeper whose deadline has been reached. Registration happens
    while the sleeper still holds its condition's lock, and ``step`` takes
    that lock to notify, so a wake-up can never fall between a sleeper
    reading the time and starting to wait.
    """

    def __init__(self, now: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        # Guards the times and the sleeper list; also notified whenever a
        # sleeper registers, for ``wait_for_sleeper``.
        self._lock = threading.Condition(threading.Lock())
        self._wall = now
        self._mono = monotonic
        self._sleepers: list[_Sleeper] = []

    def now(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def step(self, seconds: float) -> None:
        """Move both clocks forward and wake the sleepers that are now due."""
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        with self._lock:
            self._wall += seconds
            self._mono += seconds
            due = [s for s in self._sleepers if s.deadline is not None and s.deadline <= self._mono]
            for sleeper in due:
                self._sleepers.remove(sleeper)
        # Notify outside our own lock: a sleeper holds its condition's lock
        # when it takes ours, so taking them in the other order could deadlock.
        for sleeper in due:
            with sleeper.cond:
                sleeper.cond.notify_all()

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        sleeper = _Sleeper(cond, deadline)
        with self._lock:
            if deadline is not None and deadline <= self._mono:
                return
            self._sleepers.append(sleeper)
            self._lock.notify_all()
        try:
            cond.wait()
        finally:
            with self._lock:
                if sleeper in self._sleepers:
                    self._sleepers.remove(sleeper)

    def sleepers(self) -> list[float | None]:
        """Deadlines of the threads waiting on this clock right now (None: no deadline)."""
        with self._lock:
            return self._deadlines()

    def _deadlines(self) -> list[float | None]:
        return [s.deadline for s in self._sleepers]

    def wait_for_sleeper(self, deadline: float | None, timeout: float = 5.0) -> None:
        """Block until some thread waits on this clock with exactly ``deadline``.

        Tests use it to know a background thread has seen the latest state
        and gone back to sleep. ``timeout`` (real seconds) only bounds a
        broken test; it plays no part in what is being timed.
        """
        with self._lock:
            if not self._lock.wait_for(
                lambda: any(s.deadline == deadline for s in self._sleepers), timeout
            ):
                raise TimeoutError(
                    f"no thread waited until {deadline!r}; sleepers: {self._deadlines()}"
                )
