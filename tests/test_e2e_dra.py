"""GPUs served by DRA, end to end on the real plane (issue 47; docs/dra.md).

Kubernetes 1.37's kube-scheduler serves an ordinary `nvidia.com/gpu`
request on a node with none of it allocatable from the devices of the
node's ResourceSlices, through the DeviceClass whose
`extendedResourceName` is `nvidia.com/gpu`, and records them in a
ResourceClaim it makes for the pod. Here the test publishes the slices for
kwok nodes (driver gpu.example.com, a pool per node, devices with a
productName), and the controller, as deploy/'s service account, must
count those devices as it counts a device plugin's: place on them, never
beyond them, and say so when a set waits.

One controller and one DeviceClass serve the module (on the session's
plane, which serves resource.k8s.io/v1); each story has its own namespace,
nodes and GPUClass. The last story starts a plane of its own that does not
serve resource.k8s.io/v1 at all.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.client.discovery import served
from gpuclaimctl.cmd import snapshotfile, statusview, why
from gpuclaimctl.controller import DRA_OPTIONAL, DRA_RESOURCES
from gpuclaimctl.controlplane import APISERVER, CONTROLLER_MANAGER, KWOK, ControlPlane
from gpuclaimctl.controlplane.identity import controller_identity
from gpuclaimctl.decide.dra import SliceIndex, allocatable_with_dra, cluster_offers, map_resources
from gpuclaimctl.decide.drausage import device_owners, dra_usage, used_with_dra
from gpuclaimctl.model import api
from gpuclaimctl.model.dra import ClaimInfo, DeviceClassInfo, SliceInfo
from gpuclaimctl.model.snapshot import NodeInfo, claim_holds_gpus
from tests.controllerkit import RunningController, run_as
from tests.helpers import gpu_node_manifest, node_is_ready, wait_for
from tests.test_e2e import CLAIMS, Cluster
from tests.test_podgroup_gangs import install_crds

pytestmark = pytest.mark.plane

GPU = api.DEFAULT_RESOURCE_NAME
DRIVER = "gpu.example.com"
DRA = "/apis/resource.k8s.io/v1"
Obj = dict[str, Any]


# -- the module's DeviceClass and controller ------------------------------------------------


class Dra:
    def __init__(self, api_client: client.ApiClient, device_class: str, rc: RunningController) -> None:
        self.api = api_client
        self.device_class = device_class
        self.rc = rc
        self.core = client.CoreV1Api(api_client)
        self.nodes: list[str] = []
        self.slices: list[str] = []

    def publish(self, node: str, gpus: int, *, name: str = "", gen: int = 1) -> str:
        """A ResourceSlice for `node`'s pool (the node's name) of `gpus` devices."""
        name = name or f"{node}-gpus"
        kube.request(self.api, "POST", f"{DRA}/resourceslices", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": gen, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"productName": {"string": "A100"}}}
                                 for i in range(gpus)]}})
        self.slices.append(name)
        return name

    def nodes_of(self, c: Cluster, *specs: tuple[str, int, bool]) -> list[str]:
        """Kwok nodes (name, GPUs, by DRA?) labelled for `c`'s classes: a
        DRA node has no nvidia.com/gpu allocatable and a slice of that many
        devices; the others have them allocatable. Returned once Ready and
        counted by the controller (DRA offers only the resources of
        GPUClasses: make the class first)."""
        names = []
        for base, gpus, by_dra in specs:
            name = f"{base}-{c.tag}"
            self.core.create_node(gpu_node_manifest(name, 0 if by_dra else gpus,
                                                    labels={**c.label, "kubernetes.io/hostname": name}))
            self.nodes.append(name)
            if by_dra:
                self.publish(name, gpus)
            names.append(name)
        for name, (_, gpus, _) in zip(names, specs):
            wait_for(lambda: node_is_ready(self.core, name), timeout=30, message=f"node {name} Ready")
            self.sees(name, gpus)
        return names

    def sees(self, node: str, gpus: int) -> None:
        """Wait until the controller counts `gpus` on `node` (what the
        stories then do must not race its watch)."""
        def seen() -> bool:
            info = self.rc.controller.view.cluster().nodes.get(node)
            return info is not None and info.ready and info.allocatable.get(GPU, 0) == gpus

        wait_for(seen, timeout=30, message=f"the controller to count {gpus} GPUs on {node}")

    def settles(self, node: str, free: int) -> None:
        """Wait until the controller's watches have shown it every bind it
        made (nothing in flight) and it counts `free` GPUs free on `node`.
        Until a bound claim's reservation is seen, the pod it reserves
        counts by its request too (erring towards GPUs left idle), and a
        Waiting message written meanwhile keeps its figures up to 30 s:
        a story's next step starts once the count has settled."""
        view = self.rc.controller.view

        def settled() -> bool:
            with view.lock:
                return not len(view.inflight) and view.free_on([node]).get(node, {}).get(GPU, 0) == free

        wait_for(settled, timeout=30, message=f"the controller to count {free} GPUs free on {node}")

    def cleanup(self) -> None:
        for name in self.slices:
            try:
                kube.request(self.api, "DELETE", f"{DRA}/resourceslices/{name}")
            except kube.ApiError:
                pass
        for name in self.nodes:
            try:
                self.core.delete_node(name)
            except client.ApiException:
                pass
        self.nodes.clear()
        self.slices.clear()


