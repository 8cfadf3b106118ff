from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuclaimctl.model.nodeaffinity import (
    Mismatch,
    NodeSelector,
    PodNodeRules,
    Taint,
    Toleration,
    VolumeConstraint,
    pin_to_node,
    pinned_node,
    untolerated_node_state_taint,
    untolerated_taint,
)

LABELS = {"zone": "a", "gpu": "a100", "gen": "8", "neg": "-3"}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


@pytest.mark.parametrize(
    "requirement, matches",
    [
        pytest.param(expr("zone", "In", "a", "b"), True, id="In-hit"),
        pytest.param(expr("zone", "In", "b"), False, id="In-miss"),
        pytest.param(expr("rack", "In", "a"), False, id="In-label-absent"),
        pytest.param(expr("zone", "NotIn", "b"), True, id="NotIn-hit"),
        pytest.param(expr("zone", "NotIn", "a"), False, id="NotIn-miss"),
        pytest.param(expr("rack", "NotIn", "a"), True, id="NotIn-label-absent-matches"),
        pytest.param(expr("gpu", "Exists"), True, id="Exists"),
        pytest.param(expr("rack", "Exists"), False, id="Exists-absent"),
        pytest.param(expr("rack", "DoesNotExist"), True, id="DoesNotExist"),
        pytest.param(expr("gpu", "DoesNotExist"), False, id="DoesNotExist-present"),
        pytest.param(expr("gen", "Gt", "7"), True, id="Gt"),
        pytest.param(expr("gen", "Gt", "8"), False, id="Gt-equal-is-not-greater"),
        pytest.param(expr("gen", "Lt", "9"), True, id="Lt"),
        pytest.param(expr("gen", "Lt", "8"), False, id="Lt-equal-is-not-less"),
        pytest.param(expr("neg", "Lt", "-2"), True, id="Lt-negative"),
        pytest.param(expr("gpu", "Gt", "1"), False, id="Gt-label-not-a-number"),
        pytest.param(expr("rack", "Gt", "1"), False, id="Gt-label-absent"),
        pytest.param(expr("gen", "Gt", "x"), False, id="Gt-value-not-a-number"),
        pytest.param(expr("gen", "Gt", "1", "2"), False, id="Gt-two-values-invalid"),
        pytest.param(expr("gen", "Gt", "9223372036854775808"), False, id="Gt-value-beyond-int64"),
        pytest.param(expr("zone", "In"), False, id="In-without-values-invalid"),
        pytest.param(expr("zone", "Exists", "a"), False, id="Exists-with-values-invalid"),
        pytest.param(expr("zone", "Like", "a"), False, id="unknown-operator"),
    ],
)
def test_match_expressions_operators(requirement: dict[str, Any], matches: bool) -> None:
    selector = NodeSelector.from_api(required({"matchExpressions": [requirement]}))
    assert selector.matches("node-1", LABELS) is matches


@pytest.mark.parametrize(
    "fields, matches",
    [
        pytest.param([expr("metadata.name", "In", "node-1")], True, id="In-name"),
        pytest.param([expr("metadata.name", "In", "node-2")], False, id="In-other-name"),
        pytest.param([expr("metadata.name", "NotIn", "node-2")], True, id="NotIn-other-name"),
        pytest.param([expr("metadata.name", "NotIn", "node-1")], False, id="NotIn-name"),
        pytest.param([expr("metadata.name", "In", "node-1", "node-2")], False, id="In-two-values-invalid"),
        pytest.param([expr("metadata.name", "Exists")], False, id="Exists-invalid-for-fields"),
        pytest.param([expr("metadata.uid", "In", "node-1")], False, id="unknown-field"),
    ],
)
def test_match_fields_on_the_node_name(fields: list[dict[str, Any]], matches: bool) -> None:
    selector = NodeSelector.from_api(required({"matchFields": fields}))
    assert selector.matches("node-1", LABELS) is matches


def test_requirements_in_a_term_are_anded_and_terms_are_ored() -> None:
    both = {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "node-1")]}
    assert NodeSelector.from_api(required(both)).matches("node-1", LABELS)
    assert not NodeSelector.from_api(required(both)).matches("node-2", LABELS)
    either = required({"matchExpressions": [expr("zone", "In", "x")]}, {"matchExpressions": [expr("gpu", "Exists")]})
    assert NodeSelector.from_api(either).matches("node-1", LABELS)


