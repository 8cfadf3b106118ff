"""The GPU claim controller: informers in, keys through one queue, syncs out.

Built the way kube-controller-manager's controllers are: shared informers
fill indexed caches; one handler registration per informer first applies
the change to the cluster view (state.view: usage, placements in flight,
nodes, classes), then turns it into `pod:`, `claim:` and `class:` keys;
workers run the syncs (sync/), each with the same small frozen context.

`class:` keys keep each GPUClass's status figures; they are added at most
once a second per class, so placements do not become status writes one
for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from typing import Any

from gpuclaimctl.client.fence import NotLeader
from gpuclaimctl.client.errors import ApiError, Conflict
from gpuclaimctl.client.writer import Writer
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.budgets import BudgetInfo
from gpuclaimctl.model.nodes import node_ready, not_ready_since, ready_condition
from gpuclaimctl.model.podclaims import has_gate
from gpuclaimctl.model.snapshot import ClassInfo, NodeInfo, parse_time
from gpuclaimctl.state import indexes
from gpuclaimctl.state.memories import Memories
from gpuclaimctl.state.turnstile import AgeTurnstile
from gpuclaimctl.state.view import Change, ClusterView
from gpuclaimctl.sync.claims import sync_claim
from gpuclaimctl.sync.classes import sync_class
from gpuclaimctl.sync.budgets import sync_budget
from gpuclaimctl.sync.context import BUDGET, CLAIM, CLASS, POD, Settings, SyncContext
from gpuclaimctl.sync.pods import sync_pod
from informers import (
    GPU_BUDGETS,
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    DeletedFinalStateUnknown,
    EventHandlerFuncs,
    SharedInformerFactory,
)
from metrics.controller import ControllerMetrics, StateSample
from workqueue import RateLimitingQueue, default_controller_rate_limiter

log = logging.getLogger("gpuclaimctl.controller")

Obj = dict[str, Any]
# A class's status follows claims and nodes; writing it at most this often
# keeps a burst of placements from becoming a burst of status writes.
CLASS_STATUS_DELAY = 1.0


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def node_health(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What ends a rejection early: allocatable, taints, readiness."""
    if node is None:
        return ()
    ready = (ready_condition(node) or {}).get("status")
    return ((node.get("status") or {}).get("allocatable"), (node.get("spec") or {}).get("taints"), ready)


