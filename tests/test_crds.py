"""The CRDs in deploy/crds, installed on the real API server.

What is shown here is what the API server itself does with the schemas:
refuse bad objects, fill in defaults, keep a claim's spec frozen, keep status
apart from spec, and print the columns `kubectl get` shows. The controller
is not running; nothing here depends on it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client

pytestmark = pytest.mark.plane

GROUP = "gpuclaimctl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
MERGE_PATCH = "application/merge-patch+json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


# -- helpers ------------------------------------------------------------------


def claim_body(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUClaim", "metadata": {"name": name},
            "spec": spec}


def template_body(name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": spec, **extra}}


def obj(result: object) -> dict[str, Any]:
    """The custom objects API returns plain dicts, typed as `object`."""
    assert isinstance(result, dict), result
    return result


def refused(call: Callable[[], object]) -> str:
    """Run a write the API server must refuse as invalid; return its message."""
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status == 422, info.value.body
    message: str = json.loads(info.value.body or "{}")["message"]
    return message


def raw_get(api_client: client.ApiClient, path: str, accept: str) -> dict[str, Any]:
    """GET with an Accept header the typed client cannot ask for (Tables)."""
    method, url, headers, _body, _files = api_client.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"])
    response = api_client.call_api(method, url, headers)
    data = response.read()
    assert response.status == 200, data
    result: dict[str, Any] = json.loads(data)
    return result


@pytest.fixture
def custom(api_client: client.ApiClient, crds: list[str]) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def claims(custom: client.CustomObjectsApi, namespace: str) -> Any:
    """Claim calls bound to the test's namespace."""

    class Claims:
        def create(self, body: dict[str, Any]) -> dict[str, Any]:
            return obj(custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuclaims", body))

        def get(self, name: str) -> dict[str, Any]:
            return obj(custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuclaims", name))

        def replace(self, body: dict[str, Any]) -> dict[str, Any]:
            return obj(custom.replace_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuclaims", body["metadata"]["name"], body))

        def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            return obj(custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuclaims", name, patch,
                _content_type=MERGE_PATCH))

        def replace_status(self, body: dict[str, Any]) -> dict[str, Any]:
            return obj(custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "gpuclaims", body["metadata"]["name"], body))

        def patch_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            return obj(custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "gpuclaims", name, patch,
                _content_type=MERGE_PATCH))

    return Claims()


@pytest.fixture
def make_class(custom: client.CustomObjectsApi) -> Iterator[Callable[..., dict[str, Any]]]:
    """Create GPUClasses (cluster-scoped, so uniquely named); delete them after."""
    made: list[str] = []

    def make(spec: dict[str, Any] | None = None) -> dict[str, Any]:
        name = f"class-{uuid.uuid4().hex[:8]}"
        body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "GPUClass",
                                "metadata": {"name": name}}
        if spec is not None:
            body["spec"] = spec
        result = obj(custom.create_cluster_custom_object(GROUP, VERSION, "gpuclasses", body))
        made.append(name)
        return result

    yield make
    for name in made:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpuclasses", name)


VALID_STATUS: dict[str, Any] = {
    "phase": "Bound",
    "nodeName": "gpu-node-1",
    "reservedFor": [{"name": "trainer", "uid": "0b7b4b58-5d3c-4d1e-9a51-6f0c2a4e9d11"}],
}


# -- defaults -----------------------------------------------------------------


def test_claim_reclaim_policy_defaults_to_release(claims: Any) -> None:
    claims.create(claim_body("plain", className="a100", count=2))
    assert claims.get("plain")["spec"] == {"className": "a100", "count": 2,
                                           "reclaimPolicy": "Release"}


