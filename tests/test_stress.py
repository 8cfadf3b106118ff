"""The real-plane stress test, widened (issue 10).

One seeded run of the real `gpuclaimctl run` process (a subprocess, as an
operator starts it) against the test plane, with everything that makes
placement hard at once:

- five kwok nodes (8, 8, 4, 4, 2 GPUs of `example.com/gpu`; nodes 1, 3 and 4
  also offer 4, 2 and 2 of `example.com/other-gpu`) with a label of their
  own, and TWO GPUClasses that count `example.com/gpu` with node selectors
  that overlap (class a: nodes 0, 1, 2, 4; class b: 1, 2, 3, 4);
- two namespaces of pods asking, in sets of 1-4 entries over both classes,
  for inline claims, template claims (GPUClaimTemplate) and user GPUClaims
  that several gated pods name (one pod at a time may use one; Release and
  Retain), plus two Jobs whose pods complete (finished pods); far more GPUs
  asked than there are;
- churn: released pods (and now and then a gated one) deleted, new pods
  created, some under the name of a pod deleted before (as a StatefulSet
  does: the old pod's template claims bear the new pod's claim names), all
  through the run;
- the controller stopped (SIGSTOP) for a few seconds during the first
  placements and continued, so it goes on from caches behind the server;
  one class deleted and recreated (same name, same resourceName) a few
  seconds later; the controller killed with SIGKILL and restarted;
- the other class's `spec.resourceName` edited to `example.com/other-gpu`
  mid-run (issue 43), while claims of it are Bound and pods naming them are
  still synced: each namespace has a Retain claim of that class (`keep`)
  that a pod holds from the start and, after the edit, pods name in turn
  (the last one deleted, the next created), so the controller keeps it on
  its node for each new pod. A claim that stays keeps the resource it was
  bound with (DESIGN §4); one that binds or moves takes the new one, which
  only three nodes offer;
- GPU budgets tighter than capacity (issue 13), in the same run: both
  namespaces have GPUBudgets, with limits per class and for all classes
  ("*"), the first namespace two of them (each must allow a placement);
  the all-class limits sum to 22 of the 26 GPUs. The budget run shares the
  shape rather than adding one: a run of its own would cost another ~45 s,
  and every hard part above (a stalled controller, SIGKILL, a class gone,
  churn freeing GPUs that wake the namespace's pods) is what could take a
  namespace over its limit. The cluster as a whole no longer fills, but
  nodes still do (binpack fills the most allocated node first, and the
  classes split the nodes), so I1 is still tested at every node's edge.
  The run fails if no limit was ever full (the budgets tested nothing).

A sampler thread lists every GPUClaim of the cluster (and the nodes) over
and over for the whole run and checks I1 on each list (one list is one
resourceVersion, so one consistent state): per node and resource, each
claim that holds GPUs counted under the resource recorded at its bind
(`status.resourceName`; the class's, as the test knew it when the sampler
first saw the claim hold GPUs, only for a claim that records none). Between
two lists it checks that a claim which cannot have let go in between
(Retain, or reserved for the same pod in both) still holds the resource it
held, and counts the keeps after the edit (a claim bound before it,
still on its node, reserved for a pod it was not reserved for then; the
run fails if there was none: the edit tested nothing). On the same list it
checks that the GPUs held in each namespace (claims Bound, or Lost and
still reserved) of the classes a limit covers never pass the limit (the
budgets never change during the run, so the test knows them). Once the
run has settled (no claim's phase, node or reservations and no pod's
gate, node or phase changed for QUIET seconds, bounded by QUIET_MAX) it
checks I2, I4 and a few cleanup rules of DESIGN §2/§5 on a fresh list,
that every gated pod waiting on Budget or Capacity waits for a true
reason, that each budget's status.used is what its namespace holds, and
that the controller went idle within the same bound: nothing of ours
written for QUIET seconds (one that keeps rewriting conditions forever is
in a loop, not working off a backlog). The `check_*` functions are pure,
so that `test_each_check_trips_on_a_hand_made_violation` and
`test_each_budget_check_trips_on_a_hand_made_violation` show every one can
fail.

The seed fixes the workload (sets, names, when the class goes, when the
other is edited and the controller dies); the interleaving with the
controller is the machine's. It is printed and taken from
GPUCLAIMCTL_STRESS_SEED when set:

    GPUCLAIMCTL_STRESS_SEED=1234 .venv/bin/pytest -x -q -p no:cacheprovider -s tests/test_stress.py
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.model import api
from tests.helpers import NOT_READY_TAINTS, die_with_parent, free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
SEED_ENV = "GPUCLAIMCTL_STRESS_SEED"
RESOURCE = "example.com/gpu"
# What one class's resourceName is edited to mid-run (issue 43).
RESOURCE2 = "example.com/other-gpu"
GROUP_PATH = f"/apis/{api.GROUP}/{api.VERSION}"
LABEL_KEY = "stress.gpuclaimctl.io/run"
POOL_A, POOL_B = "stress.gpuclaimctl.io/pool-a", "stress.gpuclaimctl.io/pool-b"

# (node prefix, GPUs, offers class a, offers class b, GPUs of RESOURCE2): the
# selectors overlap on nodes 1, 2 and 4, the only ones where a set over both
# classes can go. After the edit the edited class has 6 or 8 GPUs on two or
# three nodes: nodes fill, and a claim bound before it on a node without
# RESOURCE2 may stay there, but nothing of its class binds there after it.
NODES = (("st0", 8, True, False, 0), ("st1", 8, True, True, 4), ("st2", 4, True, True, 0),
         ("st3", 4, False, True, 2), ("st4", 2, True, True, 2))
# Per namespace: user claims several pods name, (class key, count, policy).
USER_CLAIMS = {"u0": ("a", 1, "Release"), "u1": ("b", 2, "Release"),
               "u2": ("a", 1, "Retain"), "u3": ("b", 1, "Retain")}
# Per namespace: a Retain claim of the edited class (1 GPU) that only the
# keep chain names, one pod at a time.
KEEP_CLAIM = "keep"
# Per namespace: templates, (class key, count).
TEMPLATES = {"ta1": ("a", 1), "ta2": ("a", 2), "tb1": ("b", 1), "tb2": ("b", 2)}
MAX_SET = 8  # GPUs in one set: the biggest node
# Per namespace (in run.namespaces' order): GPUBudget name -> {class key or
# "*": GPUs}. The "*" limits sum to 22 of the 26 GPUs: budgets bind before
# the cluster fills. The first namespace (65% of the pods) has two budgets.
BUDGETS = ({"team": {"a": 9, "*": 13}, "b-cap": {"b": 6}}, {"team": {"*": 9}})
ALL_CLASSES = "*"

INITIAL_PODS = 44
JOBS = 2  # in the first namespace, 2 completions each, one pod at a time
CHURN_UNTIL = 24.0  # seconds after the workload starts
# The class edit comes after the first placements and the other class's
# delete (4-8 s), before or around the SIGKILL (12-17 s); the keep claims
# are passed on to a new pod 0.5-1.5 s after it and then every 2.5-3.5 s
# until 2 s before the churn ends: up to 4-5 keeps per namespace.
EDIT_FROM, EDIT_TO = 8.5, 11.0
# Settling takes ~5 s after the churn with a controller in good health on
# this machine; QUIET_MAX leaves a slow one room and keeps the run < 120 s.
QUIET, QUIET_MAX = 4.0, 45.0
READY_TIMEOUT = 60.0

Obj = dict[str, Any]


# -- the checks: pure, on what one list returned --------------------------------------------


def _status(o: Mapping[str, Any]) -> Mapping[str, Any]:
    return o.get("status") or {}


def _meta(o: Mapping[str, Any]) -> Mapping[str, Any]:
    return o.get("metadata") or {}


def _cid(c: Mapping[str, Any]) -> str:
    return f"{_meta(c).get('namespace')}/{_meta(c).get('name')}"


def _reserved(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(_status(c).get("reservedFor") or ())


def holds_gpus(c: Mapping[str, Any]) -> bool:
    """A claim that holds GPUs on its node for I1: Bound, or Lost and still reserved."""
    phase = _status(c).get("phase")
    return bool(_status(c).get("nodeName")) and (
        phase == api.Phase.BOUND or (phase == api.Phase.LOST and bool(_reserved(c))))


def allocatable_of(nodes: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(node, resource) -> allocatable, from listed nodes."""
    out: dict[tuple[str, str], int] = {}
    for n in nodes:
        for res, qty in (_status(n).get("allocatable") or {}).items():
            if "/" in res and str(qty).isdigit():  # extended resources are whole numbers
                out[(str(_meta(n)["name"]), res)] = int(qty)
    return out


def held_resource(c: Mapping[str, Any], resource_at_bind: Callable[[Mapping[str, Any]], str]) -> str:
    """The resource a claim that holds GPUs counts under: the one recorded at
    its bind (`status.resourceName`), which it keeps while it stays bound
    whatever its class says now (DESIGN §4); `resource_at_bind(claim)` only
    for a claim that records none."""
    return str(_status(c).get("resourceName") or resource_at_bind(c))


def check_i1(claims: Iterable[Mapping[str, Any]], allocatable: Mapping[tuple[str, str], int],
             resource_at_bind: Callable[[Mapping[str, Any]], str]) -> list[Overcommit]:
    """I1: per node (of ours) and resource, the GPUs claims hold <= allocatable.

    Each claim counts under `held_resource`: what the API says it holds, not
    what its class says now (an edited class changes nothing a bound claim
    holds). `resource_at_bind(claim)`, asked only for a claim whose status
    records no resource, is its class's resourceName as the test knew it
    when the claim was bound, not as the API shows it now: deleting or
    editing a class changes nothing here either.
    """
    nodes = {n for n, _ in allocatable}
    used: dict[tuple[str, str], int] = defaultdict(int)
    who: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in claims:
        node = _status(c).get("nodeName")
        if node not in nodes or not holds_gpus(c):
            continue
        key = (str(node), held_resource(c, resource_at_bind))
        count = int((c.get("spec") or {}).get("count") or 0)
        used[key] += count
        pods = ",".join(str(r.get("name")) for r in _reserved(c)) or "-"
        unrecorded = "" if _status(c).get("resourceName") else ", resource unrecorded"
        who[key].append(f"{_cid(c)}={count}({_status(c).get('phase')}, class "
                        f"{(c.get('spec') or {}).get('className')}{unrecorded}, uid "
                        f"{str(_meta(c).get('uid'))[:8]}, for {pods})")
    out = []
    for key, n in sorted(used.items()):
        have = allocatable.get(key, 0)
        if n > have:
            out.append(Overcommit(key[0], key[1], n, have, sorted(who[key])))
    return out


class Overcommit(str):
    """One I1 failure: its text, and the figures behind it."""

    node: str
    resource: str
    over: int

    def __new__(cls, node: str, resource: str, held: int, allocatable: int,
                claims: list[str]) -> Overcommit:
        self = super().__new__(cls, f"node {node} {resource}: {held} GPUs held > allocatable "
                                    f"{allocatable} (over by {held - allocatable}); claims: "
                                    f"{'; '.join(claims)}")
        self.node, self.resource, self.over = node, resource, held - allocatable
        return self


# What one list shows of a claim that holds GPUs: (node, status.resourceName
# or "", reclaimPolicy, uids of the pods reserving it).
Held = tuple[str, str, str, frozenset[str]]


