"""GPU budgets per namespace (issue 13), end to end on the real plane:
kube-apiserver with the GPUBudget CRD, kube-scheduler, kwok nodes and the
controller. The same stories against the in-memory API, and the pure
check, are in tests/test_budgets.py.

One controller serves the whole module (starting one per story would cost
more than the stories); each story has its own namespace, nodes and
classes, so stories see nothing of each other but the controller.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.model import api
from tests.controllerkit import RunningController
from tests.helpers import wait_for
from tests.test_e2e import CLAIMS, Cluster, Nodes, node_name

pytestmark = pytest.mark.plane
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


@pytest.fixture(scope="module")
def controller(full_plane: ControlPlane, crds: list[str]) -> Iterator[RunningController]:
    rc = RunningController(str(full_plane.kubeconfig)).start()
    yield rc
    rc.stop()


class BudgetCluster(Cluster):
    """Cluster's verbs, plus GPUBudgets and a second namespace's pods."""

    def budget_path(self, name: str = "", ns: str | None = None) -> str:
        base = f"{CLAIMS}/namespaces/{ns or self.ns}/{api.BUDGET_PLURAL}"
        return f"{base}/{name}" if name else base

    def budget(self, limits: dict[str, int], name: str = "team") -> None:
        kube.request(self.api, "POST", self.budget_path(), body={
            "apiVersion": api.API_VERSION, "kind": "GPUBudget", "metadata": {"name": name},
            "spec": {"limits": [{"className": c, "gpus": n} for c, n in limits.items()]}})

    def set_budget(self, limits: dict[str, int], name: str = "team") -> None:
        kube.request(self.api, "PATCH", self.budget_path(name),
                     content_type="application/merge-patch+json",
                     body={"spec": {"limits": [{"className": c, "gpus": n} for c, n in limits.items()]}})

    def get_budget(self, name: str = "team") -> dict[str, Any]:
        got: dict[str, Any] = kube.request_json(self.api, "GET", self.budget_path(name))
        return got

    def budget_condition(self, name: str = "team") -> dict[str, Any]:
        conds = (self.get_budget(name).get("status") or {}).get("conditions") or ()
        return next((c for c in conds if c["type"] == "Exceeded"), {})

    def waiting(self, claim: str) -> tuple[str, str] | None:
        """(reason, message) of the claim's Waiting condition, when True."""
        for cond in ((self.get_claim(claim) or {}).get("status") or {}).get("conditions") or ():
            if cond["type"] == api.CONDITION_WAITING and cond["status"] == "True":
                return str(cond["reason"]), str(cond["message"])
        return None

    def phase(self, claim: str) -> tuple[str, str | None]:
        """(phase, node); a claim with no phase yet is Pending, as the controller reads it."""
        st = (self.get_claim(claim) or {}).get("status") or {}
        return st.get("phase") or "Pending", st.get("nodeName")

    def pod_events(self, pod: str, reason: str) -> list[Any]:
        return [e for e in self.events(reason)
                if e.involved_object.kind == "Pod" and e.involved_object.name == pod]


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str,
            controller: RunningController) -> Iterator[BudgetCluster]:
    c = BudgetCluster(api_client, namespace)
    yield c
    c.cleanup()


@pytest.fixture
def other(api_client: client.ApiClient, cluster: BudgetCluster) -> Iterator[BudgetCluster]:
    """A second namespace, with no budget, sharing the first one's classes."""
    core = client.CoreV1Api(api_client)
    name = f"{cluster.ns[:50]}-other"
    core.create_namespace({"metadata": {"name": name}})
    try:
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    c = BudgetCluster(api_client, name)
    c.tag, c.label = cluster.tag, cluster.label
    yield c
    core.delete_namespace(name, propagation_policy="Background")


def one(cls: str, count: int) -> list[dict[str, Any]]:
    return [{"name": "g", "className": cls, "count": count}]


