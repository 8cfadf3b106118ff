"""Which pods a higher-priority set takes its GPUs from (DESIGN.md §4d, I6).

A set (or a gang) that fits no node as things are may take one node's GPUs
from pods of lower priority that this controller placed there. The plan is
made purely, on the same snapshot as placement, and only returned when
placement itself -- `placement.decide` (or `gang.decide_gang`) on the
snapshot with the victims' GPUs taken out -- places the whole set: nothing
is evicted that would not make the preemptor fit.

The victims on a node are chosen as:
1. only pods of lower priority than the preemptor, placed by this
   controller (they reserve GPUClaims bound on the node: `Victim`);
2. a gang is taken whole or not at all (`Unit`): every member that holds
   GPUs goes, wherever it runs, and a gang with any member of the
   preemptor's priority or higher is no victim;
3. a pod frees only what its going frees: a Retain claim keeps its GPUs
   when its pod goes, so it frees nothing; a pod already terminating frees
   its GPUs without being evicted (it is waited for, never counted as a
   victim);
4. the fewest pods, then the lowest priorities (the highest priority taken
   compared first), then the youngest (the oldest taken compared first),
   then names; the node whose victims rank first wins (then its name);
5. a victim in another namespace frees GPUs on the node but not the
   preemptor's budget: where the preemptor's namespace is over a budget,
   only its own victims' claims bring it back under.

The search is exact (branch and bound over the units on one node) up to
`SEARCH_LIMIT` steps per node, then the best found so far.

Pure: no client, no clock (`now` is passed in), no globals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpuclaimctl.decide.budget import new_asks
from gpuclaimctl.decide.capacity import free_on, shortfall
from gpuclaimctl.decide.gang import GangDecision, GangMember, GangPlaced, decide_gang
from gpuclaimctl.decide.placement import Placed, decide, describe
from gpuclaimctl.model.api import Strategy
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo, BudgetUse
from gpuclaimctl.model.snapshot import NO_USE, ClaimState, Cluster, PodInfo, UnresolvedClaim, Usage

# Branch-and-bound steps per node before the best found so far is taken.
SEARCH_LIMIT = 4096


@dataclass(frozen=True)
class Victim:
    """A pod this controller placed, as preemption sees it."""

    namespace: str
    name: str
    uid: str
    node: str
    priority: int
    created: datetime
    # resource -> GPUs that come free on `node` when it goes (its claims
    # that are not Retain, as the view counts them).
    frees: Mapping[str, int]
    # class -> GPUs its namespace's budgets get back when it goes.
    budget_frees: Mapping[str, int] = field(default_factory=dict)
    terminating: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Unit:
    """What is taken whole: one pod, or every member of a gang holding GPUs."""

    members: tuple[Victim, ...]
    gang: str = ""

    @property
    def priority(self) -> int:
        return max(m.priority for m in self.members)

    @property
    def terminating(self) -> bool:
        return all(m.terminating for m in self.members)


@dataclass(frozen=True)
class Preemption:
    """Evict `victims` (not those already terminating), then the set fits:
    `placed` is placement's decision with their GPUs free (for a gang, one
    per member)."""

    node: str
    victims: tuple[Victim, ...]
    waiting_for: tuple[Victim, ...]  # already terminating: not evicted, waited for
    placed: tuple[tuple[str, Placed], ...]
    message: str

    @property
    def usage(self) -> dict[str, dict[str, int]]:
        """resource -> node -> GPUs the preemptor will take (what is held for it)."""
        out: dict[str, dict[str, int]] = {}
        for _, p in self.placed:
            for a in p.new_gpus():
                per = out.setdefault(a.resource, {})
                per[a.node] = per.get(a.node, 0) + a.count
        return out


class NodeUnits:
    """The units with a member holding GPUs on one node, with what the
    search reads of them first, worked out once per change of the node
    (the view keeps them: state.victims)."""

    __slots__ = ("node", "units", "by_gives", "by_priority", "by_age", "any_terminating", "_bounds")

    def __init__(self, node: str, units: Sequence[Unit]) -> None:
        self.node = node
        self.units = tuple(units)
        paid = [u for u in self.units if not u.terminating]
        # resource -> (GPUs it gives here, priority, its oldest pod's age key)
        # per unit not terminating: largest gift first; lowest priority
        # first; youngest first.
        entries: dict[str, list[tuple[int, int, float]]] = {}
        for u in paid:
            for r, n in _gives_on(u, node).items():
                if n:
                    entries.setdefault(r, []).append((n, u.priority, _age_key(u)))
        self.by_gives = {r: sorted(e, reverse=True) for r, e in entries.items()}
        self.by_priority = {r: sorted(e, key=lambda t: t[1]) for r, e in entries.items()}
        self.by_age = {r: sorted(e, key=lambda t: t[2]) for r, e in entries.items()}
        self.any_terminating = len(paid) != len(self.units)
        self._bounds: dict[tuple[str, int, int], tuple[object, ...] | None] = {}

    def __len__(self) -> int:
        return len(self.units)

    def lower_bound(self, resource: str, short: int, priority: int) -> tuple[object, ...] | None:
        """No answer here for `short` GPUs of `resource` from units below
        `priority` costs less than this (None: none covers it; (): the
        terminating units may, so it is worked out in full)."""
        if self.any_terminating:
            return ()
        key = (resource, short, priority)
        if key in self._bounds:
            return self._bounds[key]
        bound = self._bounds[key] = self._lower_bound(resource, short, priority)
        return bound

    def _lower_bound(self, resource: str, short: int, priority: int) -> tuple[object, ...] | None:
        count = got = 0
        gifts: list[int] = []
        for n, p, _ in self.by_gives.get(resource, ()):
            if p < priority:
                got += n
                count += 1
                gifts.append(n)
                if got >= short:
                    break
        if got < short:
            return None
        # At least `count` units go (a unit is a pod or more); a unit giving
        # less than this can be one of `count` only with the largest others.
        least = short - sum(gifts[:-1])
        lowest = [p for n, p, _ in self.by_priority[resource] if p < priority and n >= least][:count]
        youngest = [a for n, p, a in self.by_age[resource] if p < priority and n >= least][:count]
        return (count, tuple(reversed(lowest)), tuple(reversed(youngest)))


def _gives_on(u: Unit, node: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in u.members:
        if m.node == node:
            for r, n in m.frees.items():
                out[r] = out.get(r, 0) + n
    return out


def _age_key(u: Unit) -> float:
    """The oldest member's, as `_cost` compares it (smaller: younger)."""
    return max(-m.created.timestamp() for m in u.members if not m.terminating)


