"""What counts against a node's GPUs (DESIGN.md §4 "free GPUs"), from objects.

Three things use a node's GPUs: claims Bound there (all namespaces), pods
bound there that request the resource without claims and have not
finished, and placements this controller has decided but not yet seen come
back from its watch (state.inflight). The first two are pure functions of
informer objects (`used_capacity`, or `claim_usage`/`pod_usage` per object
for an incremental index). Pure: no client, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from gpuclaimctl.model.api import FINISHED_PHASES, UNKNOWN_RESOURCE
from gpuclaimctl.model.resources import extended_resources, pod_request
from gpuclaimctl.model.snapshot import NO_USE, Usage, claim_holds_gpus




def claim_usage(claim: Mapping[str, Any], resource_of_class: Mapping[str, str]) -> tuple[str, str, int] | None:
    """(node, resource, count) a claim holds, or None.

    Whether it holds any is `model.snapshot.holds_gpus`'s rule (Bound, or
    Lost while a pod still reserves it; a NotReady node takes no placements
    anyway).

    The resource is the one recorded in the claim's status when it was
    bound (`status.resourceName`), so deleting or editing its class never
    changes what a bound claim holds. Only a claim bound before that field
    existed falls back to its class's resource, and with the class gone to
    UNKNOWN_RESOURCE: it may hold any resource, and `with_unknown` counts
    it under every one its node offers until the claim sync records one
    (from the class, or the resource its pod requests).
    """
    if not claim_holds_gpus(claim):
        return None
    status = claim.get("status") or {}
    node = str(status["nodeName"])
    spec = claim.get("spec") or {}
    count = spec.get("count")
    if not isinstance(count, int) or count <= 0:
        return None
    resource = status.get("resourceName")
    if not isinstance(resource, str) or not resource:
        resource = resource_of_class.get(spec.get("className", ""), UNKNOWN_RESOURCE)
    return node, resource, count


def with_unknown(usage: dict[str, Mapping[str, int]],
                 allocatable: Callable[[str], Mapping[str, int] | None]) -> dict[str, Mapping[str, int]]:
    """`usage` with the GPUs counted under UNKNOWN_RESOURCE on a node also
    counted under every resource that node offers (`allocatable(node)`):
    such a claim may hold any of them, so the node takes no new placement
    of any that its room does not cover either way. The same map when there
    are none (the usual case: no copy)."""
    unknown = usage.get(UNKNOWN_RESOURCE)
    if not unknown:
        return usage
    extra: dict[str, dict[str, int]] = {}
    for node, count in unknown.items():
        for resource in allocatable(node) or {}:
            extra.setdefault(resource, {})[node] = count
    return combine(usage, extra)


def free_on(allocatable: Mapping[str, int], used: Usage, node: str) -> dict[str, int]:
    """resource -> GPUs of `node` neither used nor in flight (negative when
    more is counted there than it has)."""
    return {r: n - used.get(r, NO_USE).get(node, 0) for r, n in allocatable.items()}


def shortfall(need: Mapping[str, int], free: Mapping[str, int]) -> dict[str, int]:
    """resource -> GPUs missing for `need` where `free` is free (empty: it
    fits). THE rule for "this set fits this node": placement's keep, explain,
    the handlers' wake-ups, the claim sync's room for a Lost claim and a
    gang's ranking all ask it (placement's search, the hot loop, inlines the
    same comparison; tests/test_capacity.py holds the two equal)."""
    return {r: n - free.get(r, 0) for r, n in need.items() if free.get(r, 0) < n}


def fits(need: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return not shortfall(need, free)


def pod_holds_node(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished: its containers' requests count."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in FINISHED_PHASES


def pod_usage(pod: Mapping[str, Any]) -> Iterator[tuple[str, str, int]]:
    """(node, resource, count) for each extended resource the pod requests,
    if it is on a node and not finished. What claims already account for is
    the caller's to subtract (`used_capacity`)."""
    if not pod_holds_node(pod):
        return
    node = pod["spec"]["nodeName"]
    for resource in sorted(extended_resources(pod)):
        amount = pod_request(pod, resource)
        if amount > 0:
            yield node, resource, amount


def used_capacity(
    claims: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    resource_of_class: Mapping[str, str],
) -> dict[str, dict[str, int]]:
    """resource -> node -> GPUs used by Bound claims and by pods beyond
    what their claims hold. Pure; the reference `state.usage.UsageTracker`
    keeps incrementally.

    A pod on a node counts its own requests of each extended resource minus
    what the claims reserving it hold of that resource on that node: a pod
    without claims counts whole, a pod whose containers ask for more than
    its claims give counts the excess (the scheduler and the device plugin
    count the requests, not the claims). A pod that names claims no claim
    reserves yet counts by its requests, erring towards GPUs left idle
    rather than a node overcommitted.
    """
    out: dict[str, dict[str, int]] = {}
    held_for_pod: dict[str, dict[tuple[str, str], int]] = {}
    for claim in claims:
        held = claim_usage(claim, resource_of_class)
        if held is not None:
            node, resource, count = held
            per_node = out.setdefault(resource, {})
            per_node[node] = per_node.get(node, 0) + count
        for pod_uid in {ref.get("uid", "") for ref in (claim.get("status") or {}).get("reservedFor") or ()}:
            mine = held_for_pod.setdefault(pod_uid, {})
            if held is not None:
                mine[(held[0], held[1])] = mine.get((held[0], held[1]), 0) + held[2]
    for pod in pods:
        mine = held_for_pod.get((pod.get("metadata") or {}).get("uid", ""), {})
        for node, resource, amount in pod_usage(pod):
            excess = amount - mine.get((node, resource), 0)
            if excess > 0:
                per_node = out.setdefault(resource, {})
                per_node[node] = per_node.get(node, 0) + excess
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
