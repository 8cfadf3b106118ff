"""`gpuclaimctl simulate` and `gpuclaimctl snapshot`: where a manifest's pods
would go, decided by the controller's own code, with no writes.

The pure parts run on literal objects: reading manifests into workloads and
their pods, the snapshot file and its edits, and copies placed in turn on
a `WhatIf`. Against the real plane: `simulate` on the live cluster sends
only reads (the API server's audit log shows every request of the account
it ran as), and `snapshot` then `simulate --snapshot` answer the same.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError, NotFound
from gpuclaimctl.cmd import cli, decisionview, simulate as sim, snapshotfile
from gpuclaimctl.cmd.snapshotfile import SnapshotError, Taken
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.decide.whatif import ClusterObjects, WhatIf, simulate
from gpuclaimctl.model.api import CLAIMS_ANNOTATION, SCHEDULING_GATE, WaitReason
from gpuclaimctl.model.workloads import ManifestError, copies, read_manifests
from tests.controllerkit import RunningController
from tests.helpers import wait_for

GPU = "nvidia.com/gpu"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
MUTATING = {"create", "update", "patch", "delete", "deletecollection"}


# -- literal objects --------------------------------------------------------------------


def pod_template(entries: list[dict[str, Any]], gpus: int = 0) -> dict[str, Any]:
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    return {"metadata": {"labels": {"app": "t"}, "annotations": {CLAIMS_ANNOTATION: json.dumps(entries)}},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}],
                     "containers": [{"name": "main", "image": "busybox", "resources": resources}]}}


def inline(count: int, cls: str = "a100") -> list[dict[str, Any]]:
    return [{"name": "g", "className": cls, "count": count}]


def workload(kind: str, name: str, spec: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    api_version = {"Pod": "v1", "Job": "batch/v1", "CronJob": "batch/v1"}.get(kind, "apps/v1")
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **top}, "spec": spec or {}}


def deployment(name: str, entries: list[dict[str, Any]], replicas: int | None = None,
               gpus: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "t"}}, "template": pod_template(entries, gpus)}
    if replicas is not None:
        spec["replicas"] = replicas
    return workload("Deployment", name, spec)


def bare_pod(name: str, entries: list[dict[str, Any]], gpus: int = 0) -> dict[str, Any]:
    t = pod_template(entries, gpus)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **t["metadata"]}, "spec": t["spec"]}


def api_node(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"p": "a100", **(labels or {})}, "resourceVersion": "7",
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"allocatable": {GPU: str(gpus), "cpu": "32"}, "capacity": {GPU: str(gpus)},
                       "conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True"}],
                       "images": [{"names": ["busybox"]}]}}


CLASS = {"metadata": {"name": "a100"}, "spec": {"nodeSelector": {"p": "a100"}}}


def bound_claim(name: str, node: str, count: int, ns: str = "team", pod_uid: str = "") -> dict[str, Any]:
    st: dict[str, Any] = {"phase": "Bound", "nodeName": node, "resourceName": GPU}
    if pod_uid:
        st["reservedFor"] = [{"name": pod_uid, "uid": pod_uid}]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
            "spec": {"className": "a100", "count": count}, "status": st}


def objects(*nodes: dict[str, Any], claims: list[dict[str, Any]] | None = None,
            budgets: list[dict[str, Any]] | None = None, pods: list[dict[str, Any]] | None = None
            ) -> ClusterObjects:
    return ClusterObjects(nodes=list(nodes), classes=[CLASS], claims=claims or [], budgets=budgets or [],
                          pods=pods or [])


def placements(outcomes: list[Any]) -> list[str]:
    """The node of each copy, or its wait reason."""
    return [o.placed.node if o.placed is not None else
            (o.explanation.decision.reason if o.explanation else "InvalidClaims") for o in outcomes]


# -- manifests ---------------------------------------------------------------------------


COUNTS = {
    "pod-is-one": (bare_pod("p", inline(1)), 1),
    "deployment-defaults-to-one": (deployment("d", inline(1)), 1),
    "deployment-replicas": (deployment("d", inline(1), replicas=3), 3),
    "statefulset-replicas": (workload("StatefulSet", "s", {"replicas": 4, "template": pod_template(inline(1))}), 4),
    "job-parallelism": (workload("Job", "j", {"parallelism": 5, "template": pod_template(inline(1))}), 5),
    "job-completions-below-parallelism": (
        workload("Job", "j", {"parallelism": 5, "completions": 2, "template": pod_template(inline(1))}), 2),
    "job-defaults-to-one": (workload("Job", "j", {"template": pod_template(inline(1))}), 1),
    "cronjob-its-job-s-parallelism": (workload("CronJob", "c", {"jobTemplate": {"spec": {
        "parallelism": 2, "template": pod_template(inline(1))}}}), 2),
    "replicaset-zero": (workload("ReplicaSet", "r", {"replicas": 0, "template": pod_template(inline(1))}), 0),
}


@pytest.mark.parametrize("doc,count", COUNTS.values(), ids=COUNTS.keys())
def test_each_workload_runs_as_many_copies_as_its_controller_would_at_once(doc: dict[str, Any], count: int) -> None:
    (w,) = read_manifests([doc], "team").workloads
    assert (w.replicas, w.namespace) == (count, "team")
    assert w.template["metadata"]["annotations"][CLAIMS_ANNOTATION] == json.dumps(inline(1))


def test_replicas_overrides_every_workload_s_own_count() -> None:
    m = read_manifests([bare_pod("p", inline(1)), deployment("d", inline(1), replicas=9)], "team", replicas=2)
    assert [w.replicas for w in m.workloads] == [2, 2]


def test_a_multi_document_file_and_a_List_are_read_in_order_and_other_kinds_are_skipped() -> None:
    text = yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "List", "items": [bare_pod("a", inline(1)), deployment("b", inline(1))]},
        None,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}},
        workload("Job", "c", {"template": pod_template(inline(1))}, namespace="other"),
    ])
    m = sim.read_files([("f.yaml", text)], "team", None)
    assert [w.ref for w in m.workloads] == ["Pod team/a", "Deployment team/b", "Job other/c"]
    assert m.skipped == ("Service web",)


def test_gpuclaimctl_objects_in_the_file_count_as_applied_in_their_namespace() -> None:
    template = {"apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClaimTemplate",
                "metadata": {"name": "pair"}, "spec": {"spec": {"className": "a100", "count": 2}}}
    cls = {"apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
           "spec": {}}
    m = read_manifests([template, cls, bare_pod("p", [{"name": "g", "template": "pair"}])], "team")
    assert m.objects["gpuclaimtemplates"][0]["metadata"] == {"name": "pair", "namespace": "team"}
    assert m.objects["gpuclasses"][0]["metadata"] == {"name": "h100"}


BAD = {
    "no-kind": ({"metadata": {"name": "x"}}, "document 1 has no kind"),
    "not-an-object": (["a"], "document 1 is not an object"),
    "no-template": (workload("Deployment", "d", {"replicas": 1}), "Deployment d has no spec.template.spec"),
    "no-name": ({"apiVersion": "v1", "kind": "Pod", "spec": {}}, "document 1 (Pod) has no metadata.name"),
    "replicas-not-a-number": (workload("Deployment", "d", {"replicas": "3", "template": pod_template(inline(1))}),
                              "Deployment d: replicas, parallelism or completions '3' is not a whole number"),
}


@pytest.mark.parametrize("doc,message", BAD.values(), ids=BAD.keys())
def test_a_document_that_is_not_a_workload_is_refused_with_what_is_wrong(doc: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(message)):
        read_manifests([doc], "team")


def test_a_file_without_any_workload_is_refused() -> None:
    with pytest.raises(ManifestError, match="f.yaml: no Pod, Deployment"):
        sim.read_files([("f.yaml", "kind: Service\nmetadata: {name: s}\n")], "team", None)


def test_copies_are_named_as_their_controllers_name_them_and_are_new_gated_pods() -> None:
    sts = workload("StatefulSet", "web", {"replicas": 2, "template": pod_template(inline(1)),
                                          "volumeClaimTemplates": [{"metadata": {"name": "data"}}]})
    m = read_manifests([bare_pod("solo", inline(1)), sts, deployment("d", inline(1), replicas=2)], "team")
    pods = [p for w in m.workloads for p in copies(w, NOW)]
    assert [p["metadata"]["name"] for p in pods] == ["solo", "web-0", "web-1", "d-sim-0", "d-sim-1"]
    assert len({p["metadata"]["uid"] for p in pods}) == 5
    assert all(p["metadata"]["namespace"] == "team" and p["metadata"]["creationTimestamp"] == "2025-06-01T12:00:00Z"
               and "nodeName" not in p["spec"] for p in pods)
    # A StatefulSet's pods mount the claims of its volume claim templates.
    assert pods[2]["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}}]


# -- the snapshot file --------------------------------------------------------------------


def test_add_node_makes_a_ready_node_with_its_gpus_and_labels() -> None:
    node = snapshotfile.parse_node("big-0=nvidia.com/gpu:8,amd.com/gpu:2,nvidia.com/gpu.product=H100,zone=b")
    assert node == {"metadata": {"name": "big-0", "labels": {
        "kubernetes.io/hostname": "big-0", "nvidia.com/gpu.product": "H100", "zone": "b"}}, "spec": {},
        "status": {"allocatable": {GPU: "8", "amd.com/gpu": "2"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.mark.parametrize("text", ["big", "big=", "big=nvidia.com/gpu", "big=zone=b", "Big=nvidia.com/gpu:1",
                                  "big=nvidia.com/gpu:x"])
def test_add_node_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        snapshotfile.parse_node(text)


def test_add_node_is_refused_in_one_line_by_the_command() -> None:
    result = CliRunner().invoke(cli.main, ["simulate", "-f", "x.yaml", "--add-node", "big=gpus"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "--add-node" in result.output


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_a_snapshot_reads_back_as_it_was_written(output: str) -> None:
    taken = Taken(snapshotfile.trim(objects(api_node("a0", 8), claims=[bound_claim("c", "a0", 2)])), NOW)
    again = snapshotfile.loads(snapshotfile.dumps(taken, output))
    assert again.taken_at == NOW and again.objects == taken.objects


@pytest.mark.parametrize("text,message", [
    ('{"kind": "List"}', "is not a gpuclaimctl snapshot"),
    ('{"kind": "GPUClaimCtlSnapshot", "version": 9, "takenAt": "2025-06-01T12:00:00Z"}', "version 9"),
    ('{"kind": "GPUClaimCtlSnapshot", "version": 1}', "has no takenAt"),
    ('{"kind": "GPUClaimCtlSnapshot", "version": 1, "takenAt": "2025-06-01T12:00:00Z", "nodes": {}}',
     "nodes must be a list"),
    ("kind: [", "neither JSON nor YAML"),
])
def test_a_file_that_is_not_a_snapshot_is_refused(text: str, message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        snapshotfile.loads(text, "f")


def test_trimming_keeps_what_placement_reads_and_only_pods_holding_gpus() -> None:
    running = {"metadata": {"name": "r", "namespace": "team", "uid": "u-r", "labels": {"x": "y"}},
               "spec": {"nodeName": "a0", "containers": [{"name": "m", "image": "i", "resources": {
                   "limits": {GPU: "3"}}}]}, "status": {"phase": "Running", "podIP": "10.0.0.1"}}
    cpu_only = {"metadata": {"name": "c", "namespace": "team", "uid": "u-c"},
                "spec": {"nodeName": "a0", "containers": [{"name": "m"}]}, "status": {"phase": "Running"}}
    raw = objects(api_node("a0", 8), api_node("a1", 8, {"zone": "b"}),
                  claims=[bound_claim("c", "a1", 2)], pods=[running, cpu_only])
    trimmed = snapshotfile.trim(raw)
    assert trimmed.nodes[0] == {"metadata": {"name": "a0", "labels": {"p": "a100"}}, "spec": {},
                                "status": {"allocatable": {GPU: "8", "cpu": "32"},
                                           "conditions": [{"type": "Ready", "status": "True"}]}}
    assert [p["metadata"]["name"] for p in trimmed.pods] == ["r"]
    pods = [bare_pod("p", inline(2))]
    m = read_manifests(pods, "team", replicas=4)
    on_raw = simulate(WhatIf(raw), copies(m.workloads[0], NOW), NOW)
    on_trimmed = simulate(WhatIf(trimmed), copies(m.workloads[0], NOW), NOW)
    # a0 has 5 free (the running pod's 3), a1 6 (the claim's 2): binpack fills a0 first.
    assert placements(on_raw) == placements(on_trimmed) == ["a0", "a0", "a1", "a1"]


def test_nodes_are_removed_then_added_and_a_name_that_does_not_fit_is_refused() -> None:
    base = objects(api_node("a0", 8), api_node("a1", 8))
    edited = snapshotfile.with_nodes(snapshotfile.without_nodes(base, ["a1"]),
                                     [snapshotfile.parse_node("a1=nvidia.com/gpu:2,p=a100")])
    assert [(n["metadata"]["name"], n["status"]["allocatable"][GPU]) for n in edited.nodes] == [
        ("a0", "8"), ("a1", "2")]
    with pytest.raises(SnapshotError, match="--without-node: no node zz"):
        snapshotfile.without_nodes(base, ["zz"])
    with pytest.raises(SnapshotError, match="--add-node: node a0 is already in the snapshot"):
        snapshotfile.with_nodes(base, [snapshotfile.parse_node("a0=nvidia.com/gpu:1")])


# -- copies in turn ------------------------------------------------------------------------


def run(world_objects: ClusterObjects, *docs: dict[str, Any], replicas: int | None = None) -> list[Any]:
    world = WhatIf(world_objects)
    m = read_manifests(docs, "team", replicas)
    return [o for w in m.workloads for o in simulate(world, copies(w, NOW), NOW)]


def test_each_copy_counts_the_ones_placed_before_it() -> None:
    outs = run(objects(api_node("a0", 8), api_node("a1", 4), claims=[bound_claim("other", "a0", 2)]),
               deployment("d", inline(3), replicas=4))
    # binpack: the fullest node that has room, each time.
    assert placements(outs) == ["a1", "a0", "a0", WaitReason.CAPACITY]
    assert "needs 3 nvidia.com/gpu on one node" in outs[3].explanation.decision.message


def test_requests_beyond_the_claims_count_against_the_node_and_a_copy_asking_for_them_waits() -> None:
    # A pod running on a0 whose container asks for 4 GPUs while its claim
    # holds 1: the scheduler counts 4, so 4 of the 8 are left.
    running = bare_pod("r", inline(1), gpus=4)
    running["metadata"].update(namespace="team", uid="r")
    running["spec"].pop("schedulingGates", None)
    running["spec"]["nodeName"] = "a0"
    running["status"] = {"phase": "Running"}
    outs = run(objects(api_node("a0", 8), claims=[bound_claim("r-g", "a0", 1, pod_uid="r")], pods=[running]),
               deployment("d", inline(2), replicas=3), deployment("x", inline(1), gpus=4))
    # A copy asking for 4 with a claim of 1 would be pinned where its claim
    # fits and refused there: it waits, as the webhook refuses it.
    assert placements(outs) == ["a0", "a0", WaitReason.CAPACITY, WaitReason.INVALID_CLAIMS]
    assert "request 4 nvidia.com/gpu but its GPU claims hold 1" in outs[3].explanation.decision.message


def test_a_named_claim_serves_one_copy_and_the_next_sees_it_in_use() -> None:
    claim = {"metadata": {"name": "shared", "namespace": "team", "uid": "u-s"},
             "spec": {"className": "a100", "count": 1}}
    outs = run(objects(api_node("a0", 8), claims=[claim]),
               deployment("d", [{"name": "g", "claim": "shared"}], replicas=2))
    assert placements(outs) == ["a0", WaitReason.CLAIM_IN_USE]
    assert "in use by pod d-sim-0" in outs[1].explanation.decision.message


def test_a_retained_claim_brings_its_copy_back_and_is_not_counted_twice() -> None:
    kept = bound_claim("notebook", "a1", 4)  # Retain, no pod: its GPUs already count on a1
    outs = run(objects(api_node("a0", 8), api_node("a1", 4), claims=[kept]),
               bare_pod("nb", [{"name": "g", "claim": "notebook"}]),
               bare_pod("other", inline(4)), bare_pod("third", inline(4)))
    assert placements(outs) == ["a1", "a0", "a0"]
    assert outs[0].placed is not None and [a.action for a in outs[0].placed.claims] == ["Keep"]


def test_copies_stop_at_the_namespace_s_budget() -> None:
    budget = {"metadata": {"name": "team", "namespace": "team"}, "spec": {"limits": [{"className": "*", "gpus": 5}]}}
    outs = run(objects(api_node("a0", 8), claims=[bound_claim("held", "a0", 1)], budgets=[budget]),
               deployment("d", inline(2), replicas=3))
    assert placements(outs) == ["a0", "a0", WaitReason.BUDGET]
    assert outs[2].explanation.decision.message == (
        "GPUBudget team/team allows 5 GPUs of all classes; 5 are bound; this set needs 2 more")


def test_an_invalid_annotation_is_InvalidClaims_and_places_nothing() -> None:
    p = bare_pod("p", inline(1))
    p["metadata"]["annotations"][CLAIMS_ANNOTATION] = "[{}]"
    outs = run(objects(api_node("a0", 8)), p, bare_pod("q", inline(8)))
    assert placements(outs) == ["InvalidClaims", "a0"]


# -- the command on a snapshot file ---------------------------------------------------------


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    taken = Taken(snapshotfile.trim(objects(api_node("a0", 8), api_node("a1", 4),
                                            claims=[bound_claim("other", "a0", 6)])), NOW)
    path = tmp_path / "snap.json"
    path.write_text(snapshotfile.dumps(taken))
    return path


def test_simulate_on_a_snapshot_answers_what_if_questions(snapshot_file: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "train.yaml"
    manifest.write_text(yaml.safe_dump(deployment("train", inline(4), replicas=2)))
    args = ["simulate", "-f", str(manifest), "--snapshot", str(snapshot_file), "-n", "team"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (f"Simulated on snapshot {snapshot_file} as of 2025-06-01T12:00:00Z (2 nodes, 1 GPUClass, "
                        "1 GPUClaim); nothing was written.")
    assert lines[2] == "Deployment team/train: 2 copies"
    assert lines[4].split()[:4] == ["1", "train-sim-0", "placed", "a1"]
    assert lines[5].split()[:4] == ["2", "train-sim-1", "Capacity", "-"]
    assert "Why train-sim-1 would wait, node by node (FREE: after the copies before it):" in lines
    assert any(line.split()[:2] == ["a0", "short"] and "short by 2 nvidia.com/gpu" in line for line in lines)
    assert "1 of 2 copies placed." in lines

    # With one more node, both fit; without a1, the first goes to the new one.
    doc = json.loads(CliRunner().invoke(cli.main, [*args, "--add-node", "big=nvidia.com/gpu:8,p=a100",
                                                   "--without-node", "a1", "-o", "json"]).output)
    assert [c["node"] for c in doc["workloads"][0]["copies"]] == ["big", "big"]
    assert doc["edits"] == ["removed node a1", "added node big (nvidia.com/gpu=8)"]
    assert doc["placed"] == doc["total"] == 2


def test_simulate_reads_the_manifest_from_stdin(snapshot_file: Path) -> None:
    result = CliRunner().invoke(cli.main, ["simulate", "-f", "-", "--snapshot", str(snapshot_file), "-o", "json",
                                           "--replicas", "3"], input=json.dumps(bare_pod("p", inline(1))))
    doc = json.loads(result.output)
    assert [(c["pod"], c["node"]) for c in doc["workloads"][0]["copies"]] == [
        ("p-sim-0", "a0"), ("p-sim-1", "a0"), ("p-sim-2", "a1")]


@pytest.mark.parametrize("args,message", [
    (["-f", "missing.yaml"], "cannot read missing.yaml: No such file or directory"),
    (["-f", "{manifest}", "--snapshot", "{manifest}"], "is not a gpuclaimctl snapshot"),
    (["-f", "{manifest}", "--snapshot", "{snapshot}", "--without-node", "zz"], "no node zz in the snapshot"),
])
def test_simulate_fails_in_one_line(args: list[str], message: str, snapshot_file: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "p.yaml"
    manifest.write_text(yaml.safe_dump(bare_pod("p", inline(1))))
    args = [a.format(manifest=manifest, snapshot=snapshot_file) for a in args]
    result = CliRunner().invoke(cli.main, ["simulate", *args])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and message in result.output, result.output


# -- against the real plane ------------------------------------------------------------------


@pytest.fixture(scope="module")
def controller(full_plane: ControlPlane, crds: list[str]) -> Iterator[RunningController]:
    rc = RunningController(str(full_plane.kubeconfig)).start()
    yield rc
    rc.stop()


@pytest.fixture
def audited(full_plane: ControlPlane, api_client: Any, namespace: str,
            tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A kubeconfig for a service account that may do anything (cluster-admin)
    and whose every request the plane audits; (kubeconfig, username)."""
    from tests.test_failover import audited_account_kubeconfig

    path, binding = audited_account_kubeconfig(full_plane, api_client, namespace, tmp_path / "sa.kubeconfig")
    yield path, f"system:serviceaccount:{namespace}:{binding}"
    kube.request(api_client, "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")


