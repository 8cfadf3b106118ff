"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Only the replica that holds the Lease runs the controller's workers; the
others wait to take over. As in client-go's ``tools/leaderelection``:

- A candidate judges expiry only by its own monotonic clock: the Lease is
  free once ``lease_duration`` seconds have passed since this process last
  *saw the record change*. The timestamps written in the Lease are never
  compared with our clock, so clock skew between machines does not matter.
- Every write carries the resourceVersion last read; a conflict means
  somebody else wrote in between and is answered by reading again, never by
  overwriting.
- The leader renews every ``retry_period``. When it cannot renew within
  ``renew_deadline`` of its last successful renewal, or sees another holder
  in the Lease, it stops leading at once: its workers are stopped while at
  least ``lease_duration - renew_deadline`` seconds remain before any other
  candidate may consider the Lease expired.
- On cancel (SIGTERM) the leader stops its workers, then releases the
  Lease by writing an empty holder and a one-second duration, so a standby
  takes over at its next retry instead of waiting out the lease.
- Only the leader writes (DESIGN I3): every successful acquire or renew
  moves the ``WriteFence`` on to the moment that request was started plus
  ``renew_deadline``; the controller's writes are checked against it as
  they leave. Leadership lost closes the fence at once, before the workers
  are even told to stop, so a leader that was paused past its lease (and
  whose workers run again before this thread notices) sends nothing.

Two deliberate differences from client-go: the renew deadline counts from
the last successful renewal (client-go starts it a retry period later,
which eats into the margin above), and workers are stopped and the fence
closed *before* the release (client-go releases first and leaves that
ordering to the caller).

The Lease itself is read and written by ``leaselock.LeaseLock``, the only
writer of Leases here. Neither module starts threads or makes requests at
import.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import re
import socket
import threading
import uuid
from typing import Callable

from kubernetes import client

from gpuclaimctl.client.fence import WriteFence
from gpuclaimctl.client.leaselock import LeaderElectionRecord, LeaseLock, ResourceLock, micro_time
from gpuclaimctl.logs import get_logger
from metrics.leaderelection import LeaderElectionMetrics
from workqueue.clock import Clock, RealClock

# client-go's leaderelection.JitterFactor: candidates retry after
# retry_period * (1 + rand * 1.2) (this elector's standbys wait less; see
# _next_attempt), and renew_deadline must exceed
# retry_period * 1.2 so a renewal gets more than one try.
JITTER_FACTOR = 1.2
# Standbys retry within (1 - STANDBY_SPREAD, 1] retry periods.
STANDBY_SPREAD = 0.25
# Past the observed expiry before a standby writes (its clock and the
# leader's last renewal are measured on different machines' schedules).
EXPIRY_MARGIN = 0.01

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def default_identity() -> str:
    """``<hostname>_<uuid4>``: unique even when two replicas share a hostname."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclasses.dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives, who we are, and the three durations (seconds).

    Invariant (checked on construction): every duration is positive and
    ``lease_duration > renew_deadline > JITTER_FACTOR * retry_period``.
    """

    lease_name: str
    namespace: str
    identity: str = dataclasses.field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if len(self.lease_name) > 253 or not _DNS1123_SUBDOMAIN.match(self.lease_name):
            raise ValueError(
                f"lease name {self.lease_name!r} is not a valid DNS subdomain "
                "(lower-case letters, digits, '-' and '.')"
            )
        if len(self.namespace) > 63 or not _DNS1123_LABEL.match(self.namespace):
            raise ValueError(
                f"lease namespace {self.namespace!r} is not a valid DNS label "
                "(lower-case letters, digits and '-')"
            )
        if not self.identity:
            raise ValueError("leader election identity must not be empty")
        for label, value in (
            ("lease duration", self.lease_duration),
            ("renew deadline", self.renew_deadline),
            ("retry period", self.retry_period),
        ):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{label} must be a positive number of seconds, not {value!r}")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(
                f"lease duration ({self.lease_duration:g}s) must be greater than "
                f"renew deadline ({self.renew_deadline:g}s)"
            )
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"renew deadline ({self.renew_deadline:g}s) must be greater than "
                f"{JITTER_FACTOR:g} x retry period ({self.retry_period:g}s)"
            )

    @property
    def lease_duration_seconds(self) -> int:
        # The Lease holds whole seconds. Rounding up keeps others waiting at
        # least as long as we believe we hold it; rounding down would not.
        return math.ceil(self.lease_duration)

    @property
    def stop_budget(self) -> float:
        """Seconds between a failed renewal and the earliest takeover elsewhere.

        ``on_stopped_leading`` must have stopped every worker within this.
        """
        return self.lease_duration - self.renew_deadline

    def describe(self) -> str:
        return f"{self.namespace}/{self.lease_name}"


