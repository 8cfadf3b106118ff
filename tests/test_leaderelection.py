"""Leader election: client-go's timing rules on a fake clock, then real Leases.

The first half drives ``LeaderElector`` against an in-memory lock with the
same optimistic-concurrency contract as a Lease, on a clock that moves only
when the elector waits, so every timing rule is checked exactly and without
sleeping. The second half (marked ``plane``) runs electors against the real
API server.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuclaimctl.client.leaderelection import (
    EXPIRY_MARGIN,
    JITTER_FACTOR,
    STANDBY_SPREAD,
    ElectionOutcome,
    LeaderElectionConfig,
    LeaderElectionUnhealthy,
    LeaderElector,
    default_identity,
)
from gpuclaimctl.client.errors import AlreadyExists, Conflict
from gpuclaimctl.client.fence import NotLeader, WriteFence
from gpuclaimctl.client.leaselock import LeaderElectionRecord, LeaseLock
from metrics.leaderelection import LeaderElectionMetrics
from tests.helpers import wait_for

# ---------------------------------------------------------------------------
# Fakes


class ApiDown(ConnectionError):
    pass


class SelfAdvancingClock:
    """A fake clock whose time jumps forward whenever somebody waits on it.

    ``at(t, fn)`` runs ``fn`` when time reaches ``t``; a wait returns early
    at such a moment (as ``Condition.wait`` may) so the waiter re-checks.
    """

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_700_000_000.0
        self.waits: list[float] = []
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), fn))

    def wait_until(self, cond: threading.Condition, deadline: float | None) -> None:
        assert deadline is not None, "the elector never waits without a deadline"
        self.waits.append(deadline - self.mono)
        if self._events and self._events[0][0] <= deadline:
            when, _, fn = heapq.heappop(self._events)
            self.advance(max(0.0, when - self.mono))
            fn()
            return
        self.advance(max(0.0, deadline - self.mono))


class LeaseServer:
    """One stored election record with a version, like a Lease and its resourceVersion."""

    def __init__(self, clock: SelfAdvancingClock) -> None:
        self.clock = clock
        self.record: LeaderElectionRecord | None = None
        self.version = 0
        self.down = False
        self.writes: list[tuple[float, LeaderElectionRecord]] = []
        self.calls: list[str] = []

    def steal(self, holder: str) -> None:
        """Another writer overwrites the record, as `kubectl edit` would."""
        assert self.record is not None
        self._store(dataclasses.replace(self.record, holder_identity=holder))

    def delete(self) -> None:
        """Someone deletes the Lease (`kubectl delete lease`)."""
        self.version += 1
        self.record = None

    def _store(self, record: LeaderElectionRecord) -> None:
        self.version += 1
        self.record = record
        self.writes.append((self.clock.monotonic(), record))


class FakeLock:
    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.version: int | None = None

    def describe(self) -> str:
        return "fake/lease"

    def _call(self, verb: str) -> None:
        self.server.calls.append(verb)
        if self.server.down:
            raise ApiDown("connection refused")

    def get(self, timeout: float) -> LeaderElectionRecord | None:
        self._call("get")
        self.version = self.server.version if self.server.record else None
        return self.server.record

    def create(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        self._call("create")
        if self.server.record is not None:
            raise AlreadyExists("already exists")
        self.server._store(record)
        self.version = self.server.version
        return record

    def update(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        self._call("update")
        if self.version != self.server.version:
            raise Conflict("the object has been modified")
        self.server._store(record)
        self.version = self.server.version
        return record


@dataclasses.dataclass
class Harness:
    clock: SelfAdvancingClock
    server: LeaseServer

    def elector(self, identity: str, **config: Any) -> LeaderElector:
        cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity=identity, **config)
        return LeaderElector(cfg, FakeLock(self.server), clock=self.clock, rng=random.Random(7))


@pytest.fixture
def h() -> Harness:
    clock = SelfAdvancingClock()
    return Harness(clock, LeaseServer(clock))


def held_by(holder: str, *, renew_time: str = "2024-01-01T00:00:00.000000Z") -> LeaderElectionRecord:
    return LeaderElectionRecord(holder, 15, renew_time, renew_time, 3)


# ---------------------------------------------------------------------------
# Configuration


def test_defaults_are_client_go_s_15_10_2() -> None:
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system")
    assert (cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == (15.0, 10.0, 2.0)
    assert cfg.release_on_cancel
    assert cfg.stop_budget == 5.0


def test_default_identity_is_hostname_underscore_uuid() -> None:
    identity = default_identity()
    host, _, rest = identity.rpartition("_")
    assert host == socket.gethostname()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", rest)
    assert default_identity() != identity


@pytest.mark.parametrize(
    ("durations", "message"),
    [
        pytest.param((10, 10, 2), "lease duration (10s) must be greater than renew deadline (10s)", id="lease-equals-renew"),
        pytest.param((5, 10, 2), "lease duration (5s) must be greater than renew deadline", id="lease-below-renew"),
        pytest.param((15, 2.4, 2), "renew deadline (2.4s) must be greater than 1.2 x retry period (2s)", id="renew-equals-jittered-retry"),
        pytest.param((15, 2, 2), "renew deadline (2s) must be greater than 1.2 x retry period", id="renew-equals-retry"),
        pytest.param((15, 10, 0), "retry period must be a positive number of seconds", id="zero-retry"),
        pytest.param((-1, 10, 2), "lease duration must be a positive number of seconds", id="negative-lease"),
        pytest.param((float("nan"), 10, 2), "lease duration must be a positive number", id="nan-lease"),
        pytest.param((float("inf"), 10, 2), "lease duration must be a positive number", id="infinite-lease"),
    ],
)
def test_durations_out_of_order_are_refused_with_one_line(
    durations: tuple[float, float, float], message: str
) -> None:
    lease, renew, retry = durations
    with pytest.raises(ValueError) as err:
        LeaderElectionConfig("l", "ns", lease_duration=lease, renew_deadline=renew, retry_period=retry)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_renew_deadline_just_above_jittered_retry_is_accepted() -> None:
    LeaderElectionConfig("l", "ns", lease_duration=3, renew_deadline=2.41, retry_period=2)


@pytest.mark.parametrize(
    ("name", "namespace", "identity"),
    [
        pytest.param("Bad_Name", "ns", "me", id="lease-name-not-dns"),
        pytest.param("lease", "kube.system", "me", id="namespace-not-a-label"),
        pytest.param("lease", "ns", "", id="empty-identity"),
    ],
)
def test_bad_names_are_refused(name: str, namespace: str, identity: str) -> None:
    with pytest.raises(ValueError):
        LeaderElectionConfig(name, namespace, identity=identity)


def test_fractional_lease_duration_is_written_rounded_up(h: Harness) -> None:
    a = h.elector("a", lease_duration=2.5, renew_deadline=2, retry_period=1)
    assert a.try_acquire_or_renew(1)
    assert h.server.record is not None
    assert h.server.record.lease_duration_seconds == 3


# ---------------------------------------------------------------------------
# One attempt: the timing and concurrency rules


def test_a_missing_lease_is_created_with_us_as_holder(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    assert a.is_leader()
    record = h.server.record
    assert record is not None
    assert (record.holder_identity, record.lease_duration_seconds, record.leader_transitions) == ("a", 15, 0)
    assert record.renew_time == "2023-11-14T22:13:20.000000Z"


@pytest.mark.parametrize(
    "renew_time",
    [
        pytest.param("1970-01-01T00:00:00.000000Z", id="stamped-long-ago"),
        pytest.param("2999-01-01T00:00:00.000000Z", id="stamped-in-the-future"),
    ],
)
def test_expiry_counts_from_when_we_saw_the_record_not_its_timestamps(
    h: Harness, renew_time: str
) -> None:
    h.server._store(held_by("b", renew_time=renew_time))
    a = h.elector("a")
    assert not a.try_acquire_or_renew(10)
    first_seen = h.clock.mono

    h.clock.advance(14.999)
    assert not a.try_acquire_or_renew(10)
    assert not a.is_leader()

    h.clock.advance(15 - 14.999)
    assert h.clock.mono == pytest.approx(first_seen + 15)
    assert a.try_acquire_or_renew(10)
    assert h.server.record is not None
    assert h.server.record.holder_identity == "a"
    assert h.server.record.leader_transitions == 4


def test_a_renewal_by_the_holder_restarts_the_expiry_clock(h: Harness) -> None:
    b = h.elector("b")
    a = h.elector("a")
    assert b.try_acquire_or_renew(10)
    assert not a.try_acquire_or_renew(10)

    h.clock.advance(10)
    assert b.try_acquire_or_renew(10)  # b renews
    h.clock.advance(6)  # 16 s since a first saw b; a sees the renewal only now
    assert not a.try_acquire_or_renew(10)
    h.clock.advance(14.999)
    assert not a.try_acquire_or_renew(10)
    h.clock.advance(0.001)  # 15 s since a saw the renewal
    assert a.try_acquire_or_renew(10)
    assert a.leader() == "a"


def test_a_deleted_lease_is_waited_out_for_the_holder_last_seen(h: Harness) -> None:
    """Deleting the Lease does not stop its holder, which writes until its
    renew fails: a standby that creates it at once is a second writer."""
    b = h.elector("b")
    a = h.elector("a")
    assert b.try_acquire_or_renew(10)
    assert not a.try_acquire_or_renew(10)
    seen = h.clock.mono
    h.server.delete()
    calls = len(h.server.calls)

    h.clock.advance(14.9)
    assert not a.try_acquire_or_renew(10)
    assert h.server.record is None
    assert "create" not in h.server.calls[calls:]
    h.clock.advance(seen + 15 - h.clock.mono)
    assert a.try_acquire_or_renew(10)
    assert h.server.record is not None and h.server.record.holder_identity == "a"


def test_the_holder_recreates_its_deleted_lease_and_keeps_leading(h: Harness) -> None:
    b = h.elector("b")
    a = h.elector("a")
    assert b.try_acquire_or_renew(10)
    assert not a.try_acquire_or_renew(10)
    h.server.delete()
    h.clock.advance(2)
    assert b.try_acquire_or_renew(10)
    assert b.is_leader()
    assert h.server.record is not None and h.server.record.holder_identity == "b"
    assert not a.try_acquire_or_renew(10)


def test_a_released_lease_is_taken_at_once(h: Harness) -> None:
    h.server._store(LeaderElectionRecord("", 1, None, None, 5))
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    assert h.server.record is not None
    assert (h.server.record.holder_identity, h.server.record.leader_transitions) == ("a", 6)


def test_acquired_at_is_when_the_taking_write_returned_and_renewals_keep_it(h: Harness) -> None:
    a = h.elector("a")
    assert a.acquired_at is None
    assert a.try_acquire_or_renew(10)
    taken = a.acquired_at
    assert taken == h.clock.mono
    h.clock.advance(2)
    assert a.try_acquire_or_renew(10)  # the one-write renewal
    assert h.server.record is not None
    h.server._store(h.server.record)  # someone else wrote: a reread, still ours
    h.clock.advance(2)
    assert a.try_acquire_or_renew(10)
    assert a.acquired_at == taken, "one term"


def test_acquired_at_moves_on_when_the_lease_is_taken_again_after_another_holder(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    first = a.acquired_at
    h.server.steal("thief")
    assert not a.try_acquire_or_renew(10)
    h.clock.advance(15)
    assert a.try_acquire_or_renew(10)
    assert first is not None and a.acquired_at == h.clock.mono > first, \
        "the thief may have written meanwhile: a new term"


def test_try_first_takes_a_free_lease_and_never_one_held_by_another(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_first()
    assert a.is_leader() and a.acquired_at is not None
    b = h.elector("b")
    assert not b.try_first(), "a holder seen for the first time is waited out, by run"
    assert b.acquired_at is None


def test_try_first_comes_before_run(h: Harness) -> None:
    a = h.elector("a")
    a.cancel()
    assert a.run(lambda stop: None, lambda: None) is ElectionOutcome.CANCELLED
    with pytest.raises(RuntimeError):
        a.try_first()


def test_racing_candidates_resolve_by_resource_version_never_by_force(h: Harness) -> None:
    h.server._store(LeaderElectionRecord("", 1, None, None, 0))
    a_lock, b_lock = FakeLock(h.server), FakeLock(h.server)
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a")
    a = LeaderElector(cfg, a_lock, clock=h.clock)
    b = LeaderElector(dataclasses.replace(cfg, identity="b"), b_lock, clock=h.clock)
    # b reads the free Lease; a takes it before b writes.
    assert b_lock.get(1) is not None
    assert a.try_acquire_or_renew(10)

    with pytest.raises(Conflict):
        b_lock.update(held_by("b"), 1)
    assert not b.try_acquire_or_renew(10)  # reads again and finds a holding it
    assert h.server.record is not None
    assert h.server.record.holder_identity == "a"
    assert b.leader() == "a"


def test_the_leader_renews_with_one_write_and_rereads_only_on_conflict(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    h.server.calls.clear()

    assert a.try_acquire_or_renew(10)
    assert h.server.calls == ["update"]

    h.server.calls.clear()
    assert h.server.record is not None
    h.server._store(h.server.record)  # someone else wrote (a label, say): a new version
    assert a.try_acquire_or_renew(10)
    assert h.server.calls == ["update", "get", "update"]
    assert a.is_leader()


def test_a_leader_that_finds_another_holder_stops_being_leader(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    h.server.steal("thief")
    assert not a.try_acquire_or_renew(10)
    assert not a.is_leader()
    assert a.leader() == "thief"


def test_renewal_keeps_acquire_time_and_transition_count(h: Harness) -> None:
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    first = h.server.record
    h.clock.advance(2)
    assert a.try_acquire_or_renew(10)
    again = h.server.record
    assert first is not None and again is not None
    assert again.acquire_time == first.acquire_time
    assert again.renew_time != first.renew_time
    assert again.leader_transitions == first.leader_transitions


# ---------------------------------------------------------------------------
# Health


def test_healthz_fails_only_for_a_leader_stuck_past_lease_plus_margin(h: Harness) -> None:
    a, b = h.elector("a"), h.elector("b")
    assert a.try_acquire_or_renew(10)
    assert not b.try_acquire_or_renew(10)
    a.check(20)

    h.clock.advance(35)
    a.check(20)  # exactly lease + margin: still tolerated
    h.clock.advance(0.001)
    with pytest.raises(LeaderElectionUnhealthy, match="failed election to renew leadership"):
        a.check(20)
    b.check(20)  # a standby is never unhealthy

    assert a.try_acquire_or_renew(10)
    a.check(20)


# ---------------------------------------------------------------------------
# run(): the loops


class Recorder:
    """Callbacks that write down what happened and when (on the fake clock)."""

    def __init__(self, clock: SelfAdvancingClock) -> None:
        self.clock = clock
        self.events: list[tuple[str, float]] = []
        self.leaders: list[str] = []
        self.stop: threading.Event | None = None
        self.worker_began = threading.Event()
        self.worker_saw_stop = threading.Event()
        self._lock = threading.Lock()

    def _note(self, what: str) -> None:
        with self._lock:
            self.events.append((what, self.clock.mono))

    def started(self, stop: threading.Event) -> None:
        self.stop = stop
        self._note("started")
        self.worker_began.set()
        stop.wait()
        self.worker_saw_stop.set()

    def stopped(self) -> None:
        # The worker's thread was started before leading began, but on LOST
        # nothing waits for it: let it note its start (real time, briefly).
        assert self.worker_began.wait(5)
        assert self.stop is not None and self.stop.is_set(), \
            "workers must be told to stop before on_stopped_leading"
        self._note("stopped")

    def new_leader(self, identity: str) -> None:
        self.leaders.append(identity)

    def when(self, what: str) -> float:
        return next(t for name, t in self.events if name == what)

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


def run(elector: LeaderElector, rec: Recorder) -> ElectionOutcome:
    return elector.run(rec.started, rec.stopped, rec.new_leader)


def test_a_failing_api_stops_the_leader_before_the_lease_could_expire_elsewhere(
    h: Harness,
) -> None:
    registry = CollectorRegistry()
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a")
    a = LeaderElector(cfg, FakeLock(h.server), clock=h.clock, rng=random.Random(1),
                      metrics=LeaderElectionMetrics(registry))
    rec = Recorder(h.clock)
    outage = h.clock.mono + 7.0
    h.clock.at(outage, lambda: setattr(h.server, "down", True))

    assert run(a, rec) is ElectionOutcome.LOST

    last_write = max(t for t, r in h.server.writes if r.holder_identity == "a")
    assert last_write < outage
    stopped = rec.when("stopped")
    # Others may take over from last_write + lease_duration; we stopped by
    # last_write + renew_deadline, leaving the whole stop budget.
    assert stopped <= last_write + cfg.renew_deadline
    assert stopped < last_write + cfg.lease_duration
    assert rec.names() == ["started", "stopped"]
    # A lost lease is not "released": nothing was written after the outage.
    assert all(t < outage for t, _ in h.server.writes)
    assert registry.get_sample_value("leader_election_master_status", {"name": "gpuclaimctl"}) == 0


def test_renewals_happen_every_retry_period_while_leading(h: Harness) -> None:
    a = h.elector("a")
    rec = Recorder(h.clock)
    start = h.clock.mono
    h.clock.at(start + 9.0, a.cancel)
    assert run(a, rec) is ElectionOutcome.CANCELLED
    renewals = [t - start for t, r in h.server.writes if r.holder_identity == "a"]
    assert renewals == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_a_stolen_lease_stops_the_leader_at_its_next_renewal(h: Harness) -> None:
    a = h.elector("a")
    rec = Recorder(h.clock)
    stolen_at = h.clock.mono + 5.0
    h.clock.at(stolen_at, lambda: h.server.steal("thief"))

    assert run(a, rec) is ElectionOutcome.LOST
    assert rec.when("stopped") <= stolen_at + a.config.retry_period
    assert rec.leaders == ["a", "thief"]
    assert h.server.record is not None and h.server.record.holder_identity == "thief"


def test_cancel_stops_workers_then_releases_the_lease(h: Harness) -> None:
    registry = CollectorRegistry()
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a")
    a = LeaderElector(cfg, FakeLock(h.server), clock=h.clock, metrics=LeaderElectionMetrics(registry))
    rec = Recorder(h.clock)
    gauge: list[float | None] = []
    h.clock.at(h.clock.mono + 3.0, lambda: gauge.append(
        registry.get_sample_value("leader_election_master_status", {"name": "gpuclaimctl"})))
    h.clock.at(h.clock.mono + 5.0, a.cancel)

    assert run(a, rec) is ElectionOutcome.CANCELLED

    assert gauge == [1.0]
    assert registry.get_sample_value("leader_election_master_status", {"name": "gpuclaimctl"}) == 0
    assert rec.names() == ["started", "stopped"]
    released_at, released = h.server.writes[-1]
    assert (released.holder_identity, released.lease_duration_seconds) == ("", 1)
    assert released_at >= rec.when("stopped")
    assert not a.is_leader()


def test_a_standby_takes_a_released_lease_at_its_next_retry(h: Harness) -> None:
    a, b = h.elector("a"), h.elector("b")
    assert a.try_acquire_or_renew(10)
    assert not b.try_acquire_or_renew(10)
    a._release()
    h.clock.advance(2)
    assert b.try_acquire_or_renew(10)


def test_without_release_on_cancel_the_lease_is_left_to_expire(h: Harness) -> None:
    a = h.elector("a", release_on_cancel=False)
    rec = Recorder(h.clock)
    h.clock.at(h.clock.mono + 3.0, a.cancel)
    assert run(a, rec) is ElectionOutcome.CANCELLED
    assert h.server.record is not None and h.server.record.holder_identity == "a"


def test_cancel_before_leading_returns_without_calling_on_stopped_leading(h: Harness) -> None:
    h.server._store(held_by("b"))
    a = h.elector("a")
    rec = Recorder(h.clock)
    h.clock.at(h.clock.mono + 30.0, a.cancel)

    def b_renews() -> None:
        assert h.server.record is not None
        h.server._store(dataclasses.replace(h.server.record, renew_time=str(h.clock.mono)))

    # b keeps renewing, so a never gets the lease.
    for t in range(2, 30, 2):
        h.clock.at(h.clock.mono + t, b_renews)
    assert run(a, rec) is ElectionOutcome.CANCELLED
    assert rec.names() == []
    assert rec.leaders == ["b"]
    assert h.server.record is not None and h.server.record.holder_identity == "b"


def test_a_standby_takes_over_once_the_holder_stops_renewing(h: Harness) -> None:
    h.server._store(held_by("b"))
    a = h.elector("a")
    rec = Recorder(h.clock)
    seen = h.clock.mono
    acquired: list[float] = []
    h.clock.at(seen + 40, a.cancel)

    def started(stop: threading.Event) -> None:
        acquired.append(h.clock.mono)

    assert a.run(started, lambda: None, rec.new_leader) is ElectionOutcome.CANCELLED
    assert rec.leaders == ["b", "a"]
    # Not before the lease expired on our clock, and at once after it: the
    # standby wakes at the observed expiry rather than at its next retry.
    assert seen + 15 <= acquired[0] <= seen + 15 + EXPIRY_MARGIN + 1e-9


def test_a_standby_takes_over_within_a_lease_and_a_retry_of_the_last_renewal(h: Harness) -> None:
    """The last renewal lands just after the standby read the Lease: it sees
    it at most one retry period later, and takes over as that expires."""
    h.server._store(held_by("b"))
    a = h.elector("a")
    rec = Recorder(h.clock)
    start = h.clock.mono
    last_renewal = start + 0.001

    def b_renews_once_more() -> None:
        assert h.server.record is not None
        h.server._store(dataclasses.replace(h.server.record, renew_time="later"))

    h.clock.at(last_renewal, b_renews_once_more)
    acquired: list[float] = []
    h.clock.at(start + 60, a.cancel)
    a.run(lambda stop: acquired.append(h.clock.mono), lambda: None, rec.new_leader)
    assert acquired, "a must take over"
    bound = last_renewal + 15 + a.config.retry_period + EXPIRY_MARGIN
    assert acquired[0] <= bound


def test_acquire_retries_come_within_one_retry_period_and_are_spread(h: Harness) -> None:
    h.server._store(held_by("b"))
    a = LeaderElector(
        LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a", lease_duration=1000,
                             renew_deadline=10, retry_period=2),
        FakeLock(h.server), clock=h.clock, rng=random.Random(3),
    )

    # b's lease outlasts the test, so every wait of a's is a standby's wait.
    h.server._store(dataclasses.replace(held_by("b"), lease_duration_seconds=10_000))
    h.clock.at(h.clock.mono + 200, a.cancel)
    a.run(lambda stop: None, lambda: None)
    waits = h.clock.waits[:-1]  # the last wait was cut short by cancel
    assert len(waits) > 50
    assert all(2.0 * (1 - STANDBY_SPREAD) <= w <= 2.0 for w in waits)
    assert max(waits) - min(waits) > 0.2  # spread, so candidates do not retry in step


def test_a_raising_worker_ends_leadership_and_releases(h: Harness) -> None:
    a = h.elector("a")

    def boom(stop: threading.Event) -> None:
        raise RuntimeError("controller failed to start")

    stopped: list[bool] = []
    outcome = a.run(boom, lambda: stopped.append(True))
    assert outcome is ElectionOutcome.WORKER_FAILED
    assert stopped == [True]
    assert h.server.record is not None and h.server.record.holder_identity == ""


def test_run_is_single_use(h: Harness) -> None:
    a = h.elector("a")
    h.clock.at(h.clock.mono + 1, a.cancel)
    a.run(lambda stop: None, lambda: None)
    with pytest.raises(RuntimeError, match="only once"):
        a.run(lambda stop: None, lambda: None)


# ---------------------------------------------------------------------------
# The write fence (DESIGN I3): only the leader writes


class SlowLock(FakeLock):
    """A lock whose writes take ``delay`` seconds (the clock moves meanwhile),
    or, once ``pause_next`` is set, one write during which the process is
    paused for that long."""

    def __init__(self, server: LeaseServer, delay: float = 0.0) -> None:
        super().__init__(server)
        self.delay = delay
        self.pause_next = 0.0

    def update(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        self.server.clock.advance(self.delay + self.pause_next)
        self.pause_next = 0.0
        return super().update(record, timeout)

    def create(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        self.server.clock.advance(self.delay)
        return super().create(record, timeout)


def test_the_fence_opens_until_the_start_of_each_renewal_plus_the_renew_deadline(
    h: Harness,
) -> None:
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a")
    fence = WriteFence(h.clock.monotonic)
    a = LeaderElector(cfg, SlowLock(h.server, delay=1.0), clock=h.clock, fence=fence)
    assert a.fence is fence
    started = h.clock.mono
    assert a.try_acquire_or_renew(10)
    # Counted from when the request was sent, not from its answer a second later.
    assert fence.check() == pytest.approx(cfg.lease_duration - 1.0)
    h.clock.advance(cfg.renew_deadline - 1.0 - 0.001)
    fence.check()
    h.clock.advance(0.001)
    with pytest.raises(NotLeader):
        fence.check()

    # A renewal started now opens it again, for as long.
    h.clock.mono = started + 5.0
    assert a.try_acquire_or_renew(10)
    h.clock.mono = started + 5.0 + cfg.renew_deadline - 0.001
    fence.check()


def test_a_standby_never_arms_the_fence(h: Harness) -> None:
    h.server._store(held_by("b"))
    a = h.elector("a")
    assert not a.try_acquire_or_renew(10)
    assert a.fence.check() == float("inf")  # unarmed; its workers do not run


def test_a_leader_paused_past_its_lease_writes_nothing_and_stops_without_waiting_for_workers(
    h: Harness,
) -> None:
    """SIGSTOP for longer than the lease, while the standby takes over, then
    SIGCONT: the workers may run before the elector's thread does; the
    fence refuses their writes already, and the elector ends at once."""
    a = h.elector("a")
    pause_at = h.clock.mono + 5.5  # between two renewals (0, 2, 4, 6 s)
    pause = a.config.lease_duration + 3.0
    during_pause: list[str] = []

    def paused_and_taken_over() -> None:
        h.clock.advance(pause)
        h.server.steal("b")
        try:  # a worker that runs first after SIGCONT
            a.fence.check()
            during_pause.append("sent")
        except NotLeader:
            during_pause.append("refused")

    h.clock.at(pause_at, paused_and_taken_over)
    hold = threading.Event()
    late_write: list[str] = []

    def worker(stop: threading.Event) -> None:
        # A sync in progress that does not look at `stop` before it writes.
        hold.wait(30)
        try:
            a.fence.check()
            late_write.append("sent")
        except NotLeader:
            late_write.append("refused")

    fence_when_stopped: list[bool] = []
    outcome = a.run(worker, lambda: fence_when_stopped.append(a.fence.closed))

    assert outcome is ElectionOutcome.LOST
    assert during_pause == ["refused"]
    assert fence_when_stopped == [True]
    # run() came back with the worker still in its sync: it did not wait
    # for it (the old join waited 0 s here too, but with nothing to stop
    # the worker's writes).
    assert late_write == []
    hold.set()
    wait_for(lambda: late_write, timeout=10, message="the late worker to try its write")
    assert late_write == ["refused"]
    # Not a single renewal after the pause, and no release over b's Lease.
    assert all(t < pause_at for t, r in h.server.writes if r.holder_identity == "a")
    assert h.server.record is not None and h.server.record.holder_identity == "b"


def test_a_renewal_that_returns_only_after_a_pause_ends_leadership(h: Harness) -> None:
    cfg = LeaderElectionConfig("gpuclaimctl", "kube-system", identity="a")
    lock = SlowLock(h.server)
    a = LeaderElector(cfg, lock, clock=h.clock)
    # The process stops inside its third renewal for longer than the renew deadline.
    h.clock.at(h.clock.mono + 5.0, lambda: setattr(lock, "pause_next", cfg.renew_deadline + 1.0))
    rec = Recorder(h.clock)

    assert run(a, rec) is ElectionOutcome.LOST
    # Nobody took the Lease, but counted from when that renewal started it
    # is stale: the fence never reopened, and leadership ended right away.
    assert h.server.record is not None and h.server.record.holder_identity == "a"
    with pytest.raises(NotLeader):
        a.fence.check()
    # Ended as that renewal came back, not a retry period later.
    assert rec.when("stopped") == h.server.writes[-1][0]


def test_a_lost_lease_closes_the_fence_before_workers_are_told_to_stop(h: Harness) -> None:
    a = h.elector("a")
    h.clock.at(h.clock.mono + 5.0, lambda: h.server.steal("thief"))
    closed_when_told: list[bool] = []

    def worker(stop: threading.Event) -> None:
        stop.wait()
        closed_when_told.append(a.fence.closed)

    assert a.run(worker, lambda: None) is ElectionOutcome.LOST
    wait_for(lambda: closed_when_told, timeout=10, message="the worker to be told to stop")
    assert closed_when_told == [True]


def test_cancel_closes_the_fence_after_the_workers_stopped_and_before_the_release(
    h: Harness,
) -> None:
    a = h.elector("a")
    h.clock.at(h.clock.mono + 5.0, a.cancel)
    seen: list[tuple[str, bool]] = []

    def worker(stop: threading.Event) -> None:
        stop.wait()
        a.fence.check()  # an in-flight sync's last write still leaves
        seen.append(("worker", a.fence.closed))

    assert a.run(worker, lambda: seen.append(("stopped", a.fence.closed))) \
        is ElectionOutcome.CANCELLED
    assert seen == [("worker", False), ("stopped", True)]
    released = h.server.writes[-1][1]
    assert released.holder_identity == ""
    with pytest.raises(NotLeader):
        a.fence.check()


# ---------------------------------------------------------------------------
# Against the real API server


class RecordingLock:
    """Wraps a real LeaseLock and notes when each successful write was sent."""

    def __init__(self, inner: LeaseLock) -> None:
        self.inner = inner
        self.writes: list[tuple[float, LeaderElectionRecord]] = []
        self._guard = threading.Lock()

    def describe(self) -> str:
        return self.inner.describe()

    def get(self, timeout: float) -> LeaderElectionRecord | None:
        return self.inner.get(timeout)

    def create(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        sent = time.monotonic()
        stored = self.inner.create(record, timeout)
        with self._guard:
            self.writes.append((sent, stored))
        return stored

    def update(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        sent = time.monotonic()
        stored = self.inner.update(record, timeout)
        with self._guard:
            self.writes.append((sent, stored))
        return stored

    def last_write(self) -> float:
        with self._guard:
            return self.writes[-1][0]


class Leadership:
    """Counts how many candidates lead at once."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.current = 0
        self.most = 0

    def enter(self) -> None:
        with self._guard:
            self.current += 1
            self.most = max(self.most, self.current)

    def leave(self) -> None:
        with self._guard:
            self.current -= 1


