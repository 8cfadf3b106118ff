"""Gangs end to end on the real plane (DESIGN.md §4c, invariant I5): a
gang's members are released all at once or not at all.

A watcher samples the namespace's pods, then its GPUClaims, every 75 ms
from before the first member exists, and watches both. After each story:
no sample shows a member released while another is gated without its
claim Bound; every member's claim was Bound, and every member there,
before the first release (in etcd's order: the watches' resourceVersions);
the members' first ungated samples lie within one short window.

kwok's stages finish a Job's pods as soon as they run (Running, then at
once Succeeded): a Job's member counts as run once it reached Running or
Succeeded on its node. The two-gang story uses bare pods, which stay
Running, so the first gang keeps its GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, watch

from gpuclaimctl.client import kube
from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import PodClaimsError, pod_claims
from tests.helpers import wait_for
from tests.test_e2e import CLAIMS, Cluster, node_name

pytestmark = pytest.mark.plane

Nodes = Callable[..., dict[str, Any]]
# How often the watcher samples (the brief: every 50-100 ms).
SAMPLE_EVERY = 0.075
# The members' releases are one sync's patches, one after another: a few
# round trips. A second is ample on a loaded 2-core machine and still far
# below what a member released by a sync of its own would take.
RELEASE_WINDOW = 1.0
RAN = ("Running", "Succeeded")


# -- what the watcher sees ---------------------------------------------------------------------


@dataclass(frozen=True)
class PodSeen:
    gated: bool
    node: str | None
    phase: str
    gang: str | None
    claims: tuple[str, ...]  # the GPUClaims its annotation names


@dataclass(frozen=True)
class ClaimSeen:
    phase: str | None
    node: str | None
    waiting: tuple[str, str] | None  # reason, message


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic, taken before the pods were listed
    pods: Mapping[str, PodSeen]
    claims: Mapping[str, ClaimSeen]


def _pod_seen(p: Mapping[str, Any]) -> PodSeen:
    meta, spec = p["metadata"], p.get("spec") or {}
    try:
        names = tuple(e.claim_name(meta["name"]) for e in pod_claims(p))
    except PodClaimsError:
        names = ()
    return PodSeen(
        gated=any(g.get("name") == api.SCHEDULING_GATE for g in spec.get("schedulingGates") or ()),
        node=spec.get("nodeName"), phase=str((p.get("status") or {}).get("phase") or ""),
        gang=(meta.get("annotations") or {}).get(api.GANG_ANNOTATION), claims=names)


def _claim_seen(c: Mapping[str, Any]) -> ClaimSeen:
    status = c.get("status") or {}
    waiting = next(((str(x.get("reason")), str(x.get("message"))) for x in status.get("conditions") or ()
                    if x.get("type") == api.CONDITION_WAITING and x.get("status") == "True"), None)
    return ClaimSeen(status.get("phase"), status.get("nodeName"), waiting)


class Watcher:
    """What a user polling the API would see, and the exact order of it.

    A thread samples the namespace's pods, then its claims, every
    SAMPLE_EVERY seconds (the times members are first seen ungated). Two
    watches record every change of the pods and claims with its
    resourceVersion: one etcd serves both, so its revisions order a pod's
    release against a claim's bind exactly, where sampling cannot (kwok
    runs and finishes a Job's pod, and its claim lets go, within one
    sample)."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.config = api_client.configuration
        self.api = client.ApiClient(self.config)
        self.ns = namespace
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        # From the watches: a pod's first revision, its first without our
        # gate; a claim's first revision Bound, and where.
        self.pod_added: dict[str, int] = {}
        self.pod_ungated: dict[str, int] = {}
        self.claim_bound: dict[str, tuple[int, str | None]] = {}
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads = [threading.Thread(target=self._poll, name="gang-poll", daemon=True)]

    def __enter__(self) -> Watcher:
        rv = self.revision()
        core = client.CoreV1Api(client.ApiClient(self.config))
        custom = client.CustomObjectsApi(client.ApiClient(self.config))
        self._threads += [
            threading.Thread(target=self._watch, args=(core.list_namespaced_pod, (self.ns,), rv, self._pod_event),
                             name="gang-watch-pods", daemon=True),
            threading.Thread(target=self._watch, args=(custom.list_namespaced_custom_object,
                                                       (api.GROUP, api.VERSION, self.ns, "gpuclaims"), rv,
                                                       self._claim_event), name="gang-watch-claims", daemon=True)]
        for t in self._threads:
            t.start()
        wait_for(lambda: self.samples, timeout=10, message="the watcher's first sample")
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._threads[0].join(10)
        if exc_type is None:
            wait_for(self._caught_up, timeout=10, message=lambda: "the watches to show what the samples "
                     f"showed (errors: {self.errors[-3:]})")
        for w in self._watches:
            w.stop()

    def _caught_up(self) -> bool:
        """The watches have seen every release and bind the samples show."""
        return all(n in self.pod_ungated for s in self.samples for n, p in s.pods.items() if not p.gated) \
            and all(c in self.claim_bound for s in self.samples for c, x in s.claims.items() if x.phase == "Bound")

    def revision(self) -> int:
        """The store's revision now (a list's resourceVersion)."""
        listed = kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims")
        return int(listed["metadata"]["resourceVersion"])

    def _poll(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                pods = kube.request_json(self.api, "GET", f"/api/v1/namespaces/{self.ns}/pods")["items"]
                claims = kube.request_json(self.api, "GET", f"{CLAIMS}/namespaces/{self.ns}/gpuclaims")["items"]
            except Exception as e:  # noqa: BLE001 -- a lost sample is reported, not fatal
                self.errors.append(f"{type(e).__name__}: {e}")
            else:
                self.samples.append(Sample(
                    t, {p["metadata"]["name"]: _pod_seen(p) for p in pods},
                    {c["metadata"]["name"]: _claim_seen(c) for c in claims}))
            self._stop.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - t)))

    def _watch(self, list_fn: Callable[..., Any], args: tuple[Any, ...], rv: int,
               record: Callable[[Mapping[str, Any]], None]) -> None:
        w = watch.Watch()
        self._watches.append(w)
        try:
            for event in w.stream(list_fn, *args, resource_version=str(rv), timeout_seconds=600):
                if event["type"] in ("ADDED", "MODIFIED"):
                    record(event["raw_object"])
        except Exception as e:  # noqa: BLE001 -- reported by the checks that need it
            if not self._stop.is_set():
                self.errors.append(f"watch: {type(e).__name__}: {e}")

    def _pod_event(self, p: Mapping[str, Any]) -> None:
        name, rv = p["metadata"]["name"], int(p["metadata"]["resourceVersion"])
        self.pod_added.setdefault(name, rv)
        if not _pod_seen(p).gated:
            self.pod_ungated.setdefault(name, rv)

    def _claim_event(self, c: Mapping[str, Any]) -> None:
        seen = _claim_seen(c)
        if seen.phase == "Bound":
            self.claim_bound.setdefault(c["metadata"]["name"], (int(c["metadata"]["resourceVersion"]), seen.node))

    def last(self) -> Sample:
        return self.samples[-1]

    def members(self, gang: str, sample: Sample | None = None) -> dict[str, PodSeen]:
        s = sample or self.last()
        return {n: p for n, p in s.pods.items() if p.gang == gang}

    def first_ungated(self, gang: str) -> dict[str, float]:
        """Each member's first sample without our gate (monotonic time)."""
        out: dict[str, float] = {}
        for s in self.samples:
            for name, p in self.members(gang, s).items():
                if not p.gated:
                    out.setdefault(name, s.t)
        return out

    def partial_releases(self, gang: str, size: int) -> list[str]:
        """Every sample that shows a member released while the gang's
        decision had not landed: fewer than `size` members, or a member
        still gated whose claim is not Bound. (A released member's claim is
        checked by the watches: a Job's pod can be released, run, finish
        and have its claim let go between two samples.)"""
        problems = []
        t0 = self.samples[0].t
        for s in self.samples:
            members = self.members(gang, s)
            released = sorted(n for n, p in members.items() if not p.gated)
            if not released:
                continue
            if len(members) < size:
                problems.append(f"t={s.t - t0:.2f}s: {released} released, only {len(members)} of {size} exist")
            for name, p in sorted(members.items()):
                for c in p.claims if p.gated else ():
                    seen = s.claims.get(c)
                    if seen is None or seen.phase != "Bound":
                        problems.append(f"t={s.t - t0:.2f}s: {released} released while {name} is gated "
                                        f"and its claim {c} is {seen}")
        return problems

    def out_of_order(self, gang: str) -> list[str]:
        """From the watches: each member's claim Bound, and every member
        there, before the first member was released."""
        members = self.members(gang)
        ungated = {n: self.pod_ungated[n] for n in members if n in self.pod_ungated}
        if not ungated:
            return []
        first = min(ungated.values())
        problems = [f"{n} made at revision {self.pod_added.get(n)}, after the first release at {first}"
                    for n in members if self.pod_added.get(n, first) >= first]
        for c in claims_of(members):
            bound = self.claim_bound.get(c)
            if bound is None or bound[0] >= first:
                problems.append(f"claim {c} Bound at revision {bound and bound[0]}, the first release at "
                                f"{first} ({ungated})")
        return problems

    def ever_bound(self, gang: str, before: int | None = None) -> dict[str, tuple[int, str | None]]:
        """From the watches: the gang's members' claims that were Bound (before revision `before`)."""
        names = set(claims_of(self.members(gang)))
        return {c: b for c, b in self.claim_bound.items() if c in names and (before is None or b[0] < before)}

    def describe(self, gang: str | None = None) -> str:
        """The last sample, for a failed wait."""
        s = self.last()
        pods = {n: p for n, p in s.pods.items() if gang is None or p.gang == gang}
        lines = [f"pod {n}: gated={p.gated} node={p.node} phase={p.phase} gang={p.gang}" for n, p in
                 sorted(pods.items())]
        names = {c for p in pods.values() for c in p.claims}
        lines += [f"claim {n}: {c}" for n, c in sorted(s.claims.items()) if n in names]
        return "\n  " + "\n  ".join(lines) + (f"\n  watcher errors: {self.errors[-3:]}" if self.errors else "")


