"""Placement on DRA nodes beside device-plugin nodes at 5,000 nodes
(issue 47, item 6).

A program, not a test (``make bench-placement`` runs it after
``benchmarks.preempt_bench``). It fills two real ``ClusterView``s through
the calls the informer handlers make:

* **device plugin**: 5,000 nodes with ``allocatable nvidia.com/gpu: 8``;
* **DRA**: the same nodes with no ``nvidia.com/gpu`` in allocatable, one
  DeviceClass (``extendedResourceName: nvidia.com/gpu``, a CEL selector on
  the driver) and one ResourceSlice per node of 8 GPUs with realistic
  attributes (productName, driverVersion, cudaComputeCapability, uuid, ...)
  and a memory capacity; each pod of a Bound GPUClaim also has the
  ResourceClaim kube-scheduler made for its request, allocated that node's
  devices (counted once with the GPUClaim: docs/dra.md §2);

with the same Bound GPUClaims (reserved by running pods) on the same nodes,
then times the same single-pod decisions on both through the view's
``Decider`` (``used_by`` + ``placement.decide``, under the view's lock),
checks that both choose the same node for every pod, and prints both, the
ratio, and the target: DRA within 1.2x of the device plugin (issue 47,
item 6). It also prints what applying the 5,000 slices to the view took
(one event at a time, after the DRA informers have listed), and what the
first recomputation after listing (``dra_synced``) took when the slices
came before it. It never fails on a figure; run it alone (two cores).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuclaimctl.decide.placement import Placed, decide
from gpuclaimctl.model.nodeaffinity import PodNodeRules
from gpuclaimctl.model.snapshot import ClaimState, PodInfo
from gpuclaimctl.state.view import ClusterView

GPU = "nvidia.com/gpu"
DRIVER = "gpu.nvidia.com"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ZONES = [f"zone-{i}" for i in range(10)]
TARGET_RATIO = 1.2
Obj = dict[str, Any]
PRODUCTS = {"a100": ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "80Gi"),
            "h100": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi")}


def node_obj(i: int, rng: random.Random, dra: bool) -> Obj:
    name = f"node-{i:05d}"
    product = "a100" if rng.random() < 0.6 else "h100"
    allocatable = {"cpu": "128", "memory": "1Ti", "pods": "110"}
    if not dra:
        allocatable[GPU] = "8"
    taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}] if rng.random() < 0.1 else []
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "product": product,
                                                  "zone": rng.choice(ZONES), "gen": str(rng.randint(6, 10))}},
            "spec": {"taints": taints},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}}


def device(node: int, d: int, product: str) -> Obj:
    name, arch, cc, mem = PRODUCTS[product]
    return {"name": f"gpu-{d}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-{node:08x}-{d:04x}-4c1e-9a7b-{node * 8 + d:012x}"},
                "productName": {"string": name},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": arch},
                "cudaComputeCapability": {"version": cc},
                "driverVersion": {"version": "570.124.6"},
                "cudaDriverVersion": {"version": "12.8.0"},
                "pcieBusID": {"string": f"0000:{0x10 + d * 0x10:02x}:00.0"},
                "index": {"int": d},
                "minor": {"int": d},
            },
            "capacity": {"memory": {"value": mem}}}


def slice_obj(i: int, product: str, gpus: int) -> Obj:
    node = f"node-{i:05d}"
    return {"metadata": {"name": f"{node}-{DRIVER}-x7k2q", "resourceVersion": "1"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [device(i, d, product) for d in range(gpus)]}}


def device_class() -> Obj:
    return {"metadata": {"name": DRIVER, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"extendedResourceName": GPU,
                     "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}


def gpu_classes() -> list[Obj]:
    return [{"metadata": {"name": "a100"}, "spec": {"resourceName": GPU, "nodeSelector": {"product": "a100"}}},
            {"metadata": {"name": "h100"}, "spec": {"resourceName": GPU, "nodeSelector": {"product": "h100"}}},
            {"metadata": {"name": "any"}, "spec": {"resourceName": GPU}}]


def bound(nodes: list[Obj], used_gpus: int, rng: random.Random) -> list[tuple[Obj, Obj, list[int]]]:
    """Bound GPUClaims of 1 or 2 GPUs (each with its running pod and the
    device indexes it holds on its node), `used_gpus` GPUs in all."""
    free = {n["metadata"]["name"]: list(range(8)) for n in nodes}
    names = list(free)
    out: list[tuple[Obj, Obj, list[int]]] = []
    used = 0
    while used < used_gpus:
        name = rng.choice(names)
        count = min(1 if rng.random() < 0.8 else 2, used_gpus - used)
        if len(free[name]) < count:
            continue
        devs = [free[name].pop() for _ in range(count)]
        used += count
        i = len(out)
        ns = f"team-{i % 50}"
        pod = {"metadata": {"name": f"p{i}", "namespace": ns, "uid": f"pod-{i}",
                            "creationTimestamp": "2026-05-01T00:00:00Z"},
               "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {
                   "limits": {GPU: str(count)}, "requests": {GPU: str(count)}}}]},
               "status": {"phase": "Running"}}
        claim = {"metadata": {"name": f"c{i}", "namespace": ns, "uid": f"claim-{i}", "resourceVersion": "1"},
                 "spec": {"className": "any", "count": count, "reclaimPolicy": "Release"},
                 "status": {"phase": "Bound", "nodeName": name, "resourceName": GPU,
                            "reservedFor": [{"name": f"p{i}", "uid": f"pod-{i}"}]}}
        out.append((claim, pod, devs))
    return out


def scheduler_claim(pod: Obj, node: str, devs: list[int]) -> Obj:
    """The ResourceClaim kube-scheduler makes for the pod's request on a DRA node."""
    uid = pod["metadata"]["uid"]
    return {"metadata": {"name": f"{pod['metadata']['name']}-extended-resources-abcde",
                         "namespace": pod["metadata"]["namespace"], "uid": f"rc-{uid}",
                         "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                              "uid": uid, "controller": True}]},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "container-0-request-0", "driver": DRIVER, "pool": node, "device": f"gpu-{d}"}
                for d in devs]}}}}