@pytest.fixture(scope="module")
def dra(full_plane: ControlPlane, api_client: client.ApiClient, crds: list[str]) -> Iterator[Dra]:
    if full_plane.minor != "1.37":
        pytest.skip("kube-scheduler serves extended resources from DRA by default from Kubernetes 1.37")
    name = f"gpu-example-{uuid.uuid4().hex[:6]}"
    kube.request(api_client, "POST", f"{DRA}/deviceclasses", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
                 "extendedResourceName": GPU}})
    rc = RunningController(str(full_plane.kubeconfig)).start()
    try:
        wait_for(rc.controller.dra_synced, timeout=30, message="the controller to read DRA's objects")
        yield Dra(api_client, name, rc)
    finally:
        rc.stop()
        kube.request(api_client, "DELETE", f"{DRA}/deviceclasses/{name}")


@pytest.fixture
def story(dra: Dra, api_client: client.ApiClient, namespace: str) -> Iterator[tuple[Dra, Cluster]]:
    c = Cluster(api_client, namespace)
    try:
        yield dra, c
    finally:
        c.cleanup()
        dra.cleanup()


# -- reading what happened ---------------------------------------------------------------------


def resource_claims(c: Cluster) -> list[Obj]:
    return kube.list_all(c.api, f"{DRA}/namespaces/{c.ns}/resourceclaims")


def extended_claim(c: Cluster, pod: str) -> Obj | None:
    """The ResourceClaim kube-scheduler made for the pod's nvidia.com/gpu, once allocated."""
    p = c.read_pod(pod)
    status = c.api.sanitize_for_serialization(p.status) if p is not None else {}
    name = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if not name:
        return None
    claim: Obj = kube.request_json(c.api, "GET", f"{DRA}/namespaces/{c.ns}/resourceclaims/{name}")
    return claim if (claim.get("status") or {}).get("allocation") else None


def devices_of(claim: Obj) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]


def told(c: Cluster, pod: str, reason: str) -> list[str]:
    return [e.message for e in c.events(reason) if e.involved_object.name == pod]


def waiting_message(c: Cluster, claim: str) -> str:
    got = c.get_claim(claim) or {}
    return next((str(cond.get("message")) for cond in (got.get("status") or {}).get("conditions") or ()
                 if cond["type"] == api.CONDITION_WAITING and cond["status"] == "True"), "")


