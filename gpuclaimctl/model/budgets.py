"""GPUBudget objects as placement reads them (issue 13).

A GPUBudget caps the GPUs the claims of its namespace may hold, per GPUClass
or, with className "*", for all classes together. Every GPUBudget of a
namespace applies (as ResourceQuota's do); a namespace without one is
unlimited. What counts against a limit is what `counts_against_budget` says:
the GPUs a claim holds on a node, plus this controller's placements in
flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuclaimctl.model.snapshot import ClaimState

ALL_CLASSES = "*"


@dataclass(frozen=True)
class BudgetLimit:
    class_name: str  # a GPUClass name, or ALL_CLASSES
    gpus: int

    def covers(self, class_name: str) -> bool:
        return self.class_name == ALL_CLASSES or self.class_name == class_name

    def describe(self) -> str:
        return "GPUs of all classes" if self.class_name == ALL_CLASSES else f"{self.class_name} GPUs"


@dataclass(frozen=True)
class BudgetInfo:
    namespace: str
    name: str
    limits: tuple[BudgetLimit, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> BudgetInfo:
        """The CRD's schema validates limits; anything malformed that slips
        through (an old object, a schema edited by hand) is skipped, never
        read as "unlimited" for a class it did not name."""
        meta = obj.get("metadata") or {}
        limits = []
        for item in (obj.get("spec") or {}).get("limits") or ():
            if not isinstance(item, Mapping):
                continue
            name, gpus = item.get("className"), item.get("gpus")
            if isinstance(name, str) and name and isinstance(gpus, int) and not isinstance(gpus, bool):
                limits.append(BudgetLimit(name, max(gpus, 0)))
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), tuple(limits))


def counts_against_budget(state: ClaimState) -> bool:
    """A claim that holds GPUs on a node: Bound (a Retain claim with no pod
    too), or Lost while a pod still reserves it (as capacity counts it)."""
    return state.holds_gpus


@dataclass(frozen=True)
class BudgetUse:
    """GPUs of one namespace against budgets, per class: bound on nodes
    (seen held, or a bind of this controller the API server answered), and
    placed by this controller with no answer yet."""

    bound: Mapping[str, int]
    placing: Mapping[str, int]

    def of(self, limit: BudgetLimit) -> tuple[int, int]:
        return (sum(n for c, n in self.bound.items() if limit.covers(c)),
                sum(n for c, n in self.placing.items() if limit.covers(c)))


NO_BUDGET_USE = BudgetUse({}, {})
