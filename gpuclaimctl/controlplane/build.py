"""Build the local control plane's binaries, and helm, from their Go modules.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kwok
and helm (which the chart's tests run) do not ship in any registry this
project can reach, but each is a Go module the machine's Go can build. This
module builds them once into a cache outside git, keyed by pinned version,
and never rebuilds what is there.

The plane runs the newest supported Kubernetes unless GPUCLAIMCTL_K8S_VERSION
names an older supported minor (docs/versions.md); an older minor builds only
its kube-apiserver, kube-scheduler and kube-controller-manager, each into its
own `kubernetes-vX.Y.Z` folder beside the newest's, and shares etcd, kwok,
kubectl and helm with the newest.

It must not download anything but Go modules, and its failures (no Go, no
module proxy) are one line for a person, not a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"

# Kubernetes: a current release the machine's Go (1.26) builds; its go.mod
# says `go 1.26.0`. etcd: kubeadm's DefaultEtcdVersion for that release
# ("3.7.0-0" in cmd/kubeadm/app/constants/constants.go of v1.37.2).
KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.0"
KWOK_VERSION = "v0.8.0"
# helm: the newest v3 the Go module proxy serves here; its go.mod says
# `go 1.26.0` and requires client-go v0.37, the plane's minor.
HELM_VERSION = "v3.22.0"
# The supported minors, oldest first, each at the newest patch the Go module
# proxy serves (`go list -m -versions k8s.io/kubernetes` lists v1.35.4,
# v1.36.3, v1.37.2; asking for a later patch of either is refused). The
# newest is the default plane; docs/versions.md says what differs.
KUBERNETES_VERSIONS = {"1.35": "v1.35.4", "1.36": "v1.36.3", "1.37": KUBERNETES_VERSION}
NEWEST_MINOR = "1.37"
# Which minor a plane runs (tests, `make run K8S_VERSION=`, `make test-versions`).
VERSION_ENV = "GPUCLAIMCTL_K8S_VERSION"


class BuildError(Exception):
    """A build step failed; str() is one line that says what is missing."""


@dataclasses.dataclass(frozen=True)
class Component:
    """One cached build: its binaries come from one `go` invocation."""

    name: str
    version: str
    binaries: tuple[str, ...]
    # The folder under gomod/ whose go.mod pins this build (etcd, kubernetes).
    gomod: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


SERVER_BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
KUBERNETES = Component("kubernetes", KUBERNETES_VERSION, (*SERVER_BINARIES, "kubectl"), "kubernetes")
ETCD = Component("etcd", ETCD_VERSION, ("etcd",), "etcd")
KWOK = Component("kwok", KWOK_VERSION, ("kwok",))
HELM = Component("helm", HELM_VERSION, ("helm",))
# What `ControlPlane` starts from; helm is only a tool of the test suite.
PLANE_COMPONENTS = (ETCD, KUBERNETES, KWOK)
COMPONENTS = (*PLANE_COMPONENTS, HELM)
# An older minor's plane shares the newest's kubectl: a view of the newest's
# build that needs only that binary (building it builds all four).
KUBECTL = dataclasses.replace(KUBERNETES, binaries=("kubectl",))

# What helm's Makefile sets with -X for a release build: the version it
# reports, and the Kubernetes version `helm lint` and `helm template` assume
# without a cluster (client-go v0.37 -> 1.37).
_HELM_LDFLAGS = (
    f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
    "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
    "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37",
    "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
    "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37",
)


def kubernetes_component(minor: str) -> Component:
    """The Kubernetes build of one supported minor: the newest's has kubectl
    too; an older one's only the three server binaries, from
    gomod/kubernetes_1_35 (a folder name setuptools takes as package data)."""
    if minor == NEWEST_MINOR:
        return KUBERNETES
    return Component("kubernetes", KUBERNETES_VERSIONS[minor], SERVER_BINARIES,
                     "kubernetes_" + minor.replace(".", "_"))


def selected_minor(value: str | None = None) -> str:
    """The minor a plane runs: `value`, else $GPUCLAIMCTL_K8S_VERSION, else the newest.

    "1.35", "v1.35" and the pinned "v1.35.4" all name 1.35; anything else
    (an unsupported minor, another patch) is a BuildError that lists the choices.
    """
    raw = value if value is not None else os.environ.get(VERSION_ENV, "")
    text = raw.strip().removeprefix("v")
    if not text:
        return NEWEST_MINOR
    minor = ".".join(text.split(".")[:2])
    if minor in KUBERNETES_VERSIONS and text in (minor, KUBERNETES_VERSIONS[minor][1:]):
        return minor
    choices = ", ".join(f"{m} ({v})" for m, v in KUBERNETES_VERSIONS.items())
    raise BuildError(f"Kubernetes {raw!r} is not a supported version; choose one of {choices}")


def plane_components(minor: str | None = None) -> tuple[Component, ...]:
    """What a plane of `minor` (default: the selected one) starts from: an
    older minor's server binaries, and the newest's kubectl beside them."""
    minor = selected_minor(minor)
    if minor == NEWEST_MINOR:
        return PLANE_COMPONENTS
    return (ETCD, kubernetes_component(minor), KUBECTL, KWOK)


def cache_root() -> Path:
    env = os.environ.get("GPUCLAIMCTL_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpuclaimctl"


def component_dir(component: Component, root: Path | None = None) -> Path:
    return (root or cache_root()) / "controlplane" / component.key


def binary_path(
    binary: str, root: Path | None = None, components: tuple[Component, ...] = COMPONENTS
) -> Path:
    for component in components:
        if binary in component.binaries:
            return component_dir(component, root) / binary
    raise KeyError(binary)


def missing(
    root: Path | None = None, components: tuple[Component, ...] = COMPONENTS
) -> list[Component]:
    return [
        c
        for c in components
        if not all((component_dir(c, root) / b).is_file() for b in c.binaries)
    ]


def ensure_binaries(
    root: Path | None = None,
    log: Callable[[str], None] = print,
    components: tuple[Component, ...] = COMPONENTS,
) -> dict[str, Path]:
    """Build whatever is missing; return every binary's path.

    A file lock keeps two test sessions from building the same thing at once;
    each component is built into a temporary folder and renamed into place,
    so an interrupted build leaves nothing half-made behind.
    """
    root = root or cache_root()
    if missing(root, components):
        (root / "controlplane").mkdir(parents=True, exist_ok=True)
        with _lock(root / "controlplane" / ".build.lock"):
            todo = missing(root, components)
            if todo:
                go = _find_go()
                for component in todo:
                    if missing(root, (component,)):  # KUBECTL comes with KUBERNETES
                        _build(go, _whole(component), root, log)
    return {b: binary_path(b, root, components) for c in components for b in c.binaries}


def _kubernetes_ldflags(component: Component) -> tuple[str, ...]:
    """What hack/lib/version.sh stamps into a release build, so that /version
    and `--version` say the release; unstamped, they say v0.0.0-master with
    the source's minor (component-base's DefaultKubeBinaryVersion). Only the
    older minors' builds are stamped: the newest's recipe stays the one every
    kept cache was built with (the cache is keyed by version, not recipe)."""
    if component == KUBERNETES:
        return ()
    version = component.version
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {"gitVersion": version, "gitMajor": major, "gitMinor": minor}
    return tuple(f"-X {package}.{key}={value}"
                 for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
                 for key, value in values.items())


def _whole(component: Component) -> Component:
    """The build that makes `component`'s binaries (KUBECTL is part of KUBERNETES's)."""
    return KUBERNETES if component == KUBECTL else component


def _find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go is not installed: the local control plane is built from Go "
            "modules (etcd, Kubernetes, kwok, helm); install Go 1.26 or newer and "
            "put `go` on PATH"
        )
    return go


def _build(
    go: str, component: Component, root: Path, log: Callable[[str], None]
) -> None:
    final = component_dir(component, root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{component.key}-", dir=final.parent))
    started = time.monotonic()
    log(f"building {component.key} ({', '.join(component.binaries)}); "
         "this happens once per version")
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    try:
        if component is KWOK or component is HELM:
            env["GOBIN"] = str(tmp)
            # Neither go.mod has replace directives, so `go install
            # module@version` builds each exactly as its release pins it.
            package, ldflags = {
                KWOK.name: ("sigs.k8s.io/kwok/cmd/kwok", ()),
                HELM.name: ("helm.sh/helm/v3/cmd/helm", _HELM_LDFLAGS),
            }[component.name]
            _run_go(
                [go, "install", "-trimpath", f"-ldflags={' '.join(('-s', '-w', *ldflags))}",
                 f"{package}@{component.version}"],
                cwd=tmp, env=env, component=component,
            )
        else:
            packages = {
                ETCD.name: ["."],
                KUBERNETES.name: [f"k8s.io/kubernetes/cmd/{b}" for b in component.binaries],
            }[component.name]
            out = ["-o", str(tmp / "etcd")] if component is ETCD else ["-o", str(tmp) + "/"]
            ldflags = ("-s", "-w", *(_kubernetes_ldflags(component)
                                     if component.name == KUBERNETES.name else ()))
            _run_go(
                [go, "build", "-trimpath", f"-ldflags={' '.join(ldflags)}", *out, *packages],
                cwd=GOMOD_DIR / component.gomod, env=env, component=component,
            )
        for b in component.binaries:
            if not (tmp / b).is_file():
                raise BuildError(f"building {component.key}: `go` produced no {b}")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in final.iterdir()) / 2**20
    log(f"built {component.key} in {time.monotonic() - started:.0f}s "
         f"({size:.0f} MiB) into {final}")


_PROXY_SIGNS = (
    "dial tcp", "no such host", "connection refused", "i/o timeout",
    "tls handshake", "proxy.golang.org", "unrecognized import path",
    "reading https://", "410 gone", "404 not found",
)


def _run_go(argv: list[str], *, cwd: Path, env: dict[str, str], component: Component) -> None:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    lines = [l.strip() for l in proc.stderr.splitlines() if l.strip()]
    proxy = next((l for l in lines if any(s in l.lower() for s in _PROXY_SIGNS)), None)
    if proxy is not None:
        raise BuildError(
            f"building {component.key}: the Go module proxy did not answer "
            f"(GOPROXY={env.get('GOPROXY') or _go_env('GOPROXY')}): {proxy}"
        )
    last = lines[-1] if lines else f"exit code {proc.returncode}"
    raise BuildError(f"building {component.key}: `{' '.join(argv[1:3])}` failed: {last}")


def _go_env(name: str) -> str:
    go = shutil.which("go")
    if go is None:
        return ""
    return subprocess.run([go, "env", name], capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
