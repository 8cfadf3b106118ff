"""A restart without leader election while a bind of the killed process is
still on its way (issue 43, item 4), on the real plane, made deterministic.

The churn run overcommitted a node once in eleven: `kill -9` a few
milliseconds after a bind had left, and the controller started again at
once. The new process listed the claims (its catch-up before the first
decision) before the dead one's bind landed, bound another claim to the
same GPUs, and then the old bind landed as well: both stood. Nothing
stopped it: the lost-answer rule covers a process that lives on to count
its own write, and without leader election there is no Lease term between
the two processes' writes.

Here the window is held open on purpose. A loopback TCP proxy stands
between the first process (A) and the API server; TLS passes through it as
bytes. Once A is synced the proxy holds what A sends (the answers and the
watch events keep coming to A), A binds a claim, A is killed, and a second
process (B) starts straight against the API server and finds a pod asking
for the same GPUs. A few seconds later the proxy lets A's bind through. The
proxy stands in for an API server slow to apply a write it has already
received -- queued behind others, or waiting on etcd -- which it may be for
as long as the write's own deadline (`?timeout=`). So the bind is let
through inside that deadline (fence.WRITE_DEADLINE, counted from when A sent
it), never later, and the test asks of B only what a real, slow API server
would: every version of the claims, read from a watch, never has more GPUs
Bound on the node than it has (DESIGN I1).

Before the fix B bound its pod's claim at once and A's bind then landed on
top of it (8 of 4 GPUs). With it, B waits until RESTART_WAIT has passed
since it started (cmd.startwait) before its first decision, so its list
shows A's bind, its pod waits, and it is placed once the dead pod's
reservation is dropped.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes import client, watch

from gpuclaimctl.client import kube
from gpuclaimctl.client.fence import WRITE_DEADLINE
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.model import api
from tests.helpers import wait_for
from tests.test_e2e import CLAIMS, Cluster, node_name
from tests.test_failover import audited_account_kubeconfig
from tests.test_stress import READY_TIMEOUT, Controller

pytestmark = pytest.mark.plane

GPUS = 4
# How long the proxy must have held A's bytes before A is killed: the whole
# bind request is in by then (it leaves in one send).
HELD_FOR = 0.5
# When A's bind is let through, at the latest, counted from its first held
# byte: inside the API server deadline it was sent with, with room to spare
# for the time the test itself takes to notice.
RELEASE_AFTER = WRITE_DEADLINE - 2.0
# Workers as in the run.
WORKERS = 8

Obj = dict[str, Any]


class HoldingProxy:
    """A loopback TCP proxy to the API server that can hold what clients
    send while the server's answers and watch events keep flowing to them.

    Held bytes are sent on, in order, by `release`. A connection whose
    client has gone keeps its side to the server open until `close`: the
    API server cancels a request whose connection closes, and a held
    request is exactly one whose client has gone."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._holding = False
        self._held: list[tuple[socket.socket, bytes]] = []
        self.first_held_at: float | None = None
        self.release_errors: list[str] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def hold(self) -> None:
        with self._lock:
            self._holding = True

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(data) for _, data in self._held)

    def release(self) -> None:
        with self._lock:
            self._holding = False
            for upstream, data in self._held:
                try:
                    upstream.sendall(data)
                except OSError as e:
                    self.release_errors.append(repr(e))
            self._held.clear()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                up = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                down.close()
                continue
            with self._lock:
                self._sockets += [down, up]
            threading.Thread(target=self._to_server, args=(down, up), daemon=True).start()
            threading.Thread(target=self._to_client, args=(up, down), daemon=True).start()

    def _to_server(self, down: socket.socket, up: socket.socket) -> None:
        while True:
            try:
                data = down.recv(65536)
            except OSError:
                data = b""
            if not data:
                return  # the client is gone; its side to the server stays open
            with self._lock:
                if self._holding:
                    self._held.append((up, data))
                    if self.first_held_at is None:
                        self.first_held_at = time.monotonic()
                    continue
                try:
                    up.sendall(data)
                except OSError:
                    return

    def _to_client(self, up: socket.socket, down: socket.socket) -> None:
        while True:
            try:
                data = up.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    down.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            try:
                down.sendall(data)
            except OSError:
                pass  # the client is gone: keep reading, so the server never waits on us