def held_by_uid(claims: Iterable[Mapping[str, Any]]) -> dict[str, Held]:
    """claim uid -> what it holds, for the claims that hold GPUs (holds_gpus)."""
    return {str(_meta(c).get("uid")): (str(_status(c).get("nodeName")),
                                       str(_status(c).get("resourceName") or ""),
                                       str((c.get("spec") or {}).get("reclaimPolicy") or "Release"),
                                       frozenset(str(r.get("uid")) for r in _reserved(c)))
            for c in claims if holds_gpus(c)}


def check_resource_kept(before: Mapping[str, Held], claims: Iterable[Mapping[str, Any]]) -> list[str]:
    """DESIGN §4: a bound claim keeps the resource it was bound with for as
    long as it holds GPUs. `before` is `held_by_uid` of the previous list.

    A claim that holds GPUs on the same node in both lists and recorded a
    resource in both must record the same one, if it cannot have let go in
    between: a Retain claim (it lets go only by moving, and a move there and
    back between two lists is two decisions of the set) or one reserved for
    the same pod in both (a Release claim lets go only when its pod goes). A
    Release claim whose pod went may have been released and bound anew in
    between, under its class's new resource, and is not judged; nor is one
    that recorded no resource before (the claim sync records one)."""
    def short(uids: frozenset[str]) -> list[str] | str:
        return sorted(u[:8] for u in uids) or "-"

    by_uid = {str(_meta(c).get("uid")): c for c in claims}
    out = []
    for uid, (node, resource, policy, pods) in held_by_uid(by_uid.values()).items():
        was = before.get(uid)
        if was is None or was[0] != node or not was[1] or not resource or was[1] == resource:
            continue
        if policy == "Retain" or was[3] & pods:
            c = by_uid[uid]
            out.append(f"claim {_cid(c)} ({policy}, class {(c.get('spec') or {}).get('className')}, "
                       f"uid {uid[:8]}) held {was[1]} on {node} for pods {short(was[3])} and now "
                       f"holds {resource} there for pods {short(pods)}: rewritten while bound")
    return out


# (namespace, budget, className or "*", GPUs): one limit, as the test defined it.
Limit = tuple[str, str, str, int]


def held_per_class(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(namespace, className) -> GPUs its claims hold (holds_gpus, any node)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for c in claims:
        if holds_gpus(c):
            spec = c.get("spec") or {}
            out[(str(_meta(c).get("namespace")), str(spec.get("className")))] += int(spec.get("count") or 0)
    return out


def covered(held: Mapping[tuple[str, str], int], ns: str, cls: str) -> int:
    """What a limit of `ns` on `cls` ("*": every class) counts of `held`."""
    return sum(n for (n_ns, n_cls), n in held.items() if n_ns == ns and cls in (ALL_CLASSES, n_cls))


def check_budgets_held(claims: Iterable[Mapping[str, Any]], limits: Iterable[Limit]) -> list[BudgetOver]:
    """Per limit: the GPUs its namespace's claims of the classes it covers hold <= its GPUs."""
    claims = list(claims)
    held = held_per_class(claims)
    out = []
    for ns, budget, cls, gpus in limits:
        n = covered(held, ns, cls)
        if n > gpus:
            who = sorted(f"{_cid(c)}={(c.get('spec') or {}).get('count')}({_status(c).get('phase')} on "
                         f"{_status(c).get('nodeName')}, class {(c.get('spec') or {}).get('className')})"
                         for c in claims if holds_gpus(c) and _meta(c).get("namespace") == ns
                         and cls in (ALL_CLASSES, (c.get("spec") or {}).get("className")))
            out.append(BudgetOver(ns, budget, cls, n, gpus, who))
    return out


def budget_refusal(ns: str, asks: Iterable[tuple[str, int]], held: Mapping[tuple[str, str], int],
                   limits: Iterable[Limit]) -> str | None:
    """The first limit of `ns` that held GPUs plus `asks` (className, GPUs)
    would pass, in words; None when every limit allows them."""
    asks = list(asks)
    for l_ns, budget, cls, gpus in limits:
        needs = sum(n for c, n in asks if cls in (ALL_CLASSES, c))
        if l_ns == ns and needs and covered(held, ns, cls) + needs > gpus:
            return f"{ns}/{budget} allows {gpus} of {cls}, {covered(held, ns, cls)} held, needs {needs}"
    return None


class BudgetOver(str):
    """One budget failure: its text, and the figures behind it."""

    key: tuple[str, str, str]
    over: int

    def __new__(cls, ns: str, budget: str, class_name: str, held: int, gpus: int,
                claims: list[str]) -> BudgetOver:
        self = super().__new__(cls, f"GPUBudget {ns}/{budget} {class_name}: {held} GPUs held > limit "
                                    f"{gpus} (over by {held - gpus}); claims: {'; '.join(claims)}")
        self.key, self.over = (ns, budget, class_name), held - gpus
        return self


def pod_claim_names(pod: Mapping[str, Any]) -> set[str] | None:
    """The claims a pod names in its annotation (None when it is not a usable list).

    Names are short in this test, so a template or inline entry's claim is
    `<pod>-<entry>` without the cut-and-hash of long names."""
    text = (_meta(pod).get("annotations") or {}).get(api.CLAIMS_ANNOTATION)
    try:
        entries = json.loads(text) if text else None
    except (ValueError, RecursionError):  # RecursionError: "[[[[...]]]]" nested deep
        return None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and ("claim" in e or "name" in e)
                                                for e in entries):
        return None
    name = _meta(pod).get("name")
    return {str(e["claim"]) if "claim" in e else f"{name}-{e['name']}" for e in entries}


def is_template_claim(c: Mapping[str, Any]) -> bool:
    return (_meta(c).get("labels") or {}).get(api.TEMPLATE_CLAIM_LABEL) == api.TEMPLATE_CLAIM_LABEL_VALUE


