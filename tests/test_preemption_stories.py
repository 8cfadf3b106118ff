"""Preemption's stories (issue 46, DESIGN.md §4d), one scripted interleaving
each, with the real handlers and syncs against the in-memory API (tests/sim):
a victim that never terminates, a PodDisruptionBudget refusal, the
preemptor deleted mid-way, a change of leader while victims terminate."""

from __future__ import annotations

import json
from typing import Any

from gpuclaimctl.controller import key_order
from gpuclaimctl.model import api
from tests.sim.fakeapi import CLAIMS, NODES, PODS
from tests.sim.harness import NS, RESOURCE
from tests.test_sync_scenarios import Story

Obj = dict[str, Any]


class PreemptionStory(Story):
    def pod(self, name: str, entries: list[dict[str, Any]], *, owned: bool = True,  # type: ignore[override]
            priority: int = 0, never: bool = False) -> Obj:
        meta: Obj = {"name": name, "namespace": NS, "labels": {"app": name},
                     "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries)}}
        spec: Obj = {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}],
                     "priority": priority}
        if never:
            spec["preemptionPolicy"] = "Never"
        self.t += 1.0
        return self.fake.create(PODS, {"metadata": meta, "spec": spec})

    def running(self, name: str, gpus: int, priority: int = 0) -> str:
        """A pod placed by the controller and running; its node."""
        self.pod(name, [{"name": "g", "className": "alpha", "count": gpus}], priority=priority)
        self.see_all()
        self.sync(f"pod:{NS}/{name}")
        self.see_all()
        pod = self.fake.get(PODS, NS, name)
        assert pod is not None and not pod["spec"].get("schedulingGates"), name
        node = pod["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION]
        self.fake.bind_pod(NS, name, node)
        self.fake.set_pod_phase(NS, name, "Running")
        self.see_all()
        return str(node)

    def deleting(self, name: str) -> bool:
        pod = self.fake.get(PODS, NS, name)
        return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))

    def waiting_reason(self, claim: str) -> str:
        c = self.fake.get(CLAIMS, NS, claim) or {}
        cond = next((x for x in (c.get("status") or {}).get("conditions") or () if x["type"] == "Waiting"), {})
        return str(cond.get("reason", ""))

    def finish(self, *names: str) -> None:
        """kubelet stops the pods; their claims are let go."""
        for n in names:
            self.fake.finish_pod_deletion(NS, n)
        self.see_all()
        for key in sorted(self.ctl.queue.ready):
            if key.startswith("claim:"):
                self.sync(key)
        self.see_all()


def full_cluster() -> PreemptionStory:
    """Two nodes of 4, each with two notebooks of 2 at priority 0; n1's are
    younger."""
    s = PreemptionStory(nodes=(4, 4))
    nodes = [s.running(f"nb{i}", 2) for i in range(4)]
    assert nodes == ["n0", "n0", "n1", "n1"], nodes
    return s