@pytest.mark.parametrize("spec", [None, {}], ids=["no-spec", "empty-spec"])
def test_class_defaults_to_nvidia_gpus_that_move_off_cordoned_nodes(
    make_class: Callable[..., dict[str, Any]], custom: client.CustomObjectsApi,
    spec: dict[str, Any] | None,
) -> None:
    name = make_class(spec)["metadata"]["name"]
    stored = obj(custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", name))
    assert stored["spec"] == {"resourceName": "nvidia.com/gpu", "onCordon": "Move"}


def test_class_keeps_what_the_operator_chose(
    make_class: Callable[..., dict[str, Any]],
) -> None:
    spec = {"resourceName": "example.com/mig-1g.10gb", "onCordon": "Stay",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
    assert make_class(spec)["spec"] == spec


def test_template_claim_spec_gets_the_claim_defaults(
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpuclaimtemplates",
        template_body("pair", {"className": "a100", "count": 2},
                      metadata={"labels": {"team": "ml"}}))
    stored = obj(custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpuclaimtemplates", "pair"))
    assert stored["spec"] == {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"className": "a100", "count": 2, "reclaimPolicy": "Release"},
    }


# -- invalid objects are refused by the API server ----------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"className": "a100", "count": 0}, "spec.count", id="count-zero"),
        pytest.param({"className": "a100", "count": -3}, "spec.count", id="count-negative"),
        pytest.param({"className": "a100", "count": "two"}, "spec.count", id="count-not-a-number"),
        pytest.param({"className": "a100", "count": 2**31}, "spec.count", id="count-beyond-int32"),
        pytest.param({"className": "a100"}, "spec.count", id="count-missing"),
        pytest.param({"count": 1}, "spec.className", id="class-missing"),
        pytest.param({"className": "", "count": 1}, "spec.className", id="class-empty"),
        pytest.param({"className": "A100_SXM", "count": 1}, "spec.className",
                     id="class-not-a-dns-name"),
        pytest.param({"className": "a100", "count": 1, "reclaimPolicy": "Delete"},
                     "spec.reclaimPolicy", id="reclaim-policy-unknown"),
    ],
)
def test_invalid_claim_is_refused(claims: Any, spec: dict[str, Any], field: str) -> None:
    message = refused(lambda: claims.create(claim_body("bad", **spec)))
    assert field in message


def test_claim_without_spec_is_refused(claims: Any) -> None:
    body = claim_body("bad")
    del body["spec"]
    assert "spec" in refused(lambda: claims.create(body))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"onCordon": "Drain"}, "spec.onCordon", id="on-cordon-unknown"),
        pytest.param({"resourceName": "gpu"}, "spec.resourceName", id="resource-unprefixed"),
        pytest.param({"resourceName": "kubernetes.io/gpu"}, "spec.resourceName",
                     id="resource-native-domain"),
        pytest.param({"resourceName": "gpu.kubernetes.io/a100"}, "spec.resourceName",
                     id="resource-native-subdomain"),
        pytest.param({"resourceName": "example.com/" + "g" * 64}, "spec.resourceName",
                     id="resource-name-too-long"),
        pytest.param({"resourceName": "Example.com/gpu"}, "spec.resourceName",
                     id="resource-domain-uppercase"),
        pytest.param({"nodeSelector": {"gpu": 1}}, "spec.nodeSelector", id="selector-not-a-string"),
        pytest.param({"nodeSelector": {"gpu": "a100 sxm"}}, "spec.nodeSelector",
                     id="selector-not-a-label-value"),
    ],
)
def test_invalid_class_is_refused(
    make_class: Callable[..., dict[str, Any]], spec: dict[str, Any], field: str,
) -> None:
    assert field in refused(lambda: make_class(spec))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"spec": {"className": "a100", "count": 0}}, "spec.spec.count",
                     id="count-zero"),
        pytest.param({"spec": {"count": 1}}, "spec.spec.className", id="class-missing"),
        pytest.param({"metadata": {"labels": {"team": "m l"}},
                      "spec": {"className": "a100", "count": 1}},
                     "spec.metadata.labels", id="label-not-a-label-value"),
        pytest.param({}, "spec.spec", id="claim-spec-missing"),
    ],
)
def test_invalid_template_is_refused(
    custom: client.CustomObjectsApi, namespace: str, spec: dict[str, Any], field: str,
) -> None:
    body = {"apiVersion": API_VERSION, "kind": "GPUClaimTemplate",
            "metadata": {"name": "bad"}, "spec": spec}
    message = refused(lambda: custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpuclaimtemplates", body))
    assert field in message


# -- a claim's spec is frozen ---------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"count": 2}, id="count"),
        pytest.param({"className": "h100"}, id="class"),
        pytest.param({"reclaimPolicy": "Retain"}, id="reclaim-policy"),
    ],
)
def test_claim_spec_cannot_change_after_creation(claims: Any, change: dict[str, Any]) -> None:
    claims.create(claim_body("frozen", className="a100", count=1))

    assert "spec is immutable" in refused(lambda: claims.patch("frozen", {"spec": change}))

    replaced = claims.get("frozen")
    replaced["spec"].update(change)
    assert "spec is immutable" in refused(lambda: claims.replace(replaced))
    assert claims.get("frozen")["spec"] == {"className": "a100", "count": 1,
                                             "reclaimPolicy": "Release"}