class Candidate:
    """One elector on a real Lease, campaigning in its own thread."""

    def __init__(self, api_client: Any, namespace: str, identity: str, leadership: Leadership,
                 **durations: float) -> None:
        cfg = LeaderElectionConfig("gpuclaimctl-test", namespace, identity=identity, **durations)  # type: ignore[arg-type]
        self.lock = RecordingLock(LeaseLock(api_client, namespace, cfg.lease_name))
        self.elector = LeaderElector(cfg, self.lock)
        self.leadership = leadership
        self.leading = threading.Event()
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.outcome: ElectionOutcome | None = None
        self._thread = threading.Thread(target=self._run, name=f"candidate-{identity}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.outcome = self.elector.run(self._started, self._stopped)

    def _started(self, stop: threading.Event) -> None:
        self.leadership.enter()
        self.started_at = time.monotonic()
        self.leading.set()
        stop.wait()

    def _stopped(self) -> None:
        self.stopped_at = time.monotonic()
        self.leading.clear()
        self.leadership.leave()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def stop(self) -> None:
        self.elector.cancel()
        self._thread.join(timeout=30)
        self.lock.inner.close()


@pytest.fixture
def candidates(api_client: Any, namespace: str) -> Iterator[Callable[..., Candidate]]:
    made: list[Candidate] = []
    leadership = Leadership()

    def make(identity: str, **durations: float) -> Candidate:
        c = Candidate(api_client, namespace, identity, leadership, **durations)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
    assert leadership.most <= 1, "two candidates led at the same time"


def read_lease(api_client: Any, namespace: str) -> Any:
    from kubernetes import client

    return client.CoordinationV1Api(api_client).read_namespaced_lease("gpuclaimctl-test", namespace)


FAST = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 1.0}


