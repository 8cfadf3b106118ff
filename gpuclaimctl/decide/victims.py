"""Whom preemption may take (DESIGN.md §4d): decide.preempt's `Victim`s and
`Unit`s from what the cluster shows.

THE rule, in one place for its two readers: the controller's view keeps
its inputs incrementally (state.usage, state.victims behind
`Decider.units_on`), `why` and `simulate` read them from lists of objects
(`units_on` here, through decide.whatif). A victim is a pod

1. bound to a node and not finished (`capacity.pod_holds_node`),
2. that claims holding GPUs on that very node reserve (placed by this
   controller: a pod holding GPUs without claims is kube-scheduler's);
3. freeing what its going frees: a claim frees its GPUs with the pod
   unless it is Retain, and a Retain claim only with the pod it was made
   for from a template (`freed_with`); a claim with a write of ours not
   seen back frees nothing (the view says which);
4. terminating when it has a deletionTimestamp (or was evicted lately),
   and no victim at all when it has been terminating for longer than
   `stuck_after` seconds: it frees nothing one can count on;
5. taken with every other member of its gang (the PODS_BY_GANG key,
   state.indexes.pods_by_gang, passed in as `gang_keys`: the state layer
   owns it) that is a victim, wherever they run.

`WAITS_FOR_ROOM` and `preempting` are the two rules around the plan: which
waits look for one, and how a preemptor's set then waits.

Pure: no client, no clock (`now` is passed in), no globals.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gpuclaimctl.decide.capacity import claim_usage, pod_holds_node
from gpuclaimctl.decide.placement import ClaimWait, Waiting
from gpuclaimctl.decide.preempt import Preemption, Unit, Victim
from gpuclaimctl.model import api
from gpuclaimctl.model.api import WaitReason
from gpuclaimctl.model.podclaims import template_owner_uid
from gpuclaimctl.model.snapshot import ClaimState, UnresolvedClaim, parse_time, pod_priority

Obj = Mapping[str, Any]
# A pod's PODS_BY_GANG keys (state.indexes.pods_by_gang): none, or its gang's.
GangKeys = Callable[[Obj], Sequence[str]]

# The waits a set (or gang) looks for a preemption for: room on a node, or
# its namespace's budget (its own victims may give some back). Any other
# wait is not one evicting pods could end.
WAITS_FOR_ROOM = frozenset({WaitReason.CAPACITY, WaitReason.BUDGET, WaitReason.GANG_CAPACITY})


class BoundPod(Protocol):
    """What the rule reads of a pod bound to a node (state.usage.RunningPod
    and `RunningPod` here both are one)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def created(self) -> datetime: ...
    @property
    def gang(self) -> str: ...
    @property
    def deleting_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class RunningPod:
    """A pod bound to a node, not finished, as preemption reads it."""

    namespace: str
    name: str
    node: str
    priority: int
    created: datetime
    gang: str                       # its PODS_BY_GANG key, or ""
    deleting_at: datetime | None    # metadata.deletionTimestamp


@dataclass(frozen=True)
class Hold:
    """GPUs a claim reserving the pod holds: where, of what, how many, of
    which class, and whose going frees them (`freed_with`; None: nothing
    comes free, e.g. while a write of ours to it is not seen back)."""

    node: str
    resource: str
    count: int
    class_name: str
    freed_with: str | None


def running_pod(pod: Obj, gang_keys: GangKeys) -> RunningPod | None:
    """The pod as preemption reads it, or None: not on a node, finished,
    or without a creationTimestamp."""
    if not pod_holds_node(pod):
        return None
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    if created is None:
        return None
    gang = gang_keys(pod)
    return RunningPod(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                      str((pod.get("spec") or {}).get("nodeName") or ""), pod_priority(pod), created,
                      gang[0] if gang else "", parse_time(meta.get("deletionTimestamp")))


def freed_with(claim: Obj) -> str | None:
    """Whose going frees a claim's GPUs: any pod's ("*"), unless it is
    Retain; a Retain template claim its pod's (deleted with it); None for
    any other Retain claim (its GPUs stay held when its pod goes)."""
    if (claim.get("spec") or {}).get("reclaimPolicy") == api.ReclaimPolicy.RETAIN:
        return template_owner_uid(claim) or None
    return "*"


