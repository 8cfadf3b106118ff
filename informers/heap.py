"""Giving the heap freed by a big list back to the operating system.

Turning a list of 20,000 pods into a cache allocates and frees several
times what it keeps (each page's text, the decoded objects the transform
replaces with shared equals). glibc keeps most of what was freed: RSS
stays about 280 bytes per cached pod higher than what is in use
(benchmarks/informer_bench.py), and RSS is what a container's memory limit
counts. ``malloc_trim(0)`` returns the free pages; it costs a few
milliseconds and runs once per full list, which is rare.

Where the C library has no ``malloc_trim`` (musl, macOS), this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Callable

log = logging.getLogger(__name__)


def _find_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


_malloc_trim = _find_malloc_trim()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS; False where that is not possible."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True
