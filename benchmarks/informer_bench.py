"""Benchmark: initial sync and watch throughput of the informers against a real API server.

    python -m benchmarks.informer_bench [--pods 20000] [--repeat 3]

Starts its own control plane (etcd + kube-apiserver), creates the pods (gated
GPU pods in 20 namespaces, shaped like the ones gpuclaimctl handles), then
runs each variant in a fresh subprocess so CPU and RSS are its own:

- ``informers``: this package's SharedInformer for pods, transform dropping
  managedFields, one handler; synced = the handler got every initial add.
- ``official``: the official client's ``kubernetes.informer.SharedInformer``
  over ``list_pod_for_all_namespaces`` (models); synced = every ADDED fired.
- ``limit``: the same HTTP requests as ``informers`` plus the same orjson
  decode, keeping nothing: what no informer can beat.

Each is run for the initial list client-go uses (resourceVersion "0", from
the watch cache; the server ignores the page size) and, for ours and the
limit, for a quorum list in pages of 500 (resourceVersion ""). Then the
watch: the informer's watch is held at a gate while the pods are updated,
and the backlog is timed until applied to the cache and dispatched to the
handler; the same events replayed in-process time our side alone.

The figures are printed, medians of ``--repeat`` runs; nothing fails on a
time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

GATE = "gpuclaimctl.io/claims"
NAMESPACES = 20
PAGE_SIZE = 500


# -- measuring ---------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def api_client_for(kubeconfig: str) -> Any:
    from kubernetes import config

    # connection_pool_maxsize: the creating threads share one pool.
    api = config.new_client_from_config(config_file=kubeconfig)
    return api


# -- making the pods -----------------------------------------------------------


def pod_manifest(i: int, namespace: str) -> dict[str, Any]:
    app = f"train-{i % 50}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{i:06d}",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": f"{(i % 50) * 7919 % 100000:05d}", "tier": "gpu"},
            "annotations": {GATE: json.dumps([{"name": "gpu", "className": "a100", "count": 1}])},
        },
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/ml/train:v1.4.2",
                    "args": ["--epochs", "10"],
                    "env": [{"name": "MODEL", "value": "resnet50"}],
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"},
                        "limits": {"memory": "16Gi"},
                    },
                }
            ],
            "terminationGracePeriodSeconds": 5,
        },
    }


class Writer:
    """POST/PATCH with the admin credentials, through the client's pool, no models."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._pool = api.rest_client.pool_manager
        self._host = api.configuration.host

    def _headers(self, content_type: str) -> dict[str, str]:
        h = {"Content-Type": content_type, "Accept": "application/json"}
        self._api.update_params_for_auth(h, [], ["BearerToken"], "", "POST", None)
        return h

    def request(self, method: str, path: str, body: Any, content_type: str = "application/json") -> int:
        resp = self._pool.request(
            method, self._host + path, body=orjson.dumps(body), headers=self._headers(content_type),
            preload_content=True, retries=3,
        )
        if resp.status >= 300 and resp.status != 409:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:300]!r}")
        return int(resp.status)


def namespaces() -> list[str]:
    return [f"bench-{n:02d}" for n in range(NAMESPACES)]


def create_pods(api: Any, count: int, threads: int = 16) -> float:
    w = Writer(api)
    for ns in namespaces():
        w.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        # Nothing makes the default service account without a controller
        # manager, and the API server refuses pods that would use it.
        w.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
    nss = namespaces()
    started = time.perf_counter()

    def make(i: int) -> None:
        ns = nss[i % NAMESPACES]
        w.request("POST", f"/api/v1/namespaces/{ns}/pods", pod_manifest(i, ns))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(make, range(count), chunksize=64))
    return time.perf_counter() - started


def update_pods(api: Any, names: list[tuple[str, str]], round_: int, threads: int = 16) -> None:
    w = Writer(api)

    def patch(item: tuple[str, str]) -> None:
        ns, name = item
        w.request(
            "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
            {"metadata": {"labels": {"round": str(round_)}}}, "application/merge-patch+json",
        )

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(patch, names, chunksize=64))


# -- the variants (each in its own process) -----------------------------------