def build(nodes: list[Obj], slices: list[Obj], claims: list[tuple[Obj, Obj, list[int]]], dra: bool,
          slices_first: bool = False) -> tuple[ClusterView, dict[str, float]]:
    """A view filled as the informers fill it; the seconds each phase took."""
    took: dict[str, float] = {}
    view = ClusterView(lambda: NOW)
    t0 = time.perf_counter()
    for c in gpu_classes():
        view.apply_class(c)
    for n in nodes:
        view.apply_node(n, ready=True, not_ready_since=None, health_changed=False, recreated=False)
    took["nodes"] = time.perf_counter() - t0
    if dra:
        view.apply_device_class(device_class())
        if slices_first:  # the informers' lists, then dra_synced
            t0 = time.perf_counter()
            for s in slices:
                view.apply_resource_slice(s)
            took["slices"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            view.dra_synced()
            took["synced"] = time.perf_counter() - t0
        else:  # listed (empty), then each slice an event
            view.dra_synced()
            t0 = time.perf_counter()
            for s in slices:
                view.apply_resource_slice(s)
            took["slices"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for claim, pod, devs in claims:
        view.apply_claim(None, claim)
        view.apply_pod(None, pod)
        if dra:
            view.apply_resource_claim(None, scheduler_claim(pod, claim["status"]["nodeName"], devs))
    took["claims"] = time.perf_counter() - t0
    return view, took


Request = tuple[PodInfo, list[ClaimState]]


def requests(rng: random.Random, n: int) -> list[Request]:
    """Gated pods: 1-4 GPUs of a100, h100 or any; some with a zone
    nodeSelector, required affinity, or a toleration."""
    out: list[Request] = []
    for i in range(n):
        kind = rng.random()
        spec: Obj = {}
        if kind < 0.2:
            spec = {"nodeSelector": {"zone": rng.choice(ZONES)}}
        elif kind < 0.35:
            spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": rng.sample(ZONES, 3)},
                    {"key": "gen", "operator": "Gt", "values": ["7"]}]}]}}}}
        elif kind < 0.45:
            spec = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
        count = rng.randint(1, 4)
        cls = rng.choice(["a100", "h100", "any"])
        pod = PodInfo("waiting", f"w{i}", f"w-{i}", NOW - timedelta(seconds=i), PodNodeRules.from_pod_spec(spec))
        out.append((pod, [ClaimState(f"w{i}-g", f"wc-{i}", cls, count)]))
    return out


def decide_once(view: ClusterView, req: Request) -> tuple[float, str | None]:
    info, states = req
    clock = time.perf_counter
    with view.deciding() as d:
        t0 = clock()
        used, _ = d.used_by((0, info.created, info.namespace, info.name), me=info.uid)
        decision = decide(info, states, d.cluster, used, NOW)
        took = clock() - t0
    return took, decision.node if isinstance(decision, Placed) else None


def time_both(a: ClusterView, b: ClusterView, reqs: list[Request], a_first: bool
              ) -> tuple[list[float], list[float], list[str | None], list[str | None]]:
    """Each pod decided on both views in turn, so that load from elsewhere
    falls on both alike; `a_first`: which goes first for every pod."""
    ta: list[float] = []
    tb: list[float] = []
    ca: list[str | None] = []
    cb: list[str | None] = []
    for req in reqs:
        if a_first:
            x, y = decide_once(a, req), decide_once(b, req)
        else:
            y, x = decide_once(b, req), decide_once(a, req)
        ta.append(x[0])
        tb.append(y[0])
        ca.append(x[1])
        cb.append(y[1])
    return ta, tb, ca, cb


