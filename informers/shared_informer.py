"""An informer: one reflector fills one indexed cache and feeds many handlers.

client-go's sharedIndexInformer. Threads, started by ``start`` (never at
import or construction):

- the reflector lists and watches, transforms each object and queues a
  delta (``reflector``, ``delta_fifo``), then, on the same thread, pops
  what is queued in order, applies it to the store and hands the resulting
  notifications to the processor; an update whose resourceVersion did not
  change (a relist or a resync) reaches only the handlers whose resync is
  due, as in client-go;
- each handler runs on its own thread from its own buffer (``processor``),
  unless it was added ``inline``: then it runs on the thread that applies.

A resync thread wakes when some handler's resync is due, queues a sync of
every cached object and applies it as the reflector does; resyncs replay
the cache, they never ask the API.

client-go pops the DeltaFIFO on a goroutine of its own. Here that thread
is gone: in CPython a delta handed to another thread costs a wake-up (about
35 us of CPU on this project's machine, more than applying it), and the
GIL lets only one of the two run at a time anyway. The FIFO stays, for what
it does beside handing over: a relist's tombstones, resyncs that never
overtake a newer change, one lock between ``replace`` and the store.

Everything handed out — store objects, handler arguments — is the cache's
own object: read-only.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Callable, Mapping

from informers import gcpause, heap
from informers.backoff import Backoff, BackoffPolicy
from informers.clock import Clock, RealClock, Stopper
from informers.delta_fifo import Delta, DeltaFIFO, DeltaType, FIFOClosedError
from informers.listwatch import ListerWatcher
from informers.objects import KubeObject
from informers.processor import (
    ADD,
    DELETE,
    UPDATE,
    EventHandler,
    HandlerErrorCallback,
    Listener,
    Notification,
    Processor,
)
from informers.reflector import DEFAULT_MIN_WATCH_TIMEOUT, DEFAULT_PAGE_SIZE, Reflector
from informers.store import IndexFunc, Indexer
from informers.transforms import Transform

log = logging.getLogger(__name__)

# client-go's minimumResyncPeriod: shorter asks are raised to this.
MIN_RESYNC_PERIOD = 1.0
_DELETED = DeltaType.DELETED


class HandlerRegistration:
    """What ``add_event_handler`` returns: the handler's own sync state."""

    def __init__(self, informer: SharedInformer, listener: Listener) -> None:
        self._informer = informer
        self._listener = listener

    @property
    def name(self) -> str:
        return self._listener.name

    def has_synced(self) -> bool:
        """The informer synced and this handler returned from every initial add."""
        return self._listener.has_synced()

    def wait_for_sync(self, timeout: float) -> bool:
        return self._informer._wait(self.has_synced, timeout)

    @property
    def errors(self) -> int:
        """How many times this handler raised."""
        return self._listener.errors

    @property
    def delivered(self) -> int:
        return self._listener.delivered

    def idle(self) -> bool:
        """No notification buffered or being handled for this handler."""
        return self._listener.idle()

    def remove(self) -> None:
        self._informer.remove_event_handler(self)


