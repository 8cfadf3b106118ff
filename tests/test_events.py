"""Events off the sync path (issue 12, item 1): the recorder in
gpuclaimctl/client/events.py, client-go's tools/record.

A sync's `Writer.event` only queues; one sender thread correlates (combines
similar events, turns repeats into a count, spam-filters per object), waits
for its own token bucket, and sends through the write fence.

Most tests run the recorder over `EventServer`, a fake transport under
`kube.request` (the part of an ApiClient it uses), rather than the real API
server: they must lose an answer, refuse a request or close the fence at an
exact point, and count every request that left. The correlator is pure and
is tested alone on a fake clock. The last tests run against the real API
server: repeats of an event on a pod become one Event with their count, and
a flood of distinct events on a pod is capped.

No assertion depends on how long anything took: background work is waited
for with `flush` (whose bound only stops a broken test) or, on a fake clock,
by waiting for the sender to go to sleep at a known deadline.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from typing import Any

import orjson
import pytest
import urllib3
from click.testing import CliRunner
from kubernetes import client
from prometheus_client import CollectorRegistry

from gpuclaimctl.client import events, kube
from gpuclaimctl.client.eventcorrelation import AGGREGATE_PREFIX, EventCorrelator
from gpuclaimctl.client.events import EventRecorder, Outcome, make_event
from gpuclaimctl.client.fence import WriteFence
from gpuclaimctl.client.writer import Writer
from gpuclaimctl.cmd import app
from gpuclaimctl.cmd.cli import main
from gpuclaimctl.cmd.options import Options
from metrics.controller import EVENT_RESULTS, EventMetrics
from workqueue.clock import FakeClock, RealClock

Obj = dict[str, Any]

# Only bounds a broken test: a flush that works returns as soon as the
# queue is empty.
FLUSH = 30.0


def pod(name: str = "trainer", ns: str = "team-a", uid: str = "uid-1") -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "7"}}


# -- a fake transport -------------------------------------------------------------------


class _Answer:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.data = orjson.dumps(body)


class _Pool:
    def __init__(self, server: EventServer) -> None:
        self.server = server

    def request(self, method: str, url: str, *, body: bytes | None = None,
                headers: dict[str, str], **_kw: Any) -> _Answer:
        return self.server.answer(method, url.removeprefix("https://api"), headers,
                                  orjson.loads(body) if body else None)


@dataclasses.dataclass
class Sent:
    method: str
    path: str
    content_type: str
    body: Any


class EventServer:
    """What kube.request uses of kubernetes.client.ApiClient (param_serialize
    and the connection pool), answering creates and patches of core/v1
    Events from a dict, as the API server would. `fail_next` scripts the
    next answers: an exception (no answer), optionally after the request
    landed (an answer lost), or an HTTP status."""

    PATH = re.compile(r"/api/v1/namespaces/([^/]+)/events(?:/([^/]+))?")

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Obj] = {}
        self.sent: list[Sent] = []
        self.script: list[tuple[BaseException | int, bool]] = []
        self.version = 0
        self.rest_client = type("Rest", (), {"pool_manager": _Pool(self)})()

    def param_serialize(self, method: str, path: str, **kw: Any) -> tuple[Any, ...]:
        return method, "https://api" + path, kw["header_params"], None, []

    def fail_next(self, failure: BaseException | int, *, landed: bool = False) -> None:
        self.script.append((failure, landed))

    def answer(self, method: str, path: str, headers: dict[str, str], body: Any) -> _Answer:
        self.sent.append(Sent(method, path, headers.get("Content-Type", ""), body))
        failure, landed = self.script.pop(0) if self.script else (None, False)
        if isinstance(failure, int):
            return _Answer(failure, {"kind": "Status", "code": failure, "reason": "Invalid",
                                     "message": "refused by the test"})
        if failure is not None and not landed:
            raise failure
        result = self._apply(method, path, body)
        if failure is not None:
            raise failure
        return result

    def _apply(self, method: str, path: str, body: Any) -> _Answer:
        match = self.PATH.fullmatch(path)
        assert match, path
        ns, name = match.group(1), match.group(2)
        self.version += 1
        if method == "POST":
            key = (ns, body["metadata"]["name"])
            if key in self.stored:
                return _Answer(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists",
                                     "message": f"events {key[1]!r} already exists"})
            stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
            self.stored[key] = stored
            return _Answer(201, stored)
        assert method == "PATCH" and name, (method, path)
        if (ns, name) not in self.stored:
            return _Answer(404, {"kind": "Status", "code": 404, "reason": "NotFound",
                                 "message": f"events {name!r} not found"})
        stored = self.stored[(ns, name)]
        stored.update(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        return _Answer(200, stored)

    def methods(self) -> list[str]:
        return [s.method for s in self.sent]


class Counts:
    """The recorder's metrics seam, kept as plain counts."""

    def __init__(self) -> None:
        self.by_result: Counter[str] = Counter()

    def inc(self, result: str, amount: int = 1) -> None:
        self.by_result[result] += amount

    def __getitem__(self, outcome: Outcome) -> int:
        return self.by_result[outcome.value]


