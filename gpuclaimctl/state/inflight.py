"""Placements decided but not yet seen back from the watch (DESIGN.md §4).

Three things use a node's GPUs: claims Bound there (all namespaces), pods
bound there that request the resource without claims and have not
finished, and placements this controller has decided but not yet seen come
back from its watch. The first two are pure functions of informer objects
(`used_capacity`, or `claim_usage`/`pod_usage` per object for an
incremental index); the third is `InFlightPlacements`, a TTL cache that
keeps many workers and a lagging informer from deciding twice on the same
free GPUs.

No client, nothing started at import; the cache's clock is injected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuclaimctl.model.api import Phase

# Long enough to cover any watch lag we expect; an entry that outlives its
# write (the watch skipped the Bound state during a relist, say) only keeps
# GPUs idle for this long. Never shorter than the worst watch lag, or a node
# can be overcommitted.
DEFAULT_TTL_SECONDS = 60.0


@dataclass(frozen=True)
class InFlight:
    claim_uid: str
    node: str
    resource: str
    count: int
    expires: float


class InFlightPlacements:
    """Placements written (or being written) but not yet seen by the informer.

    Use: hold `lock` across reading usage, `decide` and `add`, so two workers
    cannot both decide on the same free GPUs; `forget` when the write fails;
    `observe` from the claim informer's handlers (after the store holds the
    new object, so the claim is counted there before it stops counting
    here). Thread-safe.
    """

    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        # Reentrant, so a caller holding it for a decision can still call
        # the methods below.
        self.lock = threading.RLock()
        # claim uid -> entry; every entry is unexpired or not yet pruned.
        self._entries: dict[str, InFlight] = {}

    def add(self, claim_uid: str, node: str, resource: str, count: int) -> None:
        """Count `count` GPUs of `resource` on `node` for the claim from now
        until the informer shows it Bound there or the TTL passes. A second
        add for the same claim replaces the first."""
        with self.lock:
            self._entries[claim_uid] = InFlight(claim_uid, node, resource, count, self._clock() + self._ttl)

    def forget(self, claim_uid: str) -> None:
        """The write failed (or was never made): the claim holds nothing."""
        with self.lock:
            self._entries.pop(claim_uid, None)

    def observe(self, claim_uid: str, phase: str | None, node_name: str | None) -> None:
        """The informer shows the claim: Bound on the in-flight node ends the
        entry, as does phase None (the claim is gone). Anything else is an
        older version of the claim, so the entry stays."""
        with self.lock:
            entry = self._entries.get(claim_uid)
            if entry is None:
                return
            if phase is None or (phase == Phase.BOUND and node_name == entry.node):
                del self._entries[claim_uid]

    def observe_claim(self, claim: Mapping[str, Any] | None, *, deleted: bool = False) -> None:
        """observe() for a raw claim object from an informer event."""
        if claim is None:
            return
        uid = (claim.get("metadata") or {}).get("uid", "")
        status = claim.get("status") or {}
        # A claim with no phase yet is Pending (just created), not gone:
        # reading it as gone dropped the entry of every template claim whose
        # creation event arrived after its placement was decided.
        phase = None if deleted else (status.get("phase") or Phase.PENDING)
        self.observe(uid, phase, status.get("nodeName"))

    def get(self, claim_uid: str) -> InFlight | None:
        with self.lock:
            entry = self._entries.get(claim_uid)
            if entry is not None and entry.expires <= self._clock():
                del self._entries[claim_uid]
                return None
            return entry

    def usage(self, exclude: Collection[str] = ()) -> dict[str, dict[str, int]]:
        """resource -> node -> GPUs in flight, without claims in `exclude`."""
        with self.lock:
            self._prune()
            out: dict[str, dict[str, int]] = {}
            for uid, e in self._entries.items():
                if uid in exclude:
                    continue
                per_node = out.setdefault(e.resource, {})
                per_node[e.node] = per_node.get(e.node, 0) + e.count
            return out

    def __len__(self) -> int:
        with self.lock:
            self._prune()
            return len(self._entries)

    def _prune(self) -> None:
        now = self._clock()
        expired = [uid for uid, e in self._entries.items() if e.expires <= now]
        for uid in expired:
            del self._entries[uid]
