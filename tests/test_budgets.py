"""GPU budgets per namespace (issue 13): the check inside the decision,
with the real handlers and syncs against the in-memory API (tests/sim), and
the pure check itself. The real-plane stories are in tests/test_e2e_budgets.py."""

from __future__ import annotations

from typing import Any

from gpuclaimctl.decide.budget import check_budgets
from gpuclaimctl.model import api
from gpuclaimctl.model.budgets import BudgetInfo, BudgetUse
from tests.sim.fakeapi import BUDGETS, CLAIMS, CLASSES
from tests.sim.harness import NS
from tests.test_sync_scenarios import Story

Obj = dict[str, Any]


def _budget(limits: dict[str, int], name: str = "team-a") -> BudgetInfo:
    return BudgetInfo.from_api({"metadata": {"name": name, "namespace": NS},
                                "spec": {"limits": [{"className": c, "gpus": n} for c, n in limits.items()]}})


def test_every_limit_that_covers_the_set_must_allow_all_of_it() -> None:
    use = BudgetUse({"a100": 12}, {"a100": 2})
    refusal = check_budgets([_budget({"a100": 16})], use, [("a100", 4)])
    assert refusal is not None
    assert refusal.message == ("GPUBudget team/team-a allows 16 a100 GPUs; 12 are bound, 2 are being "
                               "placed; this set needs 4 more")
    assert check_budgets([_budget({"a100": 18})], use, [("a100", 4)]) is None
    # "*" covers every class; the other budget of the namespace applies too.
    both = [_budget({"a100": 100}), _budget({"*": 20}, name="all")]
    refusal = check_budgets(both, BudgetUse({"a100": 10, "h100": 8}, {}), [("a100", 1), ("h100", 2)])
    assert refusal is not None and refusal.budget.name == "all"
    assert "20 GPUs of all classes" in refusal.message
    # A class no limit names is not limited by a budget of other classes.
    assert check_budgets([_budget({"a100": 0})], use, [("h100", 8)]) is None
    assert check_budgets([], use, [("a100", 400)]) is None


def test_malformed_limits_are_skipped_not_read_as_unlimited_for_others() -> None:
    info = BudgetInfo.from_api({"metadata": {"name": "b", "namespace": NS}, "spec": {"limits": [
        {"className": "a100"}, {"gpus": 3}, "x", {"className": "h100", "gpus": True},
        {"className": "a100", "gpus": 2}]}})
    assert [(lim.class_name, lim.gpus) for lim in info.limits] == [("a100", 2)]


class BudgetStory(Story):
    def __init__(self, nodes: tuple[int, ...] = (8,)) -> None:
        super().__init__(nodes=nodes)
        self._create_class("beta")

    def budget(self, limits: dict[str, int] | None, name: str = "team-a") -> None:
        self.set_budget(name, limits)
        self.see_all()

    def waiting_reason(self, pod: str) -> str:
        reasons = set()
        for c in self.fake.list(CLAIMS).items:
            owner = (c["metadata"].get("ownerReferences") or [{}])[0].get("name")
            if owner == pod:
                for cond in (c.get("status") or {}).get("conditions") or ():
                    if cond["type"] == api.CONDITION_WAITING and cond["status"] == "True":
                        reasons.add((cond["reason"], cond["message"]))
        assert len(reasons) == 1, reasons
        reason, message = reasons.pop()
        return f"{reason}: {message}"

    def place(self, pod: str, entries: list[dict[str, Any]]) -> None:
        self.pod(pod, entries)
        self.see_all()
        self.sync(f"pod:team/{pod}")
        self.see_all()


def test_a_namespace_at_its_limit_waits_with_budget_and_a_message_to_act_on() -> None:
    s = BudgetStory()
    s.budget({"alpha": 4})
    s.place("p1", [{"name": "g", "className": "alpha", "count": 3}])
    s.place("p2", [{"name": "g", "className": "alpha", "count": 2}])
    assert not s.gated("p1") and s.gated("p2")
    assert s.waiting_reason("p2") == ("Budget: GPUBudget team/team-a allows 4 alpha GPUs; 3 are bound; "
                                      "this set needs 2 more")
    # Raising the budget wakes it.
    s.ctl.queue.ready.clear()
    s.budget({"alpha": 5})
    assert "pod:team/p2" in s.ctl.queue.ready
    s.drain()
    assert not s.gated("p2")


