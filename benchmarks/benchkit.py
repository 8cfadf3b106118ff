"""What the controller benchmark needs around the code it measures: the plane
(CRDs, kwok GPU nodes, an audited service account), CPU readings from /proc,
the API server's audit log as requests by client, and a restartable watch
that timestamps what it sees.

Nothing here decides or fails on a time: waits return False when they run
out, and say why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import orjson
import urllib3
import yaml
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE, ControlPlane
from gpuclaimctl.model import api

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent
CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"
POOL_LABEL = "bench.gpuclaimctl.io/pool"
TICKS = os.sysconf("SC_CLK_TCK")
# The API server ends each watch after this long and the watch starts again
# from its last resourceVersion, so a restart is routine, not a rare path.
WATCH_SECONDS = 60
# A watch that delivers nothing (not even a bookmark) for this long is dead.
WATCH_READ_TIMEOUT = WATCH_SECONDS + 30
MUTATING = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def poll(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """For setting up: wait for predicate, or exit naming what never came."""
    if not wait_until(predicate, timeout):
        raise SystemExit(f"controller_bench: timed out after {timeout:.0f}s waiting for {what}")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# -- CPU and load ------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    """utime + stime of a process, all its threads (fields 14, 15; comm may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])  # guest time is already in user


def load() -> tuple[float, float, float]:
    """`uptime`'s load averages."""
    return os.getloadavg()


