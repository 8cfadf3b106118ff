"""The queue between the reflector and the informer (client-go's DeltaFIFO).

The reflector pushes what happened (added, updated, deleted, replaced by a
relist, resync); the informer pops deltas in the order they were pushed and
applies them to its store and its handlers. Unlike client-go, deltas are
not grouped per key: handlers see the watch's own order, which is also
every key's order. What the grouping was for is kept:

- ``replace`` (a relist) queues a delete with a ``DeletedFinalStateUnknown``
  tombstone for every key the store or the queue knows that the new list
  lacks, so a delete missed while the watch was down still reaches the
  handlers;
- ``resync`` queues a sync for every stored key that has no delta waiting,
  so a resync never overtakes (and never undoes) a newer change;
- two deletes of one key in a row collapse into one.

Popping holds the queue's lock while the informer applies a batch, so a
``replace`` never sees a delta that has left the queue but not yet reached
the store (client-go's Pop does the same).
"""

from __future__ import annotations

import threading
from collections import deque
from enum import Enum
from typing import Callable, Iterable, Protocol, TypeAlias

from informers.objects import DeletedFinalStateUnknown, KeyFunc, KubeObject, meta_namespace_key


class DeltaType(Enum):
    ADDED = "Added"
    UPDATED = "Updated"
    DELETED = "Deleted"
    REPLACED = "Replaced"
    """Queued by a relist; an update only if the resourceVersion changed."""
    SYNC = "Sync"
    """Queued by a resync; reaches only handlers whose resync is due."""


Delta: TypeAlias = tuple[DeltaType, "KubeObject | DeletedFinalStateUnknown", str, bool]
"""(type, object or tombstone, key, part of the initial list)."""

_ADDED = DeltaType.ADDED
_UPDATED = DeltaType.UPDATED
_DELETED = DeltaType.DELETED
_REPLACED = DeltaType.REPLACED
_SYNC = DeltaType.SYNC


class KnownObjects(Protocol):
    """What the FIFO reads from the informer's store to find vanished objects."""

    def list_keys(self) -> list[str]: ...

    def get_by_key(self, key: str) -> KubeObject | None: ...


class FIFOClosedError(Exception):
    pass


class DeltaFIFO:
    """Invariant (under ``_cond``): ``_count[k]`` is the number of deltas of
    ``k`` in ``_queue`` and ``_newest[k]`` the last of them; keys with no
    delta in ``_queue`` are in neither. (Two dicts of existing objects, not
    a record per key: a relist queues tens of thousands at once.)"""

    def __init__(
        self,
        known: KnownObjects,
        *,
        key_func: KeyFunc = meta_namespace_key,
        on_synced: Callable[[], None] = lambda: None,
    ) -> None:
        self._known = known
        self._on_synced = on_synced
        self._key_func = key_func
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Delta] = deque()
        self._count: dict[str, int] = {}
        self._newest: dict[str, Delta] = {}
        self._populated = False
        self._initial_left = 0
        self._closed = False

    # -- producers (the reflector) ----------------------------------------

    def add(self, obj: KubeObject) -> None:
        self._push(_ADDED, obj)

    def update(self, obj: KubeObject) -> None:
        self._push(_UPDATED, obj)

    def delete(self, obj: KubeObject) -> None:
        self._push(_DELETED, obj)

    def _push(self, dtype: DeltaType, obj: KubeObject) -> None:
        key = self._key_func(obj)
        with self._cond:
            if self._queue_locked(dtype, obj, key, False):
                self._cond.notify()

    def replace(self, items: Iterable[KubeObject]) -> None:
        """A relist's result: queue every item, and a tombstone for every vanished key."""
        key_func = self._key_func
        with self._cond:
            initial = not self._populated
            queued = 0
            keys: set[str] = set()
            queue = self._queue_locked
            for obj in items:
                key = key_func(obj)
                keys.add(key)
                queued += queue(_REPLACED, obj, key, initial)
            # Keys still waiting in the queue, absent from the new list.
            for key, (newest_type, newest, _, _) in list(self._newest.items()):
                if key in keys or newest_type is _DELETED:
                    continue
                if isinstance(newest, DeletedFinalStateUnknown):
                    last = newest.obj
                else:
                    last = newest
                queued += queue(_DELETED, DeletedFinalStateUnknown(key, last), key, initial)
            # Keys in the store with nothing queued, absent from the new list.
            for key in self._known.list_keys():
                if key in keys or key in self._count:
                    continue
                last = self._known.get_by_key(key)
                queued += queue(_DELETED, DeletedFinalStateUnknown(key, last), key, initial)
            if initial:
                self._populated = True
                self._initial_left = queued
            self._cond.notify()
        if initial and not queued:
            self._on_synced()

    def resync(self) -> int:
        """Queue a sync of every stored object with no delta waiting; return how many."""
        with self._cond:
            n = 0
            for key in self._known.list_keys():
                if key in self._count:
                    continue
                obj = self._known.get_by_key(key)
                if obj is not None:
                    n += self._queue_locked(_SYNC, obj, key, False)
            if n:
                self._cond.notify()
            return n

    def _queue_locked(
        self, dtype: DeltaType, obj: KubeObject | DeletedFinalStateUnknown, key: str, initial: bool
    ) -> int:
        count = self._count.get(key, 0)
        if count and dtype is _DELETED and self._newest[key][0] is _DELETED:
            return 0
        entry = (dtype, obj, key, initial)
        self._count[key] = count + 1
        self._newest[key] = entry
        self._queue.append(entry)
        return 1

    # -- the consumer (the informer) ------------------------------------

    def pop_batch(self, process: Callable[[list[Delta]], None], max_items: int = 512,
                  *, block: bool = True) -> bool:
        """Wait for deltas (with ``block``; else return False at once if
        there are none), take up to ``max_items`` and run ``process`` on
        them under the queue's lock; True once done. Raises
        ``FIFOClosedError`` once closed."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    raise FIFOClosedError()
                if not block:
                    return False
                self._cond.wait()
            if self._closed:
                raise FIFOClosedError()
            queue = self._queue
            counts = self._count
            n = min(max_items, len(queue))
            batch = [queue.popleft() for _ in range(n)]
            initial = 0
            for _, _, key, is_initial in batch:
                count = counts[key]
                if count == 1:
                    del counts[key]
                    del self._newest[key]
                else:
                    counts[key] = count - 1
                initial += is_initial
            if not counts:
                # A dict never gives back the room a burst (a relist) made.
                self._count = {}
                self._newest = {}
            try:
                process(batch)
            finally:
                if initial:
                    self._initial_left -= initial
        if initial and self._initial_left == 0:
            # Outside the lock: the callback may wake threads that read us.
            self._on_synced()
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- state --------------------------------------------------------

    def has_synced(self) -> bool:
        """True once the first relist was queued and every delta of it applied."""
        return self._populated and self._initial_left == 0

    def __len__(self) -> int:
        return len(self._queue)

    def pending_keys(self) -> list[str]:
        with self._cond:
            return list(self._count)
