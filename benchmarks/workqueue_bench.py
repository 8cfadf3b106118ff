"""Work queue throughput beside stdlib ``queue.Queue`` and client-go's workqueue.

A program, not a test (``make bench-workqueue`` runs
``python -m benchmarks.workqueue_bench``). Each run: the main thread adds
distinct items, N worker threads take them until shutdown; for
``workqueue.Queue`` a worker does ``get`` then ``done`` (so every item goes
through de-duplication and processing tracking), for ``queue.Queue`` it does
``get`` after the producer's ``put``. Time runs from the first add until every
worker has finished; the rate is items per second. The same loop runs on
client-go's ``util/workqueue`` from ``benchmarks/go/workqueue``, built with
the machine's Go into ~/.cache/gpuclaimctl/bench/.

Runs of the Python implementations are interleaved and the best of
``--repeat`` is reported, so load from other processes hurts all alike. The
target (issue 3): metrics off at least 0.7x ``queue.Queue``. The program
reports; it never fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from metrics.workqueue import PrometheusWorkqueueMetricsProvider
from workqueue import Queue

ITEMS = 1_000_000
WORKER_COUNTS = (1, 4)
REPEAT = 3
TARGET_RATIO = 0.7

GO_MODULE = Path(__file__).resolve().parent / "go" / "workqueue"
BIN_DIR = Path.home() / ".cache" / "gpuclaimctl" / "bench"
GO_BINARY = BIN_DIR / "workqueue-bench"

STDLIB = "queue.Queue put/get"
OURS_OFF = "workqueue.Queue add/get/done, metrics off"
OURS_ON = "workqueue.Queue add/get/done, metrics on"
GO = "client-go workqueue Add/Get/Done (Go)"


def run_workqueue(items: int, workers: int, metrics: bool) -> float:
    q: Queue[int]
    if metrics:
        provider = PrometheusWorkqueueMetricsProvider(CollectorRegistry())
        q = Queue("bench", metrics_provider=provider)
    else:
        q = Queue()

    def work() -> None:
        get, done = q.get, q.done
        while True:
            got = get()
            if got[1]:
                return
            done(got[0])

    threads = [threading.Thread(target=work) for _ in range(workers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    add = q.add
    for i in range(items):
        add(i)
    # Getters drain what is queued, then see shutdown.
    q.shut_down()
    for t in threads:
        t.join()
    return items / (time.perf_counter() - start)


def run_stdlib(items: int, workers: int) -> float:
    q: queue.Queue[int | None] = queue.Queue()

    def work() -> None:
        get = q.get
        while get() is not None:
            pass

    threads = [threading.Thread(target=work) for _ in range(workers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    put = q.put
    for i in range(items):
        put(i)
    for _ in threads:
        put(None)
    for t in threads:
        t.join()
    return items / (time.perf_counter() - start)


def go_baseline(items: int, workers: tuple[int, ...], repeat: int) -> dict[int, float] | str:
    """Best client-go rate per worker count, or why there is none."""
    go = shutil.which("go")
    if go is None:
        return "skipped: no `go` on PATH"
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    build = subprocess.run(
        [go, "build", "-trimpath", "-o", str(GO_BINARY), "."],
        cwd=GO_MODULE,
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        return "skipped: go build failed: " + build.stderr.strip()[-500:]
    result = subprocess.run(
        [
            str(GO_BINARY),
            f"-items={items}",
            f"-workers={','.join(map(str, workers))}",
            f"-repeat={repeat}",
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return "skipped: the Go benchmark failed: " + result.stderr.strip()[-500:]
    rates: dict[int, list[float]] = {}
    for line in result.stdout.splitlines():
        run = json.loads(line)
        rates.setdefault(int(run["workers"]), []).append(float(run["ops_per_sec"]))
    return {w: max(r) for w, r in rates.items()}


def go_version() -> str:
    go = shutil.which("go")
    if go is None:
        return "none"
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def measure(items: int, workers: int, repeat: int) -> dict[str, list[float]]:
    runs: dict[str, Callable[[], float]] = {
        STDLIB: lambda: run_stdlib(items, workers),
        OURS_OFF: lambda: run_workqueue(items, workers, metrics=False),
        OURS_ON: lambda: run_workqueue(items, workers, metrics=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            rates[name].append(run())
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=ITEMS, help="distinct items per run")
    parser.add_argument(
        "--workers",
        type=lambda s: tuple(int(w) for w in s.split(",")),
        default=WORKER_COUNTS,
        help="comma-separated worker counts (default 1,4)",
    )
    parser.add_argument("--repeat", type=int, default=REPEAT, help="runs per figure; best is shown")
    parser.add_argument("--no-go", action="store_true", help="skip the client-go baseline")
    args = parser.parse_args(argv)

    print(
        f"workqueue benchmark: {args.items:,} distinct items per run, 1 producer + N workers, "
        f"best of {args.repeat} runs"
    )
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"go {go_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    print()

    go: dict[int, float] | str = (
        "skipped: --no-go" if args.no_go else go_baseline(args.items, args.workers, args.repeat)
    )

    header = f"{'workers':>7}  {'implementation':<44} {'ops/s (best)':>13} {'median':>11} {'x queue.Queue':>14} {'x client-go':>12}"
    print(header)
    print("-" * len(header))
    verdicts = []
    for workers in args.workers:
        rates = measure(args.items, workers, args.repeat)
        best = {name: max(r) for name, r in rates.items()}
        go_rate = go.get(workers) if isinstance(go, dict) else None
        for name in (STDLIB, OURS_OFF, OURS_ON):
            vs_go = f"{best[name] / go_rate:12.3f}" if go_rate else f"{'-':>12}"
            print(
                f"{workers:>7}  {name:<44} {best[name]:>13,.0f} {statistics.median(rates[name]):>11,.0f}"
                f" {best[name] / best[STDLIB]:>14.2f} {vs_go}"
            )
        if go_rate:
            print(f"{workers:>7}  {GO:<44} {go_rate:>13,.0f} {'':>11} {go_rate / best[STDLIB]:>14.2f} {1.0:12.3f}")
        ratio = best[OURS_OFF] / best[STDLIB]
        verdicts.append(
            f"{workers} worker{'s' if workers > 1 else ''}: {ratio:.2f}x "
            f"({'meets' if ratio >= TARGET_RATIO else 'MISSES'} the {TARGET_RATIO}x target)"
        )
        sys.stdout.flush()
    print()
    if isinstance(go, str):
        print(f"client-go baseline: {go}")
    print("metrics off vs queue.Queue: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
