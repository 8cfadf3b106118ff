"""Benchmark: how fast the controller releases gated pods, beside a baseline
that makes the same API writes with no decisions, in the same run.

    python -m benchmarks.controller_bench [--pods 1000] [--nodes 100] [--workers 8]
                                          [--gpus-per-node 32] [--rounds 2]
                                          [--profile cpu|wall]

Starts its own control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok), installs the CRDs, makes ``--nodes`` kwok GPU
nodes and one GPUClass, then runs two scenarios, each in a fresh namespace
on the same nodes:

- ``controller``: the real controller in this process (``app.build``, its
  informers, ``controller.run`` with ``--workers`` workers);
- ``baseline``: the same structure without the product: a pod informer, one
  rate-limited queue and ``--workers`` workers that, per gated pod, create
  the same inline claim (the body the controller sends), write its status
  Bound with ``reservedFor`` on a round-robin node, release the pod in one
  update of the same shape (gate removed, node pinned, node annotation) and
  post the same Normal event: the four writes the controller makes, through
  the same ``Writer`` and client rate limit, with no placement, usage
  tracking or claim syncs.

In each, ``--pods`` gated pods with one inline claim each (1..4 GPUs, seeded,
total below capacity) are created as fast as a pool of ``--creators`` threads
can. A raw watch on the namespace's pods, in this process, timestamps (ms,
monotonic clock) the first event that shows each pod without the gate. A
pod's latency runs from the earlier of its create call returning and its
ADDED event (creationTimestamp has whole seconds only) to that release.
Throughput: all releases over first create to last release, and steady state
(the middle 80 % of releases over the time they took). ``--rounds`` pairs run
in ABBA order (controller, baseline, baseline, controller, ...) so that drift
in what else the machine runs falls on both; the ratio is per round and over
all rounds.

Nodes have 32 GPUs by default, not 8: 1,000 pods of 1..4 GPUs ask for about
2,500, more than 100 nodes of 8 hold.

CPU: this process (getrusage), its threads by role (/proc/self/task), and
each control-plane component (/proc/<pid>/stat); machine: busy share of all
cores (/proc/stat) and the 1-minute load. The API server's own request
counters show both scenarios make the same writes. ``--profile`` runs the controller
scenario again with cProfile on every thread the controller starts and
prints its hotspots (profiling slows it; its figures are not the result).

Figures are printed; nothing fails on a time.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import itertools
import json
import os
import pstats
import random
import re
import resource
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import orjson
import yaml
from kubernetes import client, config
from prometheus_client import CollectorRegistry

from gpuclaimctl.model import api
from gpuclaimctl.cmd import app
from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import (
    CONTROLLER_MANAGER,
    KWOK,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SCHEDULER,
    ControlPlane,
)
from gpuclaimctl.model.podclaims import has_gate
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.model.podclaims import pod_claims, template_claim
from gpuclaimctl.decide.podplan import bound_claim, released_pod
from gpuclaimctl.client.writer import AlreadyExists, Writer
from informers import PODS, EventHandlerFuncs, SharedInformerFactory
from metrics.workqueue import PrometheusWorkqueueMetricsProvider
from workqueue import RateLimitingQueue, default_controller_rate_limiter

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent
CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"
CLASS = "bench"
POOL_LABEL = "bench.gpuclaimctl.io/pool"
ENTRY = "gpu"
TICKS = os.sysconf("SC_CLK_TCK")
COMPONENTS = ("etcd", "kube-apiserver", SCHEDULER, CONTROLLER_MANAGER, KWOK)
# Between scenarios the API server should be nearly idle (kwok's heartbeats
# for 100 nodes cost it a few percent of a core) before the next one starts.
QUIET_APISERVER_CORES = 0.3
QUIET_MAX_WAIT = 30.0


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- measuring ---------------------------------------------------------------------


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _stat_ticks(path: str) -> int:
    """utime + stime of a /proc stat file (fields 14 and 15; comm may hold spaces)."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_cpu(pid: int) -> float:
    try:
        return _stat_ticks(f"/proc/{pid}/stat") / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def _thread_group(name: str) -> str:
    """A thread's role: its name without the trailing instance number."""
    return re.sub(r"([-_#]?\d+)+$", "", name) or name


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads, summed by role."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            ticks = _stat_ticks(f"/proc/self/task/{tid}/stat")
        except (OSError, IndexError, ValueError):
            continue
        out[_thread_group(names.get(int(tid), "(not Python)"))] += ticks / TICKS
    return dict(out)