def fmt(samples: list[float]) -> str:
    ms = sorted(s * 1e3 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"mean {statistics.fmean(ms):7.3f} ms  p50 {ms[len(ms) // 2]:7.3f} ms  p99 {p99:7.3f} ms  (n={len(ms)})"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--used-gpus", type=int, default=30_000,
                        help="GPUs held by Bound GPUClaims (of 8 per node; 40,000 at 5,000 nodes is full)")
    parser.add_argument("--pods", type=int, default=2_000, help="decisions to time on each")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every pod on both views (the best mean is kept)")
    parser.add_argument("--seed", type=int, default=47)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    plugin_nodes = [node_obj(i, rng, dra=False) for i in range(args.nodes)]
    dra_nodes = [{**n, "status": {**n["status"], "allocatable": {k: v for k, v in n["status"]["allocatable"].items()
                                                                 if k != GPU}}} for n in plugin_nodes]
    slices = [slice_obj(i, n["metadata"]["labels"]["product"], 8) for i, n in enumerate(plugin_nodes)]
    claims = bound(plugin_nodes, args.used_gpus, rng)
    reqs = requests(rng, args.pods)
    print(f"DRA and device-plugin nodes at {args.nodes} nodes of 8 GPUs; {len(claims)} Bound GPUClaims holding "
          f"{args.used_gpus} GPUs (each reserved by a running pod; on DRA nodes with its scheduler-made "
          f"ResourceClaim); load average {load()}")

    gc.collect()
    plugin, t_plugin = build(plugin_nodes, slices, claims, dra=False)
    dra, t_dra = build(dra_nodes, slices, claims, dra=True)
    gc.collect()
    gc.freeze()
    print("\nfilling the views (once; what the informer handlers pay):")
    print(f"  device plugin: nodes {t_plugin['nodes'] * 1e3:8.1f} ms   claims+pods {t_plugin['claims'] * 1e3:8.1f} ms")
    print(f"  DRA:           nodes {t_dra['nodes'] * 1e3:8.1f} ms   claims+pods+ResourceClaims "
          f"{t_dra['claims'] * 1e3:8.1f} ms")
    print(f"  applying the {len(slices)} ResourceSlices (8 devices each), one event each after listing: "
          f"{t_dra['slices'] * 1e3:.1f} ms ({t_dra['slices'] / len(slices) * 1e6:.1f} µs a slice); "
          f"load average {load()}")
    with dra.deciding() as d:
        offered = sum(n.allocatable.get(GPU, 0) for n in d.cluster.nodes.values())
    print(f"  DRA view offers {offered} GPUs on {args.nodes} nodes")
    del dra
    gc.unfreeze()
    gc.collect()
    listed, t_listed = build(dra_nodes, slices, [], dra=True, slices_first=True)
    print(f"  the same slices listed before dra_synced: applying {t_listed['slices'] * 1e3:.1f} ms, "
          f"then dra_synced (every node's offers) {t_listed['synced'] * 1e3:.1f} ms; load average {load()}")
    del listed
    gc.collect()
    dra, _ = build(dra_nodes, slices, claims, dra=True)
    gc.collect()
    gc.freeze()

    # Warm up both, then rounds: each pod decided on both views in turn
    # (which goes first alternates by round).
    time_both(plugin, dra, reqs[:200], True)
    rounds_plugin: list[list[float]] = []
    rounds_dra: list[list[float]] = []
    chose_plugin: list[str | None] = []
    chose_dra: list[str | None] = []
    for r in range(args.rounds):
        tp, td, chose_plugin, chose_dra = time_both(plugin, dra, reqs, r % 2 == 0)
        rounds_plugin.append(tp)
        rounds_dra.append(td)
    best_plugin = min(rounds_plugin, key=statistics.fmean)
    best_dra = min(rounds_dra, key=statistics.fmean)
    same = sum(a == b for a, b in zip(chose_plugin, chose_dra))
    placed = sum(a is not None for a in chose_dra)
    print(f"\none pod's decision (Decider.used_by + placement.decide; {len(reqs)} pods, {placed} placed; "
          f"best mean of {args.rounds} rounds, each pod decided on both in turn):")
    print(f"  device-plugin nodes  {fmt(best_plugin)}")
    print(f"  DRA nodes            {fmt(best_dra)}")
    print(f"  every round's mean, plugin / DRA: "
          + ", ".join(f"{statistics.fmean(a) * 1e3:.3f}/{statistics.fmean(b) * 1e3:.3f} ms"
                      for a, b in zip(rounds_plugin, rounds_dra)))
    print(f"  same node chosen on {same} of {len(reqs)} pods")
    ratio = statistics.fmean(best_dra) / statistics.fmean(best_plugin)
    medians = statistics.median(best_dra) / statistics.median(best_plugin)
    print(f"  DRA / device plugin: {ratio:.2f}x of the best means ({medians:.2f}x of their medians)")
    print(f"  target: within {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'MISSED'} "
          f"(load average {load()})")


if __name__ == "__main__":
    main()
