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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuclaimctl.decide.budget import check_budgets, new_asks
from gpuclaimctl.decide.placement import ClaimWait, Placed, Waiting, decide
from gpuclaimctl.model.api import Strategy, WaitReason
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo, BudgetUse
from gpuclaimctl.model.snapshot import NO_USE, ClaimState, Cluster, PodInfo, UnresolvedClaim, Usage


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
    for m in sorted(members, key=_order):
        d = decide(m.pod, m.claims, cluster, overlay, now, strategy)
        if isinstance(d, Placed):
            placed.append((m.key, d))
            overlay.take(d)
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
    return GangWaiting(reason, message, out)


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
