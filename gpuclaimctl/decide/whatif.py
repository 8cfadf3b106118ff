"""The controller's decision on one read of the cluster (`why`, `simulate`).

The controller decides on its caches plus the placements it has in flight
(sync.pods); an operator's command has neither, only lists of API objects
read at one moment or saved in a snapshot file. `WhatIf` builds from those
lists exactly what `sync.pods` hands to `placement.decide`: the `Cluster`
of nodes and classes, GPUs used per node recounted from the lists
(`capacity.used_capacity`), the pod's claims resolved as the pod sync
resolves them (`podplan.resolve`; a template or inline claim not created
yet is the claim the controller would create), the namespace's GPUBudgets
and what its claims hold against them. `explain` then gives the decision
and each node's verdict (decide.explain).

GPUs served by DRA (docs/dra.md), given as `DraServed` (each node's
offers and the allocated ResourceClaims, computed from resource.k8s.io/v1's
lists by the caller): a node serving a resource through DRA has the
devices it offers as its allocatable and names the DeviceClass
(`NodeInfo.dra`), as the controller's snapshot has it, and the claims'
devices are used as the controller counts them (`drausage.used_with_dra`).

What it cannot know, and the commands say so: placements the running
leader has decided but not yet written, and the nodes it skips in memory
for a template set whose pod the scheduler refused (those also written on
the claims are seen). Nor does it order pods: the controller serves the
oldest waiting pod first.

`admit` counts a placed pod as the controller's writes would leave it
(claims Bound and reserved, the pod on its node), so `simulate` places
copies one after another, each seeing the ones before.

Preemption (DESIGN.md §4d), given the controller's `PreemptionRules`: a
set (or gang) that waits for room gets the plan the controller would make
(decide.preempt, on victims built from the lists by decide.victims, THE
rule the controller's view follows), and then waits Preempting as the
controller's does; or it is said why nothing would be evicted. Nothing is
evicted: `count_preemption` only lets the decisions after it see what the
controller's would (the victims terminating, the GPUs they free held for
the preemptor against pods of its priority or lower). What only the
controller knows is not seen: the GPUs it holds for preemptors now (their
nominations), the nodes where an eviction was refused lately, the pods it
evicted whose deletion does not show yet.

Pure: no client, no clock (`now` is passed in), no globals. A `WhatIf` is
one command's working state: not shared between threads.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuclaimctl.decide import podplan, preempt, victims
from gpuclaimctl.decide.capacity import combine, used_capacity
from gpuclaimctl.decide.dra import NodeDra, node_with_dra
from gpuclaimctl.decide.drausage import DraUsage, device_owners, dra_usage, used_with_dra
from gpuclaimctl.decide.explain import Explanation, explain
from gpuclaimctl.decide.gang import GangMember, GangPlaced, GangWaiting, decide_gang
from gpuclaimctl.decide.placement import Decision, Placed, Waiting
from gpuclaimctl.decide.podplan import Found
from gpuclaimctl.decide.preempt import Preemption, Unit
from gpuclaimctl.decide.victims import WAITS_FOR_ROOM, GangKeys
from gpuclaimctl.model.api import SCHEDULING_GATE, Strategy, WaitReason
from gpuclaimctl.model.budgets import BudgetInfo, BudgetUse, counts_against_budget
from gpuclaimctl.model.dra import ClaimInfo
from gpuclaimctl.model.gangs import Gang, GangError, pod_gang
from gpuclaimctl.model.podclaims import PodClaimsError, pod_claims
from gpuclaimctl.model.snapshot import (
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    PodInfo,
    UnresolvedClaim,
    Usage,
)
from gpuclaimctl.model.volumes import volume_constraints

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ClusterObjects:
    """What a decision reads, as API objects of one moment."""

    nodes: Sequence[Obj] = ()
    classes: Sequence[Obj] = ()
    claims: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()  # those that may hold GPUs (on a node, not finished)
    budgets: Sequence[Obj] = ()
    templates: Sequence[Obj] = ()  # GPUClaimTemplates
    pvcs: Sequence[Obj] = ()
    pvs: Sequence[Obj] = ()


@dataclass(frozen=True)
class DraServed:
    """What DRA serves (docs/dra.md), from resource.k8s.io/v1's lists of one
    moment, for the nodes and GPUClasses decided on: node -> its offers
    (decide.dra.cluster_offers), and the allocated ResourceClaims."""

    offers: Mapping[str, NodeDra] = field(default_factory=dict)
    claims: Sequence[ClaimInfo] = ()


@dataclass(frozen=True)
class PreemptionRules:
    """What the controller's preemption reads beyond the lists: a pod's
    PODS_BY_GANG keys (state.indexes.pods_by_gang) and how long a pod may
    terminate before it frees nothing one can count on
    (sync.preemption.STUCK_AFTER); and `off`, why no plan is made ("" to
    make them): the controller's --no-preemption, or lists without what
    preemption reads."""

    gang_keys: GangKeys
    stuck_after: float
    off: str = ""


@dataclass(frozen=True)
class WouldPreempt:
    """What preemption would do for a set (or gang) that waits for room."""

    priority: int  # the pod's; a gang's, its members' highest
    plan: Preemption | None  # None: nothing would be evicted
    note: str  # the plan's message, or why nothing would be evicted


@dataclass(frozen=True)
class Outcome:
    """One pod's decision: `explanation` (with the decision), or `invalid`,
    the InvalidClaims message when its annotation cannot be used."""

    pod: Obj
    claims: tuple[ClaimState | UnresolvedClaim, ...] = ()
    explanation: Explanation | None = None
    invalid: str = ""
    # claim name -> the object the decision read (or would create)
    raw: Mapping[str, Obj] = field(default_factory=dict)
    # For a set (or gang) that waits for room, given PreemptionRules: the
    # preemption the controller would make (then `explanation`'s decision
    # is Preempting, as the controller's), or why none.
    preemption: WouldPreempt | None = None

    @property
    def placed(self) -> Placed | None:
        d = self.explanation.decision if self.explanation is not None else None
        return d if isinstance(d, Placed) else None


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class WhatIf:
    def __init__(self, objects: ClusterObjects, strategy: Strategy = Strategy.BINPACK,
                 preemption: PreemptionRules | None = None, dra: DraServed | None = None) -> None:
        """`preemption`: the controller's rules; None looks for no preemption.
        `dra`: what DRA serves; None where resource.k8s.io/v1 is not served
        (or not known: a node then has its allocatable alone)."""
        self.strategy = strategy
        self.preemption = preemption
        classes = [ClassInfo.from_api(c) for c in objects.classes]
        offers = dra.offers if dra is not None else {}
        self.cluster = Cluster((node_with_dra(info, offers.get(info.name))
                               for info in map(NodeInfo.from_api, objects.nodes)), classes)
        self._resource_of_class = {c.name: c.resource_name for c in classes}
        self._claims = {_key(c): c for c in objects.claims}
        self._templates = {_key(t): t for t in objects.templates}
        self._pvcs = {_key(p): p for p in objects.pvcs}
        self._pvs = {_key(p)[1]: p for p in objects.pvs}
        self._budgets: dict[str, list[BudgetInfo]] = {}
        for b in objects.budgets:
            info = BudgetInfo.from_api(b)
            self._budgets.setdefault(info.namespace, []).append(info)
        usage = dra_usage(dra.claims, device_owners(offers.values())) if dra is not None else DraUsage()
        self.used: dict[str, dict[str, int]] = used_with_dra(
            objects.claims, objects.pods, self._resource_of_class, usage)
        # namespace -> class -> GPUs its claims hold (what counts against budgets)
        self._held: dict[str, dict[str, int]] = {}
        for c in objects.claims:
            self._count_held(c, +1)
        # Preemption's working state: the pods that may be victims (those
        # admitted too), the uids of those evicted by a plan counted before,
        # the GPUs held for their preemptors (priority, resource -> node ->
        # GPUs), and the units built from them (at `now`), until they change.
        self._pods: list[Obj] = list(objects.pods)
        self._evicted: set[str] = set()
        self._nominations: list[tuple[int, Mapping[str, Mapping[str, int]]]] = []
        self._units: tuple[datetime, Mapping[str, Sequence[Unit]]] | None = None

    def budgets(self, namespace: str) -> list[BudgetInfo]:
        return list(self._budgets.get(namespace, ()))

    def budget_use(self, namespace: str) -> BudgetUse:
        """What the namespace's claims hold, per class; nothing in flight."""
        return BudgetUse(dict(self._held.get(namespace, {})), {})

    def used_for(self, priority: int) -> Usage:
        """What a decision for a pod (or gang) of `priority` sees as used:
        `used`, plus the GPUs held for the preemptors counted so far of that
        priority or higher (as the controller's Decider.used_by counts its
        nominations)."""
        held = [usage for p, usage in self._nominations if p >= priority]
        return combine(self.used, *held) if held else self.used

    def units_on(self, now: datetime) -> Mapping[str, Sequence[Unit]]:
        """node -> what preemption may take there (decide.victims), as the
        lists (and the pods admitted since) show it at `now`."""
        rules = self.preemption
        if rules is None:
            return {}
        if self._units is None or self._units[0] != now:
            self._units = (now, victims.units_on(self._claims.values(), self._pods, self._resource_of_class,
                                                 now, rules.gang_keys, rules.stuck_after, self._evicted))
        return self._units[1]

    def explain(self, pod: Obj, now: datetime) -> Outcome:
        """The decision for `pod` (gated or not: it is decided as if gated)
        and each node's verdict; for a pod that waits for room, the
        preemption the controller would make, or why none."""
        outcome = self._alone(pod, now)
        decision = outcome.explanation.decision if outcome.explanation is not None else None
        if not isinstance(decision, Waiting):
            return outcome
        info, claims = self.pod_info(pod), outcome.claims
        used, ns = self.used_for(info.priority), info.namespace
        would = self._would(decision.reason, info.priority, "" if info.preempts else NEVER, now,
                            lambda units: preempt.plan(info, info.priority, claims, self.cluster, used, now,
                                                       units, self.strategy, self.budgets(ns),
                                                       self.budget_use(ns)))
        if would is None:
            return outcome
        if would.plan is not None:
            outcome = _deciding(outcome, victims.preempting(would.plan, outcome.claims))
        return dataclasses.replace(outcome, preemption=would)

    def _would(self, reason: WaitReason, priority: int, refused: str, now: datetime,
               plan: Callable[[Mapping[str, Sequence[Unit]]], Preemption | None]) -> WouldPreempt | None:
        """What preemption would do for a set (or gang) of `priority` that
        waits for `reason`: None when it does not look for one (not a wait
        for room, or no rules); `refused` says why it may not preempt."""
        rules = self.preemption
        if rules is None or reason not in WAITS_FOR_ROOM:
            return None
        if rules.off or refused:
            return WouldPreempt(priority, None, rules.off or refused)
        units = self.units_on(now)
        made = plan(units) if units else None
        if made is None:
            return WouldPreempt(priority, None, NONE_FITS.format(priority=priority))
        return WouldPreempt(priority, made, made.message)

    def count_preemption(self, would: WouldPreempt | None) -> None:
        """Count a plan as the controller's evictions would leave things for
        the decisions after it: its victims terminating, the GPUs they free
        held for the preemptor against pods of its priority or lower."""
        if would is None or would.plan is None:
            return
        self._nominations.append((would.priority, would.plan.usage))
        self._evicted.update(v.uid for v in would.plan.victims)
        self._units = None

    def _alone(self, pod: Obj, now: datetime) -> Outcome:
        """The pod's own set decided (no preemption looked for)."""
        try:
            entries = pod_claims(pod)
        except PodClaimsError as e:
            return Outcome(pod, invalid=str(e))
        info = self.pod_info(pod)
        resolved = podplan.resolve(pod, entries, lambda ns, name: self._claims.get((ns, name)),
                                   lambda ns, name: self._templates.get((ns, name)))
        states: list[ClaimState | UnresolvedClaim] = []
        raw: dict[str, Obj] = {}
        for r in resolved:
            if isinstance(r, UnresolvedClaim):
                states.append(r)
                continue
            claim = r.claim if isinstance(r, Found) else r.body
            raw[claim["metadata"]["name"]] = claim
            states.append(ClaimState.from_api(claim))
        ns = info.namespace
        explanation = explain(info, states, self.cluster, self.used_for(info.priority), now, self.strategy,
                              budgets=self.budgets(ns), budget_use=self.budget_use(ns))
        return Outcome(pod, tuple(states), explanation, raw=raw)

    def explain_gang(self, gang: Gang, pods: Sequence[Obj], now: datetime, released: int = 0) -> list[Outcome]:
        """The gang's pods decided together (decide.gang), placed ones
        admitted: each outcome's decision is that pod's part of the gang's
        (its nodes' verdicts are its own set's, alone)."""
        alone = [self._alone(pod, now) for pod in pods]
        members = [GangMember(f"{o.pod['metadata'].get('namespace', '')}/{o.pod['metadata'].get('name', '')}",
                              self.pod_info(o.pod), o.claims) for o in alone if o.explanation is not None]
        # A gang's priority is its members' highest (sync.gangs).
        priority = max((m.pod.priority for m in members), default=0)
        used, ns = self.used_for(priority), gang.namespace
        decision = decide_gang(gang.label, gang.size, members, released, self.cluster, used, now,
                               self.strategy, budgets=self.budgets(ns), budget_use=self.budget_use(ns))
        mine: dict[str, Decision] = dict(decision.sets) if isinstance(decision, GangPlaced) \
            else dict(decision.members)
        would = None
        if isinstance(decision, GangWaiting):
            refused = RELEASED.format(released=released) if released else \
                "" if all(m.pod.preempts for m in members) else GANG_NEVER
            would = self._would(decision.reason, priority, refused, now,
                                lambda units: preempt.plan_gang(gang.label, gang.size, members, priority,
                                                                self.cluster, used, now, units, self.strategy,
                                                                self.budgets(ns), self.budget_use(ns)))
            if would is not None and would.plan is not None:
                mine = {m.key: victims.preempting(would.plan, m.claims) for m in members}
        out = []
        for o, m in zip([o for o in alone if o.explanation is not None], members):
            out.append(dataclasses.replace(_deciding(o, mine[m.key]), preemption=would))
        by_pod = {id(o.pod): o for o in out}
        result = [by_pod.get(id(o.pod), o) for o in alone]
        if isinstance(decision, GangPlaced):
            for o in result:
                self.admit(o)
        return result

    def pod_info(self, pod: Obj) -> PodInfo:
        return PodInfo.from_api(pod, volumes=volume_constraints(
            pod, lambda ns, name: self._pvcs.get((ns, name)), self._pvs.get))

    def admit(self, outcome: Outcome) -> None:
        """Count a placed pod as its writes would leave the cluster: each
        claim Bound on the node and reserved for the pod (created first if
        it is new), the pod released onto the node. Nothing if it waits."""
        placed = outcome.placed
        if placed is None:
            return
        pod = outcome.pod
        meta = pod.get("metadata") or {}
        before, after = [], []
        for action in placed.claims:
            claim = outcome.raw[action.claim]
            old = self._claims.get(_key(claim))
            if old is not None:
                before.append(old)
            new = podplan.bound_claim(claim, pod, action.node, action.resource)
            new["metadata"] = dict(new["metadata"])
            new["metadata"].setdefault("uid", f"simulated-{meta.get('uid', '')}-{action.claim}")
            after.append(new)
        released = copy.deepcopy(dict(pod))
        spec = released.setdefault("spec", {})
        spec["nodeName"] = placed.node
        spec["schedulingGates"] = [g for g in spec.get("schedulingGates") or ()
                                   if g.get("name") != SCHEDULING_GATE]
        released["status"] = {"phase": "Pending"}
        self._pods.append(released)
        self._units = None
        # A gated pod has no ResourceClaim kube-scheduler made for it, so
        # used_capacity moves the count as used_with_dra would.
        _add(self.used, used_capacity(before, (), self._resource_of_class), -1)
        _add(self.used, used_capacity(after, (released,), self._resource_of_class), +1)
        for old in before:
            self._count_held(old, -1)
        for new in after:
            self._count_held(new, +1)
            self._claims[_key(new)] = new

    def _count_held(self, claim: Obj, sign: int) -> None:
        state = ClaimState.from_api(claim)
        if counts_against_budget(state):
            held = self._held.setdefault(_key(claim)[0], {})
            held[state.class_name] = held.get(state.class_name, 0) + sign * state.count


