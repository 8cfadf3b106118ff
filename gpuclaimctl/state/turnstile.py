"""Oldest pod first through the placement decision, among pods being worked on.

Waiting pods are queued oldest first, but several workers take them: a
younger pod whose claims resolve sooner (an older one is still creating its
template claims) could reach the decision first and take the room the
older one wanted. DESIGN §4: where pods compete, the oldest goes first.

A worker enters the turnstile when it starts on a pod and waits, before
deciding, while an older pod is inside; it leaves once its decision is
recorded. Only pods being worked on take part: an older pod that waits for
capacity and is not in a worker does not hold younger ones back (they may
fit where it does not). The wait is bounded, so a stuck worker delays the
others by `max_wait` at most; it never blocks them.
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
        self._cond = threading.Condition()
        self._inside: dict[str, Age] = {}

    def enter(self, key: str, age: Age) -> None:
        """Inside from now until `leave` (again: the age is replaced). The
        controller enters each pod as the work queue hands it out, under the
        queue's lock, so a pod handed out first holds back those handed out
        after it even if their worker reaches the decision first."""
        with self._cond:
            self._inside[key] = age

    @contextmanager
    def entered(self, key: str, age: Age) -> Iterator[None]:
        """Inside from now until `leave` or the end of the block."""
        self.enter(key, age)
        try:
            yield
        finally:
            self.leave(key)

    def leave(self, key: str) -> None:
        with self._cond:
            if self._inside.pop(key, None) is not None:
                self._cond.notify_all()

    def wait_turn(self, key: str, age: Age) -> bool:
        """Wait while an older pod is inside; False if `max_wait` ran out first."""
        deadline = self._clock() + self._max_wait
        with self._cond:
            while any(a < age for k, a in self._inside.items() if k != key):
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def __len__(self) -> int:
        with self._cond:
            return len(self._inside)