UnitsOn = Mapping[str, "Sequence[Unit] | NodeUnits"]  # node -> the units with a member holding GPUs there


def plan(
    pod: PodInfo,
    priority: int,
    claims: Sequence[ClaimState | UnresolvedClaim],
    cluster: Cluster,
    used: Usage,
    now: datetime,
    units_on: UnitsOn,
    strategy: Strategy = Strategy.BINPACK,
    budgets: Sequence[BudgetInfo] | None = (),
    budget_use: BudgetUse = NO_BUDGET_USE,
    skip_nodes: Iterable[str] = (),
) -> Preemption | None:
    """The preemption that places this pod's whole set, or None (none
    would: then nothing is evicted). The caller has found that the set does
    not fit as things are; `skip_nodes` are nodes given up (an eviction
    there was refused)."""
    states = [c for c in claims if isinstance(c, ClaimState)]
    if len(states) != len(claims) or not states or any(c.bound for c in states):
        # A claim it cannot use, or claims bound somewhere (they keep the
        # set on their node): preemption is for sets placed afresh.
        return None
    return _Planner(pod.namespace, priority, cluster, used, units_on, budgets, budget_use,
                    frozenset(skip_nodes)).single(pod, states, now, strategy)


def plan_gang(
    name: str,
    size: int,
    members: Sequence[GangMember],
    priority: int,
    cluster: Cluster,
    used: Usage,
    now: datetime,
    units_on: UnitsOn,
    strategy: Strategy = Strategy.BINPACK,
    budgets: Sequence[BudgetInfo] | None = (),
    budget_use: BudgetUse = NO_BUDGET_USE,
    skip_nodes: Iterable[str] = (),
) -> Preemption | None:
    """A gang's preemption: its members' sets, largest first, each fitted
    as things are then stand or by preempting on one node (the victims of
    earlier members freed), and the whole gang placed by `decide_gang` with
    every victim gone; or None. Every member's set must be placed afresh."""
    if not members or len(members) != size:
        return None
    for m in members:
        if any(not isinstance(c, ClaimState) or c.bound for c in m.claims) or not m.claims:
            return None
    namespace = members[0].pod.namespace
    planner = _Planner(namespace, priority, cluster, used, units_on, budgets, budget_use, frozenset(skip_nodes))
    taken: dict[str, Unit] = {}  # unit id -> unit
    overlay = _Usage(used)
    order = sorted(members, key=lambda m: (-sum(c.count for c in m.claims if isinstance(c, ClaimState)),
                                           m.pod.created, m.key))
    for m in order:
        states = [c for c in m.claims if isinstance(c, ClaimState)]
        as_is = decide(m.pod, states, cluster, overlay.view(), now, strategy)
        if isinstance(as_is, Placed):
            overlay.take(as_is)
            continue
        step = planner.for_set(m.pod, states, now, strategy, overlay, taken)
        if step is None:
            return None
        placed, units = step
        for u in units:
            taken[_unit_id(u)] = u
            overlay.free(u)
        overlay.take(placed)
    if not taken:
        return None
    freed = _Usage(used)
    for u in taken.values():
        freed.free(u)
    decision: GangDecision = decide_gang(name, size, members, 0, cluster, freed.view(), now, strategy,
                                         budgets, _less_budget(budget_use, namespace, taken.values()))
    if not isinstance(decision, GangPlaced):
        return None
    victims = tuple(sorted((m for u in taken.values() for m in u.members), key=lambda v: v.key))
    nodes = sorted({p.node for _, p in decision.sets})
    return _preemption(nodes[0] if len(nodes) == 1 else ", ".join(nodes), victims, decision.sets,
                       f"gang {name}")


