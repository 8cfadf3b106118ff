"""`gpuclaimctl status`: what a person reads about GPUs, claims, budgets and waiting pods.

Most tests render literal API objects (no cluster); the output is read back
by the header's column positions, so a misaligned column reads wrong. One
plane test runs the real command against the real API server.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client

from gpuclaimctl.cmd import cli
from gpuclaimctl.model.api import (
    API_VERSION,
    BUDGET_PLURAL,
    CLAIM_PLURAL,
    CLAIMS_ANNOTATION,
    CLASS_PLURAL,
    GROUP,
    SCHEDULING_GATE,
    TEMPLATE_CLAIM_LABEL,
    TEMPLATE_CLAIM_LABEL_VALUE,
    VERSION,
)
from gpuclaimctl.client.kube import request_json
from gpuclaimctl.model.podclaims import template_claim_name
from gpuclaimctl.cmd import statusview
from gpuclaimctl.cmd.statusview import BUDGETS_TITLE, GPUS_TITLE, human_duration, render

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"
MERGE_PATCH = "application/merge-patch+json"
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=timezone.utc)


# -- literal objects -----------------------------------------------------------


def node(name: str, resources: dict[str, str] | None = None, *, ready: bool = True, cordoned: bool = False,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": {"cpu": "32", **(resources or {})},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def nvidia(name: str, gpus: int, **kw: Any) -> dict[str, Any]:
    return node(name, {GPU: str(gpus)}, **kw)


def gpu_class(name: str, *, resource: str | None = None, selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": selector or {}}
    if resource:
        spec["resourceName"] = resource
    return {"metadata": {"name": name}, "spec": spec}


def claim(name: str, class_name: str, count: int, *, ns: str = "team", phase: str | None = None,
          node_name: str = "", reserved_for: Sequence[str] = (),
          waiting: tuple[str, str] | None = None, waiting_status: str = "True") -> dict[str, Any]:
    st: dict[str, Any] = {}
    if phase:
        st["phase"] = phase
    if node_name:
        st["nodeName"] = node_name
    if reserved_for:
        st["reservedFor"] = [{"name": uid, "uid": uid} for uid in reserved_for]
    if waiting:
        st["conditions"] = [{"type": "Waiting", "status": waiting_status, "reason": waiting[0],
                             "message": waiting[1], "lastTransitionTime": "2025-06-01T11:00:00Z"}]
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"className": class_name, "count": count},
            "status": st}


def owned_claim(name: str, pod: str, **kw: Any) -> dict[str, Any]:
    """A claim made for pod `pod` (gated_pod's uid) from its template or inline entry."""
    c = claim(name, "a100", 1, **kw)
    c["metadata"]["labels"] = {TEMPLATE_CLAIM_LABEL: TEMPLATE_CLAIM_LABEL_VALUE}
    c["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"uid-{pod}",
                                         "controller": True}]
    return c


def budget(name: str, limits: dict[str, int], *, ns: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"limits": [{"className": c, "gpus": n} for c, n in limits.items()]}}


def running_pod(name: str, node_name: str, gpus: int, *, ns: str = "team", phase: str = "Running",
                resource: str = GPU) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": name, "creationTimestamp": "2025-06-01T10:00:00Z"},
        "spec": {"nodeName": node_name,
                 "containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}}]},
        "status": {"phase": phase},
    }


def gated_pod(name: str, annotation: str | list[dict[str, Any]], *, ns: str = "team",
              age: timedelta = timedelta(minutes=5), gated: bool = True) -> dict[str, Any]:
    text = annotation if isinstance(annotation, str) else json.dumps(annotation)
    return {
        "metadata": {
            "name": name, "namespace": ns, "uid": f"uid-{name}",
            "creationTimestamp": (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {CLAIMS_ANNOTATION: text},
        },
        "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}] if gated else [],
                 "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


# -- reading the output back ---------------------------------------------------


def section(text: str, title: str) -> list[dict[str, str]] | None:
    """The rows under `title`, cut at the header's column positions; None
    when the section says none."""
    blocks = {b.splitlines()[0]: b.splitlines()[1:] for b in text.rstrip("\n").split("\n\n")}
    lines = blocks[title]
    if lines == ["none"]:
        return None
    header, *rows = lines
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    out = []
    for row in rows:
        cells = {}
        for i, n in enumerate(names):
            end = starts[i + 1] if i + 1 < len(names) else None
            if end is not None:
                # A value never runs into the next column: two spaces first.
                assert row[end - 2:end] == "  ", f"column {names[i + 1]} misaligned in {row!r}"
            cells[n] = row[starts[i]:end].strip()
        out.append(cells)
    return out


def gpus_by_node_class(text: str) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["NODE"], r["CLASS"]): r for r in section(text, GPUS_TITLE) or []}