def usage_now(c: Cluster, nodes: list[str], cls: str) -> list[str]:
    """Where, among `nodes`, what is counted exceeds what the node offers
    (read from the API as it is now, counted by the pure rules), and where
    GPUClaims alone exceed it; [] when nowhere. Devices kube-scheduler gave
    to two claims at once are reported too."""
    selector = ",".join(f"{k}={v}" for k, v in c.label.items())
    node_objs = [n for n in kube.list_all(c.api, "/api/v1/nodes", [("labelSelector", selector)])
                 if n["metadata"]["name"] in nodes]
    infos = [NodeInfo.from_api(n) for n in node_objs]
    slices = [SliceInfo.from_api(s) for s in kube.list_all(c.api, f"{DRA}/resourceslices")]
    classes = [DeviceClassInfo.from_api(d) for d in kube.list_all(c.api, f"{DRA}/deviceclasses")]
    offers = cluster_offers(infos, [GPU], SliceIndex.build(slices), map_resources(classes))
    claims = kube.list_all(c.api, f"{CLAIMS}/namespaces/{c.ns}/gpuclaims")
    pods = kube.list_all(c.api, f"/api/v1/namespaces/{c.ns}/pods")
    rcs = resource_claims(c)
    used = used_with_dra(claims, pods, {cls: GPU}, dra_usage([ClaimInfo.from_api(r) for r in rcs],
                                                                   device_owners(offers.values())))
    bad = []
    for n in infos:
        alloc = allocatable_with_dra(n.allocatable, offers[n.name]).get(GPU, 0)
        bound = sum(int(cl["spec"]["count"]) for cl in claims
                    if claim_holds_gpus(cl) and cl["status"]["nodeName"] == n.name)
        if used.get(GPU, {}).get(n.name, 0) > alloc or bound > alloc:
            bad.append(f"{n.name}: {used.get(GPU, {}).get(n.name, 0)} counted, {bound} bound, {alloc} offered")
    allocated = [d for r in rcs if (r.get("status") or {}).get("allocation") for d in devices_of(r)]
    if len(allocated) != len(set(allocated)):
        bad.append(f"devices allocated twice: {sorted(allocated)}")
    return bad


class Sampler:
    """usage_now, every 0.1 s on a thread, until stopped; and how many
    GPUs GPUClaims held at each sample (to show it sampled while placing)."""

    def __init__(self, c: Cluster, nodes: list[str], cls: str) -> None:
        self.bad: list[str] = []
        self.samples = 0
        self.bound: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(c, nodes, cls), daemon=True)
        self._thread.start()

    def _run(self, c: Cluster, nodes: list[str], cls: str) -> None:
        while not self._stop.is_set():
            self.bad += usage_now(c, nodes, cls)
            self.samples += 1
            self.bound.append(sum(int(cl["spec"]["count"]) for cl in kube.list_all(
                c.api, f"{CLAIMS}/namespaces/{c.ns}/gpuclaims") if claim_holds_gpus(cl)))
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


# -- the stories ------------------------------------------------------------------------------------


def test_a_gated_pod_of_four_is_placed_on_a_dra_node_and_kube_scheduler_binds_it(story: tuple[Dra, Cluster]) -> None:
    d, c = story
    cls = c.gpu_class("gpu")
    (node,) = d.nodes_of(c, ("dra-a", 4, True))
    c.pod("train", [{"name": "gpu", "className": cls, "count": 4}], gpus=4)
    wait_for(lambda: c.running_on("train", node), timeout=60,
             message=lambda: f"train Running on {node}: {c.describe_pod('train')}")
    claim = c.get_claim("train-gpu") or {}
    assert claim["status"]["phase"] == api.Phase.BOUND and claim["status"]["nodeName"] == node
    assert claim["status"]["resourceName"] == GPU
    allocated = wait_for(lambda: extended_claim(c, "train"), timeout=30,
                         message="kube-scheduler's ResourceClaim for train, allocated")
    assert sorted(devices_of(allocated)) == [(node, f"gpu-{i}") for i in range(4)]
    placed = told(c, "train", "Placed")
    assert placed and f"{GPU} served by DRA, DeviceClass {d.device_class}" in placed[0], placed
    # The class's printer columns and the metrics count the DRA node's devices.
    wait_for(lambda: ((c.api.sanitize_for_serialization(kube.request_json(
        c.api, "GET", f"{CLAIMS}/gpuclasses/{cls}")).get("status") or {}).get("allocatable") == 4),
        timeout=30, message="the class's status to count the node's 4 devices")
    assert d.rc.metric("gpuclaimctl_gpus_allocatable", **{"class": cls}) == 4.0


