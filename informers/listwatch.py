"""The seam between the reflector and the API: list one page, open one watch.

``informers.api.ResourceListerWatcher`` implements it over HTTP; tests can
implement it in memory to drive a reflector without a server. Errors are
``informers.errors.ApiStatusError`` and ``TransportError``.

A lister-watcher that can open a WatchList stream (``watch`` with
``send_initial_events``) says so with ``supports_watch_list = True``; the
reflector asks ``supports_watch_list(lw)``. client-go assumes support unless
a ListerWatcher declares otherwise (``IsWatchListSemanticsUnSupported``);
here it is the other way round, because a Python wrapper written before
WatchList would not pass the new argument on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

from informers.objects import KubeObject
from informers.transforms import Transform

# Watch event types, as the API server spells them.
ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"
ERROR = "ERROR"

# The annotation on the bookmark that ends a WatchList stream's initial
# events (metav1.InitialEventsAnnotationKey).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class ListPage:
    items: list[KubeObject]
    resource_version: str
    """The list's resourceVersion (the same on every page of one list)."""
    continue_token: str = ""
    """Non-empty while more pages follow."""


class WatchStream(Protocol):
    def __iter__(self) -> Iterator[tuple[str, KubeObject]]:
        """Yield (event type, object) until the server ends the watch.

        Raises ``TransportError`` if the connection breaks; returns quietly
        after ``close``.
        """
        ...

    def close(self) -> None:
        """Stop the stream; safe from another thread while it is being read."""
        ...


class ListerWatcher(Protocol):
    def list_page(
        self,
        *,
        resource_version: str,
        limit: int,
        continue_token: str,
        transform: Transform | None = None,
    ) -> ListPage:
        """One list request. ``limit`` 0 asks for everything in one answer.

        ``transform`` is applied to each item as soon as it is decoded (so a
        big answer never exists untransformed all at once).
        """
        ...

    def watch(
        self, *, resource_version: str, timeout_seconds: int, send_initial_events: bool = False
    ) -> WatchStream:
        """Open a watch with bookmarks from ``resource_version`` that the server ends after ``timeout_seconds``.

        With ``send_initial_events`` it is a WatchList request
        (``sendInitialEvents=true``, ``resourceVersionMatch=NotOlderThan``):
        the stream starts with an ADDED event for every object as of a
        version not older than ``resource_version`` ("" means the newest),
        then a bookmark annotated ``INITIAL_EVENTS_END``, then the changes.
        """
        ...

    def abort(self) -> None:
        """Interrupt any request in flight (called from another thread on stop)."""
        ...


def supports_watch_list(lw: object) -> bool:
    """Whether ``lw`` can open a WatchList stream (it sets ``supports_watch_list = True``)."""
    return getattr(lw, "supports_watch_list", False) is True


def is_initial_events_end(obj: KubeObject) -> bool:
    """A bookmark's object marks the end of a WatchList stream's initial events."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return annotations.get(INITIAL_EVENTS_END) == "true"
