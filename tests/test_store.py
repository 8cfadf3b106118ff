"""The indexed store: keys, the namespace index, custom indexes, thread safety."""

from __future__ import annotations

import threading

import pytest

from informers.objects import KubeObject, meta_namespace_key, split_key
from informers.store import NAMESPACE_INDEX, IndexConflictError, Indexer
from informers.testing import make_object


def by_node(obj: KubeObject) -> list[str]:
    node = obj.get("spec", {}).get("nodeName")
    return [node] if node else []


def by_claims(obj: KubeObject) -> list[str]:
    return [c["name"] for c in obj.get("spec", {}).get("claims", [])]


def names(objs: list[KubeObject]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        pytest.param(make_object("a", "ns1"), "ns1/a", id="namespaced"),
        pytest.param(make_object("node-1", None), "node-1", id="cluster-scoped"),
    ],
)
def test_objects_are_keyed_namespace_slash_name(obj: KubeObject, key: str) -> None:
    assert meta_namespace_key(obj) == key
    store = Indexer()
    store.add(obj)
    assert store.get_by_key(key) is obj
    assert store.get(make_object(obj["metadata"]["name"], obj["metadata"].get("namespace"))) is obj


def test_split_key_undoes_the_key() -> None:
    assert split_key("ns1/a") == ("ns1", "a")
    assert split_key("node-1") == ("", "node-1")


def test_namespace_index_is_built_in() -> None:
    store = Indexer()
    for i in range(6):
        store.add(make_object(f"p{i}", f"ns{i % 2}"))
    assert names(store.by_index(NAMESPACE_INDEX, "ns0")) == ["p0", "p2", "p4"]
    assert sorted(store.index_keys(NAMESPACE_INDEX, "ns1")) == ["ns1/p1", "ns1/p3", "ns1/p5"]
    assert sorted(store.list_index_values(NAMESPACE_INDEX)) == ["ns0", "ns1"]
    assert store.by_index(NAMESPACE_INDEX, "elsewhere") == []


def test_update_moves_an_object_between_index_values() -> None:
    store = Indexer({"node": by_node})
    store.add(make_object("p", spec={"nodeName": "n1"}))
    store.update(make_object("p", spec={"nodeName": "n2"}))
    assert store.by_index("node", "n1") == []
    assert names(store.by_index("node", "n2")) == ["p"]
    assert store.list_index_values("node") == ["n2"], "an emptied value is dropped"


def test_delete_removes_the_object_from_every_index() -> None:
    store = Indexer({"node": by_node})
    obj = make_object("p", spec={"nodeName": "n1"})
    store.add(obj)
    store.delete(obj)
    assert store.get_by_key("default/p") is None
    assert store.by_index("node", "n1") == []
    assert store.by_index(NAMESPACE_INDEX, "default") == []
    assert store.list_index_values("node") == []


def test_an_object_can_file_under_several_values() -> None:
    store = Indexer({"claim": by_claims})
    store.add(make_object("p1", spec={"claims": [{"name": "a"}, {"name": "b"}]}))
    store.add(make_object("p2", spec={"claims": [{"name": "b"}]}))
    assert names(store.by_index("claim", "b")) == ["p1", "p2"]
    assert names(store.index("claim", make_object("x", spec={"claims": [{"name": "a"}]}))) == ["p1"]


def test_indexers_added_after_objects_index_the_existing_ones() -> None:
    store = Indexer()
    store.add(make_object("p1", spec={"nodeName": "n1"}))
    store.add(make_object("p2", spec={"nodeName": "n1"}))
    store.add_indexers({"node": by_node})
    assert names(store.by_index("node", "n1")) == ["p1", "p2"]
    store.add(make_object("p3", spec={"nodeName": "n1"}))
    assert names(store.by_index("node", "n1")) == ["p1", "p2", "p3"]


def test_an_indexer_name_cannot_be_taken_twice() -> None:
    store = Indexer({"node": by_node})
    with pytest.raises(IndexConflictError):
        store.add_indexers({"node": by_claims})
    with pytest.raises(IndexConflictError):
        store.add_indexers({NAMESPACE_INDEX: by_node})


def test_an_unknown_index_is_an_error_not_an_empty_answer() -> None:
    with pytest.raises(KeyError):
        Indexer().by_index("node", "n1")


def test_replace_makes_the_store_hold_exactly_the_new_objects() -> None:
    store = Indexer({"node": by_node})
    store.add(make_object("old", spec={"nodeName": "n1"}))
    store.replace([make_object("new", spec={"nodeName": "n2"})])
    assert store.list_keys() == ["default/new"]
    assert store.by_index("node", "n1") == []
    assert names(store.by_index("node", "n2")) == ["new"]


def test_an_index_function_that_raises_leaves_the_store_unchanged() -> None:
    def fragile(obj: KubeObject) -> list[str]:
        if obj.get("bad"):
            raise ValueError("cannot index")
        return ["v"]

    store = Indexer({"fragile": fragile})
    good = make_object("p")
    store.add(good)
    with pytest.raises(ValueError):
        store.update(make_object("p", bad=True))
    assert store.get_by_key("default/p") is good
    assert store.index_keys("fragile", "v") == ["default/p"]


def test_returned_objects_are_the_cached_ones_not_copies() -> None:
    # Documented contract: readers get the shared object and must not change it.
    store = Indexer()
    obj = make_object("p")
    store.add(obj)
    assert store.list()[0] is obj
    assert store.by_index(NAMESPACE_INDEX, "default")[0] is obj


def test_concurrent_writers_and_readers_keep_indexes_consistent() -> None:
    store = Indexer({"node": by_node})
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(2000):
                store.update(make_object(f"p{i % 50}", spec={"nodeName": f"n{(i + w) % 7}"}))
                if i % 11 == 0:
                    store.delete(make_object(f"p{(i * 3) % 50}"))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(2000):
                for value in store.list_index_values("node"):
                    for obj in store.by_index("node", value):
                        assert obj["metadata"]["name"].startswith("p")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Every key sits under exactly the value its object says, and nowhere else.
    filed = {k: v for v in store.list_index_values("node") for k in store.index_keys("node", v)}
    assert filed == {store.key_of(o): o["spec"]["nodeName"] for o in store.list()}
