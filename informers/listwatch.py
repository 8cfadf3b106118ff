"""The seam between the reflector and the API: list one page, open one watch.

``informers.api.ResourceListerWatcher`` implements it over HTTP; tests can
implement it in memory to drive a reflector without a server. Errors are
``informers.errors.ApiStatusError`` and ``TransportError``.
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

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        """Open a watch with bookmarks from ``resource_version`` that the server ends after ``timeout_seconds``."""
        ...

    def abort(self) -> None:
        """Interrupt any request in flight (called from another thread on stop)."""
        ...
