"""`gpuclaimctl run --local`: a real control plane with sample GPU nodes.

For a newcomer without a cluster: builds the plane's binaries once (cached),
starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
kwok on loopback, installs the CRDs, and adds four fake GPU nodes (8, 8, 4
and 2 GPUs, labelled by model) and a GPUClass per model. The controller then
runs against it; Ctrl-C stops everything.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import AlreadyExists
from gpuclaimctl.controlplane import (
    CONTROLLER_MANAGER,
    KWOK,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SCHEDULER,
    ControlPlane,
)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
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
    say(f"control plane ready; kubeconfig: {plane.kubeconfig}")
    say(f"try: {plane.bin['kubectl']} --kubeconfig {plane.kubeconfig} apply -f "
        f"{DEPLOY / 'samples'}")
    return plane


def install(api_client: client.ApiClient) -> None:
    """CRDs, a GPUClass per model and the sample nodes; idempotent."""
    for path in sorted((DEPLOY / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                _create(api_client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    _wait_established(api_client)
    classes = {cls: model for _n, _g, model, cls in SAMPLE_NODES}
    for cls, model in classes.items():
        _create(api_client, "/apis/gpuclaimctl.io/v1alpha1/gpuclasses", {
            "apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": cls}, "spec": {"nodeSelector": {MODEL_LABEL: model}}})
    for name, gpus, model, _cls in SAMPLE_NODES:
        allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        _create(api_client, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, MODEL_LABEL: model},
                         "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE}},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)}})


def _create(api_client: client.ApiClient, path: str, body: dict[str, Any]) -> None:
    try:
        kube.request(api_client, "POST", path, body=body)
    except AlreadyExists:
        pass


def _wait_established(api_client: client.ApiClient, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crds = kube.request_json(api_client, "GET",
                                 "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        ours = [c for c in crds["items"] if c["spec"]["group"] == "gpuclaimctl.io"]
        if len(ours) == 3 and all(any(cond["type"] == "Established" and cond["status"] == "True"
                                      for cond in (c.get("status") or {}).get("conditions") or ())
                                  for c in ours):
            return
        time.sleep(0.2)
    raise RuntimeError("the gpuclaimctl.io CRDs were not established in time")
