"""The time seam of the informers (client-go's ``k8s.io/utils/clock``).

Backoff waits, backoff resets and resync schedules read time through a
``Clock`` and block through ``Clock.wait_until``. ``RealClock`` is the
production default; ``FakeClock`` lets tests move time by hand and wakes the
threads waiting on it, so timing is tested without sleeping.

This module must not start threads or touch global state.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol


class Clock(Protocol):
    """What the informers need from time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified or ``monotonic() >= deadline``.

        ``deadline`` None waits for a notification only. Like
        ``Condition.wait`` it may return early; callers re-check in a loop.
        """
        ...


class RealClock:
    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        if deadline is None:
            cond.wait()
            return
        timeout = deadline - time.monotonic()
        if timeout > 0:
            cond.wait(timeout)


class _Sleeper:
    __slots__ = ("cond", "deadline")

    def __init__(self, cond: threading.Condition, deadline: float | None) -> None:
        self.cond = cond
        self.deadline = deadline


class FakeClock:
    """A clock that moves only when ``step`` is called.

    A thread in ``wait_until`` registers as a sleeper while it still holds
    its condition's lock, and ``step`` takes that lock to notify, so a
    wake-up cannot fall between a sleeper reading the time and waiting.
    """

    def __init__(self, monotonic: float = 1_000.0) -> None:
        # Guards the time and the sleepers; notified whenever one registers.
        self._lock = threading.Condition(threading.Lock())
        self._mono = monotonic
        self._sleepers: list[_Sleeper] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def step(self, seconds: float) -> None:
        """Move the clock forward and wake the sleepers that are now due."""
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        with self._lock:
            self._mono += seconds
            due = [s for s in self._sleepers if s.deadline is not None and s.deadline <= self._mono]
            for sleeper in due:
                self._sleepers.remove(sleeper)
        # Notify outside our lock: a sleeper holds its condition's lock when
        # it takes ours, so the other order could deadlock.
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
        """Deadlines of the threads waiting on this clock now (None: no deadline)."""
        with self._lock:
            return [s.deadline for s in self._sleepers]

    def wait_for_sleepers(self, count: int = 1, timeout: float = 10.0) -> list[float | None]:
        """Block until at least ``count`` threads wait on this clock with a deadline.

        ``timeout`` (real seconds) only bounds a broken test.
        """
        with self._lock:
            ok = self._lock.wait_for(
                lambda: sum(1 for s in self._sleepers if s.deadline is not None) >= count,
                timeout,
            )
            deadlines = [s.deadline for s in self._sleepers]
        if not ok:
            raise TimeoutError(f"fewer than {count} threads are waiting; sleepers: {deadlines}")
        return deadlines


class Stopper:
    """A stop flag threads can sleep on; ``stop`` wakes every sleeper at once."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` on the clock; return True if stopped meanwhile."""
        deadline = self._clock.monotonic() + seconds
        with self._cond:
            while not self._stopped and self._clock.monotonic() < deadline:
                self._clock.wait_until(self._cond, deadline)
            return self._stopped

    def sleep_until(self, deadline: float | None, woken: Callable[[], bool] | None = None) -> bool:
        """Sleep until ``deadline`` (None: no deadline), until stopped, or until
        ``woken()`` is true after a ``poke``. Return True if stopped."""
        with self._cond:
            while not self._stopped:
                if deadline is not None and self._clock.monotonic() >= deadline:
                    break
                if woken is not None and woken():
                    break
                self._clock.wait_until(self._cond, deadline)
            return self._stopped

    def poke(self) -> None:
        """Wake sleepers without stopping them (they re-check their deadline)."""
        with self._cond:
            self._cond.notify_all()
