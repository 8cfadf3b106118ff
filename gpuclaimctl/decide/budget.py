"""The budget check of a placement (issue 13): pure, inside `decide`.

A set is checked as a whole, before a node is chosen, against every
GPUBudget of its namespace: the claims of the set that do not count yet
(not held, not in flight) are added as if bound, and every limit that
covers their classes must still hold. Claims already counted are never
checked again, so lowering a budget stops new placements and evicts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuclaimctl.model.budgets import BudgetInfo, BudgetLimit, BudgetUse, counts_against_budget
from gpuclaimctl.model.snapshot import ClaimState


@dataclass(frozen=True)
class BudgetRefusal:
    budget: BudgetInfo
    limit: BudgetLimit
    bound: int
    placing: int
    needs: int

    @property
    def message(self) -> str:
        placing = f", {self.placing} {_be(self.placing)} being placed" if self.placing else ""
        return (f"GPUBudget {self.budget.key} allows {self.limit.gpus} {self.limit.describe()}; "
                f"{self.bound} {_be(self.bound)} bound{placing}; this set needs {self.needs} more")


def _be(count: int) -> str:
    return "is" if count == 1 else "are"


def new_asks(states: Iterable[ClaimState]) -> list[tuple[str, int]]:
    """(class, GPUs) of the claims that would start counting if placed."""
    return [(s.class_name, s.count) for s in states if not counts_against_budget(s)]


def check_budgets(budgets: Sequence[BudgetInfo], use: BudgetUse,
                  asks: Sequence[tuple[str, int]]) -> BudgetRefusal | None:
    """The first limit (budgets by name, limits in order) the asks would
    take past its GPUs, or None if every limit allows them all."""
    if not asks:
        return None
    for budget in sorted(budgets, key=lambda b: b.name):
        for limit in budget.limits:
            needs = sum(n for c, n in asks if limit.covers(c))
            if not needs:
                continue
            bound, placing = use.of(limit)
            if bound + placing + needs > limit.gpus:
                return BudgetRefusal(budget, limit, bound, placing, needs)
    return None
