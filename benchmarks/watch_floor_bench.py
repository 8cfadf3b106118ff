"""Benchmark: the CPU one pod watch event costs the thread that reads it,
over TLS from the plane's kube-apiserver, from a bare socket reader up to
the controller's informer.

    python -m benchmarks.watch_floor_bench [--pods 1000] [--rate 100] [--variants socket,stream,informer,queue]

A child process creates ``--pods`` gated pods (the controller benchmark's
manifest), one request after another, then patches each of them three
times at ``--rate`` patches/s: four watch events per pod, as the pods of
``make bench-controller`` bring the controller (added, released, bound,
running). This process watches the namespace and, per variant, counts the
CPU (utime+stime, /proc/self/task/<tid>/stat) of the one thread that reads
the watch, from before the first create until it had the last event:

- ``socket``: ``recv_into`` on the TLS socket under the watch response,
  events cut out of the chunked body by hand (no checks), orjson, and the
  controller's pod transform (``model.podcache.prune_pod``): the floor;
- ``stream``: ``informers.api.HttpWatchStream`` (what the reflector reads)
  and the same transform;
- ``informer``: a SharedInformer for pods with the controller's transforms
  (pruning, then the Compactor) and one inline handler that counts;
- ``queue``: the same handler also adds each pod's key to a work queue that
  one worker drains (the worker's CPU is printed apart).

Each variant gets a namespace of its own on one plane, in turn. It never
fails on a figure. The point of the figures: what reading a watch event
costs a CPython process at all, beside what the controller adds to it;
``make bench-controller`` counts six watch events per pod (four of the pod,
two of its claim) inside its CPU per pod.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from typing import Any, Callable

import orjson

from benchmarks.benchkit import REPO, make_namespace, new_client, say
from gpuclaimctl.controlplane.plane import ControlPlane
from gpuclaimctl.model.podcache import prune_pod
from informers import PODS, EventHandlerFuncs, SharedInformerFactory
from informers.api import HttpWatchStream, RawClient
from workqueue import RateLimitingQueue, default_controller_rate_limiter

VARIANTS = ("socket", "stream", "informer", "queue")
EVENTS_PER_POD = 4
TICK = os.sysconf("SC_CLK_TCK")

# Creates the pods, then patches each three times at the given rate.
_CHILD = r"""
import sys, time
from benchmarks.benchkit import new_client
from benchmarks.controller_bench import pod_manifest
from gpuclaimctl.client import kube
api = new_client(sys.argv[1], 4)
pods, rate, ns = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
for i in range(pods):
    kube.request(api, "POST", f"/api/v1/namespaces/{ns}/pods", body=pod_manifest(f"w{i}", ns, 1))
start, sent = time.monotonic(), 0
for step in range(3):
    for i in range(pods):
        kube.request(api, "PATCH", f"/api/v1/namespaces/{ns}/pods/w{i}",
                     body={"metadata": {"annotations": {"step": str(step)}}},
                     content_type="application/merge-patch+json")
        sent += 1
        delay = start + sent / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
"""


def thread_figures(tid: int) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of this process's thread `tid`."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    switches = 0
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                switches = int(line.split()[1])
    return (int(fields[11]) + int(fields[12])) / TICK, switches


class Counter:
    """Counts events; `done` once `total` arrived."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.seen = 0
        self.done = threading.Event()

    def __call__(self, _obj: Any) -> None:
        self.seen += 1
        if self.seen >= self.total:
            self.done.set()


def _watch(api: Any, ns: str, window: float) -> HttpWatchStream:
    resp = RawClient(api).get(f"/api/v1/namespaces/{ns}/pods",
                              [("watch", "1"), ("timeoutSeconds", "900")], read_timeout=900)
    return HttpWatchStream(resp, gather=window)


def _read_socket(stream: HttpWatchStream, on: Callable[[Any], None], done: threading.Event) -> None:
    sock = stream._resp._fp.fp.raw._sock  # type: ignore[attr-defined]  # the TLS socket
    buf = bytearray(1 << 16)
    rest = b""
    while not done.is_set():
        n = sock.recv_into(buf)
        if not n:
            return
        parts = (rest + bytes(buf[:n])).split(b"\r\n")
        rest = parts.pop()
        for part in parts:
            if part.startswith(b"{"):  # not a chunk-size line
                on(prune_pod(orjson.loads(part)["object"]))