def test_a_mixed_cluster_fills_to_the_last_gpu_without_overcommit_on_either_kind(
        story: tuple[Dra, Cluster]) -> None:
    d, c = story
    cls = c.gpu_class("gpu")
    nodes = d.nodes_of(c, ("dp0", 4, False), ("dp1", 4, False), ("dra0", 4, True), ("dra1", 4, True))
    sampler = Sampler(c, nodes, cls)
    try:
        # A pod gpuclaimctl does not place takes a device of dra1 through
        # kube-scheduler's own claim.
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": nodes[3]}, "terminationGracePeriodSeconds": 0,
                          "containers": [{"name": "main", "image": "busybox",
                                          "resources": {"limits": {GPU: "1"}}}]}}
        c.core.create_namespaced_pod(c.ns, plain)
        wait_for(lambda: c.running_on("plain", nodes[3]), timeout=60, message=lambda: c.describe_pod("plain"))
        sizes = [3, 3, 2, 2, 2, 1, 1, 1]  # with plain's 1: the 16 GPUs of the four nodes
        names = [f"p{i}" for i in range(len(sizes))]
        for name, n in zip(names, sizes):  # a few tenths apart: the sampler sees the nodes fill
            c.pod(name, [{"name": "gpu", "className": cls, "count": n}], gpus=n)
            time.sleep(0.3)
        try:
            wait_for(lambda: all((p := c.read_pod(n)) is not None and p.status.phase == "Running" for n in names),
                     timeout=90, message="every pod to run")
        except AssertionError:
            raise AssertionError("\n".join(c.describe_pod(n) for n in names)) from None
        c.pod("last", [{"name": "gpu", "className": cls, "count": 1}], gpus=1)
        wait_for(lambda: c.waiting_reason("last-gpu") == "Capacity", timeout=30,
                 message=lambda: f"the 17th GPU to wait for Capacity: {c.describe_pod('last')}")
        time.sleep(1.0)  # a sample or more after the last decision
    finally:
        sampler.stop()
    assert sampler.bad == [], sampler.bad[:5]
    # Sampled before, while and after the sets were placed.
    assert sampler.bound[0] == 0 and sampler.bound[-1] == 15, sampler.bound
    assert len({b for b in sampler.bound if 0 < b < 15}) >= 3, sampler.bound
    on = {c.read_pod(n).spec.node_name for n in names}
    assert on == set(nodes), on  # both kinds used
    assert usage_now(c, nodes, cls) == []


def test_a_direct_resource_claim_takes_devices_and_a_gated_pod_waits_for_capacity_saying_so(
        story: tuple[Dra, Cluster]) -> None:
    d, c = story
    cls = c.gpu_class("gpu")
    (node,) = d.nodes_of(c, ("dra-c", 4, True))
    kube.request(c.api, "POST", f"{DRA}/namespaces/{c.ns}/resourceclaims", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "direct"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": d.device_class, "allocationMode": "ExactCount", "count": 3}}]}}})
    c.core.create_namespaced_pod(c.ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "direct"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "direct"}],
                 "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}]}})
    wait_for(lambda: c.running_on("direct", node), timeout=60, message=lambda: c.describe_pod("direct"))
    d.settles(node, 1)  # the claim's 3 devices counted
    c.pod("train", [{"name": "gpu", "className": cls, "count": 2}], gpus=2)
    wait_for(lambda: c.waiting_reason("train-gpu") == "Capacity", timeout=30,
             message=lambda: f"train to wait for Capacity: {c.describe_pod('train')}")
    message = waiting_message(c, "train-gpu")
    assert f"the most free on a node the pod can use: 1 {GPU} on {node}" in message, message
    assert "served by DRA" in message, message
    # `gpuclaimctl status` counts the same.
    snap = statusview.read(c.api, dra=True)
    rows = {(r.node, r.class_name): r for r in statusview.gpu_rows(snap.nodes, snap.classes, snap.claims, snap.pods,
                                                                  snap.dra)}
    row = rows[(node, cls)]
    assert (row.allocatable, row.bound, row.other, row.free) == (4, 0, 3, 1), row
    text = statusview.render(snap.nodes, snap.classes, snap.claims, snap.pods, datetime.now(timezone.utc),
                             dra=snap.dra)
    assert d.device_class in text.split(statusview.DRA_TITLE)[1].split("\n\n")[0]
    # And so does `gpuclaimctl why`, saying the node serves the GPUs through DRA.
    now = datetime.now(timezone.utc)
    taken = snapshotfile.read_live(c.api, now, trimmed=False)
    pod = kube.request_json(c.api, "GET", f"/api/v1/namespaces/{c.ns}/pods/train")
    text = why.render_text(why.build(pod, taken.objects, now, dra=taken.dra))
    assert (f"short by 1 {GPU}: the set needs 2, 1 free (served by DRA, DeviceClass {d.device_class})"
            in next(line for line in text.splitlines() if line.startswith(f"{node} "))), text
    # Its claim deallocated (the pod and the claim gone), the set fits: it is woken and placed.
    c.core.delete_namespaced_pod("direct", c.ns)
    kube.request(c.api, "DELETE", f"{DRA}/namespaces/{c.ns}/resourceclaims/direct")
    wait_for(lambda: c.running_on("train", node), timeout=60,
             message=lambda: f"train Running once the claim went: {c.describe_pod('train')}")