def test_an_urgent_set_evicts_the_youngest_node_of_victims_and_runs_there() -> None:
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    assert [n for n in ("nb0", "nb1", "nb2", "nb3") if s.deleting(n)] == ["nb2", "nb3"]
    assert s.waiting_reason("urgent-g") == "Preempting"
    assert s.gated("urgent")
    victim = s.fake.get(PODS, NS, "nb2")
    assert victim is not None
    target = next(c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert "team/urgent" in target["message"] and target["reason"] == "PreemptionByGPUClaimController"
    assert any(e.reason == "Preempted" and "nb2" in e.involved for e in s.fake.events)
    # A younger pod of lower priority does not take the GPUs being freed.
    s.pod("late", [{"name": "g", "className": "alpha", "count": 4}])
    s.finish("nb2", "nb3")
    s.sync("pod:team/late")
    assert s.gated("late")
    s.sync("pod:team/urgent")
    assert not s.gated("urgent")
    assert s.fake.get(PODS, NS, "urgent")["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] == "n1"  # type: ignore[index]
    assert len(s.fake.evicted) == 2
    s.drain()
    s.check_quiet()


def test_a_victim_that_never_terminates_is_not_waited_for_for_ever() -> None:
    """nb2 and nb3 are evicted; nb3 never finishes terminating. Past
    STUCK_AFTER it frees nothing one can count on: the preemptor takes n0
    instead (evicting its two notebooks), and nothing is evicted twice."""
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    s.finish("nb2")
    s.sync("pod:team/urgent")
    assert s.gated("urgent") and s.waiting_reason("urgent-g") == "Preempting"
    assert len(s.fake.evicted) == 2  # nb3 is waited for, not evicted again
    s.t += 200.0  # past nb3's deletionTimestamp + STUCK_AFTER
    s.see_all()
    s.sync("pod:team/urgent")
    assert s.deleting("nb0") and s.deleting("nb1")
    s.finish("nb0", "nb1")
    s.sync("pod:team/urgent")
    assert not s.gated("urgent")
    assert s.bound_on("n0") == 4


def test_a_disruption_budget_that_refuses_moves_the_preemption_or_makes_it_wait_evicting_nothing() -> None:
    s = full_cluster()
    s.fake.disruption_budgets[NS] = [{"metadata": {"name": "keep-nb3", "namespace": NS},
                                      "spec": {"selector": {"matchLabels": {"app": "nb3"}}},
                                      "status": {"disruptionsAllowed": 0}}]
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    # n1 (youngest) is given up whole: nb2 is not evicted on its own.
    assert not s.deleting("nb2") and not s.deleting("nb3")
    assert any(e.reason == "PreemptionRefused" and "keep-nb3" in e.message for e in s.fake.events)
    s.sync("pod:team/urgent")
    assert s.deleting("nb0") and s.deleting("nb1")
    # Every node protected: nothing at all is evicted.
    t = PreemptionStory(nodes=(4,))
    t.running("a", 2)
    t.running("b", 2)
    t.fake.disruption_budgets[NS] = [{"metadata": {"name": "all", "namespace": NS},
                                      "spec": {"selector": {}}, "status": {"disruptionsAllowed": 1}}]
    t.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    t.see_all()
    for _ in range(3):
        t.sync("pod:team/urgent")
    assert t.fake.evicted == [] and t.gated("urgent")


def test_a_gang_whose_plan_a_disruption_budget_refuses_gives_up_every_node_of_it() -> None:
    """A gang of two sets of 4 needs both nodes; nb3 is protected. Its plan
    spans n0 and n1: refused, both nodes are given up for the gang, which
    waits instead of planning the same evictions again at once (simulation
    seed 5037: the plan's node was "n0, n1", no node at all, and the gang
    was refused for ever without time passing)."""
    s = full_cluster()
    s.fake.disruption_budgets[NS] = [{"metadata": {"name": "keep-nb3", "namespace": NS},
                                      "spec": {"selector": {"matchLabels": {"app": "nb3"}}},
                                      "status": {"disruptionsAllowed": 0}}]
    for i in range(2):
        s.t += 1.0
        s.fake.create(PODS, {"metadata": {
            "name": f"w{i}", "namespace": NS, "labels": {"app": f"w{i}"},
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": 4}]),
                            api.GANG_ANNOTATION: "train", api.GANG_SIZE_ANNOTATION: "2"}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}],
                     "priority": 500}})
    s.see_all()
    for _ in range(5):
        for key in sorted(k for k in s.ctl.queue.ready if k.startswith("pod:team/w")):
            s.sync(key)
    refused = [e for e in s.fake.events if e.reason == "PreemptionRefused"]
    assert len(refused) == 1 and "keep-nb3" in refused[0].message, refused
    assert not any(s.deleting(n) for n in ("nb0", "nb1", "nb2", "nb3"))
    assert s.gated("w0") and s.gated("w1")
    given_up = s.ctl.ctx.memories.preemption_refused
    assert [set(given_up.get(k) or ()) for k in given_up.keys()] == [{"n0", "n1"}]


def test_the_preemptor_deleted_mid_way_lets_the_gpus_go_to_others() -> None:
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.pod("late", [{"name": "g", "className": "alpha", "count": 4}])
    s.see_all()
    s.sync("pod:team/urgent")
    s.sync("pod:team/late")
    assert s.gated("late")
    s.finish("nb2", "nb3")
    s.sync("pod:team/late")
    assert s.gated("late")  # held for the preemptor
    s.fake.delete(PODS, NS, "urgent")
    s.see_all()
    assert "pod:team/late" in s.ctl.queue.ready  # woken by the end of the hold
    s.sync("pod:team/late")
    assert not s.gated("late")


def test_a_change_of_leader_while_victims_terminate_evicts_nothing_more() -> None:
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    assert len(s.fake.evicted) == 2
    s.restart(takeover=True)
    s.see_all()
    s.sync("pod:team/urgent")
    assert len(s.fake.evicted) == 2
    assert s.waiting_reason("urgent-g") == "Preempting"
    s.finish("nb2", "nb3")
    s.sync("pod:team/urgent")
    assert not s.gated("urgent")


def test_preemption_policy_never_waits_and_evicts_nothing() -> None:
    s = full_cluster()
    s.pod("polite", [{"name": "g", "className": "alpha", "count": 4}], priority=1000, never=True)
    s.see_all()
    s.sync("pod:team/polite")
    assert s.fake.evicted == [] and s.waiting_reason("polite-g") == "Capacity"


def test_equal_priority_never_preempts() -> None:
    s = full_cluster()
    s.pod("peer", [{"name": "g", "className": "alpha", "count": 4}], priority=0)
    s.see_all()
    s.sync("pod:team/peer")
    assert s.fake.evicted == []


