"""Why a set goes where it goes, node by node (`gpuclaimctl why`, `simulate`).

`explain` runs THE decision (`placement.decide`) and, beside it, says for
each node that offers one of the set's classes (or holds one of its claims)
what keeps the set off it: the class selector, not Ready, cordoned, a live
rejection, the pod's nodeSelector, a required node affinity term, a
volume's node affinity, an untolerated taint, too few free GPUs, or the
namespace's budget; and which way it serves each resource (device
plugin, or DRA through which DeviceClass: docs/dra.md). Every check is
placement's own predicate (`ClassInfo.offered_by`/`selects`,
`PodNodeRules.mismatch`, `Term.matches`, `VolumeConstraint.reaches`,
`untolerated_taint`, `check_budgets`) and the need, free GPUs and live
rejections are those of the decision's own working state, so a node said
to fit is one `decide` could pick.

A node lists every problem it has, the first one being its verdict. The
budget is checked for the set as a whole before any node is chosen, so
"over budget" is said only of the nodes that would otherwise fit.

Pure: no client, no clock (`now` is passed in), no globals. It explains one
snapshot: placements another process has in flight are not in it unless
the caller counts them in `used`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gpuclaimctl.decide.budget import BudgetRefusal, check_budgets, new_asks
from gpuclaimctl.decide.placement import Decision, Placed, _Placer, decide
from gpuclaimctl.model.api import OnCordon, Strategy
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo, BudgetUse
from gpuclaimctl.model.nodeaffinity import Mismatch, NodeSelector, untolerated_taint
from gpuclaimctl.model.snapshot import (
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    PodInfo,
    UnresolvedClaim,
    Usage,
)


class Verdict(StrEnum):
    """What keeps a set off a node; in the order a node's problems are listed."""

    FITS = "fits"
    GONE = "gone"
    CLASS_SELECTOR = "class selector"
    NOT_READY = "not Ready"
    CORDONED = "cordoned"
    REJECTED = "rejected"
    NODE_SELECTOR = "nodeSelector"
    AFFINITY = "affinity"
    VOLUME = "volume"
    TAINT = "taint"
    # Not that many GPUs allocatable at all: waiting frees none (Unsatisfiable).
    TOO_SMALL = "too small"
    SHORT = "short"
    OVER_BUDGET = "over budget"


_FROM_MISMATCH = {
    Mismatch.NODE_SELECTOR: Verdict.NODE_SELECTOR,
    Mismatch.NODE_AFFINITY: Verdict.AFFINITY,
    Mismatch.VOLUME: Verdict.VOLUME,
    Mismatch.TAINT: Verdict.TAINT,
}


@dataclass(frozen=True)
class Problem:
    verdict: Verdict
    message: str  # "taint gpu=shared:NoSchedule not tolerated", for a person