class ElectionOutcome(enum.Enum):
    """Why ``LeaderElector.run`` returned; the CLI maps it to an exit code."""

    CANCELLED = "cancelled"  # cancel() was called; the Lease was released if held
    LOST = "lost"  # renewal failed or another holder took the Lease
    WORKER_FAILED = "worker-failed"  # on_started_leading raised


class LeaderElectionUnhealthy(Exception):
    """Raised by ``LeaderElector.check`` when leadership is stuck."""


class LeaderElector:
    """Runs one election on one lock; ``run`` may be called once.

    ``is_leader``, ``leader``, ``check`` and ``cancel`` may be called from any
    thread; ``cancel`` also from a signal handler.
    """

    def __init__(
        self,
        config: LeaderElectionConfig,
        lock: ResourceLock,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metrics: LeaderElectionMetrics | None = None,
        fence: WriteFence | None = None,
    ) -> None:
        self.config = config
        self._lock = lock
        self._clock: Clock = clock if clock is not None else RealClock()
        # Open while we may write: armed by each successful acquire or
        # renew, closed for good when leadership ends. Its clock must be
        # ours (the times we extend it with are read from ours).
        self.fence = fence if fence is not None else WriteFence(self._clock.monotonic)
        self._rng = rng if rng is not None else random.Random()
        self._metrics = metrics
        self._log = get_logger(__name__, lease=config.describe(), identity=config.identity)
        # Guards the observed record and time, read by other threads. An
        # RLock, because cancel() may run in a signal handler on the thread
        # that holds it.
        self._cond = threading.Condition(threading.RLock())
        self._observed: LeaderElectionRecord | None = None
        # Monotonic time at which _observed was last seen to change (for our
        # own writes: when the successful request was sent, the earliest
        # moment others can have seen it).
        self._observed_time = -math.inf
        # Monotonic time at which our last successful write was sent: the
        # Lease cannot expire anywhere before this plus its duration.
        self._last_write = -math.inf
        # Monotonic time at which the write that began our term returned.
        self._acquired_at: float | None = None
        self._reported_leader = ""
        self._cancelled = False
        self._worker_failed = False
        self._started = False
        self._on_new_leader: Callable[[str], None] | None = None
        if metrics is not None:
            metrics.leader_off(config.lease_name)

    @classmethod
    def on_lease(
        cls,
        config: LeaderElectionConfig,
        api_client: client.ApiClient,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metrics: LeaderElectionMetrics | None = None,
        fence: WriteFence | None = None,
    ) -> LeaderElector:
        """An elector on the Lease ``config`` names, through ``api_client``.

        The Lease's requests go through a client of their own and are never
        fenced: renewing is how the fence stays open.
        """
        lock = LeaseLock(api_client, config.namespace, config.lease_name)
        return cls(config, lock, clock=clock, rng=rng, metrics=metrics, fence=fence)

    # -- queries -------------------------------------------------------------

    @property
    def acquired_at(self) -> float | None:
        """When (monotonic) the write that took the Lease for this process's
        term returned; None before. Every earlier leader's writes had
        landed by then: the fence ends them before their Lease can expire
        (I3), and a released Lease was released only once its workers
        stopped. A list sent after it shows them all (Controller.catch_up).
        """
        with self._cond:
            return self._acquired_at

    def is_leader(self) -> bool:
        """Whether the last record we observed names us as the holder."""
        with self._cond:
            return self._observed is not None and (
                self._observed.holder_identity == self.config.identity
            )

    def leader(self) -> str:
        """The holder we last observed ('' when none)."""
        with self._cond:
            return self._observed.holder_identity if self._observed else ""

    def check(self, max_tolerable_expired: float) -> None:
        """Raise when we hold the lease but have not renewed it for too long.

        client-go's HealthzAdaptor: a leader that has not renewed for
        ``lease_duration + max_tolerable_expired`` should have stopped
        leading by itself; being stuck is what a liveness probe should see.
        A standby is always healthy.
        """
        with self._cond:
            if not (self._observed and self._observed.holder_identity == self.config.identity):
                return
            since = self._clock.monotonic() - self._observed_time
        if since > self.config.lease_duration + max_tolerable_expired:
            raise LeaderElectionUnhealthy(
                f"failed election to renew leadership on lease {self.config.describe()}: "
                f"last renewed {since:.1f}s ago"
            )

    # -- control ---------------------------------------------------------------

    def cancel(self) -> None:
        """Stop campaigning; a leader stops its workers and releases the Lease."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def run(
        self,
        on_started_leading: Callable[[threading.Event], None],
        on_stopped_leading: Callable[[], None],
        on_new_leader: Callable[[str], None] | None = None,
    ) -> ElectionOutcome:
        """Campaign until cancelled or, once leading, until leadership ends.

        ``on_started_leading(stop)`` runs in its own thread when we become
        leader; ``stop`` is set when leadership ends. It may block until then
        or start workers and return. ``on_stopped_leading()`` runs in this
        thread after ``stop`` is set and the fence is closed. It is not
        called if we never led.

        On cancel (or a failed worker) it runs after ``on_started_leading``
        has returned, or once the Lease could have expired elsewhere; when it
        returns every worker must have stopped, and the Lease is released
        only if they did. On LOST it runs at once, without waiting for the
        workers (client-go's order, kube-controller-manager's Fatalf): the
        closed fence already keeps their writes in, and the caller is
        expected to exit.

        ``on_new_leader(identity)`` runs in this thread whenever a different
        holder is observed, ourselves included; it must be quick.
        """
        with self._cond:
            if self._started:
                raise RuntimeError("a LeaderElector runs only once")
            self._started = True
        self._on_new_leader = on_new_leader
        if not self._acquire():
            return ElectionOutcome.CANCELLED
        if self._metrics is not None:
            self._metrics.leader_on(self.config.lease_name)
        stop = threading.Event()
        worker = threading.Thread(
            target=self._lead,
            args=(on_started_leading, stop),
            name=f"leader-{self.config.lease_name}",
            daemon=True,
        )
        worker.start()
        outcome = ElectionOutcome.LOST
        try:
            outcome = self._renew()
        finally:
            if outcome is ElectionOutcome.LOST:
                self.fence.close("leader election lost")
            if self._metrics is not None:
                self._metrics.leader_off(self.config.lease_name)
            stop.set()
        stopped_in_time = False
        if outcome is not ElectionOutcome.LOST:
            # Bound the wait by when the Lease may expire elsewhere: past
            # that, waiting longer buys nothing. After a pause longer than
            # the lease this waits not at all; the fence, not this wait, is
            # what keeps a late worker's writes in.
            with self._cond:
                expires = self._last_write + self.config.lease_duration
            worker.join(timeout=max(0.0, expires - self._clock.monotonic()))
            stopped_in_time = not worker.is_alive()
            if not stopped_in_time:
                self._log.error("on_started_leading has not returned; stopping anyway")
            self.fence.close(f"stopped leading ({outcome.value})")
        try:
            on_stopped_leading()
        except Exception:
            self._log.exception("on_stopped_leading raised")
        if outcome is not ElectionOutcome.LOST and self.config.release_on_cancel:
            if stopped_in_time:
                self._release()
            else:
                # Releasing would let a standby start while our workers
                # may still write; let the Lease expire instead.
                self._log.error("not releasing the Lease: workers may still be running")
        self._log.info("stopped leading", extra={"reason": outcome.value})
        return outcome

    def try_first(self) -> bool:
        """One attempt at the Lease before ``run``, made before the process
        starts its informers; True if it took it.

        If it did, the informers' first lists are sent after ``acquired_at``
        and show every write an earlier leader made, so the first decision
        needs no catch-up list. ``run`` goes on from the Lease held (its
        first attempt renews it). The attempt is bounded by the retry
        period, so a slow API server delays the informers by no more.
        Only a free Lease (none, or released) is taken at first sight: one
        held by another is waited out by ``run``, as always.
        """
        with self._cond:
            if self._started:
                raise RuntimeError("try_first comes before run")
        return self.try_acquire_or_renew(self.config.retry_period)

    # -- the loops -------------------------------------------------------------

    def _lead(self, on_started_leading: Callable[[threading.Event], None], stop: threading.Event) -> None:
        try:
            on_started_leading(stop)
        except Exception:
            self._log.exception("on_started_leading raised; giving up leadership")
            with self._cond:
                self._worker_failed = True
                self._cond.notify_all()

    def _acquire(self) -> bool:
        """Try until we hold the Lease (True) or are cancelled (False)."""
        self._log.info("attempting to acquire leader lease")
        while True:
            if self._stopping():
                return False
            acquired = self.try_acquire_or_renew(self.config.renew_deadline)
            self._report_transition()
            if acquired:
                self._log.info("successfully acquired lease")
                return True
            self._log.v(4).info("failed to acquire lease", extra={"holder": self.leader()})
            if self._sleep_until(self._next_attempt()):
                return False

    def _next_attempt(self) -> float:
        """When a standby tries again: within one retry period, and the moment
        the lease it saw would expire, whichever comes first.

        client-go waits retry_period × (1 + rand × 1.2), so after a leader's
        death a standby notices up to 2.2 retry periods late. Here it reads
        the Lease at least every retry period (jittered downwards, so
        candidates that lost together still spread out) and wakes exactly at
        the observed expiry: a takeover after a crash takes at most the lease
        duration plus one retry period (and one request).
        """
        now = self._clock.monotonic()
        wake = now + self.config.retry_period * (1 - self._rng.random() * STANDBY_SPREAD)
        with self._cond:
            observed = self._observed
            if observed is not None and observed.holder_identity:
                expires = self._observed_time + observed.lease_duration_seconds
                if now < expires:
                    wake = min(wake, expires + EXPIRY_MARGIN)
        return wake

    def _renew(self) -> ElectionOutcome:
        """Renew every retry period until cancelled or leadership is lost."""
        while True:
            if self._sleep_until(self._clock.monotonic() + self.config.retry_period):
                return self._stopped_outcome()
            with self._cond:
                deadline = self._last_write + self.config.renew_deadline
            while True:
                now = self._clock.monotonic()
                if now >= deadline:
                    # Also where a process paused past its lease (SIGSTOP,
                    # a frozen VM) finds itself when it runs again.
                    self._log.error(
                        "failed to renew lease within the renew deadline",
                        extra={"renew_deadline": self.config.renew_deadline,
                               "since_renewal": round(now - deadline + self.config.renew_deadline, 3)},
                    )
                    return ElectionOutcome.LOST
                renewed = self.try_acquire_or_renew(deadline - now, not_after=deadline)
                self._report_transition()
                if renewed:
                    with self._cond:
                        fresh_until = self._last_write + self.config.renew_deadline
                    if self._clock.monotonic() >= fresh_until:
                        # The attempt outlived its own timeout: this process
                        # was paused during it. Counted from when it started,
                        # the renewal is already stale, so the fence stays
                        # shut and the next round would end here anyway.
                        self._log.error("lease renewed only after the renew deadline; "
                                        "this process was paused")
                        return ElectionOutcome.LOST
                    self._log.v(5).info("successfully renewed lease")
                    break
                if not self.is_leader():
                    self._log.error("lease taken over", extra={"holder": self.leader()})
                    return ElectionOutcome.LOST
                if self._sleep_until(min(now + self.config.retry_period, deadline)):
                    return self._stopped_outcome()

    def _stopped_outcome(self) -> ElectionOutcome:
        with self._cond:
            failed = self._worker_failed
        return ElectionOutcome.WORKER_FAILED if failed else ElectionOutcome.CANCELLED

    def _stopping(self) -> bool:
        with self._cond:
            return self._cancelled or self._worker_failed

    def _sleep_until(self, deadline: float) -> bool:
        """Wait until ``deadline`` (monotonic); True if told to stop first."""
        with self._cond:
            while not (self._cancelled or self._worker_failed):
                if self._clock.monotonic() >= deadline:
                    return False
                self._clock.wait_until(self._cond, deadline)
            return True

    # -- one attempt -----------------------------------------------------------

    def try_acquire_or_renew(self, timeout: float, *, not_after: float | None = None) -> bool:
        """One attempt to take or renew the Lease; True when we hold it now.

        ``timeout`` bounds the attempt's requests together. ``not_after``
        (monotonic), when given, is the renew deadline: an attempt that
        would start at or after it (the process paused since its caller
        looked at the clock) sends nothing and fails, so a leader past its
        deadline ends rather than renews. ``run`` loops over this; tests
        call it directly to check the timing rules.
        """
        start = self._clock.monotonic()
        attempt_deadline = start + timeout
        if not_after is not None:
            if start >= not_after:
                return False
            attempt_deadline = min(attempt_deadline, not_after)
        stamp = micro_time(self._clock.now())
        desired = LeaderElectionRecord(
            holder_identity=self.config.identity,
            lease_duration_seconds=self.config.lease_duration_seconds,
            acquire_time=stamp,
            renew_time=stamp,
            leader_transitions=0,
        )

        # 1. Fast path: the leader writes assuming its last write is current.
        with self._cond:
            observed = self._observed
            fast = self._holds(observed) and self._lease_valid(start)
        if fast and observed is not None:
            try:
                stored = self._lock.update(
                    dataclasses.replace(
                        desired,
                        acquire_time=observed.acquire_time,
                        leader_transitions=observed.leader_transitions,
                    ),
                    self._remaining(attempt_deadline),
                )
            except Exception as e:
                self._log.v(2).info(
                    "failed to update lease optimistically, falling back to a read",
                    extra={"error": e},
                )
            else:
                self._renewed(stored, start)
                return True

        # 2. Read the record, creating the Lease if there is none.
        try:
            current = self._lock.get(self._remaining(attempt_deadline))
        except Exception as e:
            self._log.error("error retrieving lease", extra={"error": e})
            return False
        if current is None:
            # A Lease that vanished (someone deleted it) does not end its
            # holder's term: that leader writes until its renew fails, up to
            # its renew deadline. So the last record we saw of another holder
            # is waited out as if it were still stored. client-go creates
            # the Lease at once, and two leaders write side by side for up
            # to a retry period (I3). A candidate that never saw a holder
            # (a first start) takes it at once; the holder itself recreates it.
            with self._cond:
                if (self._observed is not None and self._observed.holder_identity
                        and not self._holds(self._observed) and self._lease_valid(self._clock.monotonic())):
                    self._log.v(2).info("the lease is gone, but its last holder's term has not run out",
                                        extra={"holder": self._observed.holder_identity})
                    return False
            try:
                stored = self._lock.create(desired, self._remaining(attempt_deadline))
            except Exception as e:
                self._log.error("error creating lease", extra={"error": e})
                return False
            self._renewed(stored, start, acquired=True)
            return True

        # 3. A changed record restarts the expiry clock.
        now = self._clock.monotonic()
        with self._cond:
            if current != self._observed:
                self._observed = current
                self._observed_time = now
            held_by_us = self._holds(current)
            if current.holder_identity and not held_by_us and self._lease_valid(now):
                return False

        # 4. Free, expired or ours: write ourselves in, conditional on what we read.
        if held_by_us:
            desired = dataclasses.replace(
                desired,
                acquire_time=current.acquire_time,
                leader_transitions=current.leader_transitions,
            )
        else:
            desired = dataclasses.replace(desired, leader_transitions=current.leader_transitions + 1)
        try:
            stored = self._lock.update(desired, self._remaining(attempt_deadline))
        except Exception as e:
            self._log.error("failed to update lease", extra={"error": e})
            return False
        self._renewed(stored, start, acquired=not held_by_us)
        return True

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - self._clock.monotonic()
        if remaining <= 0:
            raise TimeoutError("no time left in this attempt")
        return remaining

    def _holds(self, record: LeaderElectionRecord | None) -> bool:
        return record is not None and record.holder_identity == self.config.identity

    def _lease_valid(self, now: float) -> bool:
        # Caller holds _cond. client-go's isLeaseValid: the record's own
        # duration, counted from when we saw it change.
        if self._observed is None:
            return False
        return self._observed_time + self._observed.lease_duration_seconds > now

    def _renewed(self, record: LeaderElectionRecord, started: float, *, acquired: bool = False) -> None:
        """We hold the Lease by a write whose request started at ``started``;
        ``acquired``: a write that took it from another holder or none."""
        self._set_observed(record, started)
        self.fence.extend(started, self.config.renew_deadline, self.config.lease_duration)
        if acquired:
            with self._cond:
                self._acquired_at = self._clock.monotonic()

    def _set_observed(self, record: LeaderElectionRecord, at: float) -> None:
        """Record a successful write of ours, sent at ``at``."""
        with self._cond:
            self._observed = record
            self._observed_time = at
            self._last_write = at

    def _report_transition(self) -> None:
        holder = self.leader()
        if not holder or holder == self._reported_leader:
            return
        self._reported_leader = holder
        self._log.info("new leader observed", extra={"holder": holder})
        if self._on_new_leader is not None:
            try:
                self._on_new_leader(holder)
            except Exception:
                self._log.exception("on_new_leader raised")

    def _release(self) -> bool:
        """Hand the Lease back (empty holder, 1 s) if we hold it; True when done."""
        with self._cond:
            observed = self._observed
        if observed is None or not self._holds(observed):
            return True
        stamp = micro_time(self._clock.now())
        released = LeaderElectionRecord(
            holder_identity="",
            lease_duration_seconds=1,
            acquire_time=stamp,
            renew_time=stamp,
            leader_transitions=observed.leader_transitions,
        )
        start = self._clock.monotonic()
        try:
            stored = self._lock.update(released, self.config.renew_deadline)
        except Exception as e:
            self._log.error("failed to release lease", extra={"error": e})
            return False
        self._set_observed(stored, start)
        self._log.info("released lease")
        return True
