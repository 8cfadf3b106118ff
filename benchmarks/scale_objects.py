"""The cluster `make bench-scale` fills a plane with, and the heartbeats it
keeps: realistic kwok nodes (labels as the GPU Operator and Node Feature
Discovery put them, every node tainted for GPUs and a few for maintenance,
the images list as a kubelet reports it), pods already running on them
with their GPUClaims Bound as the controller leaves them, and a kubelet's
status heartbeats.

Everything is written straight to the API server as the plane's admin (not
audited), in pipelined batches on several connections (kube.request_many):
a pod with spec.nodeName set (kwok runs it), then its claim as the
controller makes it (`template_claim`), then the claim's status Bound on
that node (`bound_claim`) through the status subresource.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import orjson
from kubernetes import client

from benchmarks.benchkit import CLAIMS, post, say
from benchmarks.informer_bench import pod_manifest as training_pod
from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE
from gpuclaimctl.decide.podplan import bound_claim
from gpuclaimctl.model import api
from gpuclaimctl.model.nodeaffinity import pin_to_node
from gpuclaimctl.model.podclaims import pod_claims, template_claim

Obj = dict[str, Any]
GPU = api.DEFAULT_RESOURCE_NAME
PRODUCT_LABEL = "nvidia.com/gpu.product"
# Two GPU products, three nodes in five of the first: a class each.
PRODUCTS = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# Nodes drained for maintenance: no pod here tolerates it, so placement
# must pass them by. One node in this many.
MAINTENANCE_EVERY = 33
MAINTENANCE_TAINT = {"key": "example.com/maintenance", "value": "scheduled", "effect": "NoSchedule"}
# A kubelet reports at most this many images (--node-status-max-images):
# the DaemonSets' and this many training images of the cluster's pool.
NODE_IMAGES = 32
# A kubelet with node leases posts its status when something changed, else
# every --node-status-report-frequency (5 minutes); kwok's stages do it
# every 10.
KUBELET_REPORT_SECONDS = 300.0
# The claims of the pods already running: 1 GPU each, one in ten 2.
BOUND_GPUS = (1, 1, 1, 1, 1, 1, 1, 1, 1, 2)
ENTRY = "gpu"
BATCH = 25  # requests pipelined on one connection at a time
WRITERS = 8  # connections writing at once
_REPOS = ["nvcr.io/nvidia/pytorch", "nvcr.io/nvidia/tritonserver", "nvcr.io/nvidia/nemo",
          "nvcr.io/nvidia/cuda", "nvcr.io/nvidia/k8s/dcgm-exporter", "nvcr.io/nvidia/gpu-operator",
          "nvcr.io/nvidia/k8s-device-plugin", "nvcr.io/nvidia/cloud-native/gpu-operator-validator",
          "nvcr.io/nvidia/driver", "nvcr.io/nvidia/k8s/container-toolkit", "registry.k8s.io/kube-proxy",
          "registry.k8s.io/pause", "docker.io/calico/node", "docker.io/calico/cni",
          "registry.k8s.io/nfd/node-feature-discovery", "docker.io/fluent/fluent-bit",
          "quay.io/prometheus/node-exporter", "docker.io/envoyproxy/envoy",
          "registry.example.com/ml/trainer", "registry.example.com/ml/evaluator",
          "ghcr.io/example-org/vision/resnet50-trainer", "ghcr.io/example-org/nlp/bert-large-trainer",
          "gcr.io/example-project/speech/whisper-trainer", "quay.io/example/recsys/dlrm-trainer",
          "registry.example.com/research/llama-13b-trainer"]


# -- nodes -------------------------------------------------------------------------------


def _hex(rng: random.Random, n: int) -> str:
    return "%0*x" % (n, rng.getrandbits(4 * n))


def _images() -> tuple[list[Obj], list[Obj]]:
    """The images nodes report, each the same everywhere it is (one digest,
    tag and size): the DaemonSets' on every node, and a cluster's pool of
    training images, of which each node has pulled some."""
    rng = random.Random("images")

    def image(repo: str, tag: str) -> Obj:
        return {"names": [f"{repo}@sha256:{_hex(rng, 64)}", f"{repo}:{tag}"],
                "sizeBytes": rng.randrange(20_000_000, 25_000_000_000)}

    system = [image(repo, f"v{rng.randrange(1, 4)}.{rng.randrange(20)}.{rng.randrange(10)}")
              for repo in _REPOS[:18]]
    workload = [image(repo, f"{rng.randrange(23, 26)}.{rng.randrange(1, 13):02d}-{_hex(rng, 7)}")
                for repo in _REPOS[18:] for _ in range(40)]
    return system, workload


SYSTEM_IMAGES, WORKLOAD_IMAGES = _images()


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def product_of(i: int) -> str:
    return "a100" if i % 5 < 3 else "h100"


def maintained(i: int) -> bool:
    return i % MAINTENANCE_EVERY == MAINTENANCE_EVERY - 1


def node_manifest(i: int, gpus: int) -> Obj:
    """A GPU node as a kubelet registers it, with GPU Operator and NFD labels
    and its images; kwok fills in the conditions (Ready) and keeps the rest."""
    rng = random.Random(i)
    name, product, zone = node_name(i), product_of(i), ZONES[i % len(ZONES)]
    instance = "p4d.24xlarge" if product == "a100" else "p5.48xlarge"
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": instance, "node.kubernetes.io/instance-type": instance,
        "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "type": "kwok", "node-pool": f"gpu-{product}-{i // 500:02d}",
        PRODUCT_LABEL: PRODUCTS[product], "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.family": "ampere" if product == "a100" else "hopper",
        "nvidia.com/gpu.machine": instance, "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90",
        "nvidia.com/cuda.driver.rev": "07", "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4", "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single", "nvidia.com/gfd.timestamp": str(1760000000 + i),
        "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
        "feature.node.kubernetes.io/cpu-cpuid.AMXTILE": "true",
        "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1021-aws",
        "feature.node.kubernetes.io/kernel-version.major": "6",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/pci-15b3.present": "true",
        "feature.node.kubernetes.io/rdma.available": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
    }
    nfd = [k.split("/", 1)[1] for k in labels if k.startswith("feature.node.kubernetes.io/")]
    annotations = {
        KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE,
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-0{_hex(rng, 16)}"}),
        "nfd.node.kubernetes.io/feature-labels": ",".join(nfd),
        "nfd.node.kubernetes.io/master.version": "v0.17.3",
        "nvidia.com/gpu-driver-upgrade-enabled": "true",
    }
    taints = [GPU_TAINT] + ([MAINTENANCE_TAINT] if maintained(i) else [])
    capacity = {"cpu": "96", "memory": "1176460Mi", "pods": "110", "ephemeral-storage": "7812500000Ki",
                "hugepages-1Gi": "0", "hugepages-2Mi": "0", GPU: str(gpus),
                "rdma/rdma_shared_device_a": "63", "vpc.amazonaws.com/efa": "4"}
    allocatable = {**capacity, "cpu": "95690m", "memory": "1154620Mi",
                   "ephemeral-storage": "7199972125144"}
    images = sorted(SYSTEM_IMAGES + rng.sample(WORKLOAD_IMAGES, NODE_IMAGES), key=lambda im: -im["sizeBytes"])
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints, "providerID": f"aws:///{zone}/i-0{_hex(rng, 16)}"},
        "status": {
            "capacity": capacity, "allocatable": allocatable, "images": images,
            "addresses": [{"type": "InternalIP", "address": ip},
                          {"type": "InternalDNS", "address": f"ip-{ip.replace('.', '-')}.ec2.internal"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"machineID": _hex(rng, 32), "systemUUID": _hex(rng, 32), "bootID": _hex(rng, 32),
                         "kernelVersion": "6.8.0-1021-aws", "osImage": "Ubuntu 24.04.2 LTS",
                         "containerRuntimeVersion": "containerd://2.1.4", "kubeletVersion": "v1.37.2",
                         "kubeProxyVersion": "v1.37.2", "operatingSystem": "linux",
                         "architecture": "amd64"},
        },
    }


def gpu_classes() -> list[Obj]:
    """One GPUClass per product, selecting its nodes by the GPU Operator's label."""
    return [{"apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": cls},
             "spec": {"nodeSelector": {PRODUCT_LABEL: product}}} for cls, product in PRODUCTS.items()]


