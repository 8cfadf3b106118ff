"""GPUs served by DRA: which offered devices allocated ResourceClaims use,
and how a pod is counted once (docs/dra.md §2).

`decide/dra.py` says which devices each node offers of each resource;
here every allocated ResourceClaim holds its devices as kube-scheduler's
allocator counts them (allocateddevices.go: results with adminAccess are
not in use), per node and resource (`device_owners`, `claim_use`,
`dra_usage`). `pod_counted` is THE rule that counts a pod once, from its
request, the claim kube-scheduler made for that request and its GPU
claims; `used_with_dra` is the pure reference of the whole count, which
an incremental tracker must equal.

Built to be kept incrementally: a claim change recomputes that claim's
`claim_use`, an offer change the claims holding its devices. Pure: no
client, no clock, no globals; nothing here runs per decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuclaimctl.decide.capacity import claim_usage, pod_usage, used_capacity
from gpuclaimctl.decide.dra import NodeDra
from gpuclaimctl.model.dra import ClaimInfo, DeviceID

# device -> the (node, resource) offers it is counted in.
DeviceOwners = Mapping[DeviceID, tuple[tuple[str, str], ...]]


def device_owners(node_dras: Iterable[NodeDra]) -> dict[DeviceID, tuple[tuple[str, str], ...]]:
    owners: dict[DeviceID, list[tuple[str, str]]] = {}
    for nd in node_dras:
        for resource, offer in nd.offers.items():
            for d in offer.devices:
                owners.setdefault(d, []).append((nd.node, resource))
    return {d: tuple(v) for d, v in owners.items()}


@dataclass(frozen=True)
class ClaimUse:
    """What one ResourceClaim's allocation uses of the offered devices:
    (node, resource, devices). `pod_uid` is the pod whose extended-resource
    requests the claim serves (kube-scheduler made it): those devices are
    that pod's, folded into its count by `pod_counted`; "" for every other
    claim, whose devices count as they are."""

    held: tuple[tuple[str, str, int], ...] = ()
    pod_uid: str = ""


def claim_use(claim: ClaimInfo, owners: DeviceOwners) -> ClaimUse:
    """Every device of an allocated claim counts (reserved or not, its pod
    running or gone: the allocator counts it in use until deallocated),
    except results with adminAccess (skipped when parsed) and devices no
    offer counts."""
    per: dict[tuple[str, str], int] = {}
    for d in claim.devices:
        for key in owners.get(d, ()):
            per[key] = per.get(key, 0) + 1
    return ClaimUse(tuple((n, r, c) for (n, r), c in sorted(per.items())), claim.extended_for_pod)


@dataclass(frozen=True)
class DraUsage:
    """`direct`: resource -> node -> devices of claims that no pod's
    request stands for (a ResourceClaim a pod names, a claim of no pod);
    `extended`: pod uid -> (node, resource) -> devices of the claim
    kube-scheduler made for that pod's extended-resource requests."""

    direct: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    extended: Mapping[str, Mapping[tuple[str, str], int]] = field(default_factory=dict)


def dra_usage(claims: Iterable[ClaimInfo], owners: DeviceOwners) -> DraUsage:
    direct: dict[str, dict[str, int]] = {}
    extended: dict[str, dict[tuple[str, str], int]] = {}
    for claim in claims:
        use = claim_use(claim, owners)
        for node, resource, n in use.held:
            if use.pod_uid:
                mine = extended.setdefault(use.pod_uid, {})
                mine[(node, resource)] = mine.get((node, resource), 0) + n
            else:
                per = direct.setdefault(resource, {})
                per[node] = per.get(node, 0) + n
    return DraUsage(direct, extended)


def pod_counted(requested: int, extended: int, held_by_gpu_claims: int) -> int:
    """THE rule that counts a pod once on a node and resource: what it
    takes is the larger of its containers' request (while it is on the
    node and not finished) and the devices of the claim kube-scheduler made
    for that request (while allocated), since both stand for the same
    devices and either may be seen first; less what its GPU claims hold
    there, which count on their own. So a gpuclaimctl pod counts its GPU
    claims (its scheduler-made claim adds nothing when it holds no more),
    and any other pod its request or its claim, never both."""
    return max(0, max(requested, extended) - held_by_gpu_claims)


def used_with_dra(gpu_claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                  resource_of_class: Mapping[str, str], dra: DraUsage) -> dict[str, dict[str, int]]:
    """resource -> node -> GPUs used, with DRA: `capacity.used_capacity`
    (GPU claims; pods beyond their claims) plus the direct claims' devices,
    with each pod's count taken by `pod_counted` from its request and its
    scheduler-made claim. The pure reference an incremental tracker must
    equal."""
    gpu_claims = list(gpu_claims)
    pods = list(pods)
    out = used_capacity(gpu_claims, pods, resource_of_class)
    held: dict[str, dict[tuple[str, str], int]] = {}
    for claim in gpu_claims:
        usage = claim_usage(claim, resource_of_class)
        if usage is None:
            continue
        node, resource, count = usage
        for ref in {r.get("uid", "") for r in (claim.get("status") or {}).get("reservedFor") or ()}:
            per_pod = held.setdefault(ref, {})
            per_pod[(node, resource)] = per_pod.get((node, resource), 0) + count
    requested: dict[str, dict[tuple[str, str], int]] = {}
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid", "")
        for node, resource, amount in pod_usage(pod):
            requested.setdefault(uid, {})[(node, resource)] = amount

    def add(resource: str, node: str, n: int) -> None:
        if n:
            per = out.setdefault(resource, {})
            per[node] = per.get(node, 0) + n

    for resource, per_node in dra.direct.items():
        for node, n in per_node.items():
            add(resource, node, n)
    for uid, ext in dra.extended.items():
        for (node, resource), n in ext.items():
            req = requested.get(uid, {}).get((node, resource), 0)
            mine = held.get(uid, {}).get((node, resource), 0)
            # used_capacity already counted pod_counted(req, 0, mine) for it.
            add(resource, node, pod_counted(req, n, mine) - pod_counted(req, 0, mine))
    return out

