"""Events off the sync path: client-go's ``tools/record`` for core/v1 Events.

A sync hands an event to ``EventRecorder.event``, which stamps it, puts it
on a bounded queue and returns. It never waits for the API server, for a
token or for a lock held across a request; when the queue is full the event
is dropped and counted. One sender thread takes the queue in order and, as
client-go's broadcaster sink does (``record/event.go``):

- correlates the event (``eventcorrelation.EventCorrelator``,
  ``record/events_cache.go``): similar events combined, repeats sent as a
  count PATCH, a per-object spam filter;
- waits for a token of its own bucket (--event-qps/--event-burst), never
  the Writer's (--kube-api-qps/--kube-api-burst): events must not spend
  the placements' write budget;
- sends it through ``kube.request`` with the Writer's ``WriteFence`` (DESIGN
  I3): a ``NotLeader`` drops that event silently, and every queued and
  later one, for good -- a process that lost its Lease never leads again;
- retries a request that got no answer (12 tries, 10 s apart, the first
  sleep randomised), but never an answer: the API server refusing an event
  is final, as in client-go.

``flush(timeout)`` waits for the queue to empty; ``stop(timeout)`` flushes
for at most ``timeout`` and then drops (and counts) what is still queued.

Nothing here starts a thread or makes a request until ``start`` is called.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

import orjson
import urllib3
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.eventcorrelation import Correlated, EventCorrelator, event_name
from gpuclaimctl.client.errors import AlreadyExists, ApiError, NotFound
from gpuclaimctl.client.fence import NotLeader, WriteFence
from gpuclaimctl.model.snapshot import format_time
from workqueue.clock import Clock, RealClock

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# record/event.go: maxQueuedEvents, maxTriesPerEvent, defaultSleepDuration.
QUEUE_SIZE = 1000
MAX_TRIES = 12
RETRY_SLEEP = 10.0
# The global budget of every event request (--event-qps/--event-burst): 20
# a second, a tenth of the default API write budget, so a 1,000-pod burst's
# Placed events are out within a minute (at 5 they trailed releases by
# over 3 minutes in make bench-controller); a burst of two objects' spam
# allowances.
DEFAULT_QPS = 20.0
DEFAULT_BURST = 50
# One event is not worth holding the single sender longer than this.
REQUEST_TIMEOUT = 10.0
# At most this many events go in one pipelined exchange (kube.request_many).
BATCH_MAX = 20
# How long the controller's sender gathers events before an exchange. Sent
# one by one, each event cost its sender a round trip's wake-ups (about
# 0.19 ms of CPU per event in make bench-controller, most of what a pod's
# Placed event costs); gathered, the unthrottled run's 1,000 events went in
# 52 exchanges, about 0.1 ms of CPU per event. An event is news, not a
# decision: a tenth of a second is nothing to its reader.
BATCH_WINDOW = 0.1
# The Writer cut messages here before the recorder existed; kept.
MESSAGE_LIMIT = 1024
# client-go's util.ValidateEventType.
EVENT_TYPES = frozenset({"Normal", "Warning"})
# The events' source and reportingComponent (gpuclaimctl why finds its own by it).
COMPONENT = "gpuclaimctl"



class Outcome(enum.Enum):
    """What became of an event handed to the recorder (the metric's label).

    ``aggregated`` counts events folded into a combined event; the combined
    event is then also ``created`` or ``updated``.
    """

    CREATED = "created"
    UPDATED = "updated"
    AGGREGATED = "aggregated"
    FILTERED = "filtered"   # the per-object spam filter
    DROPPED = "dropped"     # queue full, not the leader, or stopped
    FAILED = "failed"       # refused by the API server, or no answer after MAX_TRIES


class EventCounter(Protocol):
    """What the recorder needs of its metrics (``metrics.controller.EventMetrics``)."""

    def inc(self, result: str, amount: int = 1) -> None: ...


def make_event(obj: Mapping[str, Any], type_: str, reason: str, message: str, *,
               component: str, instance: str, now: float) -> Obj:
    """A core/v1 Event about ``obj`` at wall time ``now`` (count 1), in the
    object's namespace (``default`` for a cluster-scoped one). Copies only
    scalars out of ``obj``, which may be a read-only cache object."""
    m = obj["metadata"]
    ns = m.get("namespace") or "default"
    stamp = format_time(datetime.fromtimestamp(now, timezone.utc))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(m["name"], int(now * 1e9)), "namespace": ns},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
            "name": m["name"], "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


# -- the recorder (record/event.go) ----------------------------------------------------


class EventRecorder:
    """Bounded queue, one sender thread, correlation, its own budget, fenced.

    Invariants: ``_queue`` never holds more than ``queue_size`` events;
    once ``_fenced`` or ``_closing`` is set it stays set and nothing more
    is queued; every event handed to ``event`` ends in exactly one of
    created, updated, filtered, dropped, failed (``aggregated`` is counted
    besides).
    """

    def __init__(self, api_client: client.ApiClient, *, fence: WriteFence | None = None,
                 component: str = COMPONENT, instance: str | None = None,
                 qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST,
                 queue_size: int = QUEUE_SIZE, clock: Clock | None = None,
                 metrics: EventCounter | None = None,
                 correlator: EventCorrelator | None = None,
                 rng: Callable[[], float] = random.random,
                 batch_window: float = 0.0) -> None:
        """``batch_window`` (seconds): once an event is queued, the sender
        waits up to this long for more (up to BATCH_MAX) and sends them in
        one pipelined exchange; 0 sends what is queued at once."""
        if qps <= 0 or burst < 1 or queue_size < 1 or batch_window < 0:
            raise ValueError("an event recorder needs qps > 0, burst >= 1, queue_size >= 1 "
                             "and batch_window >= 0")
        self._batch_window = batch_window
        self._api = api_client
        self._fence = fence.check if fence is not None else None
        self._component = component
        self._instance = instance or f"{component}-{uuid.uuid4().hex[:8]}"
        self._clock: Clock = clock if clock is not None else RealClock()
        self._metrics = metrics
        self._correlator = correlator if correlator is not None else EventCorrelator(self._clock)
        self._rng = rng
        self._qps, self._burst = qps, float(burst)
        self._queue_size = queue_size
        # Guards everything below; notified on every change a waiter may wait for.
        self._cond = threading.Condition()
        self._queue: deque[Obj] = deque()
        self._busy = False            # the sender holds events taken off the queue
        self._settled = 0             # of those, how many were counted (sender thread only)
        self._closing = False         # stop() was called: send nothing more
        self._fenced = False          # the fence refused: send nothing more, ever
        self._full_drops = 0          # drops since the queue was last found full
        self._tokens = float(burst)   # the global bucket, refilled on the monotonic clock
        self._refilled = self._clock.monotonic()
        self._thread: threading.Thread | None = None

    # -- the sync side ------------------------------------------------------------

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> bool:
        """Queue an event about ``obj`` and return at once; never raises for
        the API server's sake, never blocks on it. False if it was dropped
        (the queue full, stopping, fenced, an unsupported type): a caller
        that tells a thing once may tell it again later."""
        if type_ not in EVENT_TYPES:
            log.error("unsupported event type %r (reason %s); not recorded", type_, reason)
            self._count(Outcome.FAILED)
            return False
        body = make_event(obj, type_, reason, message, component=self._component,
                          instance=self._instance, now=self._clock.now())
        with self._cond:
            if self._closing or self._fenced:
                dropped = True
            elif len(self._queue) >= self._queue_size:
                dropped = True
                if self._full_drops == 0:
                    log.warning("event queue full (%d events); dropping events until it drains",
                                self._queue_size)
                self._full_drops += 1
            else:
                dropped = False
                if self._full_drops:
                    log.warning("event queue has room again; %d events were dropped",
                                self._full_drops)
                    self._full_drops = 0
                self._queue.append(body)
                if len(self._queue) == 1 or len(self._queue) >= BATCH_MAX:
                    # What the sender waits for (the first event, or a full
                    # batch while it gathers); flush() waits for the queue
                    # to empty, which only the sender does.
                    self._cond.notify_all()
        if dropped:
            self._count(Outcome.DROPPED)
        return not dropped

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the sender thread (once)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def flush(self, timeout: float | None) -> bool:
        """Wait until every queued event was sent (or given up), at most
        ``timeout`` seconds on the recorder's clock; True if it emptied."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    return False
                if deadline is not None and self._clock.monotonic() >= deadline:
                    return False
                self._clock.wait_until(self._cond, deadline)
            return True

    def stop(self, timeout: float = 0.0) -> bool:
        """Flush for at most ``timeout``, then send nothing more: what is still
        queued is dropped and counted. True if nothing was left unsent."""
        if timeout > 0:
            self.flush(timeout)
        with self._cond:
            self._closing = True
            left = len(self._queue)
            self._queue.clear()
            nothing_left = left == 0 and not self._busy
            self._cond.notify_all()
        if left:
            log.warning("stopping with %d events unsent; dropped", left)
            self._count(Outcome.DROPPED, left)
        return nothing_left

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    # -- the sender thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._clock.wait_until(self._cond, None)
                if self._batch_window > 0:
                    # Events queued meanwhile go in the same exchange.
                    deadline = self._clock.monotonic() + self._batch_window
                    while not self._closing and len(self._queue) < BATCH_MAX \
                            and self._clock.monotonic() < deadline:
                        self._clock.wait_until(self._cond, deadline)
                if self._closing:
                    self._cond.notify_all()
                    return
                batch = [self._queue.popleft() for _ in range(min(BATCH_MAX, len(self._queue)))]
                self._busy = True
                self._settled = 0
            try:
                self._record(batch)
            except Exception:  # the one sender must outlive any one event
                log.exception("recording events failed (%s)",
                              ", ".join(str(e.get("reason")) for e in batch))
                self._count(Outcome.FAILED, len(batch) - self._settled)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _settle(self, outcome: Outcome, n: int = 1) -> None:
        """Count what became of `n` events of the batch in hand."""
        self._settled += n
        self._count(outcome, n)

    def _record(self, batch: list[Obj]) -> None:
        """recordToSink for each event: correlate, then send; the events
        that go (with a token each) in one exchange, and any without an
        answer again, one at a time, with retries."""
        results: list[Correlated] = []
        for event in batch:
            result = self._correlator.correlate(event)
            if result.aggregated:
                self._count(Outcome.AGGREGATED)
            if result.skip:
                self._settle(Outcome.FILTERED)
            else:
                results.append(result)
        while results:
            # As many as have a token now (waiting for the first only): the
            # budget paces the exchanges, it never holds back a sendable event.
            n = self._take_tokens(len(results))
            if n == 0:
                self._settle(Outcome.DROPPED, len(results))
                return
            now, results = results[:n], results[n:]
            if not self._send_some(now):
                self._settle(Outcome.DROPPED, len(results))  # stopping, or no longer leading
                return

    def _send_some(self, results: list[Correlated]) -> bool:
        """Send events that have their tokens in one exchange; retry those
        without an answer one at a time. False if stopping or fenced: the
        caller drops what it still holds."""
        try:
            answers = self._send_all(results)
        except NotLeader as e:
            self._fence_closed(str(e), held=len(results))
            return False
        lost: list[Correlated] = []
        fenced: NotLeader | None = None
        for result, answer in zip(results, answers):
            if isinstance(answer, Outcome):
                self._settle(answer)
            elif isinstance(answer, ApiError) and not _server_gave_up(answer):
                self._refused(result, answer, attempt=1)
            elif isinstance(answer, NotLeader):
                fenced = answer
            else:
                lost.append(result)
        if fenced is not None:
            self._fence_closed(str(fenced), held=len(lost) + sum(isinstance(a, NotLeader) for a in answers))
            return False
        if not lost:
            return True
        log.info("could not record %d events (first: %s on %s), will retry: %s", len(lost),
                 lost[0].event.get("reason"), _where(lost[0].event),
                 answers[results.index(lost[0])])
        # Randomise the first sleep so that many clients do not all come
        # back at once after an API server outage.
        if not self._sleep(RETRY_SLEEP * self._rng()):
            self._settle(Outcome.DROPPED, len(lost))
            return False
        for i, result in enumerate(lost):
            if not self._deliver(result, first_attempt=2):
                self._settle(Outcome.DROPPED, len(lost) - i - 1)
                return False
        return True

    def _deliver(self, result: Correlated, first_attempt: int) -> bool:
        """Send one event with retries (attempts `first_attempt`..MAX_TRIES);
        False if stopping or fenced, when the caller drops the rest."""
        event = result.event
        for attempt in range(first_attempt, MAX_TRIES + 1):
            if not self._take_token():
                self._settle(Outcome.DROPPED)
                return False
            try:
                outcome = self._send(result)
            except NotLeader as e:
                self._fence_closed(str(e), held=1)
                return False
            except ApiError as e:
                if not _server_gave_up(e):
                    self._refused(result, e, attempt)
                    return True
                failure: Exception = e
            except (OSError, urllib3.exceptions.HTTPError) as e:  # no answer: try again
                failure = e
            else:
                self._settle(outcome)
                return True
            if attempt == MAX_TRIES:
                log.warning("could not record event %s on %s after %d tries: %s",
                            event.get("reason"), _where(event), MAX_TRIES, failure)
                self._settle(Outcome.FAILED)
                return True
            log.info("could not record event %s on %s, will retry: %s",
                     event.get("reason"), _where(event), failure)
            delay = RETRY_SLEEP * (self._rng() if attempt == 1 else 1.0)
            if not self._sleep(delay):
                self._settle(Outcome.DROPPED)
                return False
        return True

    def _refused(self, result: Correlated, e: ApiError, attempt: int) -> None:
        event = result.event
        if isinstance(e, AlreadyExists):
            # A create retried after its answer was lost finds itself:
            # the event is there. Otherwise the name was taken: refused.
            if attempt == 1:
                log.debug("event %s on %s not recorded: %s", event.get("reason"), _where(event), e)
            self._settle(Outcome.CREATED if attempt > 1 else Outcome.FAILED)
            return
        quiet = "NamespaceTerminating" in e.causes
        (log.debug if quiet else log.warning)(
            "the API server refused event %s on %s (will not retry): %s",
            event.get("reason"), _where(event), e)
        self._settle(Outcome.FAILED)

    def _send_all(self, results: list[Correlated]) -> list[Outcome | ApiError | OSError | NotLeader]:
        """The first try of each event, all in one exchange: its outcome, the
        ApiError that refused it, or the OSError of no answer. A repeat whose
        event is gone (404) is created again at once, as `_send` does (where
        the fence refuses that create: the NotLeader). What the fence raises
        before the exchange stops them all."""
        requests = [self._request(r, patch=r.patch is not None) for r in results]
        answers = kube.request_many(self._api, requests, timeout=REQUEST_TIMEOUT, fence=self._fence)
        out: list[Outcome | ApiError | OSError | NotLeader] = []
        for result, answer in zip(results, answers):
            if result.patch is not None and isinstance(answer, NotFound):
                try:
                    out.append(self._send(result, patch=False))
                except (ApiError, OSError, NotLeader) as e:
                    out.append(e)
                except urllib3.exceptions.HTTPError as e:
                    out.append(OSError(str(e)))
            elif isinstance(answer, bytes):
                self._answered(result, orjson.loads(answer) if answer else {})
                out.append(Outcome.UPDATED if result.patch is not None else Outcome.CREATED)
            else:
                out.append(answer)
        return out

    def _request(self, result: Correlated, *, patch: bool) -> kube.Sent:
        """recordEvent's request: a PATCH of a repeat's count, or a create."""
        event = result.event
        ns, name = event["metadata"]["namespace"], event["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/events"
        if patch:
            return "PATCH", f"{path}/{name}", result.patch, "application/strategic-merge-patch+json"
        body = {**event, "metadata": {k: v for k, v in event["metadata"].items()
                                      if k != "resourceVersion"}}
        return "POST", path, body, "application/json"

    def _send(self, result: Correlated, *, patch: bool = True) -> Outcome:
        """recordEvent: patch a repeat (create it if it is gone), else create."""
        if patch and result.patch is not None:
            method, path, body, content_type = self._request(result, patch=True)
            try:
                answered = kube.request_json(self._api, method, path, body=body,
                                             content_type=content_type,
                                             timeout=REQUEST_TIMEOUT, fence=self._fence)
                self._answered(result, answered)
                return Outcome.UPDATED
            except NotFound:
                pass
        method, path, body, content_type = self._request(result, patch=False)
        self._answered(result, kube.request_json(self._api, method, path, body=body,
                                                 content_type=content_type,
                                                 timeout=REQUEST_TIMEOUT, fence=self._fence))
        return Outcome.CREATED

    def _answered(self, result: Correlated, answered: Obj) -> None:
        if (answered.get("metadata") or {}).get("name"):
            self._correlator.update_state(result.key, answered)

    def _fence_closed(self, why: str, held: int) -> None:
        """No longer leading: the `held` events in hand and every queued one are dropped."""
        with self._cond:
            self._fenced = True
            left = len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        log.debug("no more events: %s", why)
        self._settle(Outcome.DROPPED, held)
        self._count(Outcome.DROPPED, left)

    def _take_token(self) -> bool:
        """Wait for a token of the recorder's own bucket; False once stopping."""
        return self._take_tokens(1) == 1

    def _take_tokens(self, most: int) -> int:
        """Wait for a token of the recorder's own bucket, then take up to
        `most` in all of what it holds; how many (0 once stopping)."""
        with self._cond:
            while not self._closing:
                now = self._clock.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._qps)
                self._refilled = now
                if self._tokens >= 1.0:
                    n = min(most, int(self._tokens))
                    self._tokens -= n
                    return n
                self._clock.wait_until(self._cond, now + (1.0 - self._tokens) / self._qps)
            return 0

    def _sleep(self, seconds: float) -> bool:
        """Sleep on the recorder's clock; False if stopped meanwhile."""
        with self._cond:
            deadline = self._clock.monotonic() + seconds
            while not self._closing and self._clock.monotonic() < deadline:
                self._clock.wait_until(self._cond, deadline)
            return not self._closing

    def _count(self, outcome: Outcome, n: int = 1) -> None:
        if self._metrics is not None and n > 0:
            self._metrics.inc(outcome.value, n)


def _server_gave_up(e: ApiError) -> bool:
    """The API server ran out of the deadline the request carried (504): no
    answer about the event, which may have been written. Tried again as a
    request without an answer (a create that landed is then AlreadyExists,
    counted created), where client-go gives up on every answer: a
    pipelined request's deadline is a share of the batch's (kube.request_many)."""
    return e.status == 504


def _where(event: Mapping[str, Any]) -> str:
    io = event.get("involvedObject") or {}
    return "/".join(p for p in (io.get("kind"), io.get("namespace"), io.get("name")) if p)
