"""No overcommit, ever: many workers, a lagging informer, more demand than GPUs.

8 workers place 300 gated pods (1-3 GPUs each, ~600 GPUs asked) on 6 kwok
nodes with 32 GPUs between them. A sampler lists every claim over and over
during the run and fails the test if any node ever has more GPUs bound than
it has. At the end every pod that could still fit has been released.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from kubernetes import client

from gpuclaimctl.model import api
from gpuclaimctl.client import kube
from tests.helpers import wait_for

pytestmark = pytest.mark.plane
CAPACITY = (8, 8, 6, 4, 4, 2)
PODS = 300


def test_eight_workers_never_overcommit_a_node_and_release_every_pod_that_fits(
    api_client: client.ApiClient, namespace: str, gpu_nodes: Callable[..., dict[str, Any]],
    run_controller: Callable[..., Any],
) -> None:
    tag = uuid.uuid4().hex[:6]
    label = {"stress.gpuclaimctl.io/run": tag}
    allocatable = {}
    for i, gpus in enumerate(CAPACITY):
        node = gpu_nodes(f"stress{i}", gpus=gpus, labels=label)
        allocatable[node["metadata"]["name"]] = gpus
    cls = f"stress-{tag}"
    kube.request(api_client, "POST", f"/apis/{api.GROUP}/{api.VERSION}/gpuclasses", body={
        "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": cls},
        "spec": {"nodeSelector": label}})
    claims_path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/gpuclaims"

    violations: list[str] = []
    samples = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal samples
        while not stop.is_set():
            claims = kube.request_json(api_client, "GET", claims_path)["items"]
            bound: Counter[str] = Counter()
            for c in claims:
                st = c.get("status") or {}
                if st.get("phase") == "Bound":
                    bound[st["nodeName"]] += c["spec"]["count"]
            for node, used in bound.items():
                if used > allocatable.get(node, 0):
                    violations.append(f"{node}: {used} GPUs bound of {allocatable.get(node)}")
            samples += 1

    rc = run_controller(workers=8)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    rng = random.Random(7)
    need = {f"p{i:03d}": rng.choice((1, 2, 3)) for i in range(PODS)}
    core = client.CoreV1Api(api_client)

    def create(name: str) -> None:
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "annotations": {api.CLAIMS_ANNOTATION: json.dumps(
                [{"name": "g", "className": cls, "count": need[name]}])}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox"}]}})

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, need))

        def settled() -> bool:
            pods = core.list_namespaced_pod(namespace).items
            claims = {c["metadata"]["name"]: c for c in
                      kube.request_json(api_client, "GET", claims_path)["items"]}
            for p in pods:
                if not p.spec.scheduling_gates:
                    continue
                conds = ((claims.get(f"{p.metadata.name}-g") or {}).get("status") or {}).get(
                    "conditions") or []
                if not any(c["type"] == api.CONDITION_WAITING for c in conds):
                    return False
            return len(pods) == PODS

        wait_for(settled, timeout=240, interval=0.5,
                 message="every pod released or its claim Waiting")
        # Let the sampler see the settled state a few more times.
        seen = samples
        wait_for(lambda: samples >= seen + 3, timeout=30, message="more samples")
    finally:
        stop.set()
        sampler.join(10)

    assert not violations, f"overcommitted: {violations[:5]} ({len(violations)} samples)"
    assert samples > 20, "the sampler must have watched the run"

    claims = kube.request_json(api_client, "GET", claims_path)["items"]
    used: Counter[str] = Counter()
    for c in claims:
        st = c.get("status") or {}
        if st.get("phase") == "Bound":
            used[st["nodeName"]] += c["spec"]["count"]
    free = {n: allocatable[n] - used[n] for n in allocatable}
    waiting = [p.metadata.name for p in core.list_namespaced_pod(namespace).items
               if p.spec.scheduling_gates]
    released = PODS - len(waiting)
    assert released > 0
    fits = [name for name in waiting if need[name] <= max(free.values())]
    assert not fits, (f"pods {fits[:5]} could fit in the free GPUs {free} but were not released")
    assert sum(used.values()) <= sum(CAPACITY)
    assert rc.metric("gpuclaimctl_placements_total", result="placed", reason="") == released
