"""Event correlation: client-go's ``tools/record/events_cache.go``.

``EventCorrelator`` turns each event the recorder is about to send into what
to send: more than ``AGGREGATE_MAX_EVENTS`` distinct messages of the same
source, object, type and reason within ``AGGREGATE_INTERVAL`` become one
event "(combined from similar events): <msg>"; a repeat of an event already
sent becomes a PATCH of its count, lastTimestamp and message instead of a
new Event; a per source+object token bucket (burst 25, one token per 5
minutes) filters the rest. Pure bookkeeping: no thread, no request (the
recorder, client/events.py, sends).

Differences from client-go, each on purpose: cache keys are tuples, not
strings joined without a separator; the combined event also carries
reportingComponent/reportingInstance; the server's answer to a write updates
the cache entry the write was correlated under (client-go recomputes the
full key, which for a combined event is a different entry).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from cachetools import LRUCache

from gpuclaimctl.model.snapshot import format_time
from workqueue.clock import Clock

Obj = dict[str, Any]

# record/events_cache.go: maxLruCacheEntries, for each of the three caches.
LRU_SIZE = 4096
# events_cache.go: more than 10 distinct messages in 10 minutes are combined.
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL = 600.0
AGGREGATE_PREFIX = "(combined from similar events): "
# events_cache.go: a source may send 25 events about an object, then one
# every 5 minutes ("the long-tail of events for things always unhealthy").
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def event_name(ref_name: str, unix_nanos: int) -> str:
    """client-go's util.GenerateEventName: ``<name>.<nanos in hex>``, or a
    UUID when that would not be a valid name (a long object name)."""
    name = f"{ref_name}.{unix_nanos:x}"
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return str(uuid.uuid4())
    return name


def _source_and_object(event: Mapping[str, Any]) -> tuple[Any, ...]:
    src, io = event.get("source") or {}, event.get("involvedObject") or {}
    return (src.get("component"), src.get("host"), io.get("kind"), io.get("namespace"),
            io.get("name"), io.get("uid"), io.get("apiVersion"))


def event_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """getEventKey: the same event, message included."""
    return (*_source_and_object(event), (event.get("involvedObject") or {}).get("fieldPath"),
            event.get("type"), event.get("reason"), event.get("message"))


def spam_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """getSpamKey: source and object (and type, as client-go has it)."""
    return (*_source_and_object(event), event.get("type"))


def aggregate_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """EventAggregatorByReasonFunc's aggregate key; its local key is the message."""
    return (*_source_and_object(event), event.get("type"), event.get("reason"),
            event.get("reportingComponent"), event.get("reportingInstance"))


