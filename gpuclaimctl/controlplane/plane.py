"""Start and stop a real local control plane on loopback.

etcd and kube-apiserver always; kube-scheduler, kube-controller-manager and
kwok (fake nodes) when asked, at start or later. Each component gets free
loopback ports, logs to its own file, and is stopped by `stop()`, by the
context manager, at interpreter exit, and by the kernel if this process dies
(PR_SET_PDEATHSIG), so no test run leaves an orphan behind.

This is a development and test tool: it runs everything as the caller with
one admin credential (system:masters), and it must never be pointed at
anything but loopback.

Without a `workdir` the plane is a throwaway: a temporary folder, removed
by `stop()` (kept with GPUCLAIMCTL_KEEP_PLANE=1, for its logs), etcd without
fsync. Given a `workdir` (`run --local` passes one under the cache), the
plane's state is kept there across starts: etcd's data, and the PKI the
objects in it depend on (service-account tokens are signed with its key);
`resumed` says whether etcd's data was there already. The ports are new
each start, the kubeconfig is rewritten for them, and the previous start's
logs are moved to `logs.previous`.

The plane runs one supported Kubernetes minor: `version`, else
$GPUCLAIMCTL_K8S_VERSION, else the newest (build.selected_minor). A kept
plane records the minor that last ran it; as kubeadm does, a start refuses
to go back a minor (etcd's data may hold what the older one cannot read)
or to skip one (upgrades go one minor at a time), and says how to go on.

The API server keeps a Metadata-level audit log of the requests of service
accounts only (`audit_events()`): tests run the controller as its service
account to prove its RBAC, and read there what it actually did. The admin
and the plane's own components are not audited, so the log stays small.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from gpuclaimctl.controlplane import build
from gpuclaimctl.controlplane.pki import PKI, load_or_make_pki

APISERVER = "kube-apiserver"
ETCD = "etcd"
SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
KWOK = "kwok"
OPTIONAL = (SCHEDULER, CONTROLLER_MANAGER, KWOK)

# kwok manages only nodes carrying this annotation, so a node a test makes
# without it stays unmanaged (NotReady), as a real broken node would.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"

SERVICE_CIDR = "10.0.0.0/24"
UNCACHED_RESOURCE = "podtemplates"
KWOK_STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
# Who is audited, and how much: verb, user and object reference, no bodies.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
_PR_SET_PDEATHSIG = 1


# In a plane's folder: the Kubernetes minor that last ran it ("1.36").
VERSION_FILE = "kubernetes-minor"
# Every plane kept before the minor was recorded ran v1.37.2.
KEPT_UNRECORDED = "1.37"


def _minor_number(minor: str) -> int:
    """"1.36" -> 36: every supported minor has major 1."""
    return int(minor.partition(".")[2])


class ControlPlaneError(Exception):
    """A component failed to start or answer; the message has its log tail."""


@dataclasses.dataclass
class _Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. The kernel sends SIGKILL to
    # the child when the thread that forked it dies, so even `kill -9` of
    # the launcher leaves no orphan.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgid(0, 0)


class ControlPlane:
    """A real etcd + kube-apiserver (+ scheduler, controller-manager, kwok).

    Use as a context manager or call start()/stop(). `kubeconfig` is written
    once the API server is ready; `server` is its https URL.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        components: Iterable[str] = (),
        log: Callable[[str], None] = lambda _m: None,
        ready_timeout: float = 90.0,
        admission_plugins: Iterable[str] = (),
        profiling: bool = False,
        audit: bool = True,
        extra_flags: Mapping[str, Iterable[str]] | None = None,
        version: str | None = None,
    ) -> None:
        # Which Kubernetes minor runs ("1.35"); a bad name is a BuildError now.
        self.minor = build.selected_minor(version)
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gpuclaimctl-plane-"))
        self._wanted = [c for c in components]
        for c in self._wanted:
            if c not in OPTIONAL:
                raise ValueError(f"unknown component {c!r}; choose from {', '.join(OPTIONAL)}")
        self._log = log
        self._ready_timeout = ready_timeout
        # Beyond the API server's default set, for tests of what a stricter
        # cluster would refuse (OwnerReferencesPermissionEnforcement, say).
        self._admission_plugins = list(admission_plugins)
        # kube-apiserver's /debug/pprof (benchmarks ask where its CPU goes).
        self._profiling = profiling
        # The audit log of service accounts' requests (tests read it); a
        # kept plane's would grow with every run of the controller.
        self._audit = audit
        # Component name -> flags added after its own (a feature gate, a
        # beta API: `--feature-gates=GenericWorkload=true`); a flag given
        # twice takes the last value, so these may override ours.
        self._extra_flags = {name: list(flags) for name, flags in (extra_flags or {}).items()}
        for name in self._extra_flags:
            if name not in (ETCD, APISERVER, *OPTIONAL):
                raise ValueError(f"extra flags for unknown component {name!r}")
        # Whether etcd's data was there already when this plane started.
        self.resumed = False
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.RLock()
        self.bin: dict[str, Path] = {}
        self.pki: PKI | None = None
        self.etcd_port = _free_port()
        self.etcd_peer_port = _free_port()
        self.apiserver_port = _free_port()
        self.kubeconfig = self.workdir / "kubeconfig"
        self.audit_log = self.workdir / "audit.log"
        self._atexit_registered = False

    # -- lifecycle ------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self.resumed = (self.workdir / "etcd" / "member").is_dir()
            if self.resumed:
                self._check_kept_version()  # before a build it would make for nothing
            self.bin = build.ensure_binaries(log=self._log,
                                             components=build.plane_components(self.minor))
            self.workdir.mkdir(parents=True, exist_ok=True)
            if not self._owns_workdir:
                self._set_previous_logs_aside()
            self.pki = load_or_make_pki(self.workdir / "pki")
            self._write_kubeconfig()
            self._start_etcd()
            self.start_apiserver()
            (self.workdir / VERSION_FILE).write_text(self.minor + "\n")
            self.ensure(*self._wanted)
        except BaseException:
            self.stop()
            raise

    def ensure(self, *components: str) -> None:
        """Start the optional components that are not running yet, side by
        side, and return once they all stayed up for a moment."""
        starters = {
            SCHEDULER: self._start_scheduler,
            CONTROLLER_MANAGER: self._start_controller_manager,
            KWOK: self._start_kwok,
        }
        for component in components:
            if component not in starters:
                raise ValueError(f"unknown component {component!r}")
        with self._lock:
            started = []
            for component in components:
                p = self._procs.get(component)
                if p is not None and p.popen is not None and p.popen.poll() is None:
                    continue
                starters[component]()
                started.append(component)
            self._wait_stayed_up(started)

    def running(self) -> dict[str, int]:
        """Name → pid of every component process still alive."""
        with self._lock:
            return {
                n: p.popen.pid
                for n, p in self._procs.items()
                if p.popen is not None and p.popen.poll() is None
            }

    def _check_kept_version(self) -> None:
        """Refuse a kept plane last run by a newer minor, or by one more than
        a minor older (kubeadm's rules for a real cluster's upgrade)."""
        recorded = self.workdir / VERSION_FILE
        # Planes kept before versions were recorded all ran the newest.
        last = recorded.read_text().strip() if recorded.exists() else KEPT_UNRECORDED
        step = _minor_number(self.minor) - _minor_number(last)
        if step == 0:
            return
        if step == 1:
            self._log(f"upgrading the plane kept in {self.workdir} from Kubernetes {last} "
                      f"to {self.minor}")
            return
        if step < 0:
            why = (f"Kubernetes does not go back a minor version: its data may hold what "
                   f"{self.minor} cannot read")
        else:
            between = f"1.{_minor_number(last) + 1}"
            why = (f"Kubernetes upgrades one minor version at a time: run it with "
                   f"{between} once first")
        raise ControlPlaneError(f"the plane kept in {self.workdir} was last run by Kubernetes "
                                f"{last}, not {self.minor}; {why}, or start afresh")

    def _set_previous_logs_aside(self) -> None:
        logs = self.workdir / "logs"
        if logs.is_dir():
            previous = self.workdir / "logs.previous"
            shutil.rmtree(previous, ignore_errors=True)
            logs.rename(previous)

    def stop(self) -> None:
        """Stop everything this plane started, newest first. Idempotent."""
        with self._lock:
            for name in reversed(list(self._procs)):
                self._stop_proc(self._procs[name])
            if self._owns_workdir and not os.environ.get("GPUCLAIMCTL_KEEP_PLANE"):
                shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the API server, restartable for tests ----------------------------

    def start_apiserver(self) -> None:
        assert self.pki is not None
        p = self.pki
        argv = [
            str(self.bin[APISERVER]),
            f"--etcd-servers={self.etcd_endpoint}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Nothing runs in-cluster here; the reconciler of the `kubernetes`
            # Service's endpoints refuses a loopback address.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # Tests make thousands of objects quickly from one client.
            "--max-requests-inflight=1000",
            "--max-mutating-requests-inflight=500",
            "--enable-priority-and-fairness=false",
            f"--profiling={'true' if self._profiling else 'false'}",
            # PodTemplates skip the watch cache and are watched straight from
            # etcd, so tests can see what an etcd compaction does to a watch:
            # the cache would keep serving old revisions from its own window.
            f"--watch-cache-sizes={UNCACHED_RESOURCE}#0",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
        ]
        if self._audit:
            policy = self.workdir / "audit-policy.json"
            policy.write_text(json.dumps(AUDIT_POLICY))
            argv += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                # Each event is on disk before its request's response is sent.
                "--audit-log-mode=blocking",
            ]
        if self._admission_plugins:
            argv.append(f"--enable-admission-plugins={','.join(self._admission_plugins)}")
        self._spawn(APISERVER, argv)
        self._wait_ready(APISERVER, lambda: self._get("/readyz") == 200)

    def stop_apiserver(self) -> None:
        with self._lock:
            p = self._procs.get(APISERVER)
            if p is not None:
                self._stop_proc(p)

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """Audit events of service accounts' requests so far, oldest first.

        One event per request: a watch's ResponseStarted is replaced by its
        ResponseComplete once that is written. `user` keeps one user's
        (`system:serviceaccount:<namespace>:<name>`).
        """
        if not self.audit_log.exists():
            return []
        by_id: dict[str, dict[str, Any]] = {}
        for line in self.audit_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the last line, half written
            if user is None or event.get("user", {}).get("username") == user:
                by_id.pop(event["auditID"], None)
                by_id[event["auditID"]] = event
        return sorted(by_id.values(), key=lambda e: str(e.get("requestReceivedTimestamp")))

    # -- etcd ------------------------------------------------------------

    def etcd_revision(self) -> int:
        body = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        header = body["header"]
        assert isinstance(header, dict)
        return int(header["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision; return that revision."""
        rev = self.etcd_revision()
        self._etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def _etcd_post(self, path: str, payload: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(
            self.etcd_endpoint + path, data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            result: dict[str, object] = json.loads(resp.read())
            return result

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(self.bin[ETCD]),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_endpoint}",
            f"--advertise-client-urls={self.etcd_endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--listen-metrics-urls=",
            "--log-level=warn",
        ]
        if self._owns_workdir:
            # A throwaway store: fsync buys nothing here and slows every write.
            argv.append("--unsafe-no-fsync")
        self._spawn(ETCD, argv)
        self._wait_ready(ETCD, self._etcd_healthy)

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.etcd_endpoint + "/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    # -- optional components ----------------------------------------------

    def _component_auth(self, name: str) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}",
            f"--cert-dir={self.workdir / 'certs' / name}",
        ]

    def _start_scheduler(self) -> None:
        argv = [str(self.bin[SCHEDULER]), *self._component_auth(SCHEDULER), "--leader-elect=false"]
        self._spawn(SCHEDULER, argv)

    def _start_controller_manager(self) -> None:
        assert self.pki is not None
        argv = [
            str(self.bin[CONTROLLER_MANAGER]), *self._component_auth(CONTROLLER_MANAGER),
            "--leader-elect=false",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--use-service-account-credentials=false",
            # Fake nodes have no cloud and no CIDRs; GC and the workload
            # controllers (Job, ReplicaSet, StatefulSet) are what tests use.
            "--allocate-node-cidrs=false",
            "--controllers=*,-node-ipam-controller",
            "--concurrent-gc-syncs=5",
        ]
        self._spawn(CONTROLLER_MANAGER, argv)

    def _start_kwok(self) -> None:
        argv = [
            str(self.bin[KWOK]),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={KWOK_STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
            "--cidr=10.244.0.1/16",
            "--node-ip=10.244.0.1",
            "--node-lease-duration-seconds=40",
        ]
        self._spawn(KWOK, argv)

    def _wait_stayed_up(self, names: list[str]) -> None:
        # These components have no readiness endpoint we can reach without
        # more certificates; it is enough that they stay up for a moment
        # (together: they start side by side).
        if not names:
            return
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            for name in names:
                p = self._procs[name]
                if p.popen is not None and p.popen.poll() is not None:
                    raise ControlPlaneError(self._failure(name, "exited during start"))
            time.sleep(0.1)

    # -- processes ---------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [*argv, *self._extra_flags.get(name, ())]
        proc = _Proc(name, argv, log)
        with open(log, "ab") as out:
            proc.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent, cwd=self.workdir,
            )
        with self._lock:
            self._procs[name] = proc
        self._log(f"started {name} (pid {proc.popen.pid}), log {log}")

    def _stop_proc(self, p: _Proc, grace: float = 10.0) -> None:
        popen = p.popen
        if popen is None or popen.poll() is not None:
            return
        try:
            os.killpg(popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()

    def _wait_ready(self, name: str, ready: Callable[[], bool]) -> None:
        p = self._procs[name]
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            if p.popen is not None and p.popen.poll() is not None:
                raise ControlPlaneError(self._failure(name, f"exited with {p.popen.returncode}"))
            if ready():
                return
            time.sleep(0.1)
        raise ControlPlaneError(self._failure(name, f"not ready after {self._ready_timeout:.0f}s"))

    def log_tail(self, name: str, lines: int = 30) -> str:
        p = self._procs.get(name)
        if p is None or not p.log.exists():
            return ""
        return "\n".join(p.log.read_text(errors="replace").splitlines()[-lines:])

    def _failure(self, name: str, what: str) -> str:
        return f"{name} {what}; last lines of {self._procs[name].log}:\n{self.log_tail(name)}"

    # -- client side ---------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _open(self, path: str, timeout: float) -> Any:
        """A GET of `path` as the admin (urlopen raises on an error status)."""
        return urllib.request.urlopen(self.server + path, timeout=timeout,
                                      context=self._ssl_context())

    def read(self, path: str, timeout: float) -> bytes:
        """GET `path` from the API server as the admin; the body (raises on
        an error status or a failed connection)."""
        with self._open(path, timeout) as r:
            body: bytes = r.read()
            return body

    def _get(self, path: str) -> int:
        try:
            with self._open(path, 5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.pki.admin_cert),
                "client-key": str(self.pki.admin_key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        # JSON is YAML; every Kubernetes client reads it. Replaced whole: a
        # reader never sees half a file, and a link left at this path is
        # replaced, not followed.
        tmp = self.kubeconfig.with_name(f".{self.kubeconfig.name}.{os.getpid()}")
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(self.kubeconfig)
