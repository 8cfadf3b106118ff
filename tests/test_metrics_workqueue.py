"""Workqueue metrics: client-go's names, help, label and buckets, scraped as text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics.workqueue import PrometheusWorkqueueMetricsProvider
from workqueue import FakeClock, ItemExponentialFailureRateLimiter, Queue, RateLimitingQueue

START = 1_000.0
# No periodic refresh during a test unless it asks for one.
NEVER = 1e9

# Go's prometheus.ExponentialBuckets(10e-9, 10, 10), as float64 arithmetic gives them.
CLIENT_GO_DURATION_BUCKETS = [
    1e-08,
    1e-07,
    1e-06,
    9.999999999999999e-06,
    9.999999999999999e-05,
    0.001,
    0.01,
    0.1,
    1.0,
    10.0,
    float("inf"),
]

CLIENT_GO_FAMILIES = {
    "workqueue_depth": ("gauge", "Current depth of workqueue"),
    "workqueue_adds": ("counter", "Total number of adds handled by workqueue"),
    "workqueue_queue_duration_seconds": (
        "histogram",
        "How long in seconds an item stays in workqueue before being requested.",
    ),
    "workqueue_work_duration_seconds": (
        "histogram",
        "How long in seconds processing an item from workqueue takes.",
    ),
    "workqueue_unfinished_work_seconds": (
        "gauge",
        "How many seconds of work has done that is in progress and hasn't been observed by "
        "work_duration. Large values indicate stuck threads. One can deduce the number of "
        "stuck threads by observing the rate at which this increases.",
    ),
    "workqueue_longest_running_processor_seconds": (
        "gauge",
        "How many seconds has the longest running processor for workqueue been running.",
    ),
    "workqueue_retries": ("counter", "Total number of retries handled by workqueue"),
}


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition text, keyed by sample name and labels."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], sample: str, **labels: str
) -> float:
    return samples[(sample, frozenset(labels.items()))]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def provider(registry: CollectorRegistry) -> PrometheusWorkqueueMetricsProvider:
    return PrometheusWorkqueueMetricsProvider(registry)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=START)


@pytest.fixture
def q(
    provider: PrometheusWorkqueueMetricsProvider, clock: FakeClock
) -> Iterator[RateLimitingQueue[str]]:
    queue: RateLimitingQueue[str] = RateLimitingQueue(
        ItemExponentialFailureRateLimiter(1, 60),
        "pods",
        metrics_provider=provider,
        clock=clock,
        unfinished_work_update_period=NEVER,
    )
    yield queue
    queue.shut_down()


def test_families_have_client_go_names_types_help_and_label(
    registry: CollectorRegistry, provider: PrometheusWorkqueueMetricsProvider
) -> None:
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name in CLIENT_GO_FAMILIES
    }

    assert {name: (f.type, f.documentation) for name, f in families.items()} == CLIENT_GO_FAMILIES


def test_duration_histograms_use_client_go_buckets(
    registry: CollectorRegistry, provider: PrometheusWorkqueueMetricsProvider
) -> None:
    provider.new_latency_metric("pods")
    provider.new_work_duration_metric("pods")
    samples = scrape(registry)

    for histogram in ["workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"]:
        bounds = sorted(
            float(dict(labels)["le"])
            for name, labels in samples
            if name == f"{histogram}_bucket" and dict(labels)["name"] == "pods"
        )
        assert bounds == CLIENT_GO_DURATION_BUCKETS


def test_scrape_after_adds_gets_and_retries_shows_client_go_values(
    registry: CollectorRegistry, clock: FakeClock, q: RateLimitingQueue[str]
) -> None:
    q.add("a")
    q.add("b")
    q.add("a")  # collapses: not an add
    clock.step(2)
    assert q.get() == ("a", False)  # waited 2 s
    clock.step(3)
    assert q.get() == ("b", False)  # waited 5 s
    clock.step(4)
    q.done("a")  # worked 7 s
    q.update_unfinished_work()  # "b" has run 4 s
    q.add_rate_limited("a")  # a retry, ready in 1 s
    clock.wait_for_sleeper(clock.monotonic() + 1)
    clock.step(1)
    clock.wait_for_sleeper(None)

    s = scrape(registry)
    assert value(s, "workqueue_adds_total", name="pods") == 3
    assert value(s, "workqueue_depth", name="pods") == 1
    assert value(s, "workqueue_retries_total", name="pods") == 1
    assert value(s, "workqueue_queue_duration_seconds_count", name="pods") == 2
    assert value(s, "workqueue_queue_duration_seconds_sum", name="pods") == 7
    assert value(s, "workqueue_queue_duration_seconds_bucket", name="pods", le="1.0") == 0
    assert value(s, "workqueue_queue_duration_seconds_bucket", name="pods", le="10.0") == 2
    assert value(s, "workqueue_work_duration_seconds_count", name="pods") == 1
    assert value(s, "workqueue_work_duration_seconds_sum", name="pods") == 7
    assert value(s, "workqueue_work_duration_seconds_bucket", name="pods", le="1.0") == 0
    assert value(s, "workqueue_work_duration_seconds_bucket", name="pods", le="10.0") == 1
    assert value(s, "workqueue_unfinished_work_seconds", name="pods") == 4
    assert value(s, "workqueue_longest_running_processor_seconds", name="pods") == 4


def test_an_add_while_processing_counts_in_depth_until_handed_out_again(
    registry: CollectorRegistry, q: RateLimitingQueue[str]
) -> None:
    q.add("a")
    q.get()
    q.add("a")
    assert value(scrape(registry), "workqueue_depth", name="pods") == 1

    q.done("a")
    q.get()

    s = scrape(registry)
    assert value(s, "workqueue_depth", name="pods") == 0
    assert value(s, "workqueue_adds_total", name="pods") == 2


def test_unfinished_work_sums_and_longest_running_takes_the_oldest(
    registry: CollectorRegistry, clock: FakeClock, q: RateLimitingQueue[str]
) -> None:
    q.add("a")
    q.add("b")
    q.get()
    clock.step(10)
    q.get()
    clock.step(5)

    q.update_unfinished_work()

    s = scrape(registry)
    assert value(s, "workqueue_unfinished_work_seconds", name="pods") == 20
    assert value(s, "workqueue_longest_running_processor_seconds", name="pods") == 15


def test_the_updater_refreshes_unfinished_work_every_half_second_of_the_clock(
    registry: CollectorRegistry, provider: PrometheusWorkqueueMetricsProvider, clock: FakeClock
) -> None:
    q: Queue[str] = Queue("pods", metrics_provider=provider, clock=clock)
    q.add("a")
    q.get()
    clock.wait_for_sleeper(START + 0.5)
    assert value(scrape(registry), "workqueue_unfinished_work_seconds", name="pods") == 0

    clock.step(0.5)
    clock.wait_for_sleeper(START + 1.0)
    s = scrape(registry)
    assert value(s, "workqueue_unfinished_work_seconds", name="pods") == 0.5
    assert value(s, "workqueue_longest_running_processor_seconds", name="pods") == 0.5

    clock.step(0.5)
    clock.wait_for_sleeper(START + 1.5)
    assert value(scrape(registry), "workqueue_unfinished_work_seconds", name="pods") == 1.0
    q.shut_down()


def test_a_queue_without_a_name_exports_nothing(
    registry: CollectorRegistry, provider: PrometheusWorkqueueMetricsProvider, clock: FakeClock
) -> None:
    q: RateLimitingQueue[str] = RateLimitingQueue(
        ItemExponentialFailureRateLimiter(1, 60), metrics_provider=provider, clock=clock
    )
    q.add("a")
    q.get()
    q.done("a")
    q.add_rate_limited("a")
    q.update_unfinished_work()
    q.shut_down()

    assert [key for key in scrape(registry) if key[0].startswith("workqueue_")] == []


def test_queues_are_told_apart_by_the_name_label(
    registry: CollectorRegistry, provider: PrometheusWorkqueueMetricsProvider
) -> None:
    pods: Queue[str] = Queue("pods", metrics_provider=provider)
    claims: Queue[str] = Queue("claims", metrics_provider=provider)
    pods.add("a")
    claims.add("b")
    claims.add("c")

    s = scrape(registry)
    pods.shut_down()
    claims.shut_down()
    assert value(s, "workqueue_depth", name="pods") == 1
    assert value(s, "workqueue_depth", name="claims") == 2


def test_metrics_go_only_to_the_injected_registry() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    q: Queue[str] = Queue("pods", metrics_provider=PrometheusWorkqueueMetricsProvider(first))
    PrometheusWorkqueueMetricsProvider(second)

    q.add("a")
    q.shut_down()

    assert value(scrape(first), "workqueue_adds_total", name="pods") == 1
    assert [key for key in scrape(second) if key[0].startswith("workqueue_")] == []


def test_importing_registers_no_metric_and_starts_no_thread() -> None:
    program = (
        "import threading\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "import metrics, metrics.workqueue, workqueue\n"
        "assert b'workqueue_' not in generate_latest(REGISTRY), 'registered at import'\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