def wait_idle(pid: int, timeout: float, cores: float = 0.02) -> bool:
    """Wait until a process uses less than `cores` over a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = process_cpu(pid)
        time.sleep(1.0)
        if process_cpu(pid) - before < cores:
            return True
    return False


# -- the plane ------------------------------------------------------------------------


def new_client(kubeconfig: str, pool: int, user_agent: str | None = None) -> client.ApiClient:
    api_client: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    api_client.configuration.connection_pool_maxsize = pool
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool
    if user_agent:
        api_client.user_agent = user_agent
    return api_client


def post(api_client: client.ApiClient, path: str, body: Obj) -> None:
    try:
        kube.request(api_client, "POST", path, body=body)
    except kube.ApiError as e:
        if e.status != 409:
            raise


def install_crds(api_client: client.ApiClient) -> None:
    names = []
    for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                post(api_client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                names.append(doc["metadata"]["name"])

    def established(name: str) -> bool:
        crd = kube.request_json(api_client, "GET",
                                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or ())

    poll(lambda: all(established(n) for n in names), 60, "the CRDs to be established")


def gpu_patch(gpus: int) -> Obj:
    return {"status": {"allocatable": {api.DEFAULT_RESOURCE_NAME: str(gpus)},
                       "capacity": {api.DEFAULT_RESOURCE_NAME: str(gpus)}}}


def node_manifest(name: str, gpus: int) -> Obj:
    # As tests/helpers.gpu_node_manifest makes them: kwok keeps it Ready.
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110", api.DEFAULT_RESOURCE_NAME: str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", POOL_LABEL: "a"},
                     "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE}},
        "spec": {"taints": []},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def make_nodes(api_client: client.ApiClient, count: int, gpus: int) -> list[str]:
    names = [f"gpu-node-{i:04d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: post(api_client, "/api/v1/nodes", node_manifest(n, gpus)), names))

    def ready() -> bool:
        nodes = kube.request_json(api_client, "GET", "/api/v1/nodes",
                                  query=[("labelSelector", f"{POOL_LABEL}=a")])["items"]
        return sum(1 for n in nodes if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (n.get("status") or {}).get("conditions") or ())) == count

    poll(ready, 180, f"kwok to report {count} nodes Ready")
    return names


def set_node_gpus(api_client: client.ApiClient, node: str, gpus: int) -> None:
    kube.request(api_client, "PATCH", f"/api/v1/nodes/{node}/status", body=gpu_patch(gpus),
                 content_type="application/merge-patch+json")


def audited_kubeconfig(plane: ControlPlane, admin: client.ApiClient, path: Path) -> str:
    """A kubeconfig holding the token of a new cluster-admin service account.

    The plane's audit log records service accounts' requests only
    (plane.AUDIT_POLICY), so what runs with this kubeconfig has every request
    it sends in the log, with its User-Agent.
    """
    assert plane.pki is not None
    namespace, name = "controller-bench", f"bench-{uuid.uuid4().hex[:6]}"
    post(admin, "/api/v1/namespaces", {"metadata": {"name": namespace}})
    post(admin, f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    post(admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
         {"metadata": {"name": name},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                      "name": "cluster-admin"},
          "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    review = kube.request_json(
        admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 86400}})
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": plane.server, "certificate-authority": str(plane.pki.ca_cert)}}],
        "users": [{"name": name, "user": {"token": review["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
        "current-context": name,
    }))
    return str(path)


def make_namespace(api_client: client.ApiClient, name: str) -> None:
    post(api_client, "/api/v1/namespaces", {"metadata": {"name": name}})
    # kube-controller-manager makes it too, but maybe not before the first pod.
    post(api_client, f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})


def clean(admin: client.ApiClient, namespace: str, timeout: float = 180.0) -> bool:
    """Delete a namespace's claims (finalizers dropped: no controller runs now),
    pods and the namespace; False if it is not gone within `timeout`."""
    base = f"{CLAIMS}/namespaces/{namespace}/gpuclaims"
    try:
        claims = kube.list_all(admin, base)
    except kube.ApiError as e:
        if e.status == 404:
            return True
        raise

    def unfinalize(c: Obj) -> None:
        try:
            kube.request(admin, "PATCH", f"{base}/{c['metadata']['name']}",
                         body={"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
        except kube.ApiError as e:
            if e.status != 404:
                raise

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(unfinalize, claims))
    kube.request(admin, "DELETE", base)
    kube.request(admin, "DELETE", f"/api/v1/namespaces/{namespace}/pods",
                 query=[("gracePeriodSeconds", "0")])
    kube.request(admin, "DELETE", f"/api/v1/namespaces/{namespace}")

    def gone() -> bool:
        try:
            kube.request(admin, "GET", f"/api/v1/namespaces/{namespace}")
            return False
        except kube.ApiError as e:
            return e.status == 404

    return wait_until(gone, timeout, 0.5)


# -- the audit log: requests by client ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """One audited request: when it was received (epoch seconds), by whom, what."""

    at: float
    agent: str
    verb: str
    resource: str      # "pods", "gpuclaims/status", ...
    namespace: str
    name: str
    code: int

    @property
    def what(self) -> str:
        return f"{self.verb} {self.resource}"


class AuditLog:
    """Reads the plane's audit log as it grows; keeps the requests of the
    clients whose User-Agent starts with one of `agents`.

    Each request counts once: a watch when its response starts, anything
    else when its response is complete (the policy omits RequestReceived).
    """

    def __init__(self, path: Path, agents: Iterable[str], ignore: Iterable[str] = ()) -> None:
        """`ignore`: resources whose requests are not kept (a leader's Lease
        renewals, which never pause, would keep `wait_quiet` waiting)."""
        self._path = path
        self._agents = tuple(agents)
        self._ignore = frozenset(ignore)
        self._offset = 0
        self._rest = b""
        self._lock = threading.Lock()
        self.requests: list[Request] = []

    def read(self) -> list[Request]:
        with self._lock:
            try:
                with open(self._path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return self.requests
            self._offset += len(data)
            *lines, self._rest = (self._rest + data).split(b"\n")
            for line in lines:
                r = self._parse(line)
                if r is not None:
                    self.requests.append(r)
            return self.requests

    def _parse(self, line: bytes) -> Request | None:
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        agent = str(e.get("userAgent", ""))
        if not agent.startswith(self._agents):
            return None
        stage, verb = e.get("stage"), e.get("verb", "")
        if not ((stage == "ResponseStarted" and verb == "watch")
                or (stage in ("ResponseComplete", "Panic") and verb != "watch")):
            return None
        ref = e.get("objectRef") or {}
        if ref.get("resource", "") in self._ignore:
            return None
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        return Request(datetime.fromisoformat(e["requestReceivedTimestamp"]).timestamp(), agent,
                       verb, resource, ref.get("namespace", ""), ref.get("name", ""),
                       int((e.get("responseStatus") or {}).get("code", 0)))

    def between(self, agent: str, start: float, end: float) -> list[Request]:
        return [r for r in self.read() if r.agent.startswith(agent) and start <= r.at <= end]

    def last(self, agent: str) -> float:
        """When the latest request of `agent` was received (epoch seconds), or 0."""
        return max((r.at for r in self.read() if r.agent.startswith(agent)), default=0.0)

    def wait_quiet(self, agent: str, quiet: float, timeout: float,
                   alive: Callable[[], bool] = lambda: True) -> bool:
        """Wait until `agent` has sent nothing for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive():
            if time.time() - max(self.last(agent), 0.0) >= quiet:
                return True
            time.sleep(0.25)
        return False