class WallClock(RealClock):
    """Real monotonic time (so a flush's bound is real), and a wall time the
    test sets (for the events' timestamps)."""

    def __init__(self, wall: float = 1_700_000_000.0) -> None:
        self.wall = wall

    def now(self) -> float:
        return self.wall


@pytest.fixture
def server() -> EventServer:
    return EventServer()


@pytest.fixture
def counts() -> Counts:
    return Counts()


def recorder_on(server: EventServer, counts: Counts, **kw: Any) -> EventRecorder:
    kw.setdefault("clock", WallClock())
    return EventRecorder(server, metrics=counts, instance="gpuclaimctl-test",  # type: ignore[arg-type]
                         **kw)


# -- the sync side -------------------------------------------------------------------------


def test_a_sync_hands_the_event_over_and_nothing_leaves_until_the_sender_runs(
    server: EventServer, counts: Counts,
) -> None:
    recorder = recorder_on(server, counts)
    # The Writer's own budget: one token, then a caller would have to wait.
    waited: list[float] = []
    limiter = kube.TokenBucket(qps=0.001, burst=1, sleep=waited.append)
    writer = Writer(server, limiter=limiter, recorder=recorder)  # type: ignore[arg-type]

    for i in range(3):
        writer.event(pod(f"p{i}"), "Warning", "Capacity", "no node has 2 free GPUs")
    assert server.sent == [] and recorder.queued == 3
    assert waited == [], "events must not take the Writer's tokens"

    recorder.start()
    assert recorder.flush(FLUSH)
    assert server.methods() == ["POST"] * 3
    assert counts[Outcome.CREATED] == 3
    assert waited == []
    recorder.stop()


def test_a_full_queue_drops_and_counts_events_instead_of_blocking_the_sync(
    server: EventServer, counts: Counts,
) -> None:
    recorder = recorder_on(server, counts, queue_size=3)
    taken = [recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed on gpu-a100-0") for i in range(5)]
    assert taken == [True, True, True, False, False], "the caller learns which were dropped"
    assert recorder.queued == 3
    assert counts[Outcome.DROPPED] == 2

    recorder.start()
    assert recorder.flush(FLUSH)
    assert [s.body["involvedObject"]["name"] for s in server.sent] == ["p0", "p1", "p2"]
    recorder.stop()


def test_an_event_of_an_unknown_type_is_refused_at_once(server: EventServer, counts: Counts) -> None:
    recorder = recorder_on(server, counts)
    assert not recorder.event(pod(), "Error", "Capacity", "no")
    assert recorder.queued == 0 and counts[Outcome.FAILED] == 1


def test_events_queued_within_the_batch_window_go_together_once_it_ends(
    server: EventServer, counts: Counts,
) -> None:
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, batch_window=0.1)
    recorder.start()
    recorder.event(pod("p0"), "Normal", "Placed", "placed")
    start = clock.monotonic()
    clock.wait_for_sleeper(start + 0.1)  # gathering
    for i in (1, 2):
        recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed")
    assert server.sent == [] and recorder.queued == 3
    clock.step(0.1)
    clock.wait_for_sleeper(None)  # sent, and idle again
    assert [s.body["involvedObject"]["name"] for s in server.sent] == ["p0", "p1", "p2"]
    assert counts[Outcome.CREATED] == 3
    recorder.stop()


