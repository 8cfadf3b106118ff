"""How `why` and `simulate` show a decision: one line for it, a row per node
(with which way it serves each resource: device plugin, or DRA through a
DeviceClass); the preemption the controller would make for it, a row per
victim; and the devices DRA offers that are not counted, a row per node and
resource (statusview.dra_rows, as `status` shows them).

Text goes through statusview's `table`, so it reads like `gpuclaimctl
status`; JSON is plain dicts of the same facts. Pure: no client, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from gpuclaimctl.cmd.statusview import DraRow, dra_rows, table
from gpuclaimctl.decide.dra import NodeDra
from gpuclaimctl.decide.explain import Explanation, NodeExplanation
from gpuclaimctl.decide.placement import Decision, Placed
from gpuclaimctl.decide.preempt import Preemption, Victim
from gpuclaimctl.decide.victims import GangKeys
from gpuclaimctl.decide.whatif import PreemptionRules, WouldPreempt
from gpuclaimctl.model.snapshot import ClaimState, UnresolvedClaim
from gpuclaimctl.state.indexes import pods_by_gang
from gpuclaimctl.sync.preemption import STUCK_AFTER

# Said wherever a decision computed here is shown.
NOT_SEEN_NOTE = (
    "Computed from a fresh read of the API server, not from the controller's memory: placements the "
    "running leader has decided but not written yet (in flight) are unknown here and can take GPUs "
    "shown free, and so can pods waiting longer than this one (the controller serves the oldest "
    "first). Nodes it skips in memory for a template set after kube-scheduler refused a pod are "
    "unknown too; those recorded on the claims are counted.")


# The controller's preemption rules, as `why` and `simulate` follow them.
PREEMPTION_OFF = "none: the controller's preemption is off (--no-preemption)"


def preemption_rules(enabled: bool = True) -> PreemptionRules:
    """The controller's own: its PODS_BY_GANG keys and how long a victim
    may terminate (sync.preemption.STUCK_AFTER); `enabled`, its --preemption."""
    # pods_by_gang reads the pod only (its dict type is the indexer's).
    return PreemptionRules(cast(GangKeys, pods_by_gang), STUCK_AFTER, "" if enabled else PREEMPTION_OFF)


PREEMPTION = preemption_rules()

# Said wherever a preemption computed here is shown.
PREEMPTION_NOTE = (
    "Nothing is evicted here. What the controller holds in memory is not seen: GPUs being freed for pods "
    "preempting now (taken by them from pods of their priority or lower), nodes where an eviction was "
    "refused lately (skipped for a minute), pods it has just evicted.")


def decision_line(decision: Decision) -> str:
    if isinstance(decision, Placed):
        return f"placed on node {decision.node}: {decision.message}"
    return f"waits, {decision.reason}: {decision.message}"


def gpus(per_resource: Mapping[str, int]) -> str:
    """`nvidia.com/gpu=3`, several joined with commas; `-` for none."""
    return ",".join(f"{r}={n}" for r, n in sorted(per_resource.items())) or "-"


def verdict_text(row: NodeExplanation) -> str:
    return "fits (chosen)" if row.chosen else str(row.verdict)


def served_text(row: NodeExplanation) -> str:
    """Which way the node serves the set's resources (explain.served_by):
    `device plugin`, or `DRA, DeviceClass gpu.example.com`; per resource,
    `RESOURCE: way` joined by `; `, where the set uses several; `-` for none."""
    ways = sorted(row.served.items())
    if len(ways) == 1:
        return ways[0][1]
    return "; ".join(f"{r}: {way}" for r, way in ways) or "-"


def node_lines(explanation: Explanation) -> list[str]:
    """One row per node: the verdict, GPUs free and needed, which way it
    serves them, and every problem the node has."""
    rows = []
    for r in explanation.nodes:
        why = "; ".join(p.message for p in r.problems)
        if r.holds:
            why = f"holds {', '.join(r.holds)}" + (f"; {why}" if why else "")
        rows.append((r.node, verdict_text(r), gpus(r.free), gpus(r.need), served_text(r), why or "-"))
    if not rows:
        return ["no node offers the set's classes"]
    return table(("NODE", "VERDICT", "FREE", "NEED", "SERVED BY", "WHY"), rows)


def not_counted(offers: Mapping[str, NodeDra], resources: Collection[str]) -> list[DraRow]:
    """The rows of `status`'s DRA section (statusview.dra_rows) for
    `resources` that say why devices were not counted: a pool refused, a
    device tainted, a DeviceClass selector outside the supported CEL subset."""
    return [r for r in dra_rows(offers) if r.resource in resources and r.not_counted != "-"]


DRA_TITLE = "Devices DRA offers that are not counted (DEVICES: those counted; docs/dra.md):"


def dra_lines(rows: Sequence[DraRow]) -> list[str]:
    """The `not_counted` rows under their title; nothing when there are none."""
    if not rows:
        return []
    return [DRA_TITLE, *table(("NODE", "RESOURCE", "DEVICECLASS", "DEVICES", "NOT COUNTED"),
                              [(r.node, r.resource, r.device_class, r.devices, r.not_counted) for r in rows])]


def claim_rows(states: Sequence[ClaimState | UnresolvedClaim], exists: Mapping[str, bool],
               notes: Mapping[str, str] | None = None) -> list[tuple[object, ...]]:
    """(NAME, CLASS, COUNT, PHASE, NODE, NOTE) for the set's claims; `notes`
    say more of a claim not created yet (why says which were refused)."""
    rows: list[tuple[object, ...]] = []
    for s in states:
        if isinstance(s, UnresolvedClaim):
            rows.append((s.name, "-", "-", "-", "-", f"{s.reason}: {s.message}"))
            continue
        note = "" if exists.get(s.name, True) else \
            (notes or {}).get(s.name, "not created yet: the controller creates it")
        rows.append((s.name, s.class_name, s.count, s.phase, s.node_name or "-", note or "-"))
    return rows


CLAIM_HEADERS = ("GPUCLAIM", "CLASS", "COUNT", "PHASE", "NODE", "NOTE")


def priority_text(priority: int, policy: str | None, gang: int | None = None) -> str:
    """`priority 1000`, with `preemptionPolicy Never` when the pod never
    preempts, and the gang's priority when it preempts at another."""
    text = f"priority {priority}"
    if policy == "Never":
        text += ", preemptionPolicy Never (it never preempts)"
    if gang is not None and gang != priority:
        text += f"; its gang's is {gang} (its members' highest)"
    return text


