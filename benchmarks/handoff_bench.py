"""Benchmark: the CPU a watch event costs the process on its way from the
socket to a worker, with the informer's handler on a thread of its own or
inline, beside the floor of reading and decoding the same events alone.

    python -m benchmarks.handoff_bench [--events 3000] [--interval-ms 2] [--repeat 3]

A child process writes ``--events`` pod MODIFIED events (about 3 KB of JSON
each, as the controller's pods are) to a socket, one every
``--interval-ms`` (a watch in a busy cluster: events apart, so every
thread that waits for one is woken for it). This process reads them as the
reflector reads a watch and runs one variant:

- ``read``: one thread reads and decodes each event, nothing else (the floor);
- ``threaded``: a SharedInformer whose one handler, on its own thread, adds
  the pod's key to a rate-limited queue that one worker drains (the
  controller's shape before handlers were inline);
- ``inline``: the same with the handler added ``inline`` (the controller's
  shape now).

Reported: this process's CPU (utime+stime) per event, from the first event
until the worker had the last key, and over the floor. The child's CPU is
its own and not counted. Variants run round-robin ``--repeat`` times; the
median is printed. Run it alone: the machine has 2 cores and other work
shifts the figures. Against other code (an older commit), point PYTHONPATH
at a checkout of it: a variant it cannot run is left out.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import orjson

from informers import EventHandlerFuncs, SharedInformer
from informers.listwatch import ListPage
from workqueue import RateLimitingQueue, default_controller_rate_limiter

_CHILD = r"""
import socket, sys, time
fd, n, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(fileno=fd)
lines = sys.stdin.buffer.read().split(b"\n")
sock.recv(1)  # the parent is ready
start = time.monotonic()
for i in range(n):
    sock.sendall(lines[i % len(lines)].replace(b"@RV@", str(i + 2).encode()) + b"\n")
    delay = start + (i + 1) * interval - time.monotonic()
    if delay > 0:
        time.sleep(delay)
sock.shutdown(socket.SHUT_WR)
sock.recv(1)
"""


def pod_event(i: int) -> bytes:
    """A MODIFIED event of a small gated pod (about 3 KB, as the controller
    benchmark's pods are once the API server filled in its defaults)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p-{i % 100}", "namespace": "bench", "uid": f"uid-{i % 100:08d}",
                     "resourceVersion": "@RV@", "creationTimestamp": "2026-12-02T09:00:00Z",
                     "labels": {"app": "bench", "rank": str(i % 100)},
                     "annotations": {"gpuclaimctl.io/claims": '[{"name":"gpu","count":2}]'}},
        "spec": {"schedulingGates": [{"name": "gpuclaimctl.io/claims"}],
                 "containers": [{"name": "main", "image": "registry.example.com/train:v1.2.3",
                                 "command": ["python", "-m", "train"], "args": ["--epochs", "10"],
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                                 "env": [{"name": f"VAR_{k}", "value": f"value-{k}"} for k in range(8)],
                                 "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                                   "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                                 "terminationMessagePath": "/dev/termination-log",
                                 "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
                 "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                 "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
                 "schedulerName": "default-scheduler",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300},
                                 {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}],
                 "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
                 "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                     {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                     {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                     {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                         "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]},
        "status": {"phase": "Pending", "qosClass": "Burstable",
                   "conditions": [{"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                                   "lastTransitionTime": "2026-12-02T09:00:00Z",
                                   "reason": "SchedulingGated",
                                   "message": "Scheduling is blocked due to non-empty scheduling gates"}]},
    }
    return orjson.dumps({"type": "MODIFIED", "object": pod})


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Feed:
    """The child process and the socket it writes the events to."""

    def __init__(self, events: int, interval: float) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.file = ours.makefile("rb")
        lines = b"\n".join(pod_event(i) for i in range(100))
        self.child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno()), str(events), str(interval)],
            stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        assert self.child.stdin is not None
        self.child.stdin.write(lines)
        self.child.stdin.close()

    def go(self) -> None:
        self.sock.sendall(b"g")

    def events(self) -> Iterator[tuple[str, Any]]:
        loads = orjson.loads
        for line in self.file:
            event = loads(line)
            yield event["type"], event["object"]

    def close(self) -> None:
        try:
            self.sock.sendall(b"x")  # go, if it was not told yet, or done
        except OSError:
            pass
        self.file.close()
        self.sock.close()  # a child still sending stops at once
        self.child.wait(30)


