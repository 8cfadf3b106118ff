"""What preemption may take on each node, read from the view (DESIGN.md §4d).

`UnitsOn` answers, per node, the units (decide.preempt.Unit: a pod, or a
gang whole) with a member holding GPUs there: pods bound to the node that
reserve claims holding GPUs there, with what their going frees. It is read
with the view's lock held, from the same usage tracker placement counts
with, so a victim frees exactly what placement counts it holding.

Built per node when asked, and kept (`VictimCache`) until something on the
node changes: the tracker counts a version per node and per gang
(state.usage), and a kept answer whose node's or gangs' versions moved is
built again. What depends on more than those is never kept: a node where a
claim has a write of ours in flight (it frees nothing until seen back), a
pod preemption evicted lately (terminating before the informer shows it),
or a pod terminating (whether it is stuck depends on the time). A planning
pass over 5,000 nodes then reads kept answers (issue 46, item 7).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpuclaimctl.decide.preempt import NodeUnits, Unit, Victim
from gpuclaimctl.decide.victims import Hold, units_at, victim
from gpuclaimctl.state.inflight import InFlightPlacements
from gpuclaimctl.state.usage import UsageTracker


@dataclass(frozen=True)
class _Kept:
    node_version: int
    gang_versions: tuple[tuple[str, int], ...]
    units: NodeUnits


class VictimCache:
    """Answers kept per node, under the view's lock."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def units_on(self, usage: UsageTracker, inflight: InFlightPlacements, now: datetime, stuck_after: float,
                 evicted: Collection[str]) -> UnitsOn:
        # Nodes whose answer depends on more than the versions say.
        fresh = {held[0] for e in inflight if (held := usage.claim_held(e.claim_uid)) is not None}
        fresh |= {pod.node for uid in evicted if (pod := usage.running.get(uid) or usage.gone.get(uid)) is not None}
        return UnitsOn(self, usage, inflight, now, stuck_after, frozenset(evicted), fresh)

    def get(self, node: str, usage: UsageTracker) -> NodeUnits | None:
        kept = self._kept.get(node)
        if kept is None or kept.node_version != usage.node_version.get(node, 0) or any(
                usage.gang_version.get(g, 0) != v for g, v in kept.gang_versions):
            return None
        return kept.units

    def keep(self, node: str, usage: UsageTracker, units: NodeUnits) -> None:
        gangs = tuple((u.gang, usage.gang_version.get(u.gang, 0)) for u in units.units if u.gang)
        self._kept[node] = _Kept(usage.node_version.get(node, 0), gangs, units)

    def forget(self, node: str) -> None:
        self._kept.pop(node, None)


class UnitsOn(Mapping[str, NodeUnits]):
    """node -> NodeUnits (decide.preempt.UnitsOn), worked out when asked."""

    def __init__(self, cache: VictimCache, usage: UsageTracker, inflight: InFlightPlacements, now: datetime,
                 stuck_after: float, evicted: frozenset[str], fresh: set[str]) -> None:
        self._cache = cache
        self._usage = usage
        self._inflight = inflight
        self._now = now
        self._stuck_after = stuck_after
        self._evicted = evicted
        self._fresh = fresh
        self._victims: dict[str, Victim | None] = {}
        self._built: dict[str, NodeUnits] = {}

    def __getitem__(self, node: str) -> NodeUnits:
        got = self._built.get(node)
        if got is None:
            got = self._built[node] = self._units(node)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._usage.node_claims)

    def __len__(self) -> int:
        return len(self._usage.node_claims)

    def _units(self, node: str) -> NodeUnits:
        usage = self._usage
        if node not in self._fresh:
            kept = self._cache.get(node, usage)
            if kept is not None:
                return kept
        units = NodeUnits(node, self._build(node))
        if node in self._fresh or units.any_terminating:
            self._cache.forget(node)
        else:
            self._cache.keep(node, usage, units)
        return units

    def _build(self, node: str) -> tuple[Unit, ...]:
        usage = self._usage
        reserved = [pod for claim in usage.node_claims.get(node, ()) for pod in usage.reserving(claim)]
        return units_at(node, reserved, self._victim,
                        lambda uid: pod.gang if (pod := usage.running.get(uid)) is not None else "",
                        lambda gang: usage.gang_pods.get(gang, ()))

    def _victim(self, pod_uid: str) -> Victim | None:
        if pod_uid not in self._victims:
            usage = self._usage
            pod, going = usage.running.get(pod_uid), pod_uid in self._evicted
            if pod is None:
                # Gone or finished, its claims not let go yet: its GPUs are
                # coming free; waited for, never evicted (a second plan in
                # that moment evicted more pods for nothing: a real-plane
                # gang story).
                pod, going = usage.gone.get(pod_uid), True
            self._victims[pod_uid] = None if pod is None else victim(
                pod_uid, pod, self._holds(pod_uid), self._now, self._stuck_after, going)
        return self._victims[pod_uid]

    def _holds(self, pod_uid: str) -> list[Hold]:
        """The claims reserving the pod that hold GPUs; one with a write of
        ours in flight frees nothing until it is seen back."""
        usage = self._usage
        out = []
        for claim_uid in usage.reserved_claims(pod_uid):
            held = usage.claim_held(claim_uid)
            info = usage.held_claims.get(claim_uid)
            if held is not None and info is not None:
                flying = self._inflight.get(claim_uid) is not None
                out.append(Hold(*held, info.class_name, None if flying else info.freed_with))
        return out
