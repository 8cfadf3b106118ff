"""heap.release_free_memory: freed C-heap pages go back to the operating system."""

from __future__ import annotations

import os

import pytest

from informers import heap


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(heap._malloc_trim is None, reason="the C library has no malloc_trim")
def test_freed_heap_returns_to_the_os() -> None:
    # 1 KB bytes objects come from malloc (pymalloc serves up to 512 B).
    # Keeping one in 64 leaves the heap's top in use, so free() alone
    # cannot shrink it: the pages in between stay resident until trimmed.
    blocks = [bytes(1000) + i.to_bytes(4, "little") for i in range(200_000)]
    kept = blocks[::64]
    del blocks
    before = rss()
    assert heap.release_free_memory()
    after = rss()
    assert before - after > 100 * 2**20, (before, after)
    assert len(kept) == 3125