def test_a_slice_republished_with_a_gpu_gone_places_nothing_over_the_new_count_and_keeps_bound_claims(
        story: tuple[Dra, Cluster]) -> None:
    d, c = story
    cls = c.gpu_class("gpu")
    (node,) = d.nodes_of(c, ("dra-d", 4, True))
    sampler = Sampler(c, [node], cls)
    try:
        c.pod("first", [{"name": "gpu", "className": cls, "count": 2}], gpus=2)
        wait_for(lambda: c.running_on("first", node), timeout=60, message=lambda: c.describe_pod("first"))
        # The driver publishes generation 2 without gpu-3, the old slice still listed.
        d.publish(node, 3, name=f"{node}-gen2", gen=2)
        d.sees(node, 3)
        d.settles(node, 1)
        c.pod("second", [{"name": "gpu", "className": cls, "count": 2}], gpus=2)
        wait_for(lambda: c.waiting_reason("second-gpu") == "Capacity", timeout=30,
                 message=lambda: f"second to wait for Capacity: {c.describe_pod('second')}")
        assert f"1 {GPU} on {node}" in waiting_message(c, "second-gpu"), waiting_message(c, "second-gpu")
        c.pod("third", [{"name": "gpu", "className": cls, "count": 1}], gpus=1)
        wait_for(lambda: c.running_on("third", node), timeout=60, message=lambda: c.describe_pod("third"))
        time.sleep(1.0)
        assert c.waiting_reason("second-gpu") == "Capacity"
        first = c.get_claim("first-gpu") or {}
        assert first["status"]["phase"] == api.Phase.BOUND and first["status"]["nodeName"] == node
        assert c.running_on("first", node)
    finally:
        sampler.stop()
    assert sampler.bad == [], sampler.bad[:5]


def test_a_pod_pinned_to_a_dra_node_without_room_waits_for_capacity_and_says_how_many_are_free_there(
        story: tuple[Dra, Cluster]) -> None:
    d, c = story
    cls = c.gpu_class("gpu")
    full, roomy = d.nodes_of(c, ("dra-e0", 4, True), ("dra-e1", 4, True))
    c.pod("fill", [{"name": "gpu", "className": cls, "count": 3}], gpus=3, node_selector={
        "kubernetes.io/hostname": full})
    wait_for(lambda: c.running_on("fill", full), timeout=60, message=lambda: c.describe_pod("fill"))
    d.settles(full, 1)
    c.pod("pinned", [{"name": "gpu", "className": cls, "count": 2}], gpus=2, node_selector={
        "kubernetes.io/hostname": full})
    wait_for(lambda: c.waiting_reason("pinned-gpu") == "Capacity", timeout=30,
             message=lambda: f"pinned to wait for Capacity: {c.describe_pod('pinned')}")
    message = waiting_message(c, "pinned-gpu")
    assert f"the most free on a node the pod can use: 1 {GPU} on {full}" in message, message
    assert "1 node with room the pod's nodeSelector, affinity or tolerations exclude" in message, message
    assert c.read_pod("pinned").spec.scheduling_gates


