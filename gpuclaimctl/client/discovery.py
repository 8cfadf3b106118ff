"""Whether the API server serves a resource: one discovery GET.

For APIs a cluster may or may not serve (PodGroups, scheduling.k8s.io/v1beta1,
need a feature gate and --runtime-config in Kubernetes 1.37): the controller
starts without their informer and asks again until they appear, instead of
a reflector failing on 404 for as long as the cluster lacks them.
"""

from __future__ import annotations

from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import NotFound
from informers import Resource


def serves(api_client: client.ApiClient, resource: Resource, *, timeout: float = 10.0) -> bool:
    """Whether `resource` is in the discovery document of its group version.
    A 404 (the group version is not served) is False; any other error
    raises (the caller asks again later)."""
    path = f"/apis/{resource.group_version}" if resource.group else f"/api/{resource.version}"
    try:
        doc = kube.request_json(api_client, "GET", path, timeout=timeout)
    except NotFound:
        return False
    return served_in(doc, resource)


def served_in(doc: object, resource: Resource) -> bool:
    """Whether an APIResourceList names `resource`'s plural."""
    found = doc.get("resources") if isinstance(doc, dict) else None
    return isinstance(found, list) and any(
        isinstance(r, dict) and r.get("name") == resource.plural for r in found)