class _Planner:
    def __init__(self, namespace: str, priority: int, cluster: Cluster, used: Usage, units_on: UnitsOn,
                 budgets: Sequence[BudgetInfo] | None, budget_use: BudgetUse, skip: frozenset[str]) -> None:
        self.namespace = namespace
        self.priority = priority
        self.cluster = cluster
        self.used = used
        self.units_on = units_on
        self.budgets = budgets
        self.budget_use = budget_use
        self.skip = skip

    def single(self, pod: PodInfo, states: Sequence[ClaimState], now: datetime,
               strategy: Strategy) -> Preemption | None:
        step = self.for_set(pod, states, now, strategy, _Usage(self.used), {}, budgets=True)
        if step is None:
            return None
        placed, units = step
        victims = tuple(sorted((m for u in units for m in u.members), key=lambda v: v.key))
        return _preemption(placed.node, victims, (((f"{pod.namespace}/{pod.name}"), placed),),
                           describe(states))

    def for_set(self, pod: PodInfo, states: Sequence[ClaimState], now: datetime, strategy: Strategy,
                overlay: _Usage, taken: Mapping[str, Unit],
                budgets: bool = False) -> tuple[Placed, tuple[Unit, ...]] | None:
        """The cheapest units on one node whose going lets placement put
        the set there (or anywhere), verified by placement itself."""
        classes = self.cluster.classes
        if any(c.class_name not in classes or classes[c.class_name].deleting for c in states):
            return None  # it waits for its class, not for room
        need: dict[str, int] = {}
        for c in states:
            r = self.cluster.classes[c.class_name].resource_name
            need[r] = need.get(r, 0) + c.count
        class_names = tuple(sorted({c.class_name for c in states}))
        offer = self.cluster.offer(class_names)
        admits = pod.rules.admits
        rejected = {r.node_name for c in states for r in c.rejected if r.until > now}
        budget_need = self._budget_excess(states) if budgets else {}
        if budget_need is None:
            return None
        used = overlay.view()
        # Each node's lower bound on its answer's cost (from what the view
        # keeps of the node); nodes are then solved in that order, each
        # search bounded by the best answer so far, until a bound is no
        # better than it.
        candidates: list[tuple[tuple[object, ...], str, NodeUnits, dict[tuple[str, str], int]]] = []
        units_on, skip, priority = self.units_on, self.skip, self.priority
        # The common case, kept tight: one resource, no budget to win back.
        single = next(iter(need.items())) if len(need) == 1 and not budget_need else None
        for name, alloc, node in offer.usable:
            got = units_on.get(name)
            if not got or name in skip or name in rejected:
                continue
            bound: tuple[object, ...] = ()
            if single is not None:
                r, n = single
                missing = n - alloc + used.get(r, NO_USE).get(name, 0)
                if missing <= 0:
                    continue  # it fits as things are: not a node to preempt on
                nu = got if isinstance(got, NodeUnits) else NodeUnits(name, got)
                # (units taken already for a gang only loosen the bound)
                lower = nu.lower_bound(r, missing, priority)
                if lower is None:
                    continue  # even every unit below its priority gone would not do
                candidates.append((lower, name, nu, {("node", r): missing}))
                continue
            short = shortfall(need, free_on(node.allocatable, used, name))
            if not short and not budget_need:
                continue  # it fits as things are: not a node to preempt on
            nu = got if isinstance(got, NodeUnits) else NodeUnits(name, got)
            req: dict[tuple[str, str], int] = {("node", r): n for r, n in short.items()}
            req.update(budget_need)
            candidates.append((bound, name, nu, req))
        candidates.sort(key=lambda t: (t[0], t[1]))
        ranked: list[tuple[tuple[object, ...], str, tuple[Unit, ...]]] = []
        for bound, name, nu, req in candidates:
            best = ranked[0][0] if ranked else None
            if best is not None and bound >= best[:3]:
                break  # neither this node nor any after it can do better
            node = offer.nodes[name]
            if not admits(name, node.labels, node.blocking_taints):
                continue
            problem = _Problem.of(
                [u for u in nu.units if (u.priority < priority or u.terminating) and _unit_id(u) not in taken],
                req, name, self.namespace)
            if problem is None:
                continue
            found = problem.solve(best)
            if found is not None:
                ranked.append((found[0], name, found[1]))
                ranked.sort(key=lambda t: (t[0], t[1]))
        for _, name, choice in ranked:
            freed = _Usage(used)
            for u in choice:
                freed.free(u)
            decision = decide(pod, states, self.cluster, freed.view(), now, strategy,
                              self.budgets if budgets else (),
                              _less_budget(self.budget_use, self.namespace, choice) if budgets
                              else NO_BUDGET_USE)
            if isinstance(decision, Placed):
                return decision, choice
        return None

    def _budget_excess(self, states: Sequence[ClaimState]) -> dict[tuple[str, str], int] | None:
        """GPUs past each budget limit the set would take (("budget", id) ->
        GPUs), which only victims of this namespace can give back; None
        while budgets cannot be read."""
        asks = new_asks(states)
        if not asks:
            return {}
        if self.budgets is None:
            return None
        out: dict[tuple[str, str], int] = {}
        for budget in self.budgets:
            for i, limit in enumerate(budget.limits):
                needs = sum(n for c, n in asks if limit.covers(c))
                if not needs:
                    continue
                bound, placing = self.budget_use.of(limit)
                over = bound + placing + needs - limit.gpus
                if over > 0:
                    out[("budget", f"{budget.name}#{i}|{limit.class_name}")] = over
        return out