# -- GPUs per node and class ---------------------------------------------------


def test_a_node_offering_two_classes_is_listed_under_both_with_bound_counted_by_resource() -> None:
    nodes = [nvidia("gpu-a", 8, labels={"gpu": "a100"})]
    classes = [gpu_class("a100", selector={"gpu": "a100"}), gpu_class("any-nvidia")]
    claims = [claim("train", "a100", 3, phase="Bound", node_name="gpu-a"),
              claim("nb", "any-nvidia", 1, ns="other", phase="Bound", node_name="gpu-a")]
    rows = gpus_by_node_class(render(nodes, classes, claims, [], NOW))
    # Both classes count the same nvidia.com/gpu: each row shows every claim on it.
    expected = {"RESOURCE": GPU, "ALLOCATABLE": "8", "BOUND": "4", "OTHER": "0", "FREE": "4", "STATE": "Ready"}
    assert rows[("gpu-a", "a100")] == {"NODE": "gpu-a", "CLASS": "a100", **expected}
    assert rows[("gpu-a", "any-nvidia")] == {"NODE": "gpu-a", "CLASS": "any-nvidia", **expected}


def test_classes_on_different_resources_count_only_their_own_gpus() -> None:
    nodes = [node("mixed", {GPU: "8", AMD: "4"})]
    classes = [gpu_class("a100"), gpu_class("mi300", resource=AMD)]
    claims = [claim("n", "a100", 2, phase="Bound", node_name="mixed"),
              claim("m", "mi300", 1, phase="Bound", node_name="mixed")]
    rows = gpus_by_node_class(render(nodes, classes, claims, [], NOW))
    assert (rows[("mixed", "a100")]["BOUND"], rows[("mixed", "a100")]["FREE"]) == ("2", "6")
    assert rows[("mixed", "mi300")]["RESOURCE"] == AMD
    assert (rows[("mixed", "mi300")]["BOUND"], rows[("mixed", "mi300")]["FREE"]) == ("1", "3")


def test_a_node_is_not_listed_under_a_class_whose_selector_or_resource_it_lacks() -> None:
    nodes = [nvidia("gpu-a", 8, labels={"gpu": "a100"}), nvidia("gpu-h", 8, labels={"gpu": "h100"}),
             node("cpu-only")]
    classes = [gpu_class("a100", selector={"gpu": "a100"}), gpu_class("mi300", resource=AMD)]
    rows = gpus_by_node_class(render(nodes, classes, [], [], NOW))
    assert list(rows) == [("gpu-a", "a100")]


@pytest.mark.parametrize(
    "ready, cordoned, state",
    [(True, False, "Ready"), (False, False, "NotReady"), (True, True, "Cordoned"),
     (False, True, "NotReady,Cordoned")],
    ids=["ready", "not-ready", "cordoned", "not-ready-and-cordoned"],
)
def test_node_state_says_whether_new_sets_can_go_there(ready: bool, cordoned: bool, state: str) -> None:
    text = render([nvidia("gpu-a", 8, ready=ready, cordoned=cordoned)], [gpu_class("a100")], [], [], NOW)
    assert gpus_by_node_class(text)[("gpu-a", "a100")]["STATE"] == state


def test_pods_using_gpus_without_claims_take_free_gpus_but_are_not_bound() -> None:
    nodes = [nvidia("gpu-a", 8)]
    claims = [claim("c", "a100", 2, phase="Bound", node_name="gpu-a", reserved_for=["claimed-pod"])]
    pods = [
        running_pod("legacy", "gpu-a", 3),  # no claim: counts against FREE
        running_pod("claimed-pod", "gpu-a", 2),  # its claim already holds its GPUs
        running_pod("done", "gpu-a", 4, phase="Succeeded"),  # finished: holds nothing
        running_pod("elsewhere", "gpu-b", 1),
    ]
    row = gpus_by_node_class(render(nodes, [gpu_class("a100")], claims, pods, NOW))[("gpu-a", "a100")]
    assert (row["ALLOCATABLE"], row["BOUND"], row["OTHER"], row["FREE"]) == ("8", "2", "3", "3")


def test_a_pod_without_claims_shows_its_gpus_as_other_so_the_columns_add_up() -> None:
    """Issue 45: `8 total, 0 bound, 7 free` left a GPU unaccounted for."""
    row = gpus_by_node_class(render([nvidia("gpu-a", 8)], [gpu_class("a100")], [],
                                    [running_pod("legacy", "gpu-a", 1)], NOW))[("gpu-a", "a100")]
    assert (row["ALLOCATABLE"], row["BOUND"], row["OTHER"], row["FREE"]) == ("8", "0", "1", "7")