class Controller:
    def __init__(
        self,
        factory: SharedInformerFactory,
        writer: Writer,
        settings: Settings,
        *,
        metrics: ControllerMetrics | None = None,
        queue_metrics: Any = None,
        shutdown_timeout: float = 20.0,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        pods = factory.pods()
        turnstile = AgeTurnstile()
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name="gpuclaimctl", metrics_provider=queue_metrics,
            order=lambda key: key_order(key, pods.get),
            tracker=TurnstileTracker(turnstile, pods.get))
        self.view = ClusterView(now)
        self.ctx = SyncContext(
            pods=pods, claims=factory.gpu_claims(), nodes=factory.nodes(),
            classes=factory.gpu_classes(), templates=factory.gpu_claim_templates(),
            pvcs=factory.persistent_volume_claims(), pvs=factory.persistent_volumes(),
            budgets=factory.gpu_budgets(),
            budgets_synced=lambda: factory.informer_for(GPU_BUDGETS).has_synced(),
            writer=writer, view=self.view, memories=Memories(reject_for=settings.reject_for),
            turnstile=turnstile, enqueue=self.queue.add, enqueue_after=self.queue.add_after,
            wake=lambda change: handlers.woke(change),
            settings=settings, metrics=metrics, now=now)
        self.shutdown_timeout = shutdown_timeout
        handlers = Handlers(self.ctx, self.queue)
        self._registrations = [
            factory.informer_for(PODS, indexers=indexes.POD_INDEXERS).add_event_handler(
                EventHandlerFuncs(add=handlers.pod_added, update=handlers.pod_updated,
                                  delete=handlers.pod_deleted), name="gpuclaimctl-pods"),
            factory.informer_for(GPU_CLAIMS, indexers=indexes.CLAIM_INDEXERS).add_event_handler(
                EventHandlerFuncs(add=handlers.claim_added, update=handlers.claim_updated,
                                  delete=handlers.claim_deleted), name="gpuclaimctl-claims"),
            factory.informer_for(NODES).add_event_handler(
                EventHandlerFuncs(add=handlers.node_added, update=handlers.node_updated,
                                  delete=handlers.node_deleted), name="gpuclaimctl-nodes"),
            factory.informer_for(GPU_CLASSES).add_event_handler(
                EventHandlerFuncs(add=handlers.class_added, update=handlers.class_updated,
                                  delete=handlers.class_deleted), name="gpuclaimctl-classes"),
            factory.informer_for(GPU_CLAIM_TEMPLATES).add_event_handler(
                EventHandlerFuncs(add=handlers.template_changed,
                                  update=lambda _o, n: handlers.template_changed(n)),
                name="gpuclaimctl-templates"),
            factory.informer_for(GPU_BUDGETS).add_event_handler(
                EventHandlerFuncs(add=handlers.budget_changed,
                                  update=handlers.budget_updated,
                                  delete=handlers.budget_changed), name="gpuclaimctl-budgets"),
            factory.informer_for(PERSISTENT_VOLUME_CLAIMS).add_event_handler(
                EventHandlerFuncs(add=handlers.pvc_changed, update=lambda _o, n: handlers.pvc_changed(n),
                                  delete=handlers.pvc_changed), name="gpuclaimctl-pvcs"),
            factory.informer_for(PERSISTENT_VOLUMES).add_event_handler(
                EventHandlerFuncs(add=handlers.pv_changed, update=lambda _o, n: handlers.pv_changed(n),
                                  delete=handlers.pv_changed), name="gpuclaimctl-pvs"),
        ]
        self._workers: list[threading.Thread] = []
        self._abandoned = threading.Event()

    @property
    def metrics(self) -> ControllerMetrics | None:
        return self.ctx.metrics

    # -- readiness -------------------------------------------------------------

    def has_synced(self) -> bool:
        return all(r.has_synced() for r in self._registrations)

    # -- worker loop (sample-controller) ------------------------------------------

    def run(self, workers: int, stop: threading.Event) -> None:
        """Start `workers` threads; return once `stop` is set and they finished."""
        for i in range(workers):
            t = threading.Thread(target=self._run_worker, name=f"worker-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        stop.wait()
        self.shutdown(self.shutdown_timeout)

    def shutdown(self, timeout: float) -> bool:
        """No new work; wait up to `timeout` for in-flight syncs. True if they finished."""
        self.queue.shut_down()
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._workers)

    def abandon(self) -> None:
        """Leadership is lost: queued keys are dropped, not drained (DESIGN I3).
        Workers finish the sync they are in (its writes are refused by the
        write fence) and take no other key."""
        self._abandoned.set()
        self.queue.shut_down()

    def _run_worker(self) -> None:
        while self._process_next_work_item():
            pass

    def _process_next_work_item(self) -> bool:
        key, shutdown = self.queue.get()
        if shutdown or key is None:
            return False
        if self._abandoned.is_set():
            self.queue.done(key)
            return False
        kind = key.split(":", 1)[0]
        started = time.monotonic()
        result = "ok"
        try:
            self.sync(key)
            self.queue.forget(key)
        except NotLeader:
            # The fence closed: this process no longer leads and is exiting.
            result = "error"
        except Exception as e:  # a retry may fix it: back off and try again
            result = "error"
            level = logging.INFO if isinstance(e, Conflict) else logging.WARNING
            log.log(level, "sync %s failed, will retry: %s", key, e,
                    exc_info=level == logging.WARNING and not _is_expected(e))
            if not self._abandoned.is_set():
                self.queue.add_rate_limited(key)
        finally:
            self.queue.done(key)  # leaves the turnstile unless handed out again (TurnstileTracker)
            if self.metrics is not None:
                self.metrics.sync_seconds.labels(kind, result).observe(time.monotonic() - started)
        return True

    def sync(self, key: str) -> None:
        dispatch(self.ctx, key)

    # -- taking over -------------------------------------------------------------------------

    def catch_up(self) -> int:
        """Count as in flight every claim the API server has Bound that the
        cache does not show Bound there yet; return how many.

        A new leader starts with no placements in flight, and its caches may
        not yet show the last binds of the leader it replaces (the watch can
        lag behind the writes). Placing on those GPUs would overcommit. So,
        once synced and before the first decision, one consistent list of
        claims is compared with the cache; the entries end, as any other,
        when the informer shows the version listed (or a later one).
        """
        added = self.view.catch_up(self.ctx.writer.list_claims(), self.ctx.claims.get)
        if added:
            log.info("took over with %d bound claims the cache did not show yet; counted as in flight",
                     added)
        return added

    def state_sample(self) -> StateSample:
        """Claims by class and phase, GPUs allocatable and bound per class,
        each GPUBudget's limits and use (for /metrics)."""
        claims: dict[tuple[str, str], int] = {}
        bound: dict[str, int] = {}
        for c in self.ctx.claims.list():
            cls = (c.get("spec") or {}).get("className", "")
            phase = (c.get("status") or {}).get("phase") or api.Phase.PENDING
            claims[(cls, phase)] = claims.get((cls, phase), 0) + 1
            if phase == api.Phase.BOUND:
                bound[cls] = bound.get(cls, 0) + int((c.get("spec") or {}).get("count") or 0)
        allocatable: dict[str, int] = {}
        nodes = [NodeInfo.from_api(n) for n in self.ctx.nodes.list()]
        for obj in self.ctx.classes.list():
            cls_info = ClassInfo.from_api(obj)
            allocatable[cls_info.name] = cls_info.allocatable(nodes)[1]
            bound.setdefault(cls_info.name, 0)
        budgets: dict[tuple[str, str, str, str], int] = {}
        for obj in self.ctx.budgets.list():
            info = BudgetInfo.from_api(obj)
            use = self.ctx.view.budget_use(info.namespace)
            for limit in info.limits:
                held, placing = use.of(limit)  # as the budget's status.used counts it
                budgets[(info.namespace, info.name, limit.class_name, "limit")] = limit.gpus
                budgets[(info.namespace, info.name, limit.class_name, "used")] = held + placing
        return StateSample(claims=claims, allocatable=allocatable, bound=bound, budgets=budgets)

    def gated_pods(self) -> tuple[list[Obj], list[Obj]]:
        """The pods that carry our gate, and the claims they name that the
        cache has (for /metrics; cache objects, read-only)."""
        pods = self.ctx.pods.by_index(indexes.WAITING_PODS, "")
        claims = [c for p in pods for key in indexes.pods_by_claim(p)
                  if (c := self.ctx.claims.get(*keys.split(key))) is not None]
        return pods, claims