def test_claim_metadata_can_change_while_spec_is_frozen(claims: Any) -> None:
    claims.create(claim_body("labelled", className="a100", count=1))
    patched = claims.patch("labelled", {"metadata": {"labels": {"team": "ml"},
                                                     "finalizers": ["gpuclaimctl.io/claim"]}})
    assert patched["metadata"]["labels"] == {"team": "ml"}
    assert patched["metadata"]["finalizers"] == ["gpuclaimctl.io/claim"]
    claims.patch("labelled", {"metadata": {"finalizers": None}})


def test_template_spec_can_be_edited_for_claims_made_later(
    custom: client.CustomObjectsApi, namespace: str,
) -> None:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpuclaimtemplates",
        template_body("grows", {"className": "a100", "count": 1}))
    patched = obj(custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpuclaimtemplates", "grows",
        {"spec": {"spec": {"count": 4}}}, _content_type=MERGE_PATCH))
    assert patched["spec"]["spec"]["count"] == 4


# -- status is its own subresource --------------------------------------------


def test_status_update_cannot_change_spec(claims: Any) -> None:
    created = claims.create(claim_body("split", className="a100", count=1))
    created["spec"]["count"] = 8
    created["status"] = VALID_STATUS

    updated = claims.replace_status(created)

    assert updated["status"] == VALID_STATUS
    assert updated["spec"]["count"] == 1
    assert claims.get("split")["spec"]["count"] == 1


def test_spec_update_cannot_change_status(claims: Any) -> None:
    claims.create(claim_body("split", className="a100", count=1))
    claims.patch_status("split", {"status": VALID_STATUS})

    body = claims.get("split")
    body["status"] = {"phase": "Lost"}
    body["metadata"]["labels"] = {"touched": "yes"}
    claims.replace(body)

    stored = claims.get("split")
    assert stored["metadata"]["labels"] == {"touched": "yes"}
    assert stored["status"] == VALID_STATUS


def test_status_of_a_new_claim_is_left_to_the_controller(claims: Any) -> None:
    """The API server drops the status a create sends; what is read back is
    the schema's default, a claim that is not on a node yet."""
    body = claim_body("fresh", className="a100", count=1)
    body["status"] = VALID_STATUS
    assert claims.create(body)["status"] == {"phase": "Pending"}
    assert claims.get("fresh")["status"] == {"phase": "Pending"}


def test_class_status_is_its_own_subresource(
    make_class: Callable[..., dict[str, Any]], custom: client.CustomObjectsApi,
) -> None:
    name = make_class({})["metadata"]["name"]
    status = {"nodes": 3, "allocatable": 24, "bound": 6}
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "gpuclasses", name,
        {"spec": {"onCordon": "Stay"}, "status": status}, _content_type=MERGE_PATCH)
    stored = obj(custom.get_cluster_custom_object(GROUP, VERSION, "gpuclasses", name))
    assert stored["status"] == status
    assert stored["spec"]["onCordon"] == "Move"


# -- status shape ---------------------------------------------------------------


