"""`gpuclaimctl run --local`: a real control plane with sample GPU nodes.

For a newcomer without a cluster: builds the plane's binaries once (cached),
starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
kwok on loopback, installs the CRDs, and adds four fake GPU nodes (8, 8, 4
and 2 GPUs, labelled by model) and a GPUClass per model. The controller then
runs against it as in a cluster: under deploy/'s service account and roles
(controlplane.identity), never the admin credentials the user holds (the
webhook leaves the controller's own requests alone, so it would leave that
user's pods ungated), and serving the admission webhook to the local API
server: deploy/webhook.yaml's configurations with a `url:` on loopback, the
CA and certificate made and injected by the controller's own CertKeeper.
`--no-local-webhook` runs without it (and removes an earlier run's
configurations). Ctrl-C stops everything and says what is kept.

The local cluster is kept across runs in `state_dir()`
(`~/.cache/gpuclaimctl/local`): etcd's data and the PKI the objects in it
depend on. Its kubeconfig is there at one stable path, rewritten each start
for the new ports, so the line the quick start copies names the plane that
runs now. The CRDs, the controller's roles and the webhook configurations
are applied again each start (deploy/ may have changed); the sample nodes
and classes are created when missing, a user's edits to them kept.
`--fresh` (`make run-clean`) wipes the state first. One run at a time uses
it: a second one is refused while the first holds its lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.model import api
from gpuclaimctl.client.errors import AlreadyExists, NotFound
from gpuclaimctl.cmd import startwait
from gpuclaimctl.cmd.bindaddress import format_bind_address, on_loopback, parse_bind_address
from gpuclaimctl.cmd.options import DEFAULT_WEBHOOK_CERT_DIR, Options
from gpuclaimctl.controlplane import (
    CONTROLLER_MANAGER,
    KWOK,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SCHEDULER,
    ControlPlane,
    ControlPlaneError,
    build,
)
from gpuclaimctl.controlplane import identity
from gpuclaimctl.webhook import configurations

DEPLOY = identity.DEPLOY
# The namespace the quick start puts the samples in (README's examples use it).
SAMPLES_NAMESPACE = "team-a"
MODEL_LABEL = "nvidia.com/gpu.product"
# name, GPUs, model (the label NVIDIA GPU feature discovery sets), class.
SAMPLE_NODES = (
    ("gpu-a100-0", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    ("gpu-a100-1", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    ("gpu-h100-0", 4, "NVIDIA-H100-80GB-HBM3", "h100"),
    ("gpu-l4-0", 2, "NVIDIA-L4", "l4"),
)


def say(message: str) -> None:
    print(f"[local] {message}", file=sys.stderr, flush=True)


def state_dir() -> Path:
    """Where the local cluster is kept across runs."""
    return build.cache_root() / "local"


LOCK_FILE = ".lock"
CONTROLLER_KUBECONFIG = "controller.kubeconfig"
MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"


class LocalCluster:
    """The running local plane and the lock on its kept state."""

    def __init__(self, plane: ControlPlane, lock: IO[str]) -> None:
        self.plane = plane
        self.state = plane.workdir
        self._lock = lock
        self._stopped = False
        # The lines a person copies to use the cluster: said once the
        # controller and its webhook answer (`announce`), not before: a pod
        # created while the webhook did not serve yet was refused
        # ("failed calling webhook").
        self.quick_start = ""
        # The admin's client, when the webhook is registered: `announce`
        # first checks that the API server reaches it.
        self.webhook_probe: client.ApiClient | None = None

    def announce(self) -> None:
        """The controller is ready (caches synced, webhook answering): the
        lines to use the cluster, once."""
        if self.quick_start:
            if self.webhook_probe is not None:
                _wait_webhook_reached(self.webhook_probe)
            say("control plane ready; in another terminal:")
            print(self.quick_start, file=sys.stderr, flush=True)
            self.quick_start = ""

    def stop(self) -> None:
        """Stop the plane (its state stays), saying so; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        say(f"stopping the local cluster; its state is kept in {self.state}: the next "
            "`make run` resumes it, `make run-clean` starts afresh")
        try:
            self.plane.stop()
        finally:
            self._lock.close()
        say("stopped")


