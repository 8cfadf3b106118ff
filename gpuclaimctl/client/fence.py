"""The write fence: only the leader writes (DESIGN I3).

A ``WriteFence`` lets writes through only until a deadline on the monotonic
clock. The leader elector moves the deadline on after every successful
acquire or renew of the Lease, to the moment that request was *started*
plus the renew deadline. That is conservative: another candidate may take
the Lease over only ``lease_duration`` after it saw our last renew, which
is later than our start of it, and ``lease_duration > renew_deadline``.
The elector closes the fence for good when leadership ends.

The deadline is judged when a write is about to leave, not when the sync
that makes it started, so a process that was paused (SIGSTOP, a long GC, a
VM migration) past its lease refuses its writes the moment it runs again,
before its elector has even noticed. ``check`` also says how long is left
until the Lease could be taken over elsewhere, so a write's HTTP timeout
can be cut to it.

A fence that is never armed always allows -- unless made with
``lease_required`` (leader election on): then it refuses until the first
acquire, so a standby's writes are refused too, whatever code sends them.
This module makes no requests and starts no threads.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable


# The longest any write of ours may take, and the API server's own deadline
# for it (`?timeout=`), whether a fence is armed or not; an armed fence cuts
# it further, to the takeover. It bounds how late a write of a process that
# died can still land, and so how long a process restarted without leader
# election waits before its first decision (cmd.startwait), so it is kept
# short: 5 s is a write's usual few milliseconds a thousand times over, and
# a write still unanswered by then is a lost answer the in-flight rules
# already handle (state.inflight). Writes without a Lease used to take
# kube.request's 30 s, and a Writer without a fence sent no deadline at all
# (the API server's --request-timeout, 60 s): a restart would wait that long.
WRITE_DEADLINE = 5.0


class NotLeader(Exception):
    """A write refused because this process may no longer be the leader.

    Not an ``OSError`` or an API error: code that tolerates failed requests
    (an event that could not be recorded) must not swallow it.
    """


class WriteFence:
    """Writes are allowed until a monotonic deadline, or always if never armed.

    Invariants: the deadline and the takeover time only move forward;
    ``deadline <= takeover`` once armed; once closed, ``check`` raises
    forever. Every method may be called from any thread.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic, *,
                 lease_required: bool = False) -> None:
        self._monotonic = monotonic
        # Refuse while never armed (a standby), rather than allow.
        self._lease_required = lease_required
        self._lock = threading.Lock()
        self._armed = False
        # Writes may leave while monotonic() < _deadline.
        self._deadline = -math.inf
        # The earliest moment another candidate may take the Lease over.
        self._takeover = -math.inf
        self._closed_because = ""

    def extend(self, started: float, renew_deadline: float, lease_duration: float) -> None:
        """A renew (or acquire) that started at ``started`` succeeded.

        Does nothing once closed: a renew that raced with the loss of
        leadership must not reopen the fence.
        """
        if not lease_duration > renew_deadline > 0:
            raise ValueError("the fence needs lease_duration > renew_deadline > 0")
        with self._lock:
            if self._closed_because:
                return
            self._armed = True
            self._deadline = max(self._deadline, started + renew_deadline)
            self._takeover = max(self._takeover, started + lease_duration)

    def close(self, reason: str = "leadership ended") -> None:
        """Refuse every write from now on, whatever ``extend`` says later."""
        with self._lock:
            if not self._closed_because:
                self._closed_because = reason or "closed"

    @property
    def closed(self) -> bool:
        with self._lock:
            return bool(self._closed_because)

    def check(self) -> float:
        """Raise ``NotLeader`` unless a write may leave now; else return the
        seconds left until the Lease could be taken over (``inf`` unarmed)."""
        with self._lock:
            if self._closed_because:
                raise NotLeader(f"not the leader: {self._closed_because}")
            if not self._armed:
                if self._lease_required:
                    raise NotLeader("not the leader: the Lease was never acquired")
                return math.inf
            now = self._monotonic()
            if now >= self._deadline:
                raise NotLeader(
                    f"not the leader: the Lease was last renewed too long ago "
                    f"(renew deadline passed {now - self._deadline:.3f}s ago)")
            return self._takeover - now
