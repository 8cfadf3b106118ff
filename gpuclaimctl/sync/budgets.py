"""budget: keys — a GPUBudget's status: per limit, the GPUs its namespace's
claims hold plus those being placed (the figures the placement checks), a
one-line summary for `kubectl get gpubudgets`, an `Exceeded` condition
when a limit was lowered below what is already held (nothing is evicted;
new placements wait), and a `ClassesFound` condition that is False while a
limit names a GPUClass that does not exist (a typo caps nothing: no claim
can be of that class). Written only when something changed; nothing reads
it back: placement reads claims and budgets themselves. A budget's
`ClassesFound` turning False is also told by a Warning event.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from gpuclaimctl.model import api, keys
from gpuclaimctl.model.budgets import ALL_CLASSES, BudgetInfo, BudgetUse
from gpuclaimctl.model.snapshot import format_time
from gpuclaimctl.sync.context import SyncContext

log = logging.getLogger("gpuclaimctl.sync.budgets")
Obj = dict[str, Any]

CONDITION_EXCEEDED = "Exceeded"
CONDITION_CLASSES_FOUND = "ClassesFound"


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
    old_conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    generation = obj["metadata"].get("generation", 1)
    now = format_time(ctx.now())

    def condition(type_: str, true: bool, reason: str, message: str) -> Obj:
        old = old_conditions.get(type_) or {}
        want = "True" if true else "False"
        return {"type": type_, "status": want, "reason": reason, "message": message,
                "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == want else now,
                "observedGeneration": generation}

    exceeded = condition(
        CONDITION_EXCEEDED, bool(over), "LimitBelowUse" if over else "WithinLimits",
        ("more is held than a limit allows (it was lowered); nothing is evicted, new "
         "placements wait: " + "; ".join(over)) if over else "every limit holds")
    unknown = unknown_classes(budget, lambda c: ctx.classes.get(c) is not None)
    found = condition(
        CONDITION_CLASSES_FOUND, not unknown, "UnknownClass" if unknown else "AllFound",
        unknown_classes_message(unknown) if unknown else "every limit names an existing GPUClass")
    ours = (exceeded, found)
    conditions = [c for c in status.get("conditions") or ()
                  if c.get("type") not in (CONDITION_EXCEEDED, CONDITION_CLASSES_FOUND)] + list(ours)
    if (status.get("used"), status.get("summary"), status.get("observedGeneration")) == \
            (figures["used"], figures["summary"], generation) and \
            all(old_conditions.get(c["type"]) == c for c in ours):
        return
    updated = copy.deepcopy(obj)
    updated["status"] = {**status, **figures, "observedGeneration": generation,
                         "conditions": conditions}
    ctx.writer.update_budget_status(updated)
    log.debug("budget status written", extra={"budget": key})
    if unknown and (old_conditions.get(CONDITION_CLASSES_FOUND) or {}).get("status") != "False":
        ctx.writer.event(_budget_ref(obj), "Warning", "UnknownClass", unknown_classes_message(unknown))


def unknown_classes(budget: BudgetInfo, exists: Callable[[str], bool]) -> list[str]:
    """The GPUClasses the budget's limits name that do not exist, in its order."""
    out: list[str] = []
    for limit in budget.limits:
        if limit.class_name != ALL_CLASSES and limit.class_name not in out and not exists(limit.class_name):
            out.append(limit.class_name)
    return out


def unknown_classes_message(unknown: list[str]) -> str:
    names = ", ".join(unknown)
    return (f"no GPUClass named {names}: {'its limit caps' if len(unknown) == 1 else 'their limits cap'} "
            "nothing, as no claim can be of a class that does not exist (a typo? `kubectl get "
            "gpuclasses` lists them); the limit applies once the class is made")


def _budget_ref(budget: Obj) -> Obj:
    return {"apiVersion": api.API_VERSION, "kind": api.BUDGET_KIND, "metadata": budget["metadata"]}
