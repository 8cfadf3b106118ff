"""A user's stories, end to end on the real plane: kube-apiserver, etcd,
kube-scheduler, kube-controller-manager, kwok nodes and the controller."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

import pytest
from kubernetes import client

from gpuclaimctl.model import api
from gpuclaimctl.client import kube
from tests.helpers import gpu_node_manifest, node_is_ready, wait_for

pytestmark = pytest.mark.plane
CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"


class Cluster:
    """Small verbs over the API for the stories below."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api = api_client
        self.ns = namespace
        self.core = client.CoreV1Api(api_client)
        # Classes are cluster-scoped: each test selects only its own nodes.
        self.tag = uuid.uuid4().hex[:6]
        self.label = {"e2e.gpuclaimctl.io/run": self.tag}
        self.classes: list[str] = []

    def gpu_class(self, name: str, **spec: Any) -> str:
        full = f"{name}-{self.tag}"
        kube.request(self.api, "POST", f"{CLAIMS}/gpuclasses", body={
            "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": full},
            "spec": {"nodeSelector": dict(self.label), **spec}})
        self.classes.append(full)
        return full

    def claim(self, name: str, class_name: str, count: int, **spec: Any) -> None:
        kube.request(self.api, "POST", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims", body={
            "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
            "spec": {"className": class_name, "count": count, **spec}})

    def template(self, name: str, class_name: str, count: int) -> None:
        kube.request(self.api, "POST", f"{CLAIMS}/namespaces/{self.ns}/gpuclaimtemplates", body={
            "apiVersion": api.API_VERSION, "kind": api.TEMPLATE_KIND, "metadata": {"name": name},
            "spec": {"spec": {"className": class_name, "count": count}}})

    def get_claim(self, name: str) -> dict[str, Any] | None:
        try:
            return kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims/{name}")
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise

    def pod_manifest(self, name: str, entries: list[dict[str, Any]] | str, *,
                     cpu: str = "100m", node_selector: dict[str, str] | None = None,
                     gpus: int = 0) -> dict[str, Any]:
        annotation = entries if isinstance(entries, str) else json.dumps(entries)
        manifest: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name},
                         "annotations": {api.CLAIMS_ANNOTATION: annotation}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": cpu}}}]},
        }
        if gpus:  # the container asks the device plugin too (limits: requests default to them)
            manifest["spec"]["containers"][0]["resources"]["limits"] = {api.DEFAULT_RESOURCE_NAME: str(gpus)}
        if node_selector:
            manifest["spec"]["nodeSelector"] = node_selector
        return manifest

    def pod(self, name: str, entries: list[dict[str, Any]] | str, **kw: Any) -> dict[str, Any]:
        created: dict[str, Any] = self.api.sanitize_for_serialization(
            self.core.create_namespaced_pod(self.ns, self.pod_manifest(name, entries, **kw)))
        return created

    def replica_set(self, name: str, entries: list[dict[str, Any]], **kw: Any) -> None:
        """One replica of a gated pod: a refused pod comes back as its next pod."""
        template = self.pod_manifest(name, entries, **kw)
        template["metadata"].pop("name")
        kube.request(self.api, "POST", f"/apis/apps/v1/namespaces/{self.ns}/replicasets", body={
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template}})

    def read_pod(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_pod(name, self.ns)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def running_on(self, name: str, node: str) -> bool:
        p = self.read_pod(name)
        return p is not None and p.spec.node_name == node and p.status.phase == "Running"

    def describe_pod(self, name: str) -> str:
        """A pod's state and events in one line, for a failed wait."""
        p = self.read_pod(name)
        if p is None:
            return f"pod {name} not found"
        gates = [g.name for g in p.spec.scheduling_gates or ()]
        conds = [(c.type, c.status, c.reason) for c in p.status.conditions or ()]
        events = [(e.reason, e.message) for e in self.core.list_namespaced_event(self.ns).items
                  if e.involved_object.name == name]
        claims = {n: (self.get_claim(n) or {}).get("status") for n in
                  [f"{name}-{x}" for x in ("g", "gpu", "gpus")] if self.get_claim(n)}
        return (f"gates={gates} node={p.spec.node_name!r} phase={p.status.phase} conditions={conds} "
                f"events={events} claims={claims}")

    def events(self, reason: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(self.ns).items if e.reason == reason]

    def waiting_reason(self, claim: str) -> str | None:
        c = self.get_claim(claim)
        for cond in ((c or {}).get("status") or {}).get("conditions") or ():
            if cond["type"] == api.CONDITION_WAITING and cond["status"] == "True":
                return str(cond["reason"])
        return None

    def cleanup(self) -> None:
        for name in self.classes:
            try:
                kube.request(self.api, "DELETE", f"{CLAIMS}/gpuclasses/{name}")
            except kube.ApiError:
                pass


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str) -> Any:
    c = Cluster(api_client, namespace)
    yield c
    c.cleanup()