class ClaimWatch(threading.Thread):
    """Every version of the namespace's claims, from a list and a watch from
    it: after each event, the GPUs Bound on `node` in that version of the
    store (a watch gives each change in order, so no state goes unseen)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, node: str) -> None:
        super().__init__(daemon=True, name="claim-watch")
        self.custom = client.CustomObjectsApi(api_client)
        self.ns, self.node = namespace, node
        self.claims: dict[str, Obj] = {}
        self.lock = threading.Lock()
        # (seconds since start, GPUs Bound on the node, the claims then)
        self.states: list[tuple[float, int, str]] = []
        self.errors: list[str] = []
        self.started_at = time.monotonic()
        self.synced = threading.Event()
        self._watch = watch.Watch()
        self._stopped = False

    def run(self) -> None:
        try:
            listed: Obj = kube.request_json(
                self.custom.api_client, "GET", f"{CLAIMS}/namespaces/{self.ns}/{api.CLAIM_PLURAL}")
            for c in listed["items"]:
                self.claims[c["metadata"]["name"]] = c
            self._note()
            self.synced.set()
            for event in self._watch.stream(
                    self.custom.list_namespaced_custom_object, api.GROUP, api.VERSION, self.ns,
                    api.CLAIM_PLURAL, resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=180):
                obj = event["object"]
                if event["type"] == "DELETED":
                    self.claims.pop(obj["metadata"]["name"], None)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    self.claims[obj["metadata"]["name"]] = obj
                else:
                    self.errors.append(f"watch: {event['type']} {obj}")
                    return
                self._note()
            if not self._stopped:
                self.errors.append("the watch ended before the test did")
        except Exception as e:  # a watch that died silently would pass the test
            if not self._stopped:  # stop() ends the stream as it can
                self.errors.append(f"t={time.monotonic() - self.started_at:.2f}s {type(e).__name__}: {e}")
            self.synced.set()

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()

    def _note(self) -> None:
        bound, brief = 0, []
        for name, c in sorted(self.claims.items()):
            st = c.get("status") or {}
            if st.get("phase") == api.Phase.BOUND and st.get("nodeName") == self.node:
                bound += int(c["spec"]["count"])
            brief.append(f"{name}={st.get('phase', 'Pending')}"
                         f"{[r['name'] for r in st.get('reservedFor') or ()]}")
        with self.lock:
            self.states.append((time.monotonic() - self.started_at, bound, " ".join(brief)))

    def peak(self) -> tuple[int, str]:
        with self.lock:
            worst = max(self.states, key=lambda s: s[1], default=(0.0, 0, ""))
        return worst[1], f"t={worst[0]:.2f}s {worst[2]}"

    def ever(self, predicate: Callable[[str], bool]) -> bool:
        with self.lock:
            return any(predicate(brief) for _, _, brief in self.states)


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str) -> Iterator[Cluster]:
    c = Cluster(api_client, namespace)
    yield c
    c.cleanup()


def user_claim(cluster: Cluster, name: str, cls: str, *, finalized: bool) -> None:
    """A GPUClaim the user made; `finalized`: with our finalizer already on
    it, so that the controller's first write for it is the bind."""
    meta: Obj = {"name": name}
    if finalized:
        meta["finalizers"] = [api.CLAIM_FINALIZER]
    kube.request(cluster.api, "POST", f"{CLAIMS}/namespaces/{cluster.ns}/{api.CLAIM_PLURAL}", body={
        "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": meta,
        "spec": {"className": cls, "count": GPUS}})


def phase(cluster: Cluster, claim: str) -> str:
    return str(((cluster.get_claim(claim) or {}).get("status") or {}).get("phase") or "")


def released(cluster: Cluster, pod: str) -> bool:
    p = cluster.read_pod(pod)
    return p is not None and not any(g.name == api.SCHEDULING_GATE for g in p.spec.scheduling_gates or ())


