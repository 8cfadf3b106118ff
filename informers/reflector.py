"""Keeps a store in step with the API server: list, then watch (client-go's Reflector).

The rules are client-go's (``tools/cache/reflector.go``, ``tools/pager``):

- By default the initial state comes from a WatchList stream, as in
  client-go since v0.35 (its ``WatchListClient`` gate is on): one watch with
  ``sendInitialEvents=true``, ``resourceVersionMatch=NotOlderThan`` and
  bookmarks, from the last resourceVersion seen ("" at first: the newest
  state, served consistently from the watch cache). Its ADDED events are
  collected (transformed as they arrive) until the bookmark annotated
  ``k8s.io/initial-events-end: "true"``; then the store is replaced with
  them, as after a list, and the same stream goes on as the watch. If the
  version asked for is gone (410) or not yet known, it asks again for the
  newest state; a stream that ends before that bookmark is opened again;
  429 and transport errors back off and try again. Any other refusal (an
  API server without WatchList answers 422), or a stream that ends at once
  with nothing in it, falls back to the paginated list below for this
  attempt; the next relist tries WatchList again. ``use_watch_list=False``
  or a lister-watcher that cannot (``listwatch.supports_watch_list``)
  always lists.
- The first list asks for resourceVersion "0" (any recent state, served
  from the API server's watch cache) in pages of ``page_size``; a later
  relist asks for the last resourceVersion seen (no older than that), and
  unpaginated unless the server paginated the first one. If that version is
  gone (410) or not yet known (a "too large resourceVersion" 504), it lists
  again with "" (the newest state, a quorum read). A 410 on a later page
  (the continue token expired) falls back to one unpaginated list.
- The list replaces the store's content: objects that vanished get a
  tombstone delete (see ``delta_fifo``).
- The watch starts from the list's resourceVersion with bookmarks and a
  server timeout drawn from [min, 2*min) (5 to 10 minutes) so watches of
  many clients do not end together; each event and bookmark moves the
  resourceVersion on, and the next watch resumes from it.
- A watch that ends normally is reopened at once. A 410 (Expired/Gone)
  relists. Refused or broken connections, 429 and 5xx back off (800ms
  doubling to 30s, jittered, reset after 2 healthy minutes) and re-watch
  from the same resourceVersion; other errors relist after backing off.
- The client read timeout is the server timeout plus a margin
  (``api.WATCH_READ_MARGIN``), so a dead connection is noticed.
- ``stop`` interrupts any request in flight at once.
- A failure is logged as it is retried: at WARNING, but for a 429
  "storage is (re)initializing" (a fresh API server whose watch cache is
  not filled yet answers every informer so for a second or two) at INFO.

The transform hook runs on every object as it arrives, before it is queued.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

from informers import gcpause, heap
from informers.backoff import Backoff
from informers.clock import Clock, RealClock, Stopper
from informers.errors import ApiStatusError, TransportError
from informers.listwatch import (
    ADDED,
    BOOKMARK,
    DELETED,
    ERROR,
    MODIFIED,
    ListerWatcher,
    WatchStream,
    is_initial_events_end,
    supports_watch_list,
)
from informers.objects import KubeObject, meta_namespace_key
from informers.transforms import Transform

log = logging.getLogger(__name__)

# client-go's pager default page size.
DEFAULT_PAGE_SIZE = 500
# client-go's minWatchTimeout: each watch asks the server to end it after
# a random time in [5, 10) minutes.
DEFAULT_MIN_WATCH_TIMEOUT = 300.0
# client-go treats a watch that ended within a second without any event as
# an error ("very short watch"), so a misbehaving server or proxy cannot
# make it spin.
_SHORT_WATCH = 1.0


def storage_initializing(e: ApiStatusError) -> bool:
    """The 429 kube-apiserver answers while a resource's watch cache is being
    filled (at its start, or after etcd came back): retried, it soon works."""
    return e.code == 429 and "storage is (re)initializing" in e.message


class ReflectorStore(Protocol):
    def replace(self, items: list[KubeObject]) -> None: ...

    def add(self, obj: KubeObject) -> None: ...

    def update(self, obj: KubeObject) -> None: ...

    def delete(self, obj: KubeObject) -> None: ...


@dataclass
class ReflectorStats:
    """Counters, written only by the reflector's thread (read them anywhere)."""

    lists: int = 0
    """Paginated lists that filled the store."""
    watch_lists: int = 0
    """WatchList streams that filled the store (up to their end bookmark)."""
    watch_list_fallbacks: int = 0
    """WatchList requests refused and followed by a list."""
    list_pages: int = 0
    last_list_pages: int = 0
    last_list_items: int = 0
    paginated_fallbacks: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    errors: int = 0
    backoffs: int = 0


