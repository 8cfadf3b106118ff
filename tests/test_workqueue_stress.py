"""Many producers and workers over many keys; the guarantees checked from a recorded history.

Events go into one list (``list.append`` is atomic). A producer records
"add" before calling ``add``; a worker records "start" after ``get``
returned and "end" before calling ``done``. So the list order respects
what the queue did: a key's next "start" can only be recorded after its
previous "end".
"""

from __future__ import annotations

import os
import random
import threading

import pytest
from prometheus_client import CollectorRegistry

from metrics.workqueue import PrometheusWorkqueueMetricsProvider
from workqueue import Queue

PRODUCERS = 6
WORKERS = 8
KEYS = 150
ADDS_PER_PRODUCER = 4_000

Event = tuple[str, str, int]  # (kind, key, worker or producer)

# Releases the GIL and lets another thread run: producers and workers then
# interleave finely, and keys get added while they are being processed.
# Without it a thread runs for a whole 5 ms switch interval at a time.
yield_thread = os.sched_yield


def run_stress(q: Queue[str]) -> list[Event]:
    events: list[Event] = []
    record = events.append
    keys = [f"pod:ns/p{i}" for i in range(KEYS)]

    def produce(producer: int) -> None:
        rng = random.Random(producer)
        for _ in range(ADDS_PER_PRODUCER):
            key = rng.choice(keys)
            record(("add", key, producer))
            q.add(key)
            yield_thread()

    def work(worker: int) -> None:
        while True:
            got = q.get()
            if got[1]:
                return
            key = got[0]
            record(("start", key, worker))
            yield_thread()
            record(("end", key, worker))
            q.done(key)

    workers = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    for t in workers + producers:
        t.start()
    for t in producers:
        t.join(timeout=60)
    q.shut_down_with_drain()
    for t in workers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in workers + producers)
    return events


def check_history(events: list[Event]) -> tuple[int, int, int]:
    """Assert the guarantees over the history; return (adds, processings, adds while processing)."""
    in_flight: dict[str, int] = {}
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    adds = starts = adds_in_flight = 0
    for index, (kind, key, who) in enumerate(events):
        if kind == "add":
            adds += 1
            adds_in_flight += key in in_flight
            last_add[key] = index
        elif kind == "start":
            starts += 1
            assert key not in in_flight, (
                f"{key} handed to worker {who} while worker {in_flight[key]} processed it"
            )
            in_flight[key] = who
            last_start[key] = index
        else:
            assert in_flight.pop(key) == who
    assert in_flight == {}
    unprocessed = [key for key, i in last_add.items() if last_start.get(key, -1) < i]
    assert unprocessed == [], f"added but never processed afterwards: {unprocessed[:5]}"
    return adds, starts, adds_in_flight


def test_no_key_is_processed_twice_at_once_and_every_add_is_followed_by_processing() -> None:
    q: Queue[str] = Queue()

    adds, starts, adds_in_flight = check_history(run_stress(q))

    assert adds == PRODUCERS * ADDS_PER_PRODUCER
    # Adds of a key that already waits collapse, so some were saved.
    assert KEYS <= starts <= adds
    # The run exercised the case that matters: keys added while in flight.
    assert adds_in_flight > 0
    assert q.len() == 0


@pytest.mark.parametrize("name", ["stress"])
def test_metrics_stay_consistent_under_concurrency(name: str) -> None:
    registry = CollectorRegistry()
    q: Queue[str] = Queue(name, metrics_provider=PrometheusWorkqueueMetricsProvider(registry))

    _, starts, _ = check_history(run_stress(q))

    def sample(metric: str) -> float | None:
        return registry.get_sample_value(metric, {"name": name})

    assert sample("workqueue_depth") == 0
    assert sample("workqueue_queue_duration_seconds_count") == starts
    assert sample("workqueue_work_duration_seconds_count") == starts
    # Every counted add was handed out exactly once.
    assert sample("workqueue_adds_total") == starts
