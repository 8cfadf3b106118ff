"""Cache index functions: the keys one object's change reaches, and nothing
(never an exception) for a malformed object."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuclaimctl.model import api
from gpuclaimctl.state import indexes
from gpuclaimctl.model.podclaims import template_claim_name
from informers.store import Indexer

Obj = dict[str, Any]


def gated_pod(annotation: Any = None, *, gates: Any = None, node: Any = None) -> Obj:
    meta: Obj = {"name": "trainer", "namespace": "ml", "uid": "pod-uid"}
    if annotation is not None:
        meta["annotations"] = {api.CLAIMS_ANNOTATION: annotation if isinstance(annotation, str)
                               else json.dumps(annotation)}
    spec: Obj = {"containers": [{"name": "c"}],
                 "schedulingGates": gates if gates is not None else [{"name": api.SCHEDULING_GATE}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


def bound_claim() -> Obj:
    return {
        "metadata": {
            "name": "trainer-gpu", "namespace": "ml", "uid": "claim-uid",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u0"},
                {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "u1", "controller": True},
            ],
        },
        "spec": {"className": "a100", "count": 2},
        "status": {
            "phase": "Bound", "nodeName": "node-a",
            "reservedFor": [{"name": "trainer", "uid": "u1"}],
            "rejectedNodes": [{"nodeName": "node-b", "until": "2030-01-01T00:00:00Z"},
                              {"nodeName": "node-c", "until": "2030-01-01T00:00:00Z"}],
        },
    }


# --- what well-formed objects are filed under ---------------------------------------


def test_a_claim_is_filed_under_its_owner_pod_reserving_pod_node_and_rejected_nodes() -> None:
    claim = bound_claim()
    assert indexes.claims_by_owner_pod(claim) == ["ml/trainer"]
    assert indexes.claims_by_reserved_pod(claim) == ["ml/trainer"]
    assert indexes.claims_by_node(claim) == ["node-a"]
    assert indexes.claims_by_rejected_node(claim) == ["node-b", "node-c"]


@pytest.mark.parametrize(
    "ref",
    [
        pytest.param({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}, id="not-the-controller"),
        pytest.param({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "p", "uid": "u",
                      "controller": True}, id="controlled-by-a-replicaset"),
        pytest.param({"apiVersion": "example.com/v1", "kind": "Pod", "name": "p", "uid": "u",
                      "controller": True}, id="a-pod-kind-of-another-group"),
    ],
)
def test_a_claim_no_pod_controls_has_no_owner_pod(ref: Obj) -> None:
    claim = bound_claim()
    claim["metadata"]["ownerReferences"] = [ref]
    assert indexes.claims_by_owner_pod(claim) == []


def test_a_pending_unreserved_claim_is_filed_under_no_pod_or_node() -> None:
    claim = {"metadata": {"name": "c", "namespace": "ml"}, "spec": {}, "status": {"phase": "Pending"}}
    for fn in indexes.CLAIM_INDEXERS.values():
        assert fn(claim) == []


def test_a_pod_is_filed_under_every_claim_its_annotation_names() -> None:
    pod = gated_pod([{"name": "gpu", "className": "a100", "count": 1},
                     {"name": "shared", "claim": "team-claim"},
                     {"name": "big", "template": "eight-gpus"}])
    assert indexes.pods_by_claim(pod) == [
        f"ml/{template_claim_name('trainer', 'gpu')}", "ml/team-claim",
        f"ml/{template_claim_name('trainer', 'big')}"]


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("not json", id="not-json"),
        pytest.param({"name": "gpu"}, id="not-a-list"),
        pytest.param([], id="empty-list"),
        pytest.param([{"name": "gpu", "claim": "a", "template": "b"}], id="two-sources"),
        pytest.param([{"name": "gpu", "className": "a100", "count": 0}], id="count-below-one"),
        pytest.param([{"name": "x", "claim": "a"}, {"name": "x", "claim": "b"}], id="duplicate-names"),
    ],
)
def test_a_pod_with_a_bad_annotation_is_filed_under_no_claim(annotation: Any) -> None:
    assert indexes.pods_by_claim(gated_pod(annotation)) == []


def test_a_pod_without_the_annotation_is_filed_under_no_claim() -> None:
    assert indexes.pods_by_claim(gated_pod()) == []


@pytest.mark.parametrize(
    "gates, waiting",
    [
        pytest.param([{"name": api.SCHEDULING_GATE}], True, id="our-gate"),
        pytest.param([{"name": "example.com/other"}, {"name": api.SCHEDULING_GATE}], True,
                     id="our-gate-among-others"),
        pytest.param([{"name": "example.com/other"}], False, id="another-gate"),
        pytest.param([], False, id="released"),
    ],
)
def test_only_pods_that_carry_our_gate_are_waiting(gates: list[Obj], waiting: bool) -> None:
    pod = gated_pod(gates=gates)
    assert indexes.has_gate(pod) is waiting
    assert indexes.waiting_pods(pod) == ([""] if waiting else [])


def test_the_indexers_work_in_the_informer_store() -> None:
    claims = Indexer(indexers=indexes.CLAIM_INDEXERS)
    claims.add(bound_claim())
    pods = Indexer(indexers=indexes.POD_INDEXERS)
    pods.add(gated_pod([{"name": "shared", "claim": "trainer-gpu"}]))
    assert [c["metadata"]["name"] for c in claims.by_index(indexes.CLAIMS_BY_REJECTED_NODE, "node-c")] \
        == ["trainer-gpu"]
    assert [p["metadata"]["name"] for p in pods.by_index(indexes.PODS_BY_CLAIM, "ml/trainer-gpu")] \
        == ["trainer"]
    assert [p["metadata"]["name"] for p in pods.by_index(indexes.WAITING_PODS, "")] == ["trainer"]


# --- malformed objects ---------------------------------------------------------------

# Values of the wrong type put where an object, a list or a string belongs.
JUNK: tuple[Any, ...] = (None, "", "text", 0, 7, True, [], ["x"], [None], [7], {}, {"k": "v"}, [{"k": []}])


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a nested object where a value can be replaced."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _with(obj: Obj, path: tuple[Any, ...], value: Any) -> Obj:
    out = copy.deepcopy(obj)
    target: Any = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return out


def malformed(good: Obj) -> Iterator[Obj]:
    yield {}
    for junk in JUNK:
        for path in _paths(good):
            yield _with(good, path, junk)


GOOD_POD = gated_pod([{"name": "gpu", "className": "a100", "count": 1}, {"name": "s", "claim": "c"}],
                     node="node-a")

INDEXERS: list[tuple[str, Callable[[Obj], list[str]], Obj]] = (
    [(name, fn, bound_claim()) for name, fn in indexes.CLAIM_INDEXERS.items()]
    + [(name, fn, GOOD_POD) for name, fn in indexes.POD_INDEXERS.items()]
)


@pytest.mark.parametrize("fn, good", [pytest.param(fn, good, id=name) for name, fn, good in INDEXERS])
def test_a_malformed_object_is_filed_under_strings_or_nothing_and_never_raises(
    fn: Callable[[Obj], list[str]], good: Obj
) -> None:
    checked = 0
    for obj in malformed(good):
        values = fn(obj)  # raising here fails the test with the object in the traceback
        assert isinstance(values, list) and all(isinstance(v, str) for v in values), obj
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("annotation", [7, None, ["a"], {"x": 1}])
def test_an_annotation_value_that_is_not_a_string_is_filed_under_no_claim(annotation: Any) -> None:
    pod = gated_pod()
    pod["metadata"]["annotations"] = {api.CLAIMS_ANNOTATION: annotation}
    assert indexes.pods_by_claim(pod) == []


def test_has_gate_never_raises_on_a_malformed_pod() -> None:
    for obj in malformed(gated_pod()):
        assert isinstance(indexes.has_gate(obj), bool)


def test_a_work_key_is_spelled_and_parsed_in_one_place() -> None:
    from gpuclaimctl.model.keys import Kind, WorkKey
    from gpuclaimctl.sync.context import AUDIT_INFLIGHT, CLAIM, POD

    assert str(WorkKey(Kind.POD, "ns/p")) == POD + "ns/p" == "pod:ns/p"
    assert WorkKey.parse(CLAIM + "ns/c") == WorkKey(Kind.CLAIM, "ns/c")
    assert WorkKey.parse(AUDIT_INFLIGHT) == WorkKey(Kind.AUDIT, "inflight")
    assert WorkKey.of_pod("pod:a-b/x") == "a-b/x" and WorkKey.of_pod("claim:a/x") is None
    for bad in ("pods:ns/p", "ns/p", "", ":x"):
        with pytest.raises(ValueError):
            WorkKey.parse(bad)
