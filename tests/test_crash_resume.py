"""A crash between any two writes of a pod sync resumes correctly.

Each test leaves the cluster exactly as a controller that died after a given
write would have (writing those objects itself, the way the controller
writes them), then starts a fresh controller and checks it finishes the job
without placing anything twice.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from gpuclaimctl.model import api
from gpuclaimctl.client import kube
from gpuclaimctl.model.podclaims import pod_claims, template_claim
from tests.helpers import wait_for
from tests.test_e2e import Cluster, node_name

pytestmark = pytest.mark.plane
Nodes = Callable[..., dict[str, Any]]


@pytest.fixture
def cluster(api_client: Any, namespace: str) -> Any:
    c = Cluster(api_client, namespace)
    yield c
    c.cleanup()


def _claims_path(c: Cluster) -> str:
    return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{c.ns}/gpuclaims"


def _create_template_claim(c: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    entry = pod_claims(pod)[0]
    created: dict[str, Any] = kube.request_json(
        c.api, "POST", _claims_path(c), body=template_claim(pod, entry))
    return created


def _bind(c: Cluster, claim: dict[str, Any], node: str, pod: dict[str, Any]) -> None:
    claim["status"] = {"phase": "Bound", "nodeName": node, "reservedFor": [
        {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]}
    kube.request(c.api, "PUT", f"{_claims_path(c)}/{claim['metadata']['name']}/status", body=claim)


@pytest.mark.parametrize("crashed_after", ["claim-created", "claim-bound"])
def test_a_fresh_controller_finishes_a_sync_that_crashed_between_writes(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], crashed_after: str,
) -> None:
    # Two nodes; the crashed controller had chosen the one bin-packing
    # would NOT choose now, so a resumed sync that placed again would show.
    chosen = node_name(gpu_nodes("chosen", gpus=8, labels=cluster.label))
    fuller = node_name(gpu_nodes("fuller", gpus=2, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    pod = cluster.pod("job", [{"name": "g", "className": cls, "count": 2}])
    claim = _create_template_claim(cluster, pod)
    if crashed_after == "claim-bound":
        _bind(cluster, claim, chosen, pod)

    rc = run_controller()
    expected = chosen if crashed_after == "claim-bound" else fuller
    wait_for(lambda: cluster.running_on("job", expected), timeout=60,
             message=f"the pod released onto {expected}")
    claims = kube.request_json(cluster.api, "GET", _claims_path(cluster))["items"]
    assert [c["metadata"]["name"] for c in claims] == ["job-g"], "no second claim was made"
    assert claims[0]["metadata"]["uid"] == claim["metadata"]["uid"]
    assert claims[0]["status"]["nodeName"] == expected
    assert rc.metric("gpuclaimctl_template_claims_created_total") == 0


def test_a_controller_restarted_before_the_informer_saw_its_release_does_not_place_again(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any],
) -> None:
    node = node_name(gpu_nodes("n", gpus=2, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    first = run_controller()
    cluster.pod("a", [{"name": "g", "className": cls, "count": 2}])
    wait_for(lambda: cluster.running_on("a", node), timeout=60, message="a Running")
    first.stop()
    second = run_controller()
    # The node is full: a second pod waits, and the first stays where it is.
    cluster.pod("b", [{"name": "g", "className": cls, "count": 1}])
    wait_for(lambda: cluster.waiting_reason("b-g") == "Capacity", timeout=30,
             message="b waiting for Capacity on the full node")
    assert cluster.running_on("a", node)
    assert second.metric("gpuclaimctl_placements_total", result="placed", reason="") == 0