def controller_owner(c: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in _meta(c).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Pod":
            return dict(ref)
    return None


def finished(pod: Mapping[str, Any]) -> bool:
    return _status(pod).get("phase") in ("Succeeded", "Failed")


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == api.SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def _pods_by_key(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(str(_meta(p).get("namespace")), str(_meta(p).get("name"))): p for p in pods}


def check_reservations(claims: Iterable[Mapping[str, Any]],
                       pods: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(I2 failures, I4 failures) about status.reservedFor, once quiet.

    I2: at most one pod; that pod names the claim in its annotation; a
    template claim is reserved only by its owner (controller reference).
    I4: no reservation for a pod that is gone, replaced (other uid) or
    finished. `pods` are all pods of the claims' namespaces.
    """
    by_key = _pods_by_key(pods)
    i2: list[str] = []
    i4: list[str] = []
    for c in claims:
        ns = str(_meta(c).get("namespace"))
        res = _reserved(c)
        if len(res) > 1:
            i2.append(f"claim {_cid(c)} is reserved for {len(res)} pods: "
                      f"{[(r.get('name'), r.get('uid')) for r in res]}")
        for r in res:
            pod = by_key.get((ns, str(r.get("name"))))
            if pod is None:
                i4.append(f"claim {_cid(c)} ({_status(c).get('phase')} on "
                          f"{_status(c).get('nodeName')}) is reserved for pod {r.get('name')} "
                          f"(uid {r.get('uid')}), which is gone")
                continue
            if _meta(pod).get("uid") != r.get("uid"):
                i4.append(f"claim {_cid(c)} is reserved for pod {r.get('name')} uid {r.get('uid')}, "
                          f"but that pod is now uid {_meta(pod).get('uid')} (replaced)")
                continue
            if finished(pod):
                i4.append(f"claim {_cid(c)} is reserved for pod {r.get('name')}, which is "
                          f"{_status(pod).get('phase')}")
            names = pod_claim_names(pod)
            if names is None or _meta(c).get("name") not in names:
                i2.append(f"claim {_cid(c)} is reserved for pod {r.get('name')}, whose annotation "
                          f"does not name it (names {sorted(names or ())})")
            if is_template_claim(c):
                owner = controller_owner(c)
                if owner is None or owner.get("uid") != r.get("uid"):
                    i2.append(f"template claim {_cid(c)} (uid {_meta(c).get('uid')}) is reserved "
                              f"for pod {r.get('name')} uid {r.get('uid')}, not its owner "
                              f"{(owner or {}).get('name')} uid {(owner or {}).get('uid')}")
    return i2, i4


def check_released_pods(claims: Iterable[Mapping[str, Any]],
                        pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """A pod the controller released (no gate, bound to or pinned for a node,
    not finished, not being deleted) holds its whole set: every claim it
    names exists, is Bound on the pod's node and reserved for it. Otherwise
    it runs on GPUs nothing counts: the other side of I1."""
    by_name = {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c for c in claims}
    out = []
    for p in pods:
        names = pod_claim_names(p)
        if gated(p) or finished(p) or _meta(p).get("deletionTimestamp") or not names:
            continue
        ns, pod = str(_meta(p).get("namespace")), str(_meta(p).get("name"))
        node = (p.get("spec") or {}).get("nodeName") or (
            (_meta(p).get("annotations") or {}).get(api.PLACED_NODE_ANNOTATION))
        for name in sorted(names):
            c = by_name.get((ns, name))
            if c is None:
                out.append(f"released pod {ns}/{pod} (node {node}) names claim {name}, which is gone")
                continue
            st = _status(c)
            mine = any(r.get("uid") == _meta(p).get("uid") for r in _reserved(c))
            if st.get("phase") != api.Phase.BOUND or st.get("nodeName") != node or not mine:
                out.append(f"released pod {ns}/{pod} on {node}: its claim {name} is "
                           f"{st.get('phase')} on {st.get('nodeName')} reserved for "
                           f"{[r.get('name') for r in _reserved(c)]}")
    return out


def check_cleanup(claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """DESIGN §2/§5 once quiet: a template claim whose owner pod is gone,
    replaced or finished is deleted; a Release claim nobody uses is not Bound."""
    by_key = _pods_by_key(pods)
    out = []
    for c in claims:
        ns = str(_meta(c).get("namespace"))
        if is_template_claim(c):
            owner = controller_owner(c)
            pod = by_key.get((ns, str((owner or {}).get("name"))))
            if owner is None or pod is None or _meta(pod).get("uid") != owner.get("uid") or finished(pod):
                why = ("has no owner" if owner is None else "gone" if pod is None else
                       "replaced" if _meta(pod).get("uid") != owner.get("uid") else
                       _status(pod).get("phase"))
                deleting = (f", deleted at {_meta(c)['deletionTimestamp']} with finalizers "
                            f"{_meta(c).get('finalizers')}" if _meta(c).get("deletionTimestamp") else "")
                out.append(f"template claim {_cid(c)} ({_status(c).get('phase')}{deleting}) still "
                           f"exists; its pod {(owner or {}).get('name')} is {why}")
                continue
        policy = (c.get("spec") or {}).get("reclaimPolicy") or "Release"
        if (policy == "Release" and _status(c).get("phase") == api.Phase.BOUND and not _reserved(c)
                and not _meta(c).get("deletionTimestamp")):
            out.append(f"Release claim {_cid(c)} is Bound on {_status(c).get('nodeName')} "
                       f"with nobody reserving it")
    return out


def node_usable(node: Mapping[str, Any]) -> bool:
    """Ready, schedulable, without the not-ready taints."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or any(t.get("key") in NOT_READY_TAINTS for t in spec.get("taints") or ()):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in _status(node).get("conditions") or ())


def _parse_time(text: str) -> float:
    return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def check_gated_pods(claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                     nodes: Iterable[Mapping[str, Any]], classes: Mapping[str, Mapping[str, Any]],
                     templates: Mapping[tuple[str, str], Mapping[str, Any]],
                     now: float, limits: Iterable[Limit] = ()) -> list[str]:
    """I4, 'every pod whose set fits somewhere is released', kept simple.

    For each gated pod (not being deleted) whose annotation parses:
    - each entry's (class, count) comes from its claim if it exists, else
      from its template (`templates[(ns, name)]`, a claim spec) or the entry;
    - the pod may legitimately wait, and is skipped, when a claim it names
      is reserved for another pod (ClaimInUse), is missing (user claim), is
      under its template claim's name but an older pod's (NameTaken), a
      class it needs does not exist (or is being deleted), or a limit of
      its namespace (`limits`) would not allow the claims of its set that
      hold nothing yet (Budget);
    - claims already holding GPUs (Bound) need nothing more on their node
      and their full count anywhere else: a set stays on its anchor node
      while that has room for the rest, and moves as a whole to a node with
      room for all of it when the anchor has not (issue 10, item 7);
    - a candidate node is usable (Ready, schedulable, not tainted
      not-ready), matches the nodeSelector of every class the set needs,
      has the class's resource (as the class says now) of every claim not
      held there, and is not in any claim's unexpired rejectedNodes; a
      claim held there stays, with the resource it holds, whether or not
      the node offers its class's resource now (DESIGN §4);
    - free(node, resource) = allocatable - GPUs held there (holds_gpus,
      every claim listed, all namespaces), each claim under the resource
      its status records (its class's for one that records none).
    It fails when, on some candidate node, the GPUs the set still needs
    there, per resource, all fit in what is free.
    """
    claims = list(claims)
    by_name: dict[tuple[str, str], Mapping[str, Any]] = {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c for c in claims}
    alloc = allocatable_of(nodes)
    held: dict[tuple[str, str], int] = defaultdict(int)
    for h in claims:
        if holds_gpus(h):
            res = held_resource(h, lambda c: (classes.get(str((c.get("spec") or {}).get("className")))
                                              or {}).get("resource", RESOURCE))
            held[(str(_status(h)["nodeName"]), res)] += int((h.get("spec") or {}).get("count") or 0)
    nodes = [n for n in nodes if node_usable(n)]
    limits = list(limits)
    held_ns = held_per_class(claims)
    out = []
    for p in pods:
        if not gated(p) or _meta(p).get("deletionTimestamp"):
            continue
        ns, pod, uid = str(_meta(p).get("namespace")), str(_meta(p).get("name")), _meta(p).get("uid")
        try:
            entries = json.loads((_meta(p).get("annotations") or {}).get(api.CLAIMS_ANNOTATION) or "")
        except ValueError:
            continue
        # (class, its resource, count, node it holds GPUs on or None), per claim of the set
        parts: list[tuple[str, str, int, str | None]] = []
        asks: list[tuple[str, int]] = []  # (class, GPUs) of the claims that hold nothing yet
        rejected: set[str] = set()
        legit = ""
        for e in entries:
            name = str(e["claim"]) if "claim" in e else f"{pod}-{e['name']}"
            c = by_name.get((ns, name))
            spec: Mapping[str, Any]
            if c is not None and "claim" not in e and (controller_owner(c) or {}).get("uid") != uid:
                legit = legit or f"claim {name} is an older pod's (NameTaken)"
                continue
            if c is not None:
                spec = c.get("spec") or {}
                for r in _reserved(c):
                    if r.get("uid") != uid:
                        legit = legit or f"claim {name} in use by {r.get('name')}"
                for rej in _status(c).get("rejectedNodes") or ():
                    if _parse_time(str(rej.get("until") or "1970-01-01T00:00:00Z")) > now:
                        rejected.add(str(rej.get("nodeName")))
            elif "claim" in e:
                legit = legit or f"claim {name} missing"
                continue
            elif "template" in e:
                spec = templates.get((ns, str(e["template"]))) or {}
            else:
                spec = {"className": e.get("className"), "count": e.get("count")}
            cls = classes.get(str(spec.get("className")))
            if cls is None or cls.get("deleting"):
                legit = legit or f"class {spec.get('className')} missing or deleting"
                continue
            on = str(_status(c)["nodeName"]) if c is not None and holds_gpus(c) else None
            parts.append((str(spec.get("className")), str(cls["resource"]), int(spec.get("count") or 0), on))
            if on is None:
                asks.append((str(spec.get("className")), int(spec.get("count") or 0)))
        if not legit and limits:
            legit = budget_refusal(ns, asks, held_ns, limits) or ""
        if legit:
            continue
        for n in nodes:
            node = str(_meta(n)["name"])
            labels = _meta(n).get("labels") or {}
            if node in rejected:
                continue
            if not all(all(labels.get(k) == v for k, v in (classes[cls_name].get("selector") or {}).items())
                       and (on == node or (node, res) in alloc) for cls_name, res, _, on in parts):
                continue
            need: dict[str, int] = defaultdict(int)
            for _, res, count, on in parts:
                if on != node:
                    need[res] += count
            free = {res: alloc.get((node, res), 0) - held[(node, res)] for res in need}
            if all(k <= free[res] for res, k in need.items()):
                anchors = sorted({on for _, _, _, on in parts if on})
                out.append(f"gated pod {ns}/{pod} fits on node {node}: needs {dict(need)} more "
                           f"there, free {free}" + (f" (its bound claims are on {anchors})" if anchors else ""))
                break
    return out


def pod_asks(pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]],
             templates: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(className, GPUs) of the claims of a pod's set that hold nothing yet:
    what a placement would add to its namespace's budgets. A claim that does
    not exist yet counts as its template or inline entry says."""
    ns, pod_name = str(_meta(pod).get("namespace")), str(_meta(pod).get("name"))
    by_name = {str(_meta(c).get("name")): c for c in claims if _meta(c).get("namespace") == ns}
    try:
        entries = json.loads((_meta(pod).get("annotations") or {}).get(api.CLAIMS_ANNOTATION) or "")
    except ValueError:
        return []
    out = []
    for e in entries:
        c = by_name.get(str(e["claim"]) if "claim" in e else f"{pod_name}-{e['name']}")
        if c is not None and holds_gpus(c):
            continue
        spec = (c.get("spec") if c is not None else None) or (
            templates.get((ns, str(e["template"]))) if "template" in e else e) or {}
        out.append((str(spec.get("className")), int(spec.get("count") or 0)))
    return out


def own_wait(pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """Why a gated pod waits: the Waiting condition (reason, message) of the
    first claim of its set, in annotation order, that is its own (a template
    or inline claim it owns). A user claim that several pods name carries the
    wait of whichever of them was decided last, so it does not tell."""
    ns, uid = str(_meta(pod).get("namespace")), _meta(pod).get("uid")
    by_name = {str(_meta(c).get("name")): c for c in claims if _meta(c).get("namespace") == ns}
    try:
        entries = json.loads((_meta(pod).get("annotations") or {}).get(api.CLAIMS_ANNOTATION) or "")
    except ValueError:
        return None
    for e in entries:
        c = by_name.get(f"{_meta(pod).get('name')}-{e['name']}") if "claim" not in e else None
        if c is None or (controller_owner(c) or {}).get("uid") != uid:
            continue
        for cond in _status(c).get("conditions") or ():
            if cond.get("type") == api.CONDITION_WAITING and cond.get("status") == "True":
                return str(cond.get("reason")), str(cond.get("message"))
    return None


def check_waiting_reasons(claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                          nodes: Iterable[Mapping[str, Any]], classes: Mapping[str, Mapping[str, Any]],
                          templates: Mapping[tuple[str, str], Mapping[str, Any]], limits: Iterable[Limit],
                          now: float) -> tuple[list[str], Counter[str]]:
    """Once quiet, every gated pod that waits on Budget or Capacity (as its
    own claims say, `own_wait`) waits for a true reason:
    - Budget: a limit of its namespace would be passed by the claims of its
      set that hold nothing yet (held + asks > limit);
    - Capacity: no node has room for its set. A pod waiting on Capacity in
      a namespace also at its limit is fine as long as no node has room
      either (both are true: the reason is the one of its last decision,
      and another pod filling the namespace's budget wakes nobody); one
      whose set fits somewhere is held by its budget and must say so;
    - BudgetsUnknown (the budget informer not listed yet) never outlasts a
      start.
    A Capacity pod whose budget allows it and whose set fits is I4's
    (check_gated_pods), not reported twice. Returns (failures, how many
    gated pods wait for each reason; `unknown`: no claim of its own says)."""
    claims, nodes, limits = list(claims), list(nodes), list(limits)
    held = held_per_class(claims)
    reasons: Counter[str] = Counter()
    out = []
    for pod in pods:
        if not gated(pod) or _meta(pod).get("deletionTimestamp"):
            continue
        wait = own_wait(pod, claims)
        reasons[wait[0] if wait else "unknown"] += 1
        if wait is None:
            continue
        reason, message = wait
        ns = str(_meta(pod).get("namespace"))
        asks = pod_asks(pod, claims, templates)
        refusal = budget_refusal(ns, asks, held, limits)
        where = f"gated pod {ns}/{_meta(pod).get('name')}"
        if reason == api.WaitReason.BUDGETS_UNKNOWN:
            out.append(f"{where} still waits on BudgetsUnknown: {message}")
        elif reason == api.WaitReason.BUDGET and refusal is None:
            out.append(f"{where} waits on Budget, but every limit allows its set {asks}: {message}")
        elif reason == api.WaitReason.CAPACITY and refusal is not None:
            fits = check_gated_pods(claims, [pod], nodes, classes, templates, now)
            if fits:
                out.append(f"{where} waits on Capacity, but its budget holds it ({refusal}), not "
                           f"capacity: {fits[0]}")
    return out, reasons


def check_budget_status(budgets: Iterable[Mapping[str, Any]],
                        claims: Iterable[Mapping[str, Any]]) -> list[str]:
    """Once quiet (nothing in flight), each budget's status.used is what its
    namespace holds per limit, and its Exceeded condition is False (the
    limits never change, so use never passes them)."""
    held = held_per_class(claims)
    out = []
    for b in budgets:
        ns, name = str(_meta(b).get("namespace")), str(_meta(b).get("name"))
        want = [{"className": lim["className"], "gpus": covered(held, ns, lim["className"])}
                for lim in (b.get("spec") or {}).get("limits") or ()]
        got = _status(b).get("used")
        exceeded = [c.get("status") for c in _status(b).get("conditions") or () if c.get("type") == "Exceeded"]
        if got != want or exceeded != ["False"]:
            out.append(f"GPUBudget {ns}/{name}: status.used {got}, Exceeded {exceeded}; the claims hold {want}")
    return out


def essentials(o: Mapping[str, Any]) -> str:
    """What the invariants read of a claim or pod; a change here is not quiet."""
    st, m = _status(o), _meta(o)
    deleting = bool(m.get("deletionTimestamp"))
    if "className" in (o.get("spec") or {}):
        return repr((m.get("uid"), st.get("phase"), st.get("nodeName"),
                     sorted(str(r.get("uid")) for r in _reserved(o)), deleting))
    return repr((m.get("uid"), gated(o), (o.get("spec") or {}).get("nodeName"), st.get("phase"), deleting))


def brief(o: Mapping[str, Any]) -> str:
    """What changed in a claim or pod, in one line (for 'not quiet')."""
    st = _status(o)
    if "className" in (o.get("spec") or {}):
        waiting = [(c.get("reason"), str(c.get("message"))[:90]) for c in st.get("conditions") or ()
                   if c.get("type") == api.CONDITION_WAITING and c.get("status") == "True"]
        return (f"{st.get('phase')} on {st.get('nodeName')} for "
                f"{[r.get('name') for r in _reserved(o)]} waiting={waiting}")
    return (f"gated={gated(o)} node={(o.get('spec') or {}).get('nodeName')} phase={st.get('phase')}"
            f"{' deleting' if _meta(o).get('deletionTimestamp') else ''}")


# -- the controller process --------------------------------------------------------------------


class Controller:
    """`python -m gpuclaimctl run --no-leader-elect` with a log file; restartable."""

    def __init__(self, kubeconfig: str, log: Path, workers: int = 4) -> None:
        self.kubeconfig, self.log, self.workers = kubeconfig, log, workers
        self.popen: subprocess.Popen[bytes] | None = None
        self.health_port = self.metrics_port = 0
        self.starts = 0

    def start(self) -> None:
        self.health_port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", "gpuclaimctl", "run", "--kubeconfig", self.kubeconfig,
                "--no-leader-elect", "--workers", str(self.workers),
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--health-bind-address", f"127.0.0.1:{self.health_port}",
                # No webhook configurations point here (tests/test_webhook_plane.py serves one).
                "--webhook-bind-address", "0",
                "--resync-period", "0", "-v", "2"]
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"=== start {self.starts}: {' '.join(argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=REPO,
                                          env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1"),
                                          preexec_fn=die_with_parent)

    def ready(self) -> bool:
        assert self.popen is not None
        assert self.popen.poll() is None, f"the controller exited {self.popen.returncode}:\n{self.tail()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def leading(self) -> bool:
        """leader_election_master_status says 1: the one writer of a run
        without leader election leads (GPUClaimCtlNoLeader must not fire)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except (urllib.error.URLError, OSError):
            return False
        return 'leader_election_master_status{name="gpuclaimctl"} 1.0' in body

    def wait_ready(self) -> None:
        wait_for(self.ready, timeout=READY_TIMEOUT, interval=0.1,
                 message=lambda: f"the controller's /readyz; its log:\n{self.tail()}")

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP / SIGCONT: a process that stalls (a long GC pause, a starved
        CPU) and then goes on from caches seconds behind the API server."""
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(30)

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def distinct_tail(self, lines: int = 12) -> str:
        """The last `lines` distinct messages (timestamps cut), with how often each came."""
        if not self.log.exists():
            return ""
        seen: dict[str, int] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            msg = line.split(" ", 1)[-1]
            seen[msg] = seen.pop(msg, 0) + 1  # re-inserted: dict order is last seen
        return "\n".join(f"{n:5d}x {msg}" for msg, n in list(seen.items())[-lines:])

    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback") if self.log.exists() else 0


# -- the run -----------------------------------------------------------------------------------


def _seed() -> int:
    text = os.environ.get(SEED_ENV)
    return int(text) if text else random.SystemRandom().randrange(1, 10**6)


@dataclass(frozen=True)
class ClassEdit:
    """A class's resourceName edited mid-run, and what it hit."""

    at: float  # run time of the edit
    class_name: str
    old: str
    new: str
    # claim uid -> (namespace/name, node, status.resourceName, uids of the
    # pods reserving it) for every claim of the class that held GPUs just
    # before the edit
    bound: Mapping[str, tuple[str, str, str, frozenset[str]]]


class Run:
    """The workload: its objects, its clock, its timeline."""

    def __init__(self, api_client: client.ApiClient, namespaces: list[str], tag: str,
                 rng: random.Random) -> None:
        self.api, self.namespaces, self.tag, self.rng = api_client, namespaces, tag, rng
        self.classes = {"a": f"stress-a-{tag}", "b": f"stress-b-{tag}"}
        # class key -> its resourceName as the test last set it
        self.resources = {"a": RESOURCE, "b": RESOURCE}
        self.edit: ClassEdit | None = None
        # namespace -> the last pod of the keep chain (it names KEEP_CLAIM alone)
        self.keep_holders: dict[str, str] = {}
        self.label = {LABEL_KEY: tag}
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, str]] = []
        self.phase = "setup"
        self.seq = 0
        self.created: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []
        self.manifests: dict[tuple[str, str], Obj] = {}
        # Deleted pods to create again under the same name (as a StatefulSet
        # would): the old pod's template claims have the new pod's claim names.
        self.reuse: list[tuple[str, str]] = []
        self.recreated = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def short(self, cid: str) -> str:
        """namespace/name with the namespace as the report calls it (ns-a, ns-b)."""
        ns, _, name = cid.partition("/")
        return f"{('ns-a', 'ns-b')[self.namespaces.index(ns)] if ns in self.namespaces else ns}/{name}"

    def event(self, what: str) -> None:
        """Record a step; the UTC time matches it with the controller's log."""
        wall = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        self.timeline.append((self.now(), f"{what} ({wall}Z)"))
        self.phase = what
        print(f"[stress] t={self.now():6.2f}s {wall}Z {what}", flush=True)

    def class_body(self, key: str) -> Obj:
        pool = POOL_A if key == "a" else POOL_B
        return {"apiVersion": api.API_VERSION, "kind": api.CLASS_KIND,
                "metadata": {"name": self.classes[key]},
                "spec": {"resourceName": self.resources[key], "nodeSelector": {**self.label, pool: "true"}}}

    def create_class(self, key: str) -> None:
        kube.request(self.api, "POST", f"{GROUP_PATH}/gpuclasses", body=self.class_body(key))

    def delete_class(self, key: str) -> None:
        kube.request(self.api, "DELETE", f"{GROUP_PATH}/gpuclasses/{self.classes[key]}")

    def resource_of(self, class_name: str) -> str:
        """A class's resourceName as the test last set it."""
        return next((self.resources[k] for k, n in self.classes.items() if n == class_name), RESOURCE)

    def edit_class(self, key: str, resource: str) -> ClassEdit:
        """Edit the class's spec.resourceName; what held GPUs of it just before."""
        name = self.classes[key]
        bound = {str(_meta(c)["uid"]): (_cid(c), str(_status(c)["nodeName"]),
                                         str(_status(c).get("resourceName") or ""),
                                         frozenset(str(r.get("uid")) for r in _reserved(c)))
                 for c in self.claims() if (c.get("spec") or {}).get("className") == name and holds_gpus(c)}
        kube.request(self.api, "PATCH", f"{GROUP_PATH}/gpuclasses/{name}",
                     content_type="application/merge-patch+json", body={"spec": {"resourceName": resource}})
        old, self.resources[key] = self.resources[key], resource
        self.edit = ClassEdit(self.now(), name, old, resource, bound)
        return self.edit

    def keep_pod(self, ns: str) -> tuple[str, Obj]:
        """(namespace, manifest) of a new bare pod naming the keep claim alone."""
        self.seq += 1
        return ns, {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"s{self.seq:03d}", "labels": {"stress": "pod"}, "annotations": {
                        api.CLAIMS_ANNOTATION: json.dumps([{"name": "k", "claim": KEEP_CLAIM}])}},
                    "spec": self.pod_spec()}

    def pass_keep_claims(self) -> list[str]:
        """In each namespace, the keep chain's pod, once released, is deleted
        and the next one created (one whose predecessor still waits is left
        to be kept later). Returns the new pods' names."""
        out = []
        for ns in self.namespaces:
            holder = self.keep_holders.get(ns)
            if holder:
                try:
                    pod = kube.request_json(self.api, "GET", f"/api/v1/namespaces/{ns}/pods/{holder}")
                    if gated(pod):
                        continue
                    kube.request(self.api, "DELETE", f"/api/v1/namespaces/{ns}/pods/{holder}",
                                 body={"gracePeriodSeconds": 0})
                    self.deleted.append((ns, holder))
                except kube.ApiError as e:
                    if e.status != 404:  # the churn deleted it
                        raise
            ns, manifest = self.keep_pod(ns)
            self.create_pod(ns, manifest)
            self.keep_holders[ns] = manifest["metadata"]["name"]
            out.append(self.short(f"{ns}/{manifest['metadata']['name']}"))
        return out

    def setup_namespace(self, ns: str) -> None:
        for name, (key, count, policy) in USER_CLAIMS.items():
            kube.request(self.api, "POST", f"{GROUP_PATH}/namespaces/{ns}/gpuclaims", body={
                "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
                "spec": {"className": self.classes[key], "count": count, "reclaimPolicy": policy}})
        for name, (key, count) in TEMPLATES.items():
            kube.request(self.api, "POST", f"{GROUP_PATH}/namespaces/{ns}/gpuclaimtemplates", body={
                "apiVersion": api.API_VERSION, "kind": api.TEMPLATE_KIND, "metadata": {"name": name},
                "spec": {"spec": {"className": self.classes[key], "count": count}}})
        for name, limits in BUDGETS[self.namespaces.index(ns)].items():
            kube.request(self.api, "POST", f"{GROUP_PATH}/namespaces/{ns}/{api.BUDGET_PLURAL}", body={
                "apiVersion": api.API_VERSION, "kind": "GPUBudget", "metadata": {"name": name},
                "spec": {"limits": [{"className": self.classes.get(key, key), "gpus": gpus}
                                    for key, gpus in limits.items()]}})

    def create_keep_claim(self, ns: str, key: str) -> None:
        kube.request(self.api, "POST", f"{GROUP_PATH}/namespaces/{ns}/gpuclaims", body={
            "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": KEEP_CLAIM},
            "spec": {"className": self.classes[key], "count": 1, "reclaimPolicy": "Retain"}})

    def limits(self) -> list[Limit]:
        """Every limit of every budget, as created (they never change)."""
        return [(ns, name, self.classes.get(key, key), gpus)
                for ns, budgets in zip(self.namespaces, BUDGETS)
                for name, limits in budgets.items() for key, gpus in limits.items()]

    def budgets(self) -> list[Obj]:
        out: list[Obj] = []
        for ns in self.namespaces:
            out += kube.request_json(self.api, "GET",
                                     f"{GROUP_PATH}/namespaces/{ns}/{api.BUDGET_PLURAL}")["items"]
        return out

    def template_specs(self) -> dict[tuple[str, str], Obj]:
        return {(ns, name): {"className": self.classes[key], "count": count}
                for ns in self.namespaces for name, (key, count) in TEMPLATES.items()}

    def random_set(self) -> list[Obj]:
        rng = self.rng
        entries: list[Obj] = []
        entry: Obj
        total = 0
        for i in range(rng.choice((1, 1, 2, 2, 3, 4))):
            kind = rng.choices(("inline", "template", "claim"), (4, 3, 2))[0]
            taken = {e.get("claim") for e in entries}
            if kind == "claim" and len(taken - {None}) < 2:
                name = rng.choice(sorted(set(USER_CLAIMS) - taken))
                entry, count = {"name": f"e{i}", "claim": name}, USER_CLAIMS[name][1]
            elif kind == "template":
                name = rng.choice(sorted(TEMPLATES))
                entry, count = {"name": f"e{i}", "template": name}, TEMPLATES[name][1]
            else:
                count = rng.choice((1, 1, 2, 3))
                entry = {"name": f"e{i}", "className": self.classes[rng.choice("ab")], "count": count}
            if total + count > MAX_SET:
                break
            entries.append(entry)
            total += count
        return entries

    def pod_spec(self) -> Obj:
        return {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "busybox",
                                "resources": {"requests": {"cpu": "10m"}}}]}

    def next_pod(self) -> tuple[str, Obj]:
        """(namespace, manifest) of a new bare pod; names are never reused."""
        self.seq += 1
        ns = self.namespaces[0] if self.rng.random() < 0.65 else self.namespaces[1]
        name = f"s{self.seq:03d}"
        return ns, {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": {"stress": "pod"},
                                 "annotations": {api.CLAIMS_ANNOTATION: json.dumps(self.random_set())}},
                    "spec": self.pod_spec()}

    def create_pod(self, ns: str, manifest: Obj) -> None:
        kube.request(self.api, "POST", f"/api/v1/namespaces/{ns}/pods", body=manifest)
        self.created.append((ns, manifest["metadata"]["name"]))
        self.manifests[(ns, manifest["metadata"]["name"])] = manifest

    def create_job(self, ns: str, name: str) -> None:
        spec = self.pod_spec()
        spec["restartPolicy"] = "Never"
        entries = [{"name": "g", "className": self.classes["a"], "count": 1}]
        kube.request(self.api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completions": 2, "parallelism": 1, "backoffLimit": 0,
                     "template": {"metadata": {"annotations": {
                         api.CLAIMS_ANNOTATION: json.dumps(entries)}}, "spec": spec}}})

    def pods(self) -> list[Obj]:
        out: list[Obj] = []
        for ns in self.namespaces:
            out += kube.request_json(self.api, "GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return out

    def claims(self) -> list[Obj]:
        return list(kube.request_json(self.api, "GET", f"{GROUP_PATH}/gpuclaims")["items"])

    def nodes(self) -> list[Obj]:
        return list(kube.request_json(self.api, "GET", "/api/v1/nodes",
                                      query=[("labelSelector", f"{LABEL_KEY}={self.tag}")])["items"])

    def class_infos(self) -> dict[str, Obj]:
        out = {}
        for key, name in self.classes.items():
            try:
                got = kube.request_json(self.api, "GET", f"{GROUP_PATH}/gpuclasses/{name}")
            except kube.ApiError as e:
                if e.status == 404:
                    continue
                raise
            spec = got.get("spec") or {}
            out[name] = {"selector": spec.get("nodeSelector") or {},
                         "resource": spec.get("resourceName") or api.DEFAULT_RESOURCE_NAME,
                         "deleting": bool(_meta(got).get("deletionTimestamp"))}
        return out

    def churn(self) -> None:
        """Delete 1-2 released bare pods (now and then a gated one too) and create
        1-3, now and then one under the name of a pod deleted before."""
        rng = self.rng
        pods = [p for p in self.pods() if (_meta(p).get("labels") or {}).get("stress") == "pod"
                and not _meta(p).get("deletionTimestamp")]
        released = sorted((p for p in pods if not gated(p)), key=lambda p: _meta(p)["name"])
        waiting = sorted((p for p in pods if gated(p)), key=lambda p: _meta(p)["name"])
        victims = rng.sample(released, min(len(released), rng.choice((1, 2))))
        if waiting and rng.random() < 0.25:
            victims.append(rng.choice(waiting))
        for p in victims:
            ns, name = str(_meta(p)["namespace"]), str(_meta(p)["name"])
            try:
                kube.request(self.api, "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                             body={"gracePeriodSeconds": 0})
                self.deleted.append((ns, name))
                if (ns, name) in self.manifests and rng.random() < 0.4:
                    self.reuse.append((ns, name))
            except kube.ApiError as e:
                if e.status != 404:
                    raise
        for _ in range(rng.choice((1, 2, 3))):
            if self.reuse and rng.random() < 0.5:
                ns, name = self.reuse.pop(rng.randrange(len(self.reuse)))
                try:
                    self.create_pod(ns, self.manifests[(ns, name)])
                    self.recreated += 1
                except kube.ApiError as e:
                    if e.status != 409:  # the old pod is not gone yet: later
                        raise
                    self.reuse.append((ns, name))
            else:
                self.create_pod(*self.next_pod())


class Sampler(threading.Thread):
    """Lists every claim and our nodes over and over; checks I1 and the
    budgets' limits on each list, and that bound claims keep their resource
    from one list to the next; counts what the class edit hit."""

    def __init__(self, kubeconfig: str, run: Run) -> None:
        super().__init__(daemon=True, name="i1-sampler")
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.run_ = run
        # (claim uid, node) -> its class's resource as the test knew it when
        # this sampler first saw the claim hold GPUs there (I1's fallback for
        # a claim that records none), for the claims of the last list that do
        self.bound_with: dict[tuple[str, str], str] = {}
        self.stop = threading.Event()
        self.samples = 0
        self.errors: list[str] = []
        self.violation_count = 0
        # (node, resource) -> [first t, last t, samples, max over, t of max, first text]
        self.episodes: dict[tuple[str, str], list[Any]] = {}
        self.seen_bound = 0
        self.limits = run.limits()
        self.budget_violations = 0
        # (namespace, budget, class) -> [first t, last t, samples, max over, t of max, first text]
        self.budget_episodes: dict[tuple[str, str, str], list[Any]] = {}
        # (namespace, budget, class) -> the most GPUs held under the limit in one sample
        self.budget_peak: dict[tuple[str, str, str], int] = {}
        self.held_before: dict[str, Held] = {}  # held_by_uid of the last list
        self.rewrite_count = 0  # samples where check_resource_kept found something
        self.rewrites: list[str] = []  # its findings, the first 20
        # After the class edit: (claim uid, pod uid) -> how a claim that held
        # GPUs of the class before it was kept on its node, under the same
        # resource, for a pod it was not reserved for then
        self.keeps: dict[tuple[str, str], str] = {}
        self.let_go: set[str] = set()  # claims of ClassEdit.bound seen elsewhere, or not holding
        self.bound_new: set[str] = set()  # claims of the class seen holding the new resource

    def resource_at_bind(self, claim: Mapping[str, Any]) -> str:
        key = (str(_meta(claim).get("uid")), str(_status(claim).get("nodeName")))
        return self.bound_with.get(key) or self.run_.resource_of(str((claim.get("spec") or {}).get("className")))

    def track_edit(self, claims: list[Obj], at: float) -> None:
        edit = self.run_.edit
        if edit is None:
            return
        by_uid = {str(_meta(c).get("uid")): c for c in claims}
        for uid, (cid, node, resource, pods) in edit.bound.items():
            if uid in self.let_go:
                continue
            c = by_uid.get(uid)
            if (c is None or not holds_gpus(c) or _status(c).get("nodeName") != node
                    or _status(c).get("resourceName") != resource):
                # Gone, moved, released, or (a Release claim) released and
                # bound anew between two lists: later pods are not keeps.
                self.let_go.add(uid)
                continue
            for r in _reserved(c):
                key = (uid, str(r.get("uid")))
                if key[1] not in pods and key not in self.keeps:
                    self.keeps[key] = f"t={at:.2f}s {cid} kept on {node} under {resource} for pod {r.get('name')}"
        self.bound_new.update(uid for uid, c in by_uid.items() if holds_gpus(c)
                              and (c.get("spec") or {}).get("className") == edit.class_name
                              and _status(c).get("resourceName") == edit.new)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                nodes = kube.request_json(self.api, "GET", "/api/v1/nodes", query=[
                    ("labelSelector", f"{LABEL_KEY}={self.run_.tag}")])["items"]
                listed = kube.request_json(self.api, "GET", f"{GROUP_PATH}/gpuclaims")
            except Exception as e:  # a sampler that dies silently would pass the test
                self.errors.append(f"t={self.run_.now():.1f}s {type(e).__name__}: {e}")
                if len(self.errors) > 20:
                    return
                time.sleep(0.2)
                continue
            at, phase = self.run_.now(), self.run_.phase
            claims = listed["items"]
            self.seen_bound = max(self.seen_bound, sum(holds_gpus(c) for c in claims))
            bound_with = {}
            for c in claims:
                if holds_gpus(c):
                    where = (str(_meta(c).get("uid")), str(_status(c).get("nodeName")))
                    bound_with[where] = self.bound_with.get(where) or self.run_.resource_of(
                        str((c.get("spec") or {}).get("className")))
            self.bound_with = bound_with
            rewritten = check_resource_kept(self.held_before, claims)
            self.held_before = held_by_uid(claims)
            if rewritten:
                self.rewrite_count += 1
                self.rewrites += [f"t={at:.2f}s (list at rv {listed['metadata'].get('resourceVersion')}, "
                                  f"last test event: {phase}): {r}" for r in rewritten][:20 - len(self.rewrites)]
            self.track_edit(claims, at)
            found = check_i1(claims, allocatable_of(nodes), self.resource_at_bind)
            if found:
                self.violation_count += 1
            for v in found:
                ep = self.episodes.setdefault((v.node, v.resource), [
                    at, at, 0, 0, at, f"t={at:.2f}s (list at rv {listed['metadata'].get('resourceVersion')}, "
                                      f"last test event: {phase}): {v}"])
                ep[1], ep[2] = at, ep[2] + 1
                if v.over > ep[3]:
                    ep[3], ep[4] = v.over, at
            held = held_per_class(claims)
            for ns, budget, cls, _ in self.limits:
                key = (ns, budget, cls)
                self.budget_peak[key] = max(self.budget_peak.get(key, 0), covered(held, ns, cls))
            over = check_budgets_held(claims, self.limits)
            if over:
                self.budget_violations += 1
            for b in over:
                ep = self.budget_episodes.setdefault(b.key, [
                    at, at, 0, 0, at, f"t={at:.2f}s (list at rv {listed['metadata'].get('resourceVersion')}, "
                                      f"last test event: {phase}): {b}"])
                ep[1], ep[2] = at, ep[2] + 1
                if b.over > ep[3]:
                    ep[3], ep[4] = b.over, at
            self.samples += 1
            time.sleep(0.02)

    def report(self) -> list[str]:
        out = [f"{self.violation_count} of {self.samples} samples had a node over its allocatable"]
        for (node, res), (first, last, n, over, at, text) in sorted(self.episodes.items(),
                                                                    key=lambda kv: kv[1][0]):
            out.append(f"node {node} {res}: over in {n} samples from t={first:.2f}s to t={last:.2f}s, "
                       f"by up to {over} GPUs (t={at:.2f}s); first seen {text}")
        return out

    def edit_report(self) -> str:
        """What the class edit hit, in one line."""
        edit = self.run_.edit
        if edit is None:
            return "the class was never edited"
        chain = sum(edit.bound[uid][0].endswith(f"/{KEEP_CLAIM}") for uid, _ in self.keeps)
        return (f"class edited at t={edit.at:.2f}s, {edit.old} -> {edit.new}: {len(edit.bound)} claims of it "
                f"held GPUs then, {len(self.keeps)} keeps after it ({chain} of the keep claims), "
                f"{len(self.bound_new)} claims of it seen holding {edit.new}")

    def budget_report(self) -> list[str]:
        out = [f"{self.budget_violations} of {self.samples} samples had a namespace over a limit"]
        for (ns, budget, cls), (first, last, n, over, at, text) in sorted(self.budget_episodes.items(),
                                                                          key=lambda kv: kv[1][0]):
            out.append(f"GPUBudget {ns}/{budget} {cls}: over in {n} samples from t={first:.2f}s to "
                       f"t={last:.2f}s, by up to {over} GPUs (t={at:.2f}s); first seen {text}")
        return out


def budget_peaks(sampler: Sampler, run: Run) -> str:
    """The most GPUs held under each limit in one sample, e.g. `ns-a/team *=13/13`."""
    short = {run.namespaces[0]: "ns-a", run.namespaces[1]: "ns-b"}
    inverse = {name: key for key, name in run.classes.items()}
    return ", ".join(f"{short.get(ns, ns)}/{b} {inverse.get(c, c)}="
                     f"{sampler.budget_peak.get((ns, b, c), 0)}/{gpus}" for ns, b, c, gpus in run.limits())


@pytest.fixture
def second_namespace(api_client: client.ApiClient, namespace: str) -> Any:
    core = client.CoreV1Api(api_client)
    name = f"{namespace[:50]}-b"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:  # kube-controller-manager may have made it already
        core.create_namespaced_service_account(
            name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))
    except client.ApiException as e:
        if e.status != 409:
            raise
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.mark.plane
def test_stress_two_classes_churn_class_recreate_and_kill_9_keep_i1_i2_i4(
    api_client: client.ApiClient, full_plane: ControlPlane, crds: list[str], namespace: str,
    second_namespace: str, gpu_nodes: Callable[..., Obj], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    seed = _seed()
    with capsys.disabled():  # the seed shows even when the test passes and output is captured
        print(f"\n[stress] seed {seed} (set {SEED_ENV}={seed} to run it again)", flush=True)
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:6]
    run = Run(api_client, [namespace, second_namespace], tag, rng)
    kubeconfig = str(full_plane.kubeconfig)

    for prefix, gpus, in_a, in_b, gpus2 in NODES:
        labels = {**run.label, **({POOL_A: "true"} if in_a else {}), **({POOL_B: "true"} if in_b else {})}
        node = gpu_nodes(prefix, gpus=gpus, labels=labels, resource=RESOURCE)
        if gpus2:  # kwok keeps what a node's status says it has
            kube.request(api_client, "PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status",
                         content_type="application/merge-patch+json", body={"status": {
                             "allocatable": {RESOURCE2: str(gpus2)}, "capacity": {RESOURCE2: str(gpus2)}}})
    for key in run.classes:
        run.create_class(key)
    for ns in run.namespaces:
        run.setup_namespace(ns)

    # The seed decides when and what breaks.
    gone_class = rng.choice("ab")
    freeze_at = rng.uniform(1.5, 3.0)
    thaw_at = freeze_at + rng.uniform(2.0, 3.5)
    class_delete_at = rng.uniform(4.0, 8.0)
    class_back_at = class_delete_at + rng.uniform(2.0, 4.0)
    kill_at = rng.uniform(12.0, 17.0)
    restart_at = kill_at + rng.uniform(1.0, 3.0)
    # The other class is edited (one class both deleted and edited would be
    # gone when the edit comes): its keep claims are held from the start.
    edited_class = "b" if gone_class == "a" else "a"
    edit_at = rng.uniform(EDIT_FROM, EDIT_TO)
    for ns in run.namespaces:
        run.create_keep_claim(ns, edited_class)
    keep_first = [run.keep_pod(ns) for ns in run.namespaces]  # created first: the oldest pods
    for ns, manifest in keep_first:
        run.keep_holders[ns] = manifest["metadata"]["name"]
    initial = keep_first + [run.next_pod() for _ in range(INITIAL_PODS)]

    ctl = Controller(kubeconfig, tmp_path / "controller.log")
    sampler = Sampler(kubeconfig, run)
    failures: dict[str, list[str]] = {}
    try:
        sampler.start()
        ctl.start()
        ctl.wait_ready()
        # Without leader election a process decides nothing until a write of
        # the one before it could no longer land (cmd.startwait): the run's
        # clock starts when it leads.
        wait_for(ctl.leading, timeout=READY_TIMEOUT, interval=0.2,
                 message="leader_election_master_status 1 without leader election")
        run.t0 = time.monotonic()
        run.event(f"controller ready (pid {ctl.popen.pid if ctl.popen else '?'}); creating the workload")
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda a: run.create_pod(*a), initial))
        for j in range(JOBS):
            run.create_job(namespace, f"job{j}")
        run.event(f"{len(initial)} pods ({len(keep_first)} holding the keep claims) and {JOBS} jobs created")
        wait_for(ctl.leading, timeout=READY_TIMEOUT, interval=0.2,
                 message="leader_election_master_status 1 without leader election")

        plan = sorted([
            (class_delete_at, "delete-class"), (class_back_at, "recreate-class"),
            (kill_at, "kill"), (restart_at, "restart"), (freeze_at, "freeze"), (thaw_at, "thaw"),
            (edit_at, "edit-class")])
        next_churn = 1.0
        next_pass = math.inf  # the keep claims are passed on after the edit
        while plan or run.now() < CHURN_UNTIL:
            if plan and run.now() >= plan[0][0]:
                _, action = plan.pop(0)
                if action == "delete-class":
                    run.delete_class(gone_class)
                    run.event(f"GPUClass {run.classes[gone_class]} deleted")
                elif action == "recreate-class":
                    run.create_class(gone_class)
                    run.event(f"GPUClass {run.classes[gone_class]} recreated")
                elif action == "edit-class":
                    edit = run.edit_class(edited_class, RESOURCE2)
                    holders = sorted(f"{run.short(cid)} on {node}" for cid, node, _, _ in edit.bound.values())
                    run.event(f"GPUClass {edit.class_name} resourceName {edit.old} -> {edit.new}; "
                              f"{len(holders)} claims of it held GPUs: {', '.join(holders)}")
                    next_pass = run.now() + rng.uniform(0.5, 1.5)
                elif action in ("freeze", "thaw"):
                    ctl.freeze(action == "freeze")
                    run.event("controller stopped (SIGSTOP)" if action == "freeze"
                              else "controller continued (SIGCONT)")
                elif action == "kill":
                    ctl.kill()
                    run.event("controller killed with SIGKILL")
                else:
                    ctl.start()
                    run.event("controller restarted")
                    ctl.wait_ready()
                    run.event("restarted controller ready")
                    wait_for(ctl.leading, timeout=READY_TIMEOUT, interval=0.2,
                             message="the restarted controller to decide (its start wait over)")
                    run.event("restarted controller deciding")
                continue
            if run.now() >= next_churn and run.now() < CHURN_UNTIL:
                run.churn()
                next_churn = run.now() + rng.uniform(1.0, 2.0)
            if run.now() >= next_pass and run.now() < CHURN_UNTIL - 2.0:
                run.event(f"keep claims passed on to {', '.join(run.pass_keep_claims()) or 'nobody'}")
                next_pass = run.now() + rng.uniform(2.5, 3.5)
            time.sleep(0.05)
        run.event(f"churn over: {len(run.created)} pods created ({run.recreated} under the name "
                  f"of a deleted one), {len(run.deleted)} deleted")

        # Quiet, in two senses, both within QUIET_MAX. Settled: what the
        # invariants read (each claim's uid, phase, node, reservations; each
        # pod's uid, gate, node, phase) has not changed for QUIET seconds.
        # Idle: nothing of ours was written at all for QUIET seconds.
        def state() -> dict[str, tuple[str, str, str]]:
            ours = set(run.namespaces)
            out = {f"claim {_cid(c)}": (str(_meta(c).get("resourceVersion")), essentials(c), brief(c))
                   for c in run.claims() if _meta(c).get("namespace") in ours}
            out.update({f"pod {_cid(p)}": (str(_meta(p).get("resourceVersion")), essentials(p), brief(p))
                        for p in run.pods()})
            return out

        absent = ("", "absent", "absent")
        last, quiet_from = state(), time.monotonic()
        settled_at = idle_at = time.monotonic()  # the last change of essentials, of anything
        changes: list[str] = []  # the last changes of essentials, newest first
        writes: list[tuple[float, str, str]] = []  # (when, object, before -> after) of other writes
        while time.monotonic() - idle_at < QUIET and time.monotonic() - quiet_from < QUIET_MAX:
            assert ctl.ready(), "the controller is not ready"
            time.sleep(0.5)
            now, at = state(), time.monotonic()
            keys = sorted(now.keys() | last.keys())
            moved = [k for k in keys if now.get(k, absent)[1] != last.get(k, absent)[1]]
            if moved:
                changes = [f"{k}: {last.get(k, absent)[2]} -> {now.get(k, absent)[2]}"
                           for k in moved[:6]] + changes[:6]
                settled_at = at
            written = [k for k in keys if now.get(k, absent)[0] != last.get(k, absent)[0]]
            writes += [(at, k, f"{last[k][2]} -> {now[k][2]}") for k in written if k not in moved]
            if written:
                idle_at = at
            last = now
        end = time.monotonic()
        if end - settled_at < QUIET:
            failures["quiet"] = [f"the claims and pods never settled: still changing "
                                 f"{QUIET_MAX:.0f}s after the churn ended; the last changes "
                                 f"(newest first):", *changes]
        elif end - idle_at < QUIET:
            recent = [(k, what) for at, k, what in writes if at >= end - QUIET]
            counts = Counter(k for k, _ in recent)
            failures["quiet (writes)"] = [
                f"settled {end - settled_at:.0f}s ago, but the controller never idles: in the "
                f"last {QUIET:.0f}s, {len(recent)} rewrites (seen once per object per 0.5 s poll) "
                f"that changed none of phase, node, reservations, gates; most rewritten "
                f"(polls): {counts.most_common(5)}; the last ones:",
                *[f"{k}: {what}" for k, what in recent[-6:]]]
        run.event("quiet" if "quiet" not in failures else "not quiet; checking anyway")
        # The sampler sees the quiet state a few more times.
        seen = sampler.samples
        wait_for(lambda: sampler.samples >= seen + 3 or not sampler.is_alive(), timeout=20,
                 message="three more samples")
    finally:
        sampler.stop.set()
        sampler.join(10)

    try:
        claims = run.claims()
        pods = run.pods()
        nodes = run.nodes()
        classes = run.class_infos()
        ours = [c for c in claims if _meta(c).get("namespace") in run.namespaces]
        if sampler.errors:
            failures["sampler"] = sampler.errors[:5]
        if sampler.violation_count:
            failures["I1 (sampled during the run)"] = sampler.report()
        if sampler.budget_violations:
            failures["budgets (sampled during the run)"] = sampler.budget_report()
        rewritten = sampler.rewrites + check_resource_kept(sampler.held_before, claims)
        if rewritten:
            failures["bound claims keep their resource (DESIGN §4)"] = [
                f"{sampler.rewrite_count} of {sampler.samples} samples (and the final list) had a bound "
                f"claim's resource rewritten", *rewritten]
        final_budgets = check_budgets_held(claims, run.limits())
        if final_budgets:
            failures["budgets (final list)"] = list(final_budgets)
        final_i1 = check_i1(claims, allocatable_of(nodes), sampler.resource_at_bind)
        if final_i1:
            failures["I1 (final list)"] = list(final_i1)
        want_classes = {name: run.resources[key] for key, name in run.classes.items()}
        got_classes = {name: info["resource"] for name, info in classes.items()}
        if got_classes != want_classes:
            failures["classes"] = [f"classes (and their resourceName) at the end: {got_classes}, "
                                   f"expected {want_classes}"]
        i2, i4 = check_reservations(ours, pods)
        gated_fit = check_gated_pods(claims, pods, nodes, classes, run.template_specs(), time.time(),
                                     run.limits())
        reasons_wrong, reasons = check_waiting_reasons(claims, pods, nodes, classes, run.template_specs(),
                                                       run.limits(), time.time())
        # The budgets' status is written a second after the claims change: let it catch up.
        budget_status = check_budget_status(run.budgets(), claims)
        deadline = time.monotonic() + 10
        while budget_status and time.monotonic() < deadline:
            time.sleep(0.5)
            budget_status = check_budget_status(run.budgets(), claims)
        for name, found in (("I2", i2), ("I4 (stale reservations)", i4),
                            ("I4 (gated pods whose set fits)", gated_fit),
                            ("gated pods wait for a true reason", reasons_wrong),
                            ("budget status", budget_status),
                            ("released pods hold their sets", check_released_pods(ours, pods)),
                            ("cleanup (DESIGN §2/§5)", check_cleanup(ours, pods))):
            if found:
                # Checked on a run that never settled, these may be steps not taken yet.
                failures[name + (" (checked before the run settled)" if "quiet" in failures else "")] = found

        n_gated = sum(gated(p) for p in pods)
        n_running = sum(not gated(p) and not finished(p) for p in pods)
        n_finished = sum(finished(p) for p in pods)
        held: Counter[str] = Counter()
        for c in claims:
            if holds_gpus(c) and _status(c).get("nodeName") in {_meta(n)["name"] for n in nodes}:
                held[held_resource(c, sampler.resource_at_bind)] += int(c["spec"]["count"])
        totals = {RESOURCE: sum(n[1] for n in NODES), RESOURCE2: sum(n[4] for n in NODES)}
        gpus_held = ", ".join(f"{held[r]}/{total} {r}" for r, total in totals.items())
        summary = (f"seed {seed}: {sampler.samples} samples, {len(run.created)} pods created "
                   f"({run.recreated} under an old name), "
                   f"{len(run.deleted)} deleted; at the end {n_running} released, {n_gated} gated, "
                   f"{n_finished} finished, {gpus_held} held, "
                   f"{sampler.edit_report()}, "
                   f"gated by reason {dict(reasons.most_common())}, "
                   f"budget peaks {budget_peaks(sampler, run)}, "
                   f"{ctl.tracebacks()} tracebacks in the controller log; "
                   f"{time.monotonic() - started:.0f}s")
        with capsys.disabled():
            print(f"\n[stress] {summary}", flush=True)
        timeline = "\n".join(f"  t={t:6.2f}s {what}" for t, what in run.timeline)
        report = "\n".join(f"{name}:\n" + "\n".join(f"  - {line}" for line in lines[:12])
                           + (f"\n  ... and {len(lines) - 12} more" if len(lines) > 12 else "")
                           for name, lines in failures.items())
        if failures:  # pytest keeps only its last few temporary folders; keep the log
            kept = Path(tempfile.gettempdir()) / f"gpuclaimctl-stress-{seed}-{tag}.log"
            shutil.copyfile(ctl.log, kept)
            ctl.log = kept
        # Namespaces are long (the test's name); the report calls them ns-a and ns-b.
        legend = f"ns-a = {run.namespaces[0]}, ns-b = {run.namespaces[1]}"
        for ns, alias in ((run.namespaces[1], "ns-b"), (run.namespaces[0], "ns-a")):
            report = report.replace(ns, alias)
        assert not failures, (f"invariants broken ({summary}); rerun with {SEED_ENV}={seed}\n"
                              f"{legend}\n{report}\ntimeline:\n{timeline}\n"
                              f"controller log, last distinct lines ({ctl.log}):\n"
                              f"{ctl.distinct_tail()}")
        assert sampler.samples > 50, f"the sampler must have watched the run ({sampler.samples} samples)"
        assert sampler.seen_bound > 0, "nothing was ever bound: the run tested nothing"
        assert n_running > 0 and n_gated > 0, "the run must end with pods released and pods waiting"
        assert any(sampler.budget_peak.get((ns, b, c)) == gpus for ns, b, c, gpus in run.limits()), \
            f"no budget was ever full: the budget run tested nothing ({budget_peaks(sampler, run)})"
        assert sampler.keeps, f"no claim bound before the class edit was kept after it: the edit tested " \
                              f"nothing ({sampler.edit_report()})"
    finally:
        ctl.kill()
        for name in run.classes.values():
            try:
                kube.request(api_client, "DELETE", f"{GROUP_PATH}/gpuclasses/{name}")
            except kube.ApiError:
                pass


