"""The GPU claim controller: informers in, keys through one queue, syncs out.

Built the way kube-controller-manager's controllers are: shared informers
fill indexed caches; event handlers only turn events into `pod:` and
`claim:` keys (and keep the usage map and the cluster snapshot current);
workers run `sync_pod` (podsync.py) and `sync_claim` (claimsync.py). A third
kind, `class:`, keeps each GPUClass's status figures (classsync.py); it is
added at most once a second per class, so placements do not become status
writes one for one.

The one rule that matters most, never overcommit a node, rests on
`placement_lock`: a decision reads usage (bound claims, pods without claims,
in-flight placements), decides, and records its new placements as in flight
without any other decision in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from cachetools import LRUCache, TTLCache
from kubernetes import client

from gpuclaimctl.model import api
from gpuclaimctl.state import indexes
from gpuclaimctl.sync.claims import sync_claim
from gpuclaimctl.sync.classes import sync_class
from gpuclaimctl.state.inflight import InFlightPlacements
from gpuclaimctl.decide.capacity import claim_usage
from gpuclaimctl.client.kube import ApiError
from gpuclaimctl.state.lockedcache import LockedCache
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.sync.pods import sync_pod
from gpuclaimctl.model.snapshot import ClassInfo, Cluster, NodeInfo, Rejection, parse_time
from gpuclaimctl.state.turnstile import AgeTurnstile
from gpuclaimctl.state.usage import UsageTracker
from gpuclaimctl.client.writer import AlreadyExists, Conflict, NotFound, Writer
from informers import (
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    NODES,
    PODS,
    DeletedFinalStateUnknown,
    EventHandlerFuncs,
    SharedInformerFactory,
)
from metrics.controller import ControllerMetrics, StateSample
from workqueue import RateLimitingQueue, default_controller_rate_limiter

log = logging.getLogger("gpuclaimctl.controller")

Obj = dict[str, Any]
POD_PREFIX = "pod:"
CLAIM_PREFIX = "claim:"
CLASS_PREFIX = "class:"
# A class's status follows claims and nodes; writing it at most this often
# keeps a burst of placements from becoming a burst of status writes.
CLASS_STATUS_DELAY = 1.0
# Deleted pod uids remembered so a stale reservation needs no API call;
# bounded so a long-running controller's memory stays flat.
DELETED_PODS_REMEMBERED = 50_000


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _node_health_fields(node: Obj | None) -> tuple[Any, ...]:
    """What ends a rejection early: allocatable, taints, readiness."""
    if node is None:
        return ()
    status = node.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or ()
                  if c.get("type") == "Ready"), None)
    return (status.get("allocatable"), (node.get("spec") or {}).get("taints"), ready)


def _placement_fields(node: Obj) -> tuple[Any, ...]:
    """What a placement reads of a node (a heartbeat changes none of it)."""
    return (_node_health_fields(node), (node.get("metadata") or {}).get("labels"),
            (node.get("spec") or {}).get("unschedulable"))


class Controller:
    def __init__(
        self,
        api_client: client.ApiClient,
        factory: SharedInformerFactory,
        options: Options,
        metrics: ControllerMetrics | None = None,
        *,
        queue_metrics: Any = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.options = options
        self.writer = Writer(api_client)
        self.metrics = metrics
        self.now = now
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name="gpuclaimctl", metrics_provider=queue_metrics)
        self.inflight = InFlightPlacements(ttl=options.inflight_ttl)
        # One lock for deciding: the usage map, the cluster snapshot and the
        # in-flight table change together or not at all.
        self.placement_lock = self.inflight.lock
        self.usage = UsageTracker()
        self.turnstile = AgeTurnstile()
        self._cluster: Cluster | None = None
        self._dirty_nodes: set[str] = set()
        self._classes_dirty = True
        self.deleted_pods: LockedCache[str, bool] = LockedCache(LRUCache(DELETED_PODS_REMEMBERED))
        # When a node went NotReady or vanished (for Lost), and when its
        # allocatable, taints or readiness last changed (ends rejections).
        self.node_unhealthy_since: dict[str, datetime] = {}
        self.node_changed_at: dict[str, datetime] = {}
        # Rejections of template and inline sets: their claims die with the
        # refused pod, so the rejection lives with the set's identity (the
        # pod's owner and the entries) here, for --reject-for at most.
        self.set_rejections: LockedCache[tuple[str, str], tuple[Rejection, ...]] = LockedCache(
            TTLCache(maxsize=10_000, ttl=max(options.reject_for, 1.0)))
        # The last waiting reason told to each pod, so it gets one event per change.
        self.told: LockedCache[str, str] = LockedCache(LRUCache(100_000))

        self.pod_informer = factory.informer_for(PODS, indexers=indexes.POD_INDEXERS)
        self.claim_informer = factory.informer_for(GPU_CLAIMS, indexers=indexes.CLAIM_INDEXERS)
        self.node_informer = factory.informer_for(NODES)
        self.class_informer = factory.informer_for(GPU_CLASSES)
        self.template_informer = factory.informer_for(GPU_CLAIM_TEMPLATES)
        self.pods = factory.pods()
        self.claims = factory.gpu_claims()
        self.nodes = factory.nodes()
        self.classes = factory.gpu_classes()
        self.templates = factory.gpu_claim_templates()
        self._registrations = [
            self.pod_informer.add_event_handler(EventHandlerFuncs(
                add=self._pod_added, update=self._pod_updated, delete=self._pod_deleted),
                name="gpuclaimctl-pods"),
            self.claim_informer.add_event_handler(EventHandlerFuncs(
                add=self._claim_added, update=self._claim_updated, delete=self._claim_deleted),
                name="gpuclaimctl-claims"),
            self.node_informer.add_event_handler(EventHandlerFuncs(
                add=self._node_added, update=self._node_updated, delete=self._node_deleted),
                name="gpuclaimctl-nodes"),
            self.class_informer.add_event_handler(EventHandlerFuncs(
                add=self._class_added, update=self._class_updated,
                delete=self._class_changed), name="gpuclaimctl-classes"),
            self.template_informer.add_event_handler(EventHandlerFuncs(
                add=self._template_changed, update=lambda _o, n: self._template_changed(n)),
                name="gpuclaimctl-templates"),
        ]
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    # -- readiness -------------------------------------------------------------

    def has_synced(self) -> bool:
        return all(r.has_synced() for r in self._registrations)

    # -- worker loop (sample-controller) ------------------------------------------

    def run(self, workers: int, stop: threading.Event) -> None:
        """Start `workers` threads; return once `stop` is set and they finished."""
        self._stop = stop
        for i in range(workers):
            t = threading.Thread(target=self._run_worker, name=f"worker-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        stop.wait()
        self.shutdown(self.options.shutdown_timeout)

    def shutdown(self, timeout: float) -> bool:
        """No new work; wait up to `timeout` for in-flight syncs. True if they finished."""
        self.queue.shut_down()
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._workers)

    def _run_worker(self) -> None:
        while self._process_next_work_item():
            pass

    def _process_next_work_item(self) -> bool:
        got = self.queue.get()
        if got[1]:
            return False
        key = got[0]
        assert key is not None
        kind = key.split(":", 1)[0]
        started = time.monotonic()
        result = "ok"
        try:
            self.sync(key)
            self.queue.forget(key)
        except Exception as e:  # a retry may fix it: back off and try again
            result = "error"
            level = logging.INFO if _is_conflict(e) else logging.WARNING
            log.log(level, "sync %s failed, will retry: %s", key, e,
                    exc_info=level == logging.WARNING and not _is_expected(e))
            self.queue.add_rate_limited(key)
        finally:
            self.queue.done(key)
            if self.metrics is not None:
                self.metrics.sync_seconds.labels(kind, result).observe(time.monotonic() - started)
        return True

    def sync(self, key: str) -> None:
        if key.startswith(POD_PREFIX):
            sync_pod(self, key[len(POD_PREFIX):])
        elif key.startswith(CLAIM_PREFIX):
            sync_claim(self, key[len(CLAIM_PREFIX):])
        elif key.startswith(CLASS_PREFIX):
            sync_class(self, key[len(CLASS_PREFIX):])
        else:
            log.error("dropping unknown key %r", key)

    # -- keys --------------------------------------------------------------------------

    def enqueue_pod(self, key: str) -> None:
        self.queue.add(POD_PREFIX + key)

    def enqueue_claim(self, key: str) -> None:
        self.queue.add(CLAIM_PREFIX + key)

    def enqueue_class(self, name: str) -> None:
        if name:
            self.queue.add_after(CLASS_PREFIX + name, CLASS_STATUS_DELAY)

    def enqueue_classes(self) -> None:
        for c in self.classes.list():
            self.enqueue_class(c["metadata"]["name"])

    def enqueue_waiting_pods(self, namespace: str | None = None) -> None:
        """Every gated pod, oldest first, so where pods compete the oldest wins."""
        pods = self.pods.by_index(indexes.WAITING_PODS, "")
        if namespace is not None:
            pods = [p for p in pods if p["metadata"].get("namespace") == namespace]
        pods = sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                           p["metadata"].get("namespace", ""),
                                           p["metadata"]["name"]))
        for p in pods:
            self.enqueue_pod(_key(p))

    # -- pods ------------------------------------------------------------------------------

    def _pod_added(self, pod: Obj) -> None:
        with self.placement_lock:
            self.usage.set_pod(pod)
        if _ours(pod):
            self.enqueue_pod(_key(pod))

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            # A resync: retry only what still waits.
            if indexes.has_gate(new):
                self.enqueue_pod(_key(new))
            return
        with self.placement_lock:
            self.usage.set_pod(new)
        if _ours(new):
            self.enqueue_pod(_key(new))
        old_phase, new_phase = (old.get("status") or {}).get("phase"), (new.get("status") or {}).get("phase")
        if old_phase != new_phase and new_phase in ("Succeeded", "Failed"):
            self._enqueue_claims_of_pod(new)
            if _uses_gpus_without_claims(new):
                self.enqueue_waiting_pods()
        elif new["metadata"].get("deletionTimestamp") and not old["metadata"].get("deletionTimestamp"):
            self._enqueue_claims_of_pod(new)
        elif indexes.has_gate(old) and not indexes.has_gate(new):
            # Released (by us: its claims are bound) or ungated by someone
            # else: either way no claim it names waits for it any more.
            self._enqueue_claims_of_pod(new)

    def _pod_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pod = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if pod is None:
            return
        uid = pod["metadata"].get("uid", "")
        self.deleted_pods[uid] = True
        with self.placement_lock:
            self.usage.delete_pod(uid)
        self.told.pop(_key(pod), None)
        self._enqueue_claims_of_pod(pod)
        if _uses_gpus_without_claims(pod):
            self.enqueue_waiting_pods()

    def _enqueue_claims_of_pod(self, pod: Obj) -> None:
        """The claims the pod uses, owns or names (whose Waiting may end)."""
        key = _key(pod)
        seen: set[str] = set(indexes.pods_by_claim(pod))
        for index in (indexes.CLAIMS_BY_RESERVED_POD, indexes.CLAIMS_BY_OWNER_POD):
            for c in self.claims.by_index(index, key):
                seen.add(_key(c))
        for k in seen:
            self.enqueue_claim(k)

    # -- claims ---------------------------------------------------------------------------

    def _claim_added(self, claim: Obj) -> None:
        self._claim_seen(claim)
        self.enqueue_claim(_key(claim))
        self._enqueue_pods_of_claim(claim)
        if _holds_gpus(claim):
            self.enqueue_class(_class_of(claim))

    def _claim_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            self.enqueue_claim(_key(new))  # a resync: cleanup may be due
            return
        self._claim_seen(new)
        self.enqueue_claim(_key(new))
        self._enqueue_pods_of_claim(new)
        if _holds_gpus(old) and not _holds_gpus(new):
            self.enqueue_waiting_pods()
        if _holds_gpus(old) != _holds_gpus(new):
            self.enqueue_class(_class_of(new))

    def _claim_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        claim = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if claim is None:
            return
        uid = claim["metadata"].get("uid", "")
        with self.placement_lock:
            self.usage.delete_claim(uid)
            self.inflight.forget(uid)
        self._enqueue_pods_of_claim(claim)
        if _holds_gpus(claim):
            self.enqueue_waiting_pods()
            self.enqueue_class(_class_of(claim))

    def _claim_seen(self, claim: Obj) -> None:
        # Usage first, then in-flight: the claim's GPUs are never uncounted.
        with self.placement_lock:
            self.usage.set_claim(claim)
            self.inflight.observe_claim(claim)

    def _enqueue_pods_of_claim(self, claim: Obj) -> None:
        for p in self.pods.by_index(indexes.PODS_BY_CLAIM, _key(claim)):
            self.enqueue_pod(_key(p))

    # -- nodes and classes ----------------------------------------------------------------

    def _node_added(self, node: Obj) -> None:
        self._node_changed(None, node)

    def _node_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            return
        self._node_changed(old, new)

    def _node_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        node = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        name = node["metadata"]["name"] if node else obj.key  # type: ignore[union-attr]
        self.node_unhealthy_since.setdefault(name, self.now())
        with self.placement_lock:
            self._dirty_nodes.add(name)
        for c in self.claims.by_index(indexes.CLAIMS_BY_NODE, name):
            self.enqueue_claim(_key(c))
        self.enqueue_classes()

    def _node_changed(self, old: Obj | None, new: Obj) -> None:
        name = new["metadata"]["name"]
        if old is None and name in self.node_unhealthy_since:
            # Re-created under the same name: as good as changed.
            self.node_changed_at[name] = self.now()
        ready = indexes.node_ready(new)
        if ready:
            self.node_unhealthy_since.pop(name, None)
        else:
            self.node_unhealthy_since.setdefault(name, _not_ready_since(new) or self.now())
        if old is not None and _placement_fields(old) == _placement_fields(new):
            return
        with self.placement_lock:
            self._dirty_nodes.add(name)
        if old is not None and _node_health_fields(old) != _node_health_fields(new):
            self.node_changed_at[name] = self.now()
            for c in self.claims.by_index(indexes.CLAIMS_BY_REJECTED_NODE, name):
                self.enqueue_claim(_key(c))
        for c in self.claims.by_index(indexes.CLAIMS_BY_NODE, name):
            self.enqueue_claim(_key(c))
        self.enqueue_waiting_pods()
        self.enqueue_classes()

    def _class_added(self, cls: Obj) -> None:
        self._class_changed(cls)
        self.enqueue_class(cls["metadata"]["name"])

    def _class_updated(self, old: Obj, new: Obj) -> None:
        self.enqueue_class(new["metadata"]["name"])
        if _class_fields(old) == _class_fields(new):
            return  # its status (ours) or a resync: nothing placement reads
        self._class_changed(new)

    def _class_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        with self.placement_lock:
            self._classes_dirty = True
        self.enqueue_waiting_pods()

    def _template_changed(self, template: Obj) -> None:
        self.enqueue_waiting_pods(template["metadata"].get("namespace"))

    # -- taking over -------------------------------------------------------------------------

    def catch_up(self) -> int:
        """Count as in flight every claim the API server has Bound that the
        cache does not show Bound there yet; return how many.

        A new leader starts with an empty in-flight table, and its caches may
        not yet show the last binds of the leader it replaces (the watch can
        lag behind the writes). Placing on those GPUs would overcommit. So,
        once synced and before the first decision, one consistent list of
        claims is compared with the cache; the entries end, as any other,
        when the informer shows the claim Bound there (or at the TTL).
        """
        listed = self.writer.list_claims()
        added = 0
        with self.placement_lock:
            self.cluster()  # brings the usage map's class -> resource up to date
            resource_of_class = self.usage.resource_of_class()
            for claim in listed:
                held = claim_usage(claim, resource_of_class)
                if held is None or (claim.get("status") or {}).get("phase") != api.Phase.BOUND:
                    continue
                meta = claim["metadata"]
                cached = self.claims.get(meta.get("namespace", ""), meta.get("name", ""))
                if cached is not None and claim_usage(cached, resource_of_class) == held:
                    continue
                node, resource, count = held
                self.inflight.add(meta.get("uid", ""), node, resource, count)
                added += 1
        if added:
            log.info("took over with %d bound claims the cache did not show yet; counted as in flight",
                     added)
        return added

    # -- the snapshot a decision reads (call with placement_lock held) ----------------------

    def cluster(self) -> Cluster:
        if self._cluster is None or self._classes_dirty:
            classes = [ClassInfo.from_api(c) for c in self.classes.list()]
            resource_of_class = {c.name: c.resource_name for c in classes}
            if resource_of_class != self.usage.resource_of_class():
                self.usage.rebuild(self.claims.list(), self.pods.list(), resource_of_class)
            self._cluster = Cluster([NodeInfo.from_api(n) for n in self.nodes.list()], classes)
            self._dirty_nodes.clear()
            self._classes_dirty = False
        elif self._dirty_nodes:
            cluster = self._cluster
            for name in self._dirty_nodes:
                node = self.nodes.get(name)
                cluster = (cluster.with_node(NodeInfo.from_api(node)) if node is not None
                           else cluster.without_node(name))
            self._cluster = cluster
            self._dirty_nodes.clear()
        return self._cluster

    def state_sample(self) -> StateSample:
        """Claims by class and phase, GPUs allocatable and bound per class (for /metrics)."""
        claims: dict[tuple[str, str], int] = {}
        bound: dict[str, int] = {}
        for c in self.claims.list():
            cls = (c.get("spec") or {}).get("className", "")
            phase = (c.get("status") or {}).get("phase") or api.Phase.PENDING
            claims[(cls, phase)] = claims.get((cls, phase), 0) + 1
            if phase == api.Phase.BOUND:
                bound[cls] = bound.get(cls, 0) + int((c.get("spec") or {}).get("count") or 0)
        allocatable: dict[str, int] = {}
        nodes = [NodeInfo.from_api(n) for n in self.nodes.list()]
        for obj in self.classes.list():
            cls = ClassInfo.from_api(obj)
            allocatable[cls.name] = cls.allocatable(nodes)[1]
            bound.setdefault(cls.name, 0)
        return StateSample(claims=claims, allocatable=allocatable, bound=bound)


# -- small helpers ----------------------------------------------------------------------------


def _class_of(claim: Obj) -> str:
    return str((claim.get("spec") or {}).get("className") or "")


def _class_fields(cls: Obj) -> tuple[Any, ...]:
    """What placement reads of a class (ClassInfo.from_api)."""
    return (cls.get("spec"), cls["metadata"].get("deletionTimestamp"))


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def _ours(pod: Obj) -> bool:
    """A pod the pod sync cares about: gated by us, or released by us."""
    meta = pod["metadata"]
    return indexes.has_gate(pod) or api.PLACED_NODE_ANNOTATION in (meta.get("annotations") or {})


def _holds_gpus(claim: Obj) -> bool:
    status = claim.get("status") or {}
    return status.get("phase") == api.Phase.BOUND and bool(status.get("nodeName"))


def _uses_gpus_without_claims(pod: Obj) -> bool:
    if api.CLAIMS_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        return False
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = c.get("resources") or {}
        for key in list((res.get("requests") or {})) + list((res.get("limits") or {})):
            if "/" in key and not key.startswith("kubernetes.io/"):
                return True
    return False


def _not_ready_since(node: Obj) -> datetime | None:
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready" and c.get("status") != "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def _is_conflict(e: Exception) -> bool:
    return isinstance(e, Conflict)


def _is_expected(e: Exception) -> bool:
    """API answers and connection errors: worth a line, not a traceback."""
    return isinstance(e, (ApiError, Conflict, NotFound, AlreadyExists, OSError))

