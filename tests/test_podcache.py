"""model.podcache.prune_pod: the controller's pod cache keeps what it reads.

Each test reads a realistic pod (benchmarks/informer_bench.pod_manifest:
two containers with env, probes, mounts; volumes of several kinds) through
the functions the controller reads cached pods with, pruned and whole, and
requires the same answer."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest

from benchmarks.informer_bench import pod_manifest
from gpuclaimctl.decide import podplan
from gpuclaimctl.decide.capacity import pod_holds_node, pod_usage
from gpuclaimctl.model.resources import extended_resources, pod_request
from gpuclaimctl.model import api
from gpuclaimctl.model.gangs import Gang, pod_gang
from gpuclaimctl.state.indexes import pods_by_gang
from gpuclaimctl.model.podcache import LAST_APPLIED, prune_pod
from gpuclaimctl.model.podclaims import has_gate, pod_claims
from gpuclaimctl.model.snapshot import PodInfo
from gpuclaimctl.model.volumes import pvc_names

Obj = dict[str, Any]


def as_served(i: int) -> Obj:
    """A realistic pod as the API server sends it: our gate and claims,
    GPU requests, node rules, volumes of every kind, status."""
    pod = pod_manifest(i, "team")
    meta, spec = pod["metadata"], pod["spec"]
    meta.update(uid=f"uid-{i}", resourceVersion="42", creationTimestamp="2026-12-01T10:00:00Z",
                ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j1",
                                  "controller": True}],
                managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}])
    meta.setdefault("annotations", {})[api.CLAIMS_ANNOTATION] = json.dumps(
        [{"name": "gpu", "className": "a100", "count": 2}])
    meta["annotations"][LAST_APPLIED] = json.dumps(pod)
    spec["schedulingGates"] = [{"name": api.SCHEDULING_GATE}, {"name": "other.example/gate"}]
    spec["nodeSelector"] = {"pool": "gpu"}
    spec["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    spec["overhead"] = {"nvidia.com/gpu": "1"}
    spec["schedulingGroup"] = {"podGroupName": "train"}
    spec["containers"][0].setdefault("resources", {})["limits"] = {"nvidia.com/gpu": "2"}
    spec["initContainers"] = [{"name": "side", "image": "x", "restartPolicy": "Always",
                               "env": [{"name": "A", "value": "b"}],
                               "resources": {"requests": {"nvidia.com/gpu": "1"}}}]
    spec.setdefault("volumes", []).extend([
        {"name": "data", "persistentVolumeClaim": {"claimName": "dataset", "readOnly": True}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["RWO"]}}}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
    ])
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable",
                     "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
                     "containerStatuses": [{"name": "c", "ready": False}]}
    return pod


@pytest.mark.parametrize("i", range(5))
def test_what_the_controller_reads_is_the_same_pruned(i: int) -> None:
    pod = as_served(i)
    whole = copy.deepcopy(pod)
    pruned = prune_pod(pod)
    assert pod == whole  # the informer's object is not changed in place
    assert PodInfo.from_api(pruned) == PodInfo.from_api(whole)
    assert pod_claims(pruned) == pod_claims(whole)
    assert has_gate(pruned) == has_gate(whole)
    assert pvc_names(pruned) == pvc_names(whole) and len(pvc_names(whole)) >= 2
    assert extended_resources(pruned) == extended_resources(whole)
    assert pod_request(pruned, "nvidia.com/gpu") == pod_request(whole, "nvidia.com/gpu") > 0
    for p in (pruned, whole):
        p["spec"]["nodeName"] = "n1"
    assert pod_holds_node(pruned) == pod_holds_node(whole)
    assert list(pod_usage(pruned)) == list(pod_usage(whole))
    assert podplan.release_patch(pruned, "n1") == podplan.release_patch(whole, "n1")
    assert pruned["status"] == {k: whole["status"][k] for k in ("phase", "conditions")}
    podgroups = {("team", "train"): {"metadata": {"name": "train"},
                                     "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}}
    assert pod_gang(pruned, lambda ns, n: podgroups.get((ns, n))) \
        == pod_gang(whole, lambda ns, n: podgroups.get((ns, n))) == Gang("team", "train", 3, "podgroup")
    assert pods_by_gang(pruned) == pods_by_gang(whole) == ["team/podgroup:train"]


def test_a_pod_whose_only_annotation_is_kubectls_copy_is_still_patched_into_its_map() -> None:
    """The release adds its annotation to an existing map, or makes the map;
    making it would drop the copy kubectl apply relies on."""
    pod = as_served(0)
    pod["metadata"]["annotations"] = {LAST_APPLIED: "{...}"}
    patch = podplan.release_patch(prune_pod(pod), "n1")
    assert patch == podplan.release_patch(pod, "n1")
    assert not any(op["path"] == "/metadata/annotations" for op in patch)


def test_a_pruned_realistic_pod_is_a_fraction_of_the_whole() -> None:
    pods = [as_served(i) for i in range(50)]
    whole = sum(len(orjson.dumps(p)) for p in pods)
    pruned = sum(len(orjson.dumps(prune_pod(p))) for p in pods)
    assert pruned < whole / 5, (pruned, whole)


def test_odd_shapes_do_not_raise() -> None:
    for pod in ({}, {"metadata": None, "spec": "x"}, {"spec": {"containers": ["x"], "volumes": [1, {}]}}):
        prune_pod(pod)  # type: ignore[arg-type]


@pytest.mark.parametrize("node_affinity", [True, False])
def test_the_release_pins_node_affinity_and_keeps_pod_anti_affinity_it_never_cached(
        node_affinity: bool) -> None:
    from tests.sim.fakeapi import json_patch

    pod = as_served(1)
    anti = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"job": "j"}}}}]}
    pod["spec"]["affinity"] = dict(pod["spec"]["affinity"], podAntiAffinity=anti)
    if not node_affinity:
        del pod["spec"]["affinity"]["nodeAffinity"]
    cached = prune_pod(pod)
    assert "podAntiAffinity" not in cached["spec"]["affinity"]
    released = json_patch(pod, podplan.release_patch(cached, "n7"))
    assert released["spec"]["affinity"]["podAntiAffinity"] == anti
    terms = released["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms and all(t["matchFields"][-1]["values"] == ["n7"] for t in terms)
    if node_affinity:  # the user's terms are kept, each narrowed to the node
        assert terms[0]["matchExpressions"] == pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]


def test_a_release_read_from_a_pod_without_affinity_makes_the_field() -> None:
    from tests.sim.fakeapi import json_patch

    pod = as_served(2)
    del pod["spec"]["affinity"]
    released = json_patch(pod, podplan.release_patch(prune_pod(pod), "n3"))
    assert set(released["spec"]["affinity"]) == {"nodeAffinity"}


def test_the_controller_built_by_the_app_caches_pods_pruned() -> None:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options
    from informers import PODS

    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))  # never asked
    factory, controller = app.build(api_client, Options(), CollectorRegistry())
    controller.queue.shut_down()  # its delay thread: no test may leave one behind
    transform = factory.informer_for(PODS).reflector._transform
    assert transform is not None
    cached = transform(as_served(3))
    assert "labels" not in cached["metadata"] and "managedFields" not in cached["metadata"]
    assert all(set(c) <= {"name", "resources", "restartPolicy"} for c in cached["spec"]["containers"])