def test_an_empty_term_matches_nothing_but_another_term_still_can() -> None:
    assert not NodeSelector.from_api(required({})).matches("node-1", LABELS)
    assert NodeSelector.from_api(required({}, {"matchExpressions": [expr("gpu", "Exists")]})).matches("node-1", LABELS)


def test_a_malformed_term_matches_nothing_but_another_term_still_can() -> None:
    bad = {"matchExpressions": [expr("zone", "In")]}
    good = {"matchExpressions": [expr("zone", "In", "a")]}
    assert not NodeSelector.from_api(required(bad)).matches("node-1", LABELS)
    assert NodeSelector.from_api(required(bad, good)).matches("node-1", LABELS)


def test_no_terms_matches_nothing() -> None:
    assert not NodeSelector.from_api(required()).matches("node-1", LABELS)


@pytest.mark.parametrize(
    "toleration, taint, tolerated",
    [
        pytest.param(Toleration("gpu", "Equal", "x", "NoSchedule"), Taint("gpu", "NoSchedule", "x"), True, id="equal-all"),
        pytest.param(Toleration("gpu", "Equal", "y", "NoSchedule"), Taint("gpu", "NoSchedule", "x"), False, id="equal-other-value"),
        pytest.param(Toleration("gpu", "", "x", ""), Taint("gpu", "NoExecute", "x"), True, id="empty-operator-is-equal"),
        pytest.param(Toleration("gpu", "Exists", "", ""), Taint("gpu", "NoSchedule", "x"), True, id="exists-any-value"),
        pytest.param(Toleration("gpu", "Exists", "", "NoExecute"), Taint("gpu", "NoSchedule"), False, id="exists-other-effect"),
        pytest.param(Toleration("", "Exists", "", ""), Taint("anything", "NoExecute", "v"), True, id="empty-key-exists-tolerates-all"),
        pytest.param(Toleration("", "Exists", "", "NoSchedule"), Taint("anything", "NoExecute"), False, id="empty-key-one-effect"),
        pytest.param(Toleration("other", "Exists"), Taint("gpu", "NoSchedule"), False, id="other-key"),
        pytest.param(Toleration("gpu", "Equal", "", ""), Taint("gpu", "NoSchedule", ""), True, id="equal-empty-values"),
        pytest.param(Toleration("gpu", "Gt", "1"), Taint("gpu", "NoSchedule", "2"), False, id="unknown-operator"),
    ],
)
def test_toleration_semantics(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_prefer_no_schedule_taints_never_block() -> None:
    assert untolerated_taint([], [Taint("soft", "PreferNoSchedule")]) is None


def test_node_state_taints_are_left_to_readiness_and_cordon_checks() -> None:
    taints = [
        Taint("node.kubernetes.io/unschedulable", "NoSchedule"),
        Taint("node.kubernetes.io/not-ready", "NoExecute"),
        Taint("node.kubernetes.io/unreachable", "NoSchedule"),
    ]
    assert untolerated_taint([], taints) is None


def test_a_refusal_is_explained_by_the_node_state_only_for_its_own_taints() -> None:
    # What the refused-pod check asks: is the node's state (not its fit) the
    # reason? A not-ready taint that lags behind Ready is; a user's taint
    # added after the release is not, and the set moves on.
    not_ready = Taint("node.kubernetes.io/not-ready", "NoSchedule")
    assert untolerated_node_state_taint([], [Taint("maintenance", "NoSchedule"), not_ready]) == not_ready
    assert untolerated_node_state_taint([], [Taint("maintenance", "NoSchedule")]) is None
    assert untolerated_node_state_taint([], [Taint("node.kubernetes.io/unreachable", "PreferNoSchedule")]) is None
    # The default tolerations for NoExecute not-ready/unreachable (300 s) cover those.
    default = Toleration("node.kubernetes.io/not-ready", "Exists", effect="NoExecute")
    assert untolerated_node_state_taint([default], [Taint("node.kubernetes.io/not-ready", "NoExecute")]) is None


def test_the_first_untolerated_blocking_taint_is_reported() -> None:
    taints = [Taint("a", "NoSchedule"), Taint("b", "NoExecute", "1")]
    assert untolerated_taint([Toleration("a", "Exists")], taints) == Taint("b", "NoExecute", "1")
    assert str(Taint("b", "NoExecute", "1")) == "b=1:NoExecute"


def pod_spec(**spec: Any) -> dict[str, Any]:
    return spec


@pytest.mark.parametrize(
    "spec, taints, expected",
    [
        pytest.param(pod_spec(), (), None, id="unconstrained"),
        pytest.param(pod_spec(nodeSelector={"zone": "a"}), (), None, id="nodeSelector-match"),
        pytest.param(pod_spec(nodeSelector={"zone": "b"}), (), Mismatch.NODE_SELECTOR, id="nodeSelector-other-value"),
        pytest.param(pod_spec(nodeSelector={"rack": "1"}), (), Mismatch.NODE_SELECTOR, id="nodeSelector-absent-label"),
        pytest.param(
            pod_spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(
                {"matchExpressions": [expr("zone", "NotIn", "a")]})}}),
            (), Mismatch.NODE_AFFINITY, id="affinity",
        ),
        pytest.param(
            pod_spec(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "z")]}}]}}),
            (), None, id="preferred-affinity-ignored",
        ),
        pytest.param(pod_spec(), (Taint("gpu", "NoSchedule"),), Mismatch.TAINT, id="untolerated-taint"),
        pytest.param(
            pod_spec(tolerations=[{"key": "gpu", "operator": "Exists"}]),
            (Taint("gpu", "NoSchedule"),), None, id="tolerated-taint",
        ),
        pytest.param(
            pod_spec(nodeSelector={"zone": "b"}, tolerations=[]),
            (Taint("gpu", "NoSchedule"),), Mismatch.NODE_SELECTOR, id="selector-reported-before-taint",
        ),
    ],
)
def test_pod_rules_report_the_first_rule_a_node_breaks(
    spec: dict[str, Any], taints: tuple[Taint, ...], expected: Mismatch | None
) -> None:
    rules = PodNodeRules.from_pod_spec(spec)
    assert rules.mismatch("node-1", LABELS, taints) is expected
    assert rules.admits("node-1", LABELS, taints) is (expected is None)


