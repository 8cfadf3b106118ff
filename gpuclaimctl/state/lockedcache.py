"""A cachetools cache behind a lock.

cachetools caches are not thread-safe: even a read reorders an LRU cache and
expires entries of a TTL cache. The controller's workers and informer
handlers share a few (deleted pod uids, waiting reasons told, set
rejections), so every access goes through this lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LockedCache(Generic[K, V]):
    def __init__(self, cache: MutableMapping[K, V]) -> None:
        self._cache = cache
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Entries held (a TTL cache counts only those not past their time)."""
        with self._lock:
            return len(self._cache)

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._cache

    def keys(self) -> list[K]:
        """The keys held now (a copy)."""
        with self._lock:
            return list(self._cache.keys())

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._cache.get(key, default)

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._cache[key] = value

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._cache.pop(key, default)

    def update(self, key: K, change: Callable[[V | None], V]) -> V:
        """Set key to change(current value) in one step."""
        with self._lock:
            value = change(self._cache.get(key))
            self._cache[key] = value
            return value
