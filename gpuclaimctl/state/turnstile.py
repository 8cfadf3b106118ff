"""Oldest pod first through the placement decision, among pods being worked on.

Waiting pods are queued oldest first, but several workers take them: a
younger pod whose claims resolve sooner (an older one is still creating its
template claims) could reach the decision first and take the room the
older one wanted. DESIGN §4: where pods compete, the oldest goes first.

A pod enters the turnstile when the work queue hands it out (or, woken
while its worker is past its decision, when it is added again:
controller.TurnstileTracker) and waits, before deciding, while an older pod
is inside; it leaves once its decision is recorded. Only pods being worked
on take part: an older pod that waits for capacity and is not in a worker
does not hold younger ones back (they may fit where it does not). The wait
is bounded, so a stuck worker delays the others by `max_wait` at most; it
never blocks them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

Age = tuple[datetime, str, str]  # creation time, namespace, name: a total order


class AgeTurnstile:
    def __init__(self, max_wait: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_wait = max_wait
        self._clock = clock
        self._lock = threading.Lock()
        self._inside: dict[str, Age] = {}
        # Each waiting pod's own event, set when no older pod is inside any
        # more: a leave wakes only the pods it lets through, not every
        # waiter (with 8 workers, waking all on each leave was the largest
        # hand-off cost in the controller's profile).
        self._waiting: dict[str, tuple[Age, threading.Event]] = {}

    def enter(self, key: str, age: Age) -> None:
        """Inside from now until `leave` (again: the age is replaced). The
        controller enters each pod as the work queue hands it out, under the
        queue's lock, so a pod handed out first holds back those handed out
        after it even if their worker reaches the decision first."""
        with self._lock:
            self._inside[key] = age
            if self._waiting:
                self._wake_locked()  # a younger age may let a waiter through

    @contextmanager
    def entered(self, key: str, age: Age) -> Iterator[None]:
        """Inside from now until `leave` or the end of the block."""
        self.enter(key, age)
        try:
            yield
        finally:
            self.leave(key)

    def leave(self, key: str) -> None:
        with self._lock:
            if self._inside.pop(key, None) is not None and self._waiting:
                self._wake_locked()

    def wait_turn(self, key: str, age: Age) -> bool:
        """Wait while an older pod is inside; False if `max_wait` ran out first."""
        deadline = self._clock() + self._max_wait
        event = threading.Event()
        with self._lock:
            if self._may_go_locked(key, age):
                return True
            self._waiting[key] = (age, event)
        try:
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                event.wait(left)
                with self._lock:
                    if self._may_go_locked(key, age):
                        return True
                    event.clear()
        finally:
            with self._lock:
                self._waiting.pop(key, None)

    def _may_go_locked(self, key: str, age: Age) -> bool:
        return not any(a < age for k, a in self._inside.items() if k != key)

    def _wake_locked(self) -> None:
        for key, (age, event) in self._waiting.items():
            if not event.is_set() and self._may_go_locked(key, age):
                event.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._inside)