@dataclasses.dataclass
class Meter:
    """CPU of this process, its threads, the plane's components and the machine over a span."""

    plane: ControlPlane
    cpu: float = 0.0
    threads: dict[str, float] = dataclasses.field(default_factory=dict)
    components: dict[str, float] = dataclasses.field(default_factory=dict)
    machine: tuple[int, int] = (0, 0)
    wall: float = 0.0

    def start(self) -> Meter:
        self.cpu, self.threads = cpu_seconds(), thread_cpu()
        self.components = {n: process_cpu(p) for n, p in self.plane.running().items()}
        self.machine, self.wall = machine_ticks(), time.monotonic()
        return self

    def stop(self) -> Usage:
        busy, total = machine_ticks()
        threads = thread_cpu()
        return Usage(
            wall=time.monotonic() - self.wall,
            cpu=cpu_seconds() - self.cpu,
            threads={k: v - self.threads.get(k, 0.0) for k, v in threads.items()},
            components={n: process_cpu(p) - self.components.get(n, 0.0)
                        for n, p in self.plane.running().items()},
            machine_busy=(busy - self.machine[0]) / max(1, total - self.machine[1]),
            load1=os.getloadavg()[0],
        )


@dataclasses.dataclass(frozen=True)
class Usage:
    wall: float
    cpu: float
    threads: dict[str, float]
    components: dict[str, float]
    machine_busy: float  # share of all cores' time that was busy
    load1: float


def wait_quiet(plane: ControlPlane) -> float:
    """Wait until the API server idles (or QUIET_MAX_WAIT passes); return its last cores in use."""
    pid = plane.running().get("kube-apiserver")
    if pid is None:
        return 0.0
    deadline = time.monotonic() + QUIET_MAX_WAIT
    while True:
        before = process_cpu(pid)
        time.sleep(1.0)
        cores = process_cpu(pid) - before
        if cores < QUIET_APISERVER_CORES or time.monotonic() > deadline:
            return cores


_REQUEST_SAMPLE = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_requests(admin: client.ApiClient) -> dict[str, float]:
    """Requests the API server has served since it started, by verb and resource (all clients)."""
    text = kube.request(admin, "GET", "/metrics").decode()
    out: dict[str, float] = defaultdict(float)
    for labels, value in _REQUEST_SAMPLE.findall(text):
        m = dict(_LABEL.findall(labels))
        what = m.get("resource", "") + (f"/{m['subresource']}" if m.get("subresource") else "")
        out[f"{m.get('verb', '')} {what}"] += float(value)
    return dict(out)


# -- the plane: CRDs, class, nodes --------------------------------------------------


def new_client(kubeconfig: str, pool: int) -> client.ApiClient:
    api_client: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    api_client.configuration.connection_pool_maxsize = pool
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool
    return api_client


def post(api_client: client.ApiClient, path: str, body: Obj) -> None:
    try:
        kube.request(api_client, "POST", path, body=body)
    except kube.ApiError as e:
        if e.status != 409:
            raise