def test_a_namespace_at_its_limit_waits_with_budget_while_another_namespace_takes_the_free_node(
    cluster: BudgetCluster, other: BudgetCluster, gpu_nodes: Nodes,
) -> None:
    node = node_name(gpu_nodes("n", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 2})
    cluster.pod("first", one(cls, 2))
    wait_for(lambda: cluster.running_on("first", node), timeout=30,
             message=lambda: f"first Running: {cluster.describe_pod('first')}")

    cluster.pod("second", one(cls, 1))
    wait_for(lambda: cluster.waiting("second-g"), timeout=30, message="second-g Waiting")
    assert cluster.waiting("second-g") == (
        "Budget", f"GPUBudget {cluster.ns}/team allows 2 {cls} GPUs; 2 are bound; this set needs 1 more")
    assert cluster.read_pod("second").spec.scheduling_gates, "the pod stays gated"
    assert cluster.phase("second-g") == ("Pending", None)
    warned = wait_for(lambda: cluster.pod_events("second", "Budget"), timeout=10,
                      message="a Budget event on pod second")
    assert warned[0].type == "Warning" and f"GPUBudget {cluster.ns}/team" in warned[0].message

    # The node has 6 GPUs free: a namespace without a budget is placed there.
    other.pod("elsewhere", one(cls, 4))
    wait_for(lambda: other.running_on("elsewhere", node), timeout=30,
             message=lambda: f"the other namespace's pod Running on {node}: {other.describe_pod('elsewhere')}")
    assert cluster.read_pod("second").spec.scheduling_gates, "still over its own namespace's budget"


def test_raising_the_budget_releases_the_waiting_pod(cluster: BudgetCluster, gpu_nodes: Nodes) -> None:
    node = node_name(gpu_nodes("n", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 2})
    cluster.pod("first", one(cls, 2))
    wait_for(lambda: cluster.running_on("first", node), timeout=30, message="first Running")
    cluster.pod("second", one(cls, 2))
    wait_for(lambda: (cluster.waiting("second-g") or ("",))[0] == "Budget", timeout=30,
             message="second-g Waiting with Budget")

    cluster.set_budget({cls: 4})
    wait_for(lambda: cluster.running_on("second", node), timeout=30,
             message=lambda: f"second released once the budget allows 4: {cluster.describe_pod('second')}")
    assert cluster.waiting("second-g") is None
    wait_for(lambda: (cluster.get_budget().get("status") or {}).get("used") == [{"className": cls, "gpus": 4}],
             timeout=10, message=lambda: f"budget status used 4: {cluster.get_budget().get('status')}")


def test_a_set_of_four_and_four_against_six_left_places_neither_claim(
    cluster: BudgetCluster, gpu_nodes: Nodes,
) -> None:
    node = node_name(gpu_nodes("n", gpus=16, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 8})
    cluster.pod("small", one(cls, 2))
    wait_for(lambda: cluster.running_on("small", node), timeout=30, message="small Running")

    cluster.pod("pair", [{"name": "a", "className": cls, "count": 4},
                         {"name": "b", "className": cls, "count": 4}])
    wait_for(lambda: cluster.waiting("pair-a") and cluster.waiting("pair-b"), timeout=30,
             message="both claims of the set Waiting")
    message = f"GPUBudget {cluster.ns}/team allows 8 {cls} GPUs; 2 are bound; this set needs 8 more"
    assert cluster.waiting("pair-a") == cluster.waiting("pair-b") == ("Budget", message)
    # The node has room for both (14 free): the budget alone holds the set, whole.
    assert cluster.phase("pair-a") == cluster.phase("pair-b") == ("Pending", None)
    assert not (cluster.get_claim("pair-a") or {}).get("status", {}).get("reservedFor")
    assert cluster.read_pod("pair").spec.scheduling_gates

    # Admitted means placed: with room for the whole set, both claims go at once.
    cluster.set_budget({cls: 10})
    wait_for(lambda: cluster.running_on("pair", node), timeout=30, message="pair released")
    assert cluster.phase("pair-a") == cluster.phase("pair-b") == ("Bound", node)


