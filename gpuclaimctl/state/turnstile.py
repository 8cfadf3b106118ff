"""Oldest pod first through the placement decision, among pods being worked on.

Waiting pods are queued oldest first, but several workers take them: a
younger pod whose claims resolve sooner (an older one is still creating its
template claims) could reach the decision first and take the room the
older one wanted. DESIGN §4: where pods compete, the oldest goes first.

A pod enters the turnstile when the work queue hands it out (or, woken
while its worker is past its decision, when it is added again:
controller.TurnstileTracker) and waits, before deciding, while an older pod
is inside; it leaves once its decision is recorded. Only pods being worked
on are waited for: an older pod that waits for capacity and is not in a
worker does not hold younger ones back (they may fit where it does not).
The wait is bounded, so a stuck worker delays the others by `max_wait` at
most; it never blocks them.

A pod can also be overtaken after its turn came: GPUs freed while it was
past `wait_turn` wake older pods (queued, or entering a worker) that the
wait never saw. So the queue also tells the turnstile which gated pods it
holds ready (`queue`), and a pod about to take GPUs checks, under the
view's lock, that no older pod was queued or entered since its turn came
(`overtaken`); if one was, it gives its turn up and is synced again after
the older one (sync.pods). The view's changes and the pods they wake are
applied under the same lock (sync.handlers.Handlers.woke_by), so a decision
that sees freed GPUs also sees the older pods they woke. Not a wait: a
worker never blocks on a pod no worker holds.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from gpuclaimctl.model.snapshot import Age as Age  # priority, then creation time, namespace, name


class AgeTurnstile:
    def __init__(self, max_wait: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_wait = max_wait
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (age, when it entered: a count that only grows)
        self._inside: dict[str, tuple[Age, int]] = {}
        self._entries = 0
        # Gated pods the queue holds ready, and a heap of their ages (lazy:
        # an entry whose key left `_queued` is dropped when it surfaces).
        self._queued: dict[str, Age] = {}
        self._queued_heap: list[tuple[Age, str]] = []
        # key -> the entry count when its turn came (see `overtaken`)
        self._turns: dict[str, int] = {}
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
            self._queued.pop(key, None)
            current = self._inside.get(key)
            if current is None or current[0] != age:
                # Again while inside keeps its place: a pod a wait timed
                # out on (stuck) does not overtake the pods it held back.
                self._entries += 1
                self._inside[key] = (age, self._entries)
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
            self._turns.pop(key, None)
            self._queued.pop(key, None)
            if self._inside.pop(key, None) is not None and self._waiting:
                self._wake_locked()

    def queue(self, key: str, age: Age) -> None:
        """`key`, a gated pod, is ready in the work queue (not in a worker)."""
        with self._lock:
            if key in self._queued:
                return
            self._queued[key] = age
            heap = self._queued_heap
            heapq.heappush(heap, (age, key))
            if len(heap) > 2 * len(self._queued) + 64:
                self._queued_heap = [(a, k) for k, a in self._queued.items()]
                heapq.heapify(self._queued_heap)

    def overtaken(self, key: str, age: Age) -> bool:
        """Whether a pod older than `key` is queued, or entered after
        `key`'s turn came (`wait_turn`): then `key` must not take GPUs
        now. An older pod inside when the turn came is not counted: the
        wait for it ran out (it is stuck), and counting it again would hold
        `key` back for as long as it stays stuck."""
        with self._lock:
            oldest = self._oldest_queued_locked()
            if oldest is not None and oldest < age:
                return True
            turn = self._turns.get(key, self._entries)
            return any(a < age and n > turn for k, (a, n) in self._inside.items() if k != key)

    def _oldest_queued_locked(self) -> Age | None:
        heap, queued = self._queued_heap, self._queued
        while heap and queued.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def wait_turn(self, key: str, age: Age) -> bool:
        """Wait while an older pod is inside; False if `max_wait` ran out first."""
        deadline = self._clock() + self._max_wait
        event = threading.Event()
        with self._lock:
            if self._may_go_locked(key, age):
                self._turns[key] = self._entries
                return True
            self._waiting[key] = (age, event)
        try:
            while True:
                left = deadline - self._clock()
                if left > 0:
                    event.wait(left)
                with self._lock:
                    # The turn is taken under the same hold as the check:
                    # a pod entering after it counts as entering after the
                    # turn came (overtaken).
                    went = self._may_go_locked(key, age)
                    if went or deadline - self._clock() <= 0:
                        self._turns[key] = self._entries
                        return went
                    event.clear()
        finally:
            with self._lock:
                self._waiting.pop(key, None)

    def _may_go_locked(self, key: str, age: Age) -> bool:
        return not any(a < age for k, (a, _) in self._inside.items() if k != key)

    def _wake_locked(self) -> None:
        for key, (age, event) in self._waiting.items():
            if not event.is_set() and self._may_go_locked(key, age):
                event.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._inside)
