"""GPUs in use per node, kept up to date from informer events.

`decide.capacity.used_capacity` computes the same map from whole lists; at
50,000 claims that takes ~100 ms, far too slow to do for every decision.
This keeps each claim's and pod's contribution and applies the difference
when one changes, so a decision reads a current map for free.

Invariant: `totals` equals `used_capacity(claims, pods, resource_of_class)`
over the objects last seen (tests check this against the pure function).
Objects are keyed by uid: a claim or pod recreated under the same name is
another object, and the caller deletes the old uid (a relist hands the
handlers `update(old, new)` with two uids).

Not thread-safe on its own: `ClusterView` holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuclaimctl.decide.capacity import claim_usage, pod_usage

Held = tuple[str, str, int]  # node, resource, count


class UsageTracker:
    def __init__(self) -> None:
        # class name -> resource name, for claims bound before status.resourceName.
        self._resource_of_class: dict[str, str] = {}
        # resource -> node -> GPUs held.
        self.totals: dict[str, dict[str, int]] = {}
        self._claims: dict[str, Held] = {}                  # claim uid -> what it holds
        self._claim_reserves: dict[str, tuple[str, ...]] = {}  # claim uid -> pod uids
        self._reserved_by: dict[str, set[str]] = {}          # pod uid -> claim uids
        # claim uid -> (class, node, count) of Bound claims without status.resourceName.
        self._legacy: dict[str, Mapping[str, Any]] = {}
        self._pods: dict[str, tuple[Held, ...]] = {}        # pod uid -> its requests on its node
        self._pod_counted: dict[str, tuple[Held, ...]] = {}  # pod uid -> what it adds now

    def resource_of_class(self) -> Mapping[str, str]:
        return self._resource_of_class

    def set_classes(self, resource_of_class: Mapping[str, str]) -> bool:
        """A class was added, changed or deleted: recount the claims whose
        resource depends on it (those without status.resourceName). True if
        any count moved."""
        if dict(resource_of_class) == self._resource_of_class:
            return False
        self._resource_of_class = dict(resource_of_class)
        moved = False
        for claim in list(self._legacy.values()):
            before = self._claims.get(claim["metadata"]["uid"])
            self.set_claim(claim)
            moved = moved or before != self._claims.get(claim["metadata"]["uid"])
        return moved

    # -- claims ------------------------------------------------------------

    def claim_held(self, uid: str) -> Held | None:
        return self._claims.get(uid)

    def set_claim(self, claim: Mapping[str, Any]) -> None:
        uid = claim["metadata"]["uid"]
        self.delete_claim(uid)
        held = claim_usage(claim, self._resource_of_class)
        if held is not None:
            self._claims[uid] = held
            self._add(held, 1)
            if not (claim.get("status") or {}).get("resourceName"):
                self._legacy[uid] = claim
        reserves = tuple(r.get("uid", "") for r in
                         (claim.get("status") or {}).get("reservedFor") or ())
        if reserves:
            self._claim_reserves[uid] = reserves
            for pod_uid in reserves:
                self._reserved_by.setdefault(pod_uid, set()).add(uid)
                self._refresh_pod(pod_uid)

    def delete_claim(self, uid: str) -> None:
        held = self._claims.pop(uid, None)
        self._legacy.pop(uid, None)
        if held is not None:
            self._add(held, -1)
        for pod_uid in self._claim_reserves.pop(uid, ()):
            claims = self._reserved_by.get(pod_uid)
            if claims is not None:
                claims.discard(uid)
                if not claims:
                    del self._reserved_by[pod_uid]
            self._refresh_pod(pod_uid)

    # -- pods --------------------------------------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        held = tuple(pod_usage(pod))
        if held:
            self._pods[uid] = held
        else:
            self._pods.pop(uid, None)
        self._refresh_pod(uid)

    def delete_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self._refresh_pod(uid)

    # -- internals -----------------------------------------------------------

    def _refresh_pod(self, pod_uid: str) -> None:
        """Count what the pod's requests exceed its claims by (all of them
        for a pod no claim reserves)."""
        for h in self._pod_counted.pop(pod_uid, ()):
            self._add(h, -1)
        requests = self._pods.get(pod_uid)
        if not requests:
            return
        by_claims: dict[tuple[str, str], int] = {}
        for claim_uid in self._reserved_by.get(pod_uid, ()):
            held = self._claims.get(claim_uid)
            if held is not None:
                by_claims[held[:2]] = by_claims.get(held[:2], 0) + held[2]
        counted = tuple((node, resource, amount - by_claims.get((node, resource), 0))
                        for node, resource, amount in requests
                        if amount > by_claims.get((node, resource), 0))
        if counted:
            self._pod_counted[pod_uid] = counted
            for h in counted:
                self._add(h, 1)

    def _add(self, held: Held, sign: int) -> None:
        node, resource, count = held
        per_node = self.totals.setdefault(resource, {})
        value = per_node.get(node, 0) + sign * count
        if value:
            per_node[node] = value
        else:
            per_node.pop(node, None)
