"""GPUs in use per node, kept up to date from informer events.

`decide.capacity.used_capacity` computes the same map from whole lists; at
50,000 claims that takes ~100 ms, far too slow to do for every decision.
This keeps each claim's and pod's contribution and applies the difference
when one changes, so a decision reads a current map for free.

Invariant: `totals` equals `decide.drausage.used_with_dra(claims, pods,
resource_of_class, dra)` over the objects last seen, where `dra` is what
`set_dra_claim` was last told of each ResourceClaim (without any:
`used_capacity(claims, pods, resource_of_class)`; tests check both against
the pure functions). DRA's part (docs/dra.md §2): a ResourceClaim no pod's
request stands for counts its devices as they are; the claim kube-scheduler
made for a pod's extended-resource requests is folded into that pod's
count by `pod_counted`, the one rule counting a pod once.
Objects are keyed by uid: a claim or pod recreated under the same name is
another object, and the caller deletes the old uid (a relist hands the
handlers `update(old, new)` with two uids).

Every change of `totals` is told to `on_change(resource, node)` as it is
made (the view's node index follows it: decide.nodeindex); `totals` itself
is never replaced.

Not thread-safe on its own: `ClusterView` holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuclaimctl.decide.capacity import claim_usage, pod_usage
from gpuclaimctl.decide.drausage import ClaimUse, pod_counted
from gpuclaimctl.decide.victims import RunningPod, freed_with, running_pod
from gpuclaimctl.state.indexes import pods_by_gang

Held = tuple[str, str, int]  # node, resource, count


@dataclass(frozen=True)
class HeldClaim:
    """A claim holding GPUs, as preemption reads it."""

    namespace: str
    class_name: str
    freed_with: str | None  # decide.victims.freed_with: "*", a pod's uid, or None


class UsageTracker:
    def __init__(self, on_change: Callable[[str, str], None] | None = None) -> None:
        self.on_change = on_change
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
        # DRA (state.dra): ResourceClaim uid -> the devices it holds of the
        # offers, counted as they are (no pod's request stands for them) ...
        self._dra_direct: dict[str, tuple[Held, ...]] = {}
        # ... or folded into its pod's count: claim uid -> (pod uid, held),
        # and pod uid -> (node, resource) -> devices of those claims.
        self._dra_extended: dict[str, tuple[str, tuple[Held, ...]]] = {}
        self._extended_of: dict[str, dict[tuple[str, str], int]] = {}
        # For preemption: the claims holding GPUs on each node, what they
        # are, and the pods bound to nodes (DESIGN.md §4d).
        self.node_claims: dict[str, set[str]] = {}           # node -> claim uids holding GPUs there
        self.held_claims: dict[str, HeldClaim] = {}          # claim uid -> what preemption reads
        self.running: dict[str, RunningPod] = {}             # pod uid -> pod bound to a node, not finished
        self.gang_pods: dict[str, set[str]] = {}             # gang key -> uids of its running pods
        # Bumped whenever what preemption reads of a node, or of a gang's
        # members, may have changed (state.victims keeps answers by them).
        self.node_version: dict[str, int] = {}
        self.gang_version: dict[str, int] = {}
        # Pods that left a node (deleted, or finished) while claims holding
        # GPUs still reserve them, as they last ran: those GPUs are coming
        # free (the claim sync lets the reservations go), at no one's cost.
        # Kept until the last reservation goes.
        self.gone: dict[str, RunningPod] = {}

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
        before = self._claim_reserves.get(uid, ())
        self.delete_claim(uid, prune=False)
        self._set_claim(uid, claim)
        self._prune_gone(before)

    def _set_claim(self, uid: str, claim: Mapping[str, Any]) -> None:
        held = claim_usage(claim, self._resource_of_class)
        if held is not None:
            self._bump(held[0])
            self._claims[uid] = held
            self._add(held, 1)
            self.node_claims.setdefault(held[0], set()).add(uid)
            meta, spec = claim["metadata"], claim.get("spec") or {}
            self.held_claims[uid] = HeldClaim(str(meta.get("namespace") or ""), str(spec.get("className") or ""),
                                              freed_with(claim))
            if not (claim.get("status") or {}).get("resourceName"):
                self._legacy[uid] = claim
        reserves = tuple(r.get("uid", "") for r in
                         (claim.get("status") or {}).get("reservedFor") or ())
        if reserves:
            self._claim_reserves[uid] = reserves
            self._bump_gangs(reserves)
            for pod_uid in reserves:
                self._reserved_by.setdefault(pod_uid, set()).add(uid)
                self._refresh_pod(pod_uid)

    def delete_claim(self, uid: str, *, prune: bool = True) -> None:
        held = self._claims.pop(uid, None)
        self._legacy.pop(uid, None)
        if held is not None:
            self._add(held, -1)
            self._bump(held[0])
            on_node = self.node_claims.get(held[0])
            if on_node is not None:
                on_node.discard(uid)
                if not on_node:
                    del self.node_claims[held[0]]
            self.held_claims.pop(uid, None)
        reserved = self._claim_reserves.pop(uid, ())
        self._bump_gangs(reserved)
        for pod_uid in reserved:
            claims = self._reserved_by.get(pod_uid)
            if claims is not None:
                claims.discard(uid)
                if not claims:
                    del self._reserved_by[pod_uid]
            self._refresh_pod(pod_uid)
        if prune:
            self._prune_gone(reserved)

    def _prune_gone(self, pod_uids: tuple[str, ...]) -> None:
        for pod_uid in pod_uids:
            if pod_uid not in self._reserved_by:
                self.gone.pop(pod_uid, None)

    # -- pods --------------------------------------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        held = tuple(pod_usage(pod))
        if held:
            self._pods[uid] = held
        else:
            self._pods.pop(uid, None)
        self._refresh_pod(uid)
        self._set_running(uid, pod)

    def delete_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self._refresh_pod(uid)
        self._set_running(uid, None)

    def reserved_claims(self, pod_uid: str) -> set[str]:
        """The uids of the claims that reserve a pod."""
        return self._reserved_by.get(pod_uid, set())

    def reserving(self, claim_uid: str) -> tuple[str, ...]:
        """The uids of the pods a claim reserves."""
        return self._claim_reserves.get(claim_uid, ())

    def _bump(self, node: str) -> None:
        self.node_version[node] = self.node_version.get(node, 0) + 1

    def _bump_gangs(self, pod_uids: tuple[str, ...]) -> None:
        for pod_uid in pod_uids:
            pod = self.running.get(pod_uid)
            if pod is not None and pod.gang:
                self.gang_version[pod.gang] = self.gang_version.get(pod.gang, 0) + 1

    def _set_running(self, uid: str, pod: Mapping[str, Any] | None) -> None:
        running = None if pod is None else running_pod(pod, pods_by_gang)  # type: ignore[arg-type]
        old = self.running.get(uid)
        if running == old:
            return  # nothing preemption reads changed (a status update, say)
        if old is not None:
            self._bump(old.node)
            self._bump_gangs((uid,))
            del self.running[uid]
            if running is None and self._reserved_by.get(uid):
                self.gone[uid] = old
            if old.gang:
                members = self.gang_pods.get(old.gang)
                if members is not None:
                    members.discard(uid)
                    if not members:
                        del self.gang_pods[old.gang]
        if running is not None:
            self.gone.pop(uid, None)
            self.running[uid] = running
            self._bump(running.node)
            if running.gang:
                self.gang_pods.setdefault(running.gang, set()).add(uid)
                self._bump_gangs((uid,))

    # -- DRA ---------------------------------------------------------------

    def set_dra_claim(self, uid: str, use: ClaimUse | None) -> None:
        """What a ResourceClaim uses of the devices DRA offers (state.dra),
        or None: nothing (not allocated, gone, or none of its devices
        offered)."""
        for h in self._dra_direct.pop(uid, ()):
            self._add(h, -1)
        pods: list[str] = []
        old = self._dra_extended.pop(uid, None)
        if old is not None:
            pod_uid, held = old
            mine = self._extended_of[pod_uid]
            for node, resource, n in held:
                left = mine[(node, resource)] - n
                if left:
                    mine[(node, resource)] = left
                else:
                    del mine[(node, resource)]
            if not mine:
                del self._extended_of[pod_uid]
            pods.append(pod_uid)
        if use is not None and use.held:
            if use.pod_uid:
                self._dra_extended[uid] = (use.pod_uid, use.held)
                mine = self._extended_of.setdefault(use.pod_uid, {})
                for node, resource, n in use.held:
                    mine[(node, resource)] = mine.get((node, resource), 0) + n
                pods.append(use.pod_uid)
            else:
                self._dra_direct[uid] = use.held
                for h in use.held:
                    self._add(h, 1)
        for pod_uid in dict.fromkeys(pods):
            self._refresh_pod(pod_uid)

    # -- internals -----------------------------------------------------------

    def _refresh_pod(self, pod_uid: str) -> None:
        """Count the pod once per node and resource (`pod_counted`): the
        larger of its requests and its scheduler-made ResourceClaim's
        devices, beyond what its claims hold (all of it for a pod no claim
        reserves)."""
        for h in self._pod_counted.pop(pod_uid, ()):
            self._add(h, -1)
        requests = self._pods.get(pod_uid)
        extended = self._extended_of.get(pod_uid)
        if not requests and not extended:
            return
        by_claims: dict[tuple[str, str], int] = {}
        for claim_uid in self._reserved_by.get(pod_uid, ()):
            held = self._claims.get(claim_uid)
            if held is not None:
                by_claims[held[:2]] = by_claims.get(held[:2], 0) + held[2]
        if extended is None:
            counted = tuple((node, resource, amount - by_claims.get((node, resource), 0))
                            for node, resource, amount in requests or ()
                            if amount > by_claims.get((node, resource), 0))
        else:
            asked = {(node, resource): amount for node, resource, amount in requests or ()}
            counted = tuple((node, resource, n) for node, resource in sorted(asked.keys() | extended.keys())
                            if (n := pod_counted(asked.get((node, resource), 0), extended.get((node, resource), 0),
                                                 by_claims.get((node, resource), 0))) > 0)
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
        if self.on_change is not None:
            self.on_change(resource, node)