def _read_stream(stream: HttpWatchStream, on: Callable[[Any], None], done: threading.Event) -> None:
    for _etype, obj in stream:
        on(prune_pod(obj))
        if done.is_set():
            return


def run_variant(plane: ControlPlane, variant: str, pods: int, rate: float, window: float) -> str:
    ns = f"floor-{variant}"
    api = new_client(str(plane.kubeconfig), 4)
    make_namespace(api, ns)
    counter = Counter(EVENTS_PER_POD * pods)
    hold = threading.Event()  # keeps a reader's thread (and its /proc entry) until measured
    worker: threading.Thread | None = None
    queue: RateLimitingQueue[str] | None = None
    factory: SharedInformerFactory | None = None
    stream: HttpWatchStream | None = None
    if variant in ("socket", "stream"):
        stream = opened = _watch(api, ns, window)  # open (its answer's head read) before the first create
        read = _read_socket if variant == "socket" else _read_stream

        def body() -> None:
            try:
                read(opened, counter, counter.done)
            finally:
                hold.wait(60)

        reader = threading.Thread(target=body, name=f"{variant}-reader", daemon=True)
        reader.start()
    else:
        # The controller's pod transforms: pruning, then the Compactor. One
        # namespace, this variant's: the events are the same as cluster-wide.
        factory = SharedInformerFactory(api, namespace=ns, transforms={PODS: prune_pod},
                                        watch_batch_window=window)
        informer = factory.informer_for(PODS)
        handler: Callable[[Any], None] = counter
        if variant == "queue":
            q: RateLimitingQueue[str] = RateLimitingQueue(default_controller_rate_limiter(), name="")
            queue = q

            def handler(obj: Any) -> None:
                q.add(obj["metadata"]["name"])
                counter(obj)

            def drain() -> None:
                while True:
                    key, shutdown = q.get()
                    if shutdown:
                        return
                    q.done(key)  # type: ignore[arg-type]

            worker = threading.Thread(target=drain, name="worker", daemon=True)
            worker.start()
        informer.add_event_handler(EventHandlerFuncs(add=handler, update=lambda _o, n: handler(n)),
                                   inline=True)
        factory.start()
        informer.wait_for_sync(60)  # the namespace is new: its list adds nothing
        reader = next(t for t in threading.enumerate() if t.name == f"{PODS}:reflector")
    assert reader.native_id is not None
    cpu0, sw0 = thread_figures(reader.native_id)
    w0 = thread_figures(worker.native_id)[0] if worker is not None and worker.native_id else 0.0
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(plane.kubeconfig), str(pods), str(rate), ns],
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    finished = counter.done.wait(60 + 4 * pods / rate)
    cpu1, sw1 = thread_figures(reader.native_id)
    w1 = thread_figures(worker.native_id)[0] if worker is not None and worker.native_id else 0.0
    child.wait(60)
    hold.set()
    if stream is not None:
        stream.close()
    if queue is not None:
        queue.shut_down()
    if factory is not None:
        factory.shutdown()
    n = max(counter.seen, 1)
    note = "" if finished else f"  (only {counter.seen} of {counter.total} events arrived)"
    worker_part = f"{1e6 * (w1 - w0) / n:10.0f}" if worker is not None else f"{'-':>10}"
    return (f"  {variant:<10} {1e6 * (cpu1 - cpu0) / n:12.0f} {(sw1 - sw0) / n:12.2f} {worker_part}"
            f" {counter.seen:8d}{note}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="patches per second")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch-window", type=float, default=0.0,
                        help="seconds events may gather before a read (--watch-batch-window); "
                             "not for the socket variant")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"watch_floor_bench: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    with ControlPlane(log=lambda m: say(f"[plane] {m}")) as plane:
        rows = [run_variant(plane, v, args.pods, args.rate, args.batch_window) for v in variants]
    print(f"{args.pods} pods x {EVENTS_PER_POD} watch events (creates back to back, then patches at "
          f"{args.rate:g}/s; batch window {args.batch_window:g}s); {os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  {'variant':<10} {'reader us/ev':>12} {'blocks/ev':>12} {'worker us':>10} {'events':>8}")
    for row in rows:
        print(row)
    print("reader: CPU of the thread reading the watch per event; blocks: its voluntary context "
          "switches per event (each a wait for the socket); worker: the queue's worker, per event")


if __name__ == "__main__":
    main()
