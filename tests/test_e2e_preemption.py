"""Preemption end to end on the real plane (DESIGN.md §4d, issue 46 item 6):
a set or gang of higher priority that fits nowhere evicts, through the
Eviction API, the cheapest pods of lower priority this controller placed on
one node (the fewest, then the lowest priorities, then the youngest; gangs
whole), holds the GPUs they free for itself, and runs there once they are
gone; a PodDisruptionBudget that forbids it sends it elsewhere or makes it
wait, evicting nothing; preemptionPolicy Never never preempts.

A Recorder watches the namespace's pods and GPUClaims from before the first
pod exists (every revision, in etcd's order) and lists the claims every
SAMPLE_EVERY seconds: no revision and no sample may show a node with more
GPUs Bound than it has, and the watch shows every pod that was ever
evicted (a DisruptionTarget condition, a deletion), however briefly.

How victims end on kwok nodes. The plane's kwok stages
(gpuclaimctl/controlplane/kwok-stages.yaml, `pod-delete`) delete a pod at
once, with grace 0, as soon as it has a deletionTimestamp, and the API
server itself deletes at once a pod whose terminationGracePeriodSeconds is
0 (these pods'): an evicted pod is gone within milliseconds, where a
kubelet would stop its containers over the grace period. The controller's
DisruptionTarget condition naming the preemptor is written after the
eviction (which writes its own, EvictionByEvictionAPI), so on a pod gone
that fast it never lands; only the Preempted event names the preemptor
(the gang story shows this path). The first story's notebooks therefore
carry a finalizer of the test's, lifted once the test has looked: the part
of a kubelet taking its grace period, so the victims terminate for a while
as real ones do, while the preemptor says Preempting and the GPUs are held
for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client, watch

from gpuclaimctl.client import kube
from gpuclaimctl.model import api
from tests.helpers import wait_for
from tests.test_e2e import CLAIMS, Cluster, node_name

pytestmark = pytest.mark.plane

Nodes = Callable[..., dict[str, Any]]
SAMPLE_EVERY = 0.1
GPUS = 8  # per node
# The finalizer standing for a kubelet's grace period (see the module docstring).
GRACE_FINALIZER = "e2e.gpuclaimctl.io/kubelet-grace"
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTED_BY_US = "PreemptionByGPUClaimController"
PRIORITY = "/apis/scheduling.k8s.io/v1/priorityclasses"


# -- what the recorder sees ---------------------------------------------------------------------


@dataclass
class PodTrace:
    uid: str
    node: str | None = None
    gated: bool = True
    phase: str = ""
    scheduled: bool = False  # PodScheduled True: kube-scheduler bound it
    deleting_rv: int | None = None
    deleted_rv: int | None = None
    # Every (reason, message) of a DisruptionTarget condition it showed.
    disruptions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def evicted(self) -> bool:
        return bool(self.disruptions) or self.deleting_rv is not None or self.deleted_rv is not None


@dataclass
class ClaimTrace:
    count: int
    phase: str | None = None
    node: str | None = None
    bound_rv: int | None = None  # first revision Bound
    # Every distinct Waiting (revision, reason, message) it said, in order.
    waits: list[tuple[int, str, str]] = field(default_factory=list)

    def said(self, reason: str) -> list[tuple[int, str, str]]:
        return [w for w in self.waits if w[1] == reason]


class Recorder:
    """The namespace's pods and claims as etcd held them, revision by
    revision (two watches), and as a user polling the claims sees them."""

    def __init__(self, api_client: client.ApiClient, namespace: str, allocatable: Mapping[str, int]) -> None:
        self.config = api_client.configuration
        self.api = client.ApiClient(self.config)
        self.ns = namespace
        self.allocatable = dict(allocatable)
        self.pods: dict[str, PodTrace] = {}
        self.claims: dict[str, ClaimTrace] = {}
        self.overcommit: list[str] = []
        # Every change the watches showed: (revision, what), for a failure's story.
        self.history: list[tuple[int, str]] = []
        self.revisions = 0  # claim revisions checked
        self.samples = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Recorder:
        rv = kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims")["metadata"][
            "resourceVersion"]
        core = client.CoreV1Api(client.ApiClient(self.config))
        custom = client.CustomObjectsApi(client.ApiClient(self.config))
        self._threads = [
            threading.Thread(target=self._watch, args=(core.list_namespaced_pod, (self.ns,), rv, self._pod),
                             daemon=True, name="preempt-watch-pods"),
            threading.Thread(target=self._watch, args=(custom.list_namespaced_custom_object,
                                                       (api.GROUP, api.VERSION, self.ns, "gpuclaims"), rv,
                                                       self._claim), daemon=True, name="preempt-watch-claims"),
            threading.Thread(target=self._poll, daemon=True, name="preempt-poll")]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            wait_for(self._caught_up, timeout=10,
                     message=lambda: f"the watches to show what the API shows (errors: {self.errors[-3:]})")
        self._stop.set()
        for w in self._watches:
            w.stop()
        self._threads[-1].join(5)

    def _watch(self, list_fn: Callable[..., Any], args: tuple[Any, ...], rv: str,
               record: Callable[[str, Mapping[str, Any]], None]) -> None:
        w = watch.Watch()
        self._watches.append(w)
        try:
            for event in w.stream(list_fn, *args, resource_version=rv, timeout_seconds=600):
                with self._lock:
                    record(event["type"], event["raw_object"])
        except Exception as e:  # noqa: BLE001 -- reported by the checks that need it
            if not self._stop.is_set():
                self.errors.append(f"watch: {type(e).__name__}: {e}")

    def _pod(self, kind: str, p: Mapping[str, Any]) -> None:
        meta, spec, status = p["metadata"], p.get("spec") or {}, p.get("status") or {}
        rv = int(meta["resourceVersion"])
        trace = self.pods.get(meta["name"])
        if trace is None or trace.uid != meta["uid"]:
            trace = self.pods[meta["name"]] = PodTrace(meta["uid"])
        trace.node = spec.get("nodeName")
        trace.gated = any(g.get("name") == api.SCHEDULING_GATE for g in spec.get("schedulingGates") or ())
        trace.phase = str(status.get("phase") or "")
        for c in status.get("conditions") or ():
            if c.get("type") == "PodScheduled" and c.get("status") == "True":
                trace.scheduled = True
            if c.get("type") == DISRUPTION_TARGET and c.get("status") == "True":
                seen = (str(c.get("reason")), str(c.get("message")))
                if seen not in trace.disruptions:
                    trace.disruptions.append(seen)
        if meta.get("deletionTimestamp") and trace.deleting_rv is None:
            trace.deleting_rv = rv
        if kind == "DELETED":
            trace.deleted_rv = rv
        self.history.append((rv, f"pod {meta['name']} {kind.lower()}: node={trace.node} gated={trace.gated} "
                                 f"phase={trace.phase} deleting={bool(meta.get('deletionTimestamp'))}"))

    def _claim(self, kind: str, c: Mapping[str, Any]) -> None:
        meta, status = c["metadata"], c.get("status") or {}
        rv = int(meta["resourceVersion"])
        name = meta["name"]
        trace = self.claims.setdefault(name, ClaimTrace(int((c.get("spec") or {}).get("count") or 0)))
        if kind == "DELETED":
            trace.phase, trace.node = "Deleted", None
        else:
            trace.phase, trace.node = status.get("phase"), status.get("nodeName")
        if trace.phase == "Bound" and trace.bound_rv is None:
            trace.bound_rv = rv
        for x in status.get("conditions") or ():
            if x.get("type") == api.CONDITION_WAITING and x.get("status") == "True":
                said = (str(x.get("reason")), str(x.get("message")))
                if not trace.waits or trace.waits[-1][1:] != said:
                    trace.waits.append((rv, *said))
        self.revisions += 1
        reserved = [x.get("name") for x in status.get("reservedFor") or ()]
        self.history.append((rv, f"claim {name} {kind.lower()}: {trace.phase} on {trace.node} for {reserved}"
                                 f"{' deleting' if meta.get('deletionTimestamp') else ''}"))
        bound = {n: (t.phase, t.node, t.count) for n, t in self.claims.items()}
        self._check(bound, f"revision {rv}")

    def _check(self, claims: Mapping[str, tuple[str | None, str | None, int]], when: str) -> None:
        per: dict[str, int] = {}
        for phase, node, count in claims.values():
            if phase == "Bound" and node:
                per[node] = per.get(node, 0) + count
        for node, n in per.items():
            if n > self.allocatable.get(node, GPUS):
                held = sorted(k for k, (p, nd, _) in claims.items() if p == "Bound" and nd == node)
                self.overcommit.append(f"{when}: {n} GPUs Bound on {node} ({held})")

    def _poll(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                items = kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims")["items"]
            except Exception as e:  # noqa: BLE001 -- a lost sample is reported, not fatal
                self.errors.append(f"poll: {type(e).__name__}: {e}")
            else:
                self.samples += 1
                self._check({c["metadata"]["name"]: ((c.get("status") or {}).get("phase"),
                                                     (c.get("status") or {}).get("nodeName"),
                                                     int(c["spec"]["count"])) for c in items},
                            f"sample {self.samples}")
            self._stop.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - t)))

    def _caught_up(self) -> bool:
        """The watches show the pods and claims the API server lists now."""
        pods = kube.request_json(self.api, "GET", f"/api/v1/namespaces/{self.ns}/pods")["items"]
        claims = kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims")["items"]
        with self._lock:
            live = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
            return all(n in self.pods and self.pods[n].uid == u for n, u in live.items()) \
                and all(t.deleted_rv is not None for n, t in self.pods.items() if n not in live) \
                and all(c["metadata"]["name"] in self.claims
                        and self.claims[c["metadata"]["name"]].phase == (c.get("status") or {}).get("phase")
                        for c in claims)

    # -- questions ------------------------------------------------------------------------------

    def evicted(self) -> list[str]:
        with self._lock:
            return sorted(n for n, t in self.pods.items() if t.evicted)

    def pod(self, name: str) -> PodTrace:
        with self._lock:
            return self.pods[name]

    def claim(self, name: str) -> ClaimTrace | None:
        with self._lock:
            return self.claims.get(name)

    def waiting(self, claim: str) -> str | None:
        """The claim's Waiting reason now, if it waits."""
        with self._lock:
            t = self.claims.get(claim)
            return None if t is None or t.phase == "Bound" or not t.waits else t.waits[-1][1]

    def describe(self) -> str:
        with self._lock:
            lines = [f"pod {n}: node={t.node} gated={t.gated} phase={t.phase} deleting={t.deleting_rv} "
                     f"deleted={t.deleted_rv} disruptions={t.disruptions}" for n, t in sorted(self.pods.items())]
            lines += [f"claim {n}: {t.phase} on {t.node}, waits {[w[1] for w in t.waits]}"
                      for n, t in sorted(self.claims.items())]
        errors = f"\n  recorder errors: {self.errors[-3:]}" if self.errors else ""
        return "\n  " + "\n  ".join(lines) + errors

    def evidence(self) -> str:
        """The state, then what the watches showed from the first eviction
        on, in etcd's order: for a failed assertion about evictions."""
        with self._lock:
            first = min((t.deleting_rv for t in self.pods.values() if t.deleting_rv is not None), default=0)
            story = "\n  ".join(f"{rv}: {what}" for rv, what in sorted(self.history) if rv >= first)
        return self.describe() + f"\n since revision {first}:\n  " + story