def start(options: Options) -> tuple[LocalCluster, Options]:
    """Start (or resume) the local cluster; the options the controller runs
    with there: its service account's kubeconfig, endpoints on loopback, the
    webhook on loopback as registered (or off)."""
    state = state_dir()
    lock = _lock(state)
    try:
        if options.fresh:
            _wipe(state)
        kept = (state / "etcd").exists()
        plane = ControlPlane(state, components=(SCHEDULER, CONTROLLER_MANAGER, KWOK), log=say,
                             audit=False)
        try:
            plane.start()
        except ControlPlaneError as e:
            hint = (f"\nthe local cluster kept in {state} did not start again; `make run-clean` "
                    "(gpuclaimctl run --local --fresh) starts afresh") if kept else ""
            raise SystemExit(f"gpuclaimctl: {e}{hint}") from None
    except BaseException as e:
        lock.close()
        if isinstance(e, KeyboardInterrupt):
            say(f"interrupted while starting; the local cluster's state is kept in {state}")
        raise
    cluster = LocalCluster(plane, lock)
    try:
        options = _local_options(options, state)
        admin = config.new_client_from_config(config_file=str(plane.kubeconfig))
        install(admin)
        controller = identity.controller_identity(plane, state / CONTROLLER_KUBECONFIG)
        webhook = parse_bind_address(options.webhook_bind_address, "--webhook-bind-address")
        if webhook is None:
            unregister_webhook(admin)
        else:
            register_webhook(admin, f"https://{format_bind_address(*webhook)}")
            cluster.webhook_probe = admin
        contents = _contents(admin) if plane.resumed else ""
    except BaseException:
        cluster.stop()
        raise
    # A new API server process: the writes of an earlier run's controller
    # went to the one that run stopped (with its etcd) before this one
    # started, and etcd's kept data holds every one that landed, so none
    # can land after the controller's first list here: it need not wait.
    startwait.own_api_server(str(plane.kubeconfig))
    startwait.own_api_server(str(controller.kubeconfig))
    if plane.resumed:
        say(f"resuming the local cluster kept in {state}: {contents} "
            "(`make run-clean` starts afresh)")
    else:
        say(f"a fresh local cluster, kept in {state} across runs "
            "(`make run-clean` starts afresh)")
    say(f"the controller runs as {controller.username} (deploy/'s roles), "
        "not as the admin of the kubeconfig below")
    if webhook is None:
        say("no admission webhook (--no-local-webhook): pods are checked only after they are made")
    else:
        say(f"admission webhook on https://{format_bind_address(*webhook)}; "
            "--no-local-webhook (GPUCLAIMCTL_LOCAL_WEBHOOK=false) runs without it")
    # Bare lines, to copy as they are (said by `announce`).
    cluster.quick_start = (f"export KUBECONFIG={shlex.quote(str(plane.kubeconfig))}\n"
                           f"alias kubectl={shlex.quote(str(plane.bin['kubectl']))}\n"
                           f"alias gpuclaimctl={shlex.quote(_tool())}\n"
                           f"kubectl create namespace {SAMPLES_NAMESPACE}\n"
                           f"kubectl apply -n {SAMPLES_NAMESPACE} -f {shlex.quote(str(DEPLOY / 'samples'))}")
    # Still `local`: the process runs against the plane it started.
    return cluster, dataclasses.replace(options, kubeconfig=str(controller.kubeconfig))


