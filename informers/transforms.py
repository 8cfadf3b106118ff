"""Transforms applied to every object before it is cached (the informer's transform hook).

A transform receives the freshly decoded object, which nobody else holds
yet, so it may change it in place; it returns the object to cache.
"""

from __future__ import annotations

import random
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


# metadata fields unique to each object (or each version of it) by
# definition: a table entry for them would never be shared, only kept.
_PER_OBJECT = frozenset(("uid", "resourceVersion", "name"))

# A part is looked up by its JSON, and an unseen part's own parts are
# looked up too, so a unique part deep in the object is encoded once per
# level above it. Parts under a key that had no equal this many times in a
# row (a pod's spec, its containers) are walked without a lookup, but for
# one in _PROBE_EVERY at random, so a key whose parts start repeating is
# found again. At random, not every 64th: the items of a list share their
# key's count, and a fixed period lands on the same positions of lists of
# the same length each time, so a list whose first item is unique (a rank)
# and the rest shared would never have its shared items looked up again.
_MISSES_BEFORE_SKIPPING = 16
_PROBE_EVERY = 64

# The tables hold strings and parts of at most this many characters (of
# JSON, for a part). A bigger one is kept by its object alone, never by a
# table: the tables are bounded by count, and an annotation padded to the
# API server's 256 KiB, unique per pod, would otherwise pin gigabytes after
# its pods are gone. Values that big are rarely shared anyway.
_MAX_REMEMBERED = 4096


