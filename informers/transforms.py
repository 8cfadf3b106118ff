"""Transforms applied to every object before it is cached (the informer's transform hook).

A transform receives the freshly decoded object, which nobody else holds
yet, so it may change it in place; it returns the object to cache.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from informers.objects import KubeObject

Transform = Callable[[KubeObject], KubeObject]


def strip_managed_fields(obj: KubeObject) -> KubeObject:
    """Drop ``metadata.managedFields``: server-side-apply bookkeeping the
    controller never reads, often a third of a small object's JSON."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


def chain(*transforms: Transform) -> Transform:
    """One transform that applies ``transforms`` left to right."""
    if len(transforms) == 1:
        return transforms[0]

    def run(obj: KubeObject) -> KubeObject:
        for t in transforms:
            obj = t(obj)
        return obj

    return run


class Compactor:
    """A transform that shares equal strings and equal sub-objects between cached objects.

    Cached objects are read-only, so their equal parts can exist once: the
    pods of one workload have the same tolerations, resources, volume
    sources, labels and most strings. Each dict or list below the top is
    looked up by its JSON encoding (orjson, in C, so equal means equal in
    every detail: key order, ``true`` vs ``1``, ``-0.0``); an equal part
    seen before replaces it whole, unseen parts are walked the same way, and
    strings are shared too. This is why the read-only rule matters even
    more here: a change made in place to a shared part would show in every
    object that holds it.

    Parts are remembered in bounded tables: a part enters ``_once`` when
    first seen and moves to ``_shared`` when seen again, so parts unique to
    one object (its metadata, a random volume name) never fill the
    long-lived table. A full table is emptied and refilled: sharing
    restarts, it is never wrong. The object itself is not remembered, so no
    table keeps an old version of it alive.

    Dicts that stay unique are rebuilt at their exact size: orjson grows a
    dict key by key and leaves it up to 40% larger than needed.

    Measured on the benchmark's pods (2.0 KB of JSON without managedFields):
    about 10.5 KB of Python objects per pod without it, 2.5 KB with it,
    tables included (benchmarks/informer_bench.py).

    Not thread-safe: each informer gets its own.
    """

    def __init__(
        self, shared_entries: int = 1 << 14, once_entries: int = 1 << 11, strings: int = 1 << 16
    ) -> None:
        self._shared: dict[bytes, Any] = {}
        self._once: dict[bytes, Any] = {}
        self._strings: dict[str, str] = {}
        self._caps = (shared_entries, once_entries, strings)
        # orjson makes a new {} or [] each time; one of each serves all.
        self._empty: dict[type, Any] = {dict: {}, list: []}

    def __call__(self, obj: KubeObject) -> KubeObject:
        shared_cap, once_cap, strings_cap = self._caps
        if len(self._shared) > shared_cap:
            self._shared.clear()
        if len(self._once) > once_cap:
            self._once.clear()
        if len(self._strings) > strings_cap:
            self._strings.clear()
        self._walk(obj)
        return obj

    def _walk(self, o: Any) -> None:
        """Replace the parts of dict or list ``o`` with their canonical equals, in place."""
        strings = self._strings
        shared = self._shared
        dumps = orjson.dumps
        for k, v in o.items() if type(o) is dict else enumerate(o):
            t = type(v)
            if t is str:
                c = strings.get(v)
                if c is None:
                    strings[v] = v
                elif c is not v:
                    o[k] = c
            elif t is dict or t is list:
                if v:
                    key = dumps(v)
                    c = shared.get(key)
                    if c is None:
                        c = self._unshared(key, v)
                else:
                    c = self._empty[t]
                if c is not v:
                    o[k] = c

    def _unshared(self, key: bytes, v: Any) -> Any:
        first = self._once.pop(key, None)
        if first is not None:
            # Seen once before: from now on that one is the canonical copy.
            self._shared[key] = first
            return first
        self._walk(v)
        if type(v) is dict and len(v) > 5:
            v = dict(zip(v.keys(), v.values()))
        self._once[key] = v
        return v
