"""The deterministic simulation: the real handlers and syncs against FakeApi.

One `Sim` is one seeded run. The controller under test is the real one in
pieces — `controller.Handlers` (what informer events do to the view and
the queue) and `sync_pod`/`sync_claim`/`sync_class` with a real
`SyncContext` — over stores the harness fills from the fake's watch logs at
whatever lag the schedule picks. Nothing runs on a thread: "workers" are
syncs run one at a time, and concurrency is made by running steps (another
sync, deliveries, a crash) *inside* a sync, at its writes, through the
fake's `before_write` hook. So a failing seed replays exactly.

Faults: answers lost after the write landed or before, conflicts (real:
every write carries its resourceVersion; 409s are also injected inside
writes), relists whose objects changed uid, a crash (the controller's
memory is thrown away mid-sync and a new one starts from a fresh list),
a crash with a write still on the wire that lands after the new process
listed (no leader election: the new one waits out its deadline), a takeover
by a standby whose caches lag (`catch_up` must cover it), classes deleted
and recreated, their resourceName and nodeSelector edited, node
allocatable lowered (to 0 too) and raised, also inside writes, nodes
deleted and recreated, pods without claims on nodes, claims deleted by
users, annotations edited (before and after release), pods deleted,
recreated, refused by the scheduler, finished.

The invariants (DESIGN.md §4) are checked on the fake's objects — the
truth — after every step: I1 (per node and resource) and I2 always, I4
once the run is drained; and at every decision the node index answers,
that the full scan on the same view chooses the same node.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from gpuclaimctl.client.writer import Writer
from gpuclaimctl.cmd import startwait
from gpuclaimctl.controller import dispatch
from gpuclaimctl.sync.handlers import Handlers
from gpuclaimctl.decide.capacity import used_capacity
from gpuclaimctl.model import api, keys
from gpuclaimctl.model.budgets import BudgetInfo
from gpuclaimctl.model.podclaims import has_gate, named_claims
from gpuclaimctl.model.resources import parse_quantity
from gpuclaimctl.state import indexes
from gpuclaimctl.state.memories import Memories
from gpuclaimctl.state.turnstile import AgeTurnstile
from gpuclaimctl.state.view import ClusterView
from gpuclaimctl.sync.claims import AUDIT_MIN_AGE, AUDIT_PERIOD
from gpuclaimctl.sync.context import AUDIT_INFLIGHT, Settings, SyncContext
from informers import (
    DeletedFinalStateUnknown,
    GPUBudgetLister,
    GPUClaimLister,
    GPUClaimTemplateLister,
    GPUClassLister,
    NodeLister,
    PersistentVolumeClaimLister,
    PersistentVolumeLister,
    PodLister,
)
from informers.store import Indexer
from tests.sim.fakeapi import (
    BUDGETS,
    CLAIMS,
    CLASSES,
    NODES,
    PODS,
    PVCS,
    PVS,
    TEMPLATES,
    FakeApi,
    lost_answer,
)

Obj = dict[str, Any]
KINDS = (PODS, CLAIMS, NODES, CLASSES, TEMPLATES, PVCS, PVS)
NS = "team"
RESOURCE = "example.com/gpu"
# Pods' spec.priority: mostly 0, some urgent (DESIGN.md §4d).
PRIORITIES = (0, 0, 0, 100, 1000, 1000)
CONTENDED_PRIORITIES = (0, 0, 100, 1000)
# A second resource some nodes offer beside RESOURCE: a class's
# resourceName is edited between the two.
RESOURCE2 = "example.com/gpu2"
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
# A write whose answer was lost lands within this many seconds of being
# sent, or never: below the controller's LOST_WRITE_WINDOW, which is what
# it waits before a live read may settle such a write as not landed.
SIM_LATE_LANDING = 40.0
# How long a new process without leader election waits before its first
# decision (app.EARLIER_WRITES_WINDOW): a write the dead process had on the
# wire lands within it, or never.
RESTART_WAIT = startwait.RESTART_WAIT


# The writes that carry a resourceVersion (a change by someone else first
# makes them a 409), and the kind of object each writes.
_TOUCHED_KIND = {"update_claim": CLAIMS, "update_claim_status": CLAIMS, "update_class_status": CLASSES,
                 "update_budget_status": BUDGETS}


class Crash(BaseException):
    """The process dies here (kill -9): nothing after this point happens."""


class InvariantBroken(AssertionError):
    pass


class SimQueue:
    """The work queue's guarantees, deterministically: a key is queued once;
    delayed keys come due on the simulated clock; the harness picks which
    ready key a "worker" takes (any order a real queue with several workers
    could produce); a key being synced is not handed to another worker (it
    stays ready, as a real queue keeps it dirty, until that sync is done)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.processing: set[str] = set()
        self._clock = clock
        self.ready: dict[str, None] = {}
        self.delayed: dict[str, float] = {}
        self.failures: dict[str, int] = {}

    def add(self, key: str) -> None:
        self.ready[key] = None
        self.delayed.pop(key, None)

    def add_all(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def add_after(self, key: str, seconds: float) -> None:
        if key in self.ready:
            return
        due = self._clock() + max(seconds, 0.0)
        self.delayed[key] = min(due, self.delayed.get(key, due))

    def add_rate_limited(self, key: str) -> None:
        n = self.failures.get(key, 0)
        self.failures[key] = n + 1
        self.add_after(key, min(0.005 * 2 ** n, 30.0))

    def forget(self, key: str) -> None:
        self.failures.pop(key, None)

    def promote(self) -> None:
        now = self._clock()
        for key, due in list(self.delayed.items()):
            if due <= now:
                del self.delayed[key]
                self.ready[key] = None

    def next_due(self) -> float | None:
        return min(self.delayed.values()) if self.delayed else None


class Informer:
    """One kind's cache fed from the fake's log at the harness's pace."""

    def __init__(self, fake: FakeApi, kind: str, indexers: Mapping[str, Any] | None,
                 on_add: Callable[[Obj], None], on_update: Callable[[Obj, Obj], None],
                 on_delete: Callable[[Any], None]) -> None:
        self.fake, self.kind = fake, kind
        self.store = Indexer(dict(indexers or {}))
        self.on_add, self.on_update, self.on_delete = on_add, on_update, on_delete
        self.cursor = 0

    def pending(self) -> int:
        return len(self.fake.events_after(self.kind, self.cursor))

    def deliver(self, n: int) -> None:
        for ev in self.fake.events_after(self.kind, self.cursor)[:n]:
            self.cursor = ev.position + 1
            key = keys.key_of(ev.obj)
            old = self.store.get_by_key(key)
            if ev.type == "DELETED":
                self.store.pop(key)
                self.on_delete(ev.obj)
            elif old is None:
                self.store.set(key, ev.obj)
                self.on_add(ev.obj)
            else:
                self.store.set(key, ev.obj)
                self.on_update(old, ev.obj)

    def relist(self) -> None:
        """A watch gap ends with a fresh list (client-go's Replace): updates
        may carry another uid, missed deletes come as tombstones."""
        listing = self.fake.list(self.kind)
        self.cursor = listing.cursor
        seen = set()
        for obj in listing.items:
            key = keys.key_of(obj)
            seen.add(key)
            old = self.store.get_by_key(key)
            self.store.set(key, obj)
            if old is None:
                self.on_add(obj)
            else:
                self.on_update(old, obj)
        for key in list(self.store.list_keys()):
            if key not in seen:
                old = self.store.pop(key)
                self.on_delete(DeletedFinalStateUnknown(key, old))


class Controller:
    """The controller's memory: informers, view, queue, memories. A crash
    or a takeover throws one away and starts another."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.queue = SimQueue(sim.monotonic)
        self.view = ClusterView(sim.now)
        # At every decision the node index answers, the full scan on the same
        # view must choose the same node (decide.nodeindex; placement.search).
        self.view.node_index.verify = self._index_agrees
        handlers_box: list[Handlers] = []

        def h() -> Handlers:
            return handlers_box[0]

        self.informers = {
            PODS: Informer(sim.fake, PODS, indexes.POD_INDEXERS, lambda o: h().pod_added(o),
                           lambda a, b: h().pod_updated(a, b), lambda o: h().pod_deleted(o)),
            CLAIMS: Informer(sim.fake, CLAIMS, indexes.CLAIM_INDEXERS, lambda o: h().claim_added(o),
                             lambda a, b: h().claim_updated(a, b), lambda o: h().claim_deleted(o)),
            NODES: Informer(sim.fake, NODES, None, lambda o: h().node_added(o),
                            lambda a, b: h().node_updated(a, b), lambda o: h().node_deleted(o)),
            CLASSES: Informer(sim.fake, CLASSES, None, lambda o: h().class_added(o),
                              lambda a, b: h().class_updated(a, b), lambda o: h().class_deleted(o)),
            TEMPLATES: Informer(sim.fake, TEMPLATES, None, lambda o: h().template_changed(o),
                                lambda a, b: h().template_changed(b), lambda o: None),
            PVCS: Informer(sim.fake, PVCS, None, lambda o: h().pvc_changed(o),
                           lambda a, b: h().pvc_changed(b), lambda o: h().pvc_changed(o)),
            PVS: Informer(sim.fake, PVS, None, lambda o: h().pv_changed(o),
                          lambda a, b: h().pv_changed(b), lambda o: h().pv_changed(o)),
            BUDGETS: Informer(sim.fake, BUDGETS, None,
                              lambda o: (sim.budgets_seen(self), h().budget_changed(o)),
                              lambda a, b: (sim.budgets_seen(self), h().budget_updated(a, b)),
                              lambda o: (sim.budgets_seen(self), h().budget_changed(o))),
        }
        i = self.informers
        self.ctx = SyncContext(
            pods=PodLister(i[PODS].store), claims=GPUClaimLister(i[CLAIMS].store),
            nodes=NodeLister(i[NODES].store), classes=GPUClassLister(i[CLASSES].store),
            templates=GPUClaimTemplateLister(i[TEMPLATES].store),
            pvcs=PersistentVolumeClaimLister(i[PVCS].store), pvs=PersistentVolumeLister(i[PVS].store),
            budgets=GPUBudgetLister(i[BUDGETS].store), budgets_synced=lambda: True,
            writer=cast(Writer, sim.fake), view=self.view, memories=Memories(reject_for=60.0),
            turnstile=AgeTurnstile(max_wait=0.0), enqueue=self.queue.add,
            enqueue_after=self.queue.add_after, wake=lambda apply: h().woke_by(apply),
            settings=Settings(reject_for=60.0, node_lost_grace=30.0), metrics=None, now=sim.now)
        handlers_box.append(Handlers(self.ctx, cast(Any, self.queue)))
        self.handlers = handlers_box[0]
        self.queue.add_after(AUDIT_INFLIGHT, AUDIT_PERIOD)  # as Controller.run
        # No decision before this (simulated) time: a new process without
        # leader election waits until the dead one's writes can land no
        # more, then lists claims once (app.run); None once it has.
        self.decides_from: float | None = None

    def _index_agrees(self, indexed: str, scanned: str, what: str) -> None:
        if indexed != scanned:
            raise InvariantBroken(f"node index: {what}: the index chose {indexed or 'no node'}, the "
                                  f"scan {scanned or 'no node'}\n" + self.sim.trace())

    def start(self, wait: float = 0.0) -> None:
        """Initial lists, then (after `wait`: see `open`) one consistent
        claim list before the first decision (app._catch_up), then every
        object's key, as a resync."""
        self.decides_from = self.sim.t + wait  # during the lists too (Sim.budgets_seen)
        for kind in (NODES, CLASSES, TEMPLATES, PVCS, PVS, BUDGETS, CLAIMS, PODS):
            self.informers[kind].relist()
        self.open()

    def open(self) -> bool:
        """Whether the worker may decide: once the start wait has passed,
        the catch-up list is taken the first time."""
        if self.decides_from is None:
            return True
        if self.sim.t < self.decides_from:
            return False
        self.decides_from = None
        self.view.catch_up(self.sim.fake.list_claims(), self.ctx.claims.get)
        return True

    def sync(self, key: str) -> None:
        self.queue.processing.add(key)
        self.sim.syncing.append(key)
        evicted_before = len(self.sim.fake.evicted)
        try:
            dispatch(self.ctx, key)
            self.queue.forget(key)
            self.sim.check_preemption(key, evicted_before)
        except Crash:
            raise
        except InvariantBroken:
            raise
        except Exception as e:  # what the worker loop does: back off, retry
            self.sim.note(f"  {key} failed: {type(e).__name__}: {e}")
            self.queue.add_rate_limited(key)
        finally:
            self.queue.processing.discard(key)
            self.sim.syncing.pop()


@dataclass
class Sim:
    seed: int
    steps: int = 300
    nodes: tuple[int, ...] = (8, 4, 4, 2)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # One seed in four is about preemption: pods run longer, and more of
        # them are urgent, so urgent sets find the cluster full.
        self.contended = self.seed % 4 == 1
        self.t = 0.0
        self.fake = FakeApi(self.now)
        self.depth = 0
        self.pod_counter = 0
        # (budget, className) -> the most GPUs the namespace may hold under
        # that limit: the limit, or (when the controller saw it lowered
        # below use) what was held and in flight when it saw it.
        self.ceilings: dict[tuple[str, str], int] = {}
        self._limits_seen: dict[tuple[str, str], int] = {}
        # (node, resource) -> the most GPUs claims may hold there by the
        # controller's doing: the allocatable its view shows, or (when it
        # saw it lowered below use) what was held and in flight then.
        self.node_ceilings: dict[tuple[str, str], int] = {}
        self._alloc_seen: dict[tuple[str, str], int] = {}
        # gang -> (size, members created so far); gangs released (their
        # first member ungated: replacements after that are placed alone).
        self.gangs: dict[str, tuple[int, int]] = {}
        self.gang_counter = 0
        self.gangs_released: set[str] = set()
        # The restart wait to use (a test sets 0 to show the window it closes).
        self.restart_wait = RESTART_WAIT
        # Preemption: the keys being synced (innermost last); per eviction,
        # the key whose sync evicted, the victim as it was, and the claims
        # that reserved it; pods whose termination never ends (until drain).
        self.syncing: list[str] = []
        self.evictions: list[tuple[str, Obj, list[Obj]]] = []
        self.stuck: set[str] = set()
        self.fake.on_evict = self._on_evict
        self.fake.before_write = self._at_write
        self._setup_cluster()
        self.ctl = Controller(self)
        self.ctl.start()

    # -- time ------------------------------------------------------------------------

    def now(self) -> datetime:
        return START + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t

    # -- the cluster ----------------------------------------------------------------

    def _setup_cluster(self) -> None:
        for i, gpus in enumerate(self.nodes):
            self.fake.create(NODES, self._node_object(f"n{i}", gpus))
        for name in ("alpha", "beta"):
            self._create_class(name)
        self.fake.create(TEMPLATES, {"metadata": {"name": "pair", "namespace": NS},
                                     "spec": {"spec": {"className": "alpha", "count": 2}}})
        for i in range(3):
            self.fake.create(CLAIMS, {"metadata": {"name": f"shared{i}", "namespace": NS},
                                      "spec": {"className": ("alpha", "beta")[i % 2], "count": 1 + i,
                                               "reclaimPolicy": ("Release", "Retain")[i % 2]}})

        if self.rng.random() < 0.7:
            self.set_budget("team-a", {"alpha": self.rng.randint(2, 8), "*": self.rng.randint(4, 14)})

    def set_budget(self, name: str, limits: Mapping[str, int] | None) -> None:
        """Create, replace or (None) delete a GPUBudget of NS."""
        old = self.fake.get(BUDGETS, NS, name)
        if limits is None:
            if old is not None:
                self.fake.delete(BUDGETS, NS, name)
            return
        spec = {"limits": [{"className": c, "gpus": n} for c, n in limits.items()]}
        if old is None:
            self.fake.create(BUDGETS, {"metadata": {"name": name, "namespace": NS}, "spec": spec})
        else:
            old["spec"] = spec
            self.fake.update(BUDGETS, old)

    def change_budget(self) -> None:
        roll = self.rng.random()
        limits = None if roll < 0.2 else {"alpha": self.rng.randint(0, 10), "*": self.rng.randint(0, 16)}
        self.note(f"admin sets budget team-a to {limits}")
        self.set_budget("team-a", limits)

    def held_in_namespace(self, covers: Callable[[str], bool]) -> int:
        held = 0
        for c in self.fake.list(CLAIMS).items:
            st = c.get("status") or {}
            if c["metadata"]["namespace"] == NS and covers(c["spec"]["className"]) and st.get("nodeName") \
                    and (st.get("phase") == "Bound" or (st.get("phase") == "Lost" and st.get("reservedFor"))):
                held += c["spec"]["count"]
        return held

    def budgets_seen(self, ctl: Controller) -> None:
        """The controller's budget informer delivered: from now on its
        decisions use these limits; what it had in flight may still land."""
        seen: dict[tuple[str, str], int] = {}
        for obj in ctl.informers[BUDGETS].store.list():
            info = BudgetInfo.from_api(obj)
            for limit in info.limits:
                seen[(info.name, limit.class_name)] = limit.gpus
        for key, gpus in seen.items():
            if self._limits_seen.get(key) == gpus and key in self.ceilings:
                continue
            cls = key[1]
            covers: Callable[[str], bool] = (lambda c: True) if cls == "*" else (lambda c: c == cls)
            flying = sum(e.count for e in ctl.view.inflight if e.namespace == NS and covers(e.class_name))
            # A process still in its start wait decides nothing, and what the
            # dead one sent (in no in-flight map; decided from what it saw of
            # the budgets, perhaps nothing) may still land: no lower.
            floor = 0
            if ctl.decides_from is not None:
                floor = max(self.ceilings.get(key, 0),
                            self.held_in_namespace(covers) + flying + self.late_binds(covers))
            self.ceilings[key] = max(gpus, self.held_in_namespace(covers) + flying, floor)
        for key in set(self.ceilings) - set(seen):
            del self.ceilings[key]
        self._limits_seen = seen

    def _node_object(self, name: str, gpus: int) -> Obj:
        """Even nodes offer RESOURCE2 too, as many as RESOURCE."""
        i = int(name[1:]) if name[1:].isdigit() else 0
        allocatable = {RESOURCE: str(gpus), **({RESOURCE2: str(gpus)} if i % 2 == 0 else {})}
        return {"metadata": {"name": name, "labels": {"pool": "a" if i % 2 == 0 else "b"}},
                "status": {"allocatable": allocatable,
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    def late_binds(self, covers: Callable[[str], bool]) -> int:
        """GPUs of NS that binds still on the server (late writes) would hold."""
        total = 0
        for w in self.fake.late:
            st = (w.body or {}).get("status") or {}
            spec = (w.body or {}).get("spec") or {}
            if w.method == "update_claim_status" and st.get("phase") == "Bound" and st.get("nodeName") \
                    and (w.body or {}).get("metadata", {}).get("namespace") == NS \
                    and covers(str(spec.get("className"))):
                total += int(spec.get("count") or 0)
        return total

    def _create_class(self, name: str) -> None:
        self.fake.create(CLASSES, {"metadata": {"name": name},
                                   "spec": {"resourceName": RESOURCE}})

    def allocatable(self) -> dict[str, int]:
        return {node: per.get(RESOURCE, 0) for node, per in self.capacity().items()}

    def capacity(self) -> dict[str, dict[str, int]]:
        """node -> resource -> allocatable, as the API server has it."""
        return {n["metadata"]["name"]: {r: parse_quantity(v) or 0
                                        for r, v in ((n.get("status") or {}).get("allocatable") or {}).items()}
                for n in self.fake.list(NODES).items}

    # -- the schedule ------------------------------------------------------------------

    def run(self) -> None:
        for step in range(self.steps):
            self.step(step)
        self.drain()
        self.check_quiet()

    def step(self, step: int) -> None:
        self.t += self.rng.choice((0.0, 0.01, 0.1, 1.0))
        self.land_late_writes()
        self.ctl.queue.promote()
        roll = self.rng.random()
        try:
            if roll < 0.35:
                self.work()
            elif roll < 0.6:
                self.deliver()
            elif roll < 0.8:
                self.user()
            elif roll < 0.93:
                self.cluster_components()
            elif roll < 0.96:
                self.relist()
            elif roll < 0.98:
                self.crash_and_restart(takeover=False)
            else:
                self.crash_and_restart(takeover=True)
        except Crash:
            self.note("crash mid-sync")
            self.restart(takeover=self.rng.random() < 0.5)
        self.check_always(f"step {step}")

    def note(self, what: str) -> None:
        self.log.append(f"t={self.t:.2f} {what}")

    # -- the controller's side ----------------------------------------------------------

    def work(self) -> None:
        if not self.ctl.open():
            return  # waiting out the dead process's writes
        q = self.ctl.queue
        q.promote()
        free = sorted(k for k in q.ready if k not in q.processing)
        if not free:
            return
        key = self.rng.choice(free)
        del q.ready[key]
        self.note(f"sync {key}")
        self.ctl.sync(key)

    def deliver(self) -> None:
        kind = self.rng.choice(KINDS)
        inf = self.ctl.informers[kind]
        n = self.rng.choice((1, 1, 2, 5, 50))
        if inf.pending():
            self.note(f"deliver {n} {kind}")
            inf.deliver(n)

    def relist(self) -> None:
        kind = self.rng.choice(KINDS)
        self.note(f"relist {kind}")
        self.ctl.informers[kind].relist()

    def _at_write(self, method: str, body: Obj) -> None:
        """Inside a sync, at one of its writes: what else happens meanwhile."""
        if self.depth >= 2:
            return
        roll = self.rng.random()
        self.depth += 1
        try:
            if roll < 0.15:
                self.note(f"  at {method}: another worker syncs")
                self.work()
            elif roll < 0.25:
                self.note(f"  at {method}: events arrive")
                self.deliver()
            elif roll < 0.3:
                fate = self.rng.choice(("landed", "not landed", "landing later"))
                self.note(f"  at {method}: answer lost ({fate})")
                self.fake.inject(method, lost_answer(), landed=fate == "landed",
                                 later=fate == "landing later")
            elif roll < 0.31 and method != "event":
                self.note(f"  at {method}: the process dies")
                raise Crash()
            elif roll < 0.32 and method != "event":
                # Sent: the server has it, and works on it while the process
                # dies and another starts (leader election or not).
                self.note(f"  at {method}: the process dies with the write on the wire")
                self.fake.inject(method, Crash(), landed=False, later=True)
            elif roll < 0.34 and method in _TOUCHED_KIND:
                # Someone else changes the object first (a label): the write's
                # resourceVersion is stale, and the API server answers 409 --
                # with a newer version on its way to the informers, as always.
                kind = _TOUCHED_KIND[method]
                meta = body.get("metadata") or {}
                if self.fake.get(kind, str(meta.get("namespace") or ""), str(meta.get("name"))) is not None:
                    self.note(f"  at {method}: someone else changes the object first (409)")
                    self.fake.patch(kind, str(meta.get("namespace") or ""), str(meta.get("name")),
                                    lambda o: o["metadata"].setdefault("labels", {}).update(
                                        {"sim/touched": str(self.rng.randrange(1000))}))
            elif roll < 0.36:
                self.toggle_cordon()
            elif roll < 0.38:
                self.change_allocatable()
        finally:
            self.depth -= 1

    def land_late_writes(self, *, all_now: bool = False) -> None:
        """Writes whose answers were lost while the server still had them
        land now or never, each within SIM_LATE_LANDING of being sent (the
        API server gives up on a request at its deadline)."""
        for w in list(self.fake.late):
            age = (self.now() - w.sent_at).total_seconds()
            if all_now or age >= SIM_LATE_LANDING or self.rng.random() < 0.05:
                land = self.rng.random() < 0.7
                self.note(f"late {w.method} (sent at {age:.2f}s ago) {'lands' if land else 'never lands'}")
                self.fake.resolve_late(w, land)

    def crash_and_restart(self, takeover: bool) -> None:
        self.note("crash" if not takeover else "leader change")
        self.restart(takeover)

    def restart(self, takeover: bool) -> None:
        """A new process (or a standby taking over): its caches start from
        a list; a standby's may lag behind the old leader's last writes,
        which its catch-up must count.

        A standby taking over: the dead leader's late writes land (or not)
        before it lists, since every write of a leader carries a server
        deadline before its Lease could be taken over. A new process without
        leader election: they land (or not) at any time, also after it has
        listed, but before its start wait ends (`restart_wait`, the writes'
        server deadline and a margin: app.EARLIER_WRITES_WINDOW); it decides
        nothing until then, and lists claims once more."""
        self.fake.clear_faults()
        before = dict(self.ceilings) if not takeover else {}
        if takeover:
            self.land_late_writes(all_now=True)
        else:
            for w in self.fake.late:  # now land within the wait, whatever their age
                object.__setattr__(w, "sent_at", self.now() - timedelta(
                    seconds=SIM_LATE_LANDING - self.restart_wait * self.rng.random()))
        new = Controller(self)
        if takeover:
            # The standby's caches were filled some time ago: replay only
            # part of the log before it starts, then it lists claims once.
            for kind, inf in new.informers.items():
                backlog = len(self.fake.events_after(kind, 0))
                inf.deliver(self.rng.randint(0, backlog))
            new.view.catch_up(self.fake.list_claims(), new.ctx.claims.get)
            for inf in new.informers.values():
                for obj in list(inf.store.list()):
                    inf.on_update(obj, obj)  # resync: every key once
        else:
            new.start(wait=self.restart_wait)
        self.ctl = new
        # Budgets bind the new process as its cache shows them (a lagging
        # standby may not show one yet; see docs/design.md §4a). What the
        # dead process decided may still land during a new process's start
        # wait: its ceilings stand until then.
        self._limits_seen = {}
        self.budgets_seen(new)
        for key, ceiling in before.items():
            if key in self.ceilings:
                self.ceilings[key] = max(self.ceilings[key], ceiling)

    # -- users and other components ----------------------------------------------------------

    def user(self) -> None:
        roll = self.rng.random()
        if roll < 0.08:
            self.create_gang_member()
            return
        roll = self.rng.random()
        if self.contended and 0.68 <= roll < 0.78:
            roll = 0.0  # classes stay: the sets wait for room, not for their class
        if roll < 0.42:
            self.create_pod()
        elif roll < 0.55:
            self.delete_pod()
        elif roll < 0.61:
            self.edit_annotation()
        elif roll < 0.68:
            self.recreate_pod()
        elif roll < 0.74:
            self.toggle_class()
        elif roll < 0.78:
            self.edit_class()
        elif roll < 0.83:
            self.change_budget()
        elif roll < 0.86:
            self.toggle_cordon()
        elif roll < 0.9:
            self.change_allocatable()
        elif roll < 0.92:
            self.recreate_node()
        elif roll < 0.95:
            self.create_claimless_pod()
        elif roll < 0.965:
            self.delete_claim()
        elif roll < 0.97:
            self.edit_annotation(released=True)
        elif roll < 0.985:
            self.toggle_disruption_budget()
        else:
            self.create_gang_member()

    def toggle_disruption_budget(self) -> None:
        """A PodDisruptionBudget that allows no disruption of one running
        pod, or one taken away."""
        budgets = self.fake.disruption_budgets.setdefault(NS, [])
        if budgets and self.rng.random() < 0.5:
            gone = budgets.pop(self.rng.randrange(len(budgets)))
            self.note(f"user deletes PodDisruptionBudget {gone['metadata']['name']}")
            return
        running = [p for p in self._pods() if (p.get("spec") or {}).get("nodeName")]
        if running:
            name = self.rng.choice(running)["metadata"]["name"]
            self.note(f"user protects pod {name} with a PodDisruptionBudget")
            budgets.append({"metadata": {"name": f"pdb-{name}", "namespace": NS},
                            "spec": {"selector": {"matchLabels": {"app": name}}},
                            "status": {"disruptionsAllowed": 0}})

    def _pods(self) -> list[Obj]:
        return self.fake.list(PODS).items

    def create_gang_member(self) -> None:
        """Members of a gang of 2 or 3 pods (inline claims only): all at once
        (a Job's pods), or the next one alone, so that gangs are decided
        incomplete too; sometimes a new gang."""
        self._create_gang_member()
        while self.rng.random() < 0.7 and any(made < size for size, made in self.gangs.values()):
            self._create_gang_member(keep_to_open=True)

    def _create_gang_member(self, keep_to_open: bool = False) -> None:
        open_gangs = [g for g, (size, made) in self.gangs.items() if made < size]
        if not open_gangs or (not keep_to_open and self.rng.random() < 0.3):
            self.gang_counter += 1
            gang = f"g{self.gang_counter}"
            self.gangs[gang] = (self.rng.choice((2, 2, 3)), 0)
        else:
            gang = self.rng.choice(sorted(open_gangs))
        size, made = self.gangs[gang]
        self.gangs[gang] = (size, made + 1)
        entries = [{"name": f"e{i}", "className": self.rng.choice(("alpha", "beta")),
                    "count": self.rng.choice((1, 1, 2))} for i in range(self.rng.choice((1, 1, 2)))]
        name = f"{gang}-m{made}"
        priority = (0, 0, 500)[int(gang[1:]) % 3]
        self.note(f"user creates gang member {name} of {gang} (size {size}) {entries} priority {priority}")
        self.fake.create(PODS, {"metadata": {
            "name": name, "namespace": NS,
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries), api.GANG_ANNOTATION: gang,
                            api.GANG_SIZE_ANNOTATION: str(size)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": gang, "uid": f"{gang}-uid",
                                 "controller": True}]},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                     "containers": [{"name": "c", "image": "x"}], "priority": priority}})

    def create_pod(self, name: str | None = None, owned: bool | None = None) -> None:
        if name is None:
            self.pod_counter += 1
            name = f"p{self.pod_counter}"
        entries: list[dict[str, Any]] = []
        for i in range(self.rng.choice((1, 1, 2, 3))):
            kind = self.rng.random()
            if kind < 0.2:
                entries.append({"name": f"e{i}", "claim": f"shared{self.rng.randrange(3)}"})
            elif kind < 0.4:
                entries.append({"name": f"e{i}", "template": "pair"})
            else:
                entries.append({"name": f"e{i}", "className": self.rng.choice(("alpha", "beta")),
                                "count": self.rng.choice((1, 1, 2, 3, 4))})
        names = [e.get("claim") for e in entries if e.get("claim")]
        if len(names) != len(set(names)):
            return
        meta: Obj = {"name": name, "namespace": NS, "labels": {"app": name},
                     "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries)}}
        if owned if owned is not None else self.rng.random() < 0.7:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                        "uid": "rs-uid", "controller": True}]
        spec: Obj = {"schedulingGates": [{"name": api.SCHEDULING_GATE}],
                     "containers": [{"name": "c", "image": "x"}],
                     "priority": self.rng.choice(CONTENDED_PRIORITIES if self.contended else PRIORITIES)}
        if self.rng.random() < 0.1:
            spec["preemptionPolicy"] = "Never"
        self.note(f"user creates pod {name} {entries} priority {spec['priority']}")
        self.fake.create(PODS, {"metadata": meta, "spec": spec})

    def delete_pod(self) -> None:
        pods = self._pods()
        if pods:
            p = self.rng.choice(pods)
            self.note(f"user deletes pod {p['metadata']['name']}")
            self.fake.delete(PODS, NS, p["metadata"]["name"])

    def recreate_pod(self) -> None:
        """Deleted and created again under its name (a StatefulSet's pod)."""
        pods = self._pods()
        if pods:
            p = self.rng.choice(pods)
            name = p["metadata"]["name"]
            self.note(f"user recreates pod {name}")
            self.fake.delete(PODS, NS, name)
            if self.fake.get(PODS, NS, name) is not None:
                self.fake.finish_pod_deletion(NS, name)
            if self.fake.get(PODS, NS, name) is None:
                self.create_pod(name)

    def edit_annotation(self, released: bool = False) -> None:
        """Drop a claim from a gated pod's annotation, or (`released`) from a
        released one's: what it runs with is what it was released with."""
        gated = [p for p in self._pods() if has_gate(p) != released
                 and api.CLAIMS_ANNOTATION in (p["metadata"].get("annotations") or {})]
        if gated:
            p = self.rng.choice(gated)
            self.note(f"user drops a claim from {'released ' if released else ''}pod {p['metadata']['name']}")

            def drop(pod: Obj) -> None:
                entries = json.loads(pod["metadata"]["annotations"][api.CLAIMS_ANNOTATION])
                if len(entries) > 1:
                    entries.pop(0)
                pod["metadata"]["annotations"][api.CLAIMS_ANNOTATION] = json.dumps(entries)
            self.fake.patch(PODS, NS, p["metadata"]["name"], drop)

    def toggle_cordon(self) -> None:
        """An admin cordons a node or uncordons it: a set partly bound there
        must move (its first binds may not be seen back yet)."""
        if not self.allocatable():
            return
        name = self.rng.choice(sorted(self.allocatable()))
        node = self.fake.get(NODES, "", name)
        cordoned = not bool((node or {}).get("spec", {}).get("unschedulable"))
        self.note(f"admin {'cordons' if cordoned else 'uncordons'} node {name}")
        self.fake.patch(NODES, "", name, lambda o: o.setdefault("spec", {}).update(unschedulable=cordoned))

    def edit_class(self) -> None:
        """An admin edits a class's resourceName (the CRD allows it) or its
        nodeSelector: what a bound claim holds never changes."""
        name = self.rng.choice(("alpha", "beta"))
        if self.fake.get(CLASSES, "", name) is None:
            return
        if self.rng.random() < 0.6:
            resource = self.rng.choice((RESOURCE, RESOURCE2))
            self.note(f"admin sets class {name}'s resourceName to {resource}")
            self.fake.patch(CLASSES, "", name, lambda c: c["spec"].update(resourceName=resource))
        else:
            pool = self.rng.choice((None, "a", "b"))
            self.note(f"admin sets class {name}'s nodeSelector to pool={pool}")
            self.fake.patch(CLASSES, "", name, lambda c: c["spec"].update(
                nodeSelector={} if pool is None else {"pool": pool}))

    def change_allocatable(self) -> None:
        """The device plugin reports another count: lower (to 0 too) or back."""
        if not self.capacity():
            return
        name = self.rng.choice(sorted(self.capacity()))
        i = int(name[1:])
        base = self.nodes[i] if i < len(self.nodes) else 4
        gpus = self.rng.choice((0, max(base - 2, 0), base, base))
        self.note(f"node {name}'s allocatable becomes {gpus}")

        def change(node: Obj) -> None:
            for r in node["status"]["allocatable"]:
                node["status"]["allocatable"][r] = str(gpus)
        self.fake.patch(NODES, "", name, change)

    def recreate_node(self) -> None:
        """A node deleted (its claims' node is gone) and, most times, back."""
        if not self.capacity():
            return
        name = self.rng.choice(sorted(self.capacity()))
        self.note(f"node {name} deleted")
        self.fake.delete(NODES, "", name)
        if self.rng.random() < 0.7:
            i = int(name[1:])
            self.note(f"node {name} created again")
            self.fake.create(NODES, self._node_object(name, self.nodes[i] if i < len(self.nodes) else 4))

    def create_claimless_pod(self) -> None:
        """kube-scheduler runs a pod that requests GPUs without claims on a
        node where, as things are, it fits (the controller counts it)."""
        gpus = self.rng.choice((1, 2))
        used = used_capacity(self.fake.list(CLAIMS).items, self._pods(),
                             {c["metadata"]["name"]: c["spec"]["resourceName"]
                              for c in self.fake.list(CLASSES).items}).get(RESOURCE, {})
        fits = [n for n, per in sorted(self.capacity().items())
                if per.get(RESOURCE, 0) - used.get(n, 0) >= gpus]
        if not fits:
            return
        self.pod_counter += 1
        name = f"plain{self.pod_counter}"
        node = self.rng.choice(fits)
        self.note(f"scheduler runs pod {name} without claims ({gpus} GPUs) on {node}")
        self.fake.create(PODS, {"metadata": {"name": name, "namespace": NS}, "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {RESOURCE: str(gpus)},
                                                       "limits": {RESOURCE: str(gpus)}}}]}})

    def delete_claim(self) -> None:
        """A user deletes a claim: it goes once nothing reserves it."""
        claims = self.fake.list(CLAIMS).items
        if claims:
            c = self.rng.choice(claims)
            self.note(f"user deletes claim {c['metadata']['name']}")
            self.fake.delete(CLAIMS, NS, c["metadata"]["name"])

    def toggle_class(self) -> None:
        name = self.rng.choice(("alpha", "beta"))
        if self.fake.get(CLASSES, "", name) is None:
            self.note(f"admin recreates class {name}")
            self._create_class(name)
        else:
            self.note(f"admin deletes class {name}")
            self.fake.delete(CLASSES, "", name)

    def cluster_components(self) -> None:
        """kube-scheduler, kubelet and the garbage collector."""
        pods = [p for p in self._pods() if not has_gate(p)]
        roll = self.rng.random()
        if roll < 0.15:
            self.fake.collect_garbage()
            return
        if not pods:
            return
        p = self.rng.choice(pods)
        name, spec = p["metadata"]["name"], p["spec"]
        pinned = (p["metadata"].get("annotations") or {}).get(api.PLACED_NODE_ANNOTATION)
        if p["metadata"].get("deletionTimestamp"):
            if p["metadata"]["uid"] in self.stuck:
                return  # its termination never ends (a stuck finalizer, a dead kubelet)
            self.note(f"kubelet stops pod {name}")
            self.fake.finish_pod_deletion(NS, name)
        elif not spec.get("nodeName") and pinned:
            if roll < 0.85:
                self.note(f"scheduler binds pod {name} to {pinned}")
                self.fake.bind_pod(NS, name, pinned)
            else:
                self.note(f"scheduler refuses pod {name}")
                self.fake.mark_unschedulable(NS, name, "0/4 nodes are available: fake")
        elif spec.get("nodeName"):
            phase = (p.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return  # a finished pod never runs again (seed 7155 made one Running again)
            if phase != "Running":
                self.fake.set_pod_phase(NS, name, "Running")
            elif roll < (0.2 if self.contended else 0.5):
                self.note(f"pod {name} succeeds")
                self.fake.set_pod_phase(NS, name, "Succeeded")

    # -- draining ------------------------------------------------------------------------

    def drain(self) -> None:
        """No more users: deliver everything, run every key and timer, until
        nothing changes."""
        self.fake.before_write = None
        self.fake.clear_faults()
        self.land_late_writes(all_now=True)
        # One key per round: a longer run leaves more objects, and so more
        # keys, to settle (at 1,000 steps some seeds needed more than 400).
        rounds = max(400, 2 * self.steps)
        audited = False
        for _ in range(rounds):
            moved = False
            for inf in self.ctl.informers.values():
                if inf.pending():
                    inf.deliver(10_000)
                    moved = True
            self.fake.collect_garbage()
            for p in self._pods():
                if p["metadata"].get("deletionTimestamp"):
                    self.fake.finish_pod_deletion(NS, p["metadata"]["name"])
                    moved = True
            q = self.ctl.queue
            q.promote()
            if q.ready:
                key = sorted(q.ready)[0]
                del q.ready[key]
                self.note(f"drain: sync {key}")
                self.ctl.sync(key)
                moved = True
            elif not moved:
                # The in-flight audit comes back for good: it does not keep
                # the run from settling, but runs once more at the end,
                # late enough for every entry to be old.
                q.delayed.pop(AUDIT_INFLIGHT, None)
                due = q.next_due()
                if due is None or due > self.t + 120:
                    if all(not inf.pending() for inf in self.ctl.informers.values()):
                        if audited:
                            return
                        audited = True
                        self.t += AUDIT_MIN_AGE + 1.0
                        self.note("drain: sync " + AUDIT_INFLIGHT)
                        self.ctl.sync(AUDIT_INFLIGHT)
                else:
                    self.t = max(self.t, due)
            self.check_always("draining")
        raise InvariantBroken(f"the run did not settle in {rounds} rounds:\n" + self.trace())

    # -- invariants -----------------------------------------------------------------------

    def trace(self) -> str:
        return f"seed {self.seed}; last steps:\n  " + "\n  ".join(self.log[-25:])

    def held_per_node(self) -> dict[tuple[str, str], int]:
        """(node, resource) -> GPUs claims hold there on the server: under the
        resource recorded at bind (or, unrecorded, their class's now); one
        whose resource nothing tells counts under every resource of its node."""
        classes = {c["metadata"]["name"]: c["spec"].get("resourceName") or RESOURCE
                   for c in self.fake.list(CLASSES).items}
        capacity = self.capacity()
        held: dict[tuple[str, str], int] = {}
        for c in self.fake.list(CLAIMS).items:
            st = c.get("status") or {}
            if st.get("nodeName") and (st.get("phase") == "Bound"
                                       or (st.get("phase") == "Lost" and st.get("reservedFor"))):
                node = st["nodeName"]
                resource = st.get("resourceName") or classes.get(c["spec"]["className"])
                for r in [resource] if resource else list(capacity.get(node, {})):
                    held[(node, r)] = held.get((node, r), 0) + c["spec"]["count"]
        return held

    def check_always(self, where: str) -> None:
        claims = self.fake.list(CLAIMS).items
        pods = {(p["metadata"]["name"]): p for p in self._pods()}
        held_at = self.held_per_node()
        # I1: GPUs held per node and resource <= allocatable -- the one the
        # controller's view shows, or, where it saw it lowered below what was
        # held and in flight then, that (a bind decided before it sees the
        # change may land after it; nothing decided after it may add).
        seen_nodes = self.ctl.view.cluster().nodes
        waiting = self.ctl.decides_from is not None
        flying: dict[tuple[str, str], int] = {}
        for e in self.ctl.view.inflight:
            flying[(e.node, e.resource)] = flying.get((e.node, e.resource), 0) + e.count
        pairs = set(held_at) | {(n, r) for n, info in seen_nodes.items() for r in info.allocatable}
        for key in sorted(pairs):
            node, resource = key
            info = seen_nodes.get(node)
            seen = info.allocatable.get(resource, 0) if info is not None else 0
            now_held = held_at.get(key, 0)
            if self._alloc_seen.get(key) != seen or key not in self.node_ceilings:
                self.node_ceilings[key] = max(seen, now_held + flying.get(key, 0),
                                              self.node_ceilings.get(key, 0) if waiting else 0)
                self._alloc_seen[key] = seen
            elif waiting:
                # What the dead process sent may still land: nothing is
                # decided meanwhile, and its writes are in no in-flight map.
                self.node_ceilings[key] = max(seen, self.node_ceilings[key])
            else:
                self.node_ceilings[key] = max(seen, min(self.node_ceilings[key],
                                                        now_held + flying.get(key, 0)))
            if now_held > self.node_ceilings[key]:
                raise InvariantBroken(f"I1 at {where}: node {node} has {now_held} {resource} bound of "
                                      f"{self.node_ceilings[key]} (allocatable seen: {seen})\n" + self.trace())
        # What keeps I1 under lag: the controller never counts fewer GPUs on
        # a node than claims hold there on the server (its informer's view
        # plus what it has in flight), or it could place more there. Not
        # while a new process waits out the dead one's writes: it decides
        # nothing until its catch-up list.
        if self.ctl.decides_from is None:
            counted = self.ctl.view.used()
            for (node, resource), n in held_at.items():
                if counted.get(resource, {}).get(node, 0) < n:
                    raise InvariantBroken(
                        f"undercount at {where}: node {node} has {n} {resource} bound, the controller "
                        f"counts {counted.get(resource, {}).get(node, 0)}\n" + self.trace())
        self.check_gangs(where)
        # Budgets: never more held under a limit than its ceiling.
        for (budget, cls), ceiling in self.ceilings.items():
            held = self.held_in_namespace((lambda c: True) if cls == "*" else (lambda c: c == cls))
            if held > ceiling:
                raise InvariantBroken(f"budget at {where}: GPUBudget {budget} limit {cls} allows "
                                      f"{ceiling}, {held} held\n" + self.trace())
        # I2: one pod per claim, a pod that names it; a template claim only its owner.
        for c in claims:
            refs = (c.get("status") or {}).get("reservedFor") or []
            name = c["metadata"]["name"]
            if len(refs) > 1:
                raise InvariantBroken(f"I2 at {where}: claim {name} reserved by {refs}\n" + self.trace())
            for ref in refs:
                owner = next((o for o in c["metadata"].get("ownerReferences") or ()
                              if o.get("controller")), None)
                if owner is not None and owner.get("uid") != ref["uid"]:
                    raise InvariantBroken(f"I2 at {where}: template claim {name} of {owner['name']} "
                                          f"reserved by {ref}\n" + self.trace())
                pod = pods.get(ref["name"])
                if pod is not None and pod["metadata"]["uid"] == ref["uid"] and has_gate(pod) \
                        and name not in named_claims(pod) and self.depth == 0 and where == "quiet":
                    raise InvariantBroken(f"I2 at {where}: claim {name} reserved by gated pod "
                                          f"{ref['name']} that does not name it\n" + self.trace())

    def _on_evict(self, namespace: str, name: str, uid: str) -> None:
        """The Eviction API accepted an eviction: what was evicted, by which
        sync, and the claims reserving it then. Some victims never finish
        terminating (until the drain)."""
        pod = self.fake.get(PODS, namespace, name)
        claims = [c for c in self.fake.list(CLAIMS).items
                  if any(r.get("uid") == uid for r in (c.get("status") or {}).get("reservedFor") or ())]
        self.evictions.append((self.syncing[-1] if self.syncing else "", pod or {}, claims))
        self.note(f"  eviction of pod {name}")
        if self.rng.random() < 0.1:
            self.stuck.add(uid)
            self.note(f"  pod {name} will not finish terminating")

    def check_preemption(self, key: str, since: int) -> None:
        """I6, after each sync that evicted: every victim was placed by the
        controller (it released it to that node), of lower priority
        than the preemptor (a gang's: its members' highest), taken with its
        whole gang; never protected by a budget allowing no disruption;
        and, for one pod's set, the set fits on the victims' node once
        every pod going there (evicted or terminating) is gone."""
        evictions = [e for e in self.evictions[-(len(self.fake.evicted) - since):] if e[0] == key] \
            if len(self.fake.evicted) > since else []
        if not evictions:
            return
        ns, _, name = key.partition(":")[2].partition("/")
        preemptor = self.fake.get(PODS, ns, name)
        if preemptor is None:
            return
        gang = (preemptor["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION)
        group = [p for p in self._pods()
                 if gang and (p["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION) == gang] \
            or [preemptor]
        priority = max(int((p.get("spec") or {}).get("priority") or 0) for p in group)
        pods = self._pods()
        for _, victim, claims in evictions:
            vname = victim["metadata"]["name"]
            vnode = (victim.get("spec") or {}).get("nodeName")
            # Placed by the controller: released by it to this node. (Its
            # claims may have been let go meanwhile -- an annotation edited
            # after release -- by a write racing the eviction: the
            # controller confirms them live just before, not atomically.)
            placed_on = (victim["metadata"].get("annotations") or {}).get(api.PLACED_NODE_ANNOTATION)
            if placed_on != vnode:
                raise InvariantBroken(f"I6: {key} evicted {vname}, which gpuclaimctl did not place on its node "
                                      f"{vnode}\n" + self.trace())
            if int((victim.get("spec") or {}).get("priority") or 0) >= priority:
                raise InvariantBroken(f"I6: {key} (priority {priority}) evicted {vname} of priority "
                                      f"{victim['spec'].get('priority')}\n" + self.trace())
            vgang = (victim["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION)
            if vgang:
                for p in pods:
                    if (p["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION) == vgang and \
                            (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp") \
                            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                        raise InvariantBroken(f"I6: {key} evicted {vname} of gang {vgang} but not its member "
                                              f"{p['metadata']['name']}\n" + self.trace())
        if gang:
            return
        claims_now = self.fake.list(CLAIMS).items
        by_name = {c["metadata"]["name"]: c for c in claims_now}
        need = self._set_need(preemptor, by_name)
        if need is None:
            return  # it may rightly not be placeable now (a class deleted since, say)
        classes = {c["metadata"]["name"]: str(c["spec"].get("resourceName") or RESOURCE)
                   for c in self.fake.list(CLASSES).items}
        need_r: dict[str, int] = {}
        for cls, n in need.items():
            need_r[classes[cls]] = need_r.get(classes[cls], 0) + n
        # The node the plan chose: the one its nomination holds GPUs on. (A
        # victim's gang is taken whole, so the first eviction may be of a
        # member on another node: seed 5035. And a victim taken for the
        # namespace's budget frees it wherever it runs: the set may go to
        # another node than the victims': seed 10197.) A plan taking no new
        # GPUs (its claims kept where they are) holds none.
        nominated = self.ctl.view.nominations.get(preemptor["metadata"]["uid"])
        if nominated is None:
            raise InvariantBroken(f"I6: {key} evicted, but holds nothing for itself\n" + self.trace())
        held_on = {n for per in nominated.usage.values() for n in per}
        if not held_on:
            return
        if len(held_on) != 1:
            raise InvariantBroken(f"I6: {key}, one pod's set, holds GPUs on {sorted(held_on)}\n" + self.trace())
        node = next(iter(held_on))
        # Terminating or finished: their claims are let go without an eviction.
        going = {p["metadata"]["uid"] for p in pods if p["metadata"].get("deletionTimestamp")
                 or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")}
        alive = {p["metadata"]["uid"] for p in pods}
        stays: dict[str, int] = {}
        for c in claims_now:
            st = c.get("status") or {}
            if st.get("nodeName") != node or st.get("phase") not in ("Bound", "Lost"):
                continue
            refs = [r.get("uid") for r in st.get("reservedFor") or ()]
            owner = next((o.get("uid") for o in c["metadata"].get("ownerReferences") or () if o.get("controller")), None)
            frees = refs and all(u in going or u not in alive for u in refs) and (
                c["spec"].get("reclaimPolicy") != "Retain" or owner in refs)
            if not frees:
                r = str(st.get("resourceName") or classes.get(c["spec"]["className"], RESOURCE))
                stays[r] = stays.get(r, 0) + int(c["spec"]["count"])
        for e in self.ctl.view.inflight:
            if e.node == node and self.fake.get(CLAIMS, e.namespace, e.name) is not None and \
                    (by_name.get(e.name, {}).get("status") or {}).get("nodeName") != node:
                stays[e.resource] = stays.get(e.resource, 0) + e.count
        alloc = self.capacity().get(str(node), {})
        short = {r: n for r, n in need_r.items() if alloc.get(r, 0) - stays.get(r, 0) < n}
        if short:
            raise InvariantBroken(f"I6: {key} evicted {[e[1]['metadata']['name'] for e in evictions]} on "
                                  f"{node}, but its set {need_r} does not fit there once they go "
                                  f"(allocatable {alloc}, staying {stays})\n" + self.trace())

    def check_gangs(self, where: str) -> None:
        """I5: no gang is ever partly released. The step a gang's first member
        is released, every other member is released or has every claim it
        names Bound and reserved for it (the decision's binds all come
        before its releases). A member replacing one refused after that is
        placed alone (the README's gang section)."""
        claims = {c["metadata"]["name"]: c for c in self.fake.list(CLAIMS).items}
        by_gang: dict[str, list[Obj]] = {}
        for p in self._pods():
            gang = (p["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION)
            if gang in self.gangs and not p["metadata"].get("deletionTimestamp"):
                by_gang.setdefault(gang, []).append(p)
        for gang, members in sorted(by_gang.items()):
            if gang in self.gangs_released or all(has_gate(p) for p in members):
                continue
            self.gangs_released.add(gang)
            for p in members:
                if not has_gate(p):
                    continue
                for name in named_claims(p):
                    st = (claims.get(name) or {}).get("status") or {}
                    if st.get("phase") != "Bound" or [r.get("uid") for r in st.get("reservedFor") or ()] != \
                            [p["metadata"]["uid"]]:
                        raise InvariantBroken(f"I5 at {where}: gang {gang} partly released: member "
                                              f"{p['metadata']['name']} gated, its claim {name} {st}\n" + self.trace())

    def check_quiet(self) -> None:
        """I4 once the run is drained."""
        self.check_always("quiet")
        claims = self.fake.list(CLAIMS).items
        pods = {p["metadata"]["uid"]: p for p in self._pods()}
        for c in claims:
            for ref in (c.get("status") or {}).get("reservedFor") or []:
                pod = pods.get(ref["uid"])
                if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    raise InvariantBroken(f"I4: claim {c['metadata']['name']} still reserved for "
                                          f"{ref} (gone or finished)\n" + self.trace())
        # The controller's usage equals a recount from a fresh list.
        classes = {c["metadata"]["name"]: c["spec"]["resourceName"] for c in self.fake.list(CLASSES).items}
        recount = _normalized(used_capacity(claims, list(pods.values()), classes))
        mine = _normalized(self.ctl.view.used())
        if mine != recount or len(self.ctl.view.inflight):
            raise InvariantBroken(f"I4: usage {mine} (in flight: {list(self.ctl.view.inflight)}) != "
                                  f"recount {recount}\n" + self.trace())
        # Every gated pod whose set fits somewhere is released.
        capacity = self.capacity()
        class_objs = {c["metadata"]["name"]: c for c in self.fake.list(CLASSES).items}
        free = {node: {r: n - recount.get(r, {}).get(node, 0) for r, n in per.items()}
                for node, per in capacity.items()}
        labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in self.fake.list(NODES).items}
        for node in self.fake.list(NODES).items:  # a cordoned node takes nothing new
            if (node.get("spec") or {}).get("unschedulable"):
                free.pop(node["metadata"]["name"], None)
        by_name = {c["metadata"]["name"]: c for c in claims}
        gangs: dict[str, list[Obj]] = {}

        def where_fits(need: Mapping[str, int], free: Mapping[str, Mapping[str, int]]) -> str | None:
            need_r: dict[str, int] = {}
            for cls, n in need.items():
                r = str(class_objs[cls]["spec"].get("resourceName") or RESOURCE)
                need_r[r] = need_r.get(r, 0) + n
            for node, per in sorted(free.items()):
                selects = all(labels[node].get(k) == v for cls in need
                              for k, v in (class_objs[cls]["spec"].get("nodeSelector") or {}).items())
                if selects and all(per.get(r, 0) >= n for r, n in need_r.items()):
                    return node
            return None

        for pod in pods.values():
            if not has_gate(pod):
                continue
            gang = (pod["metadata"].get("annotations") or {}).get(api.GANG_ANNOTATION)
            if gang is not None:
                gangs.setdefault(gang, []).append(pod)
                continue
            need = self._set_need(pod, by_name)
            if need is None:
                continue
            node = where_fits(need, free)
            if node is not None:
                raise InvariantBroken(f"I4: gated pod {pod['metadata']['name']} needs {need}; "
                                      f"free on {node}: {free[node]}\n" + self.trace())
        # A gang none of whose members is released, all there, whose sets all
        # fit at once (largest first, as decide.gang tries them), is released.
        for gang, members in sorted(gangs.items()):
            size = self.gangs.get(gang, (0, 0))[0]
            if gang in self.gangs_released or len(members) != size:
                continue
            needs = [self._set_need(m, by_name) for m in members]
            if any(n is None for n in needs):
                continue
            total: dict[str, int] = {}
            for n in needs:
                for cls, k in (n or {}).items():
                    total[cls] = total.get(cls, 0) + k
            if any(limit.covers(cls) and self.held_in_namespace(limit.covers) +
                   sum(k for c, k in total.items() if limit.covers(c)) > limit.gpus
                   for obj in self.fake.list(BUDGETS).items for limit in BudgetInfo.from_api(obj).limits
                   for cls in total):
                continue  # its budget rightly holds it back, as a whole
            scratch = {node: dict(per) for node, per in free.items()}
            placed_all = True
            for n in sorted((x or {} for x in needs), key=lambda x: -sum(x.values())):
                node = where_fits(n, scratch)
                if node is None:
                    placed_all = False
                    break
                for cls, k in n.items():
                    r = str(class_objs[cls]["spec"].get("resourceName") or RESOURCE)
                    scratch[node][r] = scratch[node].get(r, 0) - k
            if placed_all:
                raise InvariantBroken(f"I4: gang {gang}'s {size} sets {needs} all fit at once; free: {free}\n"
                                      + self.trace())

    def _set_need(self, pod: Obj, claims: Mapping[str, Obj]) -> dict[str, int] | None:
        """GPUs per class the pod's set still needs on one node, if it could
        be placed at all (its claims exist, are not another pod's, their
        classes exist); None if it may rightly wait for another reason."""
        names = named_claims(pod)
        if not names:
            return None
        classes = {c["metadata"]["name"] for c in self.fake.list(CLASSES).items}
        for name in names:
            c = claims.get(name)
            if c is None or c["spec"]["className"] not in classes or c["metadata"].get("deletionTimestamp"):
                return None
            refs = (c.get("status") or {}).get("reservedFor") or []
            if any(r["uid"] != pod["metadata"]["uid"] for r in refs):
                return None
            owner = next((o for o in c["metadata"].get("ownerReferences") or () if o.get("controller")), None)
            if owner is not None and owner.get("uid") != pod["metadata"]["uid"]:
                return None
            if (c.get("status") or {}).get("phase") == "Bound":
                return None  # anchored: may rightly wait for its node
        if any((c.get("status") or {}).get("rejectedNodes") for c in claims.values()):
            return None  # a rejection may rightly keep it off the only node with room
        by_class: dict[str, int] = {}
        for name in names:
            by_class[claims[name]["spec"]["className"]] = by_class.get(
                claims[name]["spec"]["className"], 0) + claims[name]["spec"]["count"]
        for obj in self.fake.list(BUDGETS).items:
            for limit in BudgetInfo.from_api(obj).limits:
                asks = sum(n for c, n in by_class.items() if limit.covers(c))
                if asks and self.held_in_namespace(limit.covers) + asks > limit.gpus:
                    return None  # its budget rightly holds it back
        return by_class


def _normalized(usage: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    out = {r: {n: c for n, c in per.items() if c} for r, per in usage.items()}
    return {r: per for r, per in out.items() if per}


__all__ = ["Sim", "InvariantBroken"]
