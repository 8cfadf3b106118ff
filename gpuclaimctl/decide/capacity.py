"""What counts against a node's GPUs (DESIGN.md §4 "free GPUs"), from objects.

Three things use a node's GPUs: claims Bound there (all namespaces), pods
bound there that request the resource without claims and have not
finished, and placements this controller has decided but not yet seen come
back from its watch (state.inflight). The first two are pure functions of
informer objects (`used_capacity`, or `claim_usage`/`pod_usage` per object
for an incremental index). Pure: no client, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpuclaimctl.model.api import DEFAULT_RESOURCE_NAME, Phase
from gpuclaimctl.model.snapshot import Usage, parse_quantity


_FINISHED = frozenset({"Succeeded", "Failed"})


def claim_usage(claim: Mapping[str, Any], resource_of_class: Mapping[str, str]) -> tuple[str, str, int] | None:
    """(node, resource, count) a claim holds, or None.

    A Bound claim holds its GPUs on its node. So does a Lost one that a pod
    still reserves: the node went NotReady, but the pod may still run there
    and use them when it comes back (until the pod is gone and its
    reservation dropped, counting them is the only safe guess; a NotReady
    node takes no placements anyway). A claim whose class is gone still
    holds its GPUs; it is counted against DEFAULT_RESOURCE_NAME, the only
    resource we can guess for it.
    """
    status = claim.get("status") or {}
    node = status.get("nodeName")
    phase = status.get("phase")
    if not node or not (phase == Phase.BOUND or (phase == Phase.LOST and status.get("reservedFor"))):
        return None
    spec = claim.get("spec") or {}
    count = spec.get("count")
    if not isinstance(count, int) or count <= 0:
        return None
    return node, resource_of_class.get(spec.get("className", ""), DEFAULT_RESOURCE_NAME), count


def pod_holds_node(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished: its containers' requests count."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in _FINISHED


def pod_request(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request of `resource`, as the scheduler counts it
    (component-helpers PodRequests): the sum over containers and sidecars,
    or the largest init container plus the sidecars started before it, if
    larger; plus overhead. Requests default to limits, as the API server
    defaults them for extended resources."""
    spec = pod.get("spec") or {}
    total = sum(_container_request(c, resource) for c in spec.get("containers") or ())
    sidecars = 0
    init_peak = 0
    for c in spec.get("initContainers") or ():
        amount = _container_request(c, resource)
        if c.get("restartPolicy") == "Always":
            total += amount
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount + sidecars)
    total = max(total, init_peak)
    overhead = parse_quantity((spec.get("overhead") or {}).get(resource)) or 0
    return total + overhead


def pod_usage(pod: Mapping[str, Any], resources: Iterable[str]) -> Iterator[tuple[str, str, int]]:
    """(node, resource, count) for each resource the pod requests, if it is
    on a node and not finished. Whether claims already account for the pod
    is the caller's question (`used_capacity` skips pods a claim reserves)."""
    if not pod_holds_node(pod):
        return
    node = pod["spec"]["nodeName"]
    for resource in resources:
        amount = pod_request(pod, resource)
        if amount > 0:
            yield node, resource, amount


def used_capacity(
    claims: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    resource_of_class: Mapping[str, str],
) -> dict[str, dict[str, int]]:
    """resource -> node -> GPUs used by Bound claims and by pods whose GPUs
    no claim accounts for. Pure.

    A pod's container requests are skipped only when a claim reserves it:
    then the claim is what holds its GPUs. A pod that names claims in its
    annotation but that no claim reserves (never released by us, or its
    claims' writes not seen yet) counts by its requests, erring towards
    GPUs left idle rather than a node overcommitted.
    """
    out: dict[str, dict[str, int]] = {}
    reserved_pods: set[str] = set()
    for claim in claims:
        for ref in (claim.get("status") or {}).get("reservedFor") or ():
            reserved_pods.add(ref.get("uid", ""))
        held = claim_usage(claim, resource_of_class)
        if held is not None:
            node, resource, count = held
            per_node = out.setdefault(resource, {})
            per_node[node] = per_node.get(node, 0) + count
    resources = set(resource_of_class.values()) | {DEFAULT_RESOURCE_NAME}
    for pod in pods:
        if (pod.get("metadata") or {}).get("uid") in reserved_pods:
            continue
        for node, resource, amount in pod_usage(pod, resources):
            per_node = out.setdefault(resource, {})
            per_node[node] = per_node.get(node, 0) + amount
    return out


def combine(*usages: Usage) -> dict[str, Mapping[str, int]]:
    """The sum of several usage maps. The first is shallow-copied, so a large
    base index plus a small in-flight map costs one copy per resource that
    the small map touches."""
    if not usages:
        return {}
    base, *rest = usages
    out: dict[str, Mapping[str, int]] = dict(base)
    copied: dict[str, dict[str, int]] = {}
    for extra in rest:
        for resource, per_node in extra.items():
            if not per_node:
                continue
            target = copied.get(resource)
            if target is None:
                target = copied[resource] = dict(out.get(resource, {}))
                out[resource] = target
            for node, count in per_node.items():
                target[node] = target.get(node, 0) + count
    return out


def _container_request(container: Mapping[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("requests") or {}).get(resource)
    if value is None:
        value = (resources.get("limits") or {}).get(resource)
    return parse_quantity(value) or 0