Nodes = Callable[..., dict[str, Any]]


def node_name(node: dict[str, Any]) -> str:
    return str(node["metadata"]["name"])


def test_two_inline_claims_are_placed_together_on_the_one_node_with_room_for_both(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    small = node_name(gpu_nodes("small", gpus=2, labels=cluster.label))
    big = node_name(gpu_nodes("big", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller()
    cluster.pod("train", [{"name": "a", "className": cls, "count": 2},
                          {"name": "b", "className": cls, "count": 2}])

    wait_for(lambda: cluster.running_on("train", big), timeout=60,
             message=f"pod train Running on {big}, the only node with room for 4 GPUs")
    for entry in ("a", "b"):
        claim = cluster.get_claim(f"train-{entry}")
        assert claim is not None
        assert claim["status"]["phase"] == "Bound" and claim["status"]["nodeName"] == big
        assert claim["status"]["reservedFor"][0]["name"] == "train"
        assert claim["metadata"]["ownerReferences"][0]["name"] == "train"
        assert api.CLAIM_FINALIZER in claim["metadata"]["finalizers"]
    # Events and the cache-fed metrics may trail what the API server shows by a moment.
    placed = wait_for(lambda: cluster.events("Placed"), timeout=10, message="a Placed event")
    assert len(placed) == 1 and big in placed[0].message and small not in placed[0].message
    wait_for(lambda: rc.metric("gpuclaimctl_gpus_bound", **{"class": cls}) == 4, timeout=10,
             message=lambda: f"gpuclaimctl_gpus_bound 4, is {rc.metric('gpuclaimctl_gpus_bound', **{'class': cls})}")
    assert rc.metric("gpuclaimctl_placements_total", result="placed", reason="") == 1
    assert rc.metric("gpuclaimctl_template_claims_created_total") == 2
    assert rc.metric("gpuclaimctl_gpus_bound", **{"class": cls}) == 4
    assert rc.metric("gpuclaimctl_gpus_allocatable", **{"class": cls}) == 6
    assert rc.metric("gpuclaimctl_claims", **{"class": cls, "phase": "Bound"}) == 2
    assert rc.metric("gpuclaimctl_pod_release_seconds_count", namespace=cluster.ns) == 1
    assert rc.metric("gpuclaimctl_sync_duration_seconds_count", kind="pod", result="ok") >= 1
    assert rc.metric("workqueue_adds_total", name="gpuclaimctl") >= 1


def test_a_class_status_shows_its_nodes_gpus_and_what_is_bound(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    gpu_nodes("eight", gpus=8, labels=cluster.label)
    gpu_nodes("four", gpus=4, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    run_controller()

    def status() -> dict[str, Any]:
        got = kube.request_json(cluster.api, "GET", f"{CLAIMS}/gpuclasses/{cls}")
        return {k: v for k, v in (got.get("status") or {}).items() if k in ("nodes", "allocatable", "bound")}

    wait_for(lambda: status() == {"nodes": 2, "allocatable": 12, "bound": 0}, timeout=30,
             message=f"GPUClass {cls} status: 2 nodes, 12 GPUs, none bound")
    cluster.pod("trainer", [{"name": "g", "className": cls, "count": 3}])
    wait_for(lambda: status() == {"nodes": 2, "allocatable": 12, "bound": 3}, timeout=30,
             message=f"GPUClass {cls} status: 3 GPUs bound after a placement")


def test_template_claim_lives_with_its_pod_and_a_recreated_pod_gets_a_fresh_one(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("n", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.template("pair", cls, 2)
    run_controller()
    entries = [{"name": "gpus", "template": "pair"}]
    first = cluster.pod("web-0", entries)
    wait_for(lambda: cluster.running_on("web-0", node), timeout=60, message="web-0 Running")
    claim = cluster.get_claim("web-0-gpus")
    assert claim is not None and claim["status"]["phase"] == "Bound"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]
    old_uid = claim["metadata"]["uid"]

    # While the pod runs, the claim stays.
    cluster.core.patch_namespaced_pod("web-0", cluster.ns, {"metadata": {"labels": {"x": "y"}}})
    assert cluster.get_claim("web-0-gpus") is not None

    # The pod is done: its claim goes.
    cluster.core.patch_namespaced_pod_status("web-0", cluster.ns, {"status": {"phase": "Succeeded"}})
    wait_for(lambda: cluster.get_claim("web-0-gpus") is None, timeout=30,
             message="the finished pod's template claim to be deleted")

    # A StatefulSet recreates the pod under the same name: a fresh claim.
    cluster.core.delete_namespaced_pod("web-0", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("web-0") is None, timeout=30, message="web-0 deleted")
    second = cluster.pod("web-0", entries)
    wait_for(lambda: cluster.running_on("web-0", node), timeout=60,
             message=lambda: f"new web-0 Running; last seen: {cluster.describe_pod('web-0')}")
    fresh = cluster.get_claim("web-0-gpus")
    assert fresh is not None and fresh["metadata"]["uid"] != old_uid
    assert fresh["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]


def test_a_template_the_api_server_refuses_to_make_a_claim_from_is_reported_on_the_pod(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    # The CRD checks label values, not keys: the claim made from this
    # template is refused (422). Retrying cannot help; the user must know.
    gpu_nodes("n", gpus=8, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    kube.request(cluster.api, "POST", f"{CLAIMS}/namespaces/{cluster.ns}/gpuclaimtemplates", body={
        "apiVersion": api.API_VERSION, "kind": api.TEMPLATE_KIND, "metadata": {"name": "bad-labels"},
        "spec": {"metadata": {"labels": {"not a key!": "x"}}, "spec": {"className": cls, "count": 1}}})
    run_controller()
    cluster.pod("trainer", [{"name": "gpu", "template": "bad-labels"}])

    def refusal_reported() -> bool:
        return any("refused to create" in (e.message or "") and "bad-labels" in e.message
                   for e in cluster.events("ClaimMissing"))

    wait_for(refusal_reported, timeout=30, message="a ClaimMissing event saying the claim was refused")
    assert cluster.read_pod("trainer").spec.scheduling_gates, "the pod stays gated"


def test_a_recreated_pod_waits_for_its_predecessors_claim_instead_of_name_taken(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("n", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller()
    entries = [{"name": "gpu", "className": cls, "count": 1}]
    cluster.pod("db-0", entries)
    wait_for(lambda: cluster.running_on("db-0", node), timeout=60, message="db-0 Running")
    rc.stop()  # the old claim outlives its pod while nobody cleans up
    cluster.core.delete_namespaced_pod("db-0", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("db-0") is None, timeout=30, message="db-0 deleted")
    cluster.pod("db-0", entries)
    run_controller()
    wait_for(lambda: cluster.running_on("db-0", node), timeout=60, message="the new db-0 Running")
    assert cluster.events("NameTaken") == []


def test_a_retained_claim_brings_the_next_pod_back_to_the_same_node(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    a = node_name(gpu_nodes("a", gpus=8, labels=cluster.label))
    b = node_name(gpu_nodes("b", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.claim("notebook-gpu", cls, 1, reclaimPolicy="Retain")
    run_controller()
    cluster.pod("nb", [{"name": "gpu", "claim": "notebook-gpu"}])
    wait_for(lambda: (cluster.get_claim("notebook-gpu") or {}).get("status", {}).get("nodeName"),
             timeout=60, message="the retained claim to be bound")
    home = cluster.get_claim("notebook-gpu")["status"]["nodeName"]  # type: ignore[index]
    other = b if home == a else a
    # Make the other node the one bin-packing would now prefer.
    cluster.pod("filler", [{"name": "g", "className": cls, "count": 4}],
                node_selector={"kubernetes.io/hostname": other})
    wait_for(lambda: (cluster.get_claim("filler-g") or {}).get("status", {}).get("nodeName") == other,
             timeout=60, message=f"filler placed on {other}")
    cluster.core.delete_namespaced_pod("nb", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("nb") is None
             and not cluster.get_claim("notebook-gpu")["status"].get("reservedFor"),  # type: ignore[index]
             timeout=30, message="the notebook pod gone and its reservation dropped")
    kept = cluster.get_claim("notebook-gpu")
    assert kept is not None and kept["status"]["phase"] == "Bound" and kept["status"]["nodeName"] == home

    cluster.pod("nb2", [{"name": "gpu", "claim": "notebook-gpu"}])
    wait_for(lambda: cluster.running_on("nb2", home), timeout=60,
             message=f"the next notebook pod back on {home}")


def test_a_pod_larger_than_any_node_is_unsatisfiable_until_a_large_enough_node_is_added(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], full_plane: Any,
) -> None:
    """Issue 45, item 1: 4 GPUs where the largest node has 2 is not a wait
    for Capacity (which frees nothing for it): its own reason, event,
    status column and why verdict; a node large enough turns it back into
    an ordinary placement."""
    from click.testing import CliRunner

    from gpuclaimctl.cmd import cli

    small = node_name(gpu_nodes("small", gpus=2, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller()
    cluster.pod("big", [{"name": "g", "className": cls, "count": 4}])
    wait_for(lambda: cluster.waiting_reason("big-g") == "Unsatisfiable", timeout=30,
             message=lambda: f"claim big-g Waiting with reason Unsatisfiable: {cluster.describe_pod('big')}")
    assert cluster.read_pod("big").spec.scheduling_gates  # still gated
    events = wait_for(lambda: cluster.events("Unsatisfiable"), timeout=10, message="an Unsatisfiable event")
    assert f"(the largest: 2 nvidia.com/gpu on {small})" in events[0].message, events[0].message
    assert not cluster.events("Capacity")
    assert rc.metric("gpuclaimctl_placements_total", result="waiting", reason="Unsatisfiable") >= 1
    kubeconfig = str(full_plane.kubeconfig)  # a person's (the controller's may not read events)
    status = CliRunner().invoke(cli.main, ["status", "--kubeconfig", kubeconfig])
    assert status.exit_code == 0 and "Unsatisfiable" in status.output, status.output
    why = CliRunner().invoke(cli.main, ["why", f"{cluster.ns}/big", "--kubeconfig", kubeconfig, "-o", "json"])
    doc = json.loads(why.output)
    assert doc["decision"]["reason"] == "Unsatisfiable"
    assert {n["node"]: n["verdict"] for n in doc["nodes"]} == {small: "too small"}

    new = node_name(gpu_nodes("large", gpus=8, labels=cluster.label))
    wait_for(lambda: cluster.running_on("big", new), timeout=60,
             message=f"pod big released onto the new node {new}")
    assert cluster.waiting_reason("big-g") is None
    assert len(cluster.events("Unsatisfiable")) == 1, "one event per reason change, not per retry"


def test_a_users_claim_stops_waiting_when_the_pod_that_waited_for_it_is_deleted(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    gpu_nodes("small", gpus=2, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    cluster.claim("big", cls, 4)
    run_controller()
    cluster.pod("wants-big", [{"name": "g", "claim": "big"}])
    wait_for(lambda: cluster.waiting_reason("big") == "Unsatisfiable", timeout=30,
             message="claim big Waiting with reason Unsatisfiable")
    cluster.core.delete_namespaced_pod("wants-big", cluster.ns, grace_period_seconds=0)

    def ended() -> bool:
        conds = ((cluster.get_claim("big") or {}).get("status") or {}).get("conditions") or ()
        return not any(c["type"] == api.CONDITION_WAITING for c in conds)

    wait_for(ended, timeout=30, message="claim big's Waiting condition gone with its pod")


def test_a_pod_waits_with_class_not_found_until_the_class_exists(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("n", gpus=4, labels=cluster.label))
    run_controller()
    cls = f"later-{cluster.tag}"
    cluster.pod("p", [{"name": "g", "className": cls, "count": 1}])
    wait_for(lambda: cluster.waiting_reason("p-g") == "ClassNotFound", timeout=30,
             message="claim p-g Waiting with ClassNotFound")
    wait_for(lambda: len(cluster.events("ClassNotFound")) == 1, timeout=10, message="one ClassNotFound event")
    assert cluster.gpu_class("later") == cls
    wait_for(lambda: cluster.running_on("p", node), timeout=60, message="p released once the class exists")


def test_a_claim_name_taken_by_someone_else_is_reported(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    gpu_nodes("n", gpus=4, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    cluster.claim("p-g", cls, 1)  # a person's claim with the name the template claim needs
    run_controller()
    cluster.pod("p", [{"name": "g", "className": cls, "count": 1}])
    wait_for(lambda: cluster.events("NameTaken"), timeout=30, message="a NameTaken Warning event")
    ev = cluster.events("NameTaken")[0]
    assert ev.type == "Warning" and "p-g" in ev.message
    assert cluster.read_pod("p").spec.scheduling_gates
    theirs = cluster.get_claim("p-g")
    assert theirs is not None and not theirs.get("status", {}).get("reservedFor")


@pytest.mark.parametrize("annotation, says", [
    ("not json", "not valid JSON"),
    ('[{"name": "x", "claim": "a", "template": "b"}]', "sets claim and template"),
    ('[{"name": "x", "className": "c", "count": 0}]', "count"),
    ('[{"name": "x", "claim": "a"}, {"name": "x", "claim": "b"}]', "x"),
], ids=["not-json", "claim-and-template", "count-zero", "duplicate-names"])
def test_a_malformed_annotation_keeps_the_pod_gated_with_a_warning(
    cluster: Cluster, run_controller: Callable[..., Any], annotation: str, says: str,
) -> None:
    rc = run_controller()
    cluster.pod("bad", annotation)
    wait_for(lambda: cluster.events("InvalidClaims"), timeout=30, message="an InvalidClaims event")
    ev = cluster.events("InvalidClaims")[0]
    assert ev.type == "Warning" and says in ev.message, ev.message
    assert cluster.read_pod("bad").spec.scheduling_gates
    # Cluster-wide: an earlier test's pod in a terminating namespace may count too.
    assert rc.metric("gpuclaimctl_placements_total", result="waiting", reason="InvalidClaims") >= 1
    # The controller goes on working for everyone else.
    assert rc.controller.queue.len() >= 0 and not rc.controller.queue.shutting_down()


def test_a_pod_whose_containers_ask_for_more_gpus_than_its_claims_hold_waits_invalid(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    # Without the webhook (which refuses this pod at create): placing the
    # 1-GPU claim on the 2-GPU node would pin there a pod that asks for 3.
    gpu_nodes("small", gpus=2, labels=cluster.label)
    big = node_name(gpu_nodes("big", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller()
    cluster.pod("greedy", [{"name": "g", "className": cls, "count": 1}], gpus=3)
    cluster.pod("fair", [{"name": "g", "className": cls, "count": 3}], gpus=3)

    wait_for(lambda: cluster.running_on("fair", big), timeout=60,
             message=lambda: f"pod fair Running on {big}: {cluster.describe_pod('fair')}")
    ev = wait_for(lambda: [e for e in cluster.events("InvalidClaims") if e.involved_object.name == "greedy"],
                  timeout=30, message=lambda: f"an InvalidClaims event for greedy: {cluster.describe_pod('greedy')}")
    assert ev[0].type == "Warning"
    assert f"request 3 {api.DEFAULT_RESOURCE_NAME} but its GPU claims hold 1" in ev[0].message, ev[0].message
    wait_for(lambda: cluster.waiting_reason("greedy-g") == "InvalidClaims", timeout=10,
             message=lambda: f"greedy-g Waiting InvalidClaims: {cluster.get_claim('greedy-g')}")
    claim = cluster.get_claim("greedy-g")
    assert claim is not None and (claim.get("status") or {}).get("phase") != "Bound"
    assert cluster.read_pod("greedy").spec.scheduling_gates
    assert rc.metric("gpuclaimctl_placements_total", result="waiting", reason="InvalidClaims") >= 1


def test_an_inline_entry_edited_while_its_pod_waits_has_its_claim_made_again(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("small", gpus=2, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    run_controller()
    cluster.pod("edited", [{"name": "g", "className": cls, "count": 4}])
    wait_for(lambda: cluster.waiting_reason("edited-g") == "Unsatisfiable", timeout=30,
             message=lambda: f"edited-g waiting for Unsatisfiable: {cluster.get_claim('edited-g')}")
    old_uid = (cluster.get_claim("edited-g") or {})["metadata"]["uid"]
    # A claim's spec cannot change: the claim made from the old entry goes,
    # and one is made as the annotation says now.
    cluster.core.patch_namespaced_pod("edited", cluster.ns, {"metadata": {"annotations": {
        api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": cls, "count": 1}])}}})
    wait_for(lambda: cluster.running_on("edited", node), timeout=60,
             message=lambda: f"edited Running on {node}: {cluster.describe_pod('edited')}")
    claim = cluster.get_claim("edited-g")
    assert claim is not None and claim["metadata"]["uid"] != old_uid
    assert claim["spec"]["count"] == 1 and claim["status"]["phase"] == "Bound"


def test_a_node_the_scheduler_refuses_is_rejected_and_the_recreated_pod_lands_elsewhere(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    # Bin-packing prefers the 2-GPU node, but it has too little CPU for the pod.
    cramped = node_name(gpu_nodes("cramped", gpus=2, cpu="1", labels=cluster.label))
    roomy = node_name(gpu_nodes("roomy", gpus=8, cpu="32", labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller(reject_for=300.0)
    cluster.replica_set("worker", [{"name": "g", "className": cls, "count": 2}], cpu="2")

    def worker_running_on_roomy() -> bool:
        pods = cluster.core.list_namespaced_pod(cluster.ns, label_selector="app=worker").items
        return any(p.spec.node_name == roomy and p.status.phase == "Running" for p in pods)

    wait_for(worker_running_on_roomy, timeout=90,
             message=f"a worker pod Running on {roomy} after {cramped} refused the first")
    rejected = wait_for(lambda: cluster.events("NodeRejected"), timeout=10, message="a NodeRejected event")
    assert cramped in rejected[0].message
    assert rc.metric("gpuclaimctl_refused_pods_total") == 1


def test_a_recreated_pod_waiting_on_a_rejection_is_tried_again_when_it_runs_out(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    # The only node of the class refuses the pod (too little CPU); its
    # ReplicaSet's next pod waits NodeRejected. Its inline claim is new and
    # carries no rejectedNodes: the rejection lives in the controller's
    # memory, and so must the timer that ends it. Resync is out of reach.
    cramped = node_name(gpu_nodes("only", gpus=2, cpu="1", labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller(reject_for=4.0, resync_period=600.0)
    cluster.replica_set("retry", [{"name": "g", "className": cls, "count": 2}], cpu="2")
    wait_for(lambda: rc.metric("gpuclaimctl_refused_pods_total") >= 1, timeout=60,
             message=f"{cramped} refusing the first pod")
    wait_for(lambda: any(e.reason == "NodeRejected" for e in cluster.events("NodeRejected")), timeout=30,
             message="the next pod waiting NodeRejected")
    # Placed on the node again once the rejection ran out (and refused again).
    wait_for(lambda: rc.metric("gpuclaimctl_refused_pods_total") >= 2, timeout=30,
             message=f"the next pod placed on {cramped} again after the 4 s rejection")


def test_a_stale_reservation_is_removed_after_its_pod_went_while_the_controller_was_down(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("n", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.claim("shared", cls, 2)
    first = run_controller()
    cluster.pod("user", [{"name": "g", "claim": "shared"}])
    wait_for(lambda: cluster.running_on("user", node), timeout=60, message="user Running")
    first.stop()

    cluster.core.delete_namespaced_pod("user", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("user") is None, timeout=30, message="pod user deleted")
    held = cluster.get_claim("shared")
    assert held is not None and held["status"]["reservedFor"][0]["name"] == "user"

    second = run_controller()
    wait_for(lambda: not (cluster.get_claim("shared") or {}).get("status", {}).get("reservedFor"),
             timeout=30, message="the stale reservation to be removed")
    freed = cluster.get_claim("shared")
    assert freed is not None and freed["status"]["phase"] == "Pending"
    assert "nodeName" not in freed["status"]
    # Cluster-wide: claims of earlier tests' namespaces may be cleaned up too.
    assert second.metric("gpuclaimctl_stale_reservations_removed_total", cause="deleted") >= 1


def test_a_claim_whose_node_vanished_is_lost_and_placed_again_for_its_next_pod(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    doomed = node_name(gpu_nodes("doomed", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.claim("keep", cls, 2, reclaimPolicy="Retain")
    rc = run_controller(node_lost_grace=2.0)
    cluster.pod("first", [{"name": "g", "claim": "keep"}])
    wait_for(lambda: cluster.running_on("first", doomed), timeout=60, message="first Running")
    cluster.core.delete_namespaced_pod("first", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("first") is None, timeout=30, message="first deleted")

    cluster.core.delete_node(doomed)
    wait_for(lambda: (cluster.get_claim("keep") or {}).get("status", {}).get("phase") == "Lost",
             timeout=30, message="the claim Lost once its node is gone past the grace period")
    # The event is written just after the status: wait for it too.
    wait_for(lambda: cluster.events("Lost"), timeout=10, message="a Lost event on the claim")
    assert rc.metric("gpuclaimctl_claims_lost_total") >= 1

    spare = node_name(gpu_nodes("spare", gpus=4, labels=cluster.label))
    cluster.pod("second", [{"name": "g", "claim": "keep"}])
    wait_for(lambda: cluster.running_on("second", spare), timeout=60,
             message=f"the next pod placed again, on {spare}")
    moved = cluster.get_claim("keep")
    assert moved is not None and moved["status"]["phase"] == "Bound"
    assert moved["status"]["nodeName"] == spare


def lose_node_and_bring_it_back(cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
                                back_with: int) -> tuple[str, str, Any, float]:
    """Pod `stays` Running on a 4-GPU node with its claim `stays-g` of 2; the
    Node object goes until the claim is Lost, then comes back under its name
    with `back_with` GPUs (a kubelet that registers again), the pod, bound by
    name, still there. Returns the node, the class, the controller and its
    count of claim syncs from before the node came back."""
    node = node_name(gpu_nodes("flaky", gpus=4, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    rc = run_controller(node_lost_grace=2.0)
    cluster.pod("stays", [{"name": "g", "className": cls, "count": 2}])
    wait_for(lambda: cluster.running_on("stays", node), timeout=60, message="stays Running")
    cluster.core.delete_node(node)
    wait_for(lambda: (cluster.get_claim("stays-g") or {}).get("status", {}).get("phase") == "Lost",
             timeout=30, message="the claim Lost once its node is gone past the grace period")
    syncs = rc.metric("gpuclaimctl_sync_duration_seconds_count", kind="claim", result="ok")
    cluster.core.create_node(gpu_node_manifest(node, back_with, kwok=True, labels=cluster.label))
    wait_for(lambda: node_is_ready(cluster.core, node), timeout=30, message=f"{node} Ready again")
    return node, cls, rc, syncs


def test_a_lost_claim_is_bound_again_when_its_node_comes_back_with_its_pod_still_on_it(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    flaky, cls, rc, _ = lose_node_and_bring_it_back(cluster, gpu_nodes, run_controller, back_with=4)
    wait_for(lambda: (cluster.get_claim("stays-g") or {}).get("status", {}).get("phase") == "Bound",
             timeout=30, message=lambda: f"the claim Bound again: {cluster.get_claim('stays-g')}")
    claim = cluster.get_claim("stays-g")
    assert claim is not None and claim["status"]["nodeName"] == flaky
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["stays"]
    found = wait_for(lambda: cluster.events("Found"), timeout=10, message="a Found event on the claim")
    assert flaky in found[0].message and "stays" in found[0].message
    # What it holds counted on the node all along: a pod asking for the
    # rest fits, one more GPU does not.
    cluster.pod("rest", [{"name": "g", "className": cls, "count": 2}])
    cluster.pod("more", [{"name": "g", "className": cls, "count": 1}])
    wait_for(lambda: cluster.running_on("rest", flaky) or cluster.running_on("more", flaky), timeout=60,
             message="one of rest and more placed on the node")
    wait_for(lambda: {cluster.waiting_reason("rest-g"), cluster.waiting_reason("more-g")} & {"Capacity"},
             timeout=30, message="the other waits for Capacity")
    assert rc.metric("gpuclaimctl_gpus_bound", **{"class": cls}) <= 4


def test_a_lost_claim_stays_lost_when_its_node_comes_back_with_fewer_gpus_than_it_holds(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    _node, _cls, rc, syncs = lose_node_and_bring_it_back(cluster, gpu_nodes, run_controller, back_with=1)
    # Its claim syncs run on the node's add and its Ready: Bound there would
    # be 2 GPUs on 1.
    wait_for(lambda: rc.metric("gpuclaimctl_sync_duration_seconds_count", kind="claim", result="ok") > syncs,
             timeout=30, message="a claim sync after the node came back")
    time.sleep(2)
    claim = cluster.get_claim("stays-g")
    assert claim is not None and claim["status"]["phase"] == "Lost", claim["status"]
    assert not cluster.events("Found")


def test_a_pod_whose_volume_reaches_one_node_is_placed_there_and_waits_when_none_can_take_it(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    """Issue 10, item 13: a PersistentVolume with node affinity (a local disk
    with a dataset) limits the candidates to the nodes it reaches; binpack
    alone would pick the fuller node."""
    full = node_name(gpu_nodes("fuller", gpus=4, labels=cluster.label))
    disk = node_name(gpu_nodes("disk", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    pv = f"data-{cluster.tag}"
    cluster.core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": "/tmp/data"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [disk]}]}]}}}})
    try:
        cluster.core.create_namespaced_persistent_volume_claim(cluster.ns, {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: cluster.core.read_namespaced_persistent_volume_claim("data", cluster.ns)
                 .status.phase == "Bound", timeout=60, message="kube-controller-manager to bind the PVC")
        run_controller()
        cluster.claim("warm", cls, 3)  # makes `fuller` the binpack choice
        cluster.pod("other", [{"name": "g", "claim": "warm"}])
        wait_for(lambda: cluster.running_on("other", full) or cluster.running_on("other", disk), timeout=60,
                 message="the first pod Running")
        manifest = cluster.pod_manifest("reader", [{"name": "g", "className": cls, "count": 1}])
        manifest["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
        cluster.core.create_namespaced_pod(cluster.ns, manifest)
        wait_for(lambda: cluster.running_on("reader", disk), timeout=60,
                 message=lambda: f"reader Running on {disk}, the node its volume reaches: "
                                 + cluster.describe_pod("reader"))

        manifest = cluster.pod_manifest("greedy", [{"name": "g", "className": cls, "count": 8}])
        manifest["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
        cluster.core.create_namespaced_pod(cluster.ns, manifest)
        wait_for(lambda: cluster.waiting_reason("greedy-g") is not None, timeout=30,
                 message="greedy to wait")
        claim = cluster.get_claim("greedy-g") or {}
        cond = next(c for c in claim["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
        assert cond["reason"] == "Capacity", cond
        assert cluster.read_pod("greedy").spec.scheduling_gates
    finally:
        cluster.core.delete_persistent_volume(pv)