# -- pods ---------------------------------------------------------------------------------


# What a running pod is written without unless whole: fields of its
# containers the controller drops on the way into its cache (model.podcache)
# and never reads. They are half of the pod's JSON, and of the API server's
# CPU and memory for 50,000 such pods on this machine.
TRIMMED = ("env", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "args", "command",
           "securityContext", "volumeMounts", "ports")


def pod(i: int, namespace: str, cls: str, gpus: int, node: str | None, whole: bool = True) -> Obj:
    """The benchmark's realistic training pod (informer_bench: two containers,
    env, probes, volumes, tolerating the GPU taint; about 9 KB) with one
    inline claim of `gpus` GPUs of `cls`, a trainer asking as many, and a
    node selector and zone affinity the class's nodes meet. Without `node`,
    gated and waiting; with it, as it is once released there and bound:
    ungated, pinned, marked placed, spec.nodeName set. Not `whole`: without
    its containers' TRIMMED fields."""
    p = training_pod(i, namespace)
    p["metadata"]["annotations"][api.CLAIMS_ANNOTATION] = json.dumps(
        [{"name": ENTRY, "className": cls, "count": gpus}])
    spec = p["spec"]
    trainer = spec["containers"][0]["resources"]
    trainer["requests"][GPU] = trainer["limits"][GPU] = str(gpus)
    # Its node selector and zone affinity as the class and the nodes have them.
    spec["nodeSelector"] = {PRODUCT_LABEL: PRODUCTS[cls]}
    spec["affinity"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ZONES}]}]}}
    spec["terminationGracePeriodSeconds"] = 0
    if not whole:
        for container in spec["containers"]:
            for field in TRIMMED:
                container.pop(field, None)
    if node is not None:
        del spec["schedulingGates"]
        spec["affinity"] = pin_to_node(spec["affinity"], node)
        p["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] = node
        spec["nodeName"] = node
        # As NCCL jobs often run: on the node's network, so kwok gives it the
        # node's IP. kwok's own pod IPs (one /16) ran out at 50,000 pods: its
        # retries asked for a second IP, which the API server refuses.
        spec["hostNetwork"] = True
    return p


@dataclasses.dataclass(frozen=True)
class Running:
    """One pod to write already running, with its claim."""

    index: int
    namespace: str
    cls: str
    gpus: int
    node: str


def running_pods(nodes: int, per_node: int, gpus_per_node: int, namespaces: Sequence[str]) -> list[Running]:
    """`per_node` pods on each node, their claims of BOUND_GPUS, in the node's class."""
    out: list[Running] = []
    for n in range(nodes):
        used = 0
        for k in range(per_node):
            gpus = BOUND_GPUS[(n + k) % len(BOUND_GPUS)]
            if used + gpus > gpus_per_node:
                raise SystemExit(f"scale_bench: {per_node} claims do not fit in {gpus_per_node} GPUs "
                                 f"a node; raise --gpus-per-node")
            used += gpus
            i = len(out)
            out.append(Running(i, namespaces[i % len(namespaces)], product_of(n), gpus, node_name(n)))
    return out


# -- writing ------------------------------------------------------------------------------


class WriteFailed(RuntimeError):
    pass


def _send(admin: client.ApiClient, requests: list[kube.Sent]) -> list[Obj]:
    """Pipelined; the decoded answers, or WriteFailed naming the first refusal."""
    out = []
    for (method, path, _body, _type), answer in zip(requests, kube.request_many(admin, requests)):
        if isinstance(answer, Exception):
            raise WriteFailed(f"{method} {path}: {answer}")
        out.append(orjson.loads(answer))
    return out


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def write_all(admin: client.ApiClient, items: Sequence[Any], write: Callable[[Sequence[Any]], None],
              what: str, check: Callable[[], None] = lambda: None, writers: int = WRITERS) -> float:
    """`write` each BATCH of `items` from `writers` threads, `check` (which
    may raise to stop them) before each; seconds taken."""
    t0, done, lock = time.monotonic(), [0], threading.Lock()
    step = max(len(items) // 10, BATCH)

    def one(batch: Sequence[Any]) -> None:
        check()
        write(batch)
        with lock:
            before = done[0] // step
            done[0] += len(batch)
            if done[0] // step != before:
                say(f"{what}: {done[0]}/{len(items)} in {time.monotonic() - t0:.0f}s")

    with ThreadPoolExecutor(writers, thread_name_prefix="scale-write") as pool:
        list(pool.map(one, _batches(items, BATCH)))
    return time.monotonic() - t0


def write_nodes(admin: client.ApiClient, count: int, gpus: int, check: Callable[[], None]) -> float:
    def write(batch: Sequence[int]) -> None:
        _send(admin, [("POST", "/api/v1/nodes", node_manifest(i, gpus), "application/json") for i in batch])

    return write_all(admin, range(count), write, "nodes", check)


def lift_not_ready_taints(admin: client.ApiClient, count: int, check: Callable[[], None]) -> float:
    """What kube-controller-manager's node lifecycle controller does once a
    node is Ready (this plane runs none): every new node carries the
    not-ready taint (the TaintNodesByCondition admission plugin adds it)."""
    def write(batch: Sequence[int]) -> None:
        _send(admin, [("PATCH", f"/api/v1/nodes/{node_name(i)}",
                       {"spec": {"taints": node_manifest(i, 0)["spec"]["taints"]}},
                       "application/merge-patch+json") for i in batch])

    return write_all(admin, range(count), write, "not-ready taints lifted", check)


def write_running(admin: client.ApiClient, running: Sequence[Running], whole: bool,
                  check: Callable[[], None]) -> float:
    """Each pod, then its claim, then the claim's Bound status, a batch at a time."""
    def write(batch: Sequence[Running]) -> None:
        pods = _send(admin, [("POST", f"/api/v1/namespaces/{r.namespace}/pods",
                              pod(r.index, r.namespace, r.cls, r.gpus, r.node, whole), "application/json")
                             for r in batch])
        bodies = [template_claim(p, pod_claims(p)[0]) for p in pods]
        claims = _send(admin, [("POST", f"{CLAIMS}/namespaces/{c['metadata']['namespace']}/gpuclaims",
                                c, "application/json") for c in bodies])
        _send(admin, [("PUT", f"{CLAIMS}/namespaces/{c['metadata']['namespace']}/gpuclaims/"
                              f"{c['metadata']['name']}/status",
                       bound_claim(c, p, r.node, GPU), "application/json")
                      for c, p, r in zip(claims, pods, batch)])

    return write_all(admin, running, write, "running pods and their bound claims", check)


def pods_not_running(admin: client.ApiClient) -> int:
    """Pods on nodes that kwok has not made Running yet."""
    return len(kube.list_all(admin, "/api/v1/pods",
                             [("fieldSelector", "status.phase!=Running,spec.nodeName!=")]))


# -- heartbeats ---------------------------------------------------------------------------


class Heartbeats:
    """A kubelet's status heartbeat for every node once per `period`
    seconds, spread evenly: a strategic merge patch of the conditions'
    lastHeartbeatTime alone, as a kubelet posts when nothing changed (and
    as kwok's heartbeat stage does every 10 minutes). kwok renews the nodes'
    Leases on its own, every 10 s."""

    TICK = 0.5

    def __init__(self, admin: client.ApiClient, nodes: Sequence[str], conditions: Sequence[str],
                 period: float = KUBELET_REPORT_SECONDS) -> None:
        self._admin, self._nodes, self._conditions = admin, list(nodes), list(conditions)
        self._per_tick = len(self._nodes) * self.TICK / period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-heartbeats", daemon=True)
        self.sent = 0
        self.errors: list[str] = []

    def start(self) -> Heartbeats:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        due, at, nxt = 0.0, 0, time.monotonic()
        while not self._stop.is_set():
            due += self._per_tick
            n, due = int(due), due - int(due)
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {"status": {"conditions": [{"type": t, "lastHeartbeatTime": now} for t in self._conditions]}}
            batch = [self._nodes[(at + k) % len(self._nodes)] for k in range(n)]
            at += n
            for names in _batches(batch, BATCH):
                try:
                    _send(self._admin, [("PATCH", f"/api/v1/nodes/{name}/status", body,
                                         "application/strategic-merge-patch+json") for name in names])
                    self.sent += len(names)
                except (WriteFailed, OSError) as e:
                    self.errors.append(str(e)[:200])
            nxt += self.TICK
            self._stop.wait(max(0.0, nxt - time.monotonic()))


def condition_types(admin: client.ApiClient, node: str) -> list[str]:
    obj = kube.request_json(admin, "GET", f"/api/v1/nodes/{node}")
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or ()]


def make_classes(admin: client.ApiClient) -> None:
    for c in gpu_classes():
        post(admin, f"{CLAIMS}/gpuclasses", c)