def victim(uid: str, pod: BoundPod, holds: Iterable[Hold], now: datetime, stuck_after: float,
           evicted: bool = False) -> Victim | None:
    """The pod `uid` as a victim, or None: no claim reserving it holds GPUs
    on its node (not placed by this controller), or it has been
    terminating for longer than `stuck_after` seconds. `holds`: the claims
    reserving it that hold GPUs; `evicted`: it was evicted lately (it is
    terminating, whatever its deletionTimestamp says yet)."""
    frees: dict[str, int] = {}
    budget: dict[str, int] = {}
    mine = False
    for h in holds:
        if h.node != pod.node:
            continue
        mine = True
        if h.freed_with not in ("*", uid):
            continue  # a Retain claim, or a write of ours not seen back: nothing comes free
        frees[h.resource] = frees.get(h.resource, 0) + h.count
        budget[h.class_name] = budget.get(h.class_name, 0) + h.count
    if not mine:
        return None
    if pod.deleting_at is not None and (now - pod.deleting_at).total_seconds() > stuck_after:
        return None
    return Victim(pod.namespace, pod.name, uid, pod.node, pod.priority, pod.created, frees, budget,
                  pod.deleting_at is not None or evicted)


def units_at(node: str, reserved: Iterable[str], victim_of: Callable[[str], Victim | None],
             gang_of: Callable[[str], str], members_of: Callable[[str], Iterable[str]]) -> tuple[Unit, ...]:
    """What preemption may take on `node`: `reserved` are the uids of the
    pods the claims holding GPUs there reserve; each that is a victim on
    this node is a unit alone, or with every victim of its gang (`gang_of`
    its key, `members_of` the uids of the gang's running pods). By key:
    the pod's uid, or the gang's."""
    units: dict[str, Unit] = {}
    for uid in reserved:
        v = victim_of(uid)
        if v is None or v.node != node:
            continue
        gang = gang_of(uid)
        if not gang:
            units.setdefault(uid, Unit((v,)))
        elif gang not in units:
            members = [victim_of(u) for u in sorted(members_of(gang))]
            units[gang] = Unit(tuple(m for m in members if m is not None), gang)
    return tuple(units[k] for k in sorted(units))


def units_on(claims: Iterable[Obj], pods: Iterable[Obj], resource_of_class: Mapping[str, str], now: datetime,
             gang_keys: GangKeys, stuck_after: float,
             evicted: Collection[str] = ()) -> dict[str, tuple[Unit, ...]]:
    """node -> what preemption may take there (decide.preempt's `units_on`),
    from lists of claims and pods: the nodes with none are left out; a pod
    in `evicted` (uids) is terminating. The same units as the controller's
    view builds from the same objects (state.victims)."""
    running: dict[str, RunningPod] = {}
    gang_pods: dict[str, set[str]] = {}
    for pod in pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        r = running_pod(pod, gang_keys)
        if uid and r is not None:
            running[uid] = r
            if r.gang:
                gang_pods.setdefault(r.gang, set()).add(uid)
    holds: dict[str, list[Hold]] = {}      # pod uid -> the claims reserving it that hold GPUs
    reserved_on: dict[str, list[str]] = {}  # node -> the pods its GPU-holding claims reserve
    for claim in claims:
        held = claim_usage(claim, resource_of_class)
        if held is None:
            continue
        hold = Hold(*held, str((claim.get("spec") or {}).get("className") or ""), freed_with(claim))
        uids = [str(r.get("uid") or "") for r in (claim.get("status") or {}).get("reservedFor") or ()]
        for uid in uids:
            holds.setdefault(uid, []).append(hold)
        reserved_on.setdefault(held[0], []).extend(uids)
    cache: dict[str, Victim | None] = {}

    def victim_of(uid: str) -> Victim | None:
        if uid not in cache:
            pod = running.get(uid)
            cache[uid] = None if pod is None else victim(uid, pod, holds.get(uid, ()), now, stuck_after,
                                                         uid in evicted)
        return cache[uid]

    out: dict[str, tuple[Unit, ...]] = {}
    for node, reserved in sorted(reserved_on.items()):
        units = units_at(node, reserved, victim_of, lambda uid: running[uid].gang,
                         lambda gang: gang_pods.get(gang, ()))
        if units:
            out[node] = units
    return out


def preempting(plan: Preemption, claims: Sequence[ClaimState | UnresolvedClaim]) -> Waiting:
    """How a preemptor's set waits while its victims go: Preempting, with
    the plan's message (which names the node and the victims) on every
    claim (sync.preemption writes it so)."""
    wait = ClaimWait(WaitReason.PREEMPTING, plan.message)
    return Waiting(WaitReason.PREEMPTING, plan.message, {c.name: wait for c in claims})
