"""Small test helpers: waiting for a condition, making fake GPU nodes."""

from __future__ import annotations

import ctypes
import signal
import socket

import time
from typing import Any, Callable, TypeVar

from kubernetes import client

from gpuclaimctl.controlplane import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll predicate until it returns something truthy; return that value.

    Fails the test with `message` (a string, or a callable evaluated at the
    time of failure so it can show the last state) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {text}")
        time.sleep(interval)


def gpu_node_manifest(
    name: str,
    gpus: int = 8,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    resource: str = "nvidia.com/gpu",
    cpu: str = "32",
    memory: str = "256Gi",
    pods: str = "110",
    kwok: bool = True,
) -> dict[str, Any]:
    """A Node that kwok manages (Ready, heartbeats) with `gpus` GPUs."""
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        allocatable[resource] = str(gpus)
    annotations = {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE} if kwok else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
            "annotations": annotations,
        },
        "spec": {"taints": list(taints or [])},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


# kube-controller-manager puts these on a new node and takes them off a
# moment after it reports Ready; until then kube-scheduler (and placement)
# will not use the node.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def node_is_ready(core: client.CoreV1Api, name: str) -> bool:
    """Ready, and without the not-ready taints: usable by the scheduler."""
    node = core.read_node(name)
    if any(t.key in NOT_READY_TAINTS for t in node.spec.taints or []):
        return False
    for c in node.status.conditions or []:
        if c.type == "Ready":
            return bool(c.status == "True")
    return False


def free_port() -> int:
    """A TCP port free on loopback now (for a child process's endpoints)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """In a child before exec: the kernel kills it if the test process
    dies, so not even a crashed pytest leaves a controller running."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1
