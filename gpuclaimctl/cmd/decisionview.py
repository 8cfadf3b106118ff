"""How `why` and `simulate` show a decision: one line for it, a row per node.

Text goes through statusview's `table`, so it reads like `gpuclaimctl
status`; JSON is plain dicts of the same facts. Pure: no client, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuclaimctl.cmd.statusview import table
from gpuclaimctl.decide.explain import Explanation, NodeExplanation
from gpuclaimctl.decide.placement import Decision, Placed
from gpuclaimctl.model.snapshot import ClaimState, UnresolvedClaim

# Said wherever a decision computed here is shown.
NOT_SEEN_NOTE = (
    "Computed from a fresh read of the API server, not from the controller's memory: placements the "
    "running leader has decided but not written yet (in flight) are unknown here and can take GPUs "
    "shown free, and so can pods waiting longer than this one (the controller serves the oldest "
    "first). Nodes it skips in memory for a template set after kube-scheduler refused a pod are "
    "unknown too; those recorded on the claims are counted.")


def decision_line(decision: Decision) -> str:
    if isinstance(decision, Placed):
        return f"placed on node {decision.node}: {decision.message}"
    return f"waits, {decision.reason}: {decision.message}"


def gpus(per_resource: Mapping[str, int]) -> str:
    """`nvidia.com/gpu=3`, several joined with commas; `-` for none."""
    return ",".join(f"{r}={n}" for r, n in sorted(per_resource.items())) or "-"


def verdict_text(row: NodeExplanation) -> str:
    return "fits (chosen)" if row.chosen else str(row.verdict)


def node_lines(explanation: Explanation) -> list[str]:
    """One row per node: the verdict, GPUs free and needed, and every
    problem the node has."""
    rows = []
    for r in explanation.nodes:
        why = "; ".join(p.message for p in r.problems)
        if r.holds:
            why = f"holds {', '.join(r.holds)}" + (f"; {why}" if why else "")
        rows.append((r.node, verdict_text(r), gpus(r.free), gpus(r.need), why or "-"))
    if not rows:
        return ["no node offers the set's classes"]
    return table(("NODE", "VERDICT", "FREE", "NEED", "WHY"), rows)


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
             "need": dict(r.need), "holds": list(r.holds),
             "problems": [{"verdict": str(p.verdict), "message": p.message} for p in r.problems]}
            for r in explanation.nodes]


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