# -- every check can fail ----------------------------------------------------------------------


def _claim(name: str, count: int, *, ns: str = "ns", cls: str = "a", phase: str = "Bound",
           node: str | None = "n1", reserved: Iterable[tuple[str, str]] = (), template_of: str | None = None,
           policy: str = "Release", resource: str | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if template_of is not None:
        meta["labels"] = {api.TEMPLATE_CLAIM_LABEL: api.TEMPLATE_CLAIM_LABEL_VALUE}
        meta["ownerReferences"] = [{"kind": "Pod", "name": template_of, "uid": f"uid-{template_of}",
                                    "controller": True}]
    status: Obj = {"phase": phase, "reservedFor": [{"name": n, "uid": u} for n, u in reserved]}
    if node:
        status["nodeName"] = node
    if resource:
        status["resourceName"] = resource
    return {"metadata": meta, "spec": {"className": cls, "count": count, "reclaimPolicy": policy},
            "status": status}


def _pod(name: str, entries: list[Obj], *, ns: str = "ns", gate: bool = False, phase: str = "Running",
         node: str | None = "n1") -> Obj:
    spec: Obj = {"nodeName": node} if node and not gate else {}
    if gate:
        spec["schedulingGates"] = [{"name": api.SCHEDULING_GATE}]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries)}},
            "spec": spec, "status": {"phase": phase}}