def warm_up(api: Any) -> None:
    """One tiny request first, so the TLS setup and the connection are not
    counted as memory held by the cached pods."""
    from informers import PODS
    from informers.api import RawClient

    resp = RawClient(api).get(PODS.collection_path(), [("limit", "1")], read_timeout=60)
    resp.read()
    resp.release_conn()


def run_informers(api: Any, expected: int, initial_rv: str, compact: bool = True) -> dict[str, Any]:
    from informers import PODS, Compactor, EventHandlerFuncs, SharedInformer, chain, strip_managed_fields
    from informers.api import RawClient, ResourceListerWatcher

    adds = [0]

    def on_add(obj: dict[str, Any]) -> None:
        adds[0] += 1

    warm_up(api)
    gc.collect()
    base = rss_bytes()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    inf = SharedInformer(
        ResourceListerWatcher(RawClient(api), PODS),
        name="pods",
        # What the factory does by default.
        transform=chain(strip_managed_fields, Compactor()) if compact else strip_managed_fields,
        page_size=PAGE_SIZE,
        initial_resource_version=initial_rv,
    )
    reg = inf.add_event_handler(EventHandlerFuncs(add=on_add))
    inf.start()
    if not reg.wait_for_sync(600):
        raise RuntimeError("informer did not sync")
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    n = len(inf.indexer)
    inf.stop()
    gc.collect()
    held = rss_bytes() - base
    peak = peak_rss_bytes()  # before deep_size, whose bookkeeping is big
    return {
        "sync_s": elapsed, "cpu_s": cpu, "peak_rss": peak, "objects": n,
        "bytes_per_object": held / n, "handler_adds": adds[0], "pages": inf.reflector.stats.last_list_pages,
        "deep_bytes_per_object": deep_size(inf.indexer.list()) / n,
    }


def run_official(api: Any, expected: int, initial_rv: str) -> dict[str, Any]:
    from kubernetes import client
    from kubernetes.informer import ADDED, SharedInformer

    done = threading.Event()
    adds = [0]

    def on_add(obj: Any) -> None:
        adds[0] += 1
        if adds[0] >= expected:
            done.set()

    warm_up(api)
    gc.collect()
    base = rss_bytes()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    inf = SharedInformer(client.CoreV1Api(api).list_pod_for_all_namespaces)
    inf.add_event_handler(ADDED, on_add)
    inf.start()
    if not done.wait(1800):
        raise RuntimeError("official informer did not sync")
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    n = len(inf.cache.list_keys())
    gc.collect()
    held = rss_bytes() - base
    result = {
        "sync_s": elapsed, "cpu_s": cpu, "peak_rss": peak_rss_bytes(), "objects": n,
        "bytes_per_object": held / n, "handler_adds": adds[0], "pages": 1,
    }
    # Its stop() joins a watch that only a server timeout ends: exit instead.
    return result


def run_limit(api: Any, expected: int, initial_rv: str, streamed: bool = False) -> dict[str, Any]:
    """The same requests, each answer read whole and decoded whole (or, with
    ``streamed``, decoded item by item as the informer does), keeping nothing."""
    from informers import PODS
    from informers.api import RawClient, ResourceListerWatcher, decode

    raw = RawClient(api)
    lw = ResourceListerWatcher(raw, PODS)
    empty: dict[str, Any] = {}
    gc.collect()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    n, pages, token = 0, 0, ""
    while True:
        if streamed:
            page = lw.list_page(resource_version="" if token else initial_rv, limit=PAGE_SIZE,
                                continue_token=token, transform=lambda o: empty)
            count, token = len(page.items), page.continue_token
        else:
            params = [("limit", str(PAGE_SIZE))]
            if token:
                params.append(("continue", token))
            elif initial_rv:
                params.append(("resourceVersion", initial_rv))
            resp = raw.get(PODS.collection_path(), params, read_timeout=120)
            body = resp.read()
            resp.release_conn()
            data = decode(body)
            count, token = len(data["items"]), data["metadata"].get("continue", "")
            del data, body
        n += count
        pages += 1
        if not token:
            break
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"sync_s": elapsed, "cpu_s": cpu, "peak_rss": peak_rss_bytes(), "objects": n, "pages": pages}