PIN = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}


def test_pin_adds_one_term_when_the_pod_has_no_required_affinity() -> None:
    affinities: list[dict[str, Any] | None] = [
        None, {}, {"nodeAffinity": {}}, {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}]
    for affinity in affinities:
        out = pin_to_node(affinity, "node-7")
        assert out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [PIN]}]
        }
        assert pinned_node(out) == "node-7"


def test_pin_appends_to_every_non_empty_term_and_keeps_everything_else() -> None:
    affinity = {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
            "requiredDuringSchedulingIgnoredDuringExecution": required(
                {"matchExpressions": [expr("zone", "In", "a")]},
                {},
                {"matchFields": [expr("metadata.name", "NotIn", "node-3")]},
            ),
        },
    }
    before = copy.deepcopy(affinity)
    out = pin_to_node(affinity, "node-7")
    assert affinity == before, "the input is not modified"
    terms = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [PIN]},
        {},
        {"matchFields": [expr("metadata.name", "NotIn", "node-3"), PIN]},
    ]
    assert out["podAntiAffinity"] == {"x": 1}
    assert out["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}]
    assert pinned_node(out) == "node-7"


def test_pinned_affinity_matches_only_the_pinned_node() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(
        {"matchExpressions": [expr("zone", "In", "a")]}, {"matchExpressions": [expr("gpu", "Exists")]})}}
    rules = PodNodeRules.from_pod_spec({"affinity": pin_to_node(affinity, "node-7")})
    assert rules.admits("node-7", LABELS, ())
    assert not rules.admits("node-8", LABELS, ())


def test_pin_is_idempotent() -> None:
    once = pin_to_node(None, "node-7")
    assert pin_to_node(once, "node-7") == once


def test_pinned_node_ignores_a_pods_own_name_requirements() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(
        {"matchFields": [expr("metadata.name", "NotIn", "node-3")]})}}
    assert pinned_node(own) is None
    assert pinned_node(None) is None
    assert pinned_node(pin_to_node(own, "node-9")) == "node-9"