def test_allocatable_is_bound_plus_other_plus_free_on_every_row() -> None:
    nodes = [nvidia("gpu-a", 8), node("mixed", {GPU: "4", AMD: "4"}), nvidia("full", 2)]
    classes = [gpu_class("a100"), gpu_class("mi300", resource=AMD)]
    claims = [claim("c", "a100", 2, phase="Bound", node_name="gpu-a", reserved_for=["greedy"]),
              claim("m", "mi300", 3, phase="Bound", node_name="mixed"),
              claim("f", "a100", 2, phase="Bound", node_name="full")]
    pods = [running_pod("greedy", "gpu-a", 3),  # one GPU more than its claim holds
            running_pod("legacy", "mixed", 2, resource=AMD), running_pod("over", "full", 1)]
    rows = gpus_by_node_class(render(nodes, classes, claims, pods, NOW))
    assert {k: (r["BOUND"], r["OTHER"], r["FREE"]) for k, r in rows.items()} == {
        ("gpu-a", "a100"): ("2", "1", "5"), ("mixed", "a100"): ("0", "0", "4"),
        ("mixed", "mi300"): ("3", "2", "-1"), ("full", "a100"): ("2", "1", "-1")}
    for r in rows.values():
        assert int(r["ALLOCATABLE"]) == int(r["BOUND"]) + int(r["OTHER"]) + int(r["FREE"]), r
    assert "OTHER" in GPUS_TITLE and "without" in GPUS_TITLE


def test_an_overcommitted_node_shows_negative_free_rather_than_hiding_it() -> None:
    claims = [claim("c", "a100", 4, phase="Bound", node_name="gpu-a")]
    pods = [running_pod("legacy", "gpu-a", 2)]
    row = gpus_by_node_class(render([nvidia("gpu-a", 4)], [gpu_class("a100")], claims, pods, NOW))
    assert row[("gpu-a", "a100")]["FREE"] == "-2"


def test_pending_and_lost_claims_hold_no_gpus() -> None:
    claims = [claim("p", "a100", 2), claim("l", "a100", 2, phase="Lost", node_name="gpu-a")]
    row = gpus_by_node_class(render([nvidia("gpu-a", 8)], [gpu_class("a100")], claims, [], NOW))
    assert (row[("gpu-a", "a100")]["BOUND"], row[("gpu-a", "a100")]["FREE"]) == ("0", "8")


# -- claims by phase -----------------------------------------------------------


def test_claims_are_counted_per_class_and_phase_including_classes_that_do_not_exist() -> None:
    claims = [
        claim("a", "a100", 1, phase="Bound", node_name="n"), claim("b", "a100", 1, ns="x", phase="Bound",
                                                                    node_name="n"),
        claim("c", "a100", 1),  # no status yet: Pending
        claim("d", "a100", 1, phase="Lost", node_name="n"),
        claim("e", "gone", 1, phase="Pending"),
    ]
    rows = section(render([], [gpu_class("a100"), gpu_class("idle")], claims, [], NOW), "Claims by phase")
    assert rows == [
        {"CLASS": "a100", "PENDING": "1", "BOUND": "2", "LOST": "1"},
        {"CLASS": "gone", "PENDING": "1", "BOUND": "0", "LOST": "0"},
        {"CLASS": "idle", "PENDING": "0", "BOUND": "0", "LOST": "0"},
    ]


# -- budgets -------------------------------------------------------------------


def test_each_budget_limit_shows_the_gpus_held_and_the_namespace_s_pods_waiting_on_budget() -> None:
    budgets = [budget("team", {"a100": 4, "*": 6}), budget("other-team", {"a100": 1}, ns="other")]
    claims = [
        claim("train", "a100", 3, phase="Bound", node_name="gpu-a"),
        claim("eval", "h100", 2, phase="Bound", node_name="gpu-h"),
        # Lost and still reserved: its pod may still use the GPUs (counted, as capacity does).
        claim("gone-node", "a100", 1, phase="Lost", node_name="gpu-x", reserved_for=["p"]),
        claim("released", "a100", 1, phase="Lost", node_name="gpu-x"),
        claim("waits", "a100", 2, waiting=("Budget", "GPUBudget team/team allows 4 a100 GPUs; ...")),
        claim("waits-too", "h100", 2, waiting=("Budget", "GPUBudget team/team allows 6 GPUs ...")),
        claim("no-room", "a100", 8, waiting=("Capacity", "no node has 8 free")),
        claim("theirs", "a100", 5, ns="other", phase="Bound", node_name="gpu-a"),
    ]
    pods = [gated_pod("w1", [{"name": "g", "claim": "waits"}]),
            gated_pod("w2", [{"name": "g", "claim": "waits-too"}]),
            gated_pod("w3", [{"name": "g", "claim": "no-room"}])]
    rows = section(render([], [], claims, pods, NOW, budgets), BUDGETS_TITLE)
    assert rows == [
        {"NAMESPACE": "other", "BUDGET": "other-team", "CLASS": "a100", "LIMIT": "1", "HELD": "5",
         "WAITING": "0"},
        {"NAMESPACE": "team", "BUDGET": "team", "CLASS": "a100", "LIMIT": "4", "HELD": "4", "WAITING": "2"},
        {"NAMESPACE": "team", "BUDGET": "team", "CLASS": "*", "LIMIT": "6", "HELD": "6", "WAITING": "2"},
    ]