@pytest.mark.plane
def test_two_candidates_only_one_leads_and_a_release_hands_over_promptly(
    api_client: Any, namespace: str, candidates: Callable[..., Candidate]
) -> None:
    a, b = candidates("a", **FAST), candidates("b", **FAST)
    wait_for(lambda: a.leading.is_set() or b.leading.is_set(), timeout=20, message="a leader")
    leader, standby = (a, b) if a.leading.is_set() else (b, a)
    lease = read_lease(api_client, namespace)
    assert lease.spec.holder_identity == leader.elector.config.identity
    assert lease.spec.lease_duration_seconds == 15

    # Let the leader renew twice while the standby watches.
    first_renew = lease.spec.renew_time
    wait_for(lambda: standby.elector.leader() == leader.elector.config.identity, timeout=10,
             message="the standby to see the leader")
    renewals = len(leader.lock.writes)
    wait_for(lambda: len(leader.lock.writes) >= renewals + 2, timeout=10, message="two renewals")
    assert read_lease(api_client, namespace).spec.renew_time != first_renew
    assert not standby.leading.is_set()
    assert leader.elector.is_leader() and not standby.elector.is_leader()

    leader.stop()
    assert leader.outcome is ElectionOutcome.CANCELLED
    released_at, released = leader.lock.writes[-1]
    assert (released.holder_identity, released.lease_duration_seconds) == ("", 1)
    assert leader.stopped_at <= released_at  # workers stopped before the release

    wait_for(standby.leading.is_set, timeout=10, message="the standby to take over")
    handover = standby.started_at - leader.stopped_at
    # One jittered retry at most, nowhere near the 15 s lease.
    assert handover < FAST["retry_period"] * (1 + JITTER_FACTOR) + 1.0
    assert read_lease(api_client, namespace).spec.holder_identity == standby.elector.config.identity