# --- volumes ------------------------------------------------------------------


def local_volume(host: str, pv: str = "pv-data") -> VolumeConstraint:
    selector = NodeSelector.from_api(required({"matchExpressions": [expr("kubernetes.io/hostname", "In", host)]}))
    return VolumeConstraint("data", "data", pv, selector)


HOST_1 = {**LABELS, "kubernetes.io/hostname": "node-1"}


@pytest.mark.parametrize(
    "spec, volumes, taints, expected",
    [
        pytest.param(pod_spec(), (local_volume("node-1"),), (), None, id="volume-reaches-the-node"),
        pytest.param(pod_spec(), (local_volume("node-2"),), (), Mismatch.VOLUME, id="volume-does-not-reach"),
        pytest.param(pod_spec(), (local_volume("node-1"), local_volume("node-2", "pv-2")), (), Mismatch.VOLUME,
                     id="every-volume-must-reach"),
        pytest.param(pod_spec(nodeSelector={"zone": "b"}), (local_volume("node-2"),), (), Mismatch.NODE_SELECTOR,
                     id="pods-own-rules-reported-first"),
        pytest.param(pod_spec(), (local_volume("node-2"),), (Taint("gpu", "NoSchedule"),), Mismatch.VOLUME,
                     id="volume-reported-before-taint"),
    ],
)
def test_pod_rules_require_every_bound_volume_to_reach_the_node(
    spec: dict[str, Any], volumes: tuple[VolumeConstraint, ...], taints: tuple[Taint, ...], expected: Mismatch | None
) -> None:
    rules = PodNodeRules.from_pod_spec(spec, volumes)
    assert rules.mismatch("node-1", HOST_1, taints) is expected
    assert rules.admits("node-1", HOST_1, taints) is (expected is None)


def test_the_first_unreachable_volume_is_named() -> None:
    rules = PodNodeRules.from_pod_spec({}, (local_volume("node-1", "pv-a"), local_volume("node-2", "pv-b")))
    assert rules.unreachable_volume(HOST_1) == local_volume("node-2", "pv-b")
    assert rules.unreachable_volume({**LABELS, "kubernetes.io/hostname": "node-2"}) == local_volume("node-1", "pv-a")
    assert PodNodeRules.from_pod_spec({}).unreachable_volume(HOST_1) is None


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(None, id="none"),
        pytest.param("zone=a", id="string"),
        pytest.param({"nodeSelectorTerms": {"matchExpressions": []}}, id="terms-not-a-list"),
        pytest.param({"nodeSelectorTerms": ["zone=a"]}, id="term-not-an-object"),
        pytest.param(required({"matchExpressions": [["zone", "In", "a"]]}), id="requirement-not-an-object"),
        pytest.param(required({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": [7]}]}),
                     id="value-not-a-string"),
        pytest.param(required({"matchFields": "metadata.name"}), id="fields-not-a-list"),
        pytest.param(required({"matchExpressions": [{"key": 1, "operator": "Exists"}]}), id="key-not-a-string"),
    ],
)
def test_a_selector_not_in_the_apis_shape_matches_no_node_and_does_not_raise(raw: Any) -> None:
    assert not NodeSelector.from_api(raw).matches("node-1", LABELS)


def test_selectors_read_back_for_messages() -> None:
    selector = NodeSelector.from_api(required(
        {"matchExpressions": [expr("zone", "In", "a", "b"), expr("disk", "Exists")]},
        {"matchFields": [expr("metadata.name", "In", "node-9")]},
        {"matchExpressions": [expr("rack", "In", *(f"r{i}" for i in range(8)))]},
    ))
    assert str(selector) == (
        "zone In [a, b] and disk Exists, or metadata.name In [node-9], or rack In [r0, r1, r2, r3, r4 and 3 more]"
    )
    volume = VolumeConstraint("data", "data", "pv-data", selector)
    assert str(volume) == "PersistentVolume pv-data (claim data)"
    assert "a label such as kubernetes.io/hostname" in volume.reach()
    assert local_volume("node-3").reach() == "nodes matching kubernetes.io/hostname In [node-3]"
