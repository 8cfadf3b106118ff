from __future__ import annotations

from typing import Any

import pytest

from gpuclaimctl.model.volumes import VolumeConstraint, pvc_names, volume_constraints

NS = "ml"
HOST = "kubernetes.io/hostname"
NODE_3 = {HOST: "node-3", "zone": "a"}
NODE_4 = {HOST: "node-4", "zone": "a"}


def pod(*volumes: Any, name: str = "train-0", uid: str = "pod-uid") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid}, "spec": {"volumes": list(volumes)}}


def claim_volume(volume: str, claim: str) -> dict[str, Any]:
    return {"name": volume, "persistentVolumeClaim": {"claimName": claim}}


def ephemeral_volume(volume: str) -> dict[str, Any]:
    return {"name": volume, "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}


def pvc(name: str, volume_name: str | None = None, owner_uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owner_uid is not None:
        meta["ownerReferences"] = [{"kind": "Pod", "name": "train-0", "uid": owner_uid, "controller": True}]
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if volume_name is not None:
        spec["volumeName"] = volume_name
    return {"metadata": meta, "spec": spec}


def local_pv(name: str, host: str = "node-3") -> dict[str, Any]:
    return pv(name, {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": HOST, "operator": "In", "values": [host]}]}]}})


def pv(name: str, node_affinity: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "1Ti"}, "local": {"path": "/mnt/data"}}
    if node_affinity is not None:
        spec["nodeAffinity"] = node_affinity
    return {"metadata": {"name": name}, "spec": spec}


def constraints(pod_obj: Any, pvcs: list[Any], pvs: list[Any]) -> tuple[VolumeConstraint, ...]:
    by_claim = {(NS, c["metadata"]["name"]): c for c in pvcs}
    by_name = {v["metadata"]["name"]: v for v in pvs}
    return volume_constraints(pod_obj, lambda ns, n: by_claim.get((ns, n)), by_name.get)


# (pod volume, claim, PV) of each constraint expected; every one built by
# local_pv reaches node-3 only.
@pytest.mark.parametrize(
    "pod_obj, pvcs, pvs, expected",
    [
        pytest.param(pod(claim_volume("data", "data")), [pvc("data", "pv-data")], [local_pv("pv-data")],
                     [("data", "data", "pv-data")], id="bound-pv-with-node-affinity-constrains"),
        pytest.param(pod(claim_volume("data", "data")), [pvc("data")], [local_pv("pv-data")],
                     [], id="unbound-claim-does-not-constrain"),
        pytest.param(pod(claim_volume("data", "data")), [], [local_pv("pv-data")],
                     [], id="missing-claim-does-not-constrain"),
        pytest.param(pod(claim_volume("data", "data")), [pvc("data", "pv-data")], [],
                     [], id="claim-bound-to-a-pv-not-in-the-cache-does-not-constrain"),
        pytest.param(pod(claim_volume("data", "data")), [pvc("data", "pv-data")], [pv("pv-data")],
                     [], id="pv-without-node-affinity-does-not-constrain"),
        pytest.param(pod(claim_volume("data", "data")), [pvc("data", "pv-data")], [pv("pv-data", {})],
                     [], id="pv-node-affinity-without-required-does-not-constrain"),
        pytest.param(pod(ephemeral_volume("scratch")), [pvc("train-0-scratch", "pv-s", owner_uid="pod-uid")],
                     [local_pv("pv-s")], [("scratch", "train-0-scratch", "pv-s")],
                     id="ephemeral-volume-claim-is-pod-name-dash-volume"),
        pytest.param(pod(ephemeral_volume("scratch")), [pvc("train-0-scratch", "pv-s", owner_uid="older-pod")],
                     [local_pv("pv-s")], [], id="ephemeral-claim-of-another-pod-does-not-constrain"),
        pytest.param(pod(ephemeral_volume("scratch")), [pvc("train-0-scratch", "pv-s")],
                     [local_pv("pv-s")], [], id="ephemeral-claim-without-owner-does-not-constrain"),
        pytest.param(pod(claim_volume("a", "data"), claim_volume("b", "data")), [pvc("data", "pv-data")],
                     [local_pv("pv-data")], [("a", "data", "pv-data")], id="one-constraint-per-pv"),
        pytest.param(pod(claim_volume("data", "data"), claim_volume("logs", "logs")),
                     [pvc("data", "pv-data"), pvc("logs", "pv-logs")], [local_pv("pv-data"), local_pv("pv-logs")],
                     [("data", "data", "pv-data"), ("logs", "logs", "pv-logs")], id="every-bound-volume-in-pod-order"),
        pytest.param(pod({"name": "tmp", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "data"}}),
                     [pvc("data", "pv-data")], [local_pv("pv-data")], [], id="other-volume-kinds-ignored"),
    ],
)
def test_volume_constraints(
    pod_obj: dict[str, Any], pvcs: list[Any], pvs: list[Any], expected: list[tuple[str, str, str]]
) -> None:
    got = constraints(pod_obj, pvcs, pvs)
    assert [(c.volume, c.claim, c.pv) for c in got] == expected
    for c in got:
        assert c.reaches(NODE_3) and not c.reaches(NODE_4)


def test_claims_are_looked_up_in_the_pods_namespace() -> None:
    asked: list[tuple[str, str]] = []

    def get_pvc(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((namespace, name))
        return None

    volume_constraints(pod(claim_volume("data", "data"), ephemeral_volume("s")), get_pvc, lambda _: None)
    assert asked == [(NS, "data"), (NS, "train-0-s")]


def test_pvc_names_lists_claim_backed_volumes_with_ephemeral_ones_marked() -> None:
    p = pod(claim_volume("data", "ds"), ephemeral_volume("scratch"), {"name": "tmp", "emptyDir": {}})
    assert pvc_names(p) == (("data", "ds", False), ("scratch", "train-0-scratch", True))


@pytest.mark.parametrize(
    "terms, reaches",
    [
        pytest.param([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                            {"key": HOST, "operator": "NotIn", "values": ["node-3"]}]}],
                     {"node-3": False, "node-4": True}, id="expressions-within-a-term-ANDed"),
        pytest.param([{"matchExpressions": [{"key": HOST, "operator": "In", "values": ["node-9"]}]},
                      {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["node-4"]}]}],
                     {"node-3": False, "node-4": True}, id="terms-ORed"),
        pytest.param([{"matchExpressions": [{"key": "disk", "operator": "DoesNotExist"}]}],
                     {"node-3": True, "node-4": True}, id="DoesNotExist"),
        pytest.param([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-3"]}]}],
                     {"node-3": False, "node-4": False}, id="matchFields-name-In-reaches-no-node-as-in-the-scheduler"),
        pytest.param([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-3"]}]}],
                     {"node-3": True, "node-4": True}, id="matchFields-name-NotIn-reaches-every-node"),
    ],
)
def test_pv_terms_are_matched_like_the_schedulers_volume_binding(
    terms: list[dict[str, Any]], reaches: dict[str, bool]
) -> None:
    (c,) = constraints(pod(claim_volume("data", "data")), [pvc("data", "pv-data")],
                       [pv("pv-data", {"required": {"nodeSelectorTerms": terms}})])
    labels = {"node-3": NODE_3, "node-4": NODE_4}
    assert {n: c.reaches(labels[n]) for n in reaches} == reaches


GOOD_PVC = pvc("data", "pv-data")
GOOD_POD = pod(claim_volume("data", "data"))


@pytest.mark.parametrize(
    "pod_obj, pvcs, pvs",
    [
        pytest.param({}, [GOOD_PVC], [local_pv("pv-data")], id="pod-without-metadata-or-spec"),
        pytest.param({"metadata": "x", "spec": []}, [GOOD_PVC], [local_pv("pv-data")], id="pod-fields-wrong-types"),
        pytest.param({"metadata": {"namespace": NS}, "spec": {"volumes": "data"}}, [GOOD_PVC],
                     [local_pv("pv-data")], id="volumes-not-a-list"),
        pytest.param(pod("data", None, {"persistentVolumeClaim": {"claimName": "data"}}), [GOOD_PVC],
                     [local_pv("pv-data")], id="volume-entries-not-volumes-or-nameless"),
        pytest.param(pod({"name": "data", "persistentVolumeClaim": {"claimName": 7}}), [GOOD_PVC],
                     [local_pv("pv-data")], id="claim-name-not-a-string"),
        pytest.param(pod({"name": "data", "persistentVolumeClaim": "data"}), [GOOD_PVC],
                     [local_pv("pv-data")], id="claim-source-not-an-object"),
        pytest.param(GOOD_POD, [{"metadata": {"name": "data"}, "spec": "pv-data"}], [local_pv("pv-data")],
                     id="claim-spec-not-an-object"),
        pytest.param(GOOD_POD, [{"metadata": {"name": "data"}, "spec": {"volumeName": ["pv-data"]}}],
                     [local_pv("pv-data")], id="volume-name-not-a-string"),
        pytest.param(GOOD_POD, [GOOD_PVC], [{"metadata": {"name": "pv-data"}, "spec": "x"}], id="pv-spec-not-an-object"),
        pytest.param(GOOD_POD, [GOOD_PVC], [pv("pv-data", "local")], id="pv-node-affinity-not-an-object"),
        pytest.param(GOOD_POD, [GOOD_PVC], [pv("pv-data", {"required": ["x"]})], id="required-not-an-object"),
        pytest.param(GOOD_POD, [GOOD_PVC], [pv("pv-data", {"required": {"nodeSelectorTerms": "x"}})],
                     id="terms-not-a-list"),
        pytest.param(GOOD_POD, [GOOD_PVC], [pv("pv-data", {"required": {"nodeSelectorTerms": []}})],
                     id="no-terms"),
    ],
)
def test_malformed_objects_do_not_constrain_and_never_raise(pod_obj: Any, pvcs: list[Any], pvs: list[Any]) -> None:
    assert constraints(pod_obj, pvcs, pvs) == ()


def test_listers_returning_something_odd_do_not_constrain() -> None:
    assert volume_constraints(GOOD_POD, lambda ns, n: "data", lambda n: None) == ()  # type: ignore[arg-type,return-value]
    assert volume_constraints(GOOD_POD, lambda ns, n: GOOD_PVC, lambda n: ["pv"]) == ()  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param(["zone=a"], id="term-not-an-object"),
        pytest.param([{"matchExpressions": {"key": "zone"}}], id="expressions-not-a-list"),
        pytest.param([{"matchExpressions": [{"key": "zone", "operator": "In", "values": [1]}]}],
                     id="values-not-strings"),
        pytest.param([{"matchExpressions": [{"key": "zone", "operator": "Gt", "values": [3]}]}],
                     id="Gt-value-not-a-string"),
        pytest.param([{"matchExpressions": [{"key": "zone", "operator": "Like", "values": ["a"]}]}],
                     id="unknown-operator"),
        pytest.param([{}], id="empty-term"),
    ],
)
def test_a_pv_term_that_does_not_parse_reaches_no_node(terms: list[Any]) -> None:
    """As upstream's lazy-error selector: the term matches nothing, and the
    scheduler refuses every node for such a volume."""
    (c,) = constraints(GOOD_POD, [GOOD_PVC], [pv("pv-data", {"required": {"nodeSelectorTerms": terms}})])
    assert not c.reaches(NODE_3) and not c.reaches({})