class _Stopped(Exception):
    pass


class _WatchListRefused(Exception):
    """The server cannot serve this WatchList request: list instead."""


@dataclass
class _OpenWatch:
    """A watch already being read: a WatchList stream past its initial events."""

    stream: WatchStream
    events: Iterator[tuple[str, KubeObject]]
    started: float
    received: int


class Reflector:
    def __init__(
        self,
        lw: ListerWatcher,
        store: ReflectorStore,
        *,
        name: str = "reflector",
        page_size: int = DEFAULT_PAGE_SIZE,
        initial_resource_version: str = "0",
        min_watch_timeout: float = DEFAULT_MIN_WATCH_TIMEOUT,
        transform: Transform | None = None,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        use_watch_list: bool = True,
    ) -> None:
        """``initial_resource_version`` and ``page_size`` shape the lists
        (used without WatchList, or when the server refuses it)."""
        if initial_resource_version not in ("0", ""):
            raise ValueError('initial_resource_version is "0" (watch cache) or "" (quorum read)')
        self.name = name
        self._lw = lw
        self._store = store
        self._page_size = page_size
        self._initial_rv = initial_resource_version
        self._min_watch_timeout = min_watch_timeout
        self._transform = transform
        self._clock = clock or RealClock()
        self._backoff = backoff or Backoff(clock=self._clock, rand=rand)
        self._rand = rand
        self._stopper = Stopper(self._clock)
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._last_sync_rv = ""
        self._last_rv_unavailable = False
        self._paginated_result = False
        self._in_backoff = False
        self._consistent_since: float | None = None
        self._use_watch_list = use_watch_list and supports_watch_list(lw)
        self.stats = ReflectorStats()

    # -- state ---------------------------------------------------------

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion of the last list, event or bookmark applied."""
        return self._last_sync_rv

    @property
    def consistent_since(self) -> float | None:
        """When (the clock's monotonic seconds) the newest-state request that
        last filled the store was sent: the store shows every write the
        API server had committed by then (None: no such request yet).

        A request for the newest state (resourceVersion "", a consistent
        read) shows every write committed before it was sent; what comes
        after it (watch events, relists from a version seen: no older than
        it) only moves the store on. A list from the watch cache ("0") may
        come from a server that lags, so it clears this.
        """
        return self._consistent_since

    @property
    def uses_watch_list(self) -> bool:
        """Whether the initial state (and every relist) is asked for by WatchList first."""
        return self._use_watch_list

    @property
    def in_backoff(self) -> bool:
        """True while waiting out a backoff delay before retrying."""
        return self._in_backoff

    @property
    def stopped(self) -> bool:
        return self._stopper.stopped

    # -- lifecycle -----------------------------------------------------

    def stop(self) -> None:
        """Make ``run`` return soon; closes any request in flight."""
        self._stopper.stop()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        self._lw.abort()

    def run(self) -> None:
        """List and watch until ``stop``; never raises."""
        need_list = True
        while not self._stopper.stopped:
            retry_after: float | None = None
            level = logging.WARNING
            try:
                if need_list:
                    opened = self._fill_store()
                    need_list = False
                    self._watch(opened)
                else:
                    self._watch()
                continue
            except _Stopped:
                return
            except ApiStatusError as e:
                if self._stopper.stopped:
                    return
                self.stats.errors += 1
                retry_after = e.retry_after
                if storage_initializing(e):
                    level = logging.INFO
                if e.expired:
                    self.stats.expired += 1
                    need_list, then = True, "relisting"
                elif e.retriable:
                    then = "retrying"
                else:
                    need_list, then = True, "relisting"
                error = str(e)
            except TransportError as e:
                if self._stopper.stopped:
                    return
                self.stats.errors += 1
                error, then = str(e), "retrying"
            except Exception as e:
                if self._stopper.stopped:
                    return
                # A bug (a transform or a store that raised): start over
                # from a fresh list rather than trust the store.
                self.stats.errors += 1
                log.exception("%s: unexpected error", self.name)
                need_list, error, then = True, repr(e), "relisting"
            delay = self._backoff.next_delay()
            if retry_after is not None:
                delay = max(delay, retry_after)
            log.log(level, "%s: %s; %s in %.1fs", self.name, error, then, delay)
            if self._wait(delay):
                return

    def _wait(self, delay: float) -> bool:
        self.stats.backoffs += 1
        self._in_backoff = True
        try:
            return self._stopper.sleep(delay)
        finally:
            self._in_backoff = False

    # -- the store's content: WatchList, or a list -----------------------

    def _fill_store(self) -> _OpenWatch | None:
        """Replace the store's content with the server's; return the
        WatchList stream to go on watching with, or None after a list."""
        if self._use_watch_list:
            try:
                return self._watch_list()
            except _WatchListRefused as e:
                self.stats.watch_list_fallbacks += 1
                log.info("%s: WatchList refused (%s); listing instead", self.name, e)
        self._list()
        return None

    def _watch_list(self) -> _OpenWatch:
        # As for a list: see gcpause and heap.
        with gcpause.paused():
            opened = self._watch_list_and_replace()
        heap.release_free_memory()
        return opened

    def _watch_list_and_replace(self) -> _OpenWatch:
        cut_short = 0  # streams in a row that ended before their initial events did
        while True:
            if self._stopper.stopped:
                raise _Stopped()
            # client-go's rewatchResourceVersion: "" (the newest state, a
            # consistent read) at first and once the last one is unavailable.
            rv = "" if self._last_rv_unavailable else self._last_sync_rv
            started = time.monotonic()
            try:
                stream = self._open_watch(rv, send_initial_events=True)
            except ApiStatusError as e:
                self._watch_list_failed(e, rv)
                continue
            events = iter(stream)
            try:
                objects, received, end_rv = self._initial_events(events)
            except ApiStatusError as e:
                self._close_watch(stream)
                self._watch_list_failed(e, rv)
                continue
            except BaseException:
                self._close_watch(stream)
                raise
            if self._stopper.stopped:
                self._close_watch(stream)
                raise _Stopped()
            if end_rv is None:
                self._close_watch(stream)
                # Wall time on purpose, as in _watch.
                if received == 0 and time.monotonic() - started < _SHORT_WATCH:
                    # client-go's VeryShortWatchError, which its watchList
                    # does not retry: the list is asked instead.
                    raise _WatchListRefused("the stream ended at once without an event")
                cut_short += 1
                if cut_short > 1:
                    # Twice in a row (a proxy that ends long requests, say):
                    # asking again at once would send the server the whole
                    # state again and again. client-go lists after any
                    # failed WatchList; the next relist tries WatchList again.
                    raise _WatchListRefused("the stream ended before its initial events did, twice")
                log.info("%s: WatchList stream ended before its initial events did; asking again", self.name)
                continue
            break
        # State and stats first: the store applies on this thread, so a
        # waiter on has_synced may run before replace returns.
        self._last_sync_rv = end_rv
        self._last_rv_unavailable = False
        self.stats.watch_lists += 1
        self.stats.last_list_items = len(objects)
        self._store.replace(list(objects.values()))
        self._note_consistency(rv, started)
        return _OpenWatch(stream, events, started, received)

    def _initial_events(
        self, events: Iterator[tuple[str, KubeObject]]
    ) -> tuple[dict[str, KubeObject], int, str | None]:
        """Collect a WatchList stream's objects up to the bookmark that ends
        them; return them, how many events came, and that bookmark's
        resourceVersion (None if the stream ended first).

        The initial ADDED events come in no resourceVersion order, so only
        that bookmark's version is a place to resume from.
        """
        objects: dict[str, KubeObject] = {}
        transform = self._transform
        received = 0
        for etype, obj in events:
            received += 1
            if etype == ADDED or etype == MODIFIED:
                if transform is not None:
                    obj = transform(obj)
                objects[meta_namespace_key(obj)] = obj
            elif etype == DELETED:
                objects.pop(meta_namespace_key(obj), None)
            elif etype == BOOKMARK:
                self.stats.bookmarks += 1
                if is_initial_events_end(obj):
                    return objects, received, str(obj["metadata"]["resourceVersion"])
            elif etype == ERROR:
                raise ApiStatusError.from_status(obj)
            else:
                log.warning("%s: unknown watch event type %r", self.name, etype)
        return objects, received, None

    def _watch_list_failed(self, e: ApiStatusError, rv: str) -> None:
        """What a WatchList request from ``rv`` that failed with ``e`` leads
        to (client-go's watchList): asking again at once for the newest
        state (returns), backing off before asking again (``e`` raised to
        ``run``), or a list instead (``_WatchListRefused``)."""
        if self._stopper.stopped:
            raise _Stopped()
        if (e.expired or e.too_large_resource_version) and rv:
            log.info("%s: WatchList from resourceVersion %r: %s; asking for the newest state", self.name, rv, e)
            self._last_rv_unavailable = True
            return
        if e.code == 429 or e.expired:
            # An expired newest state is the server's trouble: wait for it.
            raise e
        raise _WatchListRefused(str(e)) from e

    # -- list ----------------------------------------------------------

    def _relist_resource_version(self) -> str:
        if self._last_rv_unavailable:
            return ""
        if not self._last_sync_rv:
            return self._initial_rv
        return self._last_sync_rv

    def _list(self) -> None:
        # A list is turned into thousands of objects at once, with nothing
        # for the cyclic collector to find: see gcpause.
        with gcpause.paused():
            self._list_and_replace()
        # What the list allocated and freed is kept by malloc: see heap.
        heap.release_free_memory()

    def _list_and_replace(self) -> None:
        rv = self._relist_resource_version()
        sent = time.monotonic()
        try:
            items, list_rv, paginated = self._list_all(rv)
        except ApiStatusError as e:
            if not (e.expired or e.too_large_resource_version):
                raise
            log.info("%s: list at resourceVersion %r: %s; listing the newest state", self.name, rv, e)
            self._last_rv_unavailable = True
            rv = self._relist_resource_version()
            sent = time.monotonic()
            items, list_rv, paginated = self._list_all(rv)
        if rv == "0" and paginated:
            # The server paginates even from its watch cache: keep asking
            # for pages on relists too (client-go's paginatedResult).
            self._paginated_result = True
        self._last_rv_unavailable = False
        if self._stopper.stopped:
            raise _Stopped()
        # State and stats first, as in _watch_list_and_replace.
        self._last_sync_rv = list_rv
        self.stats.lists += 1
        self.stats.last_list_items = len(items)
        self._store.replace(items)
        self._note_consistency(rv, sent)

    def _note_consistency(self, rv: str, sent: float) -> None:
        """After the store was replaced from a request for ``rv`` sent at
        ``sent`` (after, not before: a reader must not be told of a state
        the store does not show yet): see consistent_since."""
        if rv == "":
            self._consistent_since = sent
        elif rv == "0":
            self._consistent_since = None

    def _list_all(self, rv: str) -> tuple[list[KubeObject], str, bool]:
        # client-go: pages for "0" and "", none for an exact relist version
        # (served whole from the watch cache) unless the server paginated.
        paged = self._page_size > 0 and (rv in ("", "0") or self._paginated_result)
        limit = self._page_size if paged else 0
        transform = self._transform
        items: list[KubeObject] = []
        token = ""
        pages = 0
        while True:
            if self._stopper.stopped:
                raise _Stopped()
            try:
                page = self._lw.list_page(
                    resource_version="" if token else rv,
                    limit=limit,
                    continue_token=token,
                    transform=transform,
                )
            except ApiStatusError as e:
                if not (e.expired and token):
                    raise
                # The continue token expired (a compaction) mid-list: list
                # everything again in one answer, at the resourceVersion the
                # first page asked for, as client-go's pager does.
                log.info("%s: continue token expired; listing unpaginated", self.name)
                self.stats.paginated_fallbacks += 1
                page = self._lw.list_page(
                    resource_version=rv, limit=0, continue_token="", transform=transform
                )
                items = []
                token = ""
                pages = 0
            pages += 1
            items.extend(page.items)
            if not page.continue_token:
                break
            token = page.continue_token
        self.stats.list_pages += pages
        self.stats.last_list_pages = pages
        return items, page.resource_version, pages > 1

    # -- watch ---------------------------------------------------------

    def _open_watch(self, rv: str, *, send_initial_events: bool = False) -> WatchStream:
        timeout = int(self._min_watch_timeout * (self._rand() + 1.0))
        stream: WatchStream
        if send_initial_events:
            stream = self._lw.watch(resource_version=rv, timeout_seconds=timeout, send_initial_events=True)
        else:
            # A lister-watcher that cannot do WatchList may not take the argument.
            stream = self._lw.watch(resource_version=rv, timeout_seconds=timeout)
        with self._lock:
            self._stream = stream
        if self._stopper.stopped:
            self._close_watch(stream)
            raise _Stopped()
        return stream

    def _close_watch(self, stream: WatchStream) -> None:
        with self._lock:
            self._stream = None
        stream.close()

    def _watch(self, opened: _OpenWatch | None = None) -> None:
        """Apply a watch's events until it ends: a new one from the last
        resourceVersion, or ``opened``, a WatchList stream past its initial events."""
        if opened is None:
            stream = self._open_watch(self._last_sync_rv)
            opened = _OpenWatch(stream, iter(stream), time.monotonic(), 0)
        stream = opened.stream
        self.stats.watches += 1
        events = opened.received
        store = self._store
        appliers = {ADDED: store.add, MODIFIED: store.update, DELETED: store.delete}
        transform = self._transform
        try:
            for etype, obj in opened.events:
                apply = None
                if etype == BOOKMARK:
                    self.stats.bookmarks += 1
                elif etype == ERROR:
                    raise ApiStatusError.from_status(obj)
                else:
                    apply = appliers.get(etype)
                    if apply is None:
                        log.warning("%s: unknown watch event type %r", self.name, etype)
                        continue
                    if transform is not None:
                        obj = transform(obj)
                    self.stats.events += 1
                events += 1
                self._last_sync_rv = obj["metadata"]["resourceVersion"]
                if apply is not None:
                    # After the count and the resourceVersion: the store
                    # applies (and inline handlers run) on this thread.
                    apply(obj)
        finally:
            self._close_watch(stream)
        if self._stopper.stopped:
            raise _Stopped()
        # Wall time on purpose: this guards the CPU against a server that
        # ends watches at once, it schedules nothing.
        if events == 0 and time.monotonic() - opened.started < _SHORT_WATCH:
            raise TransportError("very short watch: ended at once without an event")
