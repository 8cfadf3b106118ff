"""What the controller remembers between syncs, bounded so a long-running
process keeps a flat memory. Each is thread-safe (LockedCache)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cachetools import LRUCache, TTLCache

from gpuclaimctl.model import api, keys
from gpuclaimctl.model.snapshot import Rejection
from gpuclaimctl.state.lockedcache import LockedCache

# Deleted pod uids remembered so a stale reservation needs no API call.
DELETED_PODS_REMEMBERED = 50_000
# One waiting reason per pod, so it gets one event per change.
TOLD_REMEMBERED = 100_000
SET_REJECTIONS_REMEMBERED = 10_000
# A waiting claim whose reason stays and whose figures change ("the most
# free on a node: 3") is written at most this often: with a thousand pods
# waiting, every freed GPU would otherwise cost a thousand status writes.
WAITING_MESSAGE_REFRESH = 30.0
# Seconds a claim a pod sync made is remembered if the informer never shows
# it (Memories.made_claims).
MADE_CLAIM_REMEMBERED = 60.0
# Seconds a Waiting write's 409 is remembered (Memories.waiting_conflicts).
WAITING_CONFLICT_REMEMBERED = 120.0
# A claim create the API server refused as invalid (400, 422) is not sent
# again with the same body for this long: a waiting pod is woken by every
# GPU freed anywhere, and each wake re-sent a create bound to be refused
# (about 230 in 2.5 minutes for one pod under churn). A change of the
# template or the pod makes another body; a fix elsewhere (a webhook, the
# CRD) is tried within this.
REFUSED_CREATE_TTL = 60.0
# Seconds a pod preemption evicted counts as terminating without the
# informer showing it (Memories.evicted).
EVICTED_REMEMBERED = 120.0


def refused_create_told(status: int, claim_name: str) -> str:
    """What `Memories.last_warning` holds for a pod told that the API server
    refused (`status`) to create its claim `claim_name`: one per claim, so
    each refusal is told (a quota may refuse one claim of a set, then the
    next). Handlers.quota_changed finds the pods a quota refused by it."""
    return f"{api.WaitReason.CLAIM_MISSING}: refused {status} {claim_name}"


# What `Memories.last_warning` holds for a pod told that it names claims
# without our gate (sync.pods._tell_not_gated; it is told once).
NOT_GATED_TOLD = "NotGated"


def told_key(pod: Mapping[str, Any]) -> str:
    """What `Memories.last_warning` remembers a pod by: its uid, so a pod
    deleted and made again under its name (seen as an update when the watch
    was away) is told again, and a sync of the old one finishing late
    cannot silence the new one."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or keys.key_of(pod))


def _set_rejections(reject_for: float) -> LockedCache[tuple[str, str], tuple[Rejection, ...]]:
    return LockedCache(TTLCache(maxsize=SET_REJECTIONS_REMEMBERED, ttl=max(reject_for, 1.0)))


