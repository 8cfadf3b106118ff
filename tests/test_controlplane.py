"""The local control plane is a real cluster: each test asserts what one does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import ControlPlane
from tests.helpers import wait_for

pytestmark = pytest.mark.plane
GATE = "gpuclaimctl.io/claims"
REPO = Path(__file__).resolve().parent.parent


def gated_pod(name: str, *, affinity_terms: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": GATE}],
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m"}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if affinity_terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": affinity_terms}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_gated_pod_is_bound_to_the_pinned_node_once_released(
    full_plane: ControlPlane, api_client: client.ApiClient, namespace: str,
    gpu_nodes: Callable[..., dict[str, Any]],
) -> None:
    core = client.CoreV1Api(api_client)
    decoy = gpu_nodes("decoy", gpus=8)["metadata"]["name"]
    target = gpu_nodes("target", gpus=2)["metadata"]["name"]
    core.create_namespaced_pod(namespace, gated_pod("p", affinity_terms=[
        {"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]}]))

    # The scheduler sees the gated pod and leaves it alone.
    wait_for(lambda: any(c.reason == "SchedulingGated"
                         for c in core.read_namespaced_pod("p", namespace).status.conditions or []),
             message="the scheduler to report the pod SchedulingGated")
    assert core.read_namespaced_pod("p", namespace).spec.node_name is None

    pod = api_client.sanitize_for_serialization(core.read_namespaced_pod("p", namespace))
    pod["spec"]["schedulingGates"] = []
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        term.setdefault("matchFields", []).append(
            {"key": "metadata.name", "operator": "In", "values": [target]})
    core.replace_namespaced_pod("p", namespace, pod)  # carries the read resourceVersion

    def running_on_target() -> bool:
        p = core.read_namespaced_pod("p", namespace)
        return p.spec.node_name == target and p.status.phase == "Running"

    wait_for(running_on_target, timeout=60,
             message=lambda: f"pod p Running on {target} (not {decoy})")


def test_adding_a_node_selector_term_to_a_gated_pod_is_refused(
    api_client: client.ApiClient, namespace: str,
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, gated_pod("p", affinity_terms=[
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]))
    pod = api_client.sanitize_for_serialization(core.read_namespaced_pod("p", namespace))
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
    with pytest.raises(client.ApiException) as refused:
        core.replace_namespaced_pod("p", namespace, pod)
    assert refused.value.status == 422
    assert "nodeSelectorTerms" in refused.value.body


def test_deleting_an_owner_garbage_collects_its_dependent(
    full_plane: ControlPlane, api_client: client.ApiClient, namespace: str,
) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "dependent",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                             "uid": owner.metadata.uid}]}})
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", namespace)
            return False
        except client.ApiException as e:
            return e.status == 404

    wait_for(dependent_gone, timeout=60,
             message="kube-controller-manager to garbage-collect the dependent")


def test_a_watch_from_before_an_etcd_compaction_ends_with_410_gone(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str,
) -> None:
    # PodTemplates are watched straight from etcd (no watch cache), so the
    # compaction is what ends the watch, as it is for any resource once the
    # watch cache's window has moved past the revision.
    core = client.CoreV1Api(api_client)
    template = {"metadata": {"name": "t0"}, "template": {"spec": {
        "containers": [{"name": "c", "image": "busybox"}]}}}
    old_rv = core.create_namespaced_pod_template(namespace, template).metadata.resource_version
    for i in range(1, 5):
        core.create_namespaced_pod_template(namespace, {**template, "metadata": {"name": f"t{i}"}})
    path = f"/api/v1/namespaces/{namespace}/podtemplates"

    def watch_events() -> list[dict[str, Any]]:
        data = kube.request(api_client, "GET", path, timeout=10, query=[
            ("watch", "true"), ("resourceVersion", old_rv), ("timeoutSeconds", "1")])
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    before = watch_events()
    assert [e["type"] for e in before] == ["ADDED"] * 4, "before compaction the history replays"

    control_plane.compact_etcd()
    after = watch_events()
    assert len(after) == 1 and after[0]["type"] == "ERROR", after
    assert after[0]["object"]["code"] == 410
    assert after[0]["object"]["reason"] in ("Expired", "Gone")


ORPHAN_SCRIPT = textwrap.dedent("""
    import json, signal, sys, time
    from gpuclaimctl.controlplane import ControlPlane
    # Ctrl-C as a terminal gives it: a suite started in the background
    # (`cmd &`) passes SIGINT down ignored, and Python then keeps ignoring it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    plane = ControlPlane()
    plane.start()
    print(json.dumps(plane.running()), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM],
                         ids=lambda s: signal.Signals(s).name)
def test_no_component_outlives_the_launcher(how: signal.Signals, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE,
                            env=env, cwd=tmp_path, text=True)
    assert proc.stdout is not None
    pids: dict[str, int] = json.loads(proc.stdout.readline())
    assert set(pids) == {"etcd", "kube-apiserver"}
    proc.send_signal(how)
    # Stopping the API server and etcd gracefully takes seconds, more on a
    # busy machine: this waits for the exit, it does not time it.
    proc.wait(60)

    def all_gone() -> bool:
        return not any(_alive(pid) for pid in pids.values())

    wait_for(all_gone, timeout=20, message=lambda: f"no component left of {pids}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
