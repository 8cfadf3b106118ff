"""The view of the cluster that event handlers update and workers decide on.

One class owns the state shared between informer handler threads and
worker threads, and its lock: the usage map (claims bound, pods' requests),
the placements in flight, the nodes and classes placement reads, and when
each node last changed or went unhealthy.

Invariant (DESIGN I1): at every moment a decision can read, `used()` counts
every GPU that is or may be bound on each node — claims the informer shows
holding GPUs, pods' requests (or the devices of the ResourceClaim
kube-scheduler made for them) beyond their claims, the devices other
ResourceClaims hold of what DRA offers there, and every placement decided
but not yet shown back by the informer — against the node's allocatable as
the snapshot has it (its DRA offers for a resource its status.allocatable
has none of). Handlers apply a change here before they enqueue the keys it
affects, so a worker never decides on usage older than the event that woke
it; a decision reads `used()`, decides and records its placements with the
lock held throughout, so no two decisions count the same free GPUs. The node index `used()` carries
(decide.nodeindex) is held to the same: the tracker tells it every change
of claims' and pods' usage as it applies it, a node change reaches it with
the snapshot it makes (a class change: its buckets are built again from the
new snapshot), and what is in flight (entries and their endings, as they
stand when `used()` is read) and any hold are laid over it per decision;
it answers only for the usage and snapshot it was read with, and placement
scans otherwise.

GPUs served by DRA (docs/dra.md) are held to the same: what ResourceSlices,
DeviceClasses, DeviceTaintRules and ResourceClaims change is recomputed
here, for what the event touches (state.dra), before the handler enqueues
anything: a node's DRA offers become its allocatable in the snapshot (the
node patched in as a node event patches it), and what ResourceClaims use
of them reaches the usage tracker (direct claims' devices; per pod the
extended-claim rule `pod_counted(requested, extended, held)`), which tells
the node index as for any usage change. Nothing of DRA is computed per
decision.

Pure functions get copies, never the live dicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuclaimctl.decide.capacity import claim_usage
from gpuclaimctl.decide.capacity import free_on as capacity_free_on
from gpuclaimctl.decide.nodeindex import IndexedUsage, NodeIndex
from gpuclaimctl.state.victims import UnitsOn, VictimCache
from gpuclaimctl.model.resources import extended_resources
from gpuclaimctl.model.budgets import BudgetUse
from gpuclaimctl.model.snapshot import Age, ClassInfo, Cluster, NodeInfo, PodRef, Usage
from gpuclaimctl.state.dra import DraMoves, DraState
from gpuclaimctl.state.inflight import InFlight, InFlightPlacements, WriteState, parse_rv
from gpuclaimctl.state.usage import UsageTracker

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Change:
    """What an event did to the view: where it freed GPUs (wakes waiting
    pods that may fit there), or that GPUs may be free anywhere (a class
    change moved usage between resources)."""

    freed_on: frozenset[str] = frozenset()
    freed_anywhere: bool = False
    # Nodes whose snapshot changed (their DRA offers): class status, their
    # claims' room and rejections look again.
    nodes_changed: frozenset[str] = frozenset()


class ClusterView:
    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now
        # Reentrant: a decision holding it may call the methods below.
        self.lock = threading.RLock()
        self.usage = UsageTracker()
        # Nodes by class set and free GPUs, for placement's search: told
        # every usage change by the tracker, every node change below.
        self.node_index = NodeIndex(self.usage.totals)
        self.usage.on_change = self.node_index.used_changed
        self.inflight = InFlightPlacements()
        # Nodes as placement sees them: with their DRA offers in their
        # allocatable (state.dra keeps them as the informer shows them).
        self._nodes: dict[str, NodeInfo] = {}
        self.dra = DraState()
        self._classes: dict[str, ClassInfo] = {}
        self._cluster: Cluster | None = None
        # When a node went NotReady or vanished (for Lost), and when its
        # allocatable, taints or readiness last changed (ends rejections).
        self._unhealthy_since: dict[str, datetime] = {}
        self._changed_at: dict[str, datetime] = {}
        # What counts against budgets: the claims holding GPUs on a node, as
        # the informer shows them, summed per namespace and class.
        self._budget_holds = _BudgetHolds()
        # The oldest waiting gang's hold (Decider.used_by), or None.
        self.gang_hold: GangHold | None = None
        # GPUs held for preemptors while their victims go (Decider.used_by),
        # by holder (a pod's uid, or a gang's key).
        self.nominations: dict[str, Nomination] = {}
        # What preemption may take per node, kept until the node changes.
        self.victims = VictimCache()

    # -- claims --------------------------------------------------------------------------

    def apply_claim(self, old: Obj | None, new: Obj) -> Change:
        """The informer shows `new` (after `old`, possibly another uid)."""
        uid = new["metadata"]["uid"]
        with self.lock:
            before = self._held_pairs(uid)
            if old is not None and old["metadata"].get("uid") != uid:
                before |= self._held_pairs(old["metadata"]["uid"])
                self._forget_claim(old["metadata"]["uid"])
            totals = self._totals_at(before)
            # Usage first, then in flight: the GPUs are never uncounted.
            self.usage.set_claim(new)
            self._hold_for_budgets(new)
            self.inflight.observe(uid, new["metadata"].get("resourceVersion", ""))
            return Change(freed_on=self._less(before, totals))

    def delete_claim(self, claim: Obj) -> Change:
        uid = claim["metadata"]["uid"]
        with self.lock:
            before = self._held_pairs(uid)
            totals = self._totals_at(before)
            self._forget_claim(uid)
            return Change(freed_on=self._less(before, totals))

    def _forget_claim(self, uid: str) -> None:
        self.usage.delete_claim(uid)
        self.inflight.gone(uid)
        self._budget_holds.drop(uid)

    def _hold_for_budgets(self, claim: Obj) -> None:
        meta = claim["metadata"]
        uid = meta["uid"]
        if claim_usage(claim, {}) is None:
            self._budget_holds.drop(uid)
        else:
            spec = claim.get("spec") or {}
            self._budget_holds.set(uid, meta.get("namespace", ""), str(spec.get("className") or ""),
                                   int(spec.get("count") or 0))

    def budget_use(self, namespace: str) -> BudgetUse:
        """GPUs of `namespace` per class: bound (as the informer shows, or
        as the API server answered a bind of ours the informer does not
        show yet: InFlight.answered), and placed by us with no answer yet
        (in flight). The split is for people (a Budget message); the checks
        use the sum. A bind answered is bound whatever the watch's lag:
        with it counted as being placed, a pod running for a while was told
        its GPUs were still "being placed"."""
        with self.lock:
            holds = self._budget_holds
            bound = dict(holds.sums.get(namespace, {}))
            placing: dict[str, int] = {}
            for e in self.inflight:
                if e.namespace == namespace and not holds.holds(e.claim_uid):
                    into = bound if e.state is WriteState.WRITTEN and e.answered else placing
                    into[e.class_name] = into.get(e.class_name, 0) + e.count
            return BudgetUse(bound, placing)

    def bound_in_class(self, class_name: str) -> int:
        """GPUs the claims of `class_name` hold as the informer shows them,
        every namespace (`status.bound`): kept as claims change, where a sum
        afresh cost a pass over every claim of the class per class sync (at
        25,000 claims a class, most of what a release cost the controller)."""
        with self.lock:
            return self._budget_holds.by_class.get(class_name, 0)

    # -- pods -------------------------------------------------------------------------------

    def apply_pod(self, old: Obj | None, new: Obj) -> Change:
        with self.lock:
            nodes = self._pod_pairs(old, new)
            totals = self._totals_at(nodes)
            if old is not None and old["metadata"].get("uid") != new["metadata"].get("uid"):
                self.usage.delete_pod(old["metadata"]["uid"])
            self.usage.set_pod(new)
            return Change(freed_on=self._less(nodes, totals))

    def delete_pod(self, pod: Obj) -> Change:
        with self.lock:
            nodes = self._pod_pairs(pod, None)
            totals = self._totals_at(nodes)
            self.usage.delete_pod(pod["metadata"]["uid"])
            # A preemptor gone: what was held for it is free for others.
            held = self.drop_nomination(pod["metadata"]["uid"])
            return Change(freed_on=self._less(nodes, totals) | held)

    def drop_nomination(self, holder: str) -> frozenset[str]:
        """End `holder`'s nomination; the nodes where it held GPUs, if it
        was live (the pods waiting there may fit now)."""
        with self.lock:
            old = self.nominations.pop(holder, None)
            if old is None or old.until <= self._now():
                return frozenset()
            return frozenset(n for per in old.usage.values() for n in per)

    # -- nodes ------------------------------------------------------------------------------

    def apply_node(self, node: Obj, *, ready: bool, not_ready_since: datetime | None,
                   health_changed: bool, recreated: bool) -> bool:
        """The informer shows `node`. True if anything placement reads changed."""
        name = node["metadata"]["name"]
        raw = NodeInfo.from_api(node)
        with self.lock:
            if recreated and name in self._unhealthy_since:
                self._changed_at[name] = self._now()
            if ready:
                self._unhealthy_since.pop(name, None)
            else:
                self._unhealthy_since.setdefault(name, not_ready_since or self._now())
            if health_changed:
                self._changed_at[name] = self._now()
            moves = self.dra.set_node(raw)
            if moves is None:
                return False  # a heartbeat, say
            changed = self._put_node(name, self.dra.effective(name))
            self._dra_moved(moves, skip=name)
            return changed

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._unhealthy_since.setdefault(name, self._now())
            self._put_node(name, None)
            self._dra_moved(self.dra.delete_node(name), skip=name)

    def _put_node(self, name: str, info: NodeInfo | None) -> bool:
        """The snapshot's node `name` is now `info` (None: gone), patched
        into the snapshot and the node index. True if it changed. A change
        of its allocatable as placement sees it (its DRA offers: status
        changes come with their own event) counts as a change of the node
        (nodes_changed: rejections end)."""
        old = self._nodes.get(name)
        if old == info:
            return False
        if info is None:
            del self._nodes[name]
        else:
            self._nodes[name] = info
            if old is not None and old.allocatable != info.allocatable:
                self._changed_at[name] = self._now()
        if self._cluster is not None:
            was = self._cluster
            self._cluster = was.without_node(name) if info is None else was.with_node(info)
            self.node_index.follow(self._cluster, was=was, changed=name)
        return True

    # -- GPUs served by DRA (docs/dra.md) -------------------------------------------------

    def dra_synced(self) -> Change:
        """The DRA informers have all listed once: their offers count."""
        with self.lock:
            return self._dra_moved(self.dra.enable())

    def apply_resource_slice(self, obj: Obj) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.put_slice(obj))

    def delete_resource_slice(self, name: str) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.delete_slice(name))

    def apply_device_class(self, obj: Obj) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.put_class(obj))

    def delete_device_class(self, name: str) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.delete_class(name))

    def apply_device_taint_rule(self, obj: Obj) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.put_rule(obj))

    def delete_device_taint_rule(self, name: str) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.delete_rule(name))

    def apply_resource_claim(self, old: Obj | None, new: Obj) -> Change:
        """The ResourceClaim informer shows `new` (after `old`, possibly
        another uid)."""
        with self.lock:
            moves = DraMoves()
            if old is not None and old["metadata"].get("uid") != new["metadata"].get("uid"):
                moves = self.dra.delete_claim(old["metadata"].get("uid", ""))
            return self._dra_moved(moves.merge(self.dra.put_claim(new)))

    def delete_resource_claim(self, obj: Obj) -> Change:
        with self.lock:
            return self._dra_moved(self.dra.delete_claim(obj["metadata"].get("uid", "")))

    def _dra_moved(self, moves: DraMoves, skip: str = "") -> Change:
        """Apply what a DRA change did: the nodes whose offers moved are
        patched into the snapshot (`skip`: the caller's own node, done),
        the claims whose use moved told to the usage tracker (and so the
        node index). The Change says where GPUs are free now that were not
        (the pods waiting there wake) and which nodes changed."""
        if not moves:
            return Change()
        touched = set(moves.nodes)
        for before, after in moves.claims.values():
            for use in (before, after):
                if use is not None:
                    touched.update(node for node, _, _ in use.held)
        was = {n: self._free_at(n) for n in touched}
        changed = {skip} & moves.nodes
        for name in sorted(moves.nodes - {skip}):
            if self._put_node(name, self.dra.effective(name)):
                changed.add(name)
        for uid, (_, after) in moves.claims.items():
            self.usage.set_dra_claim(uid, after)
        freed = frozenset(n for n in touched
                          if any(f > was[n].get(r, 0) for r, f in self._free_at(n).items()))
        return Change(freed_on=freed, nodes_changed=frozenset(changed))

    def _free_at(self, name: str) -> dict[str, int]:
        """resource -> allocatable (as placement sees it) less what the
        tracker counts on the node."""
        node = self._nodes.get(name)
        if node is None:
            return {}
        return {r: n - self.usage.totals.get(r, {}).get(name, 0) for r, n in node.allocatable.items()}

    def unhealthy_since(self, name: str) -> datetime:
        """Since when the node has been NotReady or gone; now, if this is
        the first we hear of it (a node that went while we were down)."""
        with self.lock:
            return self._unhealthy_since.setdefault(name, self._now())

    def nodes_changed(self) -> dict[str, datetime]:
        """node -> when its allocatable, taints or readiness last changed (a copy)."""
        with self.lock:
            return dict(self._changed_at)

    def node_changed_at(self, name: str) -> datetime | None:
        with self.lock:
            return self._changed_at.get(name)

    # -- classes ----------------------------------------------------------------------------

    def apply_class(self, obj: Obj) -> Change:
        info = ClassInfo.from_api(obj)
        with self.lock:
            if self._classes.get(info.name) == info:
                return Change()
            self._classes[info.name] = info
            return self._classes_changed()

    def delete_class(self, name: str) -> Change:
        with self.lock:
            if self._classes.pop(name, None) is None:
                return Change()
            return self._classes_changed()

    def _classes_changed(self) -> Change:
        self._cluster = None
        moved = self.usage.set_classes({c.name: c.resource_name for c in self._classes.values()})
        # The resources DRA is asked for are the classes': offers may come or go.
        dra = self._dra_moved(self.dra.set_resources(c.resource_name for c in self._classes.values()))
        return Change(freed_anywhere=moved or bool(dra.freed_on), nodes_changed=dra.nodes_changed)

    # -- deciding ---------------------------------------------------------------------------

    @contextmanager
    def deciding(self) -> Iterator[Decider]:
        """Hold the lock across reading usage, deciding and recording."""
        with self.lock:
            yield Decider(self)

    def cluster(self) -> Cluster:
        with self.lock:
            if self._cluster is None:
                self._cluster = Cluster(self._nodes.values(), self._classes.values())
            return self._cluster

    def used(self) -> IndexedUsage:
        """resource -> node -> GPUs used or in flight (GPUs of unknown
        resource under every resource of their node: capacity.with_unknown),
        with the node index that answers for it. Read it with the lock
        held: what the tracker keeps is read live, what is in flight is
        summed afresh."""
        with self.lock:
            return self.node_index.usage(self.cluster(), self.inflight.usage(), self._allocatable)

    def _allocatable(self, node_name: str) -> Mapping[str, int] | None:
        node = self._nodes.get(node_name)
        return None if node is None else node.allocatable

    def in_flight(self, claim_uid: str) -> InFlight | None:
        with self.lock:
            return self.inflight.get(claim_uid)

    def free_on(self, node_names: Iterable[str]) -> dict[str, dict[str, int]]:
        """node -> resource -> GPUs neither used nor in flight, for the
        nodes known and Ready (an unknown node has nothing free)."""
        with self.lock:
            used = self.used()
            out: dict[str, dict[str, int]] = {}
            for name in node_names:
                node = self._nodes.get(name)
                if node is None or not node.ready or node.unschedulable:
                    continue
                out[name] = capacity_free_on(node.allocatable, used, name)
            return out

    # -- the fate of a write (pod sync) -----------------------------------------------------

    def written(self, claim_uid: str, rv: str) -> None:
        with self.lock:
            self.inflight.written(claim_uid, rv)

    def write_failed(self, claim_uid: str, base: str | None = None, *,
                     lost_at: datetime | None = None) -> Change:
        """Refused, or its answer lost (at `lost_at`): counted until a newer
        version shows (which may have shown already: then the GPUs may be
        free now)."""
        with self.lock:
            return self._ending(claim_uid, lambda: self.inflight.settling(
                claim_uid, base, lost_at=lost_at))

    def not_sent(self, claim_uid: str) -> Change:
        with self.lock:
            return self._ending(claim_uid, lambda: self.inflight.not_sent(claim_uid))

    def settled(self, claim_uid: str, live_rv: str) -> Change:
        with self.lock:
            return self._ending(claim_uid, lambda: self.inflight.settled(claim_uid, live_rv))

    def _ending(self, claim_uid: str, change: Callable[[], object]) -> Change:
        """Apply `change` to the claim's entry; where GPUs it counted are
        no longer counted, say so (the pods waiting for them wake)."""
        before = self._held_pairs(claim_uid)
        totals = self._totals_at(before)
        change()
        return Change(freed_on=self._less(before, totals))

    def unresolved(self) -> list[InFlight]:
        with self.lock:
            return self.inflight.unresolved()

    def unseen(self, added_before: datetime, cached_uid: Callable[[str, str], str | None]) -> list[InFlight]:
        """Entries begun before `added_before` whose claim the cache does not
        hold (by namespace and name, at that uid): a claim created and
        deleted while a relist skipped both has no event left to end its
        entry (sync.claims.audit_inflight)."""
        with self.lock:
            entries = [e for e in self.inflight if e.name and e.added_at is not None
                       and e.added_at <= added_before]
        return [e for e in entries if cached_uid(e.namespace, e.name) != e.claim_uid]

    def claim_gone(self, claim_uid: str) -> Change:
        """A live read shows the claim deleted (404, or another uid under its
        name): it holds nothing, as after the informer's delete."""
        with self.lock:
            return self._ending(claim_uid, lambda: self.inflight.gone(claim_uid))

    # -- taking over --------------------------------------------------------------------------

    def catch_up(self, listed: Iterable[Obj], cached: Callable[[str, str], Obj | None]) -> int:
        """Count as in flight every claim a consistent list shows holding GPUs
        that the cache does not show holding them at that version yet;
        return how many."""
        added = 0
        with self.lock:
            resource_of_class = self.usage.resource_of_class()
            for claim in listed:
                held = claim_usage(claim, resource_of_class)
                if held is None:
                    continue
                meta = claim["metadata"]
                in_cache = cached(meta.get("namespace", ""), meta.get("name", ""))
                # Skipped only if the cache shows that very version (or a
                # later one): an older one holding the same GPUs may be
                # followed, as the informer replays the versions between,
                # by the claim freed and bound again, and the GPUs would go
                # uncounted meanwhile. Counted twice until then instead.
                if in_cache is not None and claim_usage(in_cache, resource_of_class) == held \
                        and in_cache["metadata"].get("uid") == meta.get("uid") \
                        and parse_rv(in_cache["metadata"].get("resourceVersion")) >= \
                        parse_rv(meta.get("resourceVersion")):
                    continue
                refs = (claim.get("status") or {}).get("reservedFor") or [{}]
                pod = PodRef(refs[0].get("name", ""), refs[0].get("uid", ""))
                node, resource, count = held
                self.inflight.add_seen_elsewhere(
                    meta.get("uid", ""), pod, node, resource, count, meta.get("resourceVersion", ""),
                    namespace=meta.get("namespace", ""),
                    class_name=str((claim.get("spec") or {}).get("className") or ""),
                    name=meta.get("name", ""), added_at=self._now())
                added += 1
        return added

    # -- internals ----------------------------------------------------------------------------

    def _held_pairs(self, claim_uid: str) -> set[tuple[str, str]]:
        pairs = set()
        held = self.usage.claim_held(claim_uid)
        if held is not None:
            pairs.add((held[0], held[1]))
        entry = self.inflight.get(claim_uid)
        if entry is not None:
            pairs.add((entry.node, entry.resource))
        return pairs

    def _pod_pairs(self, *pods: Obj | None) -> set[tuple[str, str]]:
        pairs: set[tuple[str, str]] = set()
        for pod in pods:
            node = ((pod or {}).get("spec") or {}).get("nodeName")
            if pod is not None and node:
                pairs.update((node, r) for r in extended_resources(pod))
        return pairs

    def _totals_at(self, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        inflight = self.inflight.usage() if pairs else {}
        return {(n, r): self.usage.totals.get(r, {}).get(n, 0) + inflight.get(r, {}).get(n, 0)
                for n, r in pairs}

    def _less(self, pairs: set[tuple[str, str]],
              before: Mapping[tuple[str, str], int]) -> frozenset[str]:
        """The nodes of `pairs` where fewer GPUs are used than `before`."""
        after = self._totals_at(pairs)
        return frozenset(p[0] for p in pairs if after[p] < before[p])


class _BudgetHolds:
    """GPUs held per namespace and class, kept as claims change: a decision
    reads the sums of its namespace, which summed afresh cost a pass over
    every claim of the namespace per decision (issue 12)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[str, str, int]] = {}  # claim uid -> namespace, class, GPUs
        self.sums: dict[str, dict[str, int]] = {}            # namespace -> class -> GPUs
        self.by_class: dict[str, int] = {}                   # class -> GPUs, every namespace

    def holds(self, uid: str) -> bool:
        return uid in self._by_uid

    def set(self, uid: str, namespace: str, class_name: str, count: int) -> None:
        self.drop(uid)
        self._by_uid[uid] = (namespace, class_name, count)
        per_class = self.sums.setdefault(namespace, {})
        per_class[class_name] = per_class.get(class_name, 0) + count
        self.by_class[class_name] = self.by_class.get(class_name, 0) + count

    def drop(self, uid: str) -> None:
        held = self._by_uid.pop(uid, None)
        if held is None:
            return
        namespace, class_name, count = held
        self.by_class[class_name] -= count
        if not self.by_class[class_name]:
            del self.by_class[class_name]
        per_class = self.sums[namespace]
        per_class[class_name] -= count
        if not per_class[class_name]:
            del per_class[class_name]
            if not per_class:
                del self.sums[namespace]


@dataclass(frozen=True)
class GangHold:
    """GPUs the oldest waiting gang could use (its sets that fit, placed
    before the first that did not): no younger pod or gang takes them, so a
    stream of small pods cannot keep a large gang waiting for ever
    (DESIGN §4c, issue 44 item 3). One at a time, the oldest gang's; it
    lasts HOLD_FOR seconds from the gang's last decision, which comes again
    whenever GPUs are freed."""

    gang: str  # the gang's key
    age: Age  # its first member's in the order pods compete (priority, creation, namespace, name)
    usage: Mapping[str, Mapping[str, int]]
    until: datetime


@dataclass(frozen=True)
class Nomination:
    """GPUs held for a preemptor while the pods it preempts terminate
    (DESIGN.md §4d): counted as used for every decision but its own and
    those of higher priority, until it is placed, stops fitting, goes, or
    `until` passes (its sync renews it meanwhile)."""

    holder: str  # the preemptor: a pod's uid, or a gang's key
    pod: str     # its ns/name (a gang's: its deciding member's), for people
    priority: int
    usage: Mapping[str, Mapping[str, int]]
    victims: tuple[str, ...]  # ns/name of the pods it waits for
    until: datetime


# How long a waiting gang's hold lasts after its last decision: a gang is
# decided again whenever GPUs are freed, so a hold outlives a decision only
# while nothing in the cluster moves -- when it could not complete anyway.
HOLD_FOR = 60.0


class Decider:
    """One decision's access to the view, with its lock held."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    @property
    def cluster(self) -> Cluster:
        return self._view.cluster()

    def used(self) -> Usage:
        return self._view.used()

    def used_by(self, age: Age, gang: str = "", *, me: str = "",
                priority: int = 0) -> tuple[Usage, GangHold | None]:
        """What a decision for a pod (or gang `gang`) of `age` sees as used:
        `used()`, plus the oldest waiting gang's hold when that gang is
        older (and not its own), plus the GPUs held for preemptors of
        `priority` or higher other than `me` (its uid, or the gang's key);
        and the gang hold it counted, if any."""
        view = self._view
        now = view._now()
        extra = [n.usage for k, n in view.nominations.items()
                 if k != me and k != gang and n.until > now and n.priority >= priority]
        hold = view.gang_hold
        if hold is None or hold.gang == gang or not hold.age < age or hold.until <= now:
            return view.used().plus(*extra), None
        return view.used().plus(hold.usage, *extra), hold

    def nominate(self, nomination: Nomination) -> frozenset[str]:
        """Hold GPUs for a preemptor (replacing its earlier nomination);
        the nodes where the earlier one held GPUs this one does not."""
        view = self._view
        old = view.nominations.get(nomination.holder)
        view.nominations[nomination.holder] = nomination
        if old is None or old.until <= view._now():
            return frozenset()
        now_held = {n for per in nomination.usage.values() for n in per}
        return frozenset(n for per in old.usage.values() for n in per if n not in now_held)

    def drop_nomination(self, holder: str) -> frozenset[str]:
        return self._view.drop_nomination(holder)

    def units_on(self, now: datetime, stuck_after: float, evicted: Collection[str] = ()) -> UnitsOn:
        """node -> what preemption may take there (decide.preempt.Unit): the
        pods bound there that reserve claims holding GPUs there, a gang's
        members together. A pod terminating for longer than `stuck_after`
        seconds past its deletionTimestamp frees nothing one can count on:
        it is no victim (nor waited for); a pod in `evicted` (uids evicted
        lately) is terminating. Built per node when asked, and kept until
        the node changes (state.victims)."""
        view = self._view
        return view.victims.units_on(view.usage, view.inflight, now, stuck_after, evicted)

    def hold(self, hold: GangHold | None, gang: str) -> bool:
        """Set gang `gang`'s hold (None: drop it, if it is the one held); a
        younger gang's does not replace an older one's still live. True if
        GPUs held before are free now (the pods waiting may fit)."""
        view = self._view
        old = view.gang_hold
        live = old is not None and old.until > view._now()
        if hold is None:
            if old is not None and old.gang == gang:
                view.gang_hold = None
                return live
            return False
        if live and old is not None and old.gang != gang and old.age < hold.age:
            return False
        view.gang_hold = hold
        # A lapsed hold counted nothing any more: replacing it frees nothing
        # (waking everyone then made two waiting gangs take the hold from
        # each other every HOLD_FOR, for ever: simulation seed 9098).
        return live and old is not None and old.gang != gang

    def in_flight(self, claim_uid: str) -> InFlight | None:
        return self._view.inflight.get(claim_uid)

    def budget_use(self, namespace: str) -> BudgetUse:
        return self._view.budget_use(namespace)

    def resend(self, claim_uid: str, base: str) -> bool:
        """A kept claim's entry is written again from `base`; True if it was
        put back on the wire (InFlightPlacements.resend)."""
        return self._view.inflight.resend(claim_uid, base)

    def record(self, claim_uid: str, pod: PodRef, node: str, resource: str, count: int,
               base: str, *, namespace: str = "", class_name: str = "", name: str = "") -> None:
        """Count a placement just decided, until its write is seen back
        (against the node's GPUs, and the budgets of `namespace`)."""
        self._view.inflight.add(claim_uid, pod, node, resource, count, base,
                                namespace=namespace, class_name=class_name, name=name,
                                added_at=self._view._now())