class SharedInformer:
    def __init__(
        self,
        lw: ListerWatcher,
        *,
        name: str = "informer",
        indexers: Mapping[str, IndexFunc] | None = None,
        transform: Transform | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        initial_resource_version: str = "0",
        min_watch_timeout: float = DEFAULT_MIN_WATCH_TIMEOUT,
        backoff: BackoffPolicy = BackoffPolicy(),
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        on_handler_error: HandlerErrorCallback | None = None,
        default_resync_period: float = 0.0,
        use_watch_list: bool = True,
    ) -> None:
        """``use_watch_list``: fill the cache from a WatchList stream where
        the lister-watcher and the server can (see ``reflector``)."""
        self.name = name
        self.default_resync_period = default_resync_period
        self._clock = clock or RealClock()
        # Notified whenever a has_synced (informer or handler) may have turned true.
        self._sync_cond = threading.Condition(threading.Lock())
        self._indexer = Indexer(indexers)
        self._fifo = DeltaFIFO(self._indexer, on_synced=self._poke_waiters)
        self.reflector = Reflector(
            lw,
            _ApplyingStore(self._fifo, self._apply_queued),
            name=name,
            page_size=page_size,
            initial_resource_version=initial_resource_version,
            min_watch_timeout=min_watch_timeout,
            transform=transform,
            backoff=Backoff(backoff, clock=self._clock, rand=rand),
            clock=self._clock,
            rand=rand,
            use_watch_list=use_watch_list,
        )
        self._processor = Processor()
        self._on_handler_error = on_handler_error
        # Held while a batch of deltas is applied and distributed, and while
        # a late handler is seeded, so the seed is exactly the cache as of
        # a point between two batches.
        self._block_deltas = threading.Lock()
        self._lock = threading.Lock()
        self._stopper = Stopper(self._clock)
        self._resync_generation = 0
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stopped = False
        self._handler_count = 0
        self.handler_errors = 0
        self.apply_errors = 0

    # -- the cache -----------------------------------------------------

    @property
    def indexer(self) -> Indexer:
        """The cache (read-only objects; the informer is its only writer)."""
        return self._indexer

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add indexes; allowed before and after ``start``."""
        self._indexer.add_indexers(indexers)

    @property
    def last_sync_resource_version(self) -> str:
        return self.reflector.last_sync_resource_version

    @property
    def consistent_since(self) -> float | None:
        """See Reflector.consistent_since."""
        return self.reflector.consistent_since

    def has_synced(self) -> bool:
        """The first list (or WatchList's initial events) reached the cache, every item of it applied."""
        return self._fifo.has_synced()

    def wait_for_sync(self, timeout: float) -> bool:
        return self._wait(self.has_synced, timeout)

    def _wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        # Real time: this bounds how long a caller blocks, it schedules nothing.
        with self._sync_cond:
            return self._sync_cond.wait_for(predicate, timeout)

    def _poke_waiters(self) -> None:
        with self._sync_cond:
            self._sync_cond.notify_all()

    # -- handlers ------------------------------------------------------

    def add_event_handler(
        self, handler: EventHandler, *, resync_period: float | None = None, name: str | None = None,
        inline: bool = False,
    ) -> HandlerRegistration:
        """Register a handler; it gets every object already cached as an initial add.

        ``resync_period`` > 0 replays the whole cache to this handler as
        updates (old is new) that often; 0 never does; None takes the
        informer's ``default_resync_period``. ``inline``: the handler runs
        on the thread that applies deltas, no thread of its own (see
        ``processor``): only for a handler that never blocks; the initial
        adds of what is cached already run here, before this returns.
        """
        if resync_period is None:
            resync_period = self.default_resync_period
        with self._lock:
            self._handler_count += 1
            name = name or f"{self.name}#{self._handler_count}"
        period = max(resync_period, MIN_RESYNC_PERIOD) if resync_period > 0 else 0.0
        listener = Listener(
            handler,
            name=name,
            resync_period=period,
            upstream_synced=self.has_synced,
            on_error=self._handler_failed,
            on_initial_done=self._poke_waiters,
            inline=inline,
        )
        if period:
            listener.next_resync = self._clock.monotonic() + period
        with self._block_deltas:
            seed = self._indexer.list()
            self._processor.add(listener)
            if seed:
                listener.add([(ADD, None, obj, True, False) for obj in seed])
        # After the listener joined the processor, so either this or start()
        # starts it (Listener.start is idempotent).
        with self._lock:
            if self._started and not self._stopped:
                listener.start()
        if period:
            self._resync_generation += 1
            self._stopper.poke()
        return HandlerRegistration(self, listener)

    def remove_event_handler(self, registration: HandlerRegistration) -> None:
        listener = registration._listener
        if self._processor.remove(listener):
            listener.stop()

    def _handler_failed(self, listener: Listener, error: BaseException) -> None:
        with self._lock:
            self.handler_errors += 1
        if self._on_handler_error is not None:
            try:
                self._on_handler_error(listener.name, error)
            except Exception:
                log.exception("%s: the handler-error callback failed", self.name)
        self._poke_waiters()

    # -- lifecycle -----------------------------------------------------

    def start(self) -> None:
        """Start listing, watching and delivering; returns at once. Idempotent."""
        with self._lock:
            if self._started:
                return
            self._started = True
            listeners = self._processor.listeners()
        for target, role in (
            (self.reflector.run, "reflector"),
            (self._resync_loop, "resync"),
        ):
            t = threading.Thread(target=target, name=f"{self.name}:{role}", daemon=True)
            self._threads.append(t)
        for listener in listeners:
            listener.start()
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every thread of this informer; the cache keeps its content."""
        with self._lock:
            self._stopped = True
        self.reflector.stop()
        self._fifo.close()
        self._stopper.stop()
        for listener in self._processor.listeners():
            listener.stop()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        for listener in self._processor.listeners():
            listener.join(timeout)
        self._poke_waiters()

    @property
    def started(self) -> bool:
        return self._started

    # -- the controller ------------------------------------------------

    def _apply_queued(self) -> None:
        """Apply every queued delta, in order, on the calling thread (the
        reflector's after each push, the resync thread's after a resync)."""
        fifo = self._fifo
        try:
            if fifo.has_synced():
                while fifo.pop_batch(self._apply, block=False):
                    pass
                return
            # The first list arrives as one burst of new objects: see gcpause.
            with gcpause.paused():
                while fifo.pop_batch(self._apply, block=False):
                    pass
            if fifo.has_synced():
                # The initial list is in the cache: give what it freed
                # back to the OS (see heap).
                heap.release_free_memory()
        except FIFOClosedError:
            return

    def _apply(self, batch: list[Delta]) -> None:
        indexer = self._indexer
        notes: list[Notification] = []
        any_sync = False
        with self._block_deltas:
            for dtype, obj, key, initial in batch:
                try:
                    if dtype is _DELETED:
                        indexer.pop(key)
                        notes.append((DELETE, None, obj, False, False))
                        continue
                    new: KubeObject = obj  # type: ignore[assignment]
                    old = indexer.set(key, new)
                    if old is None:
                        notes.append((ADD, None, new, initial, False))
                    else:
                        # client-go: an update that did not change the
                        # resourceVersion is a resync, for due handlers only.
                        sync = old["metadata"].get("resourceVersion") == new["metadata"].get(
                            "resourceVersion"
                        )
                        any_sync |= sync
                        notes.append((UPDATE, old, new, False, sync))
                except Exception:
                    self.apply_errors += 1
                    log.exception("%s: could not apply %s of %s", self.name, dtype.value, key)
            self._processor.distribute(notes, any_sync)

    # -- resync --------------------------------------------------------

    def _resync_loop(self) -> None:
        while True:
            generation = self._resync_generation
            deadline = self._processor.next_resync()
            if self._stopper.sleep_until(
                deadline, woken=lambda: self._resync_generation != generation
            ):
                return
            if self._processor.should_resync(self._clock.monotonic()):
                n = self._fifo.resync()
                log.debug("%s: resync queued %d objects", self.name, n)
                self._apply_queued()


class _ApplyingStore:
    """What the reflector writes to: the FIFO, whose queued deltas are then
    applied on the reflector's own thread (see the module's docstring)."""

    def __init__(self, fifo: DeltaFIFO, apply_queued: Callable[[], None]) -> None:
        self._fifo = fifo
        self._apply_queued = apply_queued

    def replace(self, items: list[KubeObject]) -> None:
        self._fifo.replace(items)
        self._apply_queued()

    def add(self, obj: KubeObject) -> None:
        self._fifo.add(obj)
        self._apply_queued()

    def update(self, obj: KubeObject) -> None:
        self._fifo.update(obj)
        self._apply_queued()

    def delete(self, obj: KubeObject) -> None:
        self._fifo.delete(obj)
        self._apply_queued()
