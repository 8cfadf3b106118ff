"""budget: keys — a GPUBudget's status: per limit, the GPUs its namespace's
claims hold plus those being placed (the figures the placement checks), a
one-line summary for `kubectl get gpubudgets`, and a `Exceeded` condition
when a limit was lowered below what is already held (nothing is evicted;
new placements wait). Written only when something changed; nothing reads it
back: placement reads claims and budgets themselves.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from gpuclaimctl.model import keys
from gpuclaimctl.model.budgets import BudgetInfo, BudgetUse
from gpuclaimctl.model.snapshot import format_time
from gpuclaimctl.sync.context import SyncContext

log = logging.getLogger("gpuclaimctl.sync.budgets")
Obj = dict[str, Any]

CONDITION_EXCEEDED = "Exceeded"


def budget_status(budget: BudgetInfo, use: BudgetUse) -> Obj:
    """The figures of the status (without conditions)."""
    used = []
    for limit in budget.limits:
        bound, placing = use.of(limit)
        used.append({"className": limit.class_name, "gpus": bound + placing})
    return {
        "used": used,
        "summary": {
            "limits": ",".join(f"{lim.class_name}={lim.gpus}" for lim in budget.limits),
            "used": ",".join(f"{u['className']}={u['gpus']}" for u in used),
        },
    }


def sync_budget(ctx: SyncContext, key: str) -> None:
    ns, name = keys.split(key)
    obj = ctx.budgets.get(ns, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return
    budget = BudgetInfo.from_api(obj)
    use = ctx.view.budget_use(ns)
    figures = budget_status(budget, use)
    over = [f"{u['className']}: {u['gpus']} held of {lim.gpus}"
            for u, lim in zip(figures["used"], budget.limits) if u["gpus"] > lim.gpus]
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or () if c.get("type") != CONDITION_EXCEEDED]
    old = next((c for c in status.get("conditions") or () if c.get("type") == CONDITION_EXCEEDED), None)
    want_status = "True" if over else "False"
    message = ("more is held than a limit allows (it was lowered); nothing is evicted, new "
               "placements wait: " + "; ".join(over)) if over else "every limit holds"
    condition = {
        "type": CONDITION_EXCEEDED, "status": want_status,
        "reason": "LimitBelowUse" if over else "WithinLimits", "message": message,
        "lastTransitionTime": (old or {}).get("lastTransitionTime") if (old or {}).get("status") ==
        want_status else format_time(ctx.now()),
        "observedGeneration": obj["metadata"].get("generation", 1),
    }
    conditions.append(condition)
    generation = obj["metadata"].get("generation", 1)
    if (status.get("used"), status.get("summary"), status.get("observedGeneration"), old) == \
            (figures["used"], figures["summary"], generation, condition):
        return
    updated = copy.deepcopy(obj)
    updated["status"] = {**status, **figures, "observedGeneration": generation,
                         "conditions": conditions}
    ctx.writer.update_budget_status(updated)
    log.debug("budget status written", extra={"budget": key})