# -- making gangs -------------------------------------------------------------------------------


def gang_annotations(gang: str, size: int) -> dict[str, str]:
    return {api.GANG_ANNOTATION: gang, api.GANG_SIZE_ANNOTATION: str(size)}


def indexed_job(cluster: Cluster, name: str, class_name: str, size: int, gpus: int = 8) -> None:
    """An Indexed Job of `size` pods at once, each gated with one inline
    entry of `gpus` GPUs, all in gang `name` of `size`."""
    template = cluster.pod_manifest(name, [{"name": "g", "className": class_name, "count": gpus}])
    template["metadata"].pop("name")
    template["metadata"]["annotations"].update(gang_annotations(name, size))
    template["spec"]["restartPolicy"] = "Never"
    kube.request(cluster.api, "POST", f"/apis/batch/v1/namespaces/{cluster.ns}/jobs", body={
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completionMode": "Indexed", "completions": size, "parallelism": size, "backoffLimit": 0,
                 "template": template}})


def gang_pod(cluster: Cluster, name: str, gang: str, size: int, entries: list[dict[str, Any]]) -> None:
    manifest = cluster.pod_manifest(name, entries)
    manifest["metadata"]["annotations"].update(gang_annotations(gang, size))
    kube.request(cluster.api, "POST", f"/api/v1/namespaces/{cluster.ns}/pods", body=manifest)