def through(kubeconfig: str, proxy: HoldingProxy, path: Path) -> str:
    """`kubeconfig` with its server replaced by the proxy (same name, same
    certificate: the proxy passes TLS through)."""
    config = json.loads(Path(kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_restart_without_leader_election_never_binds_on_gpus_a_bind_of_the_killed_process_takes(
    cluster: Cluster, full_plane: ControlPlane, crds: list[str], api_client: client.ApiClient,
    namespace: str, gpu_nodes: Callable[..., Obj], tmp_path: Path,
) -> None:
    node = node_name(gpu_nodes("window", gpus=GPUS, labels=cluster.label))
    cls = cluster.gpu_class("a100")
    user_claim(cluster, "c1", cls, finalized=True)
    kubeconfig, binding = audited_account_kubeconfig(full_plane, api_client, namespace,
                                                     tmp_path / "sa.kubeconfig")
    proxy = HoldingProxy(full_plane.apiserver_port)
    a = Controller(through(kubeconfig, proxy, tmp_path / "proxied.kubeconfig"),
                   tmp_path / "a.log", WORKERS)
    b = Controller(kubeconfig, tmp_path / "b.log", WORKERS)
    claims = ClaimWatch(api_client, namespace, node)
    timeline: list[str] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        timeline.append(f"t={time.monotonic() - t0:.2f}s {what}")

    try:
        claims.start()
        assert claims.synced.wait(30) and not claims.errors, claims.errors
        a.start()
        # Deciding: its workers run (after its own start wait and catch-up).
        wait_for(a.leading, timeout=READY_TIMEOUT + 30, interval=0.1,
                 message=lambda: f"process A to start its workers:\n{a.tail()}")
        note("A runs its workers")

        proxy.hold()
        cluster.pod("p1", [{"name": "g", "claim": "c1"}])
        note("P1 created; the proxy holds what A sends")
        wait_for(lambda: proxy.first_held_at is not None
                 and time.monotonic() - proxy.first_held_at >= HELD_FOR,
                 timeout=30, interval=0.02, message=lambda: f"A to send its bind:\n{a.tail()}")
        held_at = proxy.first_held_at
        assert held_at is not None
        a.kill()
        note(f"A killed (SIGKILL) with {proxy.held_bytes()} bytes held, the first "
             f"{time.monotonic() - held_at:.2f}s ago")
        assert phase(cluster, "c1") != api.Phase.BOUND, "A's bind is held, not landed"

        cluster.core.delete_namespaced_pod("p1", namespace, grace_period_seconds=0)
        wait_for(lambda: cluster.read_pod("p1") is None, timeout=10, message="P1 gone")
        b.start()
        note("P1 deleted; B started, straight to the API server")
        user_claim(cluster, "c2", cls, finalized=False)
        cluster.pod("p2", [{"name": "g", "claim": "c2"}])
        note("c2 and P2 created")

        # Let A's bind through once B has bound P2's claim, or in any case
        # while the API server could still be applying it.
        wait_for(lambda: phase(cluster, "c2") == api.Phase.BOUND
                 or time.monotonic() >= held_at + RELEASE_AFTER,
                 timeout=RELEASE_AFTER + 5, interval=0.02, message="the release time")
        note(f"c2 {phase(cluster, 'c2') or 'Pending'}; A's bind let through, "
             f"{time.monotonic() - held_at:.2f}s after A sent it")
        proxy.release()
        assert proxy.release_errors == [], proxy.release_errors

        wait_for(lambda: claims.ever(lambda s: "c1=Bound['p1']" in s), timeout=10,
                 message=lambda: f"A's held bind to land; claims: {claims.states[-1:]}")
        note("A's bind landed")
        wait_for(lambda: released(cluster, "p2"), timeout=60, interval=0.1,
                 message=lambda: f"P2 released:\n{cluster.describe_pod('p2')}\n{b.tail()}")
        note("P2 released")
        time.sleep(1.0)  # what B does right after
    finally:
        claims.stop()
        a.kill()
        b.kill()
        proxy.close()
        kube.request(api_client, "DELETE",
                     f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")

    peak, when = claims.peak()
    print("\n".join(timeline) + f"\npeak: {peak} of {GPUS} GPUs Bound on the node ({when}); "
          f"{len(claims.states)} versions seen")
    assert claims.errors == []
    assert peak <= GPUS, (f"{peak} GPUs Bound on a node with {GPUS} ({when}):\n" + "\n".join(timeline)
                          + f"\n{b.tail(40)}")
    assert "before the first decision: without leader election" in b.log.read_text(), \
        "B said how long it waited and why"