@dataclass(frozen=True)
class NodeExplanation:
    node: str
    problems: tuple[Problem, ...]  # none: the set fits here
    # Per resource the set uses: GPUs free on the node (allocatable minus
    # used; negative on an overcommitted node) and GPUs the set needs there.
    free: Mapping[str, int]
    need: Mapping[str, int]
    holds: tuple[str, ...] = ()  # claims of the set bound here
    chosen: bool = False  # where the decision puts the set
    # Per resource the set uses that the node has: which way it serves it,
    # "device plugin" (status.allocatable) or "DRA, DeviceClass <name>"
    # (the devices its ResourceSlices offer: docs/dra.md).
    served: Mapping[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return self.problems[0].verdict if self.problems else Verdict.FITS

    @property
    def summary(self) -> str:
        return self.problems[0].message if self.problems else "fits"


@dataclass(frozen=True)
class Explanation:
    decision: Decision
    nodes: tuple[NodeExplanation, ...]  # chosen first, then those that fit, then by name
    # The limit that refuses the set's new GPUs, if one does (None also when
    # the budgets are unknown: `decision` says so).
    budget: BudgetRefusal | None = None


def explain(
    pod: PodInfo,
    claims: Sequence[ClaimState | UnresolvedClaim],
    cluster: Cluster,
    used: Usage,
    now: datetime,
    strategy: Strategy = Strategy.BINPACK,
    budgets: Sequence[BudgetInfo] | None = (),
    budget_use: BudgetUse = NO_BUDGET_USE,
) -> Explanation:
    """`decide` on these inputs, and each node's verdict. Pure: no client,
    no clock, no globals; the arguments are `decide`'s."""
    decision = decide(pod, claims, cluster, used, now, strategy, budgets, budget_use)
    chosen = decision.node if isinstance(decision, Placed) else ""
    # A claim whose class is unknown cannot be judged on a node; the
    # decision already says why the set waits for it.
    states = [c for c in claims if isinstance(c, ClaimState) and c.class_name in cluster.classes]
    if not states:
        return Explanation(decision, ())
    refusal = None
    if budgets is not None:
        refusal = check_budgets(budgets, budget_use, new_asks(states))
    # The decision's own working state (private to placement, on purpose):
    # need per node, free GPUs and live rejections are computed once, there.
    placer = _Placer(pod, states, cluster, used, now, strategy)
    resources = sorted({cluster.classes[c.class_name].resource_name for c in states})

    names = {c.node_name for c in states if c.bound}
    for class_name in {c.class_name for c in states}:
        names.update(cluster.offer((class_name,)).nodes)
    rows = []
    for name in names:
        holds = tuple(c.name for c in states if c.bound and c.node_name == name)
        node = cluster.nodes.get(name)
        if node is None:
            rows.append(NodeExplanation(name, (Problem(Verdict.GONE, "the node is gone; the claims bound "
                                                       "there move with the set"),), {}, {}, holds))
            continue
        need = placer.need_on(name)
        problems = _problems(pod, states, cluster, node, placer, need, refusal)
        free = {r: placer.free(node, r) for r in resources}
        rows.append(NodeExplanation(name, tuple(problems), free, need, holds, name == chosen,
                                    {r: served_by(node, r) for r in resources if r in node.allocatable}))
    rows.sort(key=lambda r: (not r.chosen, bool(r.problems), r.node))
    return Explanation(decision, tuple(rows), refusal)


def _problems(pod: PodInfo, states: Sequence[ClaimState], cluster: Cluster, node: NodeInfo,
              placer: _Placer, need: Mapping[str, int], refusal: BudgetRefusal | None) -> list[Problem]:
    out: list[Problem] = []
    held = [c for c in states if c.bound and c.node_name == node.name]
    rest = [c for c in states if not (c.bound and c.node_name == node.name)]
    for c in held:
        cls = cluster.classes[c.class_name]
        if not cls.selects(node):
            out.append(Problem(Verdict.CLASS_SELECTOR, f"GPUClass {cls.name} of GPUClaim {c.name}, bound "
                               f"here, no longer selects the node: {_selector_miss(cls, node)}"))
    for cls in _unique_classes(cluster, rest):
        if not cls.offered_by(node):
            if not cls.selects(node):
                why = _selector_miss(cls, node)
            elif cls.resource_name in node.dra:
                why = (f"DRA ({_device_class(node, cls.resource_name)}) offers no device of "
                       f"{cls.resource_name} there")
            else:
                why = f"the node has no {cls.resource_name}"
            out.append(Problem(Verdict.CLASS_SELECTOR, f"does not offer GPUClass {cls.name}: {why}"))
    if not node.ready:
        out.append(Problem(Verdict.NOT_READY, "not Ready"))
    if node.unschedulable:
        stays = any(cluster.classes[c.class_name].on_cordon is OnCordon.STAY for c in held)
        if not stays:
            out.append(Problem(Verdict.CORDONED, "cordoned"))
        elif rest:
            out.append(Problem(Verdict.CORDONED, "cordoned: its claims stay (onCordon Stay), but "
                               f"{', '.join(c.name for c in rest)} cannot be bound on a cordoned node"))
    rejection = placer.rejected.get(node.name)
    if rejection is not None:
        why = f": {rejection.reason}" if rejection.reason else ""
        out.append(Problem(Verdict.REJECTED, f"rejected for the set until {rejection.until.isoformat()}{why}"))
    out += _rule_problems(pod, node)
    for resource, n in sorted(need.items()):
        free = placer.free(node, resource)
        via = f" (served by {served_by(node, resource)})" if resource in node.dra else ""
        if node.allocatable.get(resource, 0) < n:
            out.append(Problem(Verdict.TOO_SMALL, f"too small: the set needs {n} {resource} here, the "
                               f"node has {node.allocatable.get(resource, 0)} in all{via}"))
        elif free < n:
            out.append(Problem(Verdict.SHORT, f"short by {n - free} {resource}: the set needs {n}, "
                               f"{free} free{via}"))
    if not out and refusal is not None:
        out.append(Problem(Verdict.OVER_BUDGET, f"over budget: {refusal.message}"))
    return out


def served_by(node: NodeInfo, resource: str) -> str:
    """Which way the node serves `resource`: "DRA, DeviceClass <name>"
    (docs/dra.md) or "device plugin"."""
    if resource in node.dra:
        return f"DRA, {_device_class(node, resource)}"
    return "device plugin"


def _device_class(node: NodeInfo, resource: str) -> str:
    name = node.dra.get(resource, "")
    return f"DeviceClass {name}" if name else "no DeviceClass kube-scheduler is sure to map"


def _unique_classes(cluster: Cluster, claims: Sequence[ClaimState]) -> list[ClassInfo]:
    return [cluster.classes[n] for n in sorted({c.class_name for c in claims})]


def _selector_miss(cls: ClassInfo, node: NodeInfo) -> str:
    wrong = [(k, v) for k, v in sorted(cls.node_selector.items()) if node.labels.get(k) != v]
    return "; ".join(f"it selects {k}={v}, the node has {_label(node, k)}" for k, v in wrong)


def _label(node: NodeInfo, key: str) -> str:
    return f"{key}={node.labels[key]}" if key in node.labels else f"no {key} label"


def _rule_problems(pod: PodInfo, node: NodeInfo) -> list[Problem]:
    """Every one of the pod's own rules the node breaks. Placement's
    `mismatch` decides whether any is broken; the rest only say which."""
    rules = pod.rules
    first = rules.mismatch(node.name, node.labels, node.blocking_taints)
    if first is None:
        return []
    out: list[Problem] = []
    wrong = [(k, v) for k, v in rules.node_selector if node.labels.get(k) != v]
    if wrong:
        out.append(Problem(Verdict.NODE_SELECTOR, "nodeSelector " + "; ".join(
            f"{k}={v}: the node has {_label(node, k)}" for k, v in wrong)))
    if rules.required is not None and not rules.required.matches(node.name, node.labels):
        out.append(Problem(Verdict.AFFINITY, _affinity_miss(rules.required, node)))
    for volume in rules.volumes:
        if not volume.reaches(node.labels):
            out.append(Problem(Verdict.VOLUME, f"{volume} is reachable only from {volume.reach()}"))
    taint = untolerated_taint(rules.tolerations, node.blocking_taints)
    if taint is not None:
        out.append(Problem(Verdict.TAINT, f"taint {taint} not tolerated"))
    if not out:  # cannot happen while the checks above are mismatch's; never hide a refusal
        out.append(Problem(_FROM_MISMATCH[first], f"the pod's {first} excludes the node"))
    return out


def _affinity_miss(required: NodeSelector, node: NodeInfo) -> str:
    """`affinity term 1 fails: zone In [a] (the node has zone=b)`; every
    term, as they are ORed."""
    parts = []
    for i, term in enumerate(required.terms, 1):
        if not term.usable:
            parts.append(f"term {i} is empty or malformed and matches no node")
            continue
        miss = next((r for r in term.match_expressions if not r.matches_labels(node.labels)), None)
        if miss is not None:
            parts.append(f"term {i} fails: {miss} (the node has {_label(node, miss.key)})")
            continue
        field = next((r for r in term.match_fields if not r.matches_fields(node.name)), None)
        parts.append(f"term {i} fails: {field if field is not None else term}")
    if not parts:
        return "required node affinity has no terms and matches no node"
    if len(parts) == 1:
        return f"affinity {parts[0]}"
    return "no required node affinity term matches: " + "; ".join(parts)