def test_every_budget_of_a_namespace_is_listed_and_one_without_limits_shows_dashes() -> None:
    budgets = [budget("zeta", {"a100": 2}), budget("alpha", {})]
    rows = section(render([], [], [], [], NOW, budgets), BUDGETS_TITLE) or []
    assert [(r["BUDGET"], r["CLASS"], r["LIMIT"], r["HELD"]) for r in rows] == [
        ("alpha", "-", "-", "-"), ("zeta", "a100", "2", "0")]


def test_the_budget_section_says_held_leaves_out_placements_in_flight() -> None:
    assert "HELD" in BUDGETS_TITLE and "in flight" in BUDGETS_TITLE
    assert section(render([], [], [], [], NOW), BUDGETS_TITLE) is None


# -- waiting pods --------------------------------------------------------------


def test_a_waiting_pod_shows_the_reason_and_message_its_claim_carries() -> None:
    claims = [claim("shared", "a100", 4, waiting=("Capacity", "no node has 4 free nvidia.com/gpu"))]
    pods = [gated_pod("trainer", [{"name": "gpu", "claim": "shared"}], age=timedelta(minutes=7, seconds=3))]
    rows = section(render([], [], claims, pods, NOW), "Waiting pods")
    assert rows == [{"NAMESPACE/NAME": "team/trainer", "AGE": "7m3s", "PRIORITY": "0", "REASON": "Capacity",
                     "MESSAGE": "no node has 4 free nvidia.com/gpu"}]


def test_a_preempting_pod_shows_its_priority_and_is_counted_with_the_others_by_reason() -> None:
    """Issue 46: the preemptor's claims say Preempting, naming the node and
    its victims; status shows each waiting pod's priority and how many wait
    for each reason, Preempting among them."""
    plan = ("a100 set: preempting 1 pod of lower priority on node gpu-a: team/nb (priority 0); "
            "the GPUs they free are held for it")
    claims = [owned_claim(template_claim_name("urgent", "gpu"), "urgent", waiting=("Preempting", plan)),
              owned_claim(template_claim_name("a", "gpu"), "a", waiting=("Capacity", "no room")),
              owned_claim(template_claim_name("b", "gpu"), "b", waiting=("Capacity", "no room"))]
    entry = [{"name": "gpu", "className": "a100", "count": 1}]
    urgent = gated_pod("urgent", entry, age=timedelta(minutes=1))
    urgent["spec"]["priority"] = 1000
    pods = [urgent, gated_pod("a", entry, age=timedelta(minutes=3)), gated_pod("b", entry)]
    text = render([], [], claims, pods, NOW)
    rows = {r["NAMESPACE/NAME"]: r for r in section(text, "Waiting pods") or []}
    assert (rows["team/urgent"]["PRIORITY"], rows["team/urgent"]["REASON"], rows["team/urgent"]["MESSAGE"]) \
        == ("1000", "Preempting", plan)
    assert rows["team/a"]["PRIORITY"] == "0"
    assert section(text, statusview.REASONS_TITLE) == [{"REASON": "Capacity", "PODS": "2"},
                                                       {"REASON": "Preempting", "PODS": "1"}]


def test_template_entries_are_resolved_to_the_claims_made_for_the_pod() -> None:
    name = template_claim_name("notebook", "gpu")
    claims = [
        claim("notebook-other", "a100", 1, waiting=("Capacity", "not this one")),
        owned_claim(name, "notebook", waiting=("ClassNotFound", "GPUClass 'a100' does not exist")),
        owned_claim(name, "notebook", ns="elsewhere", waiting=("Capacity", "another namespace")),
    ]
    pods = [gated_pod("notebook", [{"name": "gpu", "className": "a100", "count": 1}])]
    rows = section(render([], [], claims, pods, NOW), "Waiting pods") or []
    assert [(r["REASON"], r["MESSAGE"]) for r in rows] == [("ClassNotFound", "GPUClass 'a100' does not exist")]


