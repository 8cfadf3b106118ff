"""The pod webhooks' decisions, from literals (issue 14 items 1 and 2)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import PodClaimsError, pod_claims
from gpuclaimctl.webhook.pods import mutate, validate
from gpuclaimctl.webhook.review import AdmissionRequest, Operation, Verdict, response

CONTROLLER = "system:serviceaccount:gpuclaimctl-system:gpuclaimctl"
GATE = {"name": api.SCHEDULING_GATE}


@dataclass
class FakeView:
    namespaces: dict[str, dict[str, str]] = field(default_factory=lambda: {"team": {}})
    budgets: set[str] = field(default_factory=set)
    classes: dict[str, str] = field(default_factory=lambda: {"a100": "nvidia.com/gpu",
                                                             "mi300": "amd.com/gpu"})
    templates: dict[str, Any] = field(default_factory=dict)
    claims: dict[str, Any] = field(default_factory=dict)
    # What the API server has, where the cache (`namespaces`) lags behind;
    # an exception to raise for a read that fails.
    live_namespaces: dict[str, dict[str, str]] | None = None
    live_error: Exception | None = None
    live_reads: int = 0

    @property
    def controller_users(self) -> Set[str]:
        return frozenset({CONTROLLER})

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.namespaces.get(namespace)

    def fresh_namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        self.live_reads += 1
        if self.live_error is not None:
            raise self.live_error
        live = self.namespaces if self.live_namespaces is None else self.live_namespaces
        return live.get(namespace)

    def has_budget(self, namespace: str) -> bool:
        return namespace in self.budgets

    def class_resources(self) -> Mapping[str, str]:
        return self.classes

    def template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.templates.get(name)

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.claims.get(name)


def pod(*, claims: Any = None, gated: bool = False, gpus: int = 0, resource: str = "nvidia.com/gpu",
        init_gpus: int = 0, node: str = "", name: str = "trainer", uid: str = "uid-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": uid}
    if claims is not None:
        meta["annotations"] = {api.CLAIMS_ANNOTATION: claims if isinstance(claims, str) else json.dumps(claims)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if gpus:
        spec["containers"][0]["resources"] = {"limits": {resource: str(gpus)}}
    if init_gpus:
        spec["initContainers"] = [{"name": "init", "image": "busybox",
                                   "resources": {"limits": {resource: str(init_gpus)}}}]
    if gated:
        spec["schedulingGates"] = [dict(GATE)]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def request(obj: Any, *, old: Any = None, user: str = "alice", namespace: str = "team",
            operation: Operation | None = None) -> AdmissionRequest:
    op = operation or (Operation.UPDATE if old is not None else Operation.CREATE)
    return AdmissionRequest(uid="u-1", operation=op, namespace=namespace, name="trainer",
                            username=user, group="", resource="pods", sub_resource="",
                            object=obj, old_object=old)


def apply_patch(obj: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """Apply the verdict's JSON patch (only `add`, as the webhook sends) the
    way the API server would, via its encoded form in the response."""
    out = copy.deepcopy(obj)
    answer = response("u-1", verdict)["response"]
    if "patch" not in answer:
        return out
    assert answer["patchType"] == "JSONPatch"
    for op in json.loads(base64.b64decode(answer["patch"])):
        assert op["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target[p]
        if isinstance(target, list):
            assert last == "-"
            target.append(op["value"])
        else:
            assert last not in target, f"add over an existing {op['path']}"
            target[last] = op["value"]
    return out


# -- mutation -------------------------------------------------------------------------


def test_a_pod_naming_claims_without_the_gate_gets_the_gate() -> None:
    p = pod(claims=[{"name": "g", "className": "a100", "count": 1}], gpus=1)
    mutated = apply_patch(p, mutate(request(p), FakeView()))
    assert mutated["spec"]["schedulingGates"] == [GATE]
    assert mutated["metadata"]["annotations"] == p["metadata"]["annotations"]


def test_the_gate_is_appended_to_other_gates() -> None:
    p = pod(claims=[{"name": "g", "className": "a100", "count": 1}])
    p["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    mutated = apply_patch(p, mutate(request(p), FakeView()))
    assert mutated["spec"]["schedulingGates"] == [{"name": "example.com/other"}, GATE]


def test_a_gpu_pod_in_a_default_class_namespace_gets_an_inline_claim_and_the_gate() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}})
    p = pod(gpus=2)
    mutated = apply_patch(p, mutate(request(p), view))
    assert mutated["spec"]["schedulingGates"] == [GATE]
    entries = pod_claims(mutated)
    assert [(e.name, e.class_name, e.count) for e in entries] == [("gpus", "a100", 2)]
    # And the result passes the validating webhook.
    assert validate(request(mutated), view).allowed


@pytest.mark.parametrize("cached", [None, {}], ids=["namespace-not-cached", "label-not-cached"])
def test_a_label_the_cache_does_not_show_yet_is_read_from_the_api_server(
        cached: dict[str, str] | None) -> None:
    """The API server calls the default-class webhook because the namespace
    carries the label; a cache that lags behind (a namespace just made or
    just labelled) must not let the GPU pod past the gate unchanged."""
    view = FakeView(namespaces={} if cached is None else {"team": cached},
                    live_namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}})
    mutated = apply_patch(pod(gpus=2), mutate(request(pod(gpus=2)), view))
    assert mutated["spec"]["schedulingGates"] == [GATE]
    assert [(e.class_name, e.count) for e in pod_claims(mutated)] == [("a100", 2)]
    assert view.live_reads == 1


def test_a_label_that_cannot_be_read_refuses_the_pod_rather_than_let_it_past() -> None:
    view = FakeView(namespaces={}, live_error=OSError("connection refused"))
    verdict = mutate(request(pod(gpus=2)), view)
    assert not verdict.allowed
    assert "could not read the labels of namespace team" in verdict.message
    assert "connection refused" in verdict.message


def test_a_labelled_namespace_in_the_cache_costs_no_read() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}}, live_error=OSError("x"))
    assert mutate(request(pod(gpus=2)), view).allowed and view.live_reads == 0


def test_the_claim_counts_what_the_scheduler_counts_including_init_containers() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}})
    p = pod(gpus=1, init_gpus=3)
    p["metadata"]["annotations"] = {"other": "kept"}
    mutated = apply_patch(p, mutate(request(p), view))
    assert [e.count for e in pod_claims(mutated)] == [3]
    assert mutated["metadata"]["annotations"]["other"] == "kept"


def test_mutation_is_idempotent() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}})
    for p in (pod(gpus=2), pod(claims=[{"name": "g", "className": "a100", "count": 1}])):
        once = apply_patch(p, mutate(request(p), view))
        again = mutate(request(once), view)
        assert again.allowed and again.patch == ()


@pytest.mark.parametrize(("case", "p", "labels"), [
    pytest.param("no GPUs", pod(), {api.DEFAULT_CLASS_LABEL: "a100"}, id="no-gpus-in-labelled-namespace"),
    pytest.param("other resource", pod(gpus=1, resource="amd.com/gpu"), {api.DEFAULT_CLASS_LABEL: "a100"},
                 id="another-class-resource"),
    pytest.param("unlabelled", pod(gpus=2), {}, id="gpu-pod-in-unlabelled-namespace"),
    pytest.param("scheduled", pod(gpus=2, node="n1"), {api.DEFAULT_CLASS_LABEL: "a100"},
                 id="already-bound-to-a-node"),
    pytest.param("gated", pod(claims=[{"name": "g", "className": "a100", "count": 1}], gated=True),
                 {}, id="already-gated"),
])
def test_pods_the_mutation_leaves_alone(case: str, p: dict[str, Any], labels: dict[str, str]) -> None:
    verdict = mutate(request(p), FakeView(namespaces={"team": labels}))
    assert verdict.allowed and verdict.patch == (), case


def test_the_controllers_own_requests_are_never_changed_or_refused() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}}, budgets={"team"})
    assert mutate(request(pod(gpus=2), user=CONTROLLER), view).patch == ()
    old = pod(claims=[{"name": "g", "className": "a100", "count": 1}], gated=True)
    new = pod(claims=[{"name": "g", "className": "a100", "count": 1}])
    assert validate(request(new, old=old, user=CONTROLLER), view).allowed


def test_a_default_class_not_created_yet_counts_the_default_resource() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "h100"}})
    mutated = apply_patch(pod(gpus=1), mutate(request(pod(gpus=1)), view))
    assert [(e.class_name, e.count) for e in pod_claims(mutated)] == [("h100", 1)]


# -- validation at create -----------------------------------------------------------------


def test_an_invalid_annotation_is_refused_with_the_controllers_own_message() -> None:
    p = pod(claims='[{"name": "g", "template": "t", "claim": "c"}]', gated=True)
    with pytest.raises(PodClaimsError) as parsed:
        pod_claims(p)
    verdict = validate(request(p), FakeView())
    assert not verdict.allowed
    assert verdict.message == str(parsed.value)
    assert verdict.code == 422 and "\n" not in verdict.message


def test_a_gated_pod_without_the_annotation_is_refused() -> None:
    verdict = validate(request(pod(gated=True)), FakeView())
    assert not verdict.allowed and "has no gpuclaimctl.io/claims annotation" in verdict.message


def test_a_pod_naming_claims_that_is_not_gated_is_refused() -> None:
    verdict = validate(request(pod(claims=[{"name": "g", "className": "a100", "count": 1}])), FakeView())
    assert not verdict.allowed and "lacks the scheduling gate" in verdict.message


def test_a_pod_naming_claims_that_sets_its_node_is_refused() -> None:
    p = pod(claims=[{"name": "g", "className": "a100", "count": 1}], node="n1")
    verdict = validate(request(p), FakeView())
    assert not verdict.allowed and "spec.nodeName" in verdict.message


def test_requesting_more_than_the_claims_hold_is_refused_with_the_numbers() -> None:
    view = FakeView(templates={"pair": {"spec": {"spec": {"className": "a100", "count": 2}}}})
    p = pod(claims=[{"name": "pair", "template": "pair"}, {"name": "one", "className": "a100", "count": 1}],
            gated=True, gpus=4)
    verdict = validate(request(p), view)
    assert not verdict.allowed
    assert "request 4 nvidia.com/gpu but its GPU claims hold 3" in verdict.message
    assert "entry 'pair': 2 a100 (GPUClaimTemplate pair)" in verdict.message
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    assert validate(request(p), view).allowed


def test_requesting_another_class_resource_than_the_claims_is_refused() -> None:
    p = pod(claims=[{"name": "g", "className": "a100", "count": 1}], gated=True, gpus=1,
            resource="amd.com/gpu")
    verdict = validate(request(p), FakeView())
    assert not verdict.allowed and "request 1 amd.com/gpu but its GPU claims hold 0" in verdict.message


def test_the_request_check_waits_for_claims_the_caches_do_not_show() -> None:
    # A template not (yet) in the cache: the controller will say ClaimMissing.
    p = pod(claims=[{"name": "pair", "template": "missing"}], gated=True, gpus=8)
    assert validate(request(p), FakeView()).allowed


def test_budgets_have_teeth_for_gpu_pods_without_claims() -> None:
    view = FakeView(budgets={"team"})
    verdict = validate(request(pod(gpus=2)), view)
    assert not verdict.allowed
    assert "namespace team has a GPUBudget" in verdict.message
    assert "requests 2 nvidia.com/gpu" in verdict.message
    assert '[{"name": "gpus", "className": "a100", "count": 2}]' in verdict.message
    assert api.DEFAULT_CLASS_LABEL in verdict.message
    # Without GPUs, or without a budget, nothing is refused.
    assert validate(request(pod()), view).allowed
    assert validate(request(pod(gpus=2)), FakeView()).allowed


def test_a_gpu_pod_the_default_class_mutation_missed_is_refused() -> None:
    view = FakeView(namespaces={"team": {api.DEFAULT_CLASS_LABEL: "a100"}})
    verdict = validate(request(pod(gpus=1)), view)
    assert not verdict.allowed and "did not give it any" in verdict.message


# -- validation at update -------------------------------------------------------------------


CLAIMS = [{"name": "g", "className": "a100", "count": 1}]


def test_only_the_controller_removes_the_gate() -> None:
    old, new = pod(claims=CLAIMS, gated=True), pod(claims=CLAIMS)
    verdict = validate(request(new, old=old), FakeView())
    assert not verdict.allowed and verdict.code == 403
    assert "removed by gpuclaimctl alone" in verdict.message


def test_a_waiting_pods_claims_may_change_while_none_is_reserved() -> None:
    old = pod(claims=CLAIMS, gated=True)
    new = pod(claims=[{"name": "g", "className": "a100", "count": 2}], gated=True)
    assert validate(request(new, old=old), FakeView()).allowed
    bad = pod(claims="[", gated=True)
    assert validate(request(bad, old=old), FakeView()).code == 422


def test_claims_reserved_for_the_pod_fix_its_annotation() -> None:
    old = pod(claims=CLAIMS, gated=True)
    new = pod(claims=[{"name": "g", "className": "a100", "count": 2}], gated=True)
    view = FakeView(claims={"trainer-g": {"status": {"reservedFor": [{"name": "trainer", "uid": "uid-1"}]}}})
    verdict = validate(request(new, old=old), view)
    assert not verdict.allowed and "trainer-g are already reserved for this pod" in verdict.message


def test_a_released_pods_claims_are_fixed() -> None:
    old, new = pod(claims=CLAIMS), pod(claims=[{"name": "g", "className": "a100", "count": 8}])
    verdict = validate(request(new, old=old), FakeView())
    assert not verdict.allowed and "can change only while the pod waits" in verdict.message
    # Adding claims to a pod that never had any is refused the same way.
    assert not validate(request(pod(claims=CLAIMS), old=pod()), FakeView()).allowed


def test_other_updates_of_a_gated_pod_pass() -> None:
    old = pod(claims=CLAIMS, gated=True)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    assert validate(request(new, old=old), FakeView()).allowed


def test_deletes_and_other_resources_are_not_judged() -> None:
    req = AdmissionRequest(uid="u", operation=Operation.DELETE, namespace="team", name="p",
                           username="alice", group="", resource="pods", sub_resource="",
                           object=None, old_object=pod(gated=True))
    assert validate(req, FakeView()).allowed
    status = AdmissionRequest(uid="u", operation=Operation.UPDATE, namespace="team", name="p",
                              username="alice", group="", resource="pods", sub_resource="status",
                              object=pod(), old_object=pod(gated=True))
    assert validate(status, FakeView()).allowed