@pytest.mark.plane
def test_a_stolen_lease_stops_the_leader_and_is_not_taken_back(
    api_client: Any, namespace: str, candidates: Callable[..., Candidate]
) -> None:
    from kubernetes import client

    a = candidates("a", **FAST)
    wait_for(a.leading.is_set, timeout=20, message="a to lead")
    coordination = client.CoordinationV1Api(api_client)
    lease = read_lease(api_client, namespace)
    lease.spec.holder_identity = "intruder"
    coordination.replace_namespaced_lease("gpuclaimctl-test", namespace, lease)
    stolen_at = time.monotonic()

    wait_for(a.done, timeout=10, message="a to stop leading")
    assert a.outcome is ElectionOutcome.LOST
    assert a.stopped_at - stolen_at < FAST["retry_period"] + 1.0
    assert read_lease(api_client, namespace).spec.holder_identity == "intruder"


@pytest.mark.plane
def test_an_unreachable_api_server_stops_the_leader_before_its_lease_expires(
    api_client: Any, namespace: str, control_plane: Any, candidates: Callable[..., Candidate]
) -> None:
    durations = {"lease_duration": 6.0, "renew_deadline": 4.0, "retry_period": 1.0}
    a = candidates("a", **durations)
    wait_for(a.leading.is_set, timeout=20, message="a to lead")
    renewals = len(a.lock.writes)
    wait_for(lambda: len(a.lock.writes) > renewals, timeout=10, message="a renewal")

    control_plane.stop_apiserver()
    try:
        wait_for(a.done, timeout=30, message="a to stop leading")
    finally:
        control_plane.start_apiserver()

    assert a.outcome is ElectionOutcome.LOST
    last_renewal = a.lock.last_write()
    # Stopped within the renew deadline of the last renewal (plus one
    # request's worth of slack), so well before anyone may take over.
    assert a.stopped_at <= last_renewal + durations["renew_deadline"] + 0.5
    assert a.stopped_at < last_renewal + durations["lease_duration"]


def test_a_renewal_that_would_start_after_the_renew_deadline_sends_nothing(h: Harness) -> None:
    """The renew loop looked at the clock before its deadline, then the
    process was paused: the attempt, starting past the deadline, must not
    renew (and so reopen the fence of) a leader that should have ended."""
    a = h.elector("a")
    assert a.try_acquire_or_renew(10)
    calls = len(h.server.calls)
    deadline = h.clock.mono + a.config.renew_deadline
    h.clock.advance(a.config.renew_deadline + 1.0)  # the pause
    assert not a.try_acquire_or_renew(5.0, not_after=deadline)
    assert len(h.server.calls) == calls  # not a request sent
    with pytest.raises(NotLeader):
        a.fence.check()
    # Before the deadline the same call renews as ever.
    assert a.try_acquire_or_renew(5.0, not_after=h.clock.mono + 1.0)
