"""Delivers an informer's notifications to its handlers (client-go's sharedProcessor).

Each handler has its own thread and its own unbounded buffer: the informer
only appends to buffers, so a slow handler delays neither the watch nor the
other handlers, and each handler sees every notification in order, none
skipped. A handler that raises is logged and counted; its next notification
is delivered as usual.

An *inline* handler has neither: it is called on the thread that applies
the informer's deltas, in order, before the next delta is applied. Waking a
handler's thread costs more CPU in CPython than a handler that only updates
memory and adds queue keys (about 35 us a wake-up on this project's 2-core
machine, `python -m benchmarks.handoff_bench`), and a watch event
woke two threads before its handler ran. Only a handler that never blocks
(no request, no sleep, no lock held for long) may be inline: while it
runs, the informer applies nothing.

A handler is synced once the informer is and every "initial" add it was
given has returned; a handler added late is given the cache's content as
initial adds, so it is synced only after handling them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol, TypeAlias

from informers.objects import DeletedFinalStateUnknown, KubeObject

log = logging.getLogger(__name__)

# Notification kinds; plain ints because millions go through the buffers.
ADD = 0
UPDATE = 1
DELETE = 2

Notification: TypeAlias = tuple[int, "KubeObject | None", "KubeObject | DeletedFinalStateUnknown", bool, bool]
"""(kind, old object for updates, new object or tombstone, initial add, resync)."""

HandlerErrorCallback = Callable[[str, BaseException], None]


class EventHandler(Protocol):
    """What a handler implements; objects are the cache's own, read-only."""

    def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None: ...

    def on_update(self, old: KubeObject, new: KubeObject) -> None: ...

    def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        """``obj`` is a ``DeletedFinalStateUnknown`` when the delete was inferred by a relist."""
        ...


@dataclass(frozen=True)
class EventHandlerFuncs:
    """An ``EventHandler`` from plain functions; a missing one ignores that event."""

    add: Callable[[KubeObject], None] | None = None
    update: Callable[[KubeObject, KubeObject], None] | None = None
    delete: Callable[[KubeObject | DeletedFinalStateUnknown], None] | None = None

    def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
        if self.add is not None:
            self.add(obj)

    def on_update(self, old: KubeObject, new: KubeObject) -> None:
        if self.update is not None:
            self.update(old, new)

    def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        if self.delete is not None:
            self.delete(obj)


class Listener:
    """One handler's buffer and thread.

    ``_initial_given`` is written only by the informer's side (under
    ``_cond``) and ``_initial_done`` only by this listener's thread, so
    neither needs a read-modify-write across threads.
    """

    def __init__(
        self,
        handler: EventHandler,
        *,
        name: str,
        resync_period: float,
        upstream_synced: Callable[[], bool],
        on_error: Callable[[Listener, BaseException], None],
        on_initial_done: Callable[[], None] = lambda: None,
        inline: bool = False,
    ) -> None:
        """``inline``: no thread and no buffer; ``add`` calls the handler
        at once, on the caller's thread (the informer calls ``add`` for one
        listener from one thread at a time)."""
        self.handler = handler
        self.inline = inline
        self.name = name
        self.resync_period = resync_period
        self.next_resync: float | None = None
        self._upstream_synced = upstream_synced
        self._on_error = on_error
        self._on_initial_done = on_initial_done
        self._cond = threading.Condition(threading.Lock())
        self._buffer: deque[Notification] = deque()
        self._initial_given = 0
        self._initial_done = 0
        self._stopped = False
        self._busy = False
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.errors = 0

    def start(self) -> None:
        if self.inline:
            return
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._run, name=f"handler:{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._buffer.clear()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def add(self, notes: list[Notification]) -> None:
        initial = 0
        for n in notes:
            initial += n[3]
        if self.inline:
            if self._stopped:
                return
            self._initial_given += initial
            self._busy = True
            try:
                initial_seen = self._deliver(deque(notes))
            finally:
                self._busy = False
            if initial_seen:
                self._on_initial_done()
            return
        with self._cond:
            if self._stopped:
                return
            self._buffer.extend(notes)
            self._initial_given += initial
            self._cond.notify()

    def has_synced(self) -> bool:
        return self._upstream_synced() and self._initial_done == self._initial_given

    def idle(self) -> bool:
        """Nothing buffered and no handler call running."""
        with self._cond:
            return not self._buffer and not self._busy

    def pending(self) -> int:
        return len(self._buffer)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                while not self._buffer and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch = self._buffer
                self._buffer = deque()
                self._busy = True
            if self._deliver(batch):
                # Lets waiters on has_synced re-check without polling.
                self._on_initial_done()

    def _deliver(self, batch: deque[Notification]) -> bool:
        """Hand ``batch`` to the handler in order; True if it held an initial add."""
        handler = self.handler
        initial_seen = False
        old: KubeObject | None
        new: KubeObject | DeletedFinalStateUnknown | None
        # popleft: a handled notification (and the objects it holds)
        # is let go at once, not when the next batch arrives.
        while batch:
            kind, old, new, initial, _sync = batch.popleft()
            if self._stopped:
                return initial_seen
            try:
                if kind == ADD:
                    handler.on_add(new, initial)  # type: ignore[arg-type]
                elif kind == UPDATE:
                    handler.on_update(old, new)  # type: ignore[arg-type]
                else:
                    handler.on_delete(new)
            except Exception as e:
                self.errors += 1
                log.exception("informer handler %s failed; delivery continues", self.name)
                self._on_error(self, e)
            self.delivered += 1
            if initial:
                self._initial_done += 1
                initial_seen = True
        return initial_seen


class Processor:
    """The informer's set of listeners and who is due a resync."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._syncing: list[Listener] = []

    def add(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove(self, listener: Listener) -> bool:
        with self._lock:
            if listener not in self._listeners:
                return False
            self._listeners = [x for x in self._listeners if x is not listener]
            self._syncing = [x for x in self._syncing if x is not listener]
            return True

    def listeners(self) -> list[Listener]:
        return self._listeners

    def distribute(self, notes: list[Notification], any_sync: bool) -> None:
        """Hand ``notes`` to every listener; resync notes only to those due one."""
        if not notes:
            return
        with self._lock:
            listeners = self._listeners
            syncing = self._syncing
        if not any_sync:
            for listener in listeners:
                listener.add(notes)
            return
        plain = [n for n in notes if not n[4]]
        for listener in listeners:
            listener.add(notes if listener in syncing else plain)

    def next_resync(self) -> float | None:
        with self._lock:
            due = [x.next_resync for x in self._listeners if x.next_resync is not None]
        return min(due) if due else None

    def should_resync(self, now: float) -> bool:
        """Mark the listeners whose resync is due (client-go's shouldResync)."""
        with self._lock:
            syncing: list[Listener] = []
            for listener in self._listeners:
                if listener.next_resync is not None and now >= listener.next_resync:
                    syncing.append(listener)
                    listener.next_resync = now + listener.resync_period
            self._syncing = syncing
            return bool(syncing)