VICTIM_HEADERS = ("VICTIM", "PRIORITY", "NODE", "FREES", "ACTION")


def victim_rows(plan: Preemption) -> list[tuple[object, ...]]:
    """One row per pod the plan evicts, then per terminating one it waits for."""
    return [(v.key, v.priority, v.node, gpus(v.frees), action)
            for vs, action in ((plan.victims, "evict"), (plan.waiting_for, "terminating: waited for"))
            for v in vs]


def preemption_lines(would: WouldPreempt) -> list[str]:
    """The plan the controller would make, a row per victim; or why none."""
    plan = would.plan
    if plan is None:
        return [f"Preemption (at priority {would.priority}): {would.note}."]
    return [f"Preemption the controller would make now (at priority {would.priority}), on node {plan.node}:",
            *table(VICTIM_HEADERS, victim_rows(plan))]


def victims_text(plan: Preemption) -> str:
    """`team/a (priority 0), team/b (priority 10)`, then the terminating
    ones it waits for."""
    parts = [", ".join(f"{v.key} (priority {v.priority})" for v in plan.victims)]
    if plan.waiting_for:
        parts.append("waits for terminating " + ", ".join(v.key for v in plan.waiting_for))
    return "; ".join(p for p in parts if p)


# --- JSON -------------------------------------------------------------------------------


def decision_json(decision: Decision) -> dict[str, Any]:
    if isinstance(decision, Placed):
        return {"result": "placed", "node": decision.node, "message": decision.message,
                "claims": [{"name": a.claim, "action": str(a.action), "node": a.node,
                            "resource": a.resource, "count": a.count,
                            **({"from": a.from_node} if a.from_node else {})} for a in decision.claims]}
    return {"result": "waiting", "reason": str(decision.reason), "message": decision.message,
            "claims": [{"name": n, "reason": str(w.reason), "message": w.message}
                       for n, w in decision.claims.items()]}


def nodes_json(explanation: Explanation) -> list[dict[str, Any]]:
    return [{"node": r.node, "verdict": str(r.verdict), "chosen": r.chosen, "free": dict(r.free),
             "need": dict(r.need), "holds": list(r.holds), "served": dict(r.served),
             "problems": [{"verdict": str(p.verdict), "message": p.message} for p in r.problems]}
            for r in explanation.nodes]


def dra_json(rows: Sequence[DraRow]) -> list[dict[str, Any]]:
    return [{"node": r.node, "resource": r.resource, "deviceClass": r.device_class, "devices": r.devices,
             "notCounted": r.not_counted} for r in rows]


def claims_json(states: Sequence[ClaimState | UnresolvedClaim],
                exists: Mapping[str, bool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in states:
        if isinstance(s, UnresolvedClaim):
            out.append({"name": s.name, "reason": str(s.reason), "message": s.message})
        else:
            out.append({"name": s.name, "className": s.class_name, "count": s.count, "phase": str(s.phase),
                        "node": s.node_name or None, "exists": exists.get(s.name, True)})
    return out


def preemption_json(would: WouldPreempt) -> dict[str, Any]:
    plan = would.plan
    return {"priority": would.priority, "node": plan.node if plan is not None else None,
            "victims": [_victim_json(v) for v in plan.victims] if plan is not None else [],
            "waitingFor": [_victim_json(v) for v in plan.waiting_for] if plan is not None else [],
            "message": would.note}


def _victim_json(v: Victim) -> dict[str, Any]:
    return {"pod": v.key, "priority": v.priority, "node": v.node, "frees": dict(v.frees)}