# -- making pods of a priority -------------------------------------------------------------------


class Priorities:
    """PriorityClasses of this test (cluster-scoped), deleted after it."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = api_client
        self.made: list[str] = []

    def make(self, name: str, value: int, *, never: bool = False) -> str:
        full = f"{name}-{uuid.uuid4().hex[:6]}"
        body: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                "metadata": {"name": full}, "value": value}
        if never:
            body["preemptionPolicy"] = "Never"
        kube.request(self.api, "POST", PRIORITY, body=body)
        self.made.append(full)
        return full

    def cleanup(self) -> None:
        for name in self.made:
            try:
                kube.request(self.api, "DELETE", f"{PRIORITY}/{name}")
            except kube.ApiError:
                pass


@pytest.fixture
def priorities(api_client: client.ApiClient) -> Iterator[Priorities]:
    p = Priorities(api_client)
    yield p
    p.cleanup()


def gpu_pod(cluster: Cluster, name: str, class_name: str, gpus: int, *, priority_class: str | None = None,
            node: str | None = None, labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None, grace_finalizer: bool = False) -> dict[str, Any]:
    """A gated pod with one inline entry `g` of `gpus` GPUs (its claim is
    `<name>-g`), of a PriorityClass, pinned by nodeSelector to `node`."""
    manifest = cluster.pod_manifest(name, [{"name": "g", "className": class_name, "count": gpus}],
                                    node_selector={"kubernetes.io/hostname": node} if node else None)
    manifest["metadata"]["labels"].update(labels or {})
    manifest["metadata"]["annotations"].update(annotations or {})
    if priority_class:
        manifest["spec"]["priorityClassName"] = priority_class
    if grace_finalizer:
        manifest["metadata"]["finalizers"] = [GRACE_FINALIZER]
    created: dict[str, Any] = kube.request_json(cluster.api, "POST", f"/api/v1/namespaces/{cluster.ns}/pods",
                                                body=manifest)
    return created


def lift_grace(cluster: Cluster, names: list[str] | None = None) -> None:
    """Let the pods go: a kubelet's grace period over."""
    for p in cluster.core.list_namespaced_pod(cluster.ns).items:
        if GRACE_FINALIZER in (p.metadata.finalizers or ()) and (names is None or p.metadata.name in names):
            try:
                cluster.core.patch_namespaced_pod(p.metadata.name, cluster.ns, {"metadata": {"finalizers": None}})
            except client.ApiException as e:
                if e.status != 404:
                    raise