def install_crds(api_client: client.ApiClient) -> None:
    names = []
    for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                post(api_client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                names.append(doc["metadata"]["name"])

    def established(name: str) -> bool:
        crd = kube.request_json(api_client, "GET",
                                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or ())

    poll(lambda: all(established(n) for n in names), 60, "the CRDs to be established")


def node_manifest(name: str, gpus: int) -> Obj:
    # As tests/helpers.gpu_node_manifest makes them: kwok keeps it Ready.
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110", api.DEFAULT_RESOURCE_NAME: str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", POOL_LABEL: "a"},
                     "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE}},
        "spec": {"taints": []},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def make_nodes(api_client: client.ApiClient, count: int, gpus: int) -> list[str]:
    names = [f"gpu-node-{i:04d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: post(api_client, "/api/v1/nodes", node_manifest(n, gpus)), names))

    def ready() -> bool:
        nodes = kube.request_json(api_client, "GET", "/api/v1/nodes",
                                  query=[("labelSelector", f"{POOL_LABEL}=a")])["items"]
        return sum(1 for n in nodes if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (n.get("status") or {}).get("conditions") or ())) == count

    poll(ready, 180, f"kwok to report {count} nodes Ready")
    return names


def poll(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"controller_bench: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


# -- the workload --------------------------------------------------------------------


def demands(pods: int, capacity: int, seed: int) -> list[int]:
    """GPUs per pod, 1..4, seeded; refused if they cannot all fit."""
    rng = random.Random(seed)
    counts = [rng.randint(1, 4) for _ in range(pods)]
    if sum(counts) > capacity:
        raise SystemExit(f"controller_bench: {pods} pods ask for {sum(counts)} GPUs but the nodes "
                         f"have {capacity}; raise --gpus-per-node or --nodes")
    return counts


def pod_manifest(i: int, namespace: str, gpus: int) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"train-{i:05d}", "namespace": namespace, "labels": {"app": "train"},
                     "annotations": {api.CLAIMS_ANNOTATION: json.dumps(
                         [{"name": ENTRY, "className": CLASS, "count": gpus}])}},
        "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.example.com/ml/train:v1",
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }


def make_namespace(api_client: client.ApiClient, name: str) -> None:
    post(api_client, "/api/v1/namespaces", {"metadata": {"name": name}})
    # kube-controller-manager makes it too, but maybe not before the first pod.
    post(api_client, f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})