def waiting(reason: str = "Capacity", **extra: Any) -> dict[str, Any]:
    return {"type": "Waiting", "status": "True", "reason": reason,
            "message": "no node has 4 free nvidia.com/gpu of class a100",
            "lastTransitionTime": "2024-05-01T10:00:00Z", **extra}


def test_full_status_is_accepted_as_written(claims: Any) -> None:
    claims.create(claim_body("full", className="a100", count=1))
    status = {
        "phase": "Pending",
        "rejectedNodes": [{"nodeName": "gpu-node-2", "reason": "Unschedulable: Insufficient cpu",
                           "until": "2024-05-01T10:10:00Z"}],
        "conditions": [waiting(observedGeneration=1)],
    }
    assert claims.patch_status("full", {"status": status})["status"] == status


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({"phase": "Released"}, "status.phase", id="phase-unknown"),
        pytest.param({"phase": "Bound"}, "a Bound claim must name its node",
                     id="bound-without-node"),
        pytest.param({"phase": "Bound", "nodeName": ""}, "a Bound claim must name its node",
                     id="bound-on-empty-node"),
        pytest.param({**VALID_STATUS, "reservedFor": [
            {"name": "a", "uid": "1"}, {"name": "b", "uid": "2"}]},
            "status.reservedFor", id="reserved-for-two-pods"),
        pytest.param({"reservedFor": [{"name": "a"}]}, "status.reservedFor[0].uid",
                     id="reserved-without-uid"),
        pytest.param({"rejectedNodes": [{"nodeName": "n1", "until": "in ten minutes"}]},
                     "status.rejectedNodes[0].until", id="rejected-until-not-a-time"),
        pytest.param({"rejectedNodes": [{"nodeName": "n1", "until": "2024-05-01T10:10:00Z"},
                                        {"nodeName": "n1", "until": "2024-05-01T10:20:00Z"}]},
                     "status.rejectedNodes", id="rejected-node-twice"),
        pytest.param({"conditions": [waiting(status="Yes")]}, "status.conditions[0].status",
                     id="condition-status-unknown"),
        pytest.param({"conditions": [{k: v for k, v in waiting().items() if k != "reason"}]},
                     "status.conditions[0].reason", id="condition-without-reason"),
        pytest.param({"conditions": [waiting("Not enough GPUs")]}, "status.conditions[0].reason",
                     id="condition-reason-not-camel-case"),
        pytest.param({"conditions": [waiting(), waiting("ClassNotFound")]}, "status.conditions",
                     id="condition-type-twice"),
    ],
)
def test_invalid_claim_status_is_refused(
    claims: Any, status: dict[str, Any], expected: str,
) -> None:
    claims.create(claim_body("watched", className="a100", count=1))
    assert expected in refused(lambda: claims.patch_status("watched", {"status": status}))


# -- what kubectl shows -------------------------------------------------------