def test_the_first_claim_in_annotation_order_that_says_why_is_shown() -> None:
    claims = [
        claim("first", "a100", 1),  # no condition yet
        claim("second", "a100", 1, waiting=("ClaimInUse", "second is used by pod team/other")),
        claim("third", "a100", 1, waiting=("Capacity", "no room")),
    ]
    entries = [{"name": n, "claim": n} for n in ("first", "second", "third")]
    rows = section(render([], [], claims, [gated_pod("p", entries)], NOW), "Waiting pods") or []
    assert rows[0]["REASON"] == "ClaimInUse"


def test_an_invalid_annotation_shows_the_parse_error() -> None:
    pods = [gated_pod("broken", [{"name": "gpu", "className": "a100", "count": 0}])]
    rows = section(render([], [], [], pods, NOW), "Waiting pods") or []
    assert rows[0]["REASON"] == "InvalidClaims"
    assert "count must be at least 1" in rows[0]["MESSAGE"]


def test_an_annotation_that_is_not_json_shows_the_parse_error_on_one_line() -> None:
    rows = section(render([], [], [], [gated_pod("broken", "{not json")], NOW), "Waiting pods") or []
    assert rows[0]["REASON"] == "InvalidClaims"
    assert rows[0]["MESSAGE"].startswith(f"annotation {CLAIMS_ANNOTATION} is invalid: not valid JSON")


@pytest.mark.parametrize(
    ("entry", "claims"),
    [({"name": "gpu", "className": "a100", "count": 1}, []),
     ({"name": "gpu", "claim": "c"}, [claim("c", "a100", 1)]),
     ({"name": "gpu", "claim": "c"}, [claim("c", "a100", 1, waiting=("Capacity", "old"), waiting_status="False")])],
    ids=["claim-not-created-yet", "claim-without-conditions", "waiting-condition-false"],
)
def test_a_pod_no_claim_explains_is_pending_not_yet_processed(entry: dict[str, Any],
                                                               claims: list[dict[str, Any]]) -> None:
    pods = [gated_pod("new", [entry])]
    rows = section(render([], [], claims, pods, NOW), "Waiting pods") or []
    assert [(r["REASON"], r["MESSAGE"]) for r in rows] == [("Pending", "not yet processed")]


def warning(pod: str, reason: str, message: str, at: str, *, component: str = "gpuclaimctl",
            type_: str = "Warning") -> dict[str, Any]:
    return {"type": type_, "reason": reason, "message": message, "lastTimestamp": at,
            "involvedObject": {"kind": "Pod", "namespace": "team", "name": pod, "uid": f"uid-{pod}"},
            "source": {"component": component}, "reportingComponent": component}


def test_a_claim_the_pod_cannot_use_is_told_as_the_controller_resolves_it() -> None:
    """No claim to carry a Waiting condition: a GPUClaim or GPUClaimTemplate
    that does not exist, another pod's template claim. Read from the objects
    alone, so every replica and `gpuclaimctl status` say the same."""
    theirs = owned_claim("train-gpu", "train")
    pods = [gated_pod("missing", [{"name": "gpu", "claim": "nosuch"}], age=timedelta(minutes=4)),
            gated_pod("steal", [{"name": "gpu", "claim": "train-gpu"}], age=timedelta(minutes=3)),
            gated_pod("notemplate", [{"name": "gpu", "template": "t-x"}], age=timedelta(minutes=2))]
    rows = section(render([], [], [theirs], pods, NOW, templates=[]), "Waiting pods") or []
    said = {r["NAMESPACE/NAME"]: (r["REASON"], r["MESSAGE"]) for r in rows}
    assert said["team/missing"] == ("ClaimMissing", "GPUClaim 'nosuch' does not exist in team")
    assert said["team/steal"][0] == "ClaimInUse" and "'train'" in said["team/steal"][1]
    assert said["team/notemplate"] == ("ClaimMissing", "GPUClaimTemplate 't-x' does not exist in team")
    # Templates not known (not listed): a template entry is never said to be missing.
    rows = section(render([], [], [theirs], pods, NOW), "Waiting pods") or []
    assert [r["REASON"] for r in rows] == ["ClaimMissing", "ClaimInUse", "Pending"]