def _deciding(outcome: Outcome, decision: Decision) -> Outcome:
    """`outcome` with `decision` for the one it explains."""
    assert outcome.explanation is not None
    return dataclasses.replace(outcome, explanation=dataclasses.replace(outcome.explanation, decision=decision))


# Why nothing would be evicted, for a person (after "Preemption: ").
NEVER = "none: its preemptionPolicy is Never (it waits for room, evicting nothing)"
GANG_NEVER = "none: a member of its gang has preemptionPolicy Never (the gang waits for room, evicting nothing)"
RELEASED = ("none: {released} of its gang's members are released already (the controller finishes that "
            "decision, evicting nothing)")
NONE_FITS = ("none would make it fit: evicting pods of lower priority (below {priority}) that gpuclaimctl "
             "placed would not free what it needs on one node")


def admitted(pod: Obj, priority_classes: Sequence[Obj]) -> tuple[Obj, str]:
    """`pod` as the API server's Priority admission plugin lets it in:
    spec.priority from the PriorityClass its priorityClassName names (with
    none, from the globalDefault one of lowest value, else 0), and that
    class's preemptionPolicy where the pod says none; and what is wrong, if
    anything: a class not found (the API server refuses such a pod; it is
    taken at priority 0 here). A pod with a spec.priority keeps it."""
    spec = pod.get("spec") or {}
    if "priority" in spec:
        return pod, ""
    by_name = {str((c.get("metadata") or {}).get("name") or ""): c for c in priority_classes}
    name = spec.get("priorityClassName")
    problem = ""
    if name:
        cls = by_name.get(str(name))
        if cls is None:
            problem = f"PriorityClass {name} is not found: taken as priority 0 (the API server refuses the pod)"
    else:
        defaults = [c for c in priority_classes if c.get("globalDefault") is True]
        cls = min(defaults, key=_class_value, default=None)
    out = copy.deepcopy(dict(pod))
    out_spec = out.setdefault("spec", {})
    out_spec["priority"] = _class_value(cls) if cls is not None else 0
    if cls is not None and cls.get("preemptionPolicy") and "preemptionPolicy" not in spec:
        out_spec["preemptionPolicy"] = cls["preemptionPolicy"]
    return out, problem


