"""`gpuclaimctl run --local`: a real control plane with sample GPU nodes.

For a newcomer without a cluster: builds the plane's binaries once (cached),
starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
kwok on loopback, installs the CRDs, and adds four fake GPU nodes (8, 8, 4
and 2 GPUs, labelled by model) and a GPUClass per model. The controller then
runs against it; Ctrl-C stops everything.

The plane's kubeconfig is also reachable at one stable path (`KUBECONFIG`,
a symlink to the running plane's), so the line the quick start copies never
picks a plane an earlier run left behind.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import AlreadyExists
from gpuclaimctl.cmd import startwait
from gpuclaimctl.controlplane import (
    CONTROLLER_MANAGER,
    KWOK,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SCHEDULER,
    ControlPlane,
    build,
)

# The repository's deploy/ (gpuclaimctl/cmd/ is two levels below it).
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The namespace the quick start puts the samples in (README's examples use it).
SAMPLES_NAMESPACE = "team-a"
MODEL_LABEL = "nvidia.com/gpu.product"
# name, GPUs, model (the label NVIDIA GPU feature discovery sets), class.
SAMPLE_NODES = (
    ("gpu-a100-0", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    ("gpu-a100-1", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    ("gpu-h100-0", 4, "NVIDIA-H100-80GB-HBM3", "h100"),
    ("gpu-l4-0", 2, "NVIDIA-L4", "l4"),
)


def start_plane() -> ControlPlane:
    def say(message: str) -> None:
        print(f"[local] {message}", file=sys.stderr, flush=True)

    plane = ControlPlane(components=(SCHEDULER, CONTROLLER_MANAGER, KWOK), log=say)
    plane.start()
    try:
        api_client = config.new_client_from_config(config_file=str(plane.kubeconfig))
        install(api_client)
    except BaseException:
        plane.stop()
        raise
    # A new etcd and API server on new ports: no write of an earlier
    # process can reach them, so the controller need not wait for one.
    startwait.own_api_server(str(plane.kubeconfig))
    stable = publish_kubeconfig(plane.kubeconfig)
    say("control plane ready; in another terminal:")
    # Bare lines, to copy as they are.
    print(f"export KUBECONFIG={shlex.quote(str(stable))}\n"
          f"alias kubectl={shlex.quote(str(plane.bin['kubectl']))}\n"
          f"alias gpuclaimctl={shlex.quote(_tool())}\n"
          f"kubectl create namespace {SAMPLES_NAMESPACE}\n"
          f"kubectl apply -n {SAMPLES_NAMESPACE} -f {shlex.quote(str(DEPLOY / 'samples'))}",
          file=sys.stderr, flush=True)
    return plane


def _tool() -> str:
    """How to run gpuclaimctl's own commands (status, why, simulate) from
    another terminal: the installed script beside this Python, if any."""
    script = Path(sys.executable).parent / "gpuclaimctl"
    return str(script) if script.exists() else f"{sys.executable} -m gpuclaimctl"


def kubeconfig_link() -> Path:
    """Where the running local plane's kubeconfig can always be found."""
    return build.cache_root() / "local" / "kubeconfig"


def publish_kubeconfig(kubeconfig: Path) -> Path:
    """Point kubeconfig_link() at this plane's kubeconfig (the latest plane
    started wins) until the process exits."""
    link = kubeconfig_link()
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(kubeconfig)
    tmp.replace(link)  # atomic: a reader sees the old plane or the new one
    atexit.register(_withdraw_kubeconfig, link, kubeconfig)
    return link


def _withdraw_kubeconfig(link: Path, kubeconfig: Path) -> None:
    """Remove the link if it still names this plane (a later run owns it otherwise)."""
    try:
        if os.readlink(link) == str(kubeconfig):
            link.unlink()
    except OSError:
        pass


def install(api_client: client.ApiClient) -> None:
    """CRDs, a GPUClass per model and the sample nodes; idempotent."""
    crds: list[str] = []
    for path in sorted((DEPLOY / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                _create(api_client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                crds.append(doc["metadata"]["name"])
    if not crds:
        raise RuntimeError(f"no CRDs in {DEPLOY / 'crds'}: run from a checkout of gpuclaimctl")
    _wait_established(api_client, crds)
    classes = {cls: model for _n, _g, model, cls in SAMPLE_NODES}
    for cls, model in classes.items():
        _create(api_client, "/apis/gpuclaimctl.io/v1alpha1/gpuclasses", saved_config({
            "apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": cls}, "spec": {"nodeSelector": {MODEL_LABEL: model}}}))
    for name, gpus, model, _cls in SAMPLE_NODES:
        allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        _create(api_client, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, MODEL_LABEL: model},
                         "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE}},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)}})


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def saved_config(body: dict[str, Any]) -> dict[str, Any]:
    """The object as `kubectl create --save-config` makes it: `kubectl apply`
    of deploy/samples/gpuclass.yaml then finds the class it names unchanged,
    instead of warning that the annotation is missing. kubectl records the
    object with its other annotations, as Go encodes JSON (sorted keys)."""
    annotations = body["metadata"].setdefault("annotations", {})
    annotations[LAST_APPLIED] = json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n"
    return body


def _create(api_client: client.ApiClient, path: str, body: dict[str, Any]) -> None:
    try:
        kube.request(api_client, "POST", path, body=body)
    except AlreadyExists:
        pass


def _wait_established(api_client: client.ApiClient, names: list[str],
                      timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crds = kube.request_json(api_client, "GET",
                                 "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        established = {c["metadata"]["name"] for c in crds["items"]
                       if any(cond["type"] == "Established" and cond["status"] == "True"
                              for cond in (c.get("status") or {}).get("conditions") or ())}
        if established >= set(names):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the CRDs {', '.join(sorted(set(names) - established))} "
                       "were not established in time")