def test_a_full_batch_goes_without_waiting_out_the_window(server: EventServer, counts: Counts) -> None:
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, batch_window=60.0)
    for i in range(events.BATCH_MAX + 1):
        recorder.event(pod(f"p{i}", uid=f"u{i}"), "Normal", "Placed", "placed")
    recorder.start()
    clock.wait_for_sleeper(clock.monotonic() + 60.0)  # the one left over gathers
    assert len(server.sent) == events.BATCH_MAX
    recorder.stop()


def test_over_the_lean_transport_a_batch_is_one_exchange_and_only_unanswered_events_go_again(
    counts: Counts,
) -> None:
    """Pipelined (kube.request_many): the server answers the first create and
    hangs up; the two without an answer are sent again, one at a time."""
    from tests.test_http11 import Server

    def created(request: bytes) -> bytes:
        body = request.split(b"\r\n\r\n", 1)[1]
        return b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    http = Server(created, lambda _r: None, created)
    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{http.port}"))
        recorder = EventRecorder(api, metrics=counts, instance="gpuclaimctl-test", rng=lambda: 0.0)
        for i in range(3):
            recorder.event(pod(f"p{i}", uid=f"u{i}"), "Normal", "Placed", "placed")
        recorder.start()
        assert recorder.flush(FLUSH)
        recorder.stop()
    finally:
        http.close()
    names = [orjson.loads(r.split(b"\r\n\r\n", 1)[1])["involvedObject"]["name"] for r in http.requests]
    assert names == ["p0", "p1", "p1", "p2"]
    assert http.connections == 2  # the batch's (hung up on), then one the retries share
    assert counts[Outcome.CREATED] == 3 and counts[Outcome.FAILED] == 0


# -- repeats, combining, the spam filter -------------------------------------------------------


def test_repeats_of_an_event_become_one_event_whose_count_and_last_time_move(
    server: EventServer, counts: Counts,
) -> None:
    clock = WallClock()
    recorder = recorder_on(server, counts, clock=clock)
    recorder.start()
    for _ in range(5):
        recorder.event(pod(), "Warning", "Capacity", "no node has 2 free GPUs")
        assert recorder.flush(FLUSH)
        clock.wall += 60
    recorder.stop()

    assert server.methods() == ["POST", "PATCH", "PATCH", "PATCH", "PATCH"]
    patch = server.sent[-1]
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body == {"count": 5, "lastTimestamp": "2023-11-14T22:17:20Z",
                          "message": "no node has 2 free GPUs"}
    [stored] = server.stored.values()
    assert stored["count"] == 5
    assert stored["firstTimestamp"] == "2023-11-14T22:13:20Z"
    assert stored["lastTimestamp"] == "2023-11-14T22:17:20Z"
    assert (counts[Outcome.CREATED], counts[Outcome.UPDATED]) == (1, 4)


def test_a_repeat_of_an_event_someone_deleted_creates_it_again_with_the_count(
    server: EventServer, counts: Counts,
) -> None:
    recorder = recorder_on(server, counts)
    recorder.start()
    recorder.event(pod(), "Warning", "Capacity", "waiting")
    assert recorder.flush(FLUSH)
    server.stored.clear()  # its TTL ran out, or someone deleted it
    recorder.event(pod(), "Warning", "Capacity", "waiting")
    assert recorder.flush(FLUSH)
    recorder.stop()
    assert server.methods() == ["POST", "PATCH", "POST"]
    [stored] = server.stored.values()
    assert stored["count"] == 2
    assert "resourceVersion" not in server.sent[-1].body["metadata"]


def event_about(name: str, message: str, reason: str = "Capacity", type_: str = "Warning") -> Obj:
    return make_event(pod(name), type_, reason, message, component="gpuclaimctl",
                      instance="gpuclaimctl-test", now=1_700_000_000.0)


