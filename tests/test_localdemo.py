"""`make run` (`gpuclaimctl run --local`) and the README's quick start, as a
newcomer types them: the lines it prints to copy name the plane that is
running (not one an earlier run left behind), and `kubectl apply -f
deploy/samples/` works on it without a warning; the admission webhook
does in the demo what the README's Admission section promises, the
controller running as its own service account; the local cluster is kept
across runs, and `--fresh` (`make run-clean`) wipes it.

Each run gets a cache folder of its own whose component folders link to
the built binaries, so the state it keeps and the kubeconfig path it
publishes are the test's, not those of a `make run` going on beside it; and
its webhook listens on a free port, not :9443.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import json
from typing import Any

import pytest
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.cmd import localdemo
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.controlplane import build
from gpuclaimctl.model import api
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parent.parent


class LocalRun:
    """`python -m gpuclaimctl run --local` with its stderr collected."""

    def __init__(self, cache: Path, *flags: str) -> None:
        env = dict(os.environ, GPUCLAIMCTL_CACHE=str(cache), PYTHONPATH=str(REPO))
        for name in list(env):
            if name.startswith("GPUCLAIMCTL_") and name != "GPUCLAIMCTL_CACHE":
                del env[name]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuclaimctl", "run", "--local",
             "--metrics-bind-address", "0", "--health-bind-address", "0",
             "--webhook-bind-address", "127.0.0.1:0", *flags],
            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, prefix: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = "\n".join(self.lines[-30:])
        pytest.fail(f"`gpuclaimctl run --local` printed no line starting {prefix!r}:\n{tail}")

    def admin(self) -> client.ApiClient:
        """A client of the plane running now, as the README's KUBECONFIG line gives it."""
        export = self.wait_for_line("export KUBECONFIG=")
        admin: client.ApiClient = config.new_client_from_config(
            config_file=shlex.split(export.partition("=")[2])[0])
        return admin

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._reader.join(timeout=5)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache folder whose built components are links to the real cache's."""
    build.ensure_binaries(components=build.PLANE_COMPONENTS)
    root = tmp_path / "cache"
    (root / "controlplane").mkdir(parents=True)
    for component in build.PLANE_COMPONENTS:
        (root / "controlplane" / component.key).symlink_to(build.component_dir(component))
    return root


@pytest.mark.plane
def test_quick_start_lines_name_the_running_plane_and_samples_apply_without_warnings(
    cache: Path,
) -> None:
    stable = cache / "local" / "kubeconfig"
    # What a plane killed earlier leaves behind.
    stable.parent.mkdir()
    stable.symlink_to(Path("/tmp/gpuclaimctl-plane-gone/kubeconfig"))

    run = LocalRun(cache)
    try:
        export = run.wait_for_line("export KUBECONFIG=")
        alias = run.wait_for_line("alias kubectl=")
        tool = run.wait_for_line("alias gpuclaimctl=")
        run.wait_for_line("kubectl create namespace team-a")
        apply = run.wait_for_line("kubectl apply -n team-a -f ")
        assert len([line for line in run.lines if "KUBECONFIG" in line]) == 1
        kubeconfig = Path(shlex.split(export.partition("=")[2])[0])
        kubectl = shlex.split(alias.partition("=")[2])[0]
        samples = shlex.split(apply)[-1]
        assert kubeconfig == stable
        assert Path(samples) == REPO / "deploy" / "samples"
        # The alias runs gpuclaimctl's commands without the venv on PATH.
        version = subprocess.run([*shlex.split(shlex.split(tool.partition("=")[2])[0]), "version"],
                                 capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, PATH="/usr/bin:/bin"))
        assert version.returncode == 0, version.stderr

        def kubectl_run(*args: str) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([kubectl, *args], env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stderr}"
            return done

        classes = kubectl_run("get", "gpuclasses", "-o", "name").stdout.split()
        assert classes == ["gpuclass.gpuclaimctl.io/a100", "gpuclass.gpuclaimctl.io/h100",
                           "gpuclass.gpuclaimctl.io/l4"]

        kubectl_run("create", "namespace", "demo")
        applied = kubectl_run("apply", "-n", "demo", "-f", samples)
        assert applied.stderr.strip() == ""
        assert "gpuclass.gpuclaimctl.io/a100 unchanged" in applied.stdout.splitlines()
        assert "pod/trainer created" in applied.stdout.splitlines()
    finally:
        code = run.stop()
    assert code == 0, "\n".join(run.lines[-30:])
    # Ctrl-C says what happens to the cluster; the kubeconfig stays (it
    # names the kept cluster, whose next run rewrites it for its new port).
    assert any(line.startswith("[local] stopping the local cluster; its state is kept in "
                               f"{cache / 'local'}") for line in run.lines), run.lines[-10:]
    assert stable.is_file() and not stable.is_symlink()