def test_a_set_is_placed_whole_or_not_at_all_against_its_budget() -> None:
    s = BudgetStory(nodes=(8, 8))
    s.budget({"alpha": 6})
    s.place("p1", [{"name": "a", "className": "alpha", "count": 4},
                   {"name": "b", "className": "alpha", "count": 4}])
    assert s.gated("p1")
    assert all((c.get("status") or {}).get("phase") != "Bound" for c in s.fake.list(CLAIMS).items)
    assert s.waiting_reason("p1").startswith("Budget: GPUBudget team/team-a allows 6 alpha GPUs; "
                                             "0 are bound; this set needs 8 more")


def test_a_star_limit_counts_all_classes_together() -> None:
    s = BudgetStory()
    s.budget({"*": 5})
    s.place("p1", [{"name": "g", "className": "alpha", "count": 3}])
    s.place("p2", [{"name": "g", "className": "beta", "count": 3}])
    assert not s.gated("p1") and s.gated("p2")
    assert "allows 5 GPUs of all classes" in s.waiting_reason("p2")


def test_lowering_a_budget_below_use_evicts_nothing_and_blocks_the_next() -> None:
    s = BudgetStory()
    s.budget({"alpha": 8})
    s.place("p1", [{"name": "g", "className": "alpha", "count": 4}])
    s.budget({"alpha": 2})
    s.sync("pod:team/p1")  # synced again: stays released, its claim stays bound
    s.drain()
    assert not s.gated("p1") and s.bound_on("n0") == 4
    s.place("p2", [{"name": "g", "className": "alpha", "count": 1}])
    assert s.gated("p2") and "4 are bound" in s.waiting_reason("p2")
    budget = s.fake.get(BUDGETS, NS, "team-a")
    assert budget is not None
    assert budget["status"]["used"] == [{"className": "alpha", "gpus": 4}]
    exceeded = next(c for c in budget["status"]["conditions"] if c["type"] == "Exceeded")
    assert exceeded["status"] == "True"


def test_a_retain_claim_with_no_pod_keeps_counting_until_deleted() -> None:
    s = BudgetStory()
    s.budget({"alpha": 4})
    s.fake.create(CLAIMS, {"metadata": {"name": "kept", "namespace": NS},
                           "spec": {"className": "alpha", "count": 3, "reclaimPolicy": "Retain"}})
    s.place("p1", [{"name": "g", "claim": "kept"}])
    assert not s.gated("p1")
    s.fake.delete("pods", NS, "p1")
    s.drain()
    kept = s.fake.get(CLAIMS, NS, "kept")
    assert kept is not None and kept["status"]["phase"] == "Bound" and not kept["status"].get("reservedFor")
    s.place("p2", [{"name": "g", "className": "alpha", "count": 2}])
    assert s.gated("p2")
    kept["metadata"]["finalizers"] = []
    s.fake.update(CLAIMS, kept)
    s.fake.delete(CLAIMS, NS, "kept")
    s.drain()
    assert not s.gated("p2")


def test_placements_in_flight_count_against_the_budget_of_a_concurrent_decision() -> None:
    """P1's bind is on the wire (not yet seen) while P2 decides: P2 must
    count P1's GPUs as being placed."""
    s = BudgetStory(nodes=(8, 8))
    s.budget({"alpha": 4})
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 3}])
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 3}])
    s.see_all()
    s.at_write("update_claim_status", lambda: s.sync("pod:team/p2"))
    s.sync("pod:team/p1")  # P2 decides while P1's bind is being written
    s.see_all()
    s.drain()
    held = sum(c["spec"]["count"] for c in s.fake.list(CLAIMS).items
               if (c.get("status") or {}).get("phase") == "Bound")
    assert held == 3
    assert not s.gated("p1") and s.gated("p2")