@pytest.mark.parametrize(
    ("crd", "columns", "short_names"),
    [
        pytest.param("gpuclasses.gpuclaimctl.io",
                     ["ResourceName", "OnCordon", "Nodes", "Allocatable", "Bound", "Age"],
                     ["gc"],
                     id="class"),
        pytest.param("gpuclaims.gpuclaimctl.io",
                     ["Class", "Count", "Phase", "Node", "User", "Reclaim", "Waiting", "Age"],
                     ["gcl"], id="claim"),
        pytest.param("gpuclaimtemplates.gpuclaimctl.io",
                     ["Class", "Count", "Reclaim", "Age"], ["gct"], id="template"),
        pytest.param("gpubudgets.gpuclaimctl.io", ["Limits", "Used", "Age"], ["gb"], id="budget"),
    ],
)
def test_stored_crd_has_printer_columns_short_names_and_status(
    api_client: client.ApiClient, crds: list[str], crd: str, columns: list[str],
    short_names: list[str],
) -> None:
    stored: dict[str, Any] = api_client.sanitize_for_serialization(
        client.ApiextensionsV1Api(api_client).read_custom_resource_definition(crd))
    (version,) = stored["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    assert version["subresources"] == {"status": {}}
    assert stored["spec"]["names"]["shortNames"] == short_names
    assert stored["spec"]["names"]["categories"] == ["gpuclaimctl"]
    conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
    assert conditions["NamesAccepted"] == "True"
    assert conditions["Established"] == "True"


def test_kubectl_get_gpuclaims_shows_class_count_phase_node_and_user(
    api_client: client.ApiClient, claims: Any, namespace: str,
) -> None:
    claims.create(claim_body("shown", className="a100", count=2, reclaimPolicy="Retain"))
    claims.patch_status("shown", {"status": {**VALID_STATUS,
                                             "conditions": [waiting("NodeRejected")]}})

    table = raw_get(api_client, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpuclaims",
                    TABLE)

    names = [c["name"] for c in table["columnDefinitions"]]
    (row,) = table["rows"]
    cells = dict(zip(names, row["cells"]))
    assert cells["Name"] == "shown"
    assert {k: cells[k] for k in ("Class", "Count", "Phase", "Node", "User", "Reclaim",
                                  "Waiting")} == {
        "Class": "a100", "Count": 2, "Phase": "Bound", "Node": "gpu-node-1",
        "User": "trainer", "Reclaim": "Retain", "Waiting": "NodeRejected"}
    wide_only = {c["name"] for c in table["columnDefinitions"] if c.get("priority", 0) > 0}
    assert wide_only == {"Reclaim", "Waiting"}


def test_kubectl_get_gpuclaims_says_pending_for_a_claim_never_placed(
    api_client: client.ApiClient, claims: Any, namespace: str,
) -> None:
    claims.create(claim_body("new", className="a100", count=1))
    claims.create(claim_body("waiting", className="a100", count=1))
    # The controller writes a waiting claim's condition, not its phase.
    claims.patch_status("waiting", {"status": {"conditions": [waiting()]}})

    table = raw_get(api_client, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpuclaims",
                    TABLE)

    names = [c["name"] for c in table["columnDefinitions"]]
    phases = {row["cells"][0]: dict(zip(names, row["cells"]))["Phase"]
              for row in table["rows"]}
    assert phases == {"new": "Pending", "waiting": "Pending"}


def test_kubectl_get_gpuclasses_wide_shows_nodes_gpus_and_gpus_bound(
    api_client: client.ApiClient, make_class: Callable[..., dict[str, Any]],
    custom: client.CustomObjectsApi,
) -> None:
    name = make_class({})["metadata"]["name"]
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "gpuclasses", name, {"status": {"nodes": 2, "allocatable": 16,
                                                        "bound": 6}},
        _content_type=MERGE_PATCH)

    table = raw_get(api_client, f"/apis/{GROUP}/{VERSION}/gpuclasses/{name}", TABLE)

    (row,) = table["rows"]
    cells = dict(zip([c["name"] for c in table["columnDefinitions"]], row["cells"]))
    assert {k: cells[k] for k in ("Nodes", "Allocatable", "Bound")} == {
        "Nodes": 2, "Allocatable": 16, "Bound": 6}
    wide_only = {c["name"] for c in table["columnDefinitions"] if c.get("priority", 0) > 0}
    assert wide_only == {"Nodes", "Allocatable", "Bound"}


def test_short_names_and_category_are_discoverable(
    api_client: client.ApiClient, crds: list[str],
) -> None:
    resources = raw_get(api_client, f"/apis/{GROUP}/{VERSION}", "application/json")
    found = {r["name"]: (r.get("shortNames"), r.get("categories"), r["namespaced"])
             for r in resources["resources"] if "/" not in r["name"]}
    assert found == {
        "gpuclasses": (["gc"], ["gpuclaimctl"], False),
        "gpuclaims": (["gcl"], ["gpuclaimctl"], True),
        "gpuclaimtemplates": (["gct"], ["gpuclaimctl"], True),
        "gpubudgets": (["gb"], ["gpuclaimctl"], True),
    }
