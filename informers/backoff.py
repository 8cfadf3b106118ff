"""Capped, jittered exponential backoff that resets after a healthy period.

This is client-go's ``wait.NewExponentialBackoffManager`` as the reflector
uses it (``reflector.go``: 800ms initial, 30s cap, reset after 2 minutes,
factor 2, jitter 1.0): each delay is the current base plus up to
``jitter`` times that base at random; the base doubles up to the cap; when
no delay was asked for during ``reset_after`` seconds the base starts over.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Callable

from informers.clock import Clock, RealClock

# Every number is client-go's reflector default (NewReflectorWithOptions).
INITIAL = 0.8
CAP = 30.0
RESET_AFTER = 120.0
FACTOR = 2.0
JITTER = 1.0


@dataclass(frozen=True)
class BackoffPolicy:
    initial: float = INITIAL
    cap: float = CAP
    reset_after: float = RESET_AFTER
    factor: float = FACTOR
    jitter: float = JITTER

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.cap < self.initial or self.factor < 1 or self.jitter < 0:
            raise ValueError(f"invalid backoff policy {self}")


class Backoff:
    """Hands out the next delay; thread-safe."""

    def __init__(
        self,
        policy: BackoffPolicy = BackoffPolicy(),
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self._clock = clock or RealClock()
        self._rand = rand
        self._lock = threading.Lock()
        self._base = policy.initial
        self._last: float | None = None

    def next_delay(self) -> float:
        """The delay to wait now; the following one will be longer (up to the cap)."""
        p = self.policy
        with self._lock:
            now = self._clock.monotonic()
            if self._last is not None and now - self._last > p.reset_after:
                self._base = p.initial
            self._last = now
            base = self._base
            self._base = min(self._base * p.factor, p.cap)
        return base + p.jitter * self._rand() * base

    def reset(self) -> None:
        with self._lock:
            self._base = self.policy.initial
            self._last = None
