"""Building the control plane fails with one line a person can act on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuclaimctl.controlplane import build

REPO = Path(__file__).resolve().parent.parent


def run_build(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, GPUCLAIMCTL_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    full.update(env)
    return subprocess.run([sys.executable, "-m", "gpuclaimctl.controlplane", "build"],
                          env=full, capture_output=True, text=True, timeout=120)


def test_without_go_the_build_says_so_in_one_line(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "openssl").symlink_to(shutil.which("openssl") or "/usr/bin/openssl")
    result = run_build(tmp_path, PATH=str(bindir))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "gpuclaimctl: Go is not installed: the local control plane is built from Go modules "
        "(etcd, Kubernetes, kwok, helm); install Go 1.26 or newer and put `go` on PATH"]
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to reach the proxy step")
def test_without_the_module_proxy_the_build_says_so_in_one_line(tmp_path: Path) -> None:
    result = run_build(
        tmp_path,
        GOPROXY="http://127.0.0.1:9",  # discard port: nothing answers
        GOMODCACHE=str(tmp_path / "modcache"),
        GOFLAGS="-mod=mod",
        GOSUMDB="off",
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpuclaimctl:")]
    assert result.returncode == 1
    assert len(lines) == 1, result.stderr
    assert "the Go module proxy did not answer (GOPROXY=http://127.0.0.1:9)" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cache" / "controlplane" / build.ETCD.key).exists()


def test_cached_binaries_are_not_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    for component in build.COMPONENTS:
        d = build.component_dir(component, root)
        d.mkdir(parents=True)
        for b in component.binaries:
            (d / b).write_text("")
    messages: list[str] = []
    paths = build.ensure_binaries(root, log=messages.append)
    assert messages == []
    assert paths["kube-apiserver"] == root / "controlplane" / "kubernetes-v1.37.2" / "kube-apiserver"


def test_the_plane_starts_without_helm(tmp_path: Path) -> None:
    """helm is for the chart's tests; a plane never waits for it to build."""
    root = tmp_path / "cache"
    for component in build.PLANE_COMPONENTS:
        d = build.component_dir(component, root)
        d.mkdir(parents=True)
        for b in component.binaries:
            (d / b).write_text("")
    messages: list[str] = []
    paths = build.ensure_binaries(root, log=messages.append, components=build.PLANE_COMPONENTS)
    assert messages == []
    assert "helm" not in paths
    assert build.missing(root) == [build.HELM]