def key_order(key: str, get_pod: Callable[[str, str], Obj | None]) -> tuple[str, ...]:
    """The order keys ready together are handed out in: claim and class
    keys first (they free GPUs and keep status; each is quick), then pods
    oldest first (DESIGN §4: where pods compete, the oldest goes first), so
    a freed GPU reaches the oldest waiting pod that fits before younger
    ones are looked at. A pod the cache no longer has goes first: its sync
    does nothing."""
    if not key.startswith(POD):
        return ("",)
    pod = get_pod(*keys.split(key[len(POD):]))
    if pod is None:
        return (" ",)
    return (" ", pod["metadata"].get("creationTimestamp") or "", key)


class TurnstileTracker:
    """Keeps the pods the work queue has handed out, or will hand out again,
    in the turnstile (AgeTurnstile), under the queue's lock.

    A pod enters as it is handed out, so the pod handed out first holds back
    one handed out after it even if that one's worker reaches the decision
    first; its sync leaves once decided. A pod woken while it is being
    synced (GPUs freed after it decided, before its worker was done) enters
    again at once and stays in until decided again: else a younger pod
    woken by the same change, handed out meanwhile, would take the GPUs the
    older one now fits (make bench-controller's raised-node wake-up).
    """

    def __init__(self, turnstile: AgeTurnstile, get_pod: Callable[[str, str], Obj | None]) -> None:
        self._turnstile = turnstile
        self._get_pod = get_pod

    def handed_out(self, key: str) -> None:
        self._enter(key)

    def added_while_processing(self, key: str) -> None:
        self._enter(key)

    def finished(self, key: str, again: bool) -> None:
        if not key.startswith(POD):
            return
        if again:
            self._enter(key)  # its sync may have left after deciding
        else:
            self._turnstile.leave(key[len(POD):])

    def _enter(self, key: str) -> None:
        if not key.startswith(POD):
            return
        ns, name = keys.split(key[len(POD):])
        pod = self._get_pod(ns, name)
        created = parse_time(pod["metadata"].get("creationTimestamp")) if pod else None
        if created is not None:
            self._turnstile.enter(key[len(POD):], (created, ns, name))  # the key pod sync uses
        else:  # gone: it holds no one back
            self._turnstile.leave(key[len(POD):])


