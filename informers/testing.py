"""An in-memory API for tests of code built on informers (client-go's FakeControllerSource).

``FakeListerWatcher`` keeps objects with resourceVersions, an event log
that can be compacted, paginated lists with continue tokens, and watches
that block for new events (with ``watch_list=True`` also WatchList streams);
errors can be queued for the next list or watch.
It is a test double for the reflector's seam, not an API server: the
informers' own tests also run against the real kube-apiserver.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence

from informers.errors import ApiStatusError, TransportError
from informers.listwatch import (
    ADDED,
    BOOKMARK,
    DELETED,
    ERROR,
    INITIAL_EVENTS_END,
    MODIFIED,
    ListerWatcher,
    ListPage,
    WatchStream,
    supports_watch_list,
)
from informers.objects import KubeObject, meta_namespace_key
from informers.transforms import Transform


@dataclass(frozen=True)
class ListCall:
    resource_version: str
    limit: int
    continue_token: str


@dataclass(frozen=True)
class WatchCall:
    resource_version: str
    timeout_seconds: int
    send_initial_events: bool = False


@dataclass
class _Event:
    rv: int
    type: str
    obj: KubeObject


def gone(message: str = "too old resource version") -> ApiStatusError:
    return ApiStatusError(410, "Expired", message)


def status(code: int, reason: str = "", message: str = "") -> ApiStatusError:
    return ApiStatusError(code, reason, message)


class FakeWatch:
    def __init__(
        self, source: FakeListerWatcher, rv: int, initial: Sequence[tuple[str, KubeObject]] = ()
    ) -> None:
        self._source = source
        self._rv = rv
        self._initial = list(initial)
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, KubeObject]]:
        src = self._source
        while self._initial:
            # A WatchList stream's initial events, unless the test broke it.
            with src._cond:
                if self._closed:
                    return
                if src._broken.pop(self, False):
                    raise TransportError("connection reset (fake)")
                if src._ended.pop(self, False):
                    return
            yield self._initial.pop(0)
        while True:
            with src._cond:
                while True:
                    if self._closed:
                        return
                    if src._broken.get(self):
                        del src._broken[self]
                        raise TransportError("connection reset (fake)")
                    if src._ended.get(self):
                        del src._ended[self]
                        return
                    if src._compacted > self._rv or src._expired.pop(self, False):
                        # The window moved past us while we were watching.
                        event: tuple[str, KubeObject] = (
                            ERROR,
                            {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
                        )
                        self._closed = True
                        break
                    nxt = [e for e in src._log if e.rv > self._rv]
                    if nxt:
                        e = nxt[0]
                        self._rv = e.rv
                        event = (e.type, copy.deepcopy(e.obj))
                        break
                    src._cond.wait()
            yield event

    def close(self) -> None:
        with self._source._cond:
            self._closed = True
            self._source._watches.discard(self)
            self._source._cond.notify_all()


class FakeListerWatcher:
    """Thread-safe in-memory objects of one resource with RVs and an event log.

    With ``watch_list`` it serves WatchList requests: the objects as ADDED
    events, the bookmark that ends them, then the log from there. Without,
    it says it cannot (as client-go's fake sources do), so a reflector lists.
    """

    def __init__(self, *, watch_list: bool = False) -> None:
        self.supports_watch_list = watch_list
        self._cond = threading.Condition(threading.Lock())
        self._objects: dict[str, KubeObject] = {}
        self._log: list[_Event] = []
        self._rv = 1
        self._compacted = 0
        self._watches: set[FakeWatch] = set()
        self._ended: dict[FakeWatch, bool] = {}
        self._broken: dict[FakeWatch, bool] = {}
        self._expired: dict[FakeWatch, bool] = {}
        self._list_errors: deque[Exception] = deque()
        self._watch_errors: deque[Exception] = deque()
        self.list_calls: list[ListCall] = []
        self.watch_calls: list[WatchCall] = []
        self.aborted = 0
        # A continue token names the rest of a list snapshot: token → (rv, objects).
        self._snapshots: dict[str, tuple[int, list[KubeObject]]] = {}

    # -- changing the "cluster" ----------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def _record(self, etype: str, obj: KubeObject) -> KubeObject:
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self._log.append(_Event(self._rv, etype, obj))
        self._cond.notify_all()
        return obj

    def add(self, obj: KubeObject) -> KubeObject:
        with self._cond:
            stored = self._record(ADDED, obj)
            self._objects[meta_namespace_key(stored)] = stored
            return copy.deepcopy(stored)

    def modify(self, obj: KubeObject) -> KubeObject:
        with self._cond:
            key = meta_namespace_key(obj)
            if key not in self._objects:
                raise KeyError(key)
            stored = self._record(MODIFIED, obj)
            self._objects[key] = stored
            return copy.deepcopy(stored)

    def delete(self, key: str) -> None:
        with self._cond:
            obj = self._objects.pop(key)
            self._record(DELETED, obj)

    def change_silently(
        self, *, upsert: Sequence[KubeObject] = (), delete: Sequence[str] = ()
    ) -> None:
        """Change objects with no watch event (as if missed while disconnected);
        the log is compacted so a watch from before must relist."""
        with self._cond:
            for obj in upsert:
                self._rv += 1
                obj = copy.deepcopy(obj)
                obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
                self._objects[meta_namespace_key(obj)] = obj
            for key in delete:
                self._objects.pop(key, None)
                self._rv += 1
            self._compact_locked()

    def compact(self) -> int:
        with self._cond:
            return self._compact_locked()

    def _compact_locked(self) -> int:
        self._compacted = self._rv
        self._log = []
        self._snapshots.clear()
        self._cond.notify_all()
        return self._rv

    def bookmark(self) -> None:
        """Advance the RV with no object change and send a bookmark to watchers."""
        with self._cond:
            self._rv += 1
            self._log.append(
                _Event(self._rv, BOOKMARK, {"kind": "Bookmark", "metadata": {"resourceVersion": str(self._rv)}})
            )
            self._cond.notify_all()

    def end_watches(self) -> None:
        """End every open watch as the server's timeout would."""
        with self._cond:
            for w in self._watches:
                self._ended[w] = True
            self._cond.notify_all()

    def expire_watches(self) -> None:
        """End every open watch with a 410 ERROR event, as a watch cache that
        dropped their resourceVersion would."""
        with self._cond:
            for w in self._watches:
                self._expired[w] = True
            self._cond.notify_all()

    def break_watches(self) -> None:
        """Break every open watch as a dropped connection would."""
        with self._cond:
            for w in self._watches:
                self._broken[w] = True
            self._cond.notify_all()

    def fail_next_list(self, *errors: Exception) -> None:
        with self._cond:
            self._list_errors.extend(errors)

    def fail_next_watch(self, *errors: Exception) -> None:
        with self._cond:
            self._watch_errors.extend(errors)

    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def objects(self) -> dict[str, KubeObject]:
        with self._cond:
            return copy.deepcopy(self._objects)

    # -- the ListerWatcher seam ----------------------------------------

    def list_page(
        self,
        *,
        resource_version: str,
        limit: int,
        continue_token: str,
        transform: Transform | None = None,
    ) -> ListPage:
        with self._cond:
            self.list_calls.append(ListCall(resource_version, limit, continue_token))
            if self._list_errors:
                raise self._list_errors.popleft()
            if continue_token:
                snap = self._snapshots.get(continue_token)
                if snap is None:
                    raise gone("continue token expired")
                rv, rest = snap
            else:
                if resource_version not in ("", "0") and int(resource_version) < self._compacted:
                    raise gone()
                rv = self._rv
                rest = [copy.deepcopy(o) for _, o in sorted(self._objects.items())]
            if limit and len(rest) > limit:
                page, rest = rest[:limit], rest[limit:]
                token = f"c{len(self._snapshots)}-{rv}"
                self._snapshots[token] = (rv, rest)
            else:
                page, token = rest, ""
            if transform is not None:
                page = [transform(copy.deepcopy(o)) for o in page]
            return ListPage(items=page, resource_version=str(rv), continue_token=token)

    def watch(
        self, *, resource_version: str, timeout_seconds: int, send_initial_events: bool = False
    ) -> FakeWatch:
        with self._cond:
            self.watch_calls.append(WatchCall(resource_version, timeout_seconds, send_initial_events))
            if send_initial_events and not self.supports_watch_list:
                raise status(422, "Invalid", "sendInitialEvents is forbidden for watch (fake)")
            if self._watch_errors:
                raise self._watch_errors.popleft()
            initial: list[tuple[str, KubeObject]] = []
            if send_initial_events:
                # NotOlderThan: the current state is never older.
                if resource_version and int(resource_version) > self._rv:
                    raise status(504, "Timeout", "Too large resource version (fake)")
                rv = self._rv
                initial = [(ADDED, copy.deepcopy(o)) for _, o in sorted(self._objects.items())]
                end = {"kind": "Bookmark", "metadata": {
                    "resourceVersion": str(rv), "annotations": {INITIAL_EVENTS_END: "true"}}}
                initial.append((BOOKMARK, end))
            else:
                rv = int(resource_version or self._rv)
                if rv < self._compacted:
                    raise gone()
            w = FakeWatch(self, rv, initial)
            self._watches.add(w)
            self._cond.notify_all()
            return w

    def abort(self) -> None:
        with self._cond:
            self.aborted += 1
            for w in list(self._watches):
                w._closed = True
            self._cond.notify_all()


class GatedListerWatcher:
    """Wraps a real or fake ``ListerWatcher``; while the gate is closed a new
    watch waits at it, so a test can change the cluster while the reflector is
    known to be between two watches."""

    def __init__(self, inner: ListerWatcher) -> None:
        self.inner = inner
        self._open = threading.Event()
        self._open.set()
        self.waiting = threading.Event()
        self._aborted = False

    def close_gate(self) -> None:
        self.waiting.clear()
        self._open.clear()

    def open_gate(self) -> None:
        self._open.set()

    def list_page(
        self,
        *,
        resource_version: str,
        limit: int,
        continue_token: str,
        transform: Transform | None = None,
    ) -> ListPage:
        return self.inner.list_page(
            resource_version=resource_version,
            limit=limit,
            continue_token=continue_token,
            transform=transform,
        )

    @property
    def supports_watch_list(self) -> bool:
        return supports_watch_list(self.inner)

    def watch(
        self, *, resource_version: str, timeout_seconds: int, send_initial_events: bool = False
    ) -> WatchStream:
        if not self._open.is_set():
            self.waiting.set()
            self._open.wait()
        if self._aborted:
            raise TransportError("aborted at the gate")
        if send_initial_events:
            return self.inner.watch(
                resource_version=resource_version, timeout_seconds=timeout_seconds, send_initial_events=True
            )
        return self.inner.watch(resource_version=resource_version, timeout_seconds=timeout_seconds)

    def abort(self) -> None:
        self._aborted = True
        self._open.set()
        self.inner.abort()


def make_object(name: str, namespace: str | None = "default", **fields: object) -> KubeObject:
    """A minimal object for tests: metadata plus whatever ``fields`` add."""
    meta: dict[str, object] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    obj: KubeObject = {"metadata": meta}
    for k, v in fields.items():
        if k in ("labels", "annotations"):
            meta[k] = v
        else:
            obj[k] = v
    return obj


__all__ = ["FakeListerWatcher", "FakeWatch", "GatedListerWatcher", "ListCall", "WatchCall", "gone", "make_object", "status"]
