"""Without leader election, a process's first decision waits until no write
of the process before it can still land (issue 43, DESIGN I1).

A process killed with a write on the wire -- sent, not yet applied by the
API server -- leaves it to land whenever the server gets to it. With leader
election the Lease covers that: every write carries a server deadline that
ends before another replica may take the Lease over. Without it nothing
did: a process restarted at once could list the claims (the catch-up before
its first decision) before a bind of the dead one landed, bind other claims
to the same GPUs, and both binds stood. Two binds of one claim are safe
(the second's resourceVersion is stale); binds of two claims are not.

Every write asks the API server to give up on it after
`fence.WRITE_DEADLINE` (`?timeout=`); a storage write the server began
before that deadline may still commit a little after it (STORAGE_MARGIN).
The dead process sent its writes before it died, so before this process
started: once RESTART_WAIT has passed since this process started, none of
them can land any more, and the catch-up list shows every one that did.
`wait_out_earlier_writes` waits until then; a process that has been up
longer (caches that took that long to sync) waits nothing.

The start is `time.monotonic()` when this module is first imported, and the
cli imports it before anything else: the clock the wait runs on, on every
system, never earlier than the true start (so the wait is never short),
and later than the exec only by the interpreter's start-up, which the wait
gets longer by. /proc/self/stat's start time would be the exec itself, but
counts clock ticks on the boot-time clock, which runs on across a suspend
where the monotonic one stops, and exists on Linux only.

What it rests on: the process before this one had died when this one
started, as when a container or a supervisor restarts it. Two processes
running at once without leader election are two writers; nothing here
makes that safe (the Deployment runs with leader election). And a write
counts from when the API server received it: one still in the network
when this process starts is not covered, as it is not under a Lease.

An API server process this one started (`run --local`) has no write of
another process on its way: an earlier run's writes went to the API server
that run stopped, and what landed is in etcd before this one lists. There
is nothing to wait for (cmd.localdemo says so with `own_api_server`).

This module makes no requests and starts no threads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from gpuclaimctl.client.fence import WRITE_DEADLINE

# Taken at the first import: see the module docstring.
PROCESS_STARTED = time.monotonic()

# How long after the API server's deadline for a write a storage write it
# began before the deadline may still commit: etcd commits a proposal it
# has in one round of its raft log (an fsync: milliseconds, a second at
# worst on a loaded disk), so 3 s is ample. LOST_WRITE_WINDOW
# (state.inflight) keeps a wider 5 s on top of the API server's 60 s.
STORAGE_MARGIN = 3.0

# Without leader election, the first decision comes no sooner than this
# after the process started.
RESTART_WAIT = WRITE_DEADLINE + STORAGE_MARGIN

log = logging.getLogger("gpuclaimctl")

# The kubeconfigs of API servers this process started (`run --local`).
_OWN_API_SERVERS: set[str] = set()
_OWN_LOCK = threading.Lock()


def own_api_server(kubeconfig: str) -> None:
    """This process started the API server `kubeconfig` points at."""
    with _OWN_LOCK:
        _OWN_API_SERVERS.add(kubeconfig)


def started_here(kubeconfig: str | None) -> bool:
    """Whether this process started the API server `kubeconfig` points at."""
    with _OWN_LOCK:
        return kubeconfig is not None and kubeconfig in _OWN_API_SERVERS


def left_to_wait(now: float, started: float = PROCESS_STARTED, wait: float = RESTART_WAIT) -> float:
    """Seconds until a write sent before `started` can no longer land (0 once past)."""
    return max(0.0, started + wait - now)


def wait_out_earlier_writes(stop: threading.Event, kubeconfig: str | None = None, *,
                            started: float = PROCESS_STARTED, wait: float = RESTART_WAIT,
                            monotonic: Callable[[], float] = time.monotonic) -> bool:
    """Return once no write sent before `started` can land any more, at once
    if that time has passed or this process started the API server at
    `kubeconfig`; False if `stop` was set first. Logs once how long it waits
    and why."""
    if started_here(kubeconfig):
        return True
    left = left_to_wait(monotonic(), started, wait)
    if left <= 0:
        return True
    log.info("waiting %.1fs before the first decision: without leader election, a write sent "
             "by the process before this one may land up to %.0fs later (its API server "
             "deadline, %.0fs, plus %.0fs for storage)", left, wait, WRITE_DEADLINE, STORAGE_MARGIN)
    while left > 0:
        if stop.wait(left):
            return False
        left = left_to_wait(monotonic(), started, wait)
    return True