def _lock(state: Path) -> IO[str]:
    """Hold the state's lock until the returned file is closed (or the
    process ends); refuse, with one line, while another run holds it."""
    state.mkdir(parents=True, exist_ok=True)
    f = open(state / LOCK_FILE, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise SystemExit(f"gpuclaimctl: another `gpuclaimctl run --local` (pid {holder}) is using "
                         f"{state}; stop it first, or set GPUCLAIMCTL_CACHE to keep a cluster "
                         "elsewhere") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _wipe(state: Path) -> None:
    """Remove the kept cluster (not the lock this run holds)."""
    say(f"--fresh: removing the local cluster kept in {state}")
    for child in state.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _local_options(options: Options, state: Path) -> Options:
    """Endpoints on loopback (nothing beyond this machine reaches a demo);
    the webhook there too, on a free port for port 0 (its configurations
    name the port before it listens), its files in the state folder, its
    certificate made for the address the API server calls; or off."""
    options = dataclasses.replace(
        options,
        metrics_bind_address=on_loopback(options.metrics_bind_address, "--metrics-bind-address"),
        health_bind_address=on_loopback(options.health_bind_address, "--health-bind-address"))
    address = (on_loopback(options.webhook_bind_address, "--webhook-bind-address")
               if options.local_webhook else "0")
    bind = parse_bind_address(address, "--webhook-bind-address")
    if bind is None:
        return dataclasses.replace(options, webhook_bind_address="0")
    host, port = bind
    if port == 0:
        port = _free_port(host)
    cert_dir = options.webhook_cert_dir
    if cert_dir == DEFAULT_WEBHOOK_CERT_DIR:
        cert_dir = str(state / "webhook-certs")
    hosts = options.webhook_hosts if host in options.webhook_hosts else (*options.webhook_hosts, host)
    return dataclasses.replace(options, webhook_bind_address=format_bind_address(host, port),
                               webhook_cert_dir=cert_dir, webhook_hosts=hosts)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# How long `announce` waits for the API server to reach the webhook.
WEBHOOK_REACHED_TIMEOUT = 20.0


def _wait_webhook_reached(admin: client.ApiClient) -> None:
    """Until the API server calls the webhook with success: a server-side
    dry run of a pod whose claims annotation is not JSON is refused BY the
    webhook (an answer of the webhook's own), not with "failed calling
    webhook" (not serving yet, or its CA not yet in the configuration the
    API server reads). Gives up quietly after WEBHOOK_REACHED_TIMEOUT."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "gpuclaimctl-probe-",
                         "annotations": {api.CLAIMS_ANNOTATION: "not json"}},
            "spec": {"automountServiceAccountToken": False,
                     "schedulingGates": [{"name": api.SCHEDULING_GATE}],
                     "containers": [{"name": "probe", "image": "busybox"}]}}
    deadline = time.monotonic() + WEBHOOK_REACHED_TIMEOUT
    while time.monotonic() < deadline:
        try:
            kube.request(admin, "POST", "/api/v1/namespaces/default/pods",
                         query=[("dryRun", "All")], body=body)
            return  # admitted (the webhook's rules did not match): it answered
        except kube.ApiError as e:
            if "failed calling webhook" not in (e.message or "") and e.status < 500:
                return  # refused by the webhook itself
        except OSError:
            pass
        time.sleep(0.2)


def register_webhook(admin: client.ApiClient, url: str) -> None:
    """deploy/webhook.yaml's configurations calling `url`, and its empty
    Secret for the certificate (the controller's roles may update it, not
    create it; one kept from an earlier run keeps its certificate)."""
    docs = identity.deploy_docs("webhook.yaml")
    for doc in docs:
        if doc["kind"] == "Secret":
            _create(admin, f"/api/v1/namespaces/{doc['metadata']['namespace']}/secrets", doc)
    identity.apply(admin, [configurations.with_url(d, url) for d in docs
                           if d["kind"] in (MUTATING, VALIDATING)])


def unregister_webhook(admin: client.ApiClient) -> None:
    """Remove the configurations an earlier run registered: nothing serves them now."""
    for doc in identity.deploy_docs("webhook.yaml"):
        if doc["kind"] in (MUTATING, VALIDATING):
            try:
                kube.request(admin, "DELETE", identity.object_path(doc))
            except NotFound:
                pass


def _contents(admin: client.ApiClient) -> str:
    pods = len(kube.request_json(admin, "GET", "/api/v1/pods")["items"])
    claims = len(kube.request_json(admin, "GET", "/apis/gpuclaimctl.io/v1alpha1/gpuclaims")["items"])
    return f"{pods} pod{'s' * (pods != 1)}, {claims} GPU claim{'s' * (claims != 1)}"


def _tool() -> str:
    """How to run gpuclaimctl's own commands (status, why, simulate) from
    another terminal: the installed script beside this Python, if any."""
    script = Path(sys.executable).parent / "gpuclaimctl"
    return str(script) if script.exists() else f"{sys.executable} -m gpuclaimctl"


def install(api_client: client.ApiClient) -> None:
    """CRDs (applied: a kept cluster gets deploy/'s current ones), a
    GPUClass per model and the sample nodes (made when missing); idempotent."""
    crds: list[str] = []
    for path in sorted((DEPLOY / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                identity.apply(api_client, [doc])
                crds.append(doc["metadata"]["name"])
    if not crds:
        raise RuntimeError(f"no CRDs in {DEPLOY / 'crds'}: run from a checkout of gpuclaimctl")
    _wait_established(api_client, crds)
    classes = {cls: model for _n, _g, model, cls in SAMPLE_NODES}
    for cls, model in classes.items():
        _create(api_client, "/apis/gpuclaimctl.io/v1alpha1/gpuclasses", saved_config({
            "apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": cls}, "spec": {"nodeSelector": {MODEL_LABEL: model}}}))
    for name, gpus, model, _cls in SAMPLE_NODES:
        allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        _create(api_client, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, MODEL_LABEL: model},
                         "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE}},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)}})


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def saved_config(body: dict[str, Any]) -> dict[str, Any]:
    """The object as `kubectl create --save-config` makes it: `kubectl apply`
    of deploy/samples/gpuclass.yaml then finds the class it names unchanged,
    instead of warning that the annotation is missing. kubectl records the
    object with its other annotations, as Go encodes JSON (sorted keys)."""
    annotations = body["metadata"].setdefault("annotations", {})
    annotations[LAST_APPLIED] = json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n"
    return body


def _create(api_client: client.ApiClient, path: str, body: dict[str, Any]) -> None:
    try:
        kube.request(api_client, "POST", path, body=body)
    except AlreadyExists:
        pass


def _wait_established(api_client: client.ApiClient, names: list[str],
                      timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crds = kube.request_json(api_client, "GET",
                                 "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        established = {c["metadata"]["name"] for c in crds["items"]
                       if any(cond["type"] == "Established" and cond["status"] == "True"
                              for cond in (c.get("status") or {}).get("conditions") or ())}
        if established >= set(names):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the CRDs {', '.join(sorted(set(names) - established))} "
                       "were not established in time")