def _node(name: str, gpus: int, labels: Mapping[str, str], ready: bool = True, gpus2: int = 0) -> Obj:
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {},
            "status": {"allocatable": {RESOURCE: str(gpus), "cpu": "32",
                                       **({RESOURCE2: str(gpus2)} if gpus2 else {})},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_each_check_trips_on_a_hand_made_violation() -> None:
    alloc = {("n1", RESOURCE): 4, ("n2", RESOURCE): 2}
    res = lambda c: RESOURCE  # noqa: E731 - both classes count one resource (claims recording none)
    # I1: 3 + 2 on a 4-GPU node over two classes, and a Lost claim still reserved counts.
    over = [_claim("x", 3, cls="a"), _claim("y", 2, cls="b"), _claim("z", 2, node="n2")]
    found = check_i1(over, alloc, res)
    assert len(found) == 1 and "node n1" in found[0] and "5 GPUs held > allocatable 4" in found[0] \
        and "over by 1" in found[0], found
    lost = [_claim("x", 3), _claim("l", 2, phase="Lost", reserved=[("p", "uid-p")])]
    assert check_i1(lost, alloc, res)
    fine = [_claim("x", 3), _claim("l", 2, phase="Lost"), _claim("p", 4, phase="Pending", node=None),
            _claim("o", 9, node="not-ours")]
    assert check_i1(fine, alloc, res) == []
    assert allocatable_of([_node("n1", 4, {})]) == {("n1", RESOURCE): 4}

    # I1 per node and resource, each claim under the resource its status records.
    alloc2 = {("n1", RESOURCE): 4, ("n1", RESOURCE2): 2, ("n2", RESOURCE): 2}
    assert allocatable_of([_node("n1", 4, {}, gpus2=2)]) == {("n1", RESOURCE): 4, ("n1", RESOURCE2): 2}
    # 3 + 2 on n1 under two resources, each within its own: fine (one resource for both would be 5 of 4).
    apart = [_claim("x", 3, resource=RESOURCE), _claim("y", 2, resource=RESOURCE2)]
    assert check_i1(apart, alloc2, res) == []
    # ... under the same one: over, whatever the class's resource (res says RESOURCE2 for y's class).
    same = [_claim("x", 3, resource=RESOURCE), _claim("y", 2, cls="b", resource=RESOURCE)]
    found = check_i1(same, alloc2, lambda c: RESOURCE2)
    assert len(found) == 1 and f"node n1 {RESOURCE}: 5 GPUs held > allocatable 4" in found[0], found
    found = check_i1([_claim("y", 3, resource=RESOURCE2)], alloc2, res)
    assert len(found) == 1 and f"node n1 {RESOURCE2}: 3 GPUs held > allocatable 2" in found[0], found
    # A resource the node does not offer at all: 1 of 0.
    found = check_i1([_claim("y", 1, node="n2", resource=RESOURCE2)], alloc2, res)
    assert len(found) == 1 and f"node n2 {RESOURCE2}: 1 GPUs held > allocatable 0" in found[0], found
    # A claim recording no resource counts under resource_at_bind's (and says so).
    found = check_i1([_claim("x", 3, resource=RESOURCE), _claim("u", 2)], alloc2, res)
    assert len(found) == 1 and "resource unrecorded" in found[0], found
    assert check_i1([_claim("x", 3, resource=RESOURCE), _claim("u", 2)], alloc2, lambda c: RESOURCE2) == []

    # A bound claim keeps its resource between two lists.
    kept = _claim("k", 1, policy="Retain", resource=RESOURCE, reserved=[("p", "uid-p")])
    before = held_by_uid([kept, _claim("r", 1, resource=RESOURCE, reserved=[("p", "uid-p")])])
    assert check_resource_kept(before, [kept]) == []
    rewritten = check_resource_kept(before, [_claim("k", 1, policy="Retain", resource=RESOURCE2,
                                                    reserved=[("q", "uid-q")])])
    assert len(rewritten) == 1 and "ns/k (Retain" in rewritten[0] and "rewritten while bound" in rewritten[0], \
        rewritten
    assert check_resource_kept(before, [_claim("r", 1, resource=RESOURCE2, reserved=[("p", "uid-p")])])
    # A Release claim for another pod may have been released and bound anew; a move is a new bind;
    # a claim that recorded nothing before gets its resource recorded.
    assert check_resource_kept(before, [_claim("r", 1, resource=RESOURCE2, reserved=[("q", "uid-q")])]) == []
    assert check_resource_kept(before, [_claim("k", 1, policy="Retain", node="n2", resource=RESOURCE2)]) == []
    unrecorded = held_by_uid([_claim("k", 1, policy="Retain")])
    assert check_resource_kept(unrecorded, [_claim("k", 1, policy="Retain", resource=RESOURCE2)]) == []

    # I2 and I4.
    p = _pod("p", [{"name": "g", "className": "a", "count": 1}, {"name": "u", "claim": "shared"}])
    q = _pod("q", [{"name": "u", "claim": "shared"}])
    done = _pod("done", [{"name": "g", "className": "a", "count": 1}], phase="Succeeded")
    pods = [p, q, done]
    assert check_reservations([_claim("p-g", 1, template_of="p", reserved=[("p", "uid-p")]),
                               _claim("shared", 1, reserved=[("q", "uid-q")])], pods) == ([], [])
    i2, _ = check_reservations([_claim("shared", 1, reserved=[("p", "uid-p"), ("q", "uid-q")])], pods)
    assert any("2 pods" in m for m in i2), i2
    i2, _ = check_reservations([_claim("other", 1, reserved=[("q", "uid-q")])], pods)
    assert any("does not name it" in m for m in i2), i2
    i2, _ = check_reservations([_claim("p-g", 1, template_of="someone", reserved=[("p", "uid-p")])], pods)
    assert any("not its owner" in m for m in i2), i2
    _, i4 = check_reservations([_claim("shared", 1, reserved=[("gone", "uid-gone")])], pods)
    assert any("which is gone" in m for m in i4), i4
    _, i4 = check_reservations([_claim("shared", 1, reserved=[("q", "uid-old-q")])], pods)
    assert any("replaced" in m for m in i4), i4
    _, i4 = check_reservations([_claim("done-g", 1, template_of="done", reserved=[("done", "uid-done")])],
                               pods)
    assert any("Succeeded" in m for m in i4), i4

    # Released pods hold their sets; cleanup.
    assert check_released_pods([_claim("q-x", 1), _claim("shared", 1, reserved=[("q", "uid-q")])],
                               [q]) == []
    assert check_released_pods([_claim("shared", 1, node="n2", reserved=[("q", "uid-q")])], [q])
    assert check_released_pods([_claim("shared", 1, phase="Pending", node=None)], [q])
    assert check_released_pods([], [q])
    assert check_cleanup([_claim("gone-g", 1, template_of="gone")], pods)
    assert check_cleanup([_claim("done-g", 1, template_of="done")], pods)
    assert check_cleanup([_claim("free", 1)], pods)
    assert check_cleanup([_claim("kept", 1, policy="Retain"), _claim("p-g", 1, template_of="p", reserved=[("p", "uid-p")])], pods) == []

    # Gated pods: fits / does not fit.
    classes = {"a": {"selector": {"pool": "a"}, "resource": RESOURCE},
               "b": {"selector": {"pool": "b"}, "resource": RESOURCE}}
    nodes = [_node("n1", 4, {"pool": "a"}), _node("n2", 2, {"pool": "a", "pool-b": "x"}),
             _node("n3", 8, {"pool": "b"}, ready=False)]
    w = _pod("w", [{"name": "g", "className": "a", "count": 2}], gate=True)
    bound = [_claim("x", 3)]  # n1: 1 free, n2: 2 free
    fits = check_gated_pods(bound, [w], nodes, classes, {}, time.time())
    assert len(fits) == 1 and "fits on node n2" in fits[0], fits
    assert check_gated_pods(bound + [_claim("y", 1, node="n2")], [w], nodes, classes, {}, time.time()) == []
    # Class b is offered only on a node that is not Ready.
    wb = _pod("wb", [{"name": "g", "className": "b", "count": 1}], gate=True)
    assert check_gated_pods([], [wb], nodes, classes, {}, time.time()) == []
    # A claim in use elsewhere, or a missing class: it may wait.
    wu = _pod("wu", [{"name": "u", "claim": "shared"}], gate=True)
    assert check_gated_pods([_claim("shared", 1, reserved=[("q", "uid-q")])], [wu], nodes, classes, {},
                            time.time()) == []
    assert check_gated_pods([], [wu], nodes, classes, {}, time.time()) == []
    assert check_gated_pods([], [w], nodes, {"b": classes["b"]}, {}, time.time()) == []
    older = _claim("w-g", 2, phase="Pending", node=None, template_of="w-before")
    assert check_gated_pods(bound + [older], [w], nodes, classes, {}, time.time()) == []
    assert check_gated_pods(bound + [_claim("w-g", 2, phase="Pending", node=None, template_of="w")],
                            [w], nodes, classes, {}, time.time())
    # A template entry's size comes from its template; a Retain claim bound on n1 keeps the set there.
    wt = _pod("wt", [{"name": "t", "template": "big"}], gate=True)
    assert check_gated_pods([], [wt], nodes, classes, {("ns", "big"): {"className": "a", "count": 5}},
                            time.time()) == []
    assert check_gated_pods([], [wt], nodes, classes, {("ns", "big"): {"className": "a", "count": 4}},
                            time.time())
    wr = _pod("wr", [{"name": "u", "claim": "kept"}, {"name": "g", "className": "a", "count": 2}], gate=True)
    kept = _claim("kept", 1, policy="Retain")  # on n1: 3 free, needs 2 more there
    assert check_gated_pods([kept], [wr], nodes, classes, {}, time.time())
    assert check_gated_pods([kept, _claim("x", 2)], [wr], nodes, classes, {}, time.time()) == []
    # ... and moves as a whole (3 GPUs) to a node with room for all of it.
    roomy = [*nodes, _node("n4", 4, {"pool": "a"})]
    moved = check_gated_pods([kept, _claim("x", 2)], [wr], roomy, classes, {}, time.time())
    assert len(moved) == 1 and "fits on node n4" in moved[0] and "'example.com/gpu': 3" in moved[0], moved
    # A node rejected for the set until later is not a candidate.
    rej = _claim("w-g", 2, phase="Pending", node=None)
    rej["status"]["rejectedNodes"] = [{"nodeName": "n2", "until": "2999-01-01T00:00:00Z"}]
    assert check_gated_pods(bound + [rej], [w], nodes, classes, {}, time.time()) == []

    # Class a edited to RESOURCE2, which n1 does not offer: a claim bound on n1 before the edit
    # keeps the set there; anything new of class a needs RESOURCE2.
    edited = {"a": {"selector": {"pool": "a"}, "resource": RESOURCE2}}
    kept_old = _claim("kept", 1, policy="Retain", resource=RESOURCE)  # on n1
    wk = _pod("wk", [{"name": "u", "claim": "kept"}], gate=True)
    stays = check_gated_pods([kept_old], [wk], nodes, edited, {}, time.time())
    assert len(stays) == 1 and "fits on node n1" in stays[0], stays
    # Held GPUs count under the resource their claims record: n5's 2 RESOURCE2 are free while
    # "old" (class a, bound before the edit) holds 2 RESOURCE there, and full once "new" holds them.
    two = [_node("n1", 4, {"pool": "a"}), _node("n5", 2, {"pool": "a"}, gpus2=2)]
    wm = _pod("wm", [{"name": "u", "claim": "kept"}, {"name": "g", "className": "a", "count": 1}], gate=True)
    old = _claim("old", 2, node="n5", resource=RESOURCE, reserved=[("o", "uid-o")])
    moves = check_gated_pods([kept_old, old], [wm], two, edited, {}, time.time())
    assert len(moves) == 1 and "fits on node n5" in moves[0] and f"'{RESOURCE2}': 2" in moves[0], moves
    new = _claim("new", 2, node="n5", resource=RESOURCE2, reserved=[("o", "uid-o")])
    assert check_gated_pods([kept_old, new], [wm], two, edited, {}, time.time()) == []


def _waiting(c: Obj, reason: str) -> Obj:
    c["status"]["conditions"] = [{"type": api.CONDITION_WAITING, "status": "True", "reason": reason,
                                  "message": f"waits on {reason}"}]
    return c


def test_each_budget_check_trips_on_a_hand_made_violation() -> None:
    limits: list[Limit] = [("ns", "team", "a", 4), ("ns", "team", "*", 5), ("other", "team", "b", 1)]
    # a: 3 + 1 (Lost, still reserved) = 4; all classes: 5. At both limits, over neither.
    held = [_claim("x", 3, cls="a"), _claim("y", 1, cls="b"),
            _claim("l", 1, cls="a", phase="Lost", reserved=[("p", "uid-p")])]
    assert check_budgets_held(held, limits) == []
    over = check_budgets_held([*held, _claim("z", 1, cls="b", node="n2")], limits)
    assert len(over) == 1 and "GPUBudget ns/team *: 6 GPUs held > limit 5 (over by 1)" in over[0], over
    nothing = [_claim("p", 4, phase="Pending", node=None), _claim("q", 2, phase="Lost"),
               _claim("o", 9, ns="elsewhere")]
    assert check_budgets_held([*held, *nothing], limits) == []
    counts = held_per_class(held)
    assert budget_refusal("ns", [("b", 1)], counts, limits) == "ns/team allows 5 of *, 5 held, needs 1"
    assert budget_refusal("other", [("a", 3)], counts, limits) is None  # its limit is on b alone
    assert budget_refusal("free", [("a", 30)], counts, limits) is None  # no budget: unlimited

    # I4 knows a budget may hold a pod whose set fits.
    classes = {"a": {"selector": {"pool": "a"}, "resource": RESOURCE}}
    nodes = [_node("n1", 8, {"pool": "a"})]  # 4 held: 4 free
    w = _pod("w", [{"name": "g", "className": "a", "count": 1}], gate=True)
    assert check_gated_pods(held, [w], nodes, classes, {}, time.time())
    assert check_gated_pods(held, [w], nodes, classes, {}, time.time(), limits) == []

    # The reason a gated pod waits for is true.
    def reasons(claims: list[Obj], pods: list[Obj], lims: list[Limit],
                on: list[Obj] = nodes) -> tuple[list[str], Counter[str]]:
        return check_waiting_reasons(claims, pods, on, classes, {}, lims, time.time())

    on_budget = [*held, _waiting(_claim("w-g", 1, phase="Pending", node=None, template_of="w"), "Budget")]
    assert reasons(on_budget, [w], limits) == ([], Counter({"Budget": 1}))
    wrong, _ = reasons(on_budget, [w], [("ns", "team", "a", 10)])
    assert len(wrong) == 1 and "every limit allows its set" in wrong[0], wrong
    on_capacity = [*held, _waiting(_claim("w-g", 1, phase="Pending", node=None, template_of="w"), "Capacity")]
    wrong, _ = reasons(on_capacity, [w], limits)
    assert len(wrong) == 1 and "its budget holds it" in wrong[0] and "fits on node n1" in wrong[0], wrong
    # Capacity and Budget both true (no node has room either): fine.
    assert reasons(on_capacity, [w], limits, on=[_node("n1", 4, {"pool": "a"})])[0] == []
    # A user claim several pods name carries the last decided pod's wait: it tells nothing.
    wu = _pod("wu", [{"name": "u", "claim": "shared"}], gate=True)
    shared = _waiting(_claim("shared", 1, phase="Pending", node=None), "Budget")
    assert reasons([*held, shared], [wu], [("ns", "team", "a", 10)]) == ([], Counter({"unknown": 1}))
    unknown = [*held, _waiting(_claim("w-g", 1, phase="Pending", node=None, template_of="w"),
                               "BudgetsUnknown")]
    wrong, _ = reasons(unknown, [w], limits)
    assert len(wrong) == 1 and "BudgetsUnknown" in wrong[0], wrong

    # A budget's status, once quiet.
    def budget(used: int, exceeded: str = "False") -> Obj:
        return {"metadata": {"name": "team", "namespace": "ns"},
                "spec": {"limits": [{"className": "a", "gpus": 4}]},
                "status": {"used": [{"className": "a", "gpus": used}],
                           "conditions": [{"type": "Exceeded", "status": exceeded}]}}

    assert check_budget_status([budget(4)], held) == []
    assert check_budget_status([budget(3)], held)
    assert check_budget_status([budget(4, "True")], held)
