"""The GPU claim controller: informers in, keys through one queue, syncs out.

Built the way kube-controller-manager's controllers are: shared informers
fill indexed caches; one handler registration per informer first applies
the change to the cluster view (state.view: usage, placements in flight,
nodes, classes), then turns it into `pod:`, `claim:` and `class:` keys;
workers run the syncs (sync/), each with the same small frozen context.
The handlers are sync.handlers.Handlers.

PodGroups' informer and DRA's (ResourceSlices, DeviceClasses,
ResourceClaims, DeviceTaintRules: docs/dra.md) are the ones started late:
only once a discovery check finds the API server serving them
(discover_podgroups, discover_dra), which a cluster without them never
does; nothing waits for them to be ready. DRA nodes offer devices once
DRA's informers have all listed (Handlers.dra_synced): offered before the
claims holding them are known, devices would be counted free.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime, timezone
from typing import Any

from gpuclaimctl.client import discovery
from gpuclaimctl.client.fence import NotLeader
from gpuclaimctl.client.errors import ApiError, Conflict
from gpuclaimctl.client.writer import Writer
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.keys import Kind, WorkKey
from gpuclaimctl.model.budgets import BudgetInfo
from gpuclaimctl.model.podclaims import has_gate
from gpuclaimctl.model.snapshot import Age, ClassInfo, age_of, claim_holds_gpus, parse_time, pod_priority
from gpuclaimctl.state import indexes
from gpuclaimctl.state.memories import Memories
from gpuclaimctl.state.turnstile import AgeTurnstile
from gpuclaimctl.state.view import ClusterView
from gpuclaimctl.sync.claims import AUDIT_PERIOD, audit_inflight, sync_claim
from gpuclaimctl.sync.classes import sync_class
from gpuclaimctl.sync.budgets import sync_budget
from gpuclaimctl.sync.context import AUDIT_INFLIGHT, Settings, SyncContext
from gpuclaimctl.sync.handlers import Handlers
from gpuclaimctl.sync.podsync import sync_pod
from informers import (
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    GPU_BUDGETS,
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_GROUPS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    EventHandlerFuncs,
    HandlerRegistration,
    PodGroupLister,
    Resource,
    SharedInformerFactory,
)
from metrics.controller import ControllerMetrics, StateSample
from workqueue import RateLimitingQueue, default_controller_rate_limiter

log = logging.getLogger("gpuclaimctl.controller")

Obj = dict[str, Any]
# Seconds between discovery checks for PodGroups while the API server does
# not serve them: a cluster that turns the API on is seen within this, and
# one GET per half minute costs it nothing.
PODGROUP_DISCOVERY_PERIOD = 30.0
# DRA is read where the API server serves these three; DeviceTaintRules too
# where it serves them (docs/dra.md §1: a tainted device is not offered).
DRA_RESOURCES = (RESOURCE_SLICES, DEVICE_CLASSES, RESOURCE_CLAIMS)
DRA_OPTIONAL = (DEVICE_TAINT_RULES,)
# As PODGROUP_DISCOVERY_PERIOD, for resource.k8s.io/v1.
DRA_DISCOVERY_PERIOD = 30.0


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


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
        podgroups_served: Callable[[], bool] | None = None,
        dra_served: Callable[[], Collection[Resource]] | None = None,
    ) -> None:
        """`podgroups_served` is the discovery check for PodGroups
        (client.discovery.serves); None reads none. `dra_served` says which
        of DRA_RESOURCES and DRA_OPTIONAL the API server serves
        (client.discovery.served, through the factory's client by default)."""
        pods = factory.pods()
        self._factory = factory
        self._podgroups_served = podgroups_served
        # Guards the informers started late (PodGroups', DRA's), each set once.
        self._late_lock = threading.Lock()
        # Set once, by watch_podgroups: PodGroups' lister and handler.
        self._podgroups: tuple[PodGroupLister, HandlerRegistration] | None = None
        self._dra_served = dra_served if dra_served is not None else functools.partial(
            discovery.served, factory.api_client, DRA_RESOURCES + DRA_OPTIONAL)
        # Set once, by watch_dra: the DRA informers' handlers.
        self._dra: list[HandlerRegistration] | None = None
        # Set once every DRA informer has listed and the view counts them.
        self._dra_counted = threading.Event()
        turnstile = AgeTurnstile()
        memories = Memories(reject_for=settings.reject_for)
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name="gpuclaimctl", metrics_provider=queue_metrics,
            order=lambda key: key_order(key, pods.get),
            tracker=TurnstileTracker(turnstile, pods.get, lambda uid: uid in memories.released))
        self.view = ClusterView(now)
        self.ctx = SyncContext(
            pods=pods, claims=factory.gpu_claims(), nodes=factory.nodes(),
            classes=factory.gpu_classes(), templates=factory.gpu_claim_templates(),
            pvcs=factory.persistent_volume_claims(), pvs=factory.persistent_volumes(),
            budgets=factory.gpu_budgets(),
            budgets_synced=lambda: factory.informer_for(GPU_BUDGETS).has_synced(),
            writer=writer, view=self.view, memories=memories,
            turnstile=turnstile, enqueue=self.queue.add, enqueue_after=self.queue.add_after,
            wake=lambda apply: handlers.woke_by(apply),
            settings=settings, metrics=metrics, now=now,
            podgroups=self._podgroup, podgroups_synced=self.podgroups_synced)
        self.shutdown_timeout = shutdown_timeout
        handlers = Handlers(self.ctx, self.queue)
        self._handlers = handlers
        # Inline: each handler runs on its informer's watch thread. They
        # only update the view and add keys (sync.handlers), and a thread
        # of their own cost a wake-up per watch event (informers.processor).
        self._registrations = [
            factory.informer_for(PODS, indexers=indexes.POD_INDEXERS).add_event_handler(
                EventHandlerFuncs(add=handlers.pod_added, update=handlers.pod_updated,
                                  delete=handlers.pod_deleted), name="gpuclaimctl-pods", inline=True),
            factory.informer_for(GPU_CLAIMS, indexers=indexes.CLAIM_INDEXERS).add_event_handler(
                EventHandlerFuncs(add=handlers.claim_added, update=handlers.claim_updated,
                                  delete=handlers.claim_deleted), name="gpuclaimctl-claims", inline=True),
            factory.informer_for(NODES).add_event_handler(
                EventHandlerFuncs(add=handlers.node_added, update=handlers.node_updated,
                                  delete=handlers.node_deleted), name="gpuclaimctl-nodes", inline=True),
            factory.informer_for(GPU_CLASSES).add_event_handler(
                EventHandlerFuncs(add=handlers.class_added, update=handlers.class_updated,
                                  delete=handlers.class_deleted), name="gpuclaimctl-classes", inline=True),
            factory.informer_for(GPU_CLAIM_TEMPLATES).add_event_handler(
                EventHandlerFuncs(add=handlers.template_changed,
                                  update=lambda _o, n: handlers.template_changed(n)),
                name="gpuclaimctl-templates", inline=True),
            factory.informer_for(GPU_BUDGETS).add_event_handler(
                EventHandlerFuncs(add=handlers.budget_changed,
                                  update=handlers.budget_updated,
                                  delete=handlers.budget_changed), name="gpuclaimctl-budgets", inline=True),
            factory.informer_for(PERSISTENT_VOLUME_CLAIMS).add_event_handler(
                EventHandlerFuncs(add=handlers.pvc_changed, update=lambda _o, n: handlers.pvc_changed(n),
                                  delete=handlers.pvc_changed), name="gpuclaimctl-pvcs", inline=True),
            factory.informer_for(PERSISTENT_VOLUMES).add_event_handler(
                EventHandlerFuncs(add=handlers.pv_changed, update=lambda _o, n: handlers.pv_changed(n),
                                  delete=handlers.pv_changed), name="gpuclaimctl-pvs", inline=True),
            # A quota that refused a claim's create and then has room again
            # retries the pods it refused at once (a new one only restricts).
            factory.informer_for(RESOURCE_QUOTAS).add_event_handler(
                EventHandlerFuncs(update=handlers.quota_updated, delete=handlers.quota_deleted),
                name="gpuclaimctl-quotas", inline=True),
        ]
        self._workers: list[threading.Thread] = []
        # Set by shutdown and abandon, before the queue is shut down: a
        # worker that gets a key afterwards hands it back unsynced. The
        # queue's shut_down alone would hand out (drain) every queued key.
        self._no_new_work = threading.Event()

    @property
    def metrics(self) -> ControllerMetrics | None:
        return self.ctx.metrics

    # -- readiness -------------------------------------------------------------

    def has_synced(self) -> bool:
        return all(r.has_synced() for r in self._registrations)

    # -- PodGroups, once served ---------------------------------------------------------------

    def podgroups_synced(self) -> bool:
        """PodGroups are read: served, and their informer listed them."""
        watching = self._podgroups
        return watching is not None and watching[1].has_synced()

    def _podgroup(self, namespace: str, name: str) -> Obj | None:
        watching = self._podgroups
        if watching is None or not watching[1].has_synced():
            return None  # gang_of says they are not read yet
        return watching[0].get(namespace, name)

    def watch_podgroups(self) -> None:
        """Read PodGroups from now on: their informer, with its handler
        (which wakes the pods naming one), started. Idempotent."""
        with self._late_lock:
            if self._podgroups is not None:
                return
            informer = self._factory.informer_for(POD_GROUPS)
            h = self._handlers
            registration = informer.add_event_handler(
                EventHandlerFuncs(add=h.podgroup_changed, update=h.podgroup_updated,
                                  delete=h.podgroup_changed), name="gpuclaimctl-podgroups", inline=True)
            self._podgroups = (PodGroupLister(informer.indexer), registration)
        informer.start()

    def discover_podgroups(self, stop: threading.Event, served: Callable[[], bool],
                           period: float = PODGROUP_DISCOVERY_PERIOD) -> bool:
        """Ask `served` now and every `period` seconds until PodGroups are
        served (then watch them; True) or `stop` is set (False). Never
        raises: a failed check is asked again."""
        told = False
        while not stop.is_set():
            try:
                found = served()
            except Exception as e:  # the API server is away: ask again later
                log.warning("could not ask whether PodGroups are served, will ask again: %s", e)
                found = False
            if stop.is_set():
                return False
            if found:
                log.info("the API server serves PodGroups (%s): reading them; a pod naming one with a "
                         "gang policy is placed with its gang", POD_GROUPS)
                self.watch_podgroups()
                return True
            if not told:
                log.info("the API server does not serve PodGroups (%s); gangs are declared by "
                         "annotations alone until it does (asking every %.0f s)", POD_GROUPS, period)
                told = True
            stop.wait(period)
        return False

    def start_podgroup_discovery(self, stop: threading.Event) -> threading.Thread | None:
        """The discovery of every informer started late, each on a daemon
        thread until found or `stop`: discover_dra, and discover_podgroups
        (whose thread is returned) when there is a check for them."""
        threading.Thread(target=self.discover_dra, args=(stop, self._dra_served),
                         name="dra-discovery", daemon=True).start()
        if self._podgroups_served is None:
            return None
        t = threading.Thread(target=self.discover_podgroups, args=(stop, self._podgroups_served),
                             name="podgroup-discovery", daemon=True)
        t.start()
        return t

    # -- GPUs served by DRA, once served ------------------------------------------------------

    def dra_synced(self) -> bool:
        """DRA is read: served, listed, and counted in the view."""
        return self._dra_counted.is_set()

    def watch_dra(self, resources: Collection[Resource], stop: threading.Event | None = None) -> None:
        """Read DRA's objects from now on: an informer for each of
        `resources` with its handler, started; once all have listed, the
        view counts them (Handlers.dra_synced), from a daemon thread that
        gives up with `stop`. Idempotent."""
        h = self._handlers
        funcs = {
            RESOURCE_SLICES: EventHandlerFuncs(add=h.slice_added, update=h.slice_updated, delete=h.slice_deleted),
            DEVICE_CLASSES: EventHandlerFuncs(add=h.device_class_added, update=h.device_class_updated,
                                              delete=h.device_class_deleted),
            RESOURCE_CLAIMS: EventHandlerFuncs(add=h.resource_claim_added, update=h.resource_claim_updated,
                                               delete=h.resource_claim_deleted),
            DEVICE_TAINT_RULES: EventHandlerFuncs(add=h.taint_rule_added, update=h.taint_rule_updated,
                                                  delete=h.taint_rule_deleted),
        }
        with self._late_lock:
            if self._dra is not None:
                return
            chosen = [(r, self._factory.informer_for(r)) for r in funcs if r in resources]
            self._dra = [informer.add_event_handler(funcs[r], name=f"gpuclaimctl-{r.plural}", inline=True)
                         for r, informer in chosen]
            registrations = list(self._dra)
        for _, informer in chosen:
            informer.start()
        threading.Thread(target=self._count_dra_once_listed, args=(registrations, stop or threading.Event()),
                         name="dra-sync", daemon=True).start()

    def _count_dra_once_listed(self, registrations: list[HandlerRegistration], stop: threading.Event) -> None:
        while not stop.is_set():
            if all(r.has_synced() for r in registrations):
                self._handlers.dra_synced()
                self._dra_counted.set()
                log.info("the DRA informers have listed: nodes serving a GPUClass's resource through DRA "
                         "offer the devices their ResourceSlices publish")
                return
            stop.wait(0.1)

    def discover_dra(self, stop: threading.Event, served: Callable[[], Collection[Resource]],
                     period: float = DRA_DISCOVERY_PERIOD) -> bool:
        """Ask `served` now and every `period` seconds until it names every
        one of DRA_RESOURCES (then watch them, and those of DRA_OPTIONAL it
        names; True) or `stop` is set (False). Never raises: a failed
        check is asked again."""
        told = False
        while not stop.is_set():
            try:
                found = set(served())
            except Exception as e:  # the API server is away: ask again later
                log.warning("could not ask whether resource.k8s.io/v1 is served, will ask again: %s", e)
                found = set()
            if stop.is_set():
                return False
            if set(DRA_RESOURCES) <= found:
                watched = [r for r in DRA_RESOURCES + DRA_OPTIONAL if r in found]
                log.info("the API server serves resource.k8s.io/v1: reading %s; nodes serving a GPUClass's "
                         "resource through DRA count the devices their ResourceSlices publish",
                         ", ".join(r.plural for r in watched))
                self.watch_dra(watched, stop)
                return True
            if not told:
                log.info("the API server does not serve resource.k8s.io/v1 (DRA); GPUs are counted from "
                         "nodes' allocatable alone until it does (asking every %.0f s)", period)
                told = True
            stop.wait(period)
        return False

    # -- worker loop (sample-controller) ------------------------------------------

    def run(self, workers: int, stop: threading.Event) -> bool:
        """Start `workers` threads; once `stop` is set, give in-flight syncs
        `shutdown_timeout`. True if every worker finished, False if one is
        still in a sync (perhaps in a write already on the wire)."""
        self.queue.add_after(AUDIT_INFLIGHT, AUDIT_PERIOD)  # and every AUDIT_PERIOD after
        for i in range(workers):
            t = threading.Thread(target=self._run_worker, name=f"worker-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        stop.wait()
        return self.shutdown(self.shutdown_timeout)

    def join_workers(self) -> None:
        """Wait, without limit, for every worker to finish."""
        for t in self._workers:
            t.join()

    def shutdown(self, timeout: float) -> bool:
        """No new work (SIGTERM): the syncs in progress finish; queued keys
        are dropped, not started, as `abandon` drops them (the queue's
        `shut_down` would hand every one out). Nothing is lost: a standby's
        informers have queued the same keys, a restarted process's first
        list queues them again. Waits up to `timeout` for the syncs in
        progress; True if they finished."""
        self._no_new_work.set()
        self.queue.shut_down()
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._workers)

    def abandon(self) -> None:
        """Leadership is lost: queued keys are dropped, not drained (DESIGN I3).
        Workers finish the sync they are in (its writes are refused by the
        write fence) and take no other key."""
        self._no_new_work.set()
        self.queue.shut_down()

    def _run_worker(self) -> None:
        while self._process_next_work_item():
            pass

    def _process_next_work_item(self) -> bool:
        key, shutdown = self.queue.get()
        if shutdown or key is None:
            return False
        if self._no_new_work.is_set():
            self.queue.done(key)
            return False
        kind = key.partition(":")[0]  # a metric label: a key no sync runs fails in dispatch
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
            if not self._no_new_work.is_set():
                self.queue.add_rate_limited(key)
        finally:
            self.queue.done(key)  # leaves the turnstile unless handed out again (TurnstileTracker)
            if self.metrics is not None:
                self.metrics.sync_seconds.labels(kind, result).observe(time.monotonic() - started)
        return True

    def sync(self, key: str) -> None:
        dispatch(self.ctx, key)

    # -- taking over -------------------------------------------------------------------------

    def catch_up(self, writes_landed_by: float | None = None) -> int:
        """Count as in flight every claim the API server has Bound that the
        cache does not show Bound there yet; return how many.

        A new leader starts with no placements in flight, and its caches may
        not yet show the last binds of the leader it replaces (the watch can
        lag behind the writes). Placing on those GPUs would overcommit. So,
        once synced and before the first decision, one consistent list of
        claims is compared with the cache; the entries end, as any other,
        when the informer shows the version listed (or a later one).

        `writes_landed_by` (monotonic seconds) is when no write of an
        earlier process could land any more (this one took the Lease, or
        waited them out). If the claims' cache was filled by a consistent
        read sent after that, it shows every such write already, and the
        list (at 50,000 claims, minutes of a busy API server) is skipped.
        """
        filled = self._factory.informer_for(GPU_CLAIMS).consistent_since
        if writes_landed_by is not None and filled is not None and filled > writes_landed_by:
            log.info("the claims' cache was read from the API server after every earlier "
                     "leader's write had landed; no catch-up list needed")
            return 0
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
            if claim_holds_gpus(c):
                bound[cls] = bound.get(cls, 0) + int((c.get("spec") or {}).get("count") or 0)
        allocatable: dict[str, int] = {}
        # As placement sees them: a DRA node's offers in its allocatable.
        nodes = list(self.ctx.view.cluster().nodes.values())
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
        """The pods that carry our gate, but for those this process has
        released already (the cache shows a version before the release: it
        lags by up to the watch batch window), and the claims they name
        that the cache has (for /metrics; cache objects, read-only)."""
        released = self.ctx.memories.released
        pods = [p for p in self.ctx.pods.by_index(indexes.WAITING_PODS, "")
                if p["metadata"].get("uid") not in released]
        claims = [c for p in pods for key in indexes.pods_by_claim(p)
                  if (c := self.ctx.claims.get(*keys.split(key))) is not None]
        return pods, claims


