"""What a sync may use: a small frozen context, handed in by the controller.

A sync module takes this and nothing wider, and never imports the module
that wires it (controller.py), so it can be driven by fakes — listers over
hand-filled stores, an in-memory API behind the writer — as the
deterministic simulation does (tests/test_simulation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpuclaimctl.client.writer import Writer
from gpuclaimctl.model.api import Strategy
from gpuclaimctl.model.gangs import PodGroupLookup
from gpuclaimctl.model.keys import Kind, WorkKey
from gpuclaimctl.state.memories import Memories
from gpuclaimctl.state.turnstile import AgeTurnstile
from gpuclaimctl.state.view import Change, ClusterView
from informers import (
    GPUBudgetLister,
    GPUClaimLister,
    GPUClaimTemplateLister,
    GPUClassLister,
    NodeLister,
    PersistentVolumeClaimLister,
    PersistentVolumeLister,
    PodLister,
)
from metrics.controller import ControllerMetrics

# The queue's key kinds, as prefixes of the spelled key (model.keys.WorkKey:
# `pod:ns/name`, `claim:ns/name`, `class:name`, `budget:ns/name`, and the one
# `audit:inflight`, sync.claims.audit_inflight). Parsed only by WorkKey.
POD = f"{Kind.POD}:"
CLAIM = f"{Kind.CLAIM}:"
CLASS = f"{Kind.CLASS}:"
BUDGET = f"{Kind.BUDGET}:"
AUDIT_INFLIGHT = str(WorkKey(Kind.AUDIT, "inflight"))


def no_podgroup(namespace: str, name: str) -> None:
    """The PodGroup lookup where none are read: it finds nothing."""
    return None


def never() -> bool:
    return False


@dataclass(frozen=True)
class Settings:
    """The options a sync reads (from `gpuclaimctl run`'s flags)."""

    strategy: Strategy = Strategy.BINPACK
    reject_for: float = 600.0
    node_lost_grace: float = 300.0
    # Sets of higher priority evict pods of lower priority (DESIGN.md §4d).
    preemption: bool = True


@dataclass(frozen=True)
class SyncContext:
    pods: PodLister
    claims: GPUClaimLister
    nodes: NodeLister
    classes: GPUClassLister
    templates: GPUClaimTemplateLister
    pvcs: PersistentVolumeClaimLister
    pvs: PersistentVolumeLister
    budgets: GPUBudgetLister
    # False until the GPUBudget informer has listed: then nothing is placed
    # (a namespace may have budgets we cannot see yet).
    budgets_synced: Callable[[], bool]
    writer: Writer
    view: ClusterView
    memories: Memories
    turnstile: AgeTurnstile
    # Add a full queue key (`pod:ns/name`), now or after some seconds.
    enqueue: Callable[[str], None]
    enqueue_after: Callable[[str, float], None]
    # Apply a change to the view and wake the pods it may let fit (GPUs
    # freed when a placement in flight ends without landing), as one step
    # under the view's lock (sync.handlers.Handlers.woke_by).
    wake: Callable[[Callable[[], Change]], None]
    settings: Settings
    metrics: ControllerMetrics | None
    now: Callable[[], datetime]
    # PodGroups (scheduling.k8s.io/v1beta1) by namespace and name, None
    # when not known; and whether they are read: False while the API is
    # not served or their informer has not listed yet (controller.py
    # starts it once discovery finds them). By default there are none.
    podgroups: PodGroupLookup = no_podgroup
    podgroups_synced: Callable[[], bool] = never