# -- a plane without resource.k8s.io/v1 ------------------------------------------------------------


class PlaneWithoutDra(ControlPlane):
    """kube-apiserver with resource.k8s.io/v1 turned off. Since DRA is GA
    (its gate locked on) the Node authorizer watches ResourceSlices and
    the API server is never ready without them, so this plane authorizes
    by RBAC alone (`--authorization-mode` adds up when given twice: the
    extra flags cannot replace it). kube-scheduler waits for DRA's caches
    for ever here, so it does not run: released pods stay unbound
    (kube-controller-manager runs: it takes the not-ready taint off nodes)."""

    def _spawn(self, name: str, argv: list[str]) -> None:
        if name == APISERVER:
            argv = ["--authorization-mode=RBAC" if a.startswith("--authorization-mode=") else a for a in argv]
        super()._spawn(name, argv)


def test_a_plane_without_resource_k8s_io_places_pods_and_reads_no_dra(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plane = PlaneWithoutDra(tmp_path / "plane", components=(CONTROLLER_MANAGER, KWOK),
                            extra_flags={APISERVER: ["--runtime-config=resource.k8s.io/v1=false"]},
                            log=lambda m: print(f"[no-DRA plane] {m}"))
    try:
        plane.start()
    except Exception as e:  # the message carries the component's log tail
        pytest.fail(f"the plane without resource.k8s.io/v1 did not start: {e}", pytrace=False)
    rc: RunningController | None = None
    try:
        admin = config.new_client_from_config(config_file=str(plane.kubeconfig))
        assert served(admin, DRA_RESOURCES + DRA_OPTIONAL) == frozenset()
        install_crds(admin)
        run_as(str(plane.kubeconfig), controller_identity(plane, plane.workdir / "controller.kubeconfig",
                                                          namespace="gpuclaimctl-tests"))
        core = client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": "team"}})
        try:  # kube-controller-manager makes it too, when it gets there first
            core.create_namespaced_service_account("team", {"metadata": {"name": "default"}})
        except client.ApiException as e:
            if e.status != 409:
                raise
        c = Cluster(admin, "team")
        core.create_node(gpu_node_manifest("gpu-0", 8, labels=dict(c.label)))
        wait_for(lambda: node_is_ready(core, "gpu-0"), timeout=30, message="node gpu-0 Ready")
        cls = c.gpu_class("a100")
        # `why` and `simulate` read the cluster as before: no DRA objects, nothing to warn about.
        taken = snapshotfile.read_live(admin, datetime.now(timezone.utc))
        assert taken.dra is None and taken.warnings == (), taken.warnings
        with caplog.at_level(logging.INFO):
            rc = RunningController(str(plane.kubeconfig)).start()
            c.pod("solo", [{"name": "gpu", "className": cls, "count": 8}], gpus=8)
            wait_for(lambda: not c.read_pod("solo").spec.scheduling_gates, timeout=60,
                     message=lambda: f"solo released: {c.describe_pod('solo')}")
            claim = c.get_claim("solo-gpu") or {}
            assert claim["status"]["phase"] == api.Phase.BOUND and claim["status"]["nodeName"] == "gpu-0"
            time.sleep(3.0)  # time for a reflector to fail, had one started
        said = [r for r in caplog.records if "resource.k8s.io" in r.getMessage() or "resourceslices" in r.getMessage()
                or "resourceclaims" in r.getMessage() or "deviceclasses" in r.getMessage()]
        assert [(r.levelno, r.getMessage()) for r in said] == [(logging.INFO, next(
            r.getMessage() for r in said))], [(r.levelname, r.getMessage()) for r in said]
        assert "does not serve resource.k8s.io/v1" in said[0].getMessage()
        assert not set(DRA_RESOURCES + DRA_OPTIONAL) & set(rc.factory.informers())
        assert not rc.controller.dra_synced()
    finally:
        if rc is not None:
            rc.stop()
        plane.stop()