class ReleaseWatch:
    """Watches one namespace's pods; records when each was first seen and first seen ungated."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self._api = api_client
        self._ns = namespace
        self.seen: dict[str, float] = {}
        self.released: dict[str, float] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = False
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self) -> ReleaseWatch:
        rv = kube.request_json(self._api, "GET", f"/api/v1/namespaces/{self._ns}/pods",
                               query=[("limit", "1")])["metadata"]["resourceVersion"]
        cfg = self._api.configuration
        headers = {"Accept": "application/json"}
        self._api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
        self._resp = self._api.rest_client.pool_manager.request(
            "GET", f"{cfg.host}/api/v1/namespaces/{self._ns}/pods?watch=true&resourceVersion={rv}"
                   f"&timeoutSeconds=3600", headers=headers, preload_content=False, timeout=None)
        if self._resp.status != 200:
            raise RuntimeError(f"watch {self._ns}: {self._resp.status} {self._resp.read()[:300]!r}")
        self._thread.start()
        return self

    def _run(self) -> None:
        buf = b""
        try:
            for chunk in self._resp.stream(65536, decode_content=True):
                now = time.monotonic()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line:
                        self._event(orjson.loads(line), now)
        except Exception as e:  # a closed connection at stop ends the loop
            if not self._stop:
                say(f"pod watch on {self._ns} ended: {e}")

    def _event(self, event: Obj, now: float) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        pod = event["object"]
        name = pod["metadata"]["name"]
        with self._changed:
            self.seen.setdefault(name, now)
            if name not in self.released and not has_gate(pod):
                self.released[name] = now
                self._changed.notify_all()

    def wait_released(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.released) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stop = True
        if self._resp is not None:
            # shutdown() wakes the reading thread; close() alone would not.
            self._resp.shutdown()
            self._resp.close()


def create_pods(api_client: client.ApiClient, namespace: str, counts: list[int],
                creators: int) -> dict[str, float]:
    """Create the pods from `creators` threads; return when each create call returned."""
    returned: dict[str, float] = {}

    def one(i: int) -> None:
        body = pod_manifest(i, namespace, counts[i])
        kube.request(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
        returned[body["metadata"]["name"]] = time.monotonic()

    with ThreadPoolExecutor(creators, thread_name_prefix="bench-create") as pool:
        list(pool.map(one, range(len(counts))))
    return returned


# -- what runs the pods: the controller, or the baseline ------------------------------


class Subject:
    """What releases the pods in a scenario."""

    name = ""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def retries(self) -> float:
        return 0.0


class ControllerSubject(Subject):
    """The real controller, as `gpuclaimctl run` builds it, in this process."""

    name = "controller"

    def __init__(self, kubeconfig: str, options: Options, *, profile: str | None = None) -> None:
        self.options = options
        self.api_client = new_client(kubeconfig, max(16, options.workers * 2 + 8))
        self.registry = CollectorRegistry()
        # Its Writer waits for --kube-api-qps/--kube-api-burst tokens.
        self.factory, self.controller = app.build(self.api_client, options, self.registry)
        self.profiles: list[tuple[str, cProfile.Profile]] = []
        self._profile = profile
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._profile:
            # Every thread started from here on (informers, handlers, queue,
            # workers) enables its own profiler on its first profiled event.
            timer = time.thread_time if self._profile == "cpu" else time.perf_counter

            def bootstrap(_frame: Any, _event: str, _arg: Any) -> None:
                p = cProfile.Profile(timer)
                self.profiles.append((threading.current_thread().name, p))
                p.enable()

            threading.setprofile(bootstrap)
        self.factory.start()
        poll(self.controller.has_synced, 60, "the controller's caches to sync")
        self._thread = threading.Thread(target=self.controller.run, name="controller-run",
                                        args=(self.options.workers, self._stop), daemon=True)
        self._thread.start()
        if self._profile:
            # Workers exist once run() started them; later threads are not ours.
            poll(lambda: len(self.controller._workers) == self.options.workers, 10, "workers")
            threading.setprofile(None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.factory.shutdown()

    def retries(self) -> float:
        return self.registry.get_sample_value("workqueue_retries_total", {"name": "gpuclaimctl"}) or 0.0

    def release_histogram(self) -> tuple[float, float]:
        count = self.registry.get_sample_value("gpuclaimctl_pod_release_seconds_count") or 0.0
        total = self.registry.get_sample_value("gpuclaimctl_pod_release_seconds_sum") or 0.0
        return count, total


class BaselineSubject(Subject):
    """The controller's shape and writes without its decisions.

    A pod informer and one rate-limited queue feed `workers` threads; a sync
    makes the four writes the controller makes for a pod with one inline
    claim: create the claim (the same body), write its status Bound with
    reservedFor on the next node round-robin, release the pod in one update
    (gate removed, node pinned, node annotation) at the resourceVersion read,
    post a Normal event. Progress per pod is kept in memory so a retried
    sync (a 409 on the pod update) resumes where it stopped, as the
    controller resumes from its cache.
    """

    name = "baseline"

    def __init__(self, kubeconfig: str, options: Options, nodes: list[str]) -> None:
        self.workers = options.workers
        self.api_client = new_client(kubeconfig, max(16, options.workers * 2 + 8))
        self.registry = CollectorRegistry()
        self.factory = SharedInformerFactory(self.api_client, default_resync_period=options.resync_period)
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name="baseline",
            metrics_provider=PrometheusWorkqueueMetricsProvider(self.registry))
        self.writer = Writer(self.api_client,
                             limiter=kube.TokenBucket(options.kube_api_qps, options.kube_api_burst))
        self.pods = self.factory.pods()
        self._nodes = itertools.cycle(nodes)
        self._nodes_lock = threading.Lock()
        self._bound: dict[str, tuple[str, set[str]]] = {}  # pod uid -> (node, claims written)
        self._threads: list[threading.Thread] = []
        informer = self.factory.informer_for(PODS)
        self._registration = informer.add_event_handler(
            EventHandlerFuncs(add=self._changed, update=lambda _o, n: self._changed(n)),
            name="baseline-pods")

    def _changed(self, pod: Obj) -> None:
        if has_gate(pod):
            m = pod["metadata"]
            self.queue.add(f"{m['namespace']}/{m['name']}")

    def start(self) -> None:
        self.factory.start()
        poll(self._registration.has_synced, 60, "the baseline's pod cache to sync")
        for i in range(self.workers):
            t = threading.Thread(target=self._run_worker, name=f"baseline-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self.queue.shut_down()
        for t in self._threads:
            t.join(30)
        self.factory.shutdown()

    def retries(self) -> float:
        return self.registry.get_sample_value("workqueue_retries_total", {"name": "baseline"}) or 0.0

    def _run_worker(self) -> None:
        while True:
            key, shutdown = self.queue.get()
            if shutdown:
                return
            assert key is not None
            try:
                self._sync(key)
                self.queue.forget(key)
            except Exception as e:
                if "Conflict" not in type(e).__name__:
                    say(f"baseline sync {key} failed, will retry: {e}")
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    def _sync(self, key: str) -> None:
        ns, name = key.split("/", 1)
        pod = self.pods.get(ns, name)
        if pod is None or not has_gate(pod):
            return
        meta = pod["metadata"]
        if meta["uid"] not in self._bound:
            with self._nodes_lock:
                node = next(self._nodes)
            self._bound[meta["uid"]] = (node, set())
        node, written = self._bound[meta["uid"]]
        for entry in pod_claims(pod):
            body = template_claim(pod, entry)
            if body["metadata"]["name"] in written:
                continue
            try:
                claim = self.writer.create_claim(body)
            except AlreadyExists:
                claim = kube.request_json(self.api_client, "GET",
                                          f"{CLAIMS}/namespaces/{ns}/gpuclaims/{body['metadata']['name']}")
            self.writer.update_claim_status(bound_claim(claim, pod, node, api.DEFAULT_RESOURCE_NAME))
            written.add(body["metadata"]["name"])
        self.writer.update_pod(released_pod(pod, node))
        self.writer.event({"apiVersion": "v1", "kind": "Pod", "metadata": meta}, "Normal", "Placed",
                          f"GPU claims placed on node {node}: round-robin")


# -- one scenario ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    scenario: str
    pods: int
    released: int
    create_seconds: float   # first create sent .. last create returned
    total_seconds: float    # first create sent .. last release seen
    steady_rate: float      # releases/s over the middle 80 % of releases
    latencies: list[float]  # seconds, sorted
    retries: float
    usage: Usage
    requests: dict[str, float]  # served by the API server during the scenario, all clients
    note: str = ""

    @property
    def rate(self) -> float:
        return self.released / self.total_seconds if self.total_seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        # Nearest rank: p99 of 1,000 is the 990th value.
        rank = max(1, int(-(-q * len(self.latencies) // 100)))
        return self.latencies[min(rank, len(self.latencies)) - 1]


def run_scenario(plane: ControlPlane, admin: client.ApiClient, subject: Subject, namespace: str,
                 counts: list[int], creators: int, timeout: float) -> Result:
    make_namespace(admin, namespace)
    watch = ReleaseWatch(admin, namespace).start()
    subject.start()
    say(f"{subject.name}: creating {len(counts)} gated pods in {namespace}")
    meter = Meter(plane).start()
    requests_before = api_requests(admin)
    t0 = time.monotonic()
    returned = create_pods(admin, namespace, counts, creators)
    create_seconds = time.monotonic() - t0
    complete = watch.wait_released(len(counts), timeout)
    usage = meter.stop()
    requests = {k: v - requests_before.get(k, 0.0) for k, v in api_requests(admin).items()}
    retries = subject.retries()
    watch.stop()
    subject.stop()
    released = dict(watch.released)
    seen = dict(watch.seen)
    note = "" if complete else f"timed out after {timeout:.0f}s"
    times = sorted(released.values())
    latencies = sorted(max(0.0, t - min(returned.get(n, t), seen.get(n, t)))
                       for n, t in released.items())
    total = (times[-1] - t0) if times else 0.0
    steady = 0.0
    if len(times) >= 10:
        lo, hi = times[len(times) // 10], times[len(times) * 9 // 10 - 1]
        steady = (len(times) * 9 // 10 - len(times) // 10 - 1) / (hi - lo) if hi > lo else 0.0
    return Result(subject.name, len(counts), len(released), create_seconds, total, steady,
                  latencies, retries, usage, requests, note)


def clean(admin: client.ApiClient, namespace: str) -> None:
    """Delete a scenario's pods, claims (finalizers dropped: no controller runs) and namespace."""
    base = f"{CLAIMS}/namespaces/{namespace}/gpuclaims"
    claims = kube.request_json(admin, "GET", base)["items"]

    def unfinalize(c: Obj) -> None:
        try:
            kube.request(admin, "PATCH", f"{base}/{c['metadata']['name']}",
                         body={"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
        except kube.ApiError as e:
            if e.status != 404:
                raise

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(unfinalize, claims))
    kube.request(admin, "DELETE", base)
    kube.request(admin, "DELETE", f"/api/v1/namespaces/{namespace}/pods",
                 query=[("gracePeriodSeconds", "0")])
    kube.request(admin, "DELETE", f"/api/v1/namespaces/{namespace}")

    def gone() -> bool:
        try:
            kube.request(admin, "GET", f"/api/v1/namespaces/{namespace}")
            return False
        except kube.ApiError as e:
            return e.status == 404

    poll(gone, 180, f"namespace {namespace} to be deleted")


# -- report -------------------------------------------------------------------------------


def combined(name: str, runs: list[Result]) -> Result:
    """Runs of one scenario as one: all releases over all their time, latencies pooled."""
    total = sum(r.total_seconds for r in runs)
    steady = [r.steady_rate for r in runs if r.steady_rate > 0]
    return Result(
        name, sum(r.pods for r in runs), sum(r.released for r in runs),
        sum(r.create_seconds for r in runs), total,
        sum(steady) / len(steady) if steady else 0.0,
        sorted(x for r in runs for x in r.latencies), sum(r.retries for r in runs),
        Usage(wall=sum(r.usage.wall for r in runs), cpu=sum(r.usage.cpu for r in runs),
              threads={}, components={},
              machine_busy=sum(r.usage.machine_busy * r.usage.wall for r in runs)
              / max(1e-9, sum(r.usage.wall for r in runs)),
              load1=sum(r.usage.load1 for r in runs) / len(runs)),
        {}, "")


def report(args: argparse.Namespace, results: list[Result], counts: list[int]) -> None:
    print()
    print(f"controller_bench: {args.pods} gated pods (one inline claim each, "
          f"{sum(counts)} GPUs asked) over {args.nodes} kwok nodes x {args.gpus_per_node} GPUs, "
          f"{args.workers} workers, {args.creators} creating threads, client limit "
          f"{args.qps:g} qps; {os.cpu_count()} cores; {args.rounds} round(s), "
          "baseline and controller alternating (ABBA)")
    head = (f"{'scenario':<14} {'pods':>5} {'released':>8} {'rel/s':>7} {'steady/s':>8} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'ratio':>6} {'create s':>8} {'retries':>7} "
            f"{'CPU s':>6} {'busy':>5} {'load1':>5}")
    print(head)
    print("-" * len(head))

    def row(label: str, r: Result, base: Result | None) -> None:
        ratio = f"{r.rate / base.rate:.2f}x" if base is not None and base.rate > 0 else "-"
        print(f"{label:<14} {r.pods:>5} {r.released:>8} {r.rate:>7.1f} {r.steady_rate:>8.1f} "
              f"{r.percentile(50) * 1000:>7.0f} {r.percentile(99) * 1000:>7.0f} {ratio:>6} "
              f"{r.create_seconds:>8.1f} {r.retries:>7.0f} {r.usage.cpu:>6.1f} "
              f"{r.usage.machine_busy:>5.0%} {r.usage.load1:>5.2f}"
              + (f"  ({r.note})" if r.note else ""))

    for rnd in range(args.rounds):
        runs = [r for i, r in enumerate(results) if i // 2 == rnd]
        base = next((r for r in runs if r.scenario == "baseline"), None)
        for r in runs:
            row(f"{r.scenario} #{rnd + 1}", r, base)
    if args.rounds > 1:
        print("-" * len(head))
        base_all = combined("baseline", [r for r in results if r.scenario == "baseline"])
        ctl_all = combined("controller", [r for r in results if r.scenario == "controller"])
        row("controller all", ctl_all, base_all)
        row("baseline all", base_all, base_all)
    print("rel/s: releases from the first create to the last release; steady/s: the middle 80 %;")
    print("p50/p99: pod created -> seen released; ratio: releases/s / the baseline's of the same "
          "round (target for the controller: >= 0.80x);")
    print("CPU s: this process (creating threads and the pod watch included); busy: share of all "
          "cores busy during the scenario (other work on the machine included)")
    print()
    print("CPU seconds during each scenario, by process and by thread role of this process:")
    names = sorted({k for r in results for k in r.usage.components}, key=COMPONENTS.index)
    groups = sorted({k for r in results for k, v in r.usage.threads.items() if v >= 0.1},
                    key=lambda g: -max(r.usage.threads.get(g, 0.0) for r in results))
    labels = [f"{r.scenario[:4]} #{i // 2 + 1}" for i, r in enumerate(results)]
    print(f"  {'':<36}" + "".join(f"{x:>10}" for x in labels))
    for n in names:
        print(f"  {n:<36}" + "".join(f"{r.usage.components.get(n, 0.0):>10.1f}" for r in results))
    print(f"  {'this process':<36}" + "".join(f"{r.usage.cpu:>10.1f}" for r in results))
    for g in groups:
        print(f"    {g[:34]:<34}" + "".join(f"{r.usage.threads.get(g, 0.0):>10.1f}" for r in results))
    print(f"  {'wall seconds':<36}" + "".join(f"{r.usage.wall:>10.1f}" for r in results))
    print()
    print("API requests served during each scenario (every client: this process, scheduler, kwok, "
          "controller-manager):")
    kinds = sorted((k for k in {k for r in results for k in r.requests}
                    if max(r.requests.get(k, 0.0) for r in results) >= 5),
                   key=lambda k: (k.split(" ", 1)[1], k))
    print(f"  {'':<36}" + "".join(f"{x:>10}" for x in labels))
    for k in kinds:
        print(f"  {k[:36]:<36}" + "".join(f"{r.requests.get(k, 0.0):>10.0f}" for r in results))


def print_profile(profiles: list[tuple[str, cProfile.Profile]], top: int, clock: str) -> None:
    by_group: dict[str, list[cProfile.Profile]] = defaultdict(list)
    for name, p in profiles:
        by_group[_thread_group(name)].append(p)
    for group, ps in sorted(by_group.items()):
        out = io.StringIO()
        stats = pstats.Stats(ps[0], stream=out)
        for p in ps[1:]:
            stats.add(p)
        total: float = stats.total_tt  # type: ignore[attr-defined]
        if total < 0.2:
            continue
        print(f"\n=== cProfile ({clock} time): {len(ps)} thread(s) {group!r}, {total:.1f} s ===")
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        print("\n".join(line for line in out.getvalue().splitlines()
                        if line.strip() and not line.startswith("   Ordered by")))


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.controller_bench",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=32,
                        help="GPUs per node; 8 cannot hold 1,000 pods of 1..4 GPUs on 100 nodes")
    parser.add_argument("--creators", type=int, default=16, help="threads creating pods")
    parser.add_argument("--qps", type=float, default=1000.0,
                        help="client rate limit of the controller and the baseline (burst 2x)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="controller+baseline pairs, alternating order (ABBA) to even out drift")
    parser.add_argument("--timeout", type=float, default=240.0, help="per scenario, for releases")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", choices=("cpu", "wall"),
                        help="afterwards, run the controller once more under cProfile on every "
                             "thread it starts (timing CPU or wall time) and print hotspots")
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args(argv)

    counts = demands(args.pods, args.nodes * args.gpus_per_node, args.seed)
    options = Options(workers=args.workers, resync_period=0.0, metrics_bind_address="0",
                      health_bind_address="0", kube_api_qps=args.qps,
                      kube_api_burst=int(args.qps * 2), shutdown_timeout=20.0)
    options.validate()
    started = time.monotonic()
    plane = ControlPlane(components=(SCHEDULER, CONTROLLER_MANAGER, KWOK), log=say)
    with plane:
        kubeconfig = str(plane.kubeconfig)
        admin = new_client(kubeconfig, args.creators + 8)  # no rate limit
        install_crds(admin)
        post(admin, f"{CLAIMS}/gpuclasses", {
            "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": CLASS},
            "spec": {"nodeSelector": {POOL_LABEL: "a"}}})
        say(f"creating {args.nodes} kwok nodes with {args.gpus_per_node} GPUs each")
        nodes = make_nodes(admin, args.nodes, args.gpus_per_node)
        say(f"plane ready in {time.monotonic() - started:.0f}s; API server at "
            f"{wait_quiet(plane):.2f} cores idle")

        def controller() -> Subject:
            return ControllerSubject(kubeconfig, options)

        def baseline() -> Subject:
            return BaselineSubject(kubeconfig, options, nodes)

        results = []
        for rnd in range(args.rounds):
            for make in (controller, baseline) if rnd % 2 == 0 else (baseline, controller):
                subject = make()
                namespace = f"bench-{subject.name}-{rnd + 1}"
                result = run_scenario(plane, admin, subject, namespace, counts, args.creators,
                                      args.timeout)
                say(f"{result.scenario}: {result.released}/{result.pods} released, "
                    f"{result.rate:.1f}/s; cleaning up")
                if isinstance(subject, ControllerSubject):
                    n, total = subject.release_histogram()
                    say(f"cross-check: the controller's gpuclaimctl_pod_release_seconds has {n:.0f} "
                        f"observations, mean {total / max(n, 1):.2f}s (from whole-second "
                        "creationTimestamps, so up to 1s above the watch's figures)")
                results.append(result)
                clean(admin, namespace)
                wait_quiet(plane)
        report(args, results, counts)

        if args.profile:
            say("profiled controller run (its figures are slowed by cProfile)")
            profiled_subject = ControllerSubject(kubeconfig, options, profile=args.profile)
            profiled = run_scenario(plane, admin, profiled_subject, "bench-profiled", counts,
                                    args.creators, args.timeout)
            print(f"\nprofiled controller run: {profiled.released} released, {profiled.rate:.1f}/s, "
                  f"p50 {profiled.percentile(50) * 1000:.0f} ms, CPU {profiled.usage.cpu:.1f} s")
            print_profile(profiled_subject.profiles, args.profile_top, args.profile)
            clean(admin, "bench-profiled")
    print(f"\n(run took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()
