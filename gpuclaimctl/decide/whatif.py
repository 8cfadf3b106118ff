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

What it cannot know, and the commands say so: placements the running
leader has decided but not yet written, and the nodes it skips in memory
for a template set whose pod the scheduler refused (those also written on
the claims are seen). Nor does it order pods: the controller serves the
oldest waiting pod first.

`admit` counts a placed pod as the controller's writes would leave it
(claims Bound and reserved, the pod on its node), so `simulate` places
copies one after another, each seeing the ones before.

Pure: no client, no clock (`now` is passed in), no globals. A `WhatIf` is
one command's working state: not shared between threads.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuclaimctl.decide import podplan
from gpuclaimctl.decide.capacity import used_capacity
from gpuclaimctl.decide.explain import Explanation, explain
from gpuclaimctl.decide.gang import GangMember, GangPlaced, decide_gang
from gpuclaimctl.decide.placement import Placed, Waiting
from gpuclaimctl.decide.podplan import Found
from gpuclaimctl.model.api import SCHEDULING_GATE, Strategy
from gpuclaimctl.model.budgets import BudgetInfo, BudgetUse, counts_against_budget
from gpuclaimctl.model.gangs import Gang, GangError, pod_gang
from gpuclaimctl.model.podclaims import PodClaimsError, pod_claims
from gpuclaimctl.model.snapshot import ClaimState, ClassInfo, Cluster, NodeInfo, PodInfo, UnresolvedClaim
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
class Outcome:
    """One pod's decision: `explanation` (with the decision), or `invalid`,
    the InvalidClaims message when its annotation cannot be used."""

    pod: Obj
    claims: tuple[ClaimState | UnresolvedClaim, ...] = ()
    explanation: Explanation | None = None
    invalid: str = ""
    # claim name -> the object the decision read (or would create)
    raw: Mapping[str, Obj] = field(default_factory=dict)

    @property
    def placed(self) -> Placed | None:
        d = self.explanation.decision if self.explanation is not None else None
        return d if isinstance(d, Placed) else None


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class WhatIf:
    def __init__(self, objects: ClusterObjects, strategy: Strategy = Strategy.BINPACK) -> None:
        self.strategy = strategy
        classes = [ClassInfo.from_api(c) for c in objects.classes]
        self.cluster = Cluster((NodeInfo.from_api(n) for n in objects.nodes), classes)
        self._resource_of_class = {c.name: c.resource_name for c in classes}
        self._claims = {_key(c): c for c in objects.claims}
        self._templates = {_key(t): t for t in objects.templates}
        self._pvcs = {_key(p): p for p in objects.pvcs}
        self._pvs = {_key(p)[1]: p for p in objects.pvs}
        self._budgets: dict[str, list[BudgetInfo]] = {}
        for b in objects.budgets:
            info = BudgetInfo.from_api(b)
            self._budgets.setdefault(info.namespace, []).append(info)
        self.used: dict[str, dict[str, int]] = used_capacity(
            objects.claims, objects.pods, self._resource_of_class)
        # namespace -> class -> GPUs its claims hold (what counts against budgets)
        self._held: dict[str, dict[str, int]] = {}
        for c in objects.claims:
            self._count_held(c, +1)

    def budgets(self, namespace: str) -> list[BudgetInfo]:
        return list(self._budgets.get(namespace, ()))

    def budget_use(self, namespace: str) -> BudgetUse:
        """What the namespace's claims hold, per class; nothing in flight."""
        return BudgetUse(dict(self._held.get(namespace, {})), {})

    def explain(self, pod: Obj, now: datetime) -> Outcome:
        """The decision for `pod` (gated or not: it is decided as if gated)
        and each node's verdict."""
        try:
            entries = pod_claims(pod)
        except PodClaimsError as e:
            return Outcome(pod, invalid=str(e))
        info = PodInfo.from_api(pod, volumes=volume_constraints(
            pod, lambda ns, name: self._pvcs.get((ns, name)), self._pvs.get))
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
        explanation = explain(info, states, self.cluster, self.used, now, self.strategy,
                              budgets=self.budgets(ns), budget_use=self.budget_use(ns))
        return Outcome(pod, tuple(states), explanation, raw=raw)

    def explain_gang(self, gang: Gang, pods: Sequence[Obj], now: datetime, released: int = 0) -> list[Outcome]:
        """The gang's pods decided together (decide.gang), placed ones
        admitted: each outcome's decision is that pod's part of the gang's
        (its nodes' verdicts are its own set's, alone)."""
        alone = [self.explain(pod, now) for pod in pods]
        members = [GangMember(f"{o.pod['metadata'].get('namespace', '')}/{o.pod['metadata'].get('name', '')}",
                              self.pod_info(o.pod), o.claims) for o in alone if o.explanation is not None]
        decision = decide_gang(gang.label, gang.size, members, released, self.cluster, self.used, now,
                               self.strategy,
                               budgets=self.budgets(gang.namespace), budget_use=self.budget_use(gang.namespace))
        mine: dict[str, Placed | Waiting] = dict(decision.sets) if isinstance(decision, GangPlaced) \
            else dict(decision.members)
        out = []
        for o, m in zip([o for o in alone if o.explanation is not None], members):
            assert o.explanation is not None
            out.append(dataclasses.replace(o, explanation=dataclasses.replace(
                o.explanation, decision=mine[m.key])))
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


def _add(used: dict[str, dict[str, int]], delta: Mapping[str, Mapping[str, int]], sign: int) -> None:
    for resource, per_node in delta.items():
        target = used.setdefault(resource, {})
        for node, n in per_node.items():
            target[node] = target.get(node, 0) + sign * n


def simulate(world: WhatIf, pods: Sequence[Obj], now: datetime) -> list[Outcome]:
    """Decide `pods` in turn on `world`, each placed one counted for the next.
    The pods of one gang (gpuclaimctl.io/gang) are decided together, as the
    controller decides them (decide.gang), when the first of them comes."""
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
            out[i] = outcome
            continue
        members = gangs[gang.key]
        done.update(members)
        for j, outcome in zip(members, world.explain_gang(gang, [pods[j] for j in members], now)):
            out[j] = outcome
    return [out[i] for i in range(len(pods))]
