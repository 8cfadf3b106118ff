"""GPUs in use per node, kept up to date from informer events.

`inflight.used_capacity` computes the same map from whole lists; at 50,000
claims that takes ~100 ms, far too slow to do for every decision. This keeps
each claim's and pod's contribution and applies the difference when one
changes, so a decision reads a current map for free.

Invariant: `totals` equals `used_capacity(claims, pods, resource_of_class)`
over the objects last seen (a test checks this against the pure function).
Not thread-safe on its own: the controller holds its placement lock around
every call, so a decision never sees a half-applied event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuclaimctl.model.api import DEFAULT_RESOURCE_NAME
from gpuclaimctl.decide.capacity import claim_usage, pod_usage

Held = tuple[str, str, int]  # node, resource, count


class UsageTracker:
    def __init__(self, resource_of_class: Mapping[str, str] | None = None) -> None:
        self._resource_of_class: dict[str, str] = dict(resource_of_class or {})
        # resource -> node -> GPUs held.
        self.totals: dict[str, dict[str, int]] = {}
        self._claims: dict[str, Held] = {}            # claim uid -> what it holds
        self._claim_reserves: dict[str, tuple[str, ...]] = {}  # claim uid -> pod uids
        self._reserved: dict[str, int] = {}           # pod uid -> claims reserving it
        self._pods: dict[str, tuple[Held, ...]] = {}  # pod uid -> its requests on its node

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(self._resource_of_class.values()) | {DEFAULT_RESOURCE_NAME}

    def resource_of_class(self) -> Mapping[str, str]:
        return self._resource_of_class

    def rebuild(self, claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                resource_of_class: Mapping[str, str]) -> None:
        """Start again from whole lists (at start and when a class's resource changes)."""
        self.__init__(resource_of_class)  # type: ignore[misc]
        for claim in claims:
            self.set_claim(claim)
        for pod in pods:
            self.set_pod(pod)

    # -- claims ------------------------------------------------------------

    def set_claim(self, claim: Mapping[str, Any]) -> None:
        uid = claim["metadata"]["uid"]
        self.delete_claim(uid)
        held = claim_usage(claim, self._resource_of_class)
        if held is not None:
            self._claims[uid] = held
            self._add(held, 1)
        reserves = tuple(r.get("uid", "") for r in
                         (claim.get("status") or {}).get("reservedFor") or ())
        if reserves:
            self._claim_reserves[uid] = reserves
            for pod_uid in reserves:
                self._reserve(pod_uid, 1)

    def delete_claim(self, uid: str) -> None:
        held = self._claims.pop(uid, None)
        if held is not None:
            self._add(held, -1)
        for pod_uid in self._claim_reserves.pop(uid, ()):
            self._reserve(pod_uid, -1)

    # -- pods --------------------------------------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.delete_pod(uid)
        held = tuple(pod_usage(pod, self.resources))
        if held:
            self._pods[uid] = held
            if not self._reserved.get(uid):
                for h in held:
                    self._add(h, 1)

    def delete_pod(self, uid: str) -> None:
        held = self._pods.pop(uid, ())
        if not self._reserved.get(uid):
            for h in held:
                self._add(h, -1)

    # -- internals -----------------------------------------------------------

    def _reserve(self, pod_uid: str, delta: int) -> None:
        before = self._reserved.get(pod_uid, 0)
        after = before + delta
        if after:
            self._reserved[pod_uid] = after
        else:
            self._reserved.pop(pod_uid, None)
        # A pod's own requests count only while no claim accounts for it.
        if (before == 0) != (after == 0):
            sign = -1 if after else 1
            for h in self._pods.get(pod_uid, ()):
                self._add(h, sign)

    def _add(self, held: Held, sign: int) -> None:
        node, resource, count = held
        per_node = self.totals.setdefault(resource, {})
        value = per_node.get(node, 0) + sign * count
        if value:
            per_node[node] = value
        else:
            per_node.pop(node, None)
