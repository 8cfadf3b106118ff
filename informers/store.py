"""A thread-safe store of objects keyed ``namespace/name``, with indexes.

This is client-go's ``cache.Indexer`` (threadSafeMap): the informer writes
to it, every other reader only reads. The namespace index is built in;
custom indexes can be added at any time, also after the informer started
and the store holds objects.

Objects returned by any method are the cached objects themselves, not
copies, so lookups stay cheap. They are read-only: never change one in
place (copy first), or every other reader sees the change and the cache no
longer matches the API server.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Mapping

from informers.objects import KeyFunc, KubeObject, meta_namespace_key

IndexFunc = Callable[[KubeObject], list[str]]
"""Maps an object to the index values it is filed under (may be empty)."""

NAMESPACE_INDEX = "namespace"

# Aliases so the annotations inside Indexer are not shadowed by its own
# ``list`` and ``set`` methods.
_list = list
_set = set
_Objects = list[KubeObject]
_Keys = list[str]
_Index = dict[str, set[str]]


def namespace_index_func(obj: KubeObject) -> list[str]:
    """client-go's MetaNamespaceIndexFunc (cluster-scoped objects file under ``""``)."""
    return [obj["metadata"].get("namespace") or ""]


class IndexConflictError(ValueError):
    """An indexer with this name exists already."""


class Indexer:
    """Thread-safe map of key → object with named secondary indexes.

    Invariant (under ``_lock``): for every index ``n`` and every key ``k`` in
    ``_items``, ``k`` is in ``_indices[n][v]`` exactly for ``v`` in
    ``_indexers[n](_items[k])``, and no empty value set is kept.
    """

    def __init__(
        self,
        indexers: Mapping[str, IndexFunc] | None = None,
        *,
        key_func: KeyFunc = meta_namespace_key,
        with_namespace_index: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._key_func = key_func
        self._items: dict[str, KubeObject] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, _Index] = {}
        wanted: dict[str, IndexFunc] = {}
        if with_namespace_index:
            wanted[NAMESPACE_INDEX] = namespace_index_func
        for name, fn in (indexers or {}).items():
            if name in wanted:
                raise IndexConflictError(f"indexer {name!r} is defined twice")
            wanted[name] = fn
        self.add_indexers(wanted)

    # -- writes (the informer's) --------------------------------------------

    def key_of(self, obj: KubeObject) -> str:
        return self._key_func(obj)

    def add(self, obj: KubeObject) -> None:
        self.set(self._key_func(obj), obj)

    def update(self, obj: KubeObject) -> None:
        self.set(self._key_func(obj), obj)

    def delete(self, obj: KubeObject) -> None:
        self.pop(self._key_func(obj))

    def set(self, key: str, obj: KubeObject) -> KubeObject | None:
        """Store ``obj`` under ``key``; return the object it replaced."""
        with self._lock:
            old = self._items.get(key)
            if self._indexers:
                self._reindex(key, old, obj)
            self._items[key] = obj
            return old

    def pop(self, key: str) -> KubeObject | None:
        """Remove ``key``; return the object it held (None if absent)."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None and self._indexers:
                self._reindex(key, old, None)
            return old

    def replace(self, objs: Iterable[KubeObject]) -> None:
        """Make the store hold exactly ``objs`` (indexes rebuilt)."""
        items = {self._key_func(o): o for o in objs}
        with self._lock:
            indices = {name: self._build_index(fn, items) for name, fn in self._indexers.items()}
            self._items = items
            self._indices = indices

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add indexes; allowed at any time, existing objects are indexed at once."""
        with self._lock:
            for name in indexers:
                if name in self._indexers:
                    raise IndexConflictError(f"indexer {name!r} exists already")
            built = {name: self._build_index(fn, self._items) for name, fn in indexers.items()}
            self._indexers.update(indexers)
            self._indices.update(built)

    # -- reads -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    def get(self, obj: KubeObject) -> KubeObject | None:
        """The cached object with the same key as ``obj`` (read-only)."""
        return self.get_by_key(self._key_func(obj))

    def get_by_key(self, key: str) -> KubeObject | None:
        """The cached object for ``namespace/name`` (or ``name``), read-only."""
        # A dict lookup is atomic under the GIL; writers replace whole
        # objects, so no lock is needed for a single read.
        return self._items.get(key)

    def list(self) -> _Objects:
        """A snapshot list of every cached object (the objects are read-only)."""
        with self._lock:
            return list(self._items.values())

    def list_keys(self) -> _Keys:
        with self._lock:
            return list(self._items)

    def contains(self, key: str) -> bool:
        return key in self._items

    def indexers(self) -> dict[str, IndexFunc]:
        with self._lock:
            return dict(self._indexers)

    def index(self, index_name: str, obj: KubeObject) -> _Objects:
        """Objects filed under any of the values ``obj`` has for ``index_name``."""
        fn = self._indexer(index_name)
        values = fn(obj)
        with self._lock:
            index = self._indices[index_name]
            keys: _set[str] = set()
            for v in values:
                keys |= index.get(v, set())
            return [self._items[k] for k in keys]

    def by_index(self, index_name: str, value: str) -> _Objects:
        """Objects filed under ``value`` in index ``index_name`` (read-only)."""
        self._indexer(index_name)
        with self._lock:
            keys = self._indices[index_name].get(value, ())
            return [self._items[k] for k in keys]

    def index_keys(self, index_name: str, value: str) -> _Keys:
        """Keys filed under ``value`` in index ``index_name``."""
        self._indexer(index_name)
        with self._lock:
            return list(self._indices[index_name].get(value, ()))

    def list_index_values(self, index_name: str) -> _Keys:
        """Every value that has at least one object in index ``index_name``."""
        self._indexer(index_name)
        with self._lock:
            return list(self._indices[index_name])

    # -- internals ---------------------------------------------------------

    def _indexer(self, index_name: str) -> IndexFunc:
        fn = self._indexers.get(index_name)
        if fn is None:
            raise KeyError(f"no indexer named {index_name!r}")
        return fn

    @staticmethod
    def _build_index(fn: IndexFunc, items: Mapping[str, KubeObject]) -> _Index:
        index: _Index = {}
        for key, obj in items.items():
            for v in fn(obj):
                bucket = index.get(v)
                if bucket is None:
                    index[v] = {key}
                else:
                    bucket.add(key)
        return index

    def _reindex(self, key: str, old: KubeObject | None, new: KubeObject | None) -> None:
        # Compute every new value before touching an index, so an index
        # function that raises leaves the store as it was.
        changes: _list[tuple[_Index, _Keys, _Keys]] = []
        for name, fn in self._indexers.items():
            new_values = fn(new) if new is not None else []
            old_values = fn(old) if old is not None else []
            if new_values != old_values:
                changes.append((self._indices[name], old_values, new_values))
        for index, old_values, new_values in changes:
            for v in old_values:
                bucket = index.get(v)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del index[v]
            for v in new_values:
                bucket = index.get(v)
                if bucket is None:
                    index[v] = {key}
                else:
                    bucket.add(key)