def run_limit_streamed(api: Any, expected: int, initial_rv: str) -> dict[str, Any]:
    return run_limit(api, expected, initial_rv, streamed=True)


def deep_size(objs: list[Any]) -> int:
    """Bytes of the Python objects reachable from ``objs``, each counted once."""
    seen: set[int] = set()
    total = 0
    stack: list[Any] = list(objs)
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return total


def run_watch(api: Any, expected: int, initial_rv: str, updates: int) -> dict[str, Any]:
    """Hold the watch at a gate, update ``updates`` pods, then time the backlog."""
    from informers import PODS, Compactor, EventHandlerFuncs, SharedInformer, chain, strip_managed_fields
    from informers.api import RawClient, ResourceListerWatcher
    from informers.testing import GatedListerWatcher

    gated = GatedListerWatcher(ResourceListerWatcher(RawClient(api), PODS))
    updated = [0]

    def on_update(old: dict[str, Any], new: dict[str, Any]) -> None:
        updated[0] += 1

    # Short watches, so the gate is reached soon after it closes.
    inf = SharedInformer(gated, name="pods", transform=chain(strip_managed_fields, Compactor()),
                         min_watch_timeout=3)
    inf.add_event_handler(EventHandlerFuncs(update=on_update))
    inf.start()
    if not inf.wait_for_sync(600):
        raise RuntimeError("informer did not sync")
    names = sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in inf.indexer.list())[:updates]
    gated.close_gate()
    if not gated.waiting.wait(60):
        raise RuntimeError("the watch did not reach the gate")
    update_pods(api, names, time.time_ns() % 10**9)  # a new value each run, so each patch is a change
    events0, cpu0, t0 = inf.reflector.stats.events, cpu_seconds(), time.perf_counter()
    gated.open_gate()
    applied_at = dispatched_at = 0.0
    while not dispatched_at:
        now = time.perf_counter()
        if not applied_at and inf.reflector.stats.events - events0 >= updates and len(inf._fifo) == 0:
            applied_at = now
        if updated[0] >= updates:
            dispatched_at = now
            applied_at = applied_at or now
        if now - t0 > 600:
            raise RuntimeError(f"watch backlog not drained: {updated[0]}/{updates}")
        time.sleep(0.002)
    cpu = cpu_seconds() - cpu0
    inf.stop()
    return {
        "events": updates,
        "applied_per_s": updates / (applied_at - t0),
        "dispatched_per_s": updates / (dispatched_at - t0),
        "cpu_s": cpu,
    }


def run_replay(api: Any, expected: int, initial_rv: str, updates: int) -> dict[str, Any]:
    """The same kind of events fed from memory: decode, transform, apply, dispatch."""
    from informers import PODS, Compactor, EventHandlerFuncs, SharedInformer, chain, strip_managed_fields
    from informers.api import RawClient, ResourceListerWatcher
    from informers.listwatch import ListPage

    real = ResourceListerWatcher(RawClient(api), PODS)
    listed = real.list_page(resource_version="0", limit=0, continue_token="")
    items = listed.items[:updates]
    base_rv = int(listed.resource_version)
    # The cache starts with the objects as listed; each event changes one
    # (a new label and resourceVersion, so it is an update, not a resync).
    first = ListPage(items=[orjson.loads(orjson.dumps(o)) for o in items], resource_version=str(base_rv))
    lines = []
    for k, obj in enumerate(items):
        obj["metadata"].setdefault("labels", {})["round"] = "2"
        obj["metadata"]["resourceVersion"] = str(base_rv + 1 + k)
        lines.append(orjson.dumps({"type": "MODIFIED", "object": obj}))
    del items, listed
    go = threading.Event()

    class Replay:
        def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
            go.wait()
            loads = orjson.loads
            for line in lines:
                e = loads(line)
                yield e["type"], e["object"]
            threading.Event().wait()  # then idle like a quiet watch

        def close(self) -> None:
            pass

    class ReplayLW:
        def list_page(self, **kw: Any) -> ListPage:
            return first

        def watch(self, **kw: Any) -> Replay:
            return Replay()

        def abort(self) -> None:
            pass

    updated = [0]
    inf = SharedInformer(ReplayLW(), name="replay", transform=chain(strip_managed_fields, Compactor()))
    inf.add_event_handler(EventHandlerFuncs(update=lambda a, b: updated.__setitem__(0, updated[0] + 1)))
    inf.start()
    inf.wait_for_sync(60)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    go.set()
    applied_at = 0.0
    while updated[0] < len(lines):
        if not applied_at and inf.reflector.stats.events >= len(lines) and len(inf._fifo) == 0:
            applied_at = time.perf_counter()
        time.sleep(0.001)
    dispatched_at = time.perf_counter()
    cpu = cpu_seconds() - cpu0
    return {
        "events": len(lines),
        "applied_per_s": len(lines) / ((applied_at or dispatched_at) - t0),
        "dispatched_per_s": len(lines) / (dispatched_at - t0),
        "cpu_s": cpu,
    }


