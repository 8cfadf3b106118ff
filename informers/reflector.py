"""Keeps a store in step with the API server: list, then watch (client-go's Reflector).

The rules are client-go's (``tools/cache/reflector.go``, ``tools/pager``):

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

The transform hook runs on every object as it arrives, before it is queued.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from informers import gcpause, heap
from informers.backoff import Backoff
from informers.clock import Clock, RealClock, Stopper
from informers.errors import ApiStatusError, TransportError
from informers.listwatch import ADDED, BOOKMARK, DELETED, ERROR, MODIFIED, ListerWatcher, WatchStream
from informers.objects import KubeObject
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


class ReflectorStore(Protocol):
    def replace(self, items: list[KubeObject]) -> None: ...

    def add(self, obj: KubeObject) -> None: ...

    def update(self, obj: KubeObject) -> None: ...

    def delete(self, obj: KubeObject) -> None: ...


@dataclass
class ReflectorStats:
    """Counters, written only by the reflector's thread (read them anywhere)."""

    lists: int = 0
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
    ) -> None:
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
        self.stats = ReflectorStats()

    # -- state ---------------------------------------------------------

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion of the last list, event or bookmark applied."""
        return self._last_sync_rv

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
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch()
                continue
            except _Stopped:
                return
            except ApiStatusError as e:
                if self._stopper.stopped:
                    return
                self.stats.errors += 1
                retry_after = e.retry_after
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
            log.warning("%s: %s; %s in %.1fs", self.name, error, then, delay)
            if self._wait(delay):
                return

    def _wait(self, delay: float) -> bool:
        self.stats.backoffs += 1
        self._in_backoff = True
        try:
            return self._stopper.sleep(delay)
        finally:
            self._in_backoff = False

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
        try:
            items, list_rv, paginated = self._list_all(rv)
        except ApiStatusError as e:
            if not (e.expired or e.too_large_resource_version):
                raise
            log.info("%s: list at resourceVersion %r: %s; listing the newest state", self.name, rv, e)
            self._last_rv_unavailable = True
            rv = self._relist_resource_version()
            items, list_rv, paginated = self._list_all(rv)
        if rv == "0" and paginated:
            # The server paginates even from its watch cache: keep asking
            # for pages on relists too (client-go's paginatedResult).
            self._paginated_result = True
        self._last_rv_unavailable = False
        if self._stopper.stopped:
            raise _Stopped()
        self._store.replace(items)
        self._last_sync_rv = list_rv
        self.stats.lists += 1
        self.stats.last_list_items = len(items)

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

    def _watch(self) -> None:
        timeout = int(self._min_watch_timeout * (self._rand() + 1.0))
        stream = self._lw.watch(resource_version=self._last_sync_rv, timeout_seconds=timeout)
        with self._lock:
            self._stream = stream
        if self._stopper.stopped:
            stream.close()
            raise _Stopped()
        self.stats.watches += 1
        started = time.monotonic()
        events = 0
        store = self._store
        transform = self._transform
        try:
            for etype, obj in stream:
                if etype == BOOKMARK:
                    self.stats.bookmarks += 1
                elif etype == ERROR:
                    raise ApiStatusError.from_status(obj)
                else:
                    if transform is not None:
                        obj = transform(obj)
                    if etype == ADDED:
                        store.add(obj)
                    elif etype == MODIFIED:
                        store.update(obj)
                    elif etype == DELETED:
                        store.delete(obj)
                    else:
                        log.warning("%s: unknown watch event type %r", self.name, etype)
                        continue
                    self.stats.events += 1
                events += 1
                self._last_sync_rv = obj["metadata"]["resourceVersion"]
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        if self._stopper.stopped:
            raise _Stopped()
        # Wall time on purpose: this guards the CPU against a server that
        # ends watches at once, it schedules nothing.
        if events == 0 and time.monotonic() - started < _SHORT_WATCH:
            raise TransportError("very short watch: ended at once without an event")