def test_more_than_ten_distinct_messages_within_ten_minutes_become_one_combined_event() -> None:
    clock = FakeClock()
    correlator = EventCorrelator(clock)
    results = [correlator.correlate(event_about("p", f"the most free on a node: {i}"))
               for i in range(12)]

    assert [r.aggregated for r in results] == [False] * 9 + [True] * 3
    assert all(r.patch is None and not r.aggregated for r in results[:9])
    combined, second, third = results[9:]
    assert combined.event["message"] == AGGREGATE_PREFIX + "the most free on a node: 9"
    assert combined.patch is None and combined.event["count"] == 1
    # Later similar events update the combined one.
    assert second.event["metadata"]["name"] == combined.event["metadata"]["name"]
    assert second.patch == {"count": 2, "lastTimestamp": second.event["lastTimestamp"],
                            "message": AGGREGATE_PREFIX + "the most free on a node: 10"}
    assert third.patch is not None and third.patch["count"] == 3
    # Another reason about the same pod is its own group.
    assert not correlator.correlate(event_about("p", "x", reason="Placed", type_="Normal")).aggregated

    # Ten quiet minutes later, a new message stands on its own again.
    clock.step(601)
    assert not correlator.correlate(event_about("p", "the most free on a node: 99")).aggregated


def test_the_spam_filter_lets_25_events_about_an_object_through_then_one_every_5_minutes() -> None:
    clock = FakeClock()
    correlator = EventCorrelator(clock)
    # Distinct reasons, so nothing is combined: only the spam filter acts.
    skipped = [correlator.correlate(event_about("p", "m", reason=f"R{i}")).skip for i in range(30)]
    assert skipped == [False] * 25 + [True] * 5
    assert not correlator.correlate(event_about("other-pod", "m", reason="R0")).skip

    clock.step(299)
    assert correlator.correlate(event_about("p", "m", reason="R99")).skip
    clock.step(1)
    assert not correlator.correlate(event_about("p", "m", reason="R100")).skip
    assert correlator.correlate(event_about("p", "m", reason="R101")).skip


def test_a_filtered_repeat_still_counts_so_the_next_one_sent_carries_the_true_count() -> None:
    clock = FakeClock()
    correlator = EventCorrelator(clock, spam_burst=2)
    first = correlator.correlate(event_about("p", "waiting"))
    second = correlator.correlate(event_about("p", "waiting"))
    third = correlator.correlate(event_about("p", "waiting"))
    assert (first.skip, second.skip, third.skip) == (False, False, True)
    clock.step(300)
    fourth = correlator.correlate(event_about("p", "waiting"))
    assert not fourth.skip and fourth.patch is not None and fourth.patch["count"] == 4


# -- the recorder's own budget ----------------------------------------------------------------


def test_the_sender_waits_for_its_own_bucket(server: EventServer, counts: Counts) -> None:
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, qps=1.0, burst=2)
    for i in range(3):
        recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed")
    start = clock.monotonic()
    recorder.start()

    clock.wait_for_sleeper(start + 1.0)  # the third waits a second for its token
    assert len(server.sent) == 2
    clock.step(1.0)
    clock.wait_for_sleeper(None)  # idle, with nothing queued
    assert len(server.sent) == 3
    recorder.stop()


# -- failures -----------------------------------------------------------------------------------


def test_a_request_without_an_answer_is_retried_and_a_lost_create_is_not_doubled(
    server: EventServer, counts: Counts,
) -> None:
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, rng=lambda: 0.5)
    server.fail_next(urllib3.exceptions.ProtocolError("connection reset"))
    server.fail_next(TimeoutError("read timed out"), landed=True)  # created; the answer lost
    recorder.event(pod(), "Normal", "Placed", "placed on gpu-a100-0")
    start = clock.monotonic()
    recorder.start()

    clock.wait_for_sleeper(start + 5.0)  # the first retry is randomised: 0.5 x 10 s
    clock.step(5.0)
    clock.wait_for_sleeper(start + 15.0)  # then 10 s
    clock.step(10.0)
    clock.wait_for_sleeper(None)
    recorder.stop()

    assert server.methods() == ["POST", "POST", "POST"]  # the last one found it there
    assert len(server.stored) == 1
    assert counts[Outcome.CREATED] == 1 and counts[Outcome.FAILED] == 0


def test_an_event_the_server_ran_out_of_time_for_is_tried_again(server: EventServer, counts: Counts) -> None:
    """A 504 (the deadline the request carried ran out: a pipelined request
    gets a share of the batch's) says nothing of whether it was written."""
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, rng=lambda: 0.5)
    server.fail_next(504)
    recorder.event(pod(), "Normal", "Placed", "placed on gpu-a100-0")
    start = clock.monotonic()
    recorder.start()
    clock.wait_for_sleeper(start + 5.0)
    clock.step(5.0)
    clock.wait_for_sleeper(None)
    recorder.stop()
    assert server.methods() == ["POST", "POST"]
    assert counts[Outcome.CREATED] == 1 and counts[Outcome.FAILED] == 0


