"""Transforms: stripping managedFields, and sharing equal parts between cached objects."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from informers.objects import KubeObject
from informers.transforms import Compactor, chain, strip_managed_fields


def pod(i: int, volume: str | None = None) -> KubeObject:
    """A pod as the API server returns one (after defaulting), varied by ``i``."""
    volume = volume or f"kube-api-access-{i:05d}"
    return orjson.loads(orjson.dumps({
        "metadata": {
            "name": f"train-{i}", "namespace": "ml", "uid": f"uid-{i}", "resourceVersion": str(100 + i),
            "labels": {"app": "train", "tier": "gpu"},
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        },
        "spec": {
            "volumes": [{"name": volume, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}],
                                                      "defaultMode": 420}}],
            "containers": [{"name": "main", "image": "train:v1",
                            "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
                            "volumeMounts": [{"name": volume, "readOnly": True, "mountPath": "/var/run"}]}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "enableServiceLinks": True, "priority": 0, "securityContext": {},
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }))


def test_strip_managed_fields_removes_only_managed_fields() -> None:
    obj = pod(1)
    expected = copy.deepcopy(obj)
    del expected["metadata"]["managedFields"]
    assert strip_managed_fields(obj) == expected
    assert strip_managed_fields({"kind": "Status"}) == {"kind": "Status"}


def test_chain_applies_transforms_left_to_right() -> None:
    seen: list[str] = []

    def first(o: KubeObject) -> KubeObject:
        seen.append("first")
        return o

    def second(o: KubeObject) -> KubeObject:
        seen.append("second")
        return o

    chain(first, second)({})
    assert seen == ["first", "second"]


def test_compacted_objects_are_equal_to_what_came_in() -> None:
    c = Compactor()
    for i in range(50):
        obj = pod(i % 7 if i % 3 else i)
        expected = orjson.dumps(obj)
        assert orjson.dumps(c(obj)) == expected


def test_equal_parts_of_different_objects_become_one_object() -> None:
    c = Compactor()
    a, b = c(pod(1)), c(pod(2))
    assert a["spec"]["tolerations"] is b["spec"]["tolerations"]
    assert a["spec"]["volumes"][0]["projected"] is b["spec"]["volumes"][0]["projected"]
    assert a["spec"]["containers"][0]["resources"] is b["spec"]["containers"][0]["resources"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["metadata"] is not b["metadata"], "different parts stay apart"
    assert a["spec"]["volumes"] is not b["spec"]["volumes"]


def test_equal_strings_become_one_string() -> None:
    c = Compactor()
    a, b = c(pod(1)), c(pod(2))
    # Built separately so only the compactor can make them the same object.
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["spec"]["containers"][0]["image"] is b["spec"]["containers"][0]["image"]


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param({"x": {"v": True}}, {"x": {"v": 1}}, id="true-vs-1"),
        pytest.param({"x": {"v": 1.0}}, {"x": {"v": 1}}, id="1.0-vs-1"),
        pytest.param({"x": {"v": 0.0}}, {"x": {"v": -0.0}}, id="0.0-vs-minus-0.0"),
        pytest.param({"x": {"a": 1, "b": 2}}, {"x": {"b": 2, "a": 1}}, id="key-order"),
        pytest.param({"x": [None]}, {"x": [False]}, id="null-vs-false"),
    ],
)
def test_values_equal_in_python_but_not_in_json_are_not_merged(left: KubeObject, right: KubeObject) -> None:
    c = Compactor()
    out_left = c(orjson.loads(orjson.dumps(left)))
    out_right = c(orjson.loads(orjson.dumps(right)))
    assert orjson.dumps(out_left) == orjson.dumps(left)
    assert orjson.dumps(out_right) == orjson.dumps(right)
    assert out_left["x"] is not out_right["x"]


def test_the_object_itself_and_one_off_parts_are_not_kept_by_the_long_lived_table() -> None:
    c = Compactor()
    objs = [c(pod(i)) for i in range(3)]
    kept = set(map(id, c._shared.values()))
    assert not any(id(o) in kept for o in objs)
    assert not any(id(o["metadata"]) in kept for o in objs), "metadata is unique to each pod"
    assert id(objs[0]["spec"]["tolerations"]) in kept


def test_tables_stay_bounded() -> None:
    c = Compactor(shared_entries=64, once_entries=32, strings=128)
    for i in range(500):
        c({"metadata": {"name": f"n{i}"}, "data": {"k": f"v{i}", "shared": "s"}, "list": [i, {"i": i}] * 2})
    assert len(c._shared) <= 65 and len(c._once) <= 33 and len(c._strings) <= 129


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, 1, -1, 2**40, 1.5, -0.0, 0.0])
    if kind in (2, 3, 4):
        return rng.choice(["a", "b", "", "long string " * 3])
    if kind in (5, 6):
        return {rng.choice("abcde"): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_random_documents_survive_compaction_unchanged() -> None:
    rng = random.Random(7)
    c = Compactor(shared_entries=50, once_entries=20, strings=40)
    docs = [{"metadata": {"name": str(i)}, "body": random_json(rng)} for i in range(400)]
    encoded = [orjson.dumps(d) for d in docs]
    out = [c(orjson.loads(e)) for e in encoded]
    assert [orjson.dumps(o) for o in out] == encoded


def test_equal_keys_become_one_string() -> None:
    # The standard json module makes new key strings on every call, so only
    # the compactor can make them the same objects (orjson's key cache
    # shares most keys, but not all).
    import json

    def doc(i: int) -> KubeObject:
        spec = {f"field{j}": f"{i}-{j}" for j in range(8)}
        small = {"mountPath": f"/data/{i}", "readOnly": True}
        return json.loads(json.dumps({"metadata": {"name": f"n{i}"}, "spec": spec, "small": small}))

    c = Compactor()
    a, b = c(doc(1)), c(doc(2))
    for part in ("spec", "small"):
        assert list(a[part]) == list(b[part])
        assert all(ka is kb for ka, kb in zip(a[part], b[part])), part
    assert orjson.dumps(a) == orjson.dumps(doc(1))


def test_per_object_metadata_strings_are_not_remembered() -> None:
    c = Compactor()
    c(pod(1))
    assert "uid-1" not in c._strings and "train-1" not in c._strings and "101" not in c._strings
    assert "ml" in c._strings, "the namespace is shared by many objects"


def test_a_string_in_use_stays_shared_when_the_string_table_turns_over() -> None:
    c = Compactor(strings=8)
    objs = [c(orjson.loads(orjson.dumps({"metadata": {"name": f"n{i}"},
                                          "data": {"common": "the-image:v1", "own": f"value-{i}"}})))
            for i in range(100)]
    assert len(c._strings) <= 9
    first = objs[0]["data"]["common"]
    assert all(o["data"]["common"] is first for o in objs)


def spec_pod(i: int, spec_value: str) -> KubeObject:
    return orjson.loads(orjson.dumps({
        "metadata": {"name": f"n{i}"},
        "spec": {"rank": spec_value, "containers": [{"name": "main", "image": "train:v1"}]},
    }))


def test_a_part_under_a_key_whose_parts_never_repeat_is_not_encoded_for_each_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Looking a part up means encoding it, and a part with no equal has its
    # own parts encoded again below it: a pod's unique spec was encoded once
    # for itself and again within each level above its shared parts.
    import informers.transforms as transforms

    encoded: list[Any] = []

    class Counting:
        @staticmethod
        def dumps(v: Any) -> bytes:
            encoded.append(v)
            return orjson.dumps(v)

    monkeypatch.setattr(transforms, "orjson", Counting)
    c = Compactor()
    objs = [c(spec_pod(i, f"rank-{i}")) for i in range(640)]
    spec_lookups = sum(1 for v in encoded if type(v) is dict and "rank" in v)
    assert spec_lookups <= 16 + 3 * 640 // 64  # probes at random, one in 64 expected
    containers = objs[-1]["spec"]["containers"]
    assert all(o["spec"]["containers"] is containers for o in objs[1:]), "the shared parts below are still shared"


def test_parts_under_such_a_key_are_shared_again_once_they_repeat() -> None:
    c = Compactor()
    for i in range(200):
        c(spec_pod(i, f"rank-{i}"))
    objs = [c(spec_pod(1000 + i, "the same")) for i in range(1000)]
    # Two probes apart (the first to see it, the second to find it again):
    # 128 objects expected, 600 leave room for the draw.
    spec = objs[-1]["spec"]
    assert all(o["spec"] is spec for o in objs[600:])
    assert all(orjson.dumps(o) == orjson.dumps(spec_pod(1000 + i, "the same")) for i, o in enumerate(objs))


def test_the_shared_items_of_a_list_whose_first_item_is_unique_stay_shared() -> None:
    # The items of a list count their misses together. Probing every 64th
    # landed on the same position of each 16-item list, the unique one (a
    # rank), so the 15 shared items were never looked up again: one copy
    # of each per pod.
    def pod(i: int) -> KubeObject:
        env = [{"name": "RANK", "value": str(i)}] + [{"name": f"E{j}", "value": f"v{j}"} for j in range(1, 16)]
        return orjson.loads(orjson.dumps({"metadata": {"name": f"p{i}"},
                                          "spec": {"containers": [{"name": "main", "env": env}]}}))

    c = Compactor()
    objs = [c(pod(i)) for i in range(1000)]
    shared = {id(item) for o in objs[500:] for item in o["spec"]["containers"][0]["env"][1:]}
    assert len(shared) == 15


def test_the_tables_never_keep_a_big_string_or_part_after_its_object_is_gone() -> None:
    """The tables are bounded by count, not bytes: an annotation padded to
    the API server's 256 KiB, unique per pod, would pin gigabytes there
    after its pods were gone. Such values stay with their object alone."""
    from informers.transforms import _MAX_REMEMBERED

    compactor = Compactor()
    big = "x" * (_MAX_REMEMBERED + 1)
    for i in range(3):
        pod = {"metadata": {"name": f"p{i}", "annotations": {"a": big + str(i), "b": "small"}},
               "spec": {"containers": [{"name": "c", "args": [big + str(i)]}]}}
        out = compactor(pod)
        assert out["metadata"]["annotations"]["a"] == big + str(i)
        assert out["spec"]["containers"][0]["args"] == [big + str(i)]
    tables = [compactor._strings, compactor._older_strings, compactor._once, compactor._shared]
    assert all(len(k) <= _MAX_REMEMBERED for table in tables for k in table)
    assert "small" in compactor._strings  # small values are shared as before
