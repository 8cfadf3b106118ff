"""`make run` (`gpuclaimctl run --local`) and the README's quick start, as a
newcomer types them: the lines it prints to copy name the plane that is
running (not one an earlier run left behind), and `kubectl apply -f
deploy/samples/` works on it without a warning.

The run gets a cache folder of its own whose component folders link to the
built binaries, so the stable kubeconfig path it publishes is the test's,
not that of a `make run` going on beside it.
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

import pytest

from gpuclaimctl.controlplane import build
from tests.helpers import wait_for

pytestmark = pytest.mark.plane

REPO = Path(__file__).resolve().parent.parent


class LocalRun:
    """`python -m gpuclaimctl run --local` with its stderr collected."""

    def __init__(self, cache: Path) -> None:
        env = dict(os.environ, GPUCLAIMCTL_CACHE=str(cache), PYTHONPATH=str(REPO))
        for name in list(env):
            if name.startswith("GPUCLAIMCTL_") and name != "GPUCLAIMCTL_CACHE":
                del env[name]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuclaimctl", "run", "--local",
             "--metrics-bind-address", "0", "--health-bind-address", "0"],
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
    # The link named the plane that stopped: it goes with it.
    wait_for(lambda: not os.path.lexists(stable), timeout=5,
             message="the stable kubeconfig link to be removed")