@dataclass
class Memories:
    reject_for: float = 600.0
    deleted_pods: LockedCache[str, bool] = field(
        default_factory=lambda: LockedCache(LRUCache(DELETED_PODS_REMEMBERED)))
    # Pods (uid) this process released: a pod is never gated again, so a
    # sync that still finds one gated reads a cache that has not caught up
    # with our own release, and does nothing (the release's event will
    # come; releasing again would only be refused).
    released: LockedCache[str, bool] = field(
        default_factory=lambda: LockedCache(LRUCache(DELETED_PODS_REMEMBERED)))
    # When this process first saw kube-scheduler refuse each pod (uid) it
    # released: the condition's lastTransitionTime cannot tell, as it is
    # kept from SchedulingGated (both False) when the pod waited gated.
    refusals_seen: LockedCache[str, datetime] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # The last waiting reason each pod (its uid: told_key) was warned
    # of (one Warning event per change).
    last_warning: LockedCache[str, str] = field(default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # The reason and message each waiting pod (told_key) was last told or
    # would be told again: gpuclaimctl_pods_waiting's reason for a pod with
    # no claim to carry a Waiting condition (one missing, or another's).
    waiting_told: LockedCache[str, tuple[str, str]] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # What each pod waiting with reason Capacity needs on one node (resource
    # -> GPUs of its claims not yet bound): GPUs freed on a node with less
    # than that free cannot let it fit, so they do not wake it (see
    # sync.handlers.Handlers.enqueue_waiting_pods).
    capacity_needs: LockedCache[str, Mapping[str, int]] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Claims (uid) whose Waiting message was written in the last
    # WAITING_MESSAGE_REFRESH seconds: the reason written, and the
    # resourceVersion the write was answered with (sync.pods._waiting).
    waiting_written: LockedCache[str, tuple[api.WaitReason, int]] = field(default_factory=lambda: LockedCache(
        TTLCache(maxsize=TOLD_REMEMBERED, ttl=WAITING_MESSAGE_REFRESH)))
    # Claims (uid) whose last Waiting write met a newer version (409) and
    # was retried without failing the sync; the next 409 fails it.
    waiting_conflicts: LockedCache[str, bool] = field(default_factory=lambda: LockedCache(
        TTLCache(maxsize=TOLD_REMEMBERED, ttl=WAITING_CONFLICT_REMEMBERED)))
    # Claims (namespace/name) a pod sync made, as the create answered, until
    # the informer shows them (sync.pods._create; Handlers.claim_added).
    made_claims: LockedCache[str, Mapping[str, Any]] = field(default_factory=lambda: LockedCache(
        TTLCache(maxsize=TOLD_REMEMBERED, ttl=MADE_CLAIM_REMEMBERED)))
    # Pods (uid) a sync is placing right now (sync.pods._place): the echoes
    # of that sync's own claim create and bind are no news to it
    # (Handlers.claim_added, claim_updated), unlike those that come after it.
    placing: LockedCache[str, bool] = field(default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Claim creates refused as invalid: body digest -> (status, reason,
    # message) of the refusal (sync.pods._create).
    refused_creates: LockedCache[str, tuple[int, str, str]] = field(default_factory=lambda: LockedCache(
        TTLCache(maxsize=TOLD_REMEMBERED, ttl=REFUSED_CREATE_TTL)))
    # Pods (uid) whose release patch got no answer (it may have landed, or
    # land yet): the node it pinned the pod to and when the answer was lost.
    # Until the server has given up on it, the set must not move elsewhere.
    release_in_doubt: LockedCache[str, tuple[str, datetime]] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Pods (uid) that gave their turn up to an older pod (sync.pods): the
    # next decision goes ahead whatever is queued, so no order of the
    # queue, however it disagrees with the turnstile's, keeps a pod from
    # deciding; it costs one more sync at most.
    gave_turn: LockedCache[str, bool] = field(default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Gangs (namespace/name) whose decision took GPUs for claims it has not
    # sent the binds of yet (a write before them failed): those stay in
    # flight, held for the gang, until its next sync sends them, or, if the
    # gang waits instead, are let go (sync.gangs).
    gang_unsent: LockedCache[str, frozenset[str]] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Preemptors (pod uid, or gang key) -> nodes where an eviction they
    # needed was refused (a PodDisruptionBudget), given up until then
    # (DESIGN.md §4d).
    preemption_refused: LockedCache[str, Mapping[str, datetime]] = field(
        default_factory=lambda: LockedCache(LRUCache(TOLD_REMEMBERED)))
    # Pods (uid) evicted by preemption lately: terminating as far as
    # preemption is concerned until the informer shows it.
    evicted: LockedCache[str, bool] = field(default_factory=lambda: LockedCache(
        TTLCache(maxsize=TOLD_REMEMBERED, ttl=EVICTED_REMEMBERED)))
    # Rejections of template and inline sets: their claims die with the
    # refused pod, so the rejection lives with the set's identity (the
    # pod's owner and the entries) here, for --reject-for at most.
    set_rejections: LockedCache[tuple[str, str], tuple[Rejection, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.set_rejections = _set_rejections(self.reject_for)