# -- the admission webhook and the controller's identity (issue 45 item 2) ------------


def _namespace(admin: client.ApiClient, name: str, labels: dict[str, str] | None = None) -> None:
    kube.request(admin, "POST", "/api/v1/namespaces",
                 body={"metadata": {"name": name, "labels": labels or {}}})
    # kube-controller-manager makes the `default` account pods need; maybe not yet.
    try:
        kube.request(admin, "POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                     body={"metadata": {"name": "default"}})
    except kube.ApiError as e:
        if e.status != 409:
            raise


def _pod(name: str, *, gpus: int = 0, claims: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    meta: dict[str, Any] = {"name": name}
    if claims is not None:
        meta["annotations"] = {api.CLAIMS_ANNOTATION: claims}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}


def _create(admin: client.ApiClient, ns: str, pod: dict[str, Any], *,
            dry_run: bool = False) -> dict[str, Any]:
    created: dict[str, Any] = kube.request_json(
        admin, "POST", f"/api/v1/namespaces/{ns}/pods", body=pod,
        query=[("dryRun", "All")] if dry_run else None)
    return created


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == api.SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or ())


def _running_on(admin: client.ApiClient, ns: str, name: str) -> str | None:
    pod = kube.request_json(admin, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod["spec"].get("nodeName") if pod.get("status", {}).get("phase") == "Running" else None


def _nodes_of(cls: str) -> set[str]:
    return {name for name, _g, _m, c in localdemo.SAMPLE_NODES if c == cls}


@pytest.mark.plane
def test_the_demo_serves_the_admission_webhook_so_the_admins_own_pods_are_gated_and_checked(
    cache: Path,
) -> None:
    """What the README's Admission section promises, seen in `make run`, for
    pods its user (the admin of the kubeconfig it prints) creates: the
    controller runs as its own service account, so the webhook, which
    leaves the controller's requests alone, does not leave the admin's."""
    run = LocalRun(cache)
    try:
        admin = run.admin()
        run.wait_for_line("kubectl apply -n team-a -f ")
        _namespace(admin, "opted-in", {api.DEFAULT_CLASS_LABEL: "a100"})
        _namespace(admin, "plain")

        def mutated() -> bool:  # the webhook answers a moment after the plane is up
            try:
                return _gated(_create(admin, "opted-in", _pod("probe", gpus=2), dry_run=True))
            except kube.ApiError:
                return False

        wait_for(mutated, timeout=60, message=lambda: "the webhook to gate a dry-run GPU pod:\n"
                 + "\n".join(run.lines[-20:]))

        # An unchanged GPU pod of a namespace that opted in: an inline claim
        # of its class and the gate; placed on a node of that class (without
        # the webhook the scheduler put it on the L4 node, with no claim).
        job = _create(admin, "opted-in", _pod("job", gpus=2))
        assert _gated(job)
        assert json.loads(job["metadata"]["annotations"][api.CLAIMS_ANNOTATION]) == [
            {"name": "gpus", "className": "a100", "count": 2}]
        node = wait_for(lambda: _running_on(admin, "opted-in", "job"), timeout=60,
                        message="pod job Running")
        assert node in _nodes_of("a100")
        claim = kube.request_json(admin, "GET", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/"
                                  "opted-in/gpuclaims/job-gpus")
        assert (claim["spec"]["className"], claim["status"]["nodeName"]) == ("a100", node)

        # A pod naming claims without the gate gets it, and runs inside its claim.
        bare = _create(admin, "plain", _pod(
            "bare", claims=json.dumps([{"name": "g", "className": "h100", "count": 1}])))
        assert _gated(bare)
        assert wait_for(lambda: _running_on(admin, "plain", "bare"), timeout=60,
                        message="pod bare Running") in _nodes_of("h100")

        # An invalid annotation is refused at create, with the controller's message.
        with pytest.raises(kube.ApiError) as refused:
            _create(admin, "plain", _pod("bad", claims="not json"))
        assert f"annotation {api.CLAIMS_ANNOTATION} is invalid" in refused.value.message
    finally:
        code = run.stop()
    assert code == 0, "\n".join(run.lines[-30:])
    assert ("[local] the controller runs as system:serviceaccount:gpuclaimctl-system:gpuclaimctl "
            "(deploy/'s roles), not as the admin of the kubeconfig below") in run.lines
    assert [line for line in run.lines if line.startswith("[local] admission webhook on https://127.0.0.1:")
            and "--no-local-webhook" in line]
    # Its own identity: nothing to warn about. Its own API server: no write
    # of an earlier process can land, so the first decision waited for none.
    assert not [line for line in run.lines if " warning " in line or "before the first decision" in line]


# -- the local cluster across runs (issue 45 item 3) -----------------------------------


@pytest.mark.plane
def test_the_local_cluster_is_kept_across_runs_and_fresh_wipes_it(cache: Path) -> None:
    claims = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/kept/gpuclaims"
    first = LocalRun(cache)
    try:
        first.wait_for_line("[local] a fresh local cluster, kept in ")
        admin = first.admin()
        _namespace(admin, "kept")
        kube.request(admin, "POST", claims, body={
            "apiVersion": api.API_VERSION, "kind": "GPUClaim", "metadata": {"name": "notebook"},
            "spec": {"className": "a100", "count": 1}})
    finally:
        assert first.stop() == 0, "\n".join(first.lines[-30:])
    assert f"[local] stopping the local cluster; its state is kept in {cache / 'local'}: the next " \
           "`make run` resumes it, `make run-clean` starts afresh" in first.lines

    # Again, without the webhook this time: the claim is there, and the
    # webhook configurations the first run registered are gone with it.
    second = LocalRun(cache, "--no-local-webhook")
    try:
        resumed = second.wait_for_line("[local] resuming the local cluster kept in ")
        assert "0 pods, 1 GPU claim " in resumed
        admin = second.admin()
        assert kube.request_json(admin, "GET", f"{claims}/notebook")["spec"]["count"] == 1
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            with pytest.raises(kube.ApiError) as gone:
                kube.request(admin, "GET", f"/apis/admissionregistration.k8s.io/v1/{plural}/gpuclaimctl")
            assert gone.value.status == 404
        # One run at a time: a second one on the same state is refused.
        beside = LocalRun(cache)
        assert beside.proc.wait(timeout=60) == 1
        beside.stop()
        assert any("another `gpuclaimctl run --local` (pid " in line for line in beside.lines), beside.lines
    finally:
        assert second.stop() == 0, "\n".join(second.lines[-30:])

    third = LocalRun(cache, "--fresh")
    try:
        third.wait_for_line("[local] a fresh local cluster, kept in ")
        with pytest.raises(kube.ApiError) as wiped:
            kube.request(third.admin(), "GET", f"{claims}/notebook")
        assert wiped.value.status == 404
    finally:
        assert third.stop() == 0, "\n".join(third.lines[-30:])


@pytest.mark.parametrize("options, refused", [
    pytest.param(Options(fresh=True), "--fresh wipes the local control plane's state; give it with --local",
                 id="fresh-without-local"),
    pytest.param(Options(local=True, webhook_bind_address="0.0.0.0:9443"),
                 "--local serves on loopback only; --webhook-bind-address", id="webhook-beyond-loopback"),
    pytest.param(Options(local=True, local_webhook=False, webhook_bind_address="0.0.0.0:9443"), None,
                 id="no-local-webhook-ignores-its-address"),
    pytest.param(Options(local=True, fresh=True), None, id="fresh-local"),
])
def test_the_local_flags_are_checked_before_anything_starts(options: Options, refused: str | None) -> None:
    if refused is None:
        options.validate()
        return
    with pytest.raises(ValueError) as e:
        options.validate()
    assert str(e.value).startswith(refused)
