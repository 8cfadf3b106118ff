"""Oldest pod first through the placement decision, among pods that want one.

Waiting pods are queued oldest first, but several workers take them, and
keys also arrive out of age order (a claim event wakes the pods naming it,
a new pod is added as it comes): a younger pod could reach the decision
first and take the room an older one wanted. DESIGN §4: where pods
compete, the oldest goes first.

A gated pod takes part from the moment its key is queued (`expect`) until
its sync ends (`leave`); a worker waits, before deciding, while an older pod
takes part. An older pod that waits for capacity and is NOT queued does not
hold younger ones back: they may fit where it does not, and it is queued
again (oldest first) whenever GPUs are freed. The wait is bounded, so a
stuck or slow older pod delays the others by `max_wait` at most; it never
blocks them.

Ages are a total order (creation time, namespace, name). The oldest taking
part is found in O(log n) from a heap with lazy deletion.
"""

from __future__ import annotations

import heapq
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
        # key -> age of every pod taking part; the heap holds (age, key) for
        # each of them, and may hold stale pairs (popped when on top).
        self._inside: dict[str, Age] = {}
        self._heap: list[tuple[Age, str]] = []

    def expect(self, key: str, age: Age) -> None:
        """The pod's key was queued: it takes part until its sync ends."""
        with self._cond:
            if self._inside.get(key) != age:
                self._inside[key] = age
                heapq.heappush(self._heap, (age, key))

    @contextmanager
    def entered(self, key: str, age: Age) -> Iterator[None]:
        """Taking part from now until the end of the block."""
        self.expect(key, age)
        try:
            yield
        finally:
            self.leave(key)

    def leave(self, key: str) -> None:
        with self._cond:
            if self._inside.pop(key, None) is not None:
                self._cond.notify_all()

    def wait_turn(self, key: str, age: Age) -> bool:
        """Wait while an older pod takes part; False if `max_wait` ran out first."""
        deadline = self._clock() + self._max_wait
        with self._cond:
            while self._older_than(age, key):
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _older_than(self, age: Age, key: str) -> bool:
        heap = self._heap
        while heap and self._inside.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # left, or expected again with another age
        if not heap:
            return False
        oldest_age, oldest_key = heap[0]
        return oldest_key != key and oldest_age < age

    def __len__(self) -> int:
        with self._cond:
            return len(self._inside)
