"""Informer event handlers (DESIGN.md §5): each applies the change to the
cluster view, then turns it into the `pod:`, `claim:`, `class:` and
`budget:` keys it affects, found through the caches' indexes. DRA's
objects (ResourceSlices, DeviceClasses, DeviceTaintRules, ResourceClaims:
docs/dra.md) wake the pods that may fit where they freed GPUs or changed
what a node offers. Nothing else:
no read of the API server, no write; the syncs do the work.

`class:` and `budget:` keys are added at most once a second each, so
placements do not become status writes one for one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpuclaimctl.decide.capacity import fits
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.gangs import podgroup_gang_key
from gpuclaimctl.model.snapshot import claim_holds_gpus
from gpuclaimctl.model.nodes import node_ready, not_ready_since, ready_condition
from gpuclaimctl.model.podclaims import has_gate, names_claims_ungated, template_owner_uid
from gpuclaimctl.model.resources import parse_quantity
from gpuclaimctl.state import indexes
from gpuclaimctl.state.inflight import parse_rv
from gpuclaimctl.state.memories import NOT_GATED_TOLD, refused_create_told, told_key
from gpuclaimctl.state.view import Change
from gpuclaimctl.sync.context import BUDGET, CLAIM, CLASS, POD, SyncContext
from informers import DeletedFinalStateUnknown
from workqueue import RateLimitingQueue

log = logging.getLogger("gpuclaimctl.sync.handlers")

Obj = dict[str, Any]
# A class's status follows claims and nodes; writing it at most this often
# keeps a burst of placements from becoming a burst of status writes.
CLASS_STATUS_DELAY = 1.0
# A claim's own sync, after its informer saw the claim change, waits this
# long: one placement changes a claim twice, a round trip apart (its create,
# then its bind), and one sync after both does the work of two (claim syncs
# per placed pod: 1.85 before, 1.00 after, `make bench-controller`). Nothing
# that frees GPUs waits on it: a pod that finished or went syncs its claims
# at once (its own events), as does a node that went, and a claim being
# deleted is synced at once (its finalizer). What may wait a second: a
# reservation for a pod already gone when it was written, a claim the cache
# just learnt of. (A rejection's expiry is a sync of its own, requeued for
# the moment it ends.)
CLAIM_SETTLE_DELAY = 1.0


def node_health(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What ends a rejection early: allocatable, taints, readiness."""
    if node is None:
        return ()
    ready = (ready_condition(node) or {}).get("status")
    return ((node.get("status") or {}).get("allocatable"), (node.get("spec") or {}).get("taints"), ready)


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

    def enqueue_budgets(self, namespace: str | None) -> None:
        """The namespace's GPUBudgets' status follows its claims (at most
        once a second); every namespace's with None (a class made or gone:
        their ClassesFound condition)."""
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
                if need is not None and not any(fits(need, f) for f in free):
                    continue
            woken.append(POD + key)
        # All at once: a worker idle in get() must not take the first one
        # added (the index's order) before the oldest is in (DESIGN §4).
        self.queue.add_all(woken)

    def woke_by(self, apply: Callable[[], Change]) -> None:
        """Apply a change to the view and enqueue the pods it may let fit,
        under the view's lock: a decision sees neither or both, so a pod
        past its turn that sees GPUs freed also sees the older pods they
        woke, and gives them its turn (state.turnstile)."""
        with self.view.lock:
            self.woke(apply())

    def woke(self, change: Change) -> None:
        if change.freed_anywhere:
            self.enqueue_waiting_pods()
        elif change.freed_on:
            self.enqueue_waiting_pods(changed_nodes=change.freed_on)

    # -- pods ------------------------------------------------------------------------------

    def pod_added(self, pod: Obj) -> None:
        self.woke_by(lambda: self.view.apply_pod(None, pod))
        if self._sync_would_act(pod):
            self.queue.add(POD + keys.key_of(pod))
        self._enqueue_gang_mates(pod)
        if (pod.get("status") or {}).get("phase") in api.FINISHED_PHASES \
                or pod["metadata"].get("deletionTimestamp"):
            # First seen finished or going (a new leader's cache, a relist):
            # a claim sync that read it live while it still ran kept its
            # reservation, and no update of it will come to say it ended.
            self._enqueue_claims_of_pod(pod)

    def pod_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            # A resync: retry only what still waits.
            if has_gate(new):
                self.queue.add(POD + keys.key_of(new))
            return
        self.woke_by(lambda: self.view.apply_pod(old, new))
        if old["metadata"].get("uid") != new["metadata"].get("uid"):
            # Deleted and recreated under the name while the watch was away.
            self.ctx.memories.deleted_pods[old["metadata"].get("uid", "")] = True
            self._enqueue_claims_of_pod(old)
        if self._sync_would_act(new):
            self.queue.add(POD + keys.key_of(new))
        if _gang_fields(old) != _gang_fields(new):
            self._enqueue_gang_mates(old)
            self._enqueue_gang_mates(new)
        old_phase, new_phase = (old.get("status") or {}).get("phase"), (new.get("status") or {}).get("phase")
        if old_phase != new_phase and new_phase in api.FINISHED_PHASES:
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
        self.woke_by(lambda: self.view.delete_pod(pod))
        self.ctx.memories.last_warning.pop(told_key(pod), None)
        self.ctx.memories.waiting_told.pop(told_key(pod), None)
        self.ctx.memories.capacity_needs.pop(keys.key_of(pod), None)
        self._enqueue_claims_of_pod(pod)
        self._enqueue_gang_mates(pod)

    def _enqueue_gang_mates(self, pod: Obj) -> None:
        """A member came, went or changed its gang annotations: the gang's
        gated members decide (or say why they wait) again."""
        for value in indexes.pods_by_gang(pod):
            self.queue.add_all([POD + keys.key_of(m) for m in self.ctx.pods.by_index(indexes.PODS_BY_GANG, value)
                                if has_gate(m) and keys.key_of(m) != keys.key_of(pod)])

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
        made = self.ctx.memories.made_claims.pop(keys.key_of(claim))
        self.woke_by(lambda: self.view.apply_claim(None, claim))
        self._sync_claim_soon(claim)
        # The create of a template claim this process made is no news to the
        # pod whose sync made it while that sync still places it (it holds
        # the answer): it came back then, and synced the pod again for
        # nothing (0.6 syncs per pod in make bench-controller). After that
        # sync, or for any other pod naming the claim, it is news as before.
        owner = template_owner_uid(claim)
        own = made is not None and made["metadata"].get("uid") == claim["metadata"].get("uid") \
            and owner in self.ctx.memories.placing
        self._enqueue_pods_of_claim(claim, but=owner if own else "")
        if claim_holds_gpus(claim):
            self.enqueue_class(_class_of(claim))
            self.enqueue_budgets(claim["metadata"].get("namespace", ""))

    def claim_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
            self._sync_claim_soon(new)  # a resync: cleanup may be due
            return
        moved = _placement_fields(old) != _placement_fields(new)
        # Read before the change is applied, which may end the entry.
        placed = self.view.in_flight(new["metadata"].get("uid", "")) if moved else None
        self.woke_by(lambda: self.view.apply_claim(old, new))
        self._sync_claim_soon(new)
        if moved:
            # Not for a Waiting condition alone: two pods waiting on one
            # shared claim would wake each other with every message written.
            # Nor, as for a create, for the pod whose sync bound it while
            # that sync still places it, when this is the version that bind
            # was answered with (a later sync that found the bind not seen
            # back yet waits for this very event: sync.pods, `unsettled`).
            own = placed is not None and placed.pod.uid in self.ctx.memories.placing \
                and placed.answered_with(parse_rv(new["metadata"].get("resourceVersion")))
            self._enqueue_pods_of_claim(new, but=placed.pod.uid if own and placed else "")
        if claim_holds_gpus(old) != claim_holds_gpus(new) or _class_of(old) != _class_of(new):
            self.enqueue_class(_class_of(old))
            self.enqueue_class(_class_of(new))
            self.enqueue_budgets(new["metadata"].get("namespace", ""))

    def claim_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        claim = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if claim is None:
            return
        self.ctx.memories.made_claims.pop(keys.key_of(claim))
        self.woke_by(lambda: self.view.delete_claim(claim))
        self._enqueue_pods_of_claim(claim)
        if claim_holds_gpus(claim):
            self.enqueue_class(_class_of(claim))
            self.enqueue_budgets(claim["metadata"].get("namespace", ""))

    def _sync_claim_soon(self, claim: Obj) -> None:
        """The claim's own sync, for a change its informer saw (CLAIM_SETTLE_DELAY)."""
        key = CLAIM + keys.key_of(claim)
        if claim["metadata"].get("deletionTimestamp"):
            self.queue.add(key)  # someone waits for the delete to finish
        else:
            self.queue.add_after(key, CLAIM_SETTLE_DELAY)

    def _enqueue_pods_of_claim(self, claim: Obj, but: str = "") -> None:
        """The pods naming the claim that the pod sync would act on, except
        the one of uid `but` (whose own write this change is). The
        others (released by us, bound, deleted: most of them, as a claim's
        create and bind come back after its pod's release) would be synced
        for nothing; any change that makes one due comes as its own pod
        event (pod_updated), read from the cache the sync reads."""
        for p in self.ctx.pods.by_index(indexes.PODS_BY_CLAIM, keys.key_of(claim)):
            if but and p["metadata"].get("uid") == but:
                continue
            if self._sync_would_act(p):
                self.queue.add(POD + keys.key_of(p))

    def _sync_would_act(self, pod: Obj) -> bool:
        """_pod_sync_due, and not a pod this process released that the cache
        still shows gated (sync_pod returns at once for one), nor one being
        deleted; or a pod naming claims without our gate not yet told so."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        if _pod_sync_due(pod):
            return not (meta.get("uid") in self.ctx.memories.released and has_gate(pod))
        return names_claims_ungated(pod) and \
            self.ctx.memories.last_warning.get(told_key(pod)) != NOT_GATED_TOLD

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
        with self.view.lock:  # the change and the pods it wakes as one (woke_by)
            changed = self.view.apply_node(
                new, ready=node_ready(new), not_ready_since=not_ready_since(new),
                health_changed=health_changed, recreated=old is None)
            if changed:
                # Only this node changed: a pod short of room elsewhere can
                # only fit here now.
                self.enqueue_waiting_pods(changed_nodes=(name,))
        if health_changed:
            for c in self.ctx.claims.by_index(indexes.CLAIMS_BY_REJECTED_NODE, name):
                self.queue.add(CLAIM + keys.key_of(c))
        if not changed:
            return
        for c in self.ctx.claims.by_index(indexes.CLAIMS_BY_NODE, name):
            self.queue.add(CLAIM + keys.key_of(c))
        self.enqueue_classes()

    def class_added(self, cls: Obj) -> None:
        self.enqueue_class(cls["metadata"]["name"])
        self.enqueue_budgets(None)
        with self.view.lock:  # as woke_by
            self.view.apply_class(cls)
            self.enqueue_waiting_pods()

    def class_updated(self, old: Obj, new: Obj) -> None:
        self.enqueue_class(new["metadata"]["name"])
        if (old.get("spec"), old["metadata"].get("deletionTimestamp")) == \
                (new.get("spec"), new["metadata"].get("deletionTimestamp")):
            return  # its status (ours) or a resync: nothing placement reads
        with self.view.lock:  # as woke_by
            self.view.apply_class(new)
            self.enqueue_waiting_pods()

    def class_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        cls = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        name = cls["metadata"]["name"] if cls else keys.split(obj.key)[1]  # type: ignore[union-attr]
        with self.view.lock:  # as woke_by
            self.view.delete_class(name)
            self.enqueue_waiting_pods()
        self.enqueue_budgets(None)

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

    # -- GPUs served by DRA (docs/dra.md) -----------------------------------------------------

    def dra_synced(self) -> None:
        """The DRA informers have all listed: DRA nodes offer their devices."""
        self._dra_changed(self.view.dra_synced)

    def slice_added(self, obj: Obj) -> None:
        self._dra_changed(lambda: self.view.apply_resource_slice(obj))

    def slice_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion"):
            self._dra_changed(lambda: self.view.apply_resource_slice(new))

    def slice_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        name = _cluster_name(obj)
        self._dra_changed(lambda: self.view.delete_resource_slice(name))

    def device_class_added(self, obj: Obj) -> None:
        self._dra_changed(lambda: self.view.apply_device_class(obj))

    def device_class_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion"):
            self._dra_changed(lambda: self.view.apply_device_class(new))

    def device_class_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        name = _cluster_name(obj)
        self._dra_changed(lambda: self.view.delete_device_class(name))

    def taint_rule_added(self, obj: Obj) -> None:
        self._dra_changed(lambda: self.view.apply_device_taint_rule(obj))

    def taint_rule_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion"):
            self._dra_changed(lambda: self.view.apply_device_taint_rule(new))

    def taint_rule_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        name = _cluster_name(obj)
        self._dra_changed(lambda: self.view.delete_device_taint_rule(name))

    def resource_claim_added(self, obj: Obj) -> None:
        self._dra_changed(lambda: self.view.apply_resource_claim(None, obj))

    def resource_claim_updated(self, old: Obj, new: Obj) -> None:
        if old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion"):
            self._dra_changed(lambda: self.view.apply_resource_claim(old, new))

    def resource_claim_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        claim = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if claim is not None:
            self._dra_changed(lambda: self.view.delete_resource_claim(claim))

    def _dra_changed(self, apply: Callable[[], Change]) -> None:
        """A DRA change applied to the view, and the pods it may let fit
        woken, as one step (woke_by); then, for each node whose offers moved
        (its allocatable as placement sees it), what a node's own change
        looks at again: its claims (room, rejections) and the classes'
        status figures."""
        with self.view.lock:
            change = apply()
            self.woke(change)
        if not change.nodes_changed:
            return
        for name in sorted(change.nodes_changed):
            for index in (indexes.CLAIMS_BY_NODE, indexes.CLAIMS_BY_REJECTED_NODE):
                for c in self.ctx.claims.by_index(index, name):
                    self.queue.add(CLAIM + keys.key_of(c))
        self.enqueue_classes()

    def podgroup_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        """Made, its gang policy changed, or gone: the gated pods naming it
        look again (they wait for it, or their gang's size changed)."""
        pg = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if pg is not None:
            ns, name = pg["metadata"].get("namespace", ""), pg["metadata"].get("name", "")
        else:
            ns, name = keys.split(obj.key)  # type: ignore[union-attr]
        self.queue.add_all([POD + keys.key_of(p)
                            for p in self.ctx.pods.by_index(indexes.PODS_BY_GANG, podgroup_gang_key(ns, name))
                            if has_gate(p)])

    def podgroup_updated(self, old: Obj, new: Obj) -> None:
        if old.get("spec") == new.get("spec"):
            return  # its status (kube-scheduler's) or a resync
        self.podgroup_changed(new)

    def template_changed(self, template: Obj) -> None:
        self.enqueue_waiting_pods(template["metadata"].get("namespace"))

    def pvc_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        """A volume claim bound (or gone): the gated pods using it may now
        be constrained to other nodes."""
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if pvc is not None:
            self._enqueue_pods_of_pvc(keys.key_of(pvc))

    # -- resource quotas ----------------------------------------------------------------

    def quota_updated(self, old: Obj, new: Obj) -> None:
        if _quota_room_opened(old, new):
            self._retry_refused_by_quota(new["metadata"].get("namespace", ""))

    def quota_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        quota = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if quota is not None:
            self._retry_refused_by_quota(quota["metadata"].get("namespace", ""))

    def _retry_refused_by_quota(self, namespace: str) -> None:
        """The gated pods of `namespace` a quota refused a claim of (what
        they were told: Memories.last_warning), synced now: room in a quota
        is no event of theirs, and their backoff reaches 1,000 s."""
        told = self.ctx.memories.last_warning
        refused = refused_create_told(403, "")
        retried = [POD + keys.key_of(p) for p in self.ctx.pods.by_index(indexes.WAITING_PODS, "")
                   if p["metadata"].get("namespace") == namespace
                   and (told.get(told_key(p)) or "").startswith(refused)]
        if retried:
            log.info("a ResourceQuota has room again: retrying the %d pods it refused a claim of",
                     len(retried), extra={"namespace": namespace})
            self.queue.add_all(retried)

    def pv_changed(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pv = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            self._enqueue_pods_of_pvc(keys.namespaced(ref.get("namespace"), ref["name"]))

    def _enqueue_pods_of_pvc(self, key: str) -> None:
        for p in self.ctx.pods.by_index(indexes.PODS_BY_PVC, key):
            self.queue.add(POD + keys.key_of(p))


# -- small helpers ----------------------------------------------------------------------------


def _cluster_name(obj: Obj | DeletedFinalStateUnknown) -> str:
    """The name of a cluster-scoped object, or of its tombstone."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.obj["metadata"]["name"] if obj.obj is not None else keys.split(obj.key)[1]
    return str(obj["metadata"]["name"])


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


def _quota_room_opened(old: Obj, new: Obj) -> bool:
    """Whether an update of a ResourceQuota may let in a create it refused:
    a limit raised or dropped (in spec, or in status, which admission
    reads), or less of one used. A figure that does not parse counts as
    opened (a retry too many costs one refused request)."""
    def figures(q: Obj, part: str, name: str) -> Mapping[str, Any]:
        value = (q.get(part) or {}).get(name)
        return value if isinstance(value, Mapping) else {}

    for part in ("spec", "status"):
        before, after = figures(old, part, "hard"), figures(new, part, "hard")
        if any(r not in after or _more(after[r], v) for r, v in before.items()):
            return True
    before, after = figures(old, "status", "used"), figures(new, "status", "used")
    return any(r in after and _more(v, after[r]) for r, v in before.items())


def _more(a: Any, b: Any) -> bool:
    """a > b as quantities (whole numbers: what a quota counts of GPUClaims)."""
    x, y = parse_quantity(a), parse_quantity(b)
    return a != b if x is None or y is None else x > y


def _gang_fields(pod: Obj) -> tuple[object, object, object]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return annotations.get(api.GANG_ANNOTATION), annotations.get(api.GANG_SIZE_ANNOTATION), group


def _says_waiting(claim: Obj | None) -> bool:
    return claim is not None and any(c.get("type") == api.CONDITION_WAITING
                                     for c in (claim.get("status") or {}).get("conditions") or ())
