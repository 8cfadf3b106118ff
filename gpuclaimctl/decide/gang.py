"""Where a gang's sets go (DESIGN.md §4c): all members at once, or none.

`decide_gang` is `placement.decide` over several pods, taken once: every
gated member's whole set must fit, each on one node (members may share a
node), on the same snapshot, each placement counting against the next; the
namespace's budgets are checked for the gang as a whole, first. Then it
returns every member's `Placed`; otherwise why the gang waits, for each
member.

Members are tried largest set first (then oldest, then name): first-fit
decreasing, so a big set is not left without a node by small ones; a member
with a claim it cannot use goes first. The first member that does not fit
ends the decision ("k of N sets fit" counts those placed before it). A
member whose claims are already Bound (a decision being finished after a
failed write, a crash or a change of leader) keeps them where they are, as
a single pod's set does.

Pure: no client, no clock (`now` is passed in), no globals.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuclaimctl.decide.budget import check_budgets, new_asks
from gpuclaimctl.decide.placement import Action, ClaimAction, ClaimWait, Placed, Waiting, decide, describe
from gpuclaimctl.model.api import Phase, Strategy, WaitReason
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo, BudgetUse
from gpuclaimctl.model.snapshot import NO_USE, ClaimState, Cluster, NodeInfo, PodInfo, UnresolvedClaim, Usage


@dataclass(frozen=True)
class GangMember:
    key: str  # ns/name
    pod: PodInfo
    claims: Sequence[ClaimState | UnresolvedClaim]


@dataclass(frozen=True)
class GangPlaced:
    # (member key, its set's decision), in the order they were decided.
    sets: tuple[tuple[str, Placed], ...]


@dataclass(frozen=True)
class GangWaiting:
    reason: WaitReason
    message: str
    # member key -> why that member's set waits (its own problem, or the gang's).
    members: Mapping[str, Waiting]
    # With GangCapacity: the sets that fit, placed before the first that did
    # not -- the GPUs the gang could use (sync.gangs holds them for it).
    partial: tuple[tuple[str, Placed], ...] = ()


GangDecision = GangPlaced | GangWaiting

# A member's own wait that no other member's placement could change: the
# gang waits for that reason, not for capacity.
_CAPACITY_REASONS = frozenset({WaitReason.CAPACITY, WaitReason.CORDONED, WaitReason.NODE_AFFINITY,
                               WaitReason.NODE_REJECTED})


def decide_gang(
    name: str,
    size: int,
    members: Sequence[GangMember],
    released: int,
    cluster: Cluster,
    used: Usage,
    now: datetime,
    strategy: Strategy = Strategy.BINPACK,
    budgets: Sequence[BudgetInfo] | None = (),
    budget_use: BudgetUse = NO_BUDGET_USE,
) -> GangDecision:
    """Place every gated member's set at once, or say why the gang waits.

    `members` are the gang's gated pods, `released` how many of its pods
    were released already (a decision being finished: their GPUs are in
    `used`). `used` and `budget_use` as for `placement.decide` (a member's
    claim with an in-flight placement passed as Bound there).
    """
    have = len(members) + released
    if have < size or not members:
        return _all_wait(members, WaitReason.GANG_INCOMPLETE,
                         f"gang {name}: {have} of {size} members exist (gated or released); none is "
                         f"placed until all {size} are there")
    if have > size:
        return _all_wait(members, WaitReason.GANG_INVALID,
                         f"gang {name} has {have} members but its size is {size}: make the size say how "
                         "many pods it has, or take the extra ones out of the gang")
    states = [c for m in members for c in m.claims if isinstance(c, ClaimState)]
    asks = new_asks(states)
    if asks and budgets is None:
        return _all_wait(members, WaitReason.BUDGETS_UNKNOWN,
                         f"gang {name}: the GPUBudgets of the namespace cannot be read yet")
    refusal = check_budgets(budgets or (), budget_use, asks)
    if refusal is not None:
        return _all_wait(members, WaitReason.BUDGET, f"gang {name}, all {size} members together: "
                                                     f"{refusal.message}")

    overlay = _Overlay(used)
    placed: list[tuple[str, Placed]] = []
    waits: dict[str, Waiting] = {}
    alike = _Alike(cluster, overlay, strategy) if len(members) >= ALIKE_FROM else None
    for m in sorted(members, key=_order):
        d = (alike.place(m) if alike is not None else None) or decide(m.pod, m.claims, cluster, overlay, now,
                                                                        strategy)
        if isinstance(d, Placed):
            placed.append((m.key, d))
            overlay.take(d)
            if alike is not None:
                alike.took(d)
        else:
            # The gang waits: the members after the first that does not fit
            # are not tried (a waiting gang's decision, under the view's lock,
            # took 0.3-1.1 s for 512 members when each failing one explained
            # itself: make bench-placement). "k of N sets fit" counts those
            # placed before it.
            waits[m.key] = d
            break
    if not waits:
        return GangPlaced(tuple(placed))

    first_key, first = next((k, w) for k, w in waits.items())
    own = next(((k, w) for k, w in waits.items()
                if w.reason not in _CAPACITY_REASONS and w.reason is not WaitReason.UNSATISFIABLE), None)
    unsatisfiable = next(((k, w) for k, w in waits.items() if w.reason is WaitReason.UNSATISFIABLE), None)
    if own is not None:
        # A member's claims or classes: nothing about the others changes it.
        key, w = own
        reason, message = w.reason, f"gang {name}: member {_name(key)}: {w.message}"
    elif unsatisfiable is not None:
        key, w = unsatisfiable
        reason, message = WaitReason.UNSATISFIABLE, f"gang {name}: member {_name(key)}: {w.message}"
    else:
        fit = len(placed) + released
        reason = WaitReason.GANG_CAPACITY
        message = (f"gang {name}: {fit} of {size} sets fit at once; member {_name(first_key)}: "
                   f"{first.message}")
    out: dict[str, Waiting] = {}
    for m in members:
        own_wait = waits.get(m.key)
        if own_wait is not None and own_wait.reason not in _CAPACITY_REASONS \
                and own_wait.reason is not WaitReason.UNSATISFIABLE:
            out[m.key] = own_wait  # its own problem, said as it is
        else:
            out[m.key] = _member_waits(m, reason, message)
    return GangWaiting(reason, message, out,
                       tuple(placed) if reason is WaitReason.GANG_CAPACITY else ())


def _order(m: GangMember) -> tuple[bool, int, datetime, str, str]:
    """A member with a claim it cannot use first (it waits whatever the
    others do, and says why at once), then largest set first."""
    gpus = sum(c.count for c in m.claims if isinstance(c, ClaimState) and not c.bound)
    unresolved = any(isinstance(c, UnresolvedClaim) for c in m.claims)
    return (not unresolved, -gpus, m.pod.created, m.pod.namespace, m.pod.name)


def _name(key: str) -> str:
    return key.rpartition("/")[2]


def _member_waits(m: GangMember, reason: WaitReason, message: str) -> Waiting:
    per = ClaimWait(reason, message)
    return Waiting(reason, message, {c.name: per for c in m.claims})


def _all_wait(members: Sequence[GangMember], reason: WaitReason, message: str) -> GangWaiting:
    return GangWaiting(reason, message, {m.key: _member_waits(m, reason, message) for m in members})


# From this many members on, members with the same set share one pass over
# the nodes (_Alike); fewer are decided one by one.
ALIKE_FROM = 8


class _Alike:
    """Members whose sets are alike -- the same classes and counts, nothing
    bound, no rejection, no claim problem, no container requests, the same
    node rules (an Indexed Job's workers) -- are placed from one ranking of
    the nodes instead of one scan each: `placement.decide`'s search picks the
    fitting admitted node with the best (fraction allocated, GPUs left)
    under the strategy, the first in node order on a tie. Here every fitting
    admitted node is ranked once in a heap on that key and node order; after
    each placement the node that took it is ranked again (it is the only
    one whose key changed), and a popped entry whose key is stale is
    dropped. The same node as `decide` every time (tests/test_gang.py holds
    the two equal on random clusters), in about one scan plus M log N.

    A member that is not alike, or that finds no node, returns None: the
    caller decides it alone (and a waiting one explains itself there)."""

    def __init__(self, cluster: Cluster, used: _Overlay, strategy: Strategy) -> None:
        self.cluster = cluster
        self.used = used
        self.spread = strategy is Strategy.SPREAD
        # signature -> (need, checks, ranking heap, node order index)
        self._groups: dict[tuple[Any, ...], tuple[dict[str, int], list[tuple[float, float, int, str]],
                                                  dict[str, int]]] = {}

    def _signature(self, m: GangMember) -> tuple[Any, ...] | None:
        if m.pod.requests:
            return None
        states = []
        for c in m.claims:
            if not isinstance(c, ClaimState) or c.bound or c.phase is not Phase.PENDING or c.rejected \
                    or c.deleting or any(r.uid != m.pod.uid for r in c.reserved_for):
                return None
            cls = self.cluster.classes.get(c.class_name)
            if cls is None or cls.deleting:
                return None
            states.append((c.class_name, c.count))
        try:
            hash(m.pod.rules)
        except TypeError:
            return None
        return (tuple(sorted(states)), m.pod.rules)

    def _key(self, need: Mapping[str, int], node: NodeInfo) -> tuple[float, float] | None:
        """search's (fraction, slack) for the set on `node`, larger better;
        None if it does not fit. The same arithmetic, in the same order."""
        checks = sorted(need.items())
        if len(checks) == 1:
            ((r, n),) = checks
            alloc = node.allocatable.get(r, 0)
            after = self.used.get(r, NO_USE).get(node.name, 0) + n
            if after > alloc:
                return None
            return (-after / alloc, alloc - after) if self.spread else (after / alloc, after - alloc)
        total = 0.0
        free_after = 0
        for r, n in checks:
            alloc = node.allocatable.get(r, 0)
            after = self.used.get(r, NO_USE).get(node.name, 0) + n
            if after > alloc:
                return None
            total += after / alloc
            free_after += alloc - after
        frac = total / len(checks)
        return (-frac, free_after) if self.spread else (frac, -free_after)

    def place(self, m: GangMember) -> Placed | None:
        sig = self._signature(m)
        if sig is None:
            return None
        claims = [c for c in m.claims if isinstance(c, ClaimState)]
        group = self._groups.get(sig)
        if group is None:
            need: dict[str, int] = {}
            for c in claims:
                r = self.cluster.classes[c.class_name].resource_name
                need[r] = need.get(r, 0) + c.count
            offer = self.cluster.offer(tuple(sorted({c.class_name for c in claims})))
            admits = m.pod.rules.admits
            heap: list[tuple[float, float, int, str]] = []
            order: dict[str, int] = {}
            for i, (name, _, node) in enumerate(offer.usable):
                order[name] = i
                key = self._key(need, node)
                if key is not None and admits(name, node.labels, node.blocking_taints):
                    heap.append((-key[0], -float(key[1]), i, name))
            heapq.heapify(heap)
            group = self._groups[sig] = (need, heap, order)
        need, heap, order = group
        while heap:
            neg_frac, neg_slack, i, name = heap[0]
            node = self.cluster.nodes[name]
            key = self._key(need, node)
            if key is None or (-key[0], -float(key[1])) != (neg_frac, neg_slack):
                heapq.heappop(heap)  # stale: its node took GPUs since (re-ranked then), or is full
                continue
            actions = tuple(ClaimAction(c.name, c.uid, Action.BIND, name,
                                        self.cluster.classes[c.class_name].resource_name, c.count)
                            for c in claims)
            return Placed(name, actions, f"{describe(claims)} placed on node {name}")
        return None

    def took(self, d: Placed) -> None:
        """A placement on `d.node` changed its key for every group: ranked again."""
        node = self.cluster.nodes.get(d.node)
        if node is None:
            return
        for need, heap, order in self._groups.values():
            i = order.get(d.node)
            key = self._key(need, node) if i is not None else None
            if key is not None and i is not None:
                entry: tuple[float, float, int, str] = (-key[0], -float(key[1]), i, d.node)
                heapq.heappush(heap, entry)


class _Overlay(Mapping[str, Mapping[str, int]]):
    """`used` plus the GPUs the members placed so far take: a resource's
    per-node map is copied once, the first time a placement touches it."""

    def __init__(self, base: Usage) -> None:
        self._base = base
        self._copied: dict[str, dict[str, int]] = {}

    def take(self, d: Placed) -> None:
        for a in d.new_gpus():
            per = self._copied.get(a.resource)
            if per is None:
                per = self._copied[a.resource] = dict(self._base.get(a.resource, NO_USE))
            per[a.node] = per.get(a.node, 0) + a.count

    def __getitem__(self, resource: str) -> Mapping[str, int]:
        per = self._copied.get(resource)
        return per if per is not None else self._base[resource]

    def get(self, resource: str, default: Mapping[str, int] | None = None) -> Mapping[str, int]:  # type: ignore[override]
        per = self._copied.get(resource)
        if per is not None:
            return per
        return self._base.get(resource, default if default is not None else NO_USE)

    def __iter__(self) -> Iterator[str]:
        return iter(set(self._base) | set(self._copied))

    def __len__(self) -> int:
        return len(set(self._base) | set(self._copied))