def dispatch(ctx: SyncContext, key: str) -> None:
    """Run the sync a queue key names."""
    if key.startswith(POD):
        sync_pod(ctx, key[len(POD):])
    elif key.startswith(CLAIM):
        sync_claim(ctx, key[len(CLAIM):])
    elif key.startswith(CLASS):
        sync_class(ctx, key[len(CLASS):])
    elif key.startswith(BUDGET):
        sync_budget(ctx, key[len(BUDGET):])
    else:
        log.error("dropping unknown key %r", key)


class Handlers:
    """Informer event handlers: apply the change to the view, then enqueue
    the keys it affects (through the caches' indexes). Nothing else."""

    def __init__(self, ctx: SyncContext, queue: RateLimitingQueue[str]) -> None:
        self.ctx = ctx
        self.view = ctx.view
        self.queue = queue

    # -- keys ----------------------------------------------------------------------------

    def enqueue_class(self, name: str) -> None:
        if name:
            self.queue.add_after(CLASS + name, CLASS_STATUS_DELAY)

    def enqueue_budgets(self, namespace: str) -> None:
        """The namespace's GPUBudgets' status follows its claims (at most once a second)."""
        for b in self.ctx.budgets.list(namespace):
            self.queue.add_after(BUDGET + keys.key_of(b), CLASS_STATUS_DELAY)

    def enqueue_classes(self) -> None:
        for c in self.ctx.classes.list():
            self.enqueue_class(c["metadata"]["name"])

    def enqueue_waiting_pods(self, namespace: str | None = None,
                             changed_nodes: Collection[str] | None = None) -> None:
        """Every gated pod (the queue hands them out oldest first). With
        `changed_nodes` (GPUs freed there, or the nodes changed), only the
        pods that could now fit on one of them: a pod that waits for
        Capacity and needs more than each of them has free is skipped, as
        nothing it waited for changed; any event of its own, or a resync,
        still wakes it."""
        pods = self.ctx.pods.by_index(indexes.WAITING_PODS, "")
        if namespace is not None:
            pods = [p for p in pods if p["metadata"].get("namespace") == namespace]
        free = None if changed_nodes is None else list(self.view.free_on(changed_nodes).values())
        needs = self.ctx.memories.capacity_needs
        woken = []
        for p in pods:
            key = keys.key_of(p)
            if free is not None:
                need = needs.get(key)
                if need is not None and not any(_fits(need, f) for f in free):
                    continue
            woken.append(POD + key)
        # All at once: a worker idle in get() must not take the first one
        # added (the index's order) before the oldest is in (DESIGN §4).
        self.queue.add_all(woken)

    def woke(self, change: Change) -> None:
        if change.freed_anywhere:
            self.enqueue_waiting_pods()
        elif change.freed_on:
            self.enqueue_waiting_pods(changed_nodes=change.freed_on)

    # -- pods ------------------------------------------------------------------------------

    def pod_added(self, pod: Obj) -> None:
        self.woke(self.view.apply_pod(None, pod))
        if _pod_sync_due(pod):
            self.queue.add(POD + keys.key_of(pod))

    def pod_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            # A resync: retry only what still waits.
            if has_gate(new):
                self.queue.add(POD + keys.key_of(new))
            return
        self.woke(self.view.apply_pod(old, new))
        if old["metadata"].get("uid") != new["metadata"].get("uid"):
            # Deleted and recreated under the name while the watch was away.
            self.ctx.memories.deleted_pods[old["metadata"].get("uid", "")] = True
            self._enqueue_claims_of_pod(old)
        if _pod_sync_due(new):
            self.queue.add(POD + keys.key_of(new))
        old_phase, new_phase = (old.get("status") or {}).get("phase"), (new.get("status") or {}).get("phase")
        if old_phase != new_phase and new_phase in ("Succeeded", "Failed"):
            self._enqueue_claims_of_pod(new)
        elif new["metadata"].get("deletionTimestamp") and not old["metadata"].get("deletionTimestamp"):
            self._enqueue_claims_of_pod(new)
        elif has_gate(old) and not has_gate(new):
            # Released (by us: its claims are bound) or ungated by someone
            # else: either way no claim it names waits for it any more, so
            # a claim that says Waiting has that to drop. Only those: nothing
            # else of a claim's plan turns on the gate (a claim whose Waiting
            # the cache does not show yet is synced by its own update), and
            # a sync per claim of every released pod was a third of them.
            self._enqueue_claims_of_pod(new, saying_waiting=True)
        elif has_gate(new) and (old["metadata"].get("annotations") or {}).get(api.CLAIMS_ANNOTATION) \
                != (new["metadata"].get("annotations") or {}).get(api.CLAIMS_ANNOTATION):
            # An edited annotation may drop a claim the pod had reserved.
            self._enqueue_claims_of_pod(old)
            self._enqueue_claims_of_pod(new)

    def pod_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pod = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if pod is None:
            return
        self.ctx.memories.deleted_pods[pod["metadata"].get("uid", "")] = True
        self.woke(self.view.delete_pod(pod))
        self.ctx.memories.last_warning.pop(keys.key_of(pod), None)
        self.ctx.memories.capacity_needs.pop(keys.key_of(pod), None)
        self._enqueue_claims_of_pod(pod)

    def _enqueue_claims_of_pod(self, pod: Obj, saying_waiting: bool = False) -> None:
        """The claims the pod uses, owns or names (whose Waiting may end);
        with `saying_waiting`, only those whose cached status says Waiting."""
        key = keys.key_of(pod)
        seen: set[str] = set(indexes.pods_by_claim(pod))
        for index in (indexes.CLAIMS_BY_RESERVED_POD, indexes.CLAIMS_BY_OWNER_POD):
            for c in self.ctx.claims.by_index(index, key):
                seen.add(keys.key_of(c))
        for k in seen:
            if saying_waiting and not _says_waiting(self.ctx.claims.get(*keys.split(k))):
                continue
            self.queue.add(CLAIM + k)

    # -- claims ---------------------------------------------------------------------------

    def claim_added(self, claim: Obj) -> None:
        self.woke(self.view.apply_claim(None, claim))
        self.queue.add(CLAIM + keys.key_of(claim))
        self._enqueue_pods_of_claim(claim)
        if _holds_gpus(claim):
            self.enqueue_class(_class_of(claim))
            self.enqueue_budgets(claim["metadata"].get("namespace", ""))

    def claim_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            self.queue.add(CLAIM + keys.key_of(new))  # a resync: cleanup may be due
            return
        self.woke(self.view.apply_claim(old, new))
        self.queue.add(CLAIM + keys.key_of(new))
        if _placement_fields(old) != _placement_fields(new):
            # Not for a Waiting condition alone: two pods waiting on one
            # shared claim would wake each other with every message written.
            self._enqueue_pods_of_claim(new)
        if _holds_gpus(old) != _holds_gpus(new) or _class_of(old) != _class_of(new):
            self.enqueue_class(_class_of(old))
            self.enqueue_class(_class_of(new))
            self.enqueue_budgets(new["metadata"].get("namespace", ""))

    def claim_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        claim = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if claim is None:
            return
        self.woke(self.view.delete_claim(claim))
        self._enqueue_pods_of_claim(claim)
        if _holds_gpus(claim):
            self.enqueue_class(_class_of(claim))
            self.enqueue_budgets(claim["metadata"].get("namespace", ""))

    def _enqueue_pods_of_claim(self, claim: Obj) -> None:
        for p in self.ctx.pods.by_index(indexes.PODS_BY_CLAIM, keys.key_of(claim)):
            self.queue.add(POD + keys.key_of(p))

    # -- nodes and classes ----------------------------------------------------------------

    def node_added(self, node: Obj) -> None:
        self._node_changed(None, node)

    def node_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            return
        self._node_changed(old, new)

    def node_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        node = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        name = node["metadata"]["name"] if node else keys.split(obj.key)[1]  # type: ignore[union-attr]
        self.view.delete_node(name)
        for c in self.ctx.claims.by_index(indexes.CLAIMS_BY_NODE, name):
            self.queue.add(CLAIM + keys.key_of(c))
        self.enqueue_classes()

    def _node_changed(self, old: Obj | None, new: Obj) -> None:
        name = new["metadata"]["name"]
        health_changed = old is not None and node_health(old) != node_health(new)
        changed = self.view.apply_node(
            new, ready=node_ready(new), not_ready_since=not_ready_since(new),
            health_changed=health_changed, recreated=old is None)
        if health_changed:
            for c in self.ctx.claims.by_index(indexes.CLAIMS_BY_REJECTED_NODE, name):
                self.queue.add(CLAIM + keys.key_of(c))
        if not changed:
            return
        for c in self.ctx.claims.by_index(indexes.CLAIMS_BY_NODE, name):
            self.queue.add(CLAIM + keys.key_of(c))
        # Only this node changed: a pod short of room elsewhere can only
        # fit here now.
        self.enqueue_waiting_pods(changed_nodes=(name,))
        self.enqueue_classes()

    def class_added(self, cls: Obj) -> None:
        self.view.apply_class(cls)
        self.enqueue_class(cls["metadata"]["name"])
        self.enqueue_waiting_pods()

    def class_updated(self, old: Obj, new: Obj) -> None:
        self.enqueue_class(new["metadata"]["name"])
        if (old.get("spec"), old["metadata"].get("deletionTimestamp")) == \
                (new.get("spec"), new["metadata"].get("deletionTimestamp")):
            return  # its status (ours) or a resync: nothing placement reads
        self.view.apply_class(new)
        self.enqueue_waiting_pods()

    def class_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        cls = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        name = cls["metadata"]["name"] if cls else keys.split(obj.key)[1]  # type: ignore[union-attr]
        self.view.delete_class(name)
        self.enqueue_waiting_pods()

    def budget_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        """Added or deleted: the namespace's waiting pods look again (a pod
        waiting on Budget may fit now; one that fit may wait on it)."""
        budget = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if budget is None:
            return
        ns = budget["metadata"].get("namespace", "")
        self.queue.add_after(BUDGET + keys.key_of(budget), CLASS_STATUS_DELAY)
        self.enqueue_waiting_pods(ns)

    def budget_updated(self, old: Obj, new: Obj) -> None:
        if old.get("spec") == new.get("spec"):
            return  # its status (ours) or a resync
        self.budget_changed(new)

    def template_changed(self, template: Obj) -> None:
        self.enqueue_waiting_pods(template["metadata"].get("namespace"))

    def pvc_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        """A volume claim bound (or gone): the gated pods using it may now
        be constrained to other nodes."""
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if pvc is not None:
            self._enqueue_pods_of_pvc(keys.key_of(pvc))

    def pv_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pv = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            self._enqueue_pods_of_pvc(keys.namespaced(ref.get("namespace"), ref["name"]))

    def _enqueue_pods_of_pvc(self, key: str) -> None:
        for p in self.ctx.pods.by_index(indexes.PODS_BY_PVC, key):
            self.queue.add(POD + keys.key_of(p))