def key_order(key: str, get_pod: Callable[[str, str], Obj | None]) -> tuple[Any, ...]:
    """The order keys ready together are handed out in: claim and class
    keys first (they free GPUs and keep status; each is quick), then pods
    by priority, then oldest first (DESIGN §4, §4d: where pods compete, the
    higher priority, then the oldest goes first), so
    a freed GPU reaches the oldest waiting pod that fits before younger
    ones are looked at. A pod the cache no longer has goes first: its sync
    does nothing. Pods created in the same second go by namespace, then
    name: the turnstile's order (state.turnstile.Age). The key string
    would not do: "pod:a-b/x" sorts before "pod:a/y", and a pod handed out
    ahead of one the turnstile counts older gives its turn up to it."""
    pod_key = WorkKey.of_pod(key)
    if pod_key is None:
        return ("",)
    ns, name = keys.split(pod_key)
    pod = get_pod(ns, name)
    if pod is None:
        return (" ",)
    return (" ", -pod_priority(pod), pod["metadata"].get("creationTimestamp") or "", ns, name)


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

    def __init__(self, turnstile: AgeTurnstile, get_pod: Callable[[str, str], Obj | None],
                 released: Callable[[str], bool] = lambda uid: False) -> None:
        self._turnstile = turnstile
        self._get_pod = get_pod
        self._released = released

    def queued(self, key: str) -> None:
        """A gated pod ready in the queue: a younger pod about to take GPUs
        gives its turn up to it (AgeTurnstile.overtaken)."""
        pod_key = WorkKey.of_pod(key)
        if pod_key is not None and (age := self._age(pod_key)) is not None:
            self._turnstile.queue(pod_key, age)

    def handed_out(self, key: str) -> None:
        self._enter(key)

    def added_while_processing(self, key: str) -> None:
        self._enter(key)

    def finished(self, key: str, again: bool) -> None:
        pod_key = WorkKey.of_pod(key)
        if pod_key is None:
            return
        if again:
            # Ready again: inside (its sync may have left after deciding)
            # and queued, so a younger pod whose wait for it ran out still
            # gives its turn up to it while it waits for a worker.
            age = self._enter(key)
            if age is not None:
                self._turnstile.queue(pod_key, age)
        else:
            self._turnstile.leave(pod_key)

    def _enter(self, key: str) -> Age | None:
        pod_key = WorkKey.of_pod(key)
        if pod_key is None:
            return None
        age = self._age(pod_key)
        if age is not None:
            self._turnstile.enter(pod_key, age)  # the key pod sync uses
        else:
            self._turnstile.leave(pod_key)
        return age

    def _age(self, pod_key: str) -> Age | None:
        """The pod's age if it may compete for GPUs: None for a pod gone,
        being deleted, not gated, or released by this process (its own
        events bring it back while the cache still shows the gate; its
        sync takes nothing), so no one waits or gives a turn up for it."""
        ns, name = keys.split(pod_key)
        pod = self._get_pod(ns, name)
        if pod is None or not has_gate(pod):
            return None
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or self._released(meta.get("uid", "")):
            return None
        created = parse_time(meta.get("creationTimestamp"))
        return None if created is None else age_of(pod_priority(pod), created, ns, name)


def dispatch(ctx: SyncContext, key: str) -> None:
    """Run the sync a queue key names."""
    try:
        work = WorkKey.parse(key)
    except ValueError:
        log.error("dropping unknown key %r", key)
        return
    if work.kind is Kind.AUDIT:
        if key == AUDIT_INFLIGHT:
            audit_inflight(ctx)
        else:
            log.error("dropping unknown key %r", key)
        return
    _SYNCS[work.kind](ctx, work.key)


_SYNCS: dict[Kind, Callable[[SyncContext, str], None]] = {
    Kind.POD: sync_pod, Kind.CLAIM: sync_claim, Kind.CLASS: sync_class, Kind.BUDGET: sync_budget}


def _is_expected(e: Exception) -> bool:
    """API answers and connection errors: worth a line, not a traceback."""
    return isinstance(e, (ApiError, OSError))


__all__ = ["Controller", "Handlers", "Settings"]