@pytest.mark.plane
def test_simulate_on_the_live_cluster_places_copies_in_turn_and_sends_no_write(
    full_plane: ControlPlane, controller: RunningController, api_client: Any, namespace: str, gpu_nodes: Any,
    audited: tuple[str, str], tmp_path: Path,
) -> None:
    from tests.test_e2e import Cluster

    cluster = Cluster(api_client, namespace)
    try:
        eight = gpu_nodes("sim-8", gpus=8, labels=cluster.label)["metadata"]["name"]
        four = gpu_nodes("sim-4", gpus=4, labels=cluster.label)["metadata"]["name"]
        cls = cluster.gpu_class("a100")
        # The running controller sees both nodes first (its class status
        # counts them): each watch is read in batches (--watch-batch-window),
        # and a pod placed before the second node shows is placed on the one
        # it has seen.
        wait_for(lambda: (kube.request_json(api_client, "GET", f"/apis/gpuclaimctl.io/v1alpha1/gpuclasses/{cls}")
                          .get("status") or {}).get("nodes") == 2, timeout=30,
                 message=f"GPUClass {cls} counting both nodes")
        cluster.pod("running", inline(2, cls))
        # binpack: the 4-GPU node is the fuller one afterwards (2 of 4).
        wait_for(lambda: cluster.running_on("running", four), timeout=30,
                 message=lambda: f"running placed on {four}: {cluster.describe_pod('running')}")
        manifest = tmp_path / "train.yaml"
        manifest.write_text(yaml.safe_dump(deployment("train", inline(3, cls), replicas=3)))

        kubeconfig, user = audited
        result = CliRunner().invoke(cli.main, ["simulate", "-f", str(manifest), "-n", namespace,
                                               "--kubeconfig", kubeconfig, "-o", "json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        # 2 free on the 4-GPU node: each copy of 3 takes the 8-GPU node until it is full.
        assert [c.get("node") or c["reason"] for c in doc["workloads"][0]["copies"]] == [
            eight, eight, "Capacity"], (f"running: {cluster.describe_pod('running')}\n"
                                        + json.dumps(doc, indent=1)[:6000])
        assert "in flight" in doc["note"]

        # What the API server received from the command: reads only.
        events = full_plane.audit_events(user)
        assert events, "the command's requests were not audited"
        assert {e["verb"] for e in events} <= {"get", "list"}, sorted({e["verb"] for e in events})
        assert not [e for e in events if e["verb"] in MUTATING]
        assert {(e.get("objectRef") or {}).get("resource") for e in events} >= {
            "nodes", "gpuclasses", "gpuclaims", "pods", "gpubudgets", "gpuclaimtemplates"}
        claims = kube.request_json(api_client, "GET", f"/apis/gpuclaimctl.io/v1alpha1/namespaces/{namespace}/"
                                   "gpuclaims")["items"]
        assert [c["metadata"]["name"] for c in claims] == ["running-g"], "no claim was created for a copy"
    finally:
        cluster.cleanup()


@pytest.mark.plane
def test_a_saved_snapshot_answers_as_the_live_cluster_did_and_takes_edits(
    full_plane: ControlPlane, controller: RunningController, api_client: Any, namespace: str, gpu_nodes: Any,
    tmp_path: Path,
) -> None:
    from tests.test_e2e import Cluster

    cluster = Cluster(api_client, namespace)
    try:
        node = gpu_nodes("snap", gpus=4, labels=cluster.label)["metadata"]["name"]
        cls = cluster.gpu_class("a100")
        cluster.pod("running", inline(1, cls))
        wait_for(lambda: cluster.running_on("running", node), timeout=30,
                 message=lambda: f"running placed: {cluster.describe_pod('running')}")
        kubeconfig = str(full_plane.kubeconfig)
        result = CliRunner().invoke(cli.main, ["snapshot", "--kubeconfig", kubeconfig])
        assert result.exit_code == 0, result.output
        saved = tmp_path / "cluster.json"
        saved.write_text(result.output)
        snap = json.loads(result.output)
        assert snap["kind"] == "GPUClaimCtlSnapshot" and node in [n["metadata"]["name"] for n in snap["nodes"]]
        assert any(p["metadata"]["name"] == "running" and p["metadata"]["namespace"] == namespace
                   for p in snap["pods"]) is False  # it requests no GPU itself: its claim holds them
        assert {c["metadata"]["name"]: c["status"]["nodeName"] for c in snap["claims"]
                if c["metadata"]["namespace"] == namespace} == {"running-g": node}

        manifest = tmp_path / "p.yaml"
        manifest.write_text(yaml.safe_dump(bare_pod("p", inline(2, cls))))
        common = ["simulate", "-f", str(manifest), "-n", namespace, "--replicas", "2", "-o", "json"]
        live = json.loads(CliRunner().invoke(cli.main, [*common, "--kubeconfig", kubeconfig]).output)
        offline = json.loads(CliRunner().invoke(cli.main, [*common, "--snapshot", str(saved)]).output)
        # Placement answers alike; whom preemption would take, only the live
        # read can tell (a snapshot keeps neither the pod "running" nor priorities).
        said = [c.pop("preemption", None) for c in offline["workloads"][0]["copies"]]
        assert said[1] is not None and said[1]["message"] == sim.PREEMPTION_UNSEEN
        said = [c.pop("preemption", None) for c in live["workloads"][0]["copies"]]
        assert said[1] is not None and said[1]["message"].startswith("none would make it fit")
        assert live["workloads"] == offline["workloads"]
        assert [c.get("node") or c["reason"] for c in live["workloads"][0]["copies"]] == [node, "Capacity"]

        grown = json.loads(CliRunner().invoke(cli.main, [
            *common, "--snapshot", str(saved), "--add-node", f"extra-{uuid.uuid4().hex[:4]}=nvidia.com/gpu:2,"
            + ",".join(f"{k}={v}" for k, v in cluster.label.items())]).output)
        assert grown["placed"] == 2
        drained = json.loads(CliRunner().invoke(cli.main, [*common, "--snapshot", str(saved),
                                                           "--without-node", node]).output)
        assert drained["placed"] == 0
        assert drained["workloads"][0]["copies"][0]["message"].endswith(f"no node offers GPUClass {cls}")
    finally:
        cluster.cleanup()


def gang_job(name: str, members: int, gpus: int) -> dict[str, Any]:
    from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION

    template = pod_template(inline(gpus))
    template["metadata"]["annotations"].update({GANG_ANNOTATION: name, GANG_SIZE_ANNOTATION: str(members)})
    return workload("Job", name, {"parallelism": members, "completions": members, "completionMode": "Indexed",
                                  "template": template})


def test_an_indexed_job_with_a_gang_is_answered_for_as_a_whole() -> None:
    """Issue 44: the four workers are placed together or none is: on three
    nodes the fourth does not fit, so the three that would are not placed
    either (GangCapacity on every copy); a fourth node places all four."""
    nodes = [api_node(f"a{i}", 8) for i in range(3)]
    outs = run(objects(*nodes), gang_job("train", 4, 8))
    assert placements(outs) == [WaitReason.GANG_CAPACITY] * 4
    assert "3 of 4 sets fit at once" in outs[0].explanation.decision.message
    outs = run(objects(*nodes, api_node("a3", 8)), gang_job("train", 4, 8))
    assert sorted(placements(outs)) == ["a0", "a1", "a2", "a3"]
    # Placed copies count for what follows, as single pods' do.
    outs = run(objects(*nodes, api_node("a3", 8)), gang_job("train", 4, 8), deployment("d", inline(1)))
    assert placements(outs)[4] == WaitReason.CAPACITY


# -- preemption (issue 46) ------------------------------------------------------------------


def placed_pod(name: str, node: str, gpus: int, priority: int = 0, age: int = 60,
               ns: str = "team") -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod gpuclaimctl placed on `node`, created `age` minutes before NOW,
    and its claim holding `gpus` there."""
    created = NOW.replace(minute=0) if age == 60 else NOW - __import__("datetime").timedelta(minutes=age)
    pod = {"metadata": {"name": name, "namespace": ns, "uid": name,
                        "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
           "spec": {"nodeName": node, "priority": priority, "containers": [{"name": "main"}]},
           "status": {"phase": "Running"}}
    return pod, bound_claim(f"{name}-g", node, gpus, ns=ns, pod_uid=name)


def full_cluster() -> ClusterObjects:
    """a0 and a1 of 8 GPUs, each full with two notebooks of priority 0
    (a1's the younger)."""
    made = [placed_pod("nb-a", "a0", 4, age=90), placed_pod("nb-b", "a0", 4, age=80),
            placed_pod("nb-c", "a1", 4, age=20), placed_pod("nb-d", "a1", 4, age=10)]
    return objects(api_node("a0", 8), api_node("a1", 8), claims=[c for _, c in made], pods=[p for p, _ in made])


URGENT = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "urgent"},
          "value": 1000}


def urgent_deployment(name: str, count: int, replicas: int, priority_class: str = "urgent") -> dict[str, Any]:
    d = deployment(name, inline(count), replicas=replicas)
    d["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return d


def test_copies_that_wait_for_room_show_the_preemption_each_would_make_one_after_the_other() -> None:
    """Two copies of priority 1000 (from their PriorityClass), 8 GPUs each,
    on two full nodes: the first preempts a1's younger notebooks; the
    second, seeing those GPUs held for the first, a0's; a third finds none.
    Nothing is evicted: the snapshot's objects are as they were."""
    world = full_cluster()
    before = json.dumps(world.__dict__, sort_keys=True, default=str)
    m = read_manifests([urgent_deployment("train", 8, 3)], "team", None)
    result = sim.run(m, Taken(world, NOW), sim.LIVE, (), priority_classes=[URGENT])
    outs: list[Any] = list(result.results[0][1])
    assert placements(outs) == [WaitReason.PREEMPTING, WaitReason.PREEMPTING, WaitReason.CAPACITY]
    plans = [o.preemption.plan for o in outs[:2]]
    assert [(p.node, [v.name for v in p.victims]) for p in plans] == [("a1", ["nb-c", "nb-d"]),
                                                                    ("a0", ["nb-a", "nb-b"])]
    assert outs[2].preemption.plan is None and outs[2].preemption.note.startswith("none would make it fit")
    assert json.dumps(world.__dict__, sort_keys=True, default=str) == before

    text = sim.render_text(result)
    assert "Preemption for the copies that would wait for room (nothing is evicted here):" in text
    rows = [line.split(maxsplit=4) for line in text.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert rows[3:] == [
        ["1", "train-sim-0", "1000", "a1", "team/nb-c (priority 0), team/nb-d (priority 0)"],
        ["2", "train-sim-1", "1000", "a0", "team/nb-a (priority 0), team/nb-b (priority 0)"],
        ["3", "train-sim-2", "1000", "-", outs[2].preemption.note]]
    assert rows[0][2] == "Preempting" and "on node a1: team/nb-c (priority 0)" in rows[0][4]
    assert "Nothing is evicted here." in text

    copies_doc = json.loads(sim.render_json(result))["workloads"][0]["copies"]
    assert copies_doc[0]["reason"] == "Preempting"
    assert [(v["pod"], v["priority"]) for v in copies_doc[0]["preemption"]["victims"]] == [
        ("team/nb-c", 0), ("team/nb-d", 0)]
    assert copies_doc[2]["preemption"]["node"] is None


def test_copies_of_the_priority_of_the_pods_there_or_lower_and_those_that_never_preempt_wait() -> None:
    m = read_manifests([deployment("plain", inline(8), replicas=1), urgent_deployment("polite", 8, 1, "polite")],
                       "team", None)
    polite = {**URGENT, "metadata": {"name": "polite"}, "preemptionPolicy": "Never"}
    outs: list[Any] = [o for _, os in sim.run(m, Taken(full_cluster(), NOW), sim.LIVE, (),
                                   priority_classes=[URGENT, polite]).results for o in os]
    assert placements(outs) == [WaitReason.CAPACITY, WaitReason.CAPACITY]
    assert outs[0].preemption.note.startswith("none would make it fit") and outs[0].preemption.priority == 0
    assert outs[1].preemption.priority == 1000 and "preemptionPolicy is Never" in outs[1].preemption.note
    off = sim.run(m, Taken(full_cluster(), NOW), sim.LIVE, (), preemption=decisionview.preemption_rules(False),
                  priority_classes=[URGENT])
    assert all(o.preemption is not None and "--no-preemption" in o.preemption.note
               for _, os in off.results for o in os)


@pytest.mark.parametrize("pod, classes, priority, policy, problem", [
    pytest.param({"spec": {"priorityClassName": "urgent"}}, [URGENT], 1000, None, "", id="its-class"),
    pytest.param({"spec": {}}, [{**URGENT, "globalDefault": True},
                                {"metadata": {"name": "low"}, "value": 5, "globalDefault": True,
                                 "preemptionPolicy": "Never"}], 5, "Never", "",
                 id="the-global-default-of-lowest-value"),
    pytest.param({"spec": {}}, [URGENT], 0, None, "", id="none-at-all"),
    pytest.param({"spec": {"priorityClassName": "urgent", "preemptionPolicy": "PreemptLowerPriority"}},
                 [{**URGENT, "preemptionPolicy": "Never"}], 1000, "PreemptLowerPriority", "",
                 id="its-own-policy-wins"),
    pytest.param({"spec": {"priority": 7}}, [URGENT], 7, None, "", id="set-already"),
    pytest.param({"spec": {"priorityClassName": "nosuch"}}, [URGENT], 0, None,
                 "PriorityClass nosuch is not found: taken as priority 0 (the API server refuses the pod)",
                 id="unknown-class"),
])
def test_a_copy_gets_the_priority_the_api_server_would_give_it(pod: dict[str, Any], classes: list[dict[str, Any]],
                                                                priority: int, policy: str | None,
                                                                problem: str) -> None:
    from gpuclaimctl.decide.whatif import admitted

    got, said = admitted(pod, classes)
    assert (got["spec"]["priority"], got["spec"].get("preemptionPolicy"), said) == (priority, policy, problem)
    assert "priority" not in pod["spec"] or pod["spec"]["priority"] == 7  # the copy is new, not edited


def test_an_unknown_priority_class_is_warned_about_once_per_workload() -> None:
    m = read_manifests([urgent_deployment("train", 1, 3, "nosuch")], "team", None)
    result = sim.run(m, Taken(objects(api_node("a0", 8)), NOW), sim.LIVE, (), priority_classes=[URGENT])
    assert result.warnings == ("Deployment team/train: PriorityClass nosuch is not found: taken as priority 0 "
                               "(the API server refuses the pod)",)


def test_on_a_snapshot_without_the_pods_its_claims_serve_preemption_is_not_simulated() -> None:
    """`gpuclaimctl snapshot` keeps only pods that request GPUs themselves,
    without their priorities: whom preemption would take cannot be told."""
    m = read_manifests([urgent_deployment("train", 8, 1)], "team", None)
    trimmed = Taken(snapshotfile.trim(full_cluster()), NOW)
    out: Any = sim.run(m, trimmed, "snapshot s.json", (), priority_classes=[URGENT]).results[0][1][0]
    assert out.explanation.decision.reason == WaitReason.CAPACITY
    assert out.preemption.note == sim.PREEMPTION_UNSEEN
    assert sim.preemption_unseen(full_cluster()) == ""
    # The same objects whole are seen as the live read sees them.
    whole = sim.run(m, Taken(full_cluster(), NOW), "snapshot s.json", (), priority_classes=[URGENT])
    assert placements(list(whole.results[0][1])) == [WaitReason.PREEMPTING]


def test_a_gang_preempts_as_a_whole_in_simulate() -> None:
    job = gang_job("train", 2, 8)
    job["spec"]["template"]["spec"]["priorityClassName"] = "urgent"
    m = read_manifests([job], "team", None)
    outs: list[Any] = list(sim.run(m, Taken(full_cluster(), NOW), sim.LIVE, (),
                                   priority_classes=[URGENT]).results[0][1])
    assert placements(outs) == [WaitReason.PREEMPTING] * 2
    plan = outs[0].preemption.plan
    assert plan is outs[1].preemption.plan and plan.node == "a0, a1"
    assert sorted(v.name for v in plan.victims) == ["nb-a", "nb-b", "nb-c", "nb-d"]


def test_the_command_shows_the_preemption_unless_told_the_controller_runs_without(tmp_path: Path) -> None:
    """A snapshot holding the placed pods whole (with their priorities), a
    pod of priority 1000: Preempting; with --no-preemption it waits."""
    saved = tmp_path / "whole.json"
    saved.write_text(snapshotfile.dumps(Taken(full_cluster(), NOW)))
    pod = bare_pod("urgent", inline(8))
    pod["spec"]["priority"] = 1000
    manifest = tmp_path / "urgent.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    args = ["simulate", "-f", str(manifest), "--snapshot", str(saved), "-n", "team", "-o", "json"]
    copy = json.loads(CliRunner().invoke(cli.main, args).output)["workloads"][0]["copies"][0]
    assert (copy["reason"], copy["preemption"]["node"]) == ("Preempting", "a1")
    copy = json.loads(CliRunner().invoke(cli.main, [*args, "--no-preemption"]).output)["workloads"][0]["copies"][0]
    assert copy["reason"] == "Capacity" and "--no-preemption" in copy["preemption"]["message"]


# -- GPUs served by DRA (docs/dra.md) --------------------------------------------------------


def _dra_taken(*claims: dict[str, Any]) -> Taken:
    """a0 with 2 GPUs of its device plugin and dra-0 with none but 4
    devices its ResourceSlice publishes (status fields the trim drops
    included); `claims`: ResourceClaims."""
    from gpuclaimctl.cmd.statusview import DraObjects
    from tests.test_dra_state import device_class, gpu, node_obj, rslice

    dra_node = node_obj("dra-0", p="a100")
    slice_ = rslice("s0", "dra-0", [gpu(f"g{i}") for i in range(4)])
    slice_["metadata"].update(uid="s0-uid", managedFields=[{"manager": "driver"}])
    return Taken(objects(api_node("a0", 2), dra_node), NOW,
                 dra=DraObjects(slices=[slice_], device_classes=[device_class()], claims=list(claims)))


def _run(taken: Taken, replicas: int, source: str = "snapshot f") -> sim.Simulation:
    manifests = read_manifests([deployment("train", inline(2), replicas=replicas)], "team", None)
    return sim.run(manifests, taken, source, (), preemption=None)


def test_simulate_places_copies_on_a_dra_node_up_to_its_devices() -> None:
    result = _run(_dra_taken(), 4)
    (_, outs), = result.results
    assert sorted(placements(list(outs)), key=str) == ["Capacity", "a0", "dra-0", "dra-0"]
    text = sim.render_text(result)
    assert "(2 nodes, 1 served by DRA, 1 GPUClass, 0 GPUClaims)" in text.splitlines()[0]
    assert json.loads(sim.render_json(result))["counts"]["draNodes"] == 1


def test_simulate_counts_the_devices_resource_claims_hold_and_a_pod_with_its_claim_once() -> None:
    from tests.test_dra_state import pod, rclaim

    direct = rclaim("direct", [("dra-0", "g0")])
    # A pod kube-scheduler placed there requesting 1, with the claim it made for it: 1, not 2.
    plain, made = pod("plain", 1, "dra-0"), rclaim("made", [("dra-0", "g1")], pod="plain")
    taken = _dra_taken(direct, made)
    taken = dataclasses.replace(taken, objects=dataclasses.replace(taken.objects, pods=[plain]))
    result = _run(taken, 3)
    (_, outs), = result.results
    assert placements(list(outs)) == ["a0", "dra-0", "Capacity"]
    text = sim.render_text(result)
    assert "short by 2 nvidia.com/gpu: the set needs 2, 0 free (served by DRA, DeviceClass gpu.example.com)" \
        in text, text


def test_a_snapshot_carries_the_dra_objects_and_answers_as_the_read_it_came_from() -> None:
    from tests.test_dra_state import rclaim

    raw = _dra_taken(rclaim("direct", [("dra-0", "g0"), ("dra-0", "g1")]), rclaim("pending", None))
    assert raw.dra is not None
    saved = Taken(snapshotfile.trim(raw.objects), NOW, dra=snapshotfile.trim_dra(raw.dra))
    assert saved.dra is not None and [c["metadata"]["name"] for c in saved.dra.claims] == ["rc-direct"]
    assert "managedFields" not in saved.dra.slices[0]["metadata"]
    again = snapshotfile.loads(snapshotfile.dumps(saved))
    assert again.dra == saved.dra and again.warnings == ()
    assert placements(list(_run(again, 3).results[0][1])) == placements(list(_run(raw, 3).results[0][1])) == [
        "a0", "dra-0", "Capacity"]


def test_a_snapshot_from_before_dra_objects_were_saved_says_dra_nodes_show_no_gpus() -> None:
    doc = snapshotfile.to_document(_dra_taken())
    del doc["dra"]
    old = snapshotfile.loads(json.dumps(doc))
    assert old.dra is None and old.warnings == (snapshotfile.DRA_UNKNOWN,)
    text = sim.render_text(_run(old, 1))
    assert f"warning: {snapshotfile.DRA_UNKNOWN}" in text
    doc["dra"] = None  # the API server did not serve resource.k8s.io/v1: nothing to say
    assert snapshotfile.loads(json.dumps(doc)).warnings == ()


@pytest.mark.parametrize("answer, warned", [
    pytest.param(None, False, id="served"),
    pytest.param(NotFound("the server could not find the requested resource"), False, id="not-served"),
    pytest.param(ApiError(403, "Forbidden", "resourceslices is forbidden"), True, id="forbidden"),
])
def test_the_live_read_takes_dra_objects_where_served_and_works_as_before_where_not(
        monkeypatch: pytest.MonkeyPatch, answer: Exception | None, warned: bool) -> None:
    served = _dra_taken()
    assert served.dra is not None
    lists = {"/api/v1/nodes": served.objects.nodes, "/apis/gpuclaimctl.io/v1alpha1/gpuclasses": [CLASS],
             "/apis/resource.k8s.io/v1/resourceslices": served.dra.slices,
             "/apis/resource.k8s.io/v1/deviceclasses": served.dra.device_classes}
    asked: list[str] = []

    def list_all(api: Any, path: str, query: Any = (), **_: Any) -> list[Any]:
        asked.append(path)
        if answer is not None and path.startswith("/apis/resource.k8s.io/"):
            raise answer
        return list(lists.get(path, []))

    monkeypatch.setattr(kube, "list_all", list_all)
    taken = snapshotfile.read_live(object(), NOW)  # type: ignore[arg-type]
    assert "/apis/resource.k8s.io/v1/resourceslices" in asked
    assert (taken.dra is not None) == (answer is None)
    assert [w for w in taken.warnings if snapshotfile.DRA_LISTS in w] == (
        [f"{snapshotfile.DRA_LISTS} could not be listed (403 Forbidden); {snapshotfile.DRA_LEFT_OUT}"]
        if warned else [])
    (_, outs), = _run(taken, 2, sim.LIVE).results
    assert placements(list(outs)) == (["a0", "dra-0"] if answer is None else ["a0", "Capacity"])
