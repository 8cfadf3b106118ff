"""Gangs declared by PodGroups, on a real plane that serves them (DESIGN.md
§4c): kube-apiserver with the GenericWorkload feature gate and
scheduling.k8s.io/v1beta1 on, kube-scheduler with its gang plugin on
(GenericWorkload), kwok GPU nodes, and the controller as deploy/'s service
account. Its own plane, started once for this module: the session's serves
no PodGroups (the last test here runs on it, to show nothing needs them).

A pod whose spec.schedulingGroup.podGroupName names a PodGroup with
`schedulingPolicy.gang.minCount: N` is in a gang of N: its members are
released all at once, and kube-scheduler, whose own gang plugin holds a
PodGroup's pods until minCount of them can be scheduled, then schedules
them (issue 44: releasing all N pinned members together lets it); where
the sets do not all fit, none is released.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, utils

from gpuclaimctl.client import kube
from gpuclaimctl.client.discovery import serves
from gpuclaimctl.controlplane import APISERVER, CONTROLLER_MANAGER, KWOK, SCHEDULER, ControlPlane
from gpuclaimctl.controlplane.identity import ControllerIdentity, controller_identity
from gpuclaimctl.model import api
from informers import POD_GROUPS
from tests.controllerkit import RunningController, run_as
from tests.helpers import gpu_node_manifest, node_is_ready, wait_for
from tests.test_e2e import Cluster

pytestmark = pytest.mark.plane

REPO = Path(__file__).resolve().parent.parent
GENERIC_WORKLOAD = "--feature-gates=GenericWorkload=true"
PODGROUP_FLAGS = {
    APISERVER: [GENERIC_WORKLOAD, "--runtime-config=scheduling.k8s.io/v1beta1=true"],
    SCHEDULER: [GENERIC_WORKLOAD],
}
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1"
Obj = dict[str, Any]


class Plane:
    def __init__(self, plane: ControlPlane, api_client: client.ApiClient, identity: ControllerIdentity) -> None:
        self.plane = plane
        self.api = api_client
        self.identity = identity


def install_crds(api_client: client.ApiClient) -> None:
    """deploy/crds, established (as conftest's `crds` does on the session plane)."""
    ext = client.ApiextensionsV1Api(api_client)
    names: list[str] = []
    for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        utils.create_from_yaml(api_client, str(path))
        with open(path) as f:
            names += [d["metadata"]["name"] for d in yaml.safe_load_all(f)
                      if d and d.get("kind") == "CustomResourceDefinition"]

    def established() -> bool:
        return all(any(c.type == "Established" and c.status == "True"
                       for c in ext.read_custom_resource_definition(n).status.conditions or ())
                   for n in names)

    wait_for(established, timeout=30, message="the CRDs to be established")


@pytest.fixture(scope="module")
def podgroup_plane() -> Iterator[Plane]:
    plane = ControlPlane(components=(SCHEDULER, CONTROLLER_MANAGER, KWOK), extra_flags=PODGROUP_FLAGS,
                         log=lambda m: print(f"[podgroup plane] {m}"))
    try:
        plane.start()
    except Exception as e:  # the message carries the component's log tail
        pytest.fail(f"the plane with PodGroups did not start: {e}", pytrace=False)
    try:
        api_client = config.new_client_from_config(config_file=str(plane.kubeconfig))
        install_crds(api_client)
        identity = controller_identity(plane, plane.workdir / "controller.kubeconfig",
                                       namespace="gpuclaimctl-tests")
        run_as(str(plane.kubeconfig), identity)
        yield Plane(plane, api_client, identity)
    finally:
        plane.stop()


@pytest.fixture
def story(podgroup_plane: Plane) -> Iterator[Callable[[int], tuple[Cluster, str, RunningController]]]:
    """story(nodes): a namespace, `nodes` kwok nodes of 8 GPUs, a class
    selecting only them, and the controller running."""
    p = podgroup_plane
    core = client.CoreV1Api(p.api)
    made_nodes: list[str] = []
    running: list[RunningController] = []
    clusters: list[Cluster] = []

    def start(nodes: int) -> tuple[Cluster, str, RunningController]:
        ns = f"pg-{uuid.uuid4().hex[:8]}"
        core.create_namespace({"metadata": {"name": ns}})
        try:  # kube-controller-manager makes it too, when it gets there first
            core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
        except client.ApiException as e:
            if e.status != 409:
                raise
        c = Cluster(p.api, ns)
        clusters.append(c)
        for i in range(nodes):
            name = f"gpu-{c.tag}-{i}"
            core.create_node(gpu_node_manifest(name, 8, labels=dict(c.label)))
            made_nodes.append(name)
        for name in made_nodes[-nodes:]:
            wait_for(lambda: node_is_ready(core, name), timeout=60, message=f"node {name} Ready")
        cls = c.gpu_class("a100")
        rc = RunningController(str(p.plane.kubeconfig)).start()
        running.append(rc)
        return c, cls, rc

    yield start
    for rc in running:
        rc.stop()
    for c in clusters:
        c.cleanup()
    for n in made_nodes:
        core.delete_node(n)


def podgroup(c: Cluster, name: str, min_count: int) -> None:
    kube.request(c.api, "POST", f"{PODGROUPS}/namespaces/{c.ns}/podgroups", body={
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})


def member(c: Cluster, name: str, cls: str, group: str) -> None:
    """A gated pod with an inline claim of 8 GPUs (its container asks for
    them too), naming PodGroup `group`."""
    manifest = c.pod_manifest(name, [{"name": "gpu", "className": cls, "count": 8}], gpus=8)
    manifest["spec"]["schedulingGroup"] = {"podGroupName": group}
    c.core.create_namespaced_pod(c.ns, manifest)


def gated(c: Cluster, name: str) -> bool:
    pod = c.read_pod(name)
    return any(g.name == api.SCHEDULING_GATE for g in pod.spec.scheduling_gates or ())


def told(c: Cluster, name: str, reason: str) -> list[str]:
    return [e.message for e in c.events(reason) if e.involved_object.name == name]


def test_a_podgroup_gang_of_three_is_released_together_and_kube_scheduler_runs_it(
        story: Callable[[int], tuple[Cluster, str, RunningController]], podgroup_plane: Plane) -> None:
    c, cls, rc = story(3)
    names = [f"train-{i}" for i in range(3)]
    for n in names:
        member(c, n, cls, "train")
    # The PodGroup is not there yet: the members wait for it, holding nothing.
    wait_for(lambda: all(told(c, n, "GangIncomplete") for n in names), timeout=30,
             message="the members to be told their PodGroup is not known")
    assert all("PodGroup train" in told(c, n, "GangIncomplete")[-1] for n in names), \
        [told(c, n, "GangIncomplete") for n in names]
    assert all(gated(c, n) for n in names)

    podgroup(c, "train", 3)  # its event wakes the members
    try:
        wait_for(lambda: all(c.read_pod(n).status.phase == "Running" for n in names), timeout=90,
                 message="the gang's three pods to run")
    except AssertionError:
        raise AssertionError("\n".join(c.describe_pod(n) for n in names)) from None
    nodes = {c.read_pod(n).spec.node_name for n in names}
    assert len(nodes) == 3
    for n in names:
        claim = c.get_claim(f"{n}-gpu") or {}
        assert claim["status"]["phase"] == api.Phase.BOUND
        assert claim["status"]["nodeName"] == c.read_pod(n).spec.node_name
    assert rc.controller.podgroups_synced()

    # As deploy/'s service account: PodGroups watched, never refused, never written.
    seen = [e for e in podgroup_plane.plane.audit_events(podgroup_plane.identity.username)
            if (e.get("objectRef") or {}).get("resource") == "podgroups"]
    assert {e["verb"] for e in seen} & {"watch", "list"}, seen
    assert not [e for e in seen if (e.get("responseStatus") or {}).get("code") == 403], seen
    assert {e["verb"] for e in seen} <= {"watch", "list"}, seen


def test_on_two_nodes_a_podgroup_gang_of_three_waits_whole_and_none_is_released(
        story: Callable[[int], tuple[Cluster, str, RunningController]]) -> None:
    c, cls, _rc = story(2)
    podgroup(c, "train", 3)
    names = [f"train-{i}" for i in range(3)]
    for n in names:
        member(c, n, cls, "train")
    try:
        wait_for(lambda: all(c.waiting_reason(f"{n}-gpu") == "GangCapacity" for n in names), timeout=60,
                 message="every member's claim to wait GangCapacity")
    except AssertionError:
        raise AssertionError("\n".join(c.describe_pod(n) for n in names)) from None
    assert any("gang train (PodGroup): 2 of 3 sets fit at once" in m
               for n in names for m in told(c, n, "GangCapacity"))
    time.sleep(3.0)  # a member released late would show by now
    assert all(gated(c, n) for n in names)
    for n in names:
        assert ((c.get_claim(f"{n}-gpu") or {}).get("status") or {}).get("phase") != api.Phase.BOUND


def test_a_controller_on_a_plane_without_podgroups_serves_everything_else(
        api_client: client.ApiClient, namespace: str, gpu_nodes: Callable[..., Obj],
        run_controller: Callable[..., RunningController]) -> None:
    """The session's plane serves no PodGroups: the discovery check says so
    (a 404, not an error), the controller makes no informer for them, and
    places pods as ever."""
    assert serves(api_client, POD_GROUPS) is False
    c = Cluster(api_client, namespace)
    try:
        node = gpu_nodes("pg-absent", 8, labels=dict(c.label))
        cls = c.gpu_class("a100")
        rc = run_controller()
        c.pod("solo", [{"name": "gpu", "className": cls, "count": 8}])
        wait_for(lambda: c.running_on("solo", node["metadata"]["name"]), timeout=60,
                 message="the pod to run on its node")
        assert POD_GROUPS not in rc.factory.informers()
        assert not rc.controller.podgroups_synced()
    finally:
        c.cleanup()