def all_running(cluster: Cluster, where: Mapping[str, str]) -> bool:
    return all(cluster.running_on(pod, node) for pod, node in where.items())


def events_on(cluster: Cluster, reason: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for e in cluster.events(reason):
        out.setdefault(e.involved_object.name, []).append(e)
    return out


def every(events: dict[str, list[Any]], names: list[str]) -> dict[str, list[Any]] | None:
    """`events` once each of `names` has one."""
    return events if set(events) >= set(names) else None


def pdb(cluster: Cluster, name: str, selector: Mapping[str, str], min_available: int) -> None:
    """A PodDisruptionBudget allowing no disruption of the pods it selects,
    once kube-controller-manager has counted them healthy."""
    kube.request(cluster.api, "POST", f"/apis/policy/v1/namespaces/{cluster.ns}/poddisruptionbudgets", body={
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": dict(selector)}}})

    def counted() -> bool:
        got = kube.request_json(cluster.api, "GET",
                                f"/apis/policy/v1/namespaces/{cluster.ns}/poddisruptionbudgets/{name}")
        s = got.get("status") or {}
        return s.get("currentHealthy") == min_available and s.get("disruptionsAllowed") == 0

    wait_for(counted, timeout=30, message=f"the disruption controller to count PodDisruptionBudget {name}")


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str) -> Iterator[Cluster]:
    c = Cluster(api_client, namespace)
    try:
        yield c
    finally:
        lift_grace(c)  # or the namespace never goes
        c.cleanup()


def fill(cluster: Cluster, cls: str, layout: Mapping[str, list[tuple[str, int, str | None]]],
         **kw: Any) -> dict[str, str]:
    """Notebooks as `layout` says (node -> [(name, GPUs, PriorityClass)]),
    each pinned to its node: pod -> node."""
    where = {}
    for node, pods in layout.items():
        for name, gpus, pc in pods:
            gpu_pod(cluster, name, cls, gpus, priority_class=pc, node=node, **kw)
            where[name] = node
    return where


def second_passes(cluster: Cluster, names: Iterable[str]) -> None:
    """creationTimestamp has one-second resolution: a pod made after this
    is younger, to the API (and to preemption), than the pods `names`."""
    newest = max(cluster.core.read_namespaced_pod(n, cluster.ns).metadata.creation_timestamp
                 for n in names).strftime("%Y-%m-%dT%H:%M:%SZ")
    wait_for(lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) > newest, timeout=3, interval=0.02,
             message="the next second")


# -- the stories ---------------------------------------------------------------------------------


def test_a_set_of_higher_priority_evicts_the_cheapest_node_and_runs_there_on_the_gpus_held_for_it(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
    priorities: Priorities,
) -> None:
    """Four full 8-GPU nodes. `old` holds two priority-0 notebooks made a
    second earlier than the rest; `mixed` two of the same age, one at
    priority 100; `young` two priority-0 notebooks, the youngest; `busy`
    three priority-0 notebooks of 4, 2 and 2 GPUs. A set of 8 at priority
    1000 takes the two on `young`: fewer pods than `busy`, lower priorities
    than `mixed`, younger than `old` (whose name comes first). While they
    terminate (a kubelet's grace period, the test's finalizer) its claim
    says Preempting there, and the 8 GPUs are held for it: an older
    priority-0 pod of 4 waiting for room does not get them once they are
    free. It runs there, bound by kube-scheduler; nothing else is evicted;
    no node ever has more GPUs Bound than it has."""
    names = ("old", "mixed", "young", "busy")
    nodes = {n: node_name(gpu_nodes(n, gpus=GPUS, labels=cluster.label)) for n in names}
    cls = cluster.gpu_class("a100")
    high = priorities.make("notebook-high", 100)
    urgent = priorities.make("urgent", 1000)
    rc = run_controller()
    with Recorder(api_client, cluster.ns, {n: GPUS for n in nodes.values()}) as r:
        first = fill(cluster, cls, {nodes["old"]: [("old-1", 4, None), ("old-2", 4, None)],
                                    nodes["mixed"]: [("mixed-1", 4, high), ("mixed-2", 4, None)]},
                     grace_finalizer=True)
        second_passes(cluster, first)
        rest = fill(cluster, cls, {nodes["young"]: [("young-1", 4, None), ("young-2", 4, None)],
                                   nodes["busy"]: [("busy-1", 4, None), ("busy-2", 2, None),
                                                   ("busy-3", 2, None)]}, grace_finalizer=True)
        notebooks = {**first, **rest}
        wait_for(lambda: all_running(cluster, notebooks), timeout=60,
                 message=lambda: "every notebook Running on its node:" + r.describe())
        assert cluster.core.read_namespaced_pod("mixed-1", cluster.ns).spec.priority == 100
        # Older than the preemptor, of lower priority, waiting for room too:
        # it would take 4 of the GPUs the victims free if they were not held.
        gpu_pod(cluster, "late", cls, 4)
        wait_for(lambda: r.waiting("late-g") == "Capacity", timeout=30,
                 message=lambda: "late waiting for Capacity:" + r.describe())
        second_passes(cluster, ["late"])

        gpu_pod(cluster, "train", cls, 8, priority_class=urgent)
        young, victims = nodes["young"], ["young-1", "young-2"]
        wait_for(lambda: all(r.pod(v).deleting_rv for v in victims if v in r.pods), timeout=30,
                 message=lambda: "the pods on young terminating:" + r.describe())
        # While they terminate: the preemptor says why it waits, and where.
        wait_for(lambda: r.waiting("train-g") == "Preempting", timeout=10,
                 message=lambda: "train-g Waiting Preempting:" + r.describe())
        said = cluster.get_claim("train-g") or {}
        cond = next(c for c in said["status"]["conditions"] if c["type"] == api.CONDITION_WAITING)
        assert cond["reason"] == "Preempting" and young in cond["message"], cond
        assert all(f"{cluster.ns}/{v}" in cond["message"] for v in victims), cond
        # The controller's DisruptionTarget (after the Eviction API's own)
        # names the preemptor, and so does a Warning event on each victim.
        preemptor = f"{cluster.ns}/train"
        named = (PREEMPTED_BY_US, f"gpuclaimctl: preempting to accommodate a higher priority pod {preemptor} "
                                  f"(priority 1000) on node {young}")
        wait_for(lambda: all(named in r.pod(v).disruptions for v in victims), timeout=10,
                 message=lambda: "each victim's DisruptionTarget naming train:" + r.describe())
        got = wait_for(lambda: every(events_on(cluster, "Preempted"), victims), timeout=10,
                       message="a Preempted event on each victim")
        assert set(got) == set(victims), got
        for v in victims:
            (e,) = got[v]
            assert e.type == "Warning" and preemptor in e.message and young in e.message, e.message
        # A Normal event says it preempts (the pod's Waiting Warning says so too).
        (told,) = wait_for(lambda: [e for e in events_on(cluster, "Preempting").get("train", ())
                                    if e.type == "Normal"], timeout=10, message="a Preempting event on train")
        assert young in told.message and all(v in told.message for v in victims), told.message
        assert not cluster.read_pod("train").spec.node_name and r.pod("train").gated
        time.sleep(1.0)  # their updates wake it again while they terminate: still only these two
        assert r.evicted() == victims, r.evidence()

        lift_grace(cluster, victims)
        wait_for(lambda: cluster.running_on("train", young), timeout=60,
                 message=lambda: f"train Running on {young}:" + r.describe())
        time.sleep(1.0)  # late had its turn at what came free
    # Released, then bound by kube-scheduler, to the node its claim holds.
    t = r.pod("train")
    assert t.scheduled and not t.gated and t.node == young, t
    claim = r.claim("train-g")
    assert claim is not None and claim.phase == "Bound" and claim.node == young, claim
    waits = [w[1] for w in claim.waits]
    assert waits and waits[-1] == "Preempting" and claim.said("Preempting")[0][0] < (claim.bound_rv or 0), waits
    # The GPUs freed were held for it: late never got them.
    late = r.claim("late-g")
    assert late is not None and late.bound_rv is None and late.waits[-1][1] == "Capacity", late
    assert r.evicted() == victims, "no other pod evicted:" + r.evidence()
    for v in victims:
        assert r.pod(v).deleted_rv is not None, r.describe()
    assert not r.overcommit, "GPUs overcommitted:\n" + "\n".join(r.overcommit[:10])
    assert r.samples > 10 and r.revisions > 20, (r.samples, r.revisions)
    assert rc.metric("gpuclaimctl_preemptions_total", namespace=cluster.ns, priority="1000") == 1
    assert rc.metric("gpuclaimctl_preempted_pods_total", namespace=cluster.ns, priority="1000") == 2
    print(f"preempted {victims} on {young}; {r.revisions} claim revisions, {r.samples} samples, "
          f"none overcommitted")


def test_a_disruption_budget_sends_the_preemptor_to_the_next_node_and_where_all_are_protected_it_waits(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
    priorities: Priorities,
) -> None:
    """`cheap` (two priority-0 notebooks) would be preempted first, but a
    PodDisruptionBudget allows none of its pods to go: the preemptor is told
    PreemptionRefused naming the budget, evicts nothing there, and takes
    `dear` instead (one priority-100 and one priority-0 notebook); `crowded`
    (three notebooks) is left alone. Then a budget covers `crowded`'s
    notebooks too: another preemptor finds every node it could take
    protected (or running its equal) and waits for Capacity, and nothing
    more is evicted."""
    names = ("cheap", "dear", "crowded")
    nodes = {n: node_name(gpu_nodes(n, gpus=GPUS, labels=cluster.label)) for n in names}
    cls = cluster.gpu_class("a100")
    high = priorities.make("notebook-high", 100)
    urgent = priorities.make("urgent", 1000)
    rc = run_controller()
    with Recorder(api_client, cluster.ns, {n: GPUS for n in nodes.values()}) as r:
        notebooks: dict[str, str] = {}
        for node, pods in {"cheap": [("cheap-1", 4, None), ("cheap-2", 4, None)],
                           "dear": [("dear-1", 4, high), ("dear-2", 4, None)],
                           "crowded": [("crowded-1", 4, None), ("crowded-2", 2, None),
                                       ("crowded-3", 2, None)]}.items():
            notebooks |= fill(cluster, cls, {nodes[node]: pods}, labels={"home": node})
        wait_for(lambda: all_running(cluster, notebooks), timeout=60,
                 message=lambda: "every notebook Running on its node:" + r.describe())
        pdb(cluster, "keep-cheap", {"home": "cheap"}, 2)

        gpu_pod(cluster, "train", cls, 8, priority_class=urgent)
        dear = nodes["dear"]
        wait_for(lambda: cluster.running_on("train", dear), timeout=60,
                 message=lambda: f"train Running on {dear}:" + r.describe())
        assert r.evicted() == ["dear-1", "dear-2"], r.evidence()
        (refused,) = wait_for(lambda: events_on(cluster, "PreemptionRefused").get("train"), timeout=10,
                              message="a PreemptionRefused event on train")
        assert refused.type == "Warning" and nodes["cheap"] in refused.message, refused.message
        assert f"PodDisruptionBudget {cluster.ns}/keep-cheap allows 0 disruptions" in refused.message, \
            refused.message
        assert all(not r.pod(n).evicted for n in ("cheap-1", "cheap-2")), r.describe()
        assert rc.metric("gpuclaimctl_preempted_pods_total", namespace=cluster.ns, priority="1000") == 2

        # Every node protected now: cheap and crowded by budgets, dear by
        # train, of the same priority.
        pdb(cluster, "keep-crowded", {"home": "crowded"}, 3)
        gpu_pod(cluster, "train2", cls, 8, priority_class=urgent)
        wait_for(lambda: r.waiting("train2-g") == "Capacity"
                 and len(events_on(cluster, "PreemptionRefused").get("train2", ())) >= 2, timeout=30,
                 message=lambda: "train2 refused on both protected nodes and waiting for Capacity:"
                 + r.describe())
        time.sleep(2.0)  # and it stays so
    said = {e.message for e in events_on(cluster, "PreemptionRefused")["train2"]}
    assert any(nodes["cheap"] in m and "keep-cheap" in m for m in said), said
    assert any(nodes["crowded"] in m and "keep-crowded" in m for m in said), said
    assert r.evicted() == ["dear-1", "dear-2"], "nothing more evicted:" + r.evidence()
    assert all(r.pod(n).deleted_rv is None and not r.pod(n).disruptions
               for n in notebooks if not n.startswith("dear")), r.describe()
    claim = r.claim("train2-g")
    assert claim is not None and claim.bound_rv is None and "Preempting" not in [w[1] for w in claim.waits], claim
    assert r.pod("train2").gated
    assert not r.overcommit, "GPUs overcommitted:\n" + "\n".join(r.overcommit[:10])
    assert rc.metric("gpuclaimctl_preemptions_total", namespace=cluster.ns, priority="1000") == 1


def test_a_gang_of_higher_priority_preempts_whole_gangs_never_some_of_a_gangs_members(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
    priorities: Priorities,
) -> None:
    """Six 8-GPU nodes run three gangs of 2 (each member 8 GPUs, a node of
    its own): `elder` at priority 0, `higher` at priority 100 a second
    later, `younger` at priority 0. A gang of 4 × 8 GPUs at priority 1000
    needs four nodes: it evicts two gangs whole, the cheapest (`younger`,
    then `elder`: lower priority beats age), never one member of a gang
    alone, and runs, whole, on the four nodes they held. Its victims are
    gone at once (kwok, no finalizer here)."""
    from tests.test_e2e_gangs import gang_annotations

    nodes = [node_name(gpu_nodes(f"n{i}", gpus=GPUS, labels=cluster.label)) for i in range(6)]
    cls = cluster.gpu_class("a100")
    high = priorities.make("gang-high", 100)
    urgent = priorities.make("urgent", 1000)
    rc = run_controller()
    with Recorder(api_client, cluster.ns, {n: GPUS for n in nodes}) as r:
        members = {g: [f"{g}-{i}" for i in range(2)] for g in ("elder", "higher", "younger")}
        for gang, pc in (("elder", None), ("higher", high), ("younger", None)):
            for p in members[gang]:
                gpu_pod(cluster, p, cls, 8, priority_class=pc, annotations=gang_annotations(gang, 2))
            if gang == "elder":
                second_passes(cluster, members[gang])

        def placed() -> dict[str, str] | None:
            where = {}
            for pods in members.values():
                for p in pods:
                    got = cluster.read_pod(p)
                    if got is None or got.status.phase != "Running" or not got.spec.node_name:
                        return None
                    where[p] = got.spec.node_name
            return where

        where = wait_for(placed, timeout=60, message=lambda: "the three gangs Running:" + r.describe())
        assert len(set(where.values())) == 6, where

        for i in range(4):
            gpu_pod(cluster, f"big-{i}", cls, 8, priority_class=urgent, annotations=gang_annotations("big", 4))
        freed = {where[p] for g in ("younger", "elder") for p in members[g]}
        wait_for(lambda: all(cluster.read_pod(f"big-{i}") is not None
                             and cluster.read_pod(f"big-{i}").status.phase == "Running" for i in range(4)),
                 timeout=60, message=lambda: "the gang of 4 Running:" + r.describe())
        time.sleep(1.0)  # any later eviction shows
    # Whole gangs or nothing of them.
    evicted = set(r.evicted())
    partial = {g: sorted(set(pods) & evicted) for g, pods in members.items() if 0 < len(set(pods) & evicted) < 2}
    assert not partial, f"gangs that lost only some members: {partial}" + r.evidence()
    assert evicted == set(members["younger"] + members["elder"]), r.evidence()
    assert all(not r.pod(p).evicted and r.pod(p).phase == "Running" for p in members["higher"]), r.describe()
    ran = {r.pod(f"big-{i}").node for i in range(4)}
    assert ran == freed, (ran, freed)
    for i in range(4):
        t, c = r.pod(f"big-{i}"), r.claim(f"big-{i}-g")
        assert t.scheduled and c is not None and c.phase == "Bound" and c.node == t.node, (t, c)
        assert c.said("Preempting") and c.said("Preempting")[0][0] < (c.bound_rv or 0), c
    got = events_on(cluster, "Preempted")
    assert set(got) == evicted, got
    assert all(f"{cluster.ns}/big-" in e.message for es in got.values() for e in es), got
    # Each victim showed the Eviction API's DisruptionTarget before it went;
    # the controller's own, written after the eviction, finds it gone on
    # kwok (the module docstring): the Preempted events name the preemptor.
    for p in evicted:
        assert ("EvictionByEvictionAPI", "Eviction API: evicting") in r.pod(p).disruptions, r.pod(p)
    assert not r.overcommit, "GPUs overcommitted:\n" + "\n".join(r.overcommit[:10])
    assert rc.metric("gpuclaimctl_preempted_pods_total", namespace=cluster.ns, priority="1000") == 4


def test_a_set_whose_priority_class_never_preempts_waits_for_capacity_and_evicts_nothing(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
    priorities: Priorities,
) -> None:
    """A PriorityClass of 1000 with preemptionPolicy Never: its set waits
    for Capacity on a node full of priority-0 notebooks, and nothing is
    evicted; the claim never says Preempting."""
    node = node_name(gpu_nodes("full", gpus=GPUS, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    polite = priorities.make("polite", 1000, never=True)
    rc = run_controller()
    with Recorder(api_client, cluster.ns, {node: GPUS}) as r:
        notebooks = fill(cluster, cls, {node: [("nb-1", 4, None), ("nb-2", 4, None)]})
        wait_for(lambda: all_running(cluster, notebooks), timeout=60,
                 message=lambda: "both notebooks Running:" + r.describe())
        gpu_pod(cluster, "train", cls, 8, priority_class=polite)
        spec = cluster.core.read_namespaced_pod("train", cluster.ns).spec
        assert (spec.priority, spec.preemption_policy) == (1000, "Never"), spec
        wait_for(lambda: r.waiting("train-g") == "Capacity", timeout=30,
                 message=lambda: "train waiting for Capacity:" + r.describe())
        time.sleep(2.0)  # and it stays so
    assert r.evicted() == [], r.evidence()
    assert [w[1] for w in (r.claim("train-g") or ClaimTrace(0)).waits] == ["Capacity"], r.describe()
    assert r.pod("train").gated and all_running(cluster, notebooks)
    assert not cluster.events("Preempting") and not cluster.events("Preempted")
    assert rc.metric("gpuclaimctl_preemptions_total", namespace=cluster.ns, priority="1000") == 0
