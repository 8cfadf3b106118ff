"""`pod:` sync (DESIGN.md §5): which of the pod syncs a pod key runs.

A gated pod is placed: alone (sync.pods), or with its gang (sync.gangs); a
pod we released that the scheduler refuses is acted on; an ungated pod that
names claims is told nothing places them.
"""

from __future__ import annotations

from gpuclaimctl.model import api, keys
from gpuclaimctl.model.podclaims import has_gate, names_claims_ungated
from gpuclaimctl.sync.context import SyncContext
from gpuclaimctl.sync.gangs import gang_of, place_gang
from gpuclaimctl.sync.pods import _check_refused, _place, _tell_not_gated


def sync_pod(ctx: SyncContext, key: str) -> None:
    ns, name = keys.split(key)
    pod = ctx.pods.get(ns, name)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return
    if has_gate(pod):
        if pod["metadata"].get("uid") in ctx.memories.released:
            return  # released by us; the cache shows an older version
        gang = gang_of(ctx, pod)
        if gang is None:
            _place(ctx, pod)
        else:
            place_gang(ctx, pod, gang)
    elif api.PLACED_NODE_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        _check_refused(ctx, pod)
    elif names_claims_ungated(pod):
        _tell_not_gated(ctx, pod)
