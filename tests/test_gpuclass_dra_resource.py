"""A GPUClass may name the resource every DeviceClass maps implicitly,
deviceclass.resource.kubernetes.io/<class> (issue 47; docs/dra.md), and
nothing else in the kubernetes.io domain: the schema in deploy/crds, on
the real API server, and the chart's copy of it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client

GROUP = "gpuclaimctl.io"
VERSION = "v1alpha1"
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_chart_installs_the_same_gpuclass_schema() -> None:
    base = (DEPLOY / "crds" / "gpuclasses.yaml").read_text()
    assert (DEPLOY / "chart" / "gpuclaimctl" / "crds" / "gpuclasses.yaml").read_text() == base
    assert "deviceclass.resource.kubernetes.io/" in base


@pytest.fixture
def make_class(api_client: client.ApiClient, crds: list[str]) -> Iterator[Callable[[str], dict[str, Any]]]:
    custom = client.CustomObjectsApi(api_client)
    made: list[str] = []

    def make(resource: str) -> dict[str, Any]:
        name = f"class-{uuid.uuid4().hex[:8]}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUClass", "metadata": {"name": name},
                "spec": {"resourceName": resource}}
        result = custom.create_cluster_custom_object(GROUP, VERSION, "gpuclasses", body)
        made.append(name)
        assert isinstance(result, dict)
        return result

    yield make
    for name in made:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpuclasses", name)


@pytest.mark.plane
@pytest.mark.parametrize("resource", [
    pytest.param("deviceclass.resource.kubernetes.io/gpu.nvidia.com", id="implicit-device-class"),
    pytest.param("deviceclass.resource.kubernetes.io/a100-80g", id="implicit-device-class-dashes"),
    pytest.param("nvidia.com/gpu", id="extended-resource"),
])
def test_a_class_may_name_a_resource_dra_serves(make_class: Callable[[str], dict[str, Any]], resource: str) -> None:
    assert make_class(resource)["spec"]["resourceName"] == resource


@pytest.mark.plane
@pytest.mark.parametrize(("resource", "said"), [
    pytest.param("deviceclass.resource.kubernetes.io/GPU_Class", "DeviceClass name", id="not-a-dns-subdomain"),
    pytest.param("deviceclass.resource.kubernetes.io/gpu..a", "DeviceClass name", id="empty-dns-label"),
    pytest.param("deviceclass.resource.kubernetes.io/" + "g" * 64, "spec.resourceName", id="beyond-63"),
    pytest.param("resource.kubernetes.io/gpu", "outside the kubernetes.io", id="other-kubernetes-io-domain"),
    pytest.param("xdeviceclass.resource.kubernetes.io/gpu", "outside the kubernetes.io", id="lookalike-prefix"),
    pytest.param("kubernetes.io/gpu", "outside the kubernetes.io", id="kubernetes-io"),
])
def test_other_kubernetes_io_names_are_still_refused(
        make_class: Callable[[str], dict[str, Any]], resource: str, said: str) -> None:
    with pytest.raises(client.ApiException) as info:
        make_class(resource)
    assert info.value.status == 422, info.value.body
    message = json.loads(info.value.body or "{}")["message"]
    assert "spec.resourceName" in message and said in message