def test_a_placement_in_flight_that_ends_without_landing_wakes_the_pods_it_held_back() -> None:
    """P2 waits on Budget because P1's 3 GPUs are being placed; P1's bind is
    refused (409) after the informer already showed the newer claim, so the
    entry ends at once: that frees the budget, and P2 must be woken without
    waiting for a resync. (Found by the budget stress work; the same held
    for Capacity.)"""
    s = BudgetStory(nodes=(8,))
    s.budget({"alpha": 4})
    s.fake.create(CLAIMS, {"metadata": {"name": "c2", "namespace": NS},
                           "spec": {"className": "alpha", "count": 2}})
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 3}])
    s.pod("p2", [{"name": "g", "claim": "c2"}])
    s.see_all()
    s.ctl.queue.ready.clear()

    def during_p1_bind() -> None:
        s.sync("pod:team/p2")
        claim = s.fake.get(CLAIMS, NS, "p1-g")
        assert claim is not None
        claim["metadata"].setdefault("labels", {})["touched"] = "yes"
        s.fake.update(CLAIMS, claim)  # P1's bind now carries a stale resourceVersion
        s.fake.delete("pods", NS, "p1")
        s.see_all()

    s.at_write("update_claim_status", during_p1_bind)
    s.sync("pod:team/p1")  # fails with Conflict: the worker would retry it
    assert s.gated("p2")
    s.drain()
    assert not s.gated("p2")



def test_refusal_message_agrees_with_one_gpu() -> None:
    """"1 is bound, 1 is being placed", not "1 are"."""
    refusal = check_budgets([_budget({"a100": 2})], BudgetUse({"a100": 1}, {"a100": 1}), [("a100", 1)])
    assert refusal is not None
    assert refusal.message == ("GPUBudget team/team-a allows 2 a100 GPUs; 1 is bound, 1 is being placed; "
                               "this set needs 1 more")


def test_a_limit_naming_no_class_is_told_until_the_class_is_made() -> None:
    """A typo in a limit's className caps nothing (no claim can be of that
    class): the budget says so in ClassesFound and a Warning event, and the
    condition turns True once the class exists."""
    s = BudgetStory()
    s.budget({"alpha": 4, "a100": 2, "*": 10})
    s.drain()
    budget = s.fake.get(BUDGETS, NS, "team-a")
    assert budget is not None
    found = next(c for c in budget["status"]["conditions"] if c["type"] == "ClassesFound")
    assert (found["status"], found["reason"]) == ("False", "UnknownClass")
    assert found["message"].startswith("no GPUClass named a100: its limit caps nothing")
    assert [e.reason for e in s.fake.events] == ["UnknownClass"]
    writes: list[str] = []
    s.fake.before_write = lambda m, _b: writes.append(m)
    s.sync("budget:team/team-a")  # nothing new: neither a write nor a second event
    assert writes == [] and [e.reason for e in s.fake.events] == ["UnknownClass"]
    s.fake.before_write = None
    s._create_class("a100")
    s.see_all()
    s.drain()
    budget = s.fake.get(BUDGETS, NS, "team-a")
    assert budget is not None
    found = next(c for c in budget["status"]["conditions"] if c["type"] == "ClassesFound")
    assert (found["status"], found["reason"]) == ("True", "AllFound")
    exceeded = next(c for c in budget["status"]["conditions"] if c["type"] == "Exceeded")
    assert exceeded["status"] == "False"
    s.fake.delete(CLASSES, "", "a100")  # gone again: told again
    s.see_all()
    s.drain()
    budget = s.fake.get(BUDGETS, NS, "team-a")
    assert budget is not None
    found = next(c for c in budget["status"]["conditions"] if c["type"] == "ClassesFound")
    assert found["status"] == "False"
    assert [e.reason for e in s.fake.events] == ["UnknownClass", "UnknownClass"]


def test_a_bind_the_api_server_answered_is_told_as_bound_before_the_watch_shows_it() -> None:
    """P1's bind was answered (P1 released) but its claim's watch event has
    not come: P2's Budget message says P1's GPUs are bound, not "being
    placed", which the watch's lag would have it say while P1 already runs."""
    s = BudgetStory(nodes=(8,))
    s.budget({"alpha": 4})
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 3}])
    s.pod("p2", [{"name": "g", "className": "alpha", "count": 2}])
    s.see_all()
    s.sync("pod:team/p1")
    assert not s.gated("p1")
    s.sync("pod:team/p2")  # no claim event seen since P1's bind
    assert s.gated("p2")
    assert s.waiting_reason("p2").endswith("allows 4 alpha GPUs; 3 are bound; this set needs 2 more")