def claims_of(members: Mapping[str, PodSeen]) -> list[str]:
    return sorted(c for p in members.values() for c in p.claims)


def all_waiting(w: Watcher, gang: str, size: int, reason: str) -> bool:
    """All `size` members exist and each of their claims says Waiting `reason`."""
    members = w.members(gang)
    s = w.last()
    return len(members) == size and all(
        (s.claims.get(c) is not None and (s.claims[c].waiting or ("", ""))[0] == reason)
        for c in claims_of(members))


def bound_elsewhere(cluster: Cluster) -> list[str]:
    """Claims Bound in other namespaces: what is left of earlier tests."""
    claims = kube.request_json(cluster.api, "GET", f"{CLAIMS}/gpuclaims")["items"]
    return [f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in claims
            if c["metadata"]["namespace"] != cluster.ns and (c.get("status") or {}).get("phase") == "Bound"]


def all_ran(w: Watcher, gang: str, size: int) -> bool:
    members = w.members(gang)
    return len(members) == size and all(not p.gated and p.node and p.phase in RAN for p in members.values())


def assert_released_whole(w: Watcher, gang: str, size: int, nodes: Iterable[str]) -> None:
    """No sample shows the gang partly released; the members' first ungated
    moments lie within RELEASE_WINDOW; each ran on a node of its own, the
    node its claim was bound to."""
    problems = w.partial_releases(gang, size)
    assert not problems, "the gang was partly released:\n" + "\n".join(problems[:10])
    problems = w.out_of_order(gang)
    assert not problems, "a member was released before the gang's decision landed:\n" + "\n".join(problems)
    first = w.first_ungated(gang)
    assert len(first) == size, first
    spread = max(first.values()) - min(first.values())
    assert spread <= RELEASE_WINDOW, f"first ungated {spread:.2f}s apart: {first}"
    members = w.members(gang)
    ran_on = {n: p.node for n, p in members.items()}
    assert len(set(ran_on.values())) == size and set(ran_on.values()) <= set(nodes), ran_on
    for n, p in members.items():
        assert [w.claim_bound[c][1] for c in p.claims] == [p.node], (n, p, w.claim_bound)
    print(f"gang {gang}: {size} members released within {spread * 1000:.0f} ms "
          f"({len(w.samples)} samples, {len(w.errors)} lost)")


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str) -> Any:
    c = Cluster(api_client, namespace)
    yield c
    c.cleanup()