def test_a_claim_still_to_be_made_shows_what_the_controller_last_told_the_pod() -> None:
    """A claim the API server refused to create: the pod's latest Warning
    event from gpuclaimctl with a waiting reason says why. Once every claim
    exists, an event is no longer taken as the reason."""
    events = [
        warning("new", "ClassNotFound", "older", "2025-06-01T11:00:00Z"),
        warning("new", "ClaimMissing", "refused to create GPUClaim 'new-gpu': 403", "2025-06-01T11:30:00Z"),
        warning("new", "ClaimMissing", "not ours", "2025-06-01T11:50:00Z", component="someone-else"),
        warning("new", "FailedScheduling", "not a waiting reason", "2025-06-01T11:55:00Z"),
        warning("new", "ClaimInUse", "a Normal event", "2025-06-01T11:58:00Z", type_="Normal"),
    ]
    told = statusview.told_by_events(events)
    assert told == {"uid-new": ("ClaimMissing", "refused to create GPUClaim 'new-gpu': 403")}
    pods = [gated_pod("new", [{"name": "gpu", "className": "a100", "count": 1}])]
    rows = section(render([], [], [], pods, NOW, told=told.get), "Waiting pods") or []
    assert [(r["REASON"], r["MESSAGE"]) for r in rows] == [("ClaimMissing", "refused to create GPUClaim 'new-gpu': 403")]
    made = [owned_claim(template_claim_name("new", "gpu"), "new")]
    rows = section(render([], [], made, pods, NOW, told=told.get), "Waiting pods") or []
    assert [r["REASON"] for r in rows] == ["Pending"]


def test_another_pod_s_claim_is_told_as_in_use_or_taken_whatever_its_own_condition_says() -> None:
    """Found by a real-plane attack: the first claim with a Waiting condition
    was shown even when it was another pod's, waiting for its own reason."""
    train = owned_claim(template_claim_name("train", "gpu"), "train", waiting=("Capacity", "train's wait"))
    taken = claim(template_claim_name("nt", "g"), "a100", 9, waiting=("Capacity", "user's wait"))
    notebook = claim("notebook-gpu", "a100", 1, phase="Bound", node_name="n0", reserved_for=["nb"],
                     waiting=("Capacity", "stale"))
    pods = [gated_pod("steal", [{"name": "gpu", "claim": template_claim_name("train", "gpu")}],
                      age=timedelta(minutes=3)),
            gated_pod("nt", [{"name": "g", "className": "a100", "count": 1}], age=timedelta(minutes=2)),
            gated_pod("borrow", [{"name": "gpu", "claim": "notebook-gpu"}], age=timedelta(minutes=1))]
    rows = section(render([], [], [train, taken, notebook], pods, NOW), "Waiting pods") or []
    said = {r["NAMESPACE/NAME"]: (r["REASON"], r["MESSAGE"]) for r in rows}
    assert said["team/steal"][0] == "ClaimInUse" and "'train'" in said["team/steal"][1]
    assert said["team/nt"][0] == "NameTaken"
    assert said["team/borrow"] == ("ClaimInUse", "GPUClaim notebook-gpu is in use by pod nb; "
                                                 "a claim serves one pod at a time")


def test_a_claim_two_waiting_pods_name_says_one_of_them_so_each_is_told_by_what_it_was_told() -> None:
    """Found by a real-plane attack: a shared claim's Waiting condition is
    the reason of whichever pod was decided last."""
    shared = claim("sh", "a100", 2, waiting=("NodeAffinity", "s1's reason"))
    pods = [gated_pod("s1", [{"name": "gpu", "claim": "sh"}], age=timedelta(minutes=2)),
            gated_pod("s2", [{"name": "gpu", "claim": "sh"}], age=timedelta(minutes=1))]
    told = {"uid-s1": ("NodeAffinity", "s1's reason"), "uid-s2": ("Capacity", "s2's reason")}
    rows = section(render([], [], [shared], pods, NOW, told=told.get), "Waiting pods") or []
    assert [(r["REASON"], r["MESSAGE"]) for r in rows] == [("NodeAffinity", "s1's reason"),
                                                           ("Capacity", "s2's reason")]
    # Nothing told (a new leader, events gone): the claim's condition for both.
    rows = section(render([], [], [shared], pods, NOW), "Waiting pods") or []
    assert [r["REASON"] for r in rows] == ["NodeAffinity", "NodeAffinity"]


def test_a_claim_missing_told_earlier_is_not_shown_once_the_claim_exists() -> None:
    pods = [gated_pod("new", [{"name": "gpu", "claim": "mine"}])]
    told = {"uid-new": ("ClaimMissing", "GPUClaim 'mine' does not exist in team")}
    rows = section(render([], [], [claim("mine", "a100", 1)], pods, NOW, told=told.get), "Waiting pods") or []
    assert [r["REASON"] for r in rows] == ["Pending"]


