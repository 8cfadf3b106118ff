"""What releases the pods in `make bench-controller`: the controller as a
process of its own at given flags (or in this process, profiled), and the
baseline -- a process with the controller's shape and writes and none of its
decisions (`BaselineWorkers`), started as `python -m benchmarks.controller_bench
--serve-baseline`.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.benchkit import CLAIMS, POOL_LABEL, REPO, new_client, poll, post, say, wait_until
from gpuclaimctl.client import kube
from gpuclaimctl.client.writer import AlreadyExists, Writer
from gpuclaimctl.cmd import app
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.decide.podplan import bound_claim, release_patch
from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import has_gate, pod_claims, template_claim
from informers import PODS, EventHandlerFuncs, SharedInformerFactory
from metrics.workqueue import PrometheusWorkqueueMetricsProvider
from workqueue import RateLimitingQueue, default_controller_rate_limiter

Obj = dict[str, Any]
CONTROLLER_AGENT = "gpuclaimctl/"
BASELINE_AGENT = "controller-bench-baseline/"
DEFAULTS = Options()
SUBJECT_START_TIMEOUT = 90.0


class Subject:
    """A process (or, profiled, this one) that releases gated pods."""

    name = ""
    agent = ""
    pid = 0
    log: Path | None = None

    def start(self) -> None: ...

    def alive(self) -> bool:
        return True

    def stop(self) -> None: ...

    def retries(self) -> float | None:
        return None

    def syncs(self) -> dict[str, float]:
        """Syncs done so far, by key kind (the controller's metric; {} for others)."""
        return {}

    def tail(self, lines: int = 15) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _die_with_parent() -> None:
    # In the child before exec: the kernel kills it if this process dies.
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess(Subject):
    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self._argv, self.log, self._log = name, argv, log, log
        self._popen: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with open(self._log, "ab") as out:
            out.write(f"=== {' '.join(self._argv)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(
                self._argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1"),
                preexec_fn=_die_with_parent)
        self.pid = self._popen.pid

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def wait_ready(self, ready: Callable[[], bool]) -> None:
        if not wait_until(lambda: not self.alive() or ready(), SUBJECT_START_TIMEOUT, 0.2) \
                or not self.alive():
            raise RuntimeError(f"{self.name} did not become ready; its log:\n{self.tail()}")

    def stop(self, grace: float = DEFAULTS.shutdown_timeout + 10) -> None:
        """SIGTERM, then SIGKILL after `grace`; never raises."""
        p = self._popen
        if p is None:
            return
        try:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    say(f"{self.name} ignored SIGTERM for {grace:.0f}s; killing it")
                    p.kill()
                    p.wait(30)
        except (OSError, subprocess.SubprocessError) as e:
            say(f"stopping {self.name}: {e}")


class ControllerProcess(ChildProcess):
    """`gpuclaimctl run --kubeconfig ... <flags>`, endpoints on loopback."""

    agent = CONTROLLER_AGENT

    def __init__(self, name: str, kubeconfig: str, workdir: Path, flags: list[str]) -> None:
        self.metrics_port, self.health_port = _free_port(), _free_port()
        # `python -m gpuclaimctl`, as the tests start it: the venv's console
        # script is only as current as the last `pip install -e .`.
        # The plane registers no admission webhook (as `--local` does not):
        # the pods come with their gate, and the webhook's port and
        # readiness would only get in the way of several processes.
        webhook = ["--webhook-bind-address", "0"] if "webhook_bind_address" in Options.__dataclass_fields__ \
            else []
        super().__init__(name, [sys.executable, "-m", "gpuclaimctl", "run", "--kubeconfig", kubeconfig,
                                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                                "--health-bind-address", f"127.0.0.1:{self.health_port}",
                                *webhook, *flags],
                         workdir / f"{name}.log")

    def start(self) -> None:
        self.spawn()
        self.wait_ready(lambda: self._get(self.health_port, "/readyz") is not None)

    @staticmethod
    def _get(port: int, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read().decode() if r.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None

    def _samples(self, name: str) -> Iterator[Any]:
        """The samples named `name` the process exports now (none once it is gone)."""
        text = self._get(self.metrics_port, "/metrics") if self.alive() else None
        for family in text_string_to_metric_families(text or ""):
            yield from (s for s in family.samples if s.name == name)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        for s in self._samples(name):
            if all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return float(s.value)
        return None

    def retries(self) -> float | None:
        return self.sample("workqueue_retries_total", {"name": "gpuclaimctl"})

    def syncs(self, what: str = "count") -> dict[str, float]:
        """Syncs done so far by key kind, or with `what` "sum" the seconds they took."""
        out: dict[str, float] = {}
        for s in self._samples(f"gpuclaimctl_sync_duration_seconds_{what}"):
            kind = s.labels.get("kind", "")
            out[kind] = out.get(kind, 0.0) + s.value
        return out


class BaselineProcess(ChildProcess):
    """This module with --serve-baseline: BaselineWorkers in a process of its own."""

    agent = BASELINE_AGENT

    def __init__(self, name: str, kubeconfig: str, workdir: Path, workers: int, qps: float) -> None:
        self.ready_file = workdir / f"{name}.ready"
        super().__init__(name, [sys.executable, "-m", "benchmarks.controller_bench",
                                "--serve-baseline", kubeconfig, "--ready-file", str(self.ready_file),
                                "--workers", str(workers), "--qps", str(qps)],
                         workdir / f"{name}.log")

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        self.spawn()
        self.wait_ready(self.ready_file.exists)


class BaselineWorkers:
    """The controller's shape and writes without its decisions.

    A pod informer and one rate-limited queue feed `workers` threads; a sync
    makes the four writes the controller makes for a pod with one inline
    claim: create the claim (the same body), write its status Bound with
    reservedFor on the next node round-robin, release the pod with the same
    JSON patch (gate removed, node pinned, node annotation, tests of what was
    read), post a Normal event. Progress per pod is kept in memory so a
    retried sync resumes where it stopped, as the controller resumes from
    its cache.
    """

    def __init__(self, api_client: client.ApiClient, workers: int, qps: float, nodes: list[str]) -> None:
        self.workers = workers
        self.api_client = api_client
        self.registry = CollectorRegistry()
        self.factory = SharedInformerFactory(api_client, default_resync_period=0.0)
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name="baseline",
            metrics_provider=PrometheusWorkqueueMetricsProvider(self.registry))
        self.writer = Writer(api_client, limiter=kube.TokenBucket(qps, int(qps * 2)))
        self.pods = self.factory.pods()
        self._nodes = itertools.cycle(nodes)
        self._nodes_lock = threading.Lock()
        self._bound: dict[str, tuple[str, set[str]]] = {}  # pod uid -> (node, claims written)
        self._threads: list[threading.Thread] = []
        informer = self.factory.informer_for(PODS)
        self._registration = informer.add_event_handler(
            EventHandlerFuncs(add=self._changed, update=lambda _o, n: self._changed(n)),
            name="baseline-pods", inline=True)  # as the controller's handlers are

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
        self.writer.patch_pod(ns, name, release_patch(pod, node))
        self.writer.event({"apiVersion": "v1", "kind": "Pod", "metadata": meta}, "Normal", "Placed",
                          f"GPU claims placed on node {node}: round-robin")


def serve_baseline(kubeconfig: str, ready_file: str, workers: int, qps: float) -> None:
    """The baseline process: run BaselineWorkers until SIGTERM."""
    api_client = new_client(kubeconfig, max(16, workers * 2 + 8), f"{BASELINE_AGENT}1 {os.getpid()}")
    nodes = sorted(n["metadata"]["name"] for n in kube.request_json(
        api_client, "GET", "/api/v1/nodes", query=[("labelSelector", f"{POOL_LABEL}=a")])["items"])
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    workers_ = BaselineWorkers(api_client, workers, qps, nodes)
    workers_.start()
    Path(ready_file).write_text("ready\n")
    done.wait()
    workers_.stop()
    retries = workers_.registry.get_sample_value("workqueue_retries_total", {"name": "baseline"})
    say(f"baseline: stopped; {retries or 0:.0f} retries")


class InProcessController(Subject):
    """The controller as `gpuclaimctl run` builds it, in this process, with
    cProfile on every thread it starts (for --profile only)."""

    agent = CONTROLLER_AGENT

    def __init__(self, kubeconfig: str, options: Options, clock: str) -> None:
        self.name, self.pid, self.options = "profiled", os.getpid(), options
        self.api_client = new_client(kubeconfig, max(16, options.workers * 2 + 8),
                                     app.user_agent("controller-bench-profiled"))
        self.factory, self.controller = app.build(self.api_client, options, CollectorRegistry())
        self.profiles: list[tuple[str, cProfile.Profile]] = []
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        timer = time.thread_time if self._clock == "cpu" else time.perf_counter

        def bootstrap(_frame: Any, _event: str, _arg: Any) -> None:
            p = cProfile.Profile(timer)
            self.profiles.append((threading.current_thread().name, p))
            p.enable()

        # Every thread started from here on (informers, handlers, queue,
        # workers) enables its own profiler on its first profiled event.
        threading.setprofile(bootstrap)
        try:
            self.factory.start()
            poll(self.controller.has_synced, 60, "the controller's caches to sync")
            self._thread = threading.Thread(target=self.controller.run, name="controller-run",
                                            args=(self.options.workers, self._stop), daemon=True)
            self._thread.start()
            poll(lambda: len(self.controller._workers) == self.options.workers, 10, "workers")
        finally:
            threading.setprofile(None)  # later threads are not the controller's

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.factory.shutdown()
