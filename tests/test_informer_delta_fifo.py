"""The delta queue between reflector and informer: order, relist tombstones, resync, sync state."""

from __future__ import annotations

import threading

import pytest

from informers.delta_fifo import Delta, DeltaFIFO, DeltaType, FIFOClosedError
from informers.objects import DeletedFinalStateUnknown, KubeObject
from informers.store import Indexer
from informers.testing import make_object


def obj(name: str, rv: str = "1", **fields: object) -> KubeObject:
    o = make_object(name, **fields)
    o["metadata"]["resourceVersion"] = rv
    return o


def drain(fifo: DeltaFIFO, store: Indexer | None = None) -> list[tuple[str, str, object]]:
    """Pop everything queued; apply it to ``store`` as the informer would."""
    seen: list[tuple[str, str, object]] = []

    def process(batch: list[Delta]) -> None:
        for dtype, o, key, initial in batch:
            seen.append((dtype.value, key, o))
            if store is not None:
                if dtype is DeltaType.DELETED:
                    store.pop(key)
                else:
                    store.set(key, o)  # type: ignore[arg-type]

    while len(fifo):
        fifo.pop_batch(process, max_items=3)
    return seen


def kinds(seen: list[tuple[str, str, object]]) -> list[tuple[str, str]]:
    return [(t, k) for t, k, _ in seen]


def test_deltas_come_out_in_the_order_they_went_in() -> None:
    fifo = DeltaFIFO(Indexer())
    fifo.add(obj("a"))
    fifo.add(obj("b"))
    fifo.update(obj("a", "2"))
    fifo.delete(obj("b", "3"))
    assert kinds(drain(fifo)) == [
        ("Added", "default/a"),
        ("Added", "default/b"),
        ("Updated", "default/a"),
        ("Deleted", "default/b"),
    ]


def test_a_second_delete_of_the_same_key_in_a_row_is_dropped() -> None:
    fifo = DeltaFIFO(Indexer())
    fifo.delete(obj("a"))
    fifo.delete(obj("a"))
    assert kinds(drain(fifo)) == [("Deleted", "default/a")]


def test_relist_emits_a_tombstone_for_each_stored_object_that_vanished() -> None:
    store = Indexer()
    fifo = DeltaFIFO(store)
    fifo.replace([obj("a"), obj("b"), obj("c")])
    drain(fifo, store)
    fifo.replace([obj("a"), obj("c", "5")])
    seen = drain(fifo, store)
    tombstones = [(k, o) for t, k, o in seen if t == "Deleted"]
    assert len(tombstones) == 1
    key, tomb = tombstones[0]
    assert key == "default/b"
    assert isinstance(tomb, DeletedFinalStateUnknown)
    assert tomb.key == "default/b" and tomb.obj is not None and tomb.obj["metadata"]["name"] == "b"
    assert sorted(store.list_keys()) == ["default/a", "default/c"]


def test_relist_emits_a_tombstone_for_a_queued_object_that_vanished() -> None:
    # Added by the watch, not yet applied, and gone by the relist.
    store = Indexer()
    fifo = DeltaFIFO(store)
    fifo.replace([])
    fifo.add(obj("fleeting"))
    fifo.replace([])
    seen = drain(fifo, store)
    assert kinds(seen) == [("Added", "default/fleeting"), ("Deleted", "default/fleeting")]
    assert isinstance(seen[-1][2], DeletedFinalStateUnknown)
    assert len(store) == 0


def test_relist_adds_no_tombstone_for_a_key_already_being_deleted() -> None:
    store = Indexer()
    fifo = DeltaFIFO(store)
    fifo.replace([obj("a")])
    drain(fifo, store)
    fifo.delete(obj("a", "2"))
    fifo.replace([])
    assert kinds(drain(fifo, store)) == [("Deleted", "default/a")]


def test_resync_queues_every_stored_object_without_a_pending_delta() -> None:
    store = Indexer()
    fifo = DeltaFIFO(store)
    fifo.replace([obj("a"), obj("b")])
    drain(fifo, store)
    fifo.update(obj("a", "2"))
    assert fifo.resync() == 1
    assert kinds(drain(fifo, store)) == [("Updated", "default/a"), ("Sync", "default/b")]


def test_has_synced_waits_for_every_delta_of_the_first_list() -> None:
    store = Indexer()
    fifo = DeltaFIFO(store)
    assert not fifo.has_synced()
    fifo.replace([obj(f"o{i}") for i in range(5)])
    assert not fifo.has_synced()
    fifo.pop_batch(lambda batch: None, max_items=4)
    assert not fifo.has_synced()
    fifo.pop_batch(lambda batch: None, max_items=4)
    assert fifo.has_synced()


def test_an_empty_first_list_is_synced_at_once() -> None:
    fifo = DeltaFIFO(Indexer())
    fifo.replace([])
    assert fifo.has_synced()


def test_only_deltas_of_the_first_list_are_marked_initial() -> None:
    store = Indexer()
    fifo = DeltaFIFO(store)
    fifo.replace([obj("a")])
    first = drain(fifo, store)
    fifo.replace([obj("a"), obj("b")])
    flags: list[bool] = []
    fifo.pop_batch(lambda batch: flags.extend(d[3] for d in batch))
    assert len(first) == 1 and flags == [False, False]


def test_pop_blocks_until_a_delta_arrives_and_close_releases_it() -> None:
    fifo = DeltaFIFO(Indexer())
    got: list[str] = []
    closed = threading.Event()

    def consumer() -> None:
        try:
            while True:
                fifo.pop_batch(lambda batch: got.extend(d[2] for d in batch))
        except FIFOClosedError:
            closed.set()

    t = threading.Thread(target=consumer)
    t.start()
    fifo.add(obj("a"))
    fifo.close()
    t.join(5)
    assert closed.is_set()
    assert got in (["default/a"], []), "close may overtake the add; it must never hang"


def test_pop_after_close_raises() -> None:
    fifo = DeltaFIFO(Indexer())
    fifo.close()
    with pytest.raises(FIFOClosedError):
        fifo.pop_batch(lambda batch: None)