class _Watch:
    def __init__(self, events: Iterator[tuple[str, Any]] | None, stop: threading.Event) -> None:
        self._events = events
        self._stop = stop

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        if self._events is not None:
            yield from self._events
        self._stop.wait()  # the next watch: nothing more comes

    def close(self) -> None:
        self._stop.set()


class _ListerWatcher:
    supports_watch_list = False

    def __init__(self, feed: _Feed) -> None:
        self._feed: _Feed | None = feed
        self.stop = threading.Event()

    def list_page(self, *, resource_version: str, limit: int, continue_token: str,
                  transform: Any = None) -> ListPage:
        return ListPage(items=[], resource_version="1")

    def watch(self, *, resource_version: str, timeout_seconds: int,
              send_initial_events: bool = False) -> _Watch:
        feed, self._feed = self._feed, None
        return _Watch(feed.events() if feed is not None else None, self.stop)

    def abort(self) -> None:
        self.stop.set()


def run_read(events: int, interval: float) -> float:
    feed = _Feed(events, interval)
    c0 = cpu()
    feed.go()
    n = sum(1 for _ in feed.events())
    used = cpu() - c0
    feed.close()
    assert n == events, n
    return used


def run_informer(events: int, interval: float, inline: bool) -> float | None:
    feed = _Feed(events, interval)
    lw = _ListerWatcher(feed)
    informer = SharedInformer(lw, name="handoff-bench")
    queue: RateLimitingQueue[str] = RateLimitingQueue(default_controller_rate_limiter(), name="bench")
    got = [0]
    done = threading.Event()

    def on_update(_old: Any, new: Any) -> None:
        queue.add(new["metadata"]["name"] + new["metadata"]["resourceVersion"])

    def work() -> None:
        while True:
            key, shutdown = queue.get()
            if shutdown:
                return
            got[0] += 1
            queue.done(key)
            if got[0] >= events - 100:  # the first 100 are adds
                done.set()

    handler = EventHandlerFuncs(add=lambda obj: on_update(None, obj), update=on_update)
    try:
        informer.add_event_handler(handler, name="bench", **({"inline": True} if inline else {}))
    except TypeError:
        feed.close()
        return None  # older code: no inline handlers
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    informer.start()
    if not informer.wait_for_sync(30):
        raise RuntimeError("the informer did not sync")
    c0 = cpu()
    feed.go()
    if not done.wait(events * interval + 60):
        raise RuntimeError(f"only {got[0]} of {events} keys reached the worker")
    used = cpu() - c0
    informer.stop()
    queue.shut_down()
    worker.join(10)
    feed.close()
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    interval = args.interval_ms / 1000
    results: dict[str, list[float]] = {"read": [], "threaded": [], "inline": []}
    for _ in range(args.repeat):
        results["read"].append(run_read(args.events, interval))
        for name, inline in (("threaded", False), ("inline", True)):
            used = run_informer(args.events, interval, inline)
            if used is not None:
                results[name].append(used)
    load = os.getloadavg()
    print(f"{args.events} watch events, one every {args.interval_ms:g} ms; median of {args.repeat}; "
          f"{os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    floor = statistics.median(results["read"]) / args.events * 1e6
    print(f"  {'variant':<10} {'CPU us/event':>13} {'over read':>10}")
    for name, runs in results.items():
        if not runs:
            print(f"  {name:<10} {'(not in this code)':>24}")
            continue
        per = statistics.median(runs) / args.events * 1e6
        print(f"  {name:<10} {per:>13.1f} {per - floor:>10.1f}")


if __name__ == "__main__":
    main()