def test_events_that_cannot_reach_the_server_wait_to_be_tried_again(counts: Counts) -> None:
    """No connection at all (an API server restarting): the batch's events
    are tried again after the retry sleep, not failed at once."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    clock = FakeClock()
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    recorder = EventRecorder(api, metrics=counts, instance="gpuclaimctl-test", clock=clock,
                             rng=lambda: 0.5)
    for i in range(3):
        recorder.event(pod(f"p{i}", uid=f"u{i}"), "Normal", "Placed", "placed")
    start = clock.monotonic()
    recorder.start()
    clock.wait_for_sleeper(start + 5.0)  # the batch's retry sleep
    assert counts[Outcome.FAILED] == 0
    recorder.stop()  # the sender wakes from its sleep and drops them
    deadline = time.monotonic() + FLUSH
    while counts[Outcome.DROPPED] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert counts[Outcome.DROPPED] == 3 and counts[Outcome.FAILED] == 0


def test_an_answer_refusing_an_event_is_final(server: EventServer, counts: Counts) -> None:
    recorder = recorder_on(server, counts)
    server.fail_next(422)
    recorder.event(pod("bad"), "Warning", "InvalidClaims", "not JSON")
    recorder.event(pod("good"), "Normal", "Placed", "placed")
    recorder.start()
    assert recorder.flush(FLUSH)
    recorder.stop()
    assert server.methods() == ["POST", "POST"]
    assert [name for _, name in server.stored] == [server.sent[1].body["metadata"]["name"]]
    assert (counts[Outcome.FAILED], counts[Outcome.CREATED]) == (1, 1)


def test_once_the_fence_refuses_no_event_leaves_and_later_ones_are_dropped(
    server: EventServer, counts: Counts,
) -> None:
    fence = WriteFence()
    recorder = recorder_on(server, counts, fence=fence)
    recorder.start()
    recorder.event(pod("p0"), "Normal", "Placed", "placed")
    assert recorder.flush(FLUSH)
    assert len(server.sent) == 1

    fence.close("leader election lost")
    for i in range(1, 4):
        recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed")
    assert recorder.flush(FLUSH)
    assert len(server.sent) == 1, "nothing may leave a process that is no longer the leader"
    assert counts[Outcome.DROPPED] == 3

    recorder.event(pod("late"), "Normal", "Placed", "placed")
    assert recorder.queued == 0 and counts[Outcome.DROPPED] == 4
    recorder.stop()
    assert len(server.sent) == 1


def test_the_writer_and_the_recorder_share_one_fence(server: EventServer, counts: Counts) -> None:
    fence = WriteFence()
    fence.close()
    options = dataclasses.replace(Options(), event_qps=100.0, event_burst=100)
    recorder = app.build_recorder(server, options, CollectorRegistry(), fence=fence)  # type: ignore[arg-type]
    recorder.start()
    Writer(server, fence=fence, recorder=recorder).event(  # type: ignore[arg-type]
        pod(), "Normal", "Placed", "placed")
    assert recorder.flush(FLUSH)
    recorder.stop()
    assert server.sent == []


def test_stop_drops_what_is_still_queued_and_nothing_leaves_afterwards(
    server: EventServer, counts: Counts,
) -> None:
    clock = FakeClock()
    recorder = recorder_on(server, counts, clock=clock, qps=1.0, burst=1)
    for i in range(3):
        recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed")
    start = clock.monotonic()
    recorder.start()
    clock.wait_for_sleeper(start + 1.0)  # p0 sent, p1 waiting for a token, p2 queued

    assert recorder.stop() is False
    clock.step(10.0)
    assert recorder.flush(FLUSH)
    assert [s.body["involvedObject"]["name"] for s in server.sent] == ["p0"]
    assert (counts[Outcome.CREATED], counts[Outcome.DROPPED]) == (1, 2)
    recorder.event(pod("late"), "Normal", "Placed", "placed")
    assert recorder.queued == 0 and counts[Outcome.DROPPED] == 3


def test_stop_gives_queued_events_their_time_to_be_sent(server: EventServer, counts: Counts) -> None:
    recorder = recorder_on(server, counts)
    for i in range(5):
        recorder.event(pod(f"p{i}"), "Normal", "Placed", "placed")
    recorder.start()
    assert recorder.stop(FLUSH) is True
    assert len(server.stored) == 5 and counts[Outcome.DROPPED] == 0


def test_shutdown_gives_events_at_most_until_a_second_before_the_lease_could_be_taken_over() -> None:
    now = [100.0]
    fence = WriteFence(monotonic=lambda: now[0])
    assert app.event_flush_budget(fence) == app.EVENT_FLUSH_TIMEOUT  # no leader election
    fence.extend(started=100.0, renew_deadline=10.0, lease_duration=15.0)
    now[0] = 109.0  # takeover possible at 115
    assert app.event_flush_budget(fence) == app.EVENT_FLUSH_TIMEOUT
    fence.extend(started=100.0, renew_deadline=14.0, lease_duration=15.0)
    now[0] = 112.0
    assert app.event_flush_budget(fence) == pytest.approx(2.0)
    fence.close()
    assert app.event_flush_budget(fence) == 0.0


# -- names, metrics, flags -----------------------------------------------------------------------


def test_an_event_is_named_after_its_object_unless_that_would_be_too_long() -> None:
    short = make_event(pod("trainer"), "Normal", "Placed", "m", component="c", instance="i",
                       now=1_700_000_000.5)
    assert short["metadata"]["name"] == f"trainer.{int(1_700_000_000.5 * 1e9):x}"
    long_name = "a" * 250
    named = make_event(pod(long_name), "Normal", "Placed", "m", component="c", instance="i", now=1.0)
    assert re.fullmatch(r"[0-9a-f-]{36}", named["metadata"]["name"])
    assert named["involvedObject"]["name"] == long_name
    cluster_scoped = make_event({"kind": "GPUClass", "metadata": {"name": "a100"}}, "Warning",
                                "X", "m" * 2000, component="c", instance="i", now=1.0)
    assert cluster_scoped["metadata"]["namespace"] == "default"
    assert len(cluster_scoped["message"]) == events.MESSAGE_LIMIT


def test_the_event_counter_shows_every_result_from_the_start() -> None:
    registry = CollectorRegistry()
    metrics = EventMetrics(registry)
    assert {o.value for o in Outcome} == set(EVENT_RESULTS)
    assert all(registry.get_sample_value("gpuclaimctl_events_total", {"result": r}) == 0
               for r in EVENT_RESULTS)
    metrics.inc("dropped", 3)
    assert registry.get_sample_value("gpuclaimctl_events_total", {"result": "dropped"}) == 3


def test_event_flags_reach_the_options_and_bad_ones_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (Options().event_qps, Options().event_burst) == (events.DEFAULT_QPS, events.DEFAULT_BURST)
    seen: list[Options] = []

    def fake_run(options: Options) -> int:  # nothing starts
        seen.append(options)
        return 0

    monkeypatch.setattr(app, "run", fake_run)
    for name in [n for n in __import__("os").environ if n.startswith("GPUCLAIMCTL_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(main, ["run", "--event-qps", "2", "--event-burst", "10"])
    assert result.exit_code == 0, result.output
    assert (seen[0].event_qps, seen[0].event_burst) == (2.0, 10)

    result = CliRunner().invoke(main, ["run", "--event-qps", "0"])
    assert result.exit_code == 2 and "--event-qps must be > 0" in result.output
    result = CliRunner().invoke(main, ["run"], env={"GPUCLAIMCTL_EVENT_BURST": "1",
                                                    "GPUCLAIMCTL_EVENT_QPS": "5"})
    assert result.exit_code == 2 and "--event-burst must be at least --event-qps" in result.output
    with pytest.raises(ValueError, match="--event-qps must be a finite number"):
        Options(event_qps=float("inf")).validate()


# -- against the real API server ------------------------------------------------------------------


def gated_pod(api_client: client.ApiClient, ns: str, name: str) -> Obj:
    """A pod that is never scheduled: the events' involvedObject is real."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulingGates": [{"name": "gpuclaimctl.io/claims"}],
                     "containers": [{"name": "c", "image": "busybox"}]}}
    created: Obj = kube.request_json(api_client, "POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    return created


def events_in(api_client: client.ApiClient, ns: str) -> list[Obj]:
    items: list[Obj] = kube.request_json(api_client, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return items


# The real clock: the spam filter refills one token per 300 s and combining
# looks back 600 s, both beyond the suite's 300 s timeout, so nothing these
# tests assert can change with how fast the machine is.


@pytest.mark.plane
def test_a_batch_of_creates_then_one_of_repeats_each_go_in_one_exchange(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over TLS to the real kube-apiserver: five events gathered go out
    pipelined in one exchange, then their five repeats (count PATCHes)."""
    pods = [gated_pod(api_client, namespace, f"batch-{i}") for i in range(5)]
    batches: list[list[str]] = []
    many = kube.request_many

    def spy(api: Any, requests: Any, **kw: Any) -> Any:
        batches.append([method for method, *_ in requests])
        return many(api, requests, **kw)

    monkeypatch.setattr(kube, "request_many", spy)
    counts = Counts()
    recorder = EventRecorder(api_client, fence=WriteFence(), metrics=counts, batch_window=0.5)
    writer = Writer(api_client, recorder=recorder)
    recorder.start()
    for p in pods:
        writer.event(p, "Normal", "Placed", "placed on gpu-a100-0")
    assert recorder.flush(FLUSH)
    for p in pods:
        writer.event(p, "Normal", "Placed", "placed on gpu-a100-0")
    assert recorder.flush(FLUSH)
    recorder.stop()
    assert batches == [["POST"] * 5, ["PATCH"] * 5]
    placed = [e for e in events_in(api_client, namespace) if e["reason"] == "Placed"]
    assert sorted(e["involvedObject"]["name"] for e in placed) == [f"batch-{i}" for i in range(5)]
    assert all(e["count"] == 2 for e in placed)
    assert counts[Outcome.CREATED] == 5 and counts[Outcome.UPDATED] == 5 and counts[Outcome.FAILED] == 0


@pytest.mark.plane
def test_repeats_on_a_pod_become_one_event_object_with_their_count(
    api_client: client.ApiClient, namespace: str,
) -> None:
    p = gated_pod(api_client, namespace, "waiting")
    counts = Counts()
    recorder = EventRecorder(api_client, fence=WriteFence(), metrics=counts)
    writer = Writer(api_client, recorder=recorder)
    recorder.start()
    for _ in range(7):
        writer.event(p, "Warning", "Capacity", "no node has 2 free a100 GPUs")
    assert recorder.flush(FLUSH)
    recorder.stop()

    [event] = events_in(api_client, namespace)
    assert event["count"] == 7
    assert event["involvedObject"]["uid"] == p["metadata"]["uid"]
    assert (event["reason"], event["type"]) == ("Capacity", "Warning")
    assert (counts[Outcome.CREATED], counts[Outcome.UPDATED]) == (1, 6)


@pytest.mark.plane
def test_a_flood_of_distinct_waiting_events_on_a_pod_is_combined_and_capped(
    api_client: client.ApiClient, namespace: str,
) -> None:
    flooded = gated_pod(api_client, namespace, "flooded")
    quiet = gated_pod(api_client, namespace, "quiet")
    counts = Counts()
    recorder = EventRecorder(api_client, fence=WriteFence(), metrics=counts)
    recorder.start()
    for i in range(40):
        recorder.event(flooded, "Warning", "Capacity", f"the most free on a node: {i}")
    recorder.event(quiet, "Warning", "Capacity", "the most free on a node: 1")
    assert recorder.flush(FLUSH)
    recorder.stop()

    about = Counter(e["involvedObject"]["name"] for e in events_in(api_client, namespace))
    assert about == {"flooded": 10, "quiet": 1}
    [combined] = [e for e in events_in(api_client, namespace)
                  if e["message"].startswith(AGGREGATE_PREFIX)]
    # Events 10..25 about the pod went into the combined event; the spam
    # filter's 25 tokens were spent then, so 26..40 were not sent.
    assert combined["count"] == 16
    assert combined["message"] == AGGREGATE_PREFIX + "the most free on a node: 24"
    assert counts[Outcome.CREATED] + counts[Outcome.UPDATED] == 26
    assert (counts[Outcome.FILTERED], counts[Outcome.AGGREGATED]) == (15, 31)