class PassiveBucket:
    """A token bucket that is asked, never waited on (flowcontrol's passive
    limiter): full at first, ``qps`` tokens a second, at most ``burst``."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self._qps, self._burst = qps, float(burst)
        self._tokens, self._last = float(burst), now

    def try_accept(self, now: float) -> bool:
        self._tokens = min(self._burst, self._tokens + max(0.0, now - self._last) * self._qps)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclasses.dataclass
class _Aggregate:
    messages: set[str]   # distinct messages seen, never more than AGGREGATE_MAX_EVENTS - 1 kept
    last: float          # monotonic time of the last similar event


@dataclasses.dataclass(frozen=True)
class _Observation:
    count: int
    first_timestamp: str
    name: str
    resource_version: str


@dataclasses.dataclass(frozen=True)
class Correlated:
    """EventCorrelateResult: what to send, and under which cache key.

    ``patch`` is set for a repeat of an event already observed: send it as a
    PATCH of ``event``'s name, and create ``event`` if that is gone.
    """

    event: Obj
    key: tuple[Any, ...]
    patch: Obj | None = None
    skip: bool = False
    aggregated: bool = False


class EventCorrelator:
    """client-go's EventCorrelator: aggregate, then count, then spam-filter.

    Not thread-safe: the recorder's sender thread is its only user. Time
    comes from ``clock``: ``monotonic`` for intervals and buckets, ``now``
    for the timestamps and name of a combined event.
    """

    def __init__(self, clock: Clock, *, cache_size: int = LRU_SIZE,
                 spam_burst: int = SPAM_BURST, spam_qps: float = SPAM_QPS,
                 max_events: int = AGGREGATE_MAX_EVENTS,
                 max_interval: float = AGGREGATE_INTERVAL) -> None:
        self._clock = clock
        self._spam_burst, self._spam_qps = spam_burst, spam_qps
        self._max_events, self._max_interval = max_events, max_interval
        self._spam: LRUCache[tuple[Any, ...], PassiveBucket] = LRUCache(cache_size)
        self._aggregates: LRUCache[tuple[Any, ...], _Aggregate] = LRUCache(cache_size)
        self._observed: LRUCache[tuple[Any, ...], _Observation] = LRUCache(cache_size)

    def correlate(self, event: Obj) -> Correlated:
        event, key, aggregated = self._aggregate(event)
        event, patch = self._observe(event, key)
        if not self._allow(event):
            return Correlated(event, key, skip=True, aggregated=aggregated)
        return Correlated(event, key, patch, aggregated=aggregated)

    def update_state(self, key: tuple[Any, ...], answered: Mapping[str, Any]) -> None:
        """The server's answer to a create or patch correlated under ``key``."""
        meta = answered.get("metadata") or {}
        self._observed[key] = _Observation(
            count=int(answered.get("count") or 1),
            first_timestamp=str(answered.get("firstTimestamp") or ""),
            name=str(meta.get("name") or ""),
            resource_version=str(meta.get("resourceVersion") or ""))

    def _aggregate(self, event: Obj) -> tuple[Obj, tuple[Any, ...], bool]:
        """EventAggregate: the event itself under its full key, or once too
        many distinct messages came, a combined event under the group's key."""
        now = self._clock.monotonic()
        group = aggregate_key(event)
        record = self._aggregates.get(group)
        if record is None or now - record.last > self._max_interval:
            record = _Aggregate(set(), now)
        record.messages.add(event.get("message") or "")
        record.last = now
        self._aggregates[group] = record
        if len(record.messages) < self._max_events:
            return event, event_key(event), False
        record.messages.pop()  # the set never grows past the threshold
        wall = self._clock.now()
        stamp = format_time(datetime.fromtimestamp(wall, timezone.utc))
        io = event["involvedObject"]
        combined: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(io["name"], int(wall * 1e9)),
                         "namespace": event["metadata"]["namespace"]},
            "involvedObject": io,
            "type": event.get("type"),
            "reason": event.get("reason"),
            "message": AGGREGATE_PREFIX + (event.get("message") or ""),
            "source": event.get("source"),
            "reportingComponent": event.get("reportingComponent"),
            "reportingInstance": event.get("reportingInstance"),
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        return combined, group, True

    def _observe(self, event: Obj, key: tuple[Any, ...]) -> tuple[Obj, Obj | None]:
        """eventObserve: a repeat takes the first occurrence's name and
        firstTimestamp and the next count, and is sent as a patch."""
        last = self._observed.get(key)
        patch: Obj | None = None
        if last is not None and last.count > 0:
            event = {**event,
                     "metadata": {**event["metadata"], "name": last.name,
                                  "resourceVersion": last.resource_version},
                     "firstTimestamp": last.first_timestamp, "count": last.count + 1}
            patch = {"count": event["count"], "lastTimestamp": event["lastTimestamp"],
                     "message": event["message"]}
        self._observed[key] = _Observation(
            count=int(event["count"]), first_timestamp=str(event["firstTimestamp"]),
            name=str(event["metadata"]["name"]),
            resource_version=str(event["metadata"].get("resourceVersion") or ""))
        return event, patch

    def _allow(self, event: Obj) -> bool:
        """EventSourceObjectSpamFilter: one token per event about the object."""
        now = self._clock.monotonic()
        key = spam_key(event)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = PassiveBucket(self._spam_qps, self._spam_burst, now)
        allowed = bucket.try_accept(now)
        self._spam[key] = bucket
        return allowed
