"""Whether the API server serves a resource: one discovery GET per group version.

For APIs a cluster may or may not serve (PodGroups, scheduling.k8s.io/v1beta1,
need a feature gate and --runtime-config in Kubernetes 1.37; DRA's
resource.k8s.io/v1 is on by default and may be turned off): the controller
starts without their informers and asks again until they appear, instead
of a reflector failing on 404 for as long as the cluster lacks them.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import NotFound
from informers import Resource


def serves(api_client: client.ApiClient, resource: Resource, *, timeout: float = 10.0) -> bool:
    """Whether `resource` is in the discovery document of its group version.
    A 404 (the group version is not served) is False; any other error
    raises (the caller asks again later)."""
    return resource in served(api_client, (resource,), timeout=timeout)


def served(api_client: client.ApiClient, resources: Iterable[Resource], *,
           timeout: float = 10.0) -> frozenset[Resource]:
    """Those of `resources` the API server serves: one GET of each group
    version's discovery document (a 404: none of its resources). Any
    other error raises (the caller asks again later)."""
    wanted = list(resources)
    found: set[Resource] = set()
    for group_version in dict.fromkeys(r.group_version for r in wanted):
        some = next(r for r in wanted if r.group_version == group_version)
        path = f"/apis/{group_version}" if some.group else f"/api/{some.version}"
        try:
            doc = kube.request_json(api_client, "GET", path, timeout=timeout)
        except NotFound:
            continue
        found.update(r for r in wanted if r.group_version == group_version and served_in(doc, r))
    return frozenset(found)


def served_in(doc: object, resource: Resource) -> bool:
    """Whether an APIResourceList names `resource`'s plural."""
    found = doc.get("resources") if isinstance(doc, dict) else None
    return isinstance(found, list) and any(
        isinstance(r, dict) and r.get("name") == resource.plural for r in found)