class Compactor:
    """A transform that shares equal strings and equal sub-objects between cached objects.

    Cached objects are read-only, so their equal parts can exist once: the
    pods of one workload have the same tolerations, resources, volume
    sources, labels and most strings. Each dict or list below the top is
    looked up by its JSON encoding (orjson, in C, so equal means equal in
    every detail: key order, ``true`` vs ``1``, ``-0.0``); an equal part
    seen before replaces it whole, unseen parts are walked the same way, and
    strings and dict keys are shared too (orjson's own key cache is small
    and misses some). This is why the read-only rule matters even more
    here: a change made in place to a shared part would show in every
    object that holds it.

    Parts are remembered in bounded tables: a part enters ``_once`` when
    first seen and moves to ``_shared`` when seen again, so parts unique to
    one object (its metadata, a random volume name) never fill the
    long-lived table. ``metadata.uid``, ``resourceVersion`` and ``name``
    are unique by definition and are not remembered at all. A full table of
    parts is emptied and refilled: sharing restarts, it is never wrong. The
    string table has two generations instead, so the strings in use (an
    image, a namespace) stay shared when it turns over. The object itself
    is not remembered, so no table keeps an old version of it alive.

    Unique dicts of more than five keys are rebuilt at their exact size
    (orjson grows a dict key by key and leaves it up to 40% larger than
    needed), and smaller ones when a key is to be shared.

    Measured on the benchmark's pods (2.0 KB of JSON without managedFields):
    10.4 KB of Python objects per pod without it, 2.0 KB with it; 2.5 KB
    of RSS per cached pod in all, store and tables included
    (benchmarks/informer_bench.py).

    Not thread-safe: each informer gets its own.
    """

    def __init__(
        self,
        shared_entries: int = 1 << 14,
        once_entries: int = 1 << 11,
        strings: int = 1 << 13,
        keys: int = 1 << 14,
    ) -> None:
        self._shared: dict[bytes, Any] = {}
        self._once: dict[bytes, Any] = {}
        self._strings: dict[str, str] = {}
        self._older_strings: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._caps = (shared_entries, once_entries, strings, keys)
        # Looked-up parts that had no equal, in a row, per key they sat
        # under (the items of a list apart from the list).
        self._value_misses: dict[str, int] = {}
        self._item_misses: dict[str, int] = {}
        self._probe = random.Random(0).random  # seeded: a run can be replayed
        # orjson makes a new {} or [] each time; one of each serves all.
        self._empty: dict[type, Any] = {dict: {}, list: []}

    def __call__(self, obj: KubeObject) -> KubeObject:
        shared_cap, once_cap, strings_cap, keys_cap = self._caps
        if len(self._shared) > shared_cap:
            self._shared.clear()
        if len(self._once) > once_cap:
            self._once.clear()
        if len(self._strings) > strings_cap:
            # Two generations: a string still in use moves back into the
            # new table when next seen, one-offs are dropped with the old.
            self._older_strings = self._strings
            self._strings = {}
        if len(self._keys) > keys_cap:
            self._keys.clear()
        if len(self._value_misses) + len(self._item_misses) > keys_cap:
            # Keys of a map of objects can be names without end.
            self._value_misses.clear()
            self._item_misses.clear()
        return self._dict(obj, top=True)

    def _dict(self, d: dict[str, Any], top: bool = False, metadata: bool = False) -> dict[str, Any]:
        """``d`` with its values made canonical, in place, and its keys:
        a dict with a key to share, or big enough to be oversized, is
        rebuilt and so returned as a new dict. With ``top``, ``d`` is the
        object itself: its metadata (unique) is walked without being looked
        up, and there the per-object strings are not remembered."""
        strings = self._strings
        keys = self._keys
        # Rebuilt anyway when big enough to be oversized; a small one only
        # when a key is not the shared one (orjson's key cache is small,
        # and which keys it misses depends on which others it has seen).
        rebuild = len(d) > 5
        # Strings are handled inline: they are most of the values, and a
        # call per value would be most of the cost.
        c: Any
        for k, v in d.items():
            if not rebuild:
                c = keys.get(k)
                if c is None:
                    keys[k] = k
                elif c is not k:
                    rebuild = True
            t = type(v)
            if t is str:
                if (metadata and k in _PER_OBJECT) or len(v) > _MAX_REMEMBERED:
                    continue
                c = strings.get(v)
                if c is None:
                    strings[v] = c = self._older_strings.get(v, v)
            elif t is dict and top and k == "metadata":
                c = self._dict(v, metadata=True)
            elif t is dict or t is list:
                c = self._container(v, t, k, self._value_misses)
            else:
                continue
            if c is not v:
                d[k] = c
        if rebuild:
            setdefault = keys.setdefault
            d = {setdefault(k, k): v for k, v in d.items()}
        return d

    def _list(self, items: list[Any], slot: str) -> list[Any]:
        strings = self._strings
        for i, v in enumerate(items):
            t = type(v)
            if t is str:
                if len(v) > _MAX_REMEMBERED:
                    continue
                c = strings.get(v)
                if c is None:
                    strings[v] = c = self._older_strings.get(v, v)
            elif t is dict or t is list:
                c = self._container(v, t, slot, self._item_misses)
            else:
                continue
            if c is not v:
                items[i] = c
        return items

    def _container(self, v: Any, t: type, slot: str, misses: dict[str, int]) -> Any:
        """The canonical equal of dict or list ``v`` (``v`` itself when it is
        the first). ``slot`` is the key ``v`` sits under (for a list's item,
        the list's key, counted in the items' own table ``misses``)."""
        if not v:
            return self._empty[t]
        missed = misses.get(slot, 0)
        if missed >= _MISSES_BEFORE_SKIPPING and self._probe() * _PROBE_EVERY >= 1.0:
            # Never equal to one seen before of late: walked, not looked up.
            return self._dict(v) if t is dict else self._list(v, slot)
        key = orjson.dumps(v)
        if len(key) > _MAX_REMEMBERED:
            return self._dict(v) if t is dict else self._list(v, slot)
        c = self._shared.get(key)
        if c is None:
            c = self._once.pop(key, None)
            if c is not None:
                # Seen once before: from now on that one is the canonical copy.
                self._shared[key] = c
        if c is not None:
            if missed:
                misses[slot] = 0
            return c
        misses[slot] = missed + 1
        v = self._dict(v) if t is dict else self._list(v, slot)
        self._once[key] = v
        return v