def test_a_star_limit_counts_two_classes_together(cluster: BudgetCluster, gpu_nodes: Nodes) -> None:
    a_label, b_label = {**cluster.label, "pool": "a"}, {**cluster.label, "pool": "b"}
    node_a = node_name(gpu_nodes("a", gpus=8, labels=a_label))
    node_b = node_name(gpu_nodes("b", gpus=8, labels=b_label))
    cls_a = cluster.gpu_class("a100", nodeSelector=a_label)
    cls_b = cluster.gpu_class("h100", nodeSelector=b_label)
    cluster.budget({"*": 4})
    cluster.pod("on-a", one(cls_a, 3))
    wait_for(lambda: cluster.running_on("on-a", node_a), timeout=30, message="on-a Running")

    cluster.pod("on-b", one(cls_b, 2))
    wait_for(lambda: cluster.waiting("on-b-g"), timeout=30, message="on-b-g Waiting")
    assert cluster.waiting("on-b-g") == (
        "Budget", f"GPUBudget {cluster.ns}/team allows 4 GPUs of all classes; 3 are bound; "
                  f"this set needs 2 more")
    # One more GPU of the other class is within the limit.
    cluster.pod("small-b", one(cls_b, 1))
    wait_for(lambda: cluster.running_on("small-b", node_b), timeout=30,
             message=lambda: f"small-b Running: {cluster.describe_pod('small-b')}")
    assert cluster.read_pod("on-b").spec.scheduling_gates
    wait_for(lambda: (cluster.get_budget().get("status") or {}).get("used") == [{"className": "*", "gpus": 4}],
             timeout=10, message=lambda: f"budget status used 4: {cluster.get_budget().get('status')}")


def test_lowering_a_budget_below_use_leaves_running_pods_alone_and_blocks_the_next(
    cluster: BudgetCluster, gpu_nodes: Nodes,
) -> None:
    node = node_name(gpu_nodes("n", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 4})
    cluster.pod("running", one(cls, 3))
    wait_for(lambda: cluster.running_on("running", node), timeout=30, message="running Running")
    uid = cluster.read_pod("running").metadata.uid
    wait_for(lambda: cluster.budget_condition().get("status") == "False", timeout=10,
             message=lambda: f"Exceeded False while within the limit: {cluster.get_budget().get('status')}")

    cluster.set_budget({cls: 2})
    wait_for(lambda: cluster.budget_condition().get("status") == "True", timeout=30,
             message=lambda: f"the budget's Exceeded condition True: {cluster.get_budget().get('status')}")
    status = cluster.get_budget()["status"]
    assert status["used"] == [{"className": cls, "gpus": 3}]
    assert cluster.budget_condition()["reason"] == "LimitBelowUse"
    assert f"{cls}: 3 held of 2" in cluster.budget_condition()["message"]

    cluster.pod("next", one(cls, 1))
    wait_for(lambda: cluster.waiting("next-g"), timeout=30, message="next-g Waiting")
    assert cluster.waiting("next-g") == (
        "Budget", f"GPUBudget {cluster.ns}/team allows 2 {cls} GPUs; 3 are bound; this set needs 1 more")
    # Nothing was evicted: the same pod runs, its claim still held.
    pod = cluster.read_pod("running")
    assert pod is not None and pod.metadata.uid == uid and cluster.running_on("running", node)
    assert pod.metadata.deletion_timestamp is None
    assert cluster.phase("running-g") == ("Bound", node)


