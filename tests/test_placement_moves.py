"""A partly bound set whose anchor node is full moves as a whole (issue 10, item 7)."""

from __future__ import annotations

from gpuclaimctl.decide.placement import Action, Placed, Waiting, decide
from gpuclaimctl.model.api import WaitReason
from gpuclaimctl.model.snapshot import Cluster
from tests.test_placement import GPU, NOW, bound, claim, gpu_class, node, pod


def test_a_partly_bound_set_whose_anchor_is_full_moves_to_a_node_with_room_for_all_of_it() -> None:
    cluster = Cluster([node("node-a", gpus=4), node("node-b", gpus=8)], [gpu_class()])
    used = {GPU: {"node-a": 4}}  # the bound claim's 1 and 3 of someone else's
    d = decide(pod(), [bound("kept", "node-a", 1), claim("new", 2)], cluster, used, NOW)
    assert isinstance(d, Placed) and d.node == "node-b"
    assert {a.claim: a.action for a in d.claims} == {"kept": Action.MOVE, "new": Action.BIND}


def test_a_partly_bound_set_stays_on_its_anchor_while_it_has_room() -> None:
    cluster = Cluster([node("node-a", gpus=4), node("node-b", gpus=8)], [gpu_class()])
    d = decide(pod(), [bound("kept", "node-a", 1), claim("new", 2)], cluster, {GPU: {"node-a": 1}}, NOW)
    assert isinstance(d, Placed) and d.node == "node-a"


def test_it_waits_for_capacity_when_no_node_has_room_for_the_whole_set() -> None:
    cluster = Cluster([node("node-a", gpus=4), node("node-b", gpus=2)], [gpu_class()])
    d = decide(pod(), [bound("kept", "node-a", 1), claim("new", 2)], cluster, {GPU: {"node-a": 4}}, NOW)
    assert isinstance(d, Waiting) and d.reason is WaitReason.CAPACITY