def run_informers_uncompacted(api: Any, expected: int, initial_rv: str) -> dict[str, Any]:
    return run_informers(api, expected, initial_rv, compact=False)


VARIANTS: dict[str, Callable[..., dict[str, Any]]] = {
    "informers": run_informers,
    "no-compact": run_informers_uncompacted,
    "official": run_official,
    "limit": run_limit,
    "limit-stream": run_limit_streamed,
    "watch": run_watch,
    "replay": run_replay,
}


def child(args: argparse.Namespace) -> None:
    api = api_client_for(args.kubeconfig)
    fn = VARIANTS[args.child]
    kwargs: dict[str, Any] = {}
    if args.child in ("watch", "replay"):
        kwargs["updates"] = args.updates
    result = fn(api, args.pods, args.initial_rv, **kwargs)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the official informer's thread would block a normal exit


def run_child(kubeconfig: Path, variant: str, pods: int, initial_rv: str, updates: int) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "benchmarks.informer_bench", "--child", variant,
        "--kubeconfig", str(kubeconfig), "--pods", str(pods), "--initial-rv", initial_rv,
        "--updates", str(updates),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                         cwd=Path(__file__).resolve().parent.parent)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT "):])
            return result
    raise RuntimeError(f"{variant} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


# -- the report ----------------------------------------------------------------


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        values = [r[k] for r in runs]
        out[k] = statistics.median(values) if isinstance(values[0], (int, float)) else values[0]
    out["sync_s_best"] = min(r.get("sync_s", 0.0) for r in runs)
    return out


def pod_weights(api: Any) -> dict[str, float]:
    from informers import PODS, strip_managed_fields
    from informers.api import RawClient

    resp = RawClient(api).get(PODS.collection_path("bench-00"), [("limit", "200")], read_timeout=60)
    body = resp.read()
    resp.release_conn()
    items = orjson.loads(body)["items"]
    raw = sum(len(orjson.dumps(o)) for o in items) / len(items)
    stripped = sum(len(orjson.dumps(strip_managed_fields(o))) for o in items) / len(items)
    return {"json_bytes": raw, "json_bytes_after_transform": stripped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--skip-official", action="store_true", help="the slow baseline")
    parser.add_argument("--existing", metavar="KUBECONFIG",
                        help="measure a cluster that already has the pods (e.g. kept from an earlier run)")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--initial-rv", default="0", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    if args.existing:
        # A cluster from an earlier run that has the pods already.
        measure(args, Path(args.existing), None)
        return
    from gpuclaimctl.controlplane import ControlPlane

    with ControlPlane(log=lambda m: print(f"[plane] {m}", file=sys.stderr)) as plane:
        api = api_client_for(str(plane.kubeconfig))
        took = create_pods(api, args.pods)
        measure(args, plane.kubeconfig, took)


def measure(args: argparse.Namespace, kubeconfig: Path, took: float | None) -> None:
    api = api_client_for(str(kubeconfig))
    if took is not None:
        print(f"created {args.pods} pods in {took:.1f}s ({args.pods / took:.0f}/s)")
    weights = pod_weights(api)
    plan = [("limit", "0"), ("limit-stream", "0"), ("informers", "0"), ("no-compact", "0")]
    if not args.skip_official:
        plan.append(("official", "0"))
    plan += [("limit", ""), ("limit-stream", ""), ("informers", "")]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {p: [] for p in plan}
    # Round-robin, so a busy spell of the machine hits every variant alike.
    for _ in range(args.repeat):
        for variant, rv in plan:
            r = run_child(kubeconfig, variant, args.pods, rv, args.updates)
            runs[(variant, rv)].append(r)
            print(f"  {variant:10} rv={rv!r:4} sync {r['sync_s']:.2f}s", file=sys.stderr)
    rows = [(v, rv, median_of(runs[(v, rv)])) for v, rv in plan]
    watch = median_of([run_child(kubeconfig, "watch", args.pods, "0", args.updates)
                       for _ in range(args.repeat)])
    replay = median_of([run_child(kubeconfig, "replay", args.pods, "0", args.updates)
                        for _ in range(args.repeat)])
    report(args, weights, rows, watch, replay)


def report(args: argparse.Namespace, weights: dict[str, float], rows: list[tuple[str, str, dict[str, Any]]],
           watch: dict[str, Any], replay: dict[str, Any]) -> None:
    print()
    print(f"initial sync of {args.pods} pods (median and best of {args.repeat} runs, "
          "round-robin, each in a fresh process)")
    print(f"a pod weighs {weights['json_bytes']:.0f} B as JSON, "
          f"{weights['json_bytes_after_transform']:.0f} B without managedFields")
    header = (f"{'variant':12} {'list':14} {'pages':>5} {'sync s':>7} {'best s':>7} {'cpu s':>7} "
              f"{'peak RSS MB':>11} {'B/pod RSS':>9} {'B/pod deep':>10} {'vs limit':>8}")
    print(header)
    print("-" * len(header))
    limits = {rv: r["sync_s"] for v, rv, r in rows if v == "limit"}
    for variant, rv, r in rows:
        listing = "watch cache" if rv == "0" else "quorum, paged"
        per_pod = f"{r['bytes_per_object']:.0f}" if "bytes_per_object" in r else "-"
        deep = f"{r['deep_bytes_per_object']:.0f}" if "deep_bytes_per_object" in r else "-"
        ratio = r["sync_s"] / limits[rv] if rv in limits else float("nan")
        print(f"{variant:12} {listing:14} {r['pages']:>5} {r['sync_s']:>7.2f} {r['sync_s_best']:>7.2f} {r['cpu_s']:>7.2f} "
              f"{r['peak_rss'] / 2**20:>11.0f} {per_pod:>9} {deep:>10} {ratio:>7.2f}x")
    ours = {rv: r for v, rv, r in rows if v == "informers"}
    streamed = {rv: r["sync_s"] for v, rv, r in rows if v == "limit-stream"}
    official = [r for v, _, r in rows if v == "official"]
    print()
    print("limit: the same requests, read whole and decoded whole, keeping nothing;")
    print("limit-stream: the same, decoded item by item as they arrive (as the informer does)")
    print("targets: sync within 1.3x of the limit; >= 3x faster than the official informer; <= 3 KB/pod")
    for rv, r in ours.items():
        best = {v: x["sync_s_best"] for v, rv2, x in rows if rv2 == rv}
        print(f"  list rv={rv!r}: {r['sync_s'] / limits[rv]:.2f}x the limit "
              f"(best runs {best['informers'] / best['limit']:.2f}x), "
              f"{r['sync_s'] / streamed[rv]:.2f}x limit-stream, {r['bytes_per_object']:.0f} B/pod RSS")
    if official:
        print(f"  official informer / ours (rv '0'): {official[0]['sync_s'] / ours['0']['sync_s']:.1f}x slower")
    print()
    print(f"watch: {watch['events']} pod updates queued behind a held watch, then released")
    print(f"  from the API server: applied {watch['applied_per_s']:.0f}/s, dispatched {watch['dispatched_per_s']:.0f}/s, "
          f"cpu {watch['cpu_s']:.2f}s")
    print(f"  replayed in-process: applied {replay['applied_per_s']:.0f}/s, dispatched {replay['dispatched_per_s']:.0f}/s, "
          f"cpu {replay['cpu_s']:.2f}s")


if __name__ == "__main__":
    main()