def test_a_retain_claim_with_no_pod_keeps_counting_until_it_is_deleted(
    cluster: BudgetCluster, gpu_nodes: Nodes,
) -> None:
    node = node_name(gpu_nodes("n", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 4})
    cluster.claim("kept", cls, 3, reclaimPolicy="Retain")
    cluster.pod("notebook", [{"name": "g", "claim": "kept"}])
    wait_for(lambda: cluster.running_on("notebook", node), timeout=30, message="notebook Running")
    cluster.core.delete_namespaced_pod("notebook", cluster.ns, grace_period_seconds=0)
    wait_for(lambda: cluster.read_pod("notebook") is None
             and not (cluster.get_claim("kept") or {}).get("status", {}).get("reservedFor"),
             timeout=30, message="the notebook gone and its reservation dropped")
    assert cluster.phase("kept") == ("Bound", node)

    cluster.pod("other", one(cls, 2))
    wait_for(lambda: cluster.waiting("other-g"), timeout=30, message="other-g Waiting")
    assert cluster.waiting("other-g") == (
        "Budget", f"GPUBudget {cluster.ns}/team allows 4 {cls} GPUs; 3 are bound; this set needs 2 more")

    kube.request(cluster.api, "DELETE", f"{CLAIMS}/namespaces/{cluster.ns}/gpuclaims/kept")
    wait_for(lambda: cluster.running_on("other", node), timeout=30,
             message=lambda: f"other released once the kept claim is deleted: {cluster.describe_pod('other')}")
    assert cluster.get_claim("kept") is None


def _table(api_client: client.ApiClient, path: str) -> dict[str, Any]:
    """A list as `kubectl get` asks for it: a meta.k8s.io Table."""
    method, url, headers, _body, _post = api_client.param_serialize(
        "GET", path, header_params={"Accept": TABLE}, auth_settings=["BearerToken"])
    resp = api_client.rest_client.pool_manager.request(method, url, headers=headers)
    assert resp.status == 200, resp.data
    table: dict[str, Any] = orjson.loads(resp.data)
    return table


def test_kubectl_get_gpubudgets_and_the_metric_show_limits_and_use(
    cluster: BudgetCluster, gpu_nodes: Nodes, controller: RunningController,
) -> None:
    node = node_name(gpu_nodes("n", gpus=8, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    cluster.budget({cls: 4, "*": 6})
    cluster.pod("user", one(cls, 3))
    wait_for(lambda: cluster.running_on("user", node), timeout=30, message="user Running")

    def row() -> dict[str, Any]:
        table = _table(cluster.api, cluster.budget_path())
        assert table["kind"] == "Table"
        names = [c["name"] for c in table["columnDefinitions"]]
        assert names[:4] == ["Name", "Limits", "Used", "Age"], names
        (only,) = table["rows"]
        return dict(zip(names, only["cells"]))

    wait_for(lambda: row()["Used"] == f"{cls}=3,*=3", timeout=10,
             message=lambda: f"the Used column {cls}=3,*=3: {row()}")
    assert row()["Name"] == "team" and row()["Limits"] == f"{cls}=4,*=6"

    def gauge(cls_or_all: str, kind: str) -> float:
        return controller.metric("gpuclaimctl_budget_gpus", namespace=cluster.ns, budget="team",
                                 **{"class": cls_or_all}, kind=kind)

    assert (gauge(cls, "limit"), gauge(cls, "used"), gauge("*", "limit"), gauge("*", "used")) == (4, 3, 6, 3)


@pytest.mark.parametrize("limit, says", [
    ({"className": "a100", "gpus": -1}, "should be greater than or equal to 0"),
    ({"className": "A100 GPUs", "gpus": 2}, 'className must be a GPUClass name or "*"'),
    ({"className": "", "gpus": 2}, "should be at least 1 chars long"),
], ids=["negative-gpus", "bad-class-name", "empty-class-name"])
def test_the_crd_refuses_a_malformed_limit_with_a_clear_message(
    api_client: client.ApiClient, crds: list[str], namespace: str, limit: dict[str, Any], says: str,
) -> None:
    path = f"{CLAIMS}/namespaces/{namespace}/{api.BUDGET_PLURAL}"
    with pytest.raises(kube.ApiError) as refused:
        kube.request(api_client, "POST", path, body={
            "apiVersion": api.API_VERSION, "kind": "GPUBudget", "metadata": {"name": f"bad-{uuid.uuid4().hex[:4]}"},
            "spec": {"limits": [limit]}})
    assert refused.value.status == 422
    assert "spec.limits[0]" in str(refused.value) and says in str(refused.value), str(refused.value)
    assert kube.request_json(api_client, "GET", path)["items"] == [], json.dumps(limit)