def test_a_claim_s_waiting_condition_wins_over_what_an_event_told() -> None:
    claims = [owned_claim(template_claim_name("new", "gpu"), "new", waiting=("Capacity", "no node has 1 free"))]
    pods = [gated_pod("new", [{"name": "gpu", "className": "a100", "count": 1}])]
    told = {"uid-new": ("ClaimMissing", "earlier")}
    rows = section(render([], [], claims, pods, NOW, told=told.get), "Waiting pods") or []
    assert [(r["REASON"], r["MESSAGE"]) for r in rows] == [("Capacity", "no node has 1 free")]


def test_waiting_pods_are_listed_oldest_first_and_released_pods_not_at_all() -> None:
    pods = [
        gated_pod("young", [{"name": "g", "claim": "a"}], age=timedelta(seconds=30)),
        gated_pod("old", [{"name": "g", "claim": "b"}], ns="b-team", age=timedelta(days=3, hours=2)),
        gated_pod("released", [{"name": "g", "claim": "c"}], gated=False),
        running_pod("plain", "gpu-a", 1),
    ]
    rows = section(render([], [], [], pods, NOW), "Waiting pods") or []
    assert [(r["NAMESPACE/NAME"], r["AGE"]) for r in rows] == [("b-team/old", "3d2h"), ("team/young", "30s")]


def test_a_multi_line_message_stays_on_its_row() -> None:
    claims = [claim("c", "a100", 1, waiting=("Capacity", "no node fits:\n  gpu-a: 1 free\n  gpu-b: cordoned"))]
    text = render([], [], claims, [gated_pod("p", [{"name": "g", "claim": "c"}])], NOW)
    rows = section(text, "Waiting pods") or []
    assert rows[0]["MESSAGE"] == "no node fits: gpu-a: 1 free gpu-b: cordoned"


# -- the whole text ------------------------------------------------------------


def test_an_empty_cluster_says_none_in_every_section() -> None:
    assert render([], [], [], [], NOW) == (
        f"{GPUS_TITLE}\nnone\n\nClaims by phase\nnone\n\n{BUDGETS_TITLE}\nnone\n\n"
        f"{statusview.REASONS_TITLE}\nnone\n\nWaiting pods\nnone\n"
    )


def test_columns_line_up_when_names_differ_in_length() -> None:
    nodes = [nvidia("n", 8), nvidia("a-much-longer-node-name", 16, cordoned=True)]
    text = render(nodes, [gpu_class("a100")], [], [], NOW)
    lines = text.split("\n\n")[0].splitlines()[1:]
    starts = {line.index(GPU) for line in lines[1:]} | {lines[0].index("RESOURCE")}
    assert len(starts) == 1, text
    assert all(line == line.rstrip() for line in text.splitlines())


