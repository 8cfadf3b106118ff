"""Pausing the cyclic garbage collector while a big list is turned into a cache.

A list of 20,000 pods becomes about a million dicts and lists in seconds.
With the collector running, every few hundred allocations start a
collection, and the oldest generation (the whole growing cache) is walked
again and again: about twice the cost of the list's decoding and caching
together (benchmarks/informer_bench.py). JSON cannot make reference
cycles, so there is nothing for a collection to find in it.

Pauses nest across threads: the collector is off while any pause is held
and is re-enabled when the last one ends, only if it was on when the first
began. Reference counting still frees everything as usual meanwhile; only
cycles made elsewhere wait for the end of the pause.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


def pause() -> None:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            if _was_enabled:
                gc.disable()
        _holders += 1


def resume() -> None:
    global _holders
    with _lock:
        if _holders == 0:
            raise RuntimeError("resume() without pause()")
        _holders -= 1
        if _holders == 0 and _was_enabled:
            gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    pause()
    try:
        yield
    finally:
        resume()


class PauseUntil:
    """One pause that is started once and ended once, possibly by another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = 0  # 0 not started, 1 holding, 2 done

    def start(self) -> None:
        with self._lock:
            if self._state == 0:
                pause()
                self._state = 1

    def end(self) -> None:
        with self._lock:
            if self._state == 1:
                resume()
            self._state = 2