def test_higher_priority_pods_are_handed_out_first() -> None:
    s = PreemptionStory(nodes=(4,))
    s.pod("old-low", [{"name": "g", "className": "alpha", "count": 4}], priority=0)
    s.pod("young-high", [{"name": "g", "className": "alpha", "count": 4}], priority=100)
    s.see_all()
    keys = sorted(["pod:team/old-low", "pod:team/young-high"],
                  key=lambda k: key_order(k, lambda ns, name: s.ctl.ctx.pods.get(ns, name)))
    assert keys == ["pod:team/young-high", "pod:team/old-low"]


def test_victims_gone_before_their_claims_are_let_go_are_waited_for_not_replaced() -> None:
    """The victims are deleted, and the informer shows it, but their claims'
    syncs have not let them go yet: the claims still hold the GPUs. A
    decision of the preemptor then must wait for those GPUs, not evict
    more pods elsewhere (a real-plane gang story evicted a whole other
    gang in that moment)."""
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    assert len(s.fake.evicted) == 2
    for n in ("nb2", "nb3"):
        s.fake.finish_pod_deletion(NS, n)
    s.see_all()  # the pods are gone; no claim sync has run
    assert s.bound_on("n1") == 4
    s.sync("pod:team/urgent")
    assert len(s.fake.evicted) == 2 and not s.deleting("nb0") and not s.deleting("nb1")
    assert s.waiting_reason("urgent-g") == "Preempting"
    s.finish()
    s.sync("pod:team/urgent")
    assert not s.gated("urgent") and s.bound_on("n1") == 4


def test_a_finished_pod_s_gpus_not_let_go_yet_are_waited_for_at_no_cost() -> None:
    """A notebook on n1 finished; its claim still holds its GPUs until its
    sync runs. The urgent set needs 2: it waits for those rather than
    evicting anyone."""
    s = full_cluster()
    s.fake.set_pod_phase(NS, "nb3", "Succeeded")
    s.see_all()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 2}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    assert s.fake.evicted == [] and s.waiting_reason("urgent-g") == "Preempting"


def test_nothing_is_evicted_on_a_node_the_server_shows_without_the_gpus_the_cache_counts() -> None:
    """The node cache lags: on the server n1 was cordoned and lost its GPUs
    (its device plugin went), the cache still shows 4 there. The plan to
    evict n1's notebooks is checked against the node read live: nothing is
    evicted, and once the cache shows it, the urgent set preempts on n0
    (simulation seed 5098: a standby whose node cache lagged)."""
    s = full_cluster()

    def gone(node: Obj) -> None:
        node["spec"] = {"unschedulable": True}
        node["status"]["allocatable"][RESOURCE] = "0"
    s.fake.patch(NODES, "", "n1", gone)
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.ctl.informers[PODS].deliver(10_000)
    s.sync("pod:team/urgent")
    assert s.fake.evicted == [] and s.gated("urgent")
    assert s.ctl.view.nominations == {}
    assert "pod:team/urgent" in {**s.ctl.queue.ready, **s.ctl.queue.delayed}  # decides again in a moment
    s.see_all()
    s.sync("pod:team/urgent")
    assert [n for n in ("nb0", "nb1", "nb2", "nb3") if s.deleting(n)] == ["nb0", "nb1"]


def test_nothing_is_evicted_for_a_preemptor_replaced_on_the_server() -> None:
    """The urgent pod was deleted and made again under its name at
    priority 0; the pod cache still shows the old one, at 1000. Nothing is
    evicted for a pod the server no longer has (simulation seed 15029)."""
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.fake.delete(PODS, NS, "urgent")
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=0)
    s.sync("pod:team/urgent")
    assert s.fake.evicted == []
    s.see_all()
    s.sync("pod:team/urgent")
    assert s.fake.evicted == [], "the new pod, of priority 0, preempts nobody"


def test_a_victim_the_server_shows_finished_is_not_evicted() -> None:
    """nb3 finished on the server; the pod cache still shows it running.
    Its GPUs come free without an eviction: nothing is evicted on a count
    the server no longer holds."""
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.fake.set_pod_phase(NS, "nb3", "Succeeded")
    s.sync("pod:team/urgent")
    assert s.fake.evicted == [] and s.gated("urgent")
    s.see_all()
    s.sync("pod:team/urgent")
    assert not s.deleting("nb3")


def test_the_preemptor_is_told_once_by_a_normal_event_not_a_warning_too() -> None:
    s = full_cluster()
    s.pod("urgent", [{"name": "g", "className": "alpha", "count": 4}], priority=1000)
    s.see_all()
    s.sync("pod:team/urgent")
    s.see_all()
    s.sync("pod:team/urgent")
    told = [(e.type, e.reason) for e in s.fake.events if "urgent" in e.involved]
    assert told == [("Normal", "Preempting")], told