# -- small helpers ----------------------------------------------------------------------------


def _class_of(claim: Obj) -> str:
    return str((claim.get("spec") or {}).get("className") or "")


def _placement_fields(claim: Obj) -> tuple[Any, ...]:
    """What a placement reads of a claim (ClaimState.from_api): not its conditions."""
    status = claim.get("status") or {}
    return (claim["metadata"].get("uid"), claim["metadata"].get("deletionTimestamp"),
            claim.get("spec"), status.get("phase"), status.get("nodeName"),
            status.get("reservedFor"), status.get("rejectedNodes"))


def _pod_sync_due(pod: Obj) -> bool:
    """A pod the pod sync acts on: gated by us (to place), or released by
    us and reported Unschedulable while not bound (a refusal). The other
    updates of a released pod (binding, kubelet status) need no sync."""
    if has_gate(pod):
        return True
    if api.PLACED_NODE_ANNOTATION not in (pod["metadata"].get("annotations") or {}) \
            or (pod.get("spec") or {}).get("nodeName"):
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _fits(need: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return all(free.get(r, 0) >= n for r, n in need.items())


def _holds_gpus(claim: Obj) -> bool:
    status = claim.get("status") or {}
    return status.get("phase") == api.Phase.BOUND and bool(status.get("nodeName"))


def _is_expected(e: Exception) -> bool:
    """API answers and connection errors: worth a line, not a traceback."""
    return isinstance(e, (ApiError, OSError))


__all__ = ["Controller", "Handlers", "Settings"]


def _says_waiting(claim: Obj | None) -> bool:
    return claim is not None and any(c.get("type") == api.CONDITION_WAITING
                                     for c in (claim.get("status") or {}).get("conditions") or ())