def _class_value(cls: Obj) -> int:
    value = cls.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _add(used: dict[str, dict[str, int]], delta: Mapping[str, Mapping[str, int]], sign: int) -> None:
    for resource, per_node in delta.items():
        target = used.setdefault(resource, {})
        for node, n in per_node.items():
            target[node] = target.get(node, 0) + sign * n


def simulate(world: WhatIf, pods: Sequence[Obj], now: datetime) -> list[Outcome]:
    """Decide `pods` in turn on `world`, each placed one counted for the next
    (and each preemption, as `count_preemption` counts it). The pods of one
    gang (gpuclaimctl.io/gang) are decided together, as the controller
    decides them (decide.gang), when the first of them comes."""
    out: dict[int, Outcome] = {}
    gangs: dict[str, list[int]] = {}
    for i, pod in enumerate(pods):
        try:
            gang = pod_gang(pod)
        except GangError:
            gang = None
        if gang is not None:
            gangs.setdefault(gang.key, []).append(i)
    done: set[int] = set()
    for i, pod in enumerate(pods):
        if i in done:
            continue
        try:
            gang = pod_gang(pod)
        except GangError:
            gang = None
        if gang is None:
            outcome = world.explain(pod, now)
            world.admit(outcome)
            world.count_preemption(outcome.preemption)
            out[i] = outcome
            continue
        members = gangs[gang.key]
        done.update(members)
        outcomes = world.explain_gang(gang, [pods[j] for j in members], now)
        world.count_preemption(next((o.preemption for o in outcomes if o.preemption is not None), None))
        for j, outcome in zip(members, outcomes):
            out[j] = outcome
    return [out[i] for i in range(len(pods))]
