"""Odd user input, generated: the rule of DESIGN.md §3 and §4b is that bad
input gets a clear error and loses nothing, and that the process never dies
of a user's object.

Each test feeds objects made by the stdlib `random` with fixed seeds (no
hypothesis dependency; a failure replays exactly) into one of the pure
functions the controller and its webhook run on user input, and asserts it
returns a sane value or raises the project's documented user-error type
(PodClaimsError, BadReview), never anything else. The last test drives the
real informer handlers and syncs (the simulation harness, tests/sim) over
such objects and checks that nothing raises, invariant I1 holds, and every
pod with a bad annotation stays gated with an InvalidClaims warning.
Quick (a few seconds) and deterministic.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest

from gpuclaimctl.decide.claimplan import NodeFacts, PodFacts, plan_claim
from gpuclaimctl.decide.placement import Placed, Waiting, decide
from gpuclaimctl.decide.podplan import release_patch
from gpuclaimctl.model import api
from gpuclaimctl.model.api import OnCordon, Phase, ReclaimPolicy, Strategy
from gpuclaimctl.model.nodeaffinity import Mismatch, PodNodeRules, Taint, pinned_node
from gpuclaimctl.model.podcache import prune_pod
from gpuclaimctl.model.podclaims import (
    MAX_CLAIM_NAME,
    ClaimEntry,
    PodClaimsError,
    has_gate,
    parse_claims,
    pod_claims,
    template_claim_name,
)
from gpuclaimctl.model.resources import QUANTITY_MAX, parse_quantity
from gpuclaimctl.model.snapshot import (
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    PodInfo,
    PodRef,
    Rejection,
)
from gpuclaimctl.webhook.pods import mutate, validate
from gpuclaimctl.webhook.review import BadReview, Verdict, parse_review, response

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "nvidia.com/gpu"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# -- generators --------------------------------------------------------------------------


ATOMS: list[Any] = [None, True, False, 0, 1, -1, 2**31 - 1, 2**31, 2**63, 1.5, -0.0, "", "a", "A", "-a",
                    "a" * 63, "a" * 64, "a" * 254, "gpu", "x.y", "a100", {}, [], "1", "é", "\u0000"]
FIELDS = ("name", "claim", "template", "className", "count", "x")


def rvalue(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rng.choice(ATOMS)
    if r < 0.7:
        return [rvalue(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(FIELDS): rvalue(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def rlabel(rng: random.Random, n: int) -> str:
    """A DNS label of length n."""
    if n == 1:
        return rng.choice("ab0")
    return rng.choice("ab1") + "".join(rng.choice("ab-0") for _ in range(n - 2)) + rng.choice("ab1")


def rsubdomain(rng: random.Random, n: int) -> str:
    """A DNS subdomain of length about n (at most 253)."""
    parts: list[str] = []
    left = n
    while left > 0:
        k = min(left, rng.randint(1, 63))
        parts.append(rlabel(rng, k))
        left -= k + 1
    return ".".join(parts)[:253].rstrip(".-") or "a"


def rentries(rng: random.Random) -> list[Any]:
    """A list of entries, mostly well formed, each perhaps with one thing wrong."""
    out: list[Any] = []
    for i in range(rng.choice((1, 1, 2, 3, 33))):
        kind = rng.random()
        entry: dict[str, Any] = {"name": rng.choice([f"e{i}", f"e{i}", "e" * 63, "g"])}
        if kind < 0.3:
            entry["claim"] = rng.choice(["shared", f"c{i}", "a." * 100 + "b"])
        elif kind < 0.5:
            entry["template"] = rng.choice(["pair", f"t{i}"])
        else:
            entry["className"] = rng.choice(["a100", "h100", "x.y"])
            entry["count"] = rng.choice([1, 2, 8, 2**31 - 1])
        if rng.random() < 0.3:
            entry[rng.choice(FIELDS)] = rvalue(rng)
        out.append(entry)
    return out


def odd_texts(rng: random.Random) -> list[str]:
    texts = []
    for _ in range(3000):
        try:
            texts.append(json.dumps(rentries(rng) if rng.random() < 0.5 else rvalue(rng)))
        except ValueError:
            continue
    for depth in (999, 1000, 5000, 60_000):
        texts += ["[" * depth + "]" * depth, '[{"name":' * depth]
    texts += ["", " ", "NaN", "[NaN]", "Infinity", "[1e400]", "\ud800", "[" + "1," * 40 + "1]",
              '[{"name":"g","className":"a","count":' + "9" * 5000 + "}]",
              '[{"name":"g","className":"a","count":1e999}]', '[{"name":"g","name":"h"}]',
              "".join(rng.choice(string.printable) for _ in range(200))]
    return texts


# -- the annotation ----------------------------------------------------------------------


def test_the_annotation_parser_returns_valid_entries_or_a_pod_claims_error() -> None:
    rng = random.Random(1)
    parsed = 0
    for text in odd_texts(rng):
        try:
            entries = parse_claims(text)
        except PodClaimsError as e:
            assert str(e).startswith(f"annotation {api.CLAIMS_ANNOTATION} is invalid: ")
            continue
        parsed += 1
        assert entries and all(isinstance(e, ClaimEntry) for e in entries)
        assert len({e.name for e in entries}) == len(entries)
        for e in entries:
            assert DNS_LABEL.fullmatch(e.name) and len(e.name) <= 63
            assert sum(x is not None for x in (e.claim, e.template, e.class_name)) == 1
            assert (e.count is not None) == (e.class_name is not None)
            assert e.count is None or 1 <= e.count <= 2**31 - 1
    assert parsed  # the generator makes some valid ones too


def test_pod_claims_on_a_pod_of_any_name_raises_only_pod_claims_error() -> None:
    rng = random.Random(2)
    for text in odd_texts(rng)[::7]:
        pod = {"metadata": {"name": rsubdomain(rng, rng.randint(1, 253)), "annotations": {api.CLAIMS_ANNOTATION: text}}}
        try:
            entries = pod_claims(pod)
        except PodClaimsError:
            continue
        names = [e.claim_name(pod["metadata"]["name"]) for e in entries]
        assert len(set(names)) == len(names)


# -- claim names -------------------------------------------------------------------------


def test_template_claim_names_are_valid_short_deterministic_and_distinct() -> None:
    rng = random.Random(3)
    seen: dict[str, tuple[str, str]] = {}
    for _ in range(20_000):
        pod = rsubdomain(rng, rng.choice((1, 10, 50, 62, 63, 200, 252, 253)))
        entry = rlabel(rng, rng.choice((1, 2, 10, 62, 63)))
        name = template_claim_name(pod, entry)
        # A valid object name, and short enough to be a label value too.
        assert len(name) <= MAX_CLAIM_NAME and DNS_SUBDOMAIN.fullmatch(name), (pod, entry, name)
        assert template_claim_name(pod, entry) == name
        if len(f"{pod}-{entry}") > MAX_CLAIM_NAME:
            other = seen.get(name)
            assert other is None or other == (pod, entry), (name, other, (pod, entry))
            seen[name] = (pod, entry)


# -- quantities --------------------------------------------------------------------------


_SUFFIXES = {"": (1, 0), "n": (1, -9), "u": (1, -6), "m": (1, -3), "k": (1, 3), "M": (1, 6), "G": (1, 9),
             "T": (1, 12), "P": (1, 15), "E": (1, 18), "Ki": (2**10, 0), "Mi": (2**20, 0), "Gi": (2**30, 0),
             "Ti": (2**40, 0), "Pi": (2**50, 0), "Ei": (2**60, 0)}


def reference_quantity(number: str, suffix: str) -> int:
    """Exact floor of the quantity, capped: the slow way, with fractions."""
    if suffix in _SUFFIXES:
        mult, exp = _SUFFIXES[suffix]
    else:
        mult, exp = 1, int(suffix[1:])
    value = Fraction(number) * mult * Fraction(10) ** exp
    whole = int(value)  # towards zero, as parse_quantity rounds
    return max(-QUANTITY_MAX, min(whole, QUANTITY_MAX))


def test_every_quantity_the_api_server_may_write_is_parsed_exactly() -> None:
    rng = random.Random(4)
    suffixes = [*_SUFFIXES, "e3", "E3", "e-3", "e18", "E+2", "e40", "e-40", "e0"]
    for _ in range(20_000):
        number = rng.choice(["0", "1", "2", "8", "1000", "0.5", ".5", "1.5", "7.25", "+1", "-1", "999999999999",
                             "9223372036854775807", "123456789012345678901234567890"])
        suffix = rng.choice(suffixes)
        got = parse_quantity(number + suffix)
        assert got == reference_quantity(number, suffix), number + suffix
    # Never raises, whatever the string.
    for text in ["1e1000000", "1e-1000000", "9" * 5000, "1" + "0" * 5000 + "Ei", "1e", "e3", "Ki", ".", "-",
                 "\u00b2", "\u0663", "1 k", "1kk", "1.2.3", "0x10", "inf", "nan", "1_000"]:
        got = parse_quantity(text)
        assert got is None or (isinstance(got, int) and abs(got) <= QUANTITY_MAX)
    for _ in range(5000):
        text = "".join(rng.choice("0123456789.+-eEkKmMGiTPnu ") for _ in range(rng.randint(0, 12)))
        got = parse_quantity(text)
        assert got is None or (isinstance(got, int) and abs(got) <= QUANTITY_MAX), text


# -- nodes, node affinity, placement ---------------------------------------------------


QUANTITIES = ["0", "1", "2", "4", "8", "1k", "1E", "2Ei", "1e3", "9223372036854775807", "1e30"]
LABEL_VALUES = ["a", "b", "1", "-5", "99999999999999999999", ""]


def random_node_object(rng: random.Random, name: str) -> dict[str, Any]:
    conditions = rng.choice([[{"type": "Ready", "status": "True"}], [{"type": "Ready", "status": "False"}], [],
                             [{"type": "Ready", "status": "Unknown"}]])
    taints = [{"key": rng.choice(["t1", "t2", "node.kubernetes.io/not-ready", "node.kubernetes.io/unschedulable"]),
               "effect": rng.choice(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
               **({"value": "v"} if rng.random() < 0.3 else {})} for _ in range(rng.randint(0, 2))]
    return {
        "metadata": {"name": name, "labels": {k: rng.choice(LABEL_VALUES) for k in ("zone", "pool", "n")
                                              if rng.random() < 0.7}},
        "spec": {"unschedulable": rng.random() < 0.15, "taints": taints},
        "status": {"allocatable": {r: rng.choice(QUANTITIES) for r in (GPU, "amd.com/gpu", "memory")
                                   if rng.random() < 0.85},
                   "conditions": conditions},
    }


def random_pod_spec(rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"zone": rng.choice(LABEL_VALUES)}
    if rng.random() < 0.5:
        terms = []
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])
            values = {"In": [rng.choice(LABEL_VALUES)], "NotIn": [rng.choice(LABEL_VALUES)], "Exists": [],
                      "DoesNotExist": [], "Gt": [rng.choice(["0", "-10", "x"])],
                      "Lt": [rng.choice(["5", "99999999999999999999"])]}[op]
            term: dict[str, Any] = {}
            if rng.random() < 0.9:
                term["matchExpressions"] = [{"key": rng.choice(["zone", "n", "pool"]), "operator": op,
                                             "values": values}]
            if rng.random() < 0.3:
                term["matchFields"] = [{"key": "metadata.name", "operator": rng.choice(["In", "NotIn"]),
                                        "values": [f"n{rng.randint(0, 5)}"]}]
            terms.append(term)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                             {"nodeSelectorTerms": terms}}}
    elif rng.random() < 0.2:
        spec["affinity"] = rng.choice([{}, {"podAffinity": {}}, {"nodeAffinity": {}}])
    if rng.random() < 0.4:
        spec["tolerations"] = rng.choice([[{"operator": "Exists"}], [{"key": "t1", "operator": "Exists"}],
                                          [{"key": "t2", "value": "v", "effect": "NoSchedule"}]])
    return spec


def reference_admits(spec: dict[str, Any], node: dict[str, Any]) -> bool:
    """kube-scheduler's NodeAffinity and TaintToleration filters, written out
    plainly, for nodes and pods of the shapes the API server accepts."""
    labels = node["metadata"]["labels"]
    name = node["metadata"]["name"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")

    def int64(text: str) -> int | None:
        return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) and -(2**63) <= int(text) < 2**63 else None

    def expr_ok(r: dict[str, Any]) -> bool:
        key, op, values = r["key"], r["operator"], r.get("values") or []
        if op == "In":
            return key in labels and labels[key] in values
        if op == "NotIn":
            return key not in labels or labels[key] not in values
        if op == "Exists":
            return key in labels
        if op == "DoesNotExist":
            return key not in labels
        have, want = (int64(labels[key]) if key in labels else None), int64(values[0])
        return have is not None and want is not None and (have > want if op == "Gt" else have < want)

    def term_ok(t: dict[str, Any]) -> bool:
        exprs, fields = t.get("matchExpressions") or [], t.get("matchFields") or []
        if not exprs and not fields:
            return False
        if any(r["operator"] in ("Gt", "Lt") and int64(r["values"][0]) is None for r in exprs):
            return False  # the term does not parse: it matches nothing
        return all(map(expr_ok, exprs)) and all(
            (name == f["values"][0]) == (f["operator"] == "In") for f in fields)

    if required is not None and not any(term_ok(t) for t in required["nodeSelectorTerms"]):
        return False
    for taint in node["spec"]["taints"]:
        if taint["effect"] not in ("NoSchedule", "NoExecute") or taint["key"] in (
                "node.kubernetes.io/not-ready", "node.kubernetes.io/unschedulable"):
            continue
        if not any((not t.get("effect") or t["effect"] == taint["effect"])
                   and (not t.get("key") or t["key"] == taint["key"])
                   and (t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""))
                   for t in spec.get("tolerations") or ()):
            return False
    return True


def test_node_rules_match_the_schedulers_filters_and_the_pin_narrows_to_one_node() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        nodes = [random_node_object(rng, f"n{i}") for i in range(rng.randint(1, 5))]
        spec = random_pod_spec(rng)
        pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z",
                            "annotations": {api.CLAIMS_ANNOTATION: "[]"}},
               "spec": {**spec, "schedulingGates": [{"name": api.SCHEDULING_GATE}],
                        "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]}}
        pruned = prune_pod(pod)
        rules = PodNodeRules.from_pod_spec(pruned["spec"])
        assert rules == PodNodeRules.from_pod_spec(pod["spec"])
        for node_obj in nodes:
            info = NodeInfo.from_api(node_obj)
            mismatch = rules.mismatch(info.name, info.labels, info.blocking_taints)
            assert mismatch is None or isinstance(mismatch, Mismatch)
            assert (mismatch is None) == reference_admits(spec, node_obj), (spec, node_obj)
        # The release pins the pod to the chosen node, and only there.
        target = rng.choice(nodes)["metadata"]["name"]
        from tests.sim.fakeapi import json_patch
        released = json_patch(pruned, release_patch(pruned, target))
        assert not has_gate(released)
        assert pinned_node(released["spec"]["affinity"]) in (target, None)
        pinned = PodNodeRules.from_pod_spec(released["spec"])
        for node_obj in nodes:
            info = NodeInfo.from_api(node_obj)
            if info.name != target:
                assert pinned.mismatch(info.name, info.labels, ()) is not None


def test_node_objects_of_any_allocatable_are_read() -> None:
    rng = random.Random(6)
    for i in range(3000):
        info = NodeInfo.from_api(random_node_object(rng, f"n{i}"))
        assert all(isinstance(v, int) and 0 <= v <= QUANTITY_MAX for v in info.allocatable.values())


def test_a_placement_never_overcommits_and_honours_every_rule() -> None:
    for seed in range(1500):
        rng = random.Random(seed)
        nodes = [NodeInfo.from_api(random_node_object(rng, f"n{i}")) for i in range(rng.randint(0, 6))]
        classes = [ClassInfo(c, rng.choice([GPU, "amd.com/gpu"]),
                             {"pool": rng.choice(LABEL_VALUES)} if rng.random() < 0.3 else {},
                             rng.choice(list(OnCordon)), rng.random() < 0.05)
                   for c in ("c1", "c2", "c3") if rng.random() < 0.9]
        cluster = Cluster(nodes, classes)
        used: dict[str, dict[str, int]] = {r: {n.name: rng.choice([0, 0, 1, 3, 8, 20]) for n in nodes
                                               if rng.random() < 0.5} for r in (GPU, "amd.com/gpu")}
        pod = PodInfo("ns", "p", "uid-p", NOW, PodNodeRules.from_pod_spec(random_pod_spec(rng)))
        claims = []
        for j in range(rng.randint(1, 3)):
            is_bound = rng.random() < 0.3
            phase = Phase.BOUND if is_bound else rng.choice([Phase.PENDING, Phase.LOST])
            on = f"n{rng.randint(0, 6)}" if phase is not Phase.PENDING else ""
            rejected = tuple(Rejection(f"n{rng.randint(0, 5)}", NOW + timedelta(seconds=rng.choice([-5, 5])))
                             for _ in range(rng.randint(0, 1)))
            c = ClaimState(f"k{j}", f"u{j}", rng.choice(["c1", "c2", "c3", "zz"]),
                           rng.choice([1, 2, 4, 8, 2**31 - 1]), phase, on, rng.choice(list(ReclaimPolicy)),
                           (PodRef("p", "uid-p"),) if is_bound else (), rejected)
            claims.append(c)
            if c.bound and c.class_name in cluster.classes:  # `used` counts this set's bound claims too
                per_node = used.setdefault(cluster.classes[c.class_name].resource_name, {})
                per_node[c.node_name] = per_node.get(c.node_name, 0) + c.count
        d = decide(pod, claims, cluster, used, NOW, rng.choice(list(Strategy)))
        assert isinstance(d, (Placed, Waiting))
        if isinstance(d, Waiting):
            assert d.message and set(d.claims) == {c.name for c in claims}
            continue
        node = cluster.nodes[d.node]
        assert node.ready, seed
        assert pod.rules.admits(node.name, node.labels, node.blocking_taints), seed
        new = Counter[str]()
        for a in d.new_gpus():
            cls = cluster.classes[next(c for c in claims if c.name == a.claim).class_name]
            assert cls.selects(node) and not cls.deleting and not node.unschedulable, seed
            assert not any(r.node_name == d.node and r.until > NOW for c in claims for r in c.rejected), seed
            new[a.resource] += a.count
        for resource, n in new.items():  # I1
            assert used.get(resource, {}).get(d.node, 0) + n <= node.allocatable.get(resource, 0), seed


# -- claims' status ----------------------------------------------------------------------


def test_the_claim_plan_takes_any_status_the_schema_allows() -> None:
    rng = random.Random(7)
    times = ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00+23:59", "2026-01-01T00:05:00+05:00",
             "2025-12-31T23:59:59.123456789Z", "2026-01-01T00:00:30Z", "not a time", None,
             # No offset: the API server's date-time format takes these too.
             "2099-01-01T00:00:00", "2026-01-01"]
    for _ in range(3000):
        status: dict[str, Any] = {"phase": rng.choice(["Pending", "Bound", "Lost", None])}
        if status["phase"] in ("Bound", "Lost"):
            status["nodeName"] = rng.choice(["n0", "n1"])
        refs = [{"name": f"p{i}", "uid": f"u{i}"} for i in range(rng.randint(0, 2))]
        status["reservedFor"] = refs
        status["rejectedNodes"] = [{"nodeName": rng.choice(["n0", "n1"]), "until": rng.choice(times)}
                                   for _ in range(rng.randint(0, 2))]
        claim = {"metadata": {"name": "c", "namespace": "ns", "uid": "cu",
                              "finalizers": [api.CLAIM_FINALIZER] if rng.random() < 0.5 else [],
                              **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if rng.random() < 0.2 else {})},
                 "spec": {"className": "a", "count": rng.choice([1, 2**31 - 1]),
                          "reclaimPolicy": rng.choice(["Release", "Retain"])},
                 "status": status}
        pods = {r["uid"]: rng.choice([None, PodFacts(r["uid"]), PodFacts("other"), PodFacts(r["uid"], "Failed")])
                for r in refs}
        node = NodeFacts(exists=rng.random() < 0.8, ready=rng.random() < 0.7,
                         unhealthy_since=rng.choice([None, NOW - timedelta(seconds=999)]))
        plan = plan_claim(claim, pods, False, node if status.get("nodeName") else None, NOW,
                          node_lost_grace=300, reject_for=600,
                          nodes_changed={"n0": NOW - timedelta(seconds=rng.choice([1, 10_000]))})
        assert plan.requeue_after is None or plan.requeue_after >= 0
        ClaimState.from_api(claim)  # what placement reads of it


# -- the webhook -------------------------------------------------------------------------


class _View:
    controller_users = frozenset({"system:serviceaccount:gpuclaimctl:gpuclaimctl"})

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        return {api.DEFAULT_CLASS_LABEL: "a100"} if namespace == "dft" else {}

    def fresh_namespace_labels(self, namespace: str) -> dict[str, str] | None:
        return self.namespace_labels(namespace)

    def has_budget(self, namespace: str) -> bool:
        return namespace == "bud"

    def class_resources(self) -> dict[str, str]:
        return {"a100": GPU}

    def template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"spec": {"className": "a100", "count": 2}}} if name == "pair" else None

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"className": "a100", "count": 1}, "status": {"reservedFor": [{"name": "p", "uid": "u"}]}}


def _odd_pod(rng: random.Random, texts: list[str]) -> Any:
    if rng.random() < 0.25:
        return rvalue(rng)
    annotations = rng.choice([{}, {api.CLAIMS_ANNOTATION: rng.choice(texts)}, "x", None, {api.CLAIMS_ANNOTATION: 5}])
    gpus = rng.choice(QUANTITIES + ["500m", "x", 3, None, []])
    spec = rng.choice([
        {"containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}],
         "schedulingGates": rng.choice([[{"name": api.SCHEDULING_GATE}], None, "x", [1]])},
        {"initContainers": [{"restartPolicy": "Always", "resources": {"requests": {GPU: gpus}}}]},
        None, "x", {"containers": "x"}, {"containers": [1]}, {"overhead": "x"}, {"nodeName": "n0"}])
    return {"metadata": rng.choice([{"name": "p", "uid": "u", "annotations": annotations}, None, "x", []]),
            "spec": spec}


def test_the_webhook_answers_any_body_or_refuses_it_as_a_bad_review() -> None:
    rng = random.Random(8)
    texts = odd_texts(random.Random(9))[::50] + ['[{"name":"g","className":"a100","count":1}]',
                                                 '[{"name":"g","template":"pair"}]', '[{"name":"g","claim":"c"}]']
    view = _View()
    answered = 0
    for _ in range(5000):
        request = {"uid": rng.choice(["u1", "", None, 5]), "operation": rng.choice(["CREATE", "UPDATE", "DELETE", "X"]),
                   "namespace": rng.choice(["dft", "bud", "x", None]),
                   "resource": rng.choice([{"group": "", "resource": "pods"}, None, {"group": 5}]),
                   "userInfo": rng.choice([{"username": "bob"}, None, {}]),
                   "object": _odd_pod(rng, texts), "oldObject": _odd_pod(rng, texts)}
        body: Any = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        if rng.random() < 0.05:
            body = rvalue(rng)
        raw = json.dumps(body).encode()
        if rng.random() < 0.02:
            raw = raw[: rng.randint(0, len(raw))]
        try:
            req = parse_review(raw)
        except BadReview as e:
            assert str(e)
            continue
        for route in (mutate, validate):
            verdict = route(req, view)
            assert isinstance(verdict, Verdict)
            json.dumps(response(req.uid, verdict))
            answered += 1
    for raw in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000, b"\xff\xfe", b""):
        with pytest.raises(BadReview):
            parse_review(raw)
    assert answered


# -- the handlers and syncs, on the in-memory API ----------------------------------------


def test_handlers_and_syncs_survive_odd_objects_and_say_what_is_wrong() -> None:
    from tests.sim.fakeapi import BUDGETS, CLAIMS, NODES, PODS
    from tests.sim.harness import NS, RESOURCE, Sim

    class OddSim(Sim):
        def allocatable(self) -> dict[str, int]:
            return {n["metadata"]["name"]: parse_quantity(n["status"]["allocatable"].get(RESOURCE)) or 0
                    for n in self.fake.list(NODES).items}

    texts = odd_texts(random.Random(10))[::40]
    for seed in range(25):
        sim = OddSim(seed, steps=0)
        rng = random.Random(seed)
        fake = sim.fake
        for i in range(rng.randint(1, 3)):
            node = random_node_object(rng, f"odd{i}" + ("x" * 240 if rng.random() < 0.2 else ""))
            node["status"]["allocatable"][RESOURCE] = rng.choice(QUANTITIES)
            fake.create(NODES, node)
        for i in range(2):
            until = rng.choice(["9999-12-31T23:59:59Z", "2026-01-01T00:10:00+05:00", "0001-01-01T00:00:00+23:59"])
            fake.create(CLAIMS, {"metadata": {"name": f"odd{i}", "namespace": NS},
                                 "spec": {"className": rng.choice(["alpha", "beta", "gamma"]),
                                          "count": rng.choice([1, 2**31 - 1])},
                                 "status": {"rejectedNodes": [{"nodeName": "n0", "until": until}]}})
        for i in range(rng.randint(2, 6)):
            meta: dict[str, Any] = {"name": f"q{i}" + ("y" * 240 if rng.random() < 0.2 else ""), "namespace": NS}
            spec: dict[str, Any] = {**random_pod_spec(rng),
                                    "containers": [{"name": "c", "resources": {"limits": {RESOURCE: rng.choice(QUANTITIES)}}}]}
            if rng.random() < 0.25:
                spec["nodeName"] = rng.choice(["n0", "n1", "odd0"])  # a pod without claims, on a node
            else:
                spec["schedulingGates"] = [{"name": api.SCHEDULING_GATE}]
                entries = [{"name": "e" * rng.choice((1, 63)), "className": rng.choice(["alpha", "beta"]),
                            "count": rng.choice([1, 2, 2**31 - 1])}]
                meta["annotations"] = {api.CLAIMS_ANNOTATION: rng.choice([*texts, json.dumps(entries)])}
            if rng.random() < 0.5:
                meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                            "uid": "rs-uid", "controller": True}]
            fake.create(PODS, {"metadata": meta, "spec": spec})
        if rng.random() < 0.5:
            fake.create(BUDGETS, {"metadata": {"name": "odd", "namespace": NS},
                                  "spec": {"limits": [{"className": "*", "gpus": rng.choice([0, 1_000_000])}]}})
        sim.drain()  # handlers raise through here; I1 is checked after every round
        failed = [line for line in sim.log if " failed: " in line
                  and not any(t in line for t in ("Conflict", "NotFound", "AlreadyExists"))]
        assert not failed, (seed, failed)
        for pod in fake.list(PODS).items:
            if api.CLAIMS_ANNOTATION not in (pod["metadata"].get("annotations") or {}):
                continue
            try:
                pod_claims(pod)
            except PodClaimsError:
                involved = f"Pod/{NS}/{pod['metadata']['name']}"
                assert has_gate(pod), (seed, involved)
                assert any(e.involved == involved and e.type == "Warning" and e.reason == "InvalidClaims"
                           for e in fake.events), (seed, involved)