def _unit_id(u: Unit) -> str:
    return u.gang or u.members[0].uid


def _contribution(u: Unit, node: str, namespace: str, req: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for key in req:
        kind, what = key
        if kind == "node":
            got = sum(m.frees.get(what, 0) for m in u.members if m.node == node)
        else:
            covers = what.rpartition("|")[2]
            got = sum(n for m in u.members if m.namespace == namespace
                      for c, n in m.budget_frees.items() if covers in ("*", c))
        if got:
            out[key] = got
    return out


@dataclass
class _Problem:
    """One node's victims to choose: the units that would give something,
    what is still required once the terminating ones are gone, and a lower
    bound on how many pods it takes."""

    free_units: tuple[Unit, ...]  # terminating: they give for nothing
    paid: list[tuple[Unit, dict[tuple[str, str], int], tuple[object, ...]]]  # unit, gives, its own cost
    remaining: dict[tuple[str, str], int]
    lower_bound: int
    # No answer here costs less than this (a cost as `_cost` makes).
    optimistic: tuple[object, ...] = ()

    @classmethod
    def of(cls, units: Sequence[Unit], req: Mapping[tuple[str, str], int], node: str,
           namespace: str) -> _Problem | None:
        """None if even every unit gone would not cover `req`."""
        remaining = dict(req)
        free_units: list[Unit] = []
        paid = []
        for u in units:
            got = _contribution(u, node, namespace, req)
            if not got:
                continue
            if u.terminating:
                free_units.append(u)
                for k, n in got.items():
                    remaining[k] = remaining.get(k, 0) - n
            else:
                paid.append((u, got, _cost(u.members)))
        remaining = {k: n for k, n in remaining.items() if n > 0}
        bound = 0
        for k, n in remaining.items():
            # As many units at least as the largest givers take to cover k
            # (each unit is one pod or more).
            gives = sorted((g.get(k, 0) for _, g, _ in paid), reverse=True)
            total, count = 0, 0
            for g in gives:
                if total >= n or not g:
                    break
                total += g
                count += 1
            if total < n:
                return None
            bound = max(bound, count)
        # Cheapest-looking first (its pods, priorities, youngest): the search
        # meets good answers early.
        paid.sort(key=lambda t: (t[2], -sum(t[1].values())))
        # At least `bound` units go: their priorities at best the lowest
        # `bound` of all, their oldest members at best the youngest.
        lowest = sorted(u.priority for u, _, _ in paid)[:bound]
        youngest = sorted(max(-m.created.timestamp() for m in u.members if not m.terminating)
                          for u, _, _ in paid)[:bound]
        optimistic = (bound, tuple(sorted(lowest, reverse=True)), tuple(sorted(youngest, reverse=True)))
        return cls(tuple(free_units), paid, remaining, bound, optimistic if remaining else ())

    def solve(self, better_than: tuple[object, ...] | None) -> tuple[tuple[object, ...], tuple[Unit, ...]] | None:
        """The cheapest covering units (fewest pods, lowest priorities,
        youngest, names) if cheaper than `better_than`: branch and bound."""
        free = self.free_units
        if not self.remaining:
            key = _cost(m for u in free for m in u.members)
            return (key, free) if better_than is None or key < better_than else None
        if better_than is not None and self.optimistic >= better_than[:3]:
            return None  # even the best imaginable here is no better
        paid = self.paid
        # What the best s units from i on can give, per requirement: the
        # prefix sums of their gifts, largest first.
        keys = list(self.remaining)
        top: list[dict[tuple[str, str], list[int]]] = []
        for i in range(len(paid) + 1):
            per: dict[tuple[str, str], list[int]] = {}
            for k in keys:
                sums = [0]
                for g in sorted((t[1].get(k, 0) for t in paid[i:]), reverse=True):
                    sums.append(sums[-1] + g)
                per[k] = sums
            top.append(per)
        best: list[tuple[tuple[object, ...], tuple[Unit, ...]]] = []
        bound = [better_than]
        steps = 0

        def search(i: int, chosen: list[Unit], left: dict[tuple[str, str], int], pods: int) -> None:
            nonlocal steps
            steps += 1
            limit = bound[0]
            if not left:
                key = _cost(m for u in chosen for m in u.members)
                if limit is None or key < limit:
                    best[:] = [(key, tuple(chosen))]
                    bound[0] = key
                return
            if i == len(paid) or steps > SEARCH_LIMIT:
                return
            # Units that may still be added: up to as many pods as the best
            # answer has (each unit is a pod or more), or all of them.
            slots = len(paid) - i
            if limit is not None:
                slots = min(slots, limit[0] - pods)  # type: ignore[operator]
                if slots <= 0:
                    return  # one more unit makes more pods than the best
            if any(top[i][k][min(slots, len(top[i][k]) - 1)] < n for k, n in left.items()):
                return
            u, got, _ = paid[i]
            after = {k: n - got.get(k, 0) for k, n in left.items() if n - got.get(k, 0) > 0}
            search(i + 1, chosen + [u], after, pods + sum(1 for m in u.members if not m.terminating))
            search(i + 1, chosen, left, pods)

        search(0, [], self.remaining, 0)
        if not best:
            return None
        key, units = best[0]
        return key, free + units


def _cost(members: Iterable[Victim]) -> tuple[object, ...]:
    """Fewest pods, lowest priorities, youngest, names: smaller is better."""
    paid = [m for m in members if not m.terminating]
    return (len(paid),
            tuple(sorted((m.priority for m in paid), reverse=True)),
            tuple(sorted((-m.created.timestamp() for m in paid), reverse=True)),
            tuple(sorted(m.key for m in paid)))


class _Usage:
    """`used` with victims' GPUs taken out and placements added, copied on write."""

    def __init__(self, used: Usage) -> None:
        self._base = used
        self._delta: dict[str, dict[str, int]] = {}

    def free(self, unit: Unit) -> None:
        for m in unit.members:
            for r, n in m.frees.items():
                per = self._delta.setdefault(r, {})
                per[m.node] = per.get(m.node, 0) - n

    def take(self, placed: Placed) -> None:
        for a in placed.new_gpus():
            per = self._delta.setdefault(a.resource, {})
            per[a.node] = per.get(a.node, 0) + a.count

    def view(self) -> Usage:
        if not self._delta:
            return self._base
        out: dict[str, Mapping[str, int]] = dict(self._base)
        for r, delta in self._delta.items():
            per = dict(self._base.get(r, NO_USE))
            for node, n in delta.items():
                per[node] = per.get(node, 0) + n
            out[r] = per
        return out


def _less_budget(use: BudgetUse, namespace: str, units: Iterable[Unit]) -> BudgetUse:
    bound = dict(use.bound)
    for u in units:
        for m in u.members:
            if m.namespace == namespace:
                for c, n in m.budget_frees.items():
                    bound[c] = bound.get(c, 0) - n
    return BudgetUse(bound, use.placing)


def _preemption(node: str, victims: tuple[Victim, ...], placed: tuple[tuple[str, Placed], ...],
                what: str) -> Preemption:
    evict = tuple(v for v in victims if not v.terminating)
    wait = tuple(v for v in victims if v.terminating)
    shown = ", ".join(f"{v.key} (priority {v.priority})" for v in evict)
    parts = []
    if evict:
        parts.append(f"preempting {len(evict)} pod{'s' if len(evict) != 1 else ''} of lower priority on node "
                     f"{node}: {shown}")
    if wait:
        parts.append(f"waiting for {len(wait)} terminating pod{'s' if len(wait) != 1 else ''} there: "
                     + ", ".join(v.key for v in wait))
    return Preemption(node, evict, wait, placed, f"{what}: " + "; ".join(parts) +
                      "; the GPUs they free are held for it")
