"""Which victims preemption takes (decide.preempt), as tables: the fewest
pods, then the lowest priorities, then the youngest; gangs whole; Retain
claims free nothing; budgets across namespaces; nothing evicted unless the
set then fits (DESIGN.md §4d, I6)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuclaimctl.decide.gang import GangMember
from gpuclaimctl.decide.placement import Placed, decide
from gpuclaimctl.decide.preempt import Preemption, Unit, Victim, plan, plan_gang
from gpuclaimctl.model.budgets import BudgetInfo, BudgetLimit, BudgetUse
from gpuclaimctl.model.snapshot import Cluster, UnresolvedClaim
from gpuclaimctl.model.api import WaitReason
from tests.test_placement import GPU, NOW, bound, claim, gpu_class, node, pod


def victim(name: str, on: str, gpus: int, priority: int = 0, age: int = 0, *, ns: str = "ns",
           retain: bool = False, terminating: bool = False) -> Victim:
    """A pod of `priority`, created `age` minutes before NOW, holding `gpus`
    on node `on` (a Retain claim frees nothing)."""
    frees = {} if retain else {GPU: gpus}
    budget = {} if retain else {"a100": gpus}
    return Victim(ns, name, f"uid-{name}", on, priority, NOW - timedelta(minutes=age), frees, budget,
                  terminating)


def units(*vs: Victim, gangs: dict[str, list[Victim]] | None = None) -> dict[str, list[Unit]]:
    out: dict[str, list[Unit]] = {}
    for v in vs:
        out.setdefault(v.node, []).append(Unit((v,)))
    for name, members in (gangs or {}).items():
        u = Unit(tuple(members), name)
        for n in sorted({m.node for m in members}):
            out.setdefault(n, []).append(u)
    return out


def used_by(*vs: Victim, extra: dict[str, int] | None = None) -> dict[str, dict[str, int]]:
    per: dict[str, int] = dict(extra or {})
    for v in vs:
        per[v.node] = per.get(v.node, 0) + (v.frees.get(GPU, 0) or 0)
    return {GPU: per}


def run(need: int, nodes: dict[str, int], vs: list[Victim], *, priority: int = 1000,
        gangs: dict[str, list[Victim]] | None = None, retained: dict[str, int] | None = None,
        budgets: list[BudgetInfo] | None = None, budget_use: BudgetUse | None = None,
        skip: tuple[str, ...] = ()) -> Preemption | None:
    members = [m for ms in (gangs or {}).values() for m in ms]
    used = used_by(*vs, *members, extra=retained)
    cluster = Cluster([node(n, g) for n, g in nodes.items()], [gpu_class()])
    claims = [claim("urgent-g", need)]
    got = plan(pod(name="urgent"), priority, claims, cluster, used, NOW, units(*vs, gangs=gangs),
               budgets=budgets or [], budget_use=budget_use or BudgetUse({}, {}), skip_nodes=skip)
    if got is not None:
        # I6: the decision itself shows the set fits once the victims go.
        freed = {GPU: dict(used[GPU])}
        for v in got.victims + got.waiting_for:
            freed[GPU][v.node] -= v.frees.get(GPU, 0)
        after = decide(pod(name="urgent"), claims, cluster, freed, NOW)
        assert isinstance(after, Placed) and after.node == got.node
    return got


def names(p: Preemption | None) -> list[str]:
    assert p is not None
    return sorted(v.name for v in p.victims)


def test_one_node_of_notebooks_gives_exactly_what_the_set_needs() -> None:
    full = [victim(f"nb{n}{i}", f"n{n}", 2, age=i) for n in range(2) for i in range(4)]
    p = run(8, {"n0": 8, "n1": 8}, full)
    assert p is not None and p.node == "n0" and names(p) == ["nb00", "nb01", "nb02", "nb03"]
    assert "preempting 4 pods of lower priority on node n0" in p.message
    assert p.usage == {GPU: {"n0": 8}}


def test_fewest_pods_first() -> None:
    """Two GPUs short: one pod of 2 on n1 beats two pods of 1 on n0."""
    vs = [victim("a", "n0", 1), victim("b", "n0", 1), victim("c", "n0", 6, priority=2000),
          victim("d", "n1", 2), victim("e", "n1", 6)]
    assert names(run(2, {"n0": 8, "n1": 8}, vs)) == ["d"]


def test_among_as_few_pods_the_lowest_priorities() -> None:
    vs = [victim("hi", "n0", 4, priority=500), victim("x", "n0", 4, priority=0),
          victim("lo", "n1", 4, priority=10), victim("y", "n1", 4, priority=10)]
    p = run(4, {"n0": 8, "n1": 8}, vs)
    assert names(p) == ["x"]


def test_among_equal_priorities_the_youngest() -> None:
    vs = [victim("old", "n0", 4, age=60), victim("mid", "n0", 4, age=30),
          victim("young", "n1", 4, age=1), victim("older", "n1", 4, age=90)]
    assert names(run(4, {"n0": 8, "n1": 8}, vs)) == ["young"]


def test_higher_or_equal_priority_pods_are_never_victims() -> None:
    vs = [victim("peer", "n0", 8, priority=1000), victim("boss", "n1", 8, priority=2000)]
    assert run(8, {"n0": 8, "n1": 8}, vs) is None


def test_nothing_is_evicted_when_even_all_victims_gone_would_not_make_room() -> None:
    """Six of eight GPUs are held by a Retain claim of a lower pod and by a
    higher one: evicting the rest cannot free eight."""
    vs = [victim("keep", "n0", 4, retain=True), victim("boss", "n0", 2, priority=5000),
          victim("nb", "n0", 2)]
    assert run(8, {"n0": 8}, vs, retained={"n0": 4}) is None


def test_a_retain_claim_frees_nothing_so_another_node_is_chosen() -> None:
    vs = [victim("keeper", "n0", 8, retain=True), victim("a", "n1", 4), victim("b", "n1", 4)]
    p = run(8, {"n0": 8, "n1": 8}, vs, retained={"n0": 8})
    assert p is not None and p.node == "n1" and names(p) == ["a", "b"]


def test_a_gang_victim_goes_whole_or_not_at_all() -> None:
    """n0: one member of a four-pod gang (the others elsewhere) and a pod
    of 4; n1: two single pods of 4. Taking the gang costs four pods; n1
    costs two."""
    gang = [victim(f"g{i}", f"n{i + 2}", 8) for i in range(3)] + [victim("g3", "n0", 4)]
    vs = [victim("solo", "n0", 4, priority=5000), victim("a", "n1", 4), victim("b", "n1", 4)]
    p = run(8, {"n0": 8, "n1": 8, "n2": 8, "n3": 8, "n4": 8}, vs, gangs={"ns/train": gang})
    assert p is not None and p.node == "n1" and names(p) == ["a", "b"]


def test_a_gang_taken_takes_every_member_wherever_it_runs() -> None:
    gang = [victim("g0", "n0", 8), victim("g1", "n1", 8)]
    p = run(8, {"n0": 8, "n1": 8}, [], gangs={"ns/train": gang})
    assert p is not None and names(p) == ["g0", "g1"]


def test_a_gang_with_a_member_of_higher_priority_is_no_victim() -> None:
    gang = [victim("g0", "n0", 8), victim("g1", "n1", 8, priority=5000)]
    assert run(8, {"n0": 8, "n1": 8}, [], gangs={"ns/train": gang}) is None


def test_terminating_pods_free_their_gpus_without_being_evicted() -> None:
    vs = [victim("going", "n0", 4, terminating=True), victim("a", "n0", 4), victim("b", "n1", 8)]
    p = run(4, {"n0": 8, "n1": 8}, vs)
    assert p is not None and p.node == "n0" and p.victims == () and [v.name for v in p.waiting_for] == ["going"]
    assert "waiting for 1 terminating pod" in p.message


def test_a_node_given_up_is_skipped() -> None:
    vs = [victim("a", "n0", 8), victim("b", "n1", 8, age=5)]
    assert run(8, {"n0": 8, "n1": 8}, vs).node == "n0"  # type: ignore[union-attr]
    assert run(8, {"n0": 8, "n1": 8}, vs, skip=("n0",)).node == "n1"  # type: ignore[union-attr]


def test_victims_in_another_namespace_free_the_node_but_not_the_budget() -> None:
    """The preemptor's namespace holds 8 of its 8 budget GPUs: only its own
    pods give budget back, so its own pod is taken though younger pods of
    another namespace are on the other node."""
    budget = [BudgetInfo("ns", "team", (BudgetLimit("a100", 8),))]
    vs = [victim("mine", "n0", 8, ns="ns", age=100), victim("theirs", "n1", 8, ns="other", age=1)]
    p = run(8, {"n0": 8, "n1": 8}, vs, budgets=budget, budget_use=BudgetUse({"a100": 8}, {}))
    assert p is not None and names(p) == ["mine"]
    only_theirs = run(8, {"n1": 8}, [vs[1]], budgets=budget, budget_use=BudgetUse({"a100": 8}, {}))
    assert only_theirs is None


def test_no_preemption_for_a_set_with_claims_bound_somewhere_or_unresolved() -> None:
    cluster = Cluster([node("n0", 8)], [gpu_class()])
    u = units(victim("a", "n0", 8))
    used = {GPU: {"n0": 8}}
    assert plan(pod(), 1000, [bound("x", "n0", 2)], cluster, used, NOW, u) is None
    missing = UnresolvedClaim("x", WaitReason.CLAIM_MISSING, "missing")
    assert plan(pod(), 1000, [missing], cluster, used, NOW, u) is None


def test_the_pods_rules_are_kept_a_node_it_cannot_use_is_no_target() -> None:
    cluster = Cluster([node("n0", 8, labels={"pool": "a"}), node("n1", 8, labels={"pool": "b"})], [gpu_class()])
    vs = [victim("a", "n0", 8, age=1), victim("b", "n1", 8, age=50)]
    p = plan(pod({"nodeSelector": {"pool": "b"}}), 1000, [claim("c", 8)], cluster, used_by(*vs), NOW, units(*vs))
    assert p is not None and p.node == "n1"


def test_a_gang_preempts_whole_lower_gangs_never_parts() -> None:
    """Four nodes, each full with one member of a gang of two (two gangs);
    a gang of 4 x 8 needs all four nodes: both gangs go whole."""
    g1 = [victim("a0", "n0", 8), victim("a1", "n1", 8)]
    g2 = [victim("b0", "n2", 8), victim("b1", "n3", 8)]
    cluster = Cluster([node(f"n{i}", 8) for i in range(4)], [gpu_class()])
    members = [GangMember(f"ns/t{i}", pod(name=f"t{i}", uid=f"t{i}", created=NOW + timedelta(seconds=i)),
                          [claim(f"t{i}-g", 8)]) for i in range(4)]
    p = plan_gang("t", 4, members, 1000, cluster, used_by(*g1, *g2), NOW, units(gangs={"ns/a": g1, "ns/b": g2}))
    assert p is not None and sorted(v.name for v in p.victims) == ["a0", "a1", "b0", "b1"]
    assert len(p.placed) == 4


def test_a_gang_takes_one_lower_gang_whole_and_leaves_the_other() -> None:
    g1 = [victim("a0", "n0", 8), victim("a1", "n1", 8)]
    g2 = [victim("b0", "n2", 8, age=10), victim("b1", "n3", 8, age=10)]
    cluster = Cluster([node(f"n{i}", 8) for i in range(4)], [gpu_class()])
    members = [GangMember(f"ns/t{i}", pod(name=f"t{i}", uid=f"t{i}"), [claim(f"t{i}-g", 8)]) for i in range(2)]
    p = plan_gang("t", 2, members, 1000, cluster, used_by(*g1, *g2), NOW, units(gangs={"ns/a": g1, "ns/b": g2}))
    assert p is not None and sorted(v.name for v in p.victims) in (["a0", "a1"], ["b0", "b1"])
    # Never one member of each.
    assert len({v.name[0] for v in p.victims}) == 1


@pytest.mark.parametrize("seed", range(30))
def test_random_nodes_the_plan_is_minimal_and_fits(seed: int) -> None:
    """Against brute force over every subset on the chosen node: no plan
    with fewer pods exists anywhere, and the plan fits (run checks)."""
    import itertools
    import random
    rnd = random.Random(seed)
    nodes = {f"n{i}": 8 for i in range(3)}
    vs: list[Victim] = []
    for n in nodes:
        left = 8
        i = 0
        while left > 0:
            g = rnd.randint(1, min(4, left))
            vs.append(victim(f"{n}p{i}", n, g, priority=rnd.choice([0, 10, 2000]), age=rnd.randint(0, 100)))
            left -= g
            i += 1
    need = rnd.randint(1, 8)
    p = run(need, nodes, vs)
    best: int | None = None
    for n in nodes:
        lower = [v for v in vs if v.node == n and v.priority < 1000]
        for k in range(len(lower) + 1):
            if any(sum(v.frees[GPU] for v in combo) >= need for combo in itertools.combinations(lower, k)):
                best = k if best is None else min(best, k)
                break
    if best is None:
        assert p is None
    else:
        assert p is not None and len(p.victims) == best


def test_claims_of_the_set_must_exist() -> None:
    missing: Any = UnresolvedClaim("x", WaitReason.CLAIM_MISSING, "m")
    assert plan(pod(), 1, [missing], Cluster([], [gpu_class()]), {}, NOW, {}) is None