@pytest.mark.parametrize(
    "seconds, shown",
    [(-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (200, "3m20s"),
     (10 * 60, "10m"), (179 * 60, "179m"), (3 * 3600, "3h"), (3 * 3600 + 600, "3h10m"),
     (8 * 3600, "8h"), (47 * 3600, "47h"), (48 * 3600, "2d"), (3 * 86400 + 7200, "3d2h"),
     (8 * 86400, "8d"), (729 * 86400, "729d"), (730 * 86400, "2y"), (800 * 86400, "2y70d"),
     (3000 * 86400, "8y")],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


# -- the command, without a cluster --------------------------------------------


def test_without_kubeconfig_or_cluster_the_command_fails_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    result = CliRunner().invoke(cli.main, ["status"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "--kubeconfig" in result.output


def test_a_missing_kubeconfig_fails_with_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["status", "--kubeconfig", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "nope" in result.output


def test_an_unreachable_api_server_fails_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    }))
    result = CliRunner().invoke(cli.main, ["status", "--kubeconfig", str(path)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and f"127.0.0.1:{port}" in result.output


# -- against the real API server -----------------------------------------------


@pytest.fixture
def cluster_objects(api_client: client.ApiClient, crds: list[str], namespace: str) -> Iterator[dict[str, str]]:
    """A NotReady node with 4 GPUs, a class selecting it, a GPUBudget of 8
    of that class, a claim waiting for Capacity and a gated pod using it. The controller is not running;
    the claim's condition is written as it would write it."""
    suffix = uuid.uuid4().hex[:6]
    names = {"node": f"status-node-{suffix}", "class": f"status-a100-{suffix}", "claim": "trainer-gpus",
             "pod": "trainer"}
    crd_base = f"/apis/{GROUP}/{VERSION}"
    claims_path = f"{crd_base}/namespaces/{namespace}/{CLAIM_PLURAL}"
    made: list[str] = []  # cluster-scoped paths to delete; the namespace takes the rest

    def create(path: str, body: dict[str, Any]) -> None:
        request_json(api_client, "POST", path, body=body)
        if "/namespaces/" not in path:
            made.append(f"{path}/{body['metadata']['name']}")

    try:
        create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": names["node"], "labels": {"status-test": suffix}}})
        request_json(api_client, "PATCH", f"/api/v1/nodes/{names['node']}/status", content_type=MERGE_PATCH,
                     body={"status": {"capacity": {GPU: "4"}, "allocatable": {GPU: "4"}}})
        create(f"{crd_base}/{CLASS_PLURAL}", {
            "apiVersion": API_VERSION, "kind": "GPUClass", "metadata": {"name": names["class"]},
            "spec": {"nodeSelector": {"status-test": suffix}}})
        create(claims_path, {
            "apiVersion": API_VERSION, "kind": "GPUClaim", "metadata": {"name": names["claim"]},
            "spec": {"className": names["class"], "count": 8}})
        create(f"{crd_base}/namespaces/{namespace}/{BUDGET_PLURAL}", {
            "apiVersion": API_VERSION, "kind": "GPUBudget", "metadata": {"name": "team"},
            "spec": {"limits": [{"className": names["class"], "gpus": 8}]}})
        request_json(api_client, "PATCH", f"{claims_path}/{names['claim']}/status", content_type=MERGE_PATCH,
                     body={"status": {"phase": "Pending", "conditions": [{
                         "type": "Waiting", "status": "True", "reason": "Capacity",
                         "message": f"no node has 8 free {GPU}",
                         "lastTransitionTime": "2025-06-01T11:00:00Z"}]}})
        create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": names["pod"], "annotations": {
                CLAIMS_ANNOTATION: json.dumps([{"name": "gpus", "claim": names["claim"]}])}},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}})
        # A pod whose claim the API server refused to create, told so in a
        # Warning event as the controller's recorder posts one.
        orphan = request_json(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "orphan", "annotations": {
                CLAIMS_ANNOTATION: json.dumps([{"name": "gpus", "className": names["class"], "count": 1}])}},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}})
        request_json(api_client, "POST", f"/api/v1/namespaces/{namespace}/events", body={
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"orphan.{suffix}"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": "orphan",
                               "uid": orphan["metadata"]["uid"]},
            "type": "Warning", "reason": "ClaimMissing",
            "message": "the API server refused to create GPUClaim 'orphan-gpus': 403 Forbidden: quota",
            "source": {"component": "gpuclaimctl"}, "reportingComponent": "gpuclaimctl",
            "firstTimestamp": "2025-06-01T11:00:00Z", "lastTimestamp": "2025-06-01T11:00:00Z", "count": 1})
        yield names
    finally:
        for path in reversed(made):
            request_json(api_client, "DELETE", path)


@pytest.mark.plane
def test_status_lists_the_cluster_s_classes_claims_and_waiting_pods(
    control_plane: Any, cluster_objects: dict[str, str], namespace: str
) -> None:
    result = CliRunner().invoke(cli.main, ["status", "--kubeconfig", str(control_plane.kubeconfig)])
    assert result.exit_code == 0, result.output
    text = result.output

    row = gpus_by_node_class(text)[(cluster_objects["node"], cluster_objects["class"])]
    assert row == {"NODE": cluster_objects["node"], "CLASS": cluster_objects["class"], "RESOURCE": GPU,
                   "ALLOCATABLE": "4", "BOUND": "0", "OTHER": "0", "FREE": "4", "STATE": "NotReady"}

    phases = {r["CLASS"]: r for r in section(text, "Claims by phase") or []}
    assert phases[cluster_objects["class"]] == {"CLASS": cluster_objects["class"], "PENDING": "1",
                                                "BOUND": "0", "LOST": "0"}

    budgets = [r for r in section(text, BUDGETS_TITLE) or [] if r["NAMESPACE"] == namespace]
    assert budgets == [{"NAMESPACE": namespace, "BUDGET": "team", "CLASS": cluster_objects["class"],
                        "LIMIT": "8", "HELD": "0", "WAITING": "0"}]

    waiting = {r["NAMESPACE/NAME"]: r for r in section(text, "Waiting pods") or []}
    pod = waiting[f"{namespace}/{cluster_objects['pod']}"]
    assert (pod["REASON"], pod["MESSAGE"]) == ("Capacity", f"no node has 8 free {GPU}")
    orphan = waiting[f"{namespace}/orphan"]
    assert (orphan["REASON"], orphan["MESSAGE"]) == (
        "ClaimMissing", "the API server refused to create GPUClaim 'orphan-gpus': 403 Forbidden: quota")