def by_verb(requests: Iterable[Request]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for r in requests:
        out[r.what] += 1
    return dict(out)


_REQUEST_SAMPLE = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def all_requests(admin: client.ApiClient) -> float:
    """Requests the API server has served since it started, every client (its /metrics)."""
    text = kube.request(admin, "GET", "/metrics").decode()
    return sum(float(v) for _labels, v in _REQUEST_SAMPLE.findall(text))


# -- a watch that survives the server closing it ----------------------------------------


Handler = Callable[[str, Obj, float], None]


class Watch:
    """List, then watch one collection; `handler(type, object, monotonic time)`
    gets every ADDED, MODIFIED and DELETED, in a thread of its own.

    A watch the server ends (its timeout, a restart, a dropped connection) is
    started again from the last resourceVersion seen (bookmarks included);
    when that is too old (410) or the watch fails, the collection is listed
    again and each object is handed over as "RELISTED" at the time of that
    list: an upper bound, counted in `relisted`. Every wait has a timeout.
    """

    def __init__(self, api_client: client.ApiClient, path: str, handler: Handler,
                 name: str) -> None:
        self._api = api_client
        self._path = path
        self._handler = handler
        self.name = name
        self._stopping = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"bench-watch-{name}", daemon=True)
        self.restarts = 0
        self.relists = 0
        self.relisted = 0
        self.errors: list[str] = []
        self._rv = ""

    def start(self, timeout: float = 60.0) -> Watch:
        """List (again while the server answers 429 or 5xx, as a fresh CRD's
        storage does while it initializes), then watch from that list."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._rv = self._list(initial=True)
                break
            except kube.ApiError as e:
                if not (e.status == 429 or e.status >= 500) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        self._thread.start()
        return self

    def _list(self, initial: bool = False) -> str:
        page = kube.request_json(self._api, "GET", self._path)
        now = time.monotonic()
        if not initial:
            self.relists += 1
        for item in page.get("items") or ():
            if not initial:
                self.relisted += 1
            self._handler("ADDED" if initial else "RELISTED", item, now)
        return str(page["metadata"]["resourceVersion"])

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self._rv:
                    self._rv = self._list()
                self._watch_once()
            except Exception as e:  # the stream broke: note it, relist, go on
                if self._stopping.is_set():
                    return
                self.errors.append(f"{type(e).__name__}: {e}"[:200])
                say(f"watch {self.name} broke ({self.errors[-1]}); listing again")
                self._rv = ""
                self._stopping.wait(0.5)
            else:
                self.restarts += 1

    def _watch_once(self) -> None:
        cfg = self._api.configuration
        headers = {"Accept": "application/json"}
        self._api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
        resp = self._api.rest_client.pool_manager.request(
            "GET", f"{cfg.host}{self._path}?watch=true&allowWatchBookmarks=true"
                   f"&resourceVersion={self._rv}&timeoutSeconds={WATCH_SECONDS}",
            headers=headers, preload_content=False, retries=False,
            timeout=urllib3.Timeout(connect=10, read=WATCH_READ_TIMEOUT))
        self._resp = resp
        try:
            if resp.status != 200:
                raise RuntimeError(f"watch answered {resp.status}: {resp.read()[:200]!r}")
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                now = time.monotonic()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line and not self._event(orjson.loads(line), now):
                        return
        finally:
            self._resp = None
            _close(resp)

    def _event(self, event: Obj, now: float) -> bool:
        """Hand an event over; False when the watch must end (an ERROR)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            # 410 Gone: the resourceVersion is too old to resume; list again.
            self.errors.append(f"ERROR {obj.get('code')}: {obj.get('message', '')}"[:200])
            self._rv = ""
            return False
        self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
        if kind != "BOOKMARK":
            self._handler(str(kind), obj, now)
        return True

    def stop(self) -> None:
        """Never raises: the connection may be closed already."""
        self._stopping.set()
        resp = self._resp
        if resp is not None:
            _close(resp)
        if self._thread.ident is not None:  # started
            self._thread.join(5.0)


def _close(resp: Any) -> None:
    # shutdown() wakes a thread blocked reading; either may find the socket
    # closed already (that was the EBADF a closed watch used to crash with).
    for method in ("shutdown", "release_conn", "close"):
        try:
            getattr(resp, method)()
        except Exception:
            pass


def percentile(values: list[float], q: float) -> float:
    """Nearest rank of sorted `values`: p99 of 1,000 is the 990th."""
    if not values:
        return float("nan")
    rank = max(1, int(-(-q * len(values) // 100)))
    return values[min(rank, len(values)) - 1]