# -- the stories ---------------------------------------------------------------------------------


def test_an_indexed_job_of_four_is_released_whole_onto_four_nodes(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    nodes = [node_name(gpu_nodes(f"n{i}", gpus=8, labels=cluster.label)) for i in range(4)]
    cls = cluster.gpu_class("a100")
    run_controller()
    with Watcher(api_client, cluster.ns) as w:
        indexed_job(cluster, "train", cls, 4)
        wait_for(lambda: all_ran(w, "train", 4), timeout=60,
                 message=lambda: "all 4 members Running on their nodes:" + w.describe("train"))
    assert_released_whole(w, "train", 4, nodes)
    job = kube.request_json(cluster.api, "GET", f"/apis/batch/v1/namespaces/{cluster.ns}/jobs/train")
    assert not (job.get("status") or {}).get("failed"), job.get("status")


def test_a_job_too_big_for_the_nodes_waits_whole_until_a_node_is_added(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    nodes = [node_name(gpu_nodes(f"n{i}", gpus=8, labels=cluster.label)) for i in range(3)]
    cls = cluster.gpu_class("a100")
    run_controller()
    with Watcher(api_client, cluster.ns) as w:
        indexed_job(cluster, "train", cls, 4)
        wait_for(lambda: all_waiting(w, "train", 4, "GangCapacity"), timeout=30,
                 message=lambda: "every member's claim Waiting GangCapacity:" + w.describe("train"))
        s = w.last()
        members = w.members("train", s)
        for c in claims_of(members):
            assert "3 of 4 sets fit at once" in s.claims[c].waiting[1], (c, s.claims[c])  # type: ignore[index]
        assert not [n for n, p in members.items() if not p.gated], w.describe("train")
        assert not [c for c in claims_of(members) if s.claims[c].phase == "Bound"], w.describe("train")
        assert cluster.events("GangCapacity"), "a GangCapacity Warning event"

        adding = w.revision()
        nodes.append(node_name(gpu_nodes("n3", gpus=8, labels=cluster.label)))
        wait_for(lambda: all_ran(w, "train", 4), timeout=60,
                 message=lambda: "all 4 members Running once the 4th node came:" + w.describe("train"))
    assert min(w.pod_ungated[n] for n in w.members("train")) > adding, "no member released before the 4th node"
    assert not w.ever_bound("train", before=adding), w.ever_bound("train", before=adding)
    assert_released_whole(w, "train", 4, nodes)


def test_of_two_gangs_with_room_for_one_one_runs_whole_and_the_other_waits_whole(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    nodes = [node_name(gpu_nodes(f"n{i}", gpus=8, labels=cluster.label)) for i in range(4)]
    cls = cluster.gpu_class("a100")
    run_controller()
    with Watcher(api_client, cluster.ns) as w:
        for i in range(3):  # interleaved, as two jobs' pods arrive
            for gang in ("alpha", "beta"):
                gang_pod(cluster, f"{gang}-{i}", gang, 3, [{"name": "g", "className": cls, "count": 8}])

        def settled() -> tuple[str, str] | None:
            for ran, waits in (("alpha", "beta"), ("beta", "alpha")):
                if all_ran(w, ran, 3) and all_waiting(w, waits, 3, "GangCapacity"):
                    return ran, waits
            return None

        outcome = wait_for(settled, timeout=60, message=lambda: "one gang Running, the other waiting "
                                                                "GangCapacity:" + w.describe())
        assert outcome is not None
        ran, waits = outcome
        time.sleep(2.0)  # and it stays so
    s = w.last()
    assert all_ran(w, ran, 3) and all(p.phase == "Running" for p in w.members(ran).values()), w.describe()
    waiting = w.members(waits, s)
    assert all(p.gated for p in waiting.values()), w.describe(waits)
    for c in claims_of(waiting):
        seen = s.claims[c]
        assert seen.phase != "Bound" and seen.waiting is not None, (c, seen)
        # Not the figure: a Waiting is written once per reason (sync.pods._waiting),
        # and a decision taken while the other gang's first bind was being
        # retried saw 2 of 3 fit (the other gang's unsent binds held 2 nodes).
        assert seen.waiting[0] == "GangCapacity" and f"gang {waits}: " in seen.waiting[1] \
            and "of 3 sets fit at once" in seen.waiting[1], (c, seen)
    assert not w.first_ungated(waits), "no member of the waiting gang was ever released"
    assert not w.ever_bound(waits), f"nothing ever bound for the waiting gang: {w.ever_bound(waits)}"
    assert not any(n in w.pod_ungated for n in waiting), w.pod_ungated
    assert_released_whole(w, ran, 3, nodes)


def test_members_that_disagree_on_the_gang_size_are_told_gang_invalid_and_nothing_is_placed(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    gpu_nodes("n0", gpus=8, labels=cluster.label)
    gpu_nodes("n1", gpus=8, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    # Claims of the users' own: a gang that cannot be placed has nothing
    # made for it (sync.gangs._gang_invalid), and these exist to say why.
    cluster.claim("pair-0-gpu", cls, 8)
    cluster.claim("pair-1-gpu", cls, 8)
    # Nothing but the gang's own pods' events may sync its members: no
    # resync within the story, and no GPUs freed meanwhile by the cleanup
    # of earlier tests' namespaces (freed GPUs wake every gated pod).
    run_controller(resync_period=600.0)
    wait_for(lambda: not bound_elsewhere(cluster), timeout=60,
             message=lambda: f"earlier tests' claims to let go: {bound_elsewhere(cluster)}")
    with Watcher(api_client, cluster.ns) as w:
        # A Job's pods arrive one after another: the first waits for the second.
        gang_pod(cluster, "pair-0", "pair", 2, [{"name": "gpu", "claim": "pair-0-gpu"}])
        wait_for(lambda: all_waiting(w, "pair", 1, "GangIncomplete"), timeout=30,
                 message=lambda: "pair-0's claim Waiting GangIncomplete:" + w.describe("pair"))
        gang_pod(cluster, "pair-1", "pair", 3, [{"name": "gpu", "claim": "pair-1-gpu"}])
        wait_for(lambda: all_waiting(w, "pair", 2, "GangInvalid"), timeout=10,
                 message=lambda: "both members' claims Waiting GangInvalid:" + w.describe("pair"))
        time.sleep(2.0)  # and nothing is placed meanwhile
    events = cluster.events("GangInvalid")
    assert {e.involved_object.name for e in events} == {"pair-0", "pair-1"}, [
        (e.involved_object.name, e.message) for e in events]
    assert all(e.type == "Warning" and "disagree on its size" in (e.message or "") for e in events), events
    s = w.last()
    for c in ("pair-0-gpu", "pair-1-gpu"):
        assert s.claims[c].phase != "Bound" and (s.claims[c].waiting or ("",))[0] == "GangInvalid", s.claims[c]
        assert "pair-0 says 2, pair-1 says 3" in s.claims[c].waiting[1], s.claims[c]  # type: ignore[index]
    assert not w.first_ungated("pair"), "no member was ever released:" + w.describe("pair")
    assert not w.ever_bound("pair"), w.ever_bound("pair")
    assert not any(n in w.pod_ungated for n in w.members("pair")), w.pod_ungated


def test_a_member_lost_with_its_node_is_replaced_and_placed_alone_while_the_other_runs(
    cluster: Cluster, gpu_nodes: Nodes, run_controller: Callable[..., Any], api_client: client.ApiClient,
) -> None:
    """Issue 44, item 6, §4c "After release": a gang of 2 × 8 GPUs runs on two
    of three 8-GPU nodes; one member's node is deleted. Its claim turns Lost
    (--node-lost-grace 2 s); the pod goes; its owner makes another, which is
    placed by itself on the third node, while the other member runs on, never
    gated, moved or evicted, its claim Bound on its node throughout.

    The owner is a StatefulSet (podManagementPolicy Parallel): kwok finishes
    a Job's pods at once, and a StatefulSet's pods stay Running and come
    back under their names when deleted. The pod on the deleted node is
    deleted here, with grace 0, once its claim is Lost: that is what
    kube-controller-manager's pod GC does to a pod bound to a node that no
    longer exists, but only after its fixed 40 s quarantine (and a 20 s
    period), which would double the story's length."""
    nodes = [node_name(gpu_nodes(f"n{i}", gpus=8, labels=cluster.label)) for i in range(3)]
    cls = cluster.gpu_class("a100")
    run_controller(node_lost_grace=2.0)
    template = cluster.pod_manifest("train", [{"name": "g", "className": cls, "count": 8}])
    template["metadata"].pop("name")
    template["metadata"]["annotations"].update(gang_annotations("train", 2))
    with Watcher(api_client, cluster.ns) as w:
        kube.request(cluster.api, "POST", f"/apis/apps/v1/namespaces/{cluster.ns}/statefulsets", body={
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "train"},
            "spec": {"replicas": 2, "podManagementPolicy": "Parallel", "serviceName": "train",
                     "selector": {"matchLabels": {"app": "train"}}, "template": template}})
        wait_for(lambda: all_ran(w, "train", 2) and all(p.phase == "Running" for p in w.members("train").values()),
                 timeout=60, message=lambda: "both members Running on their nodes:" + w.describe("train"))
        assert_released_whole(w, "train", 2, nodes)
        placed = {n: str(p.node) for n, p in w.members("train").items()}
        lost, stays = "train-1", "train-0"
        doomed, home = placed[lost], placed[stays]
        (third,) = set(nodes) - {doomed, home}
        survivor_uid = cluster.read_pod(stays).metadata.uid
        lost_pod_uid = cluster.read_pod(lost).metadata.uid
        lost_claim_uid = (cluster.get_claim(f"{lost}-g") or {})["metadata"]["uid"]
        from_sample = len(w.samples)

        cluster.core.delete_node(doomed)
        wait_for(lambda: (cluster.get_claim(f"{lost}-g") or {}).get("status", {}).get("phase") == "Lost",
                 timeout=30, message=lambda: f"{lost}-g Lost once {doomed} is gone past the grace:"
                 + w.describe("train"))
        wait_for(lambda: [e for e in cluster.events("Lost") if e.involved_object.name == f"{lost}-g"],
                 timeout=10, message="a Lost event on the lost member's claim")
        # The pod GC's part (see above): the pod bound to a node that is gone.
        cluster.core.delete_namespaced_pod(lost, cluster.ns, grace_period_seconds=0)

        def replaced() -> bool:
            p = cluster.read_pod(lost)
            return p is not None and p.metadata.uid != lost_pod_uid and cluster.running_on(lost, third)

        wait_for(replaced, timeout=45, message=lambda: f"the StatefulSet's next {lost} Running on {third}: "
                 + cluster.describe_pod(lost) + w.describe("train"))
        time.sleep(1.0)  # and the survivor still runs a moment after
    claim = cluster.get_claim(f"{lost}-g")
    assert claim is not None and claim["metadata"]["uid"] != lost_claim_uid, "the old template claim went"
    assert claim["status"]["phase"] == "Bound" and claim["status"]["nodeName"] == third, claim["status"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [lost], claim["status"]
    new = cluster.read_pod(lost)
    assert claim["metadata"]["ownerReferences"][0]["uid"] == new.metadata.uid
    # Never evicted: the same pod, on its node, Running, its claim Bound there.
    survivor = cluster.read_pod(stays)
    assert survivor.metadata.uid == survivor_uid and survivor.spec.node_name == home
    assert survivor.status.phase == "Running" and survivor.metadata.deletion_timestamp is None
    kept = cluster.get_claim(f"{stays}-g")
    assert kept is not None and kept["status"]["phase"] == "Bound" and kept["status"]["nodeName"] == home
    problems = []
    t0 = w.samples[0].t
    for s in w.samples[from_sample:]:
        p, c = s.pods.get(stays), s.claims.get(f"{stays}-g")
        if p is None or p.gated or p.node != home or p.phase != "Running":
            problems.append(f"t={s.t - t0:.2f}s: {stays} is {p}")
        if c is None or c.phase != "Bound" or c.node != home:
            problems.append(f"t={s.t - t0:.2f}s: {stays}-g is {c}")
    assert not problems, f"the survivor was disturbed ({len(problems)} samples):\n" + "\n".join(problems[:10])
    # Placed by itself, bind before release: every sample since the node
    # went that shows the replacement released (pods are listed before
    # claims) shows its claim Bound on the third node.
    released = [s for s in w.samples[from_sample:] if (p := s.pods.get(lost)) and not p.gated and p.node == third]
    assert released, "a sample shows the replacement released:" + w.describe("train")
    unbound = [(round(s.t - t0, 2), c) for s in released
               if (c := s.claims.get(f"{lost}-g")) is None or (c.phase, c.node) != ("Bound", third)]
    assert not unbound, unbound[:5]
    print(f"member {lost} lost with {doomed}, replaced on {third}; {stays} ran on {home} throughout "
          f"({len(w.samples) - from_sample} samples since the node went, {len(w.errors)} lost)")
