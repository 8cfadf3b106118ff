"""Where kube-apiserver's CPU goes during a benchmark scenario, by kind of request.

At the shipped defaults on a 2-core machine the API server, not the
controller, takes most of the CPU (issue 12): `controller_bench
--apiserver-profile SECONDS` starts the plane's API server with
`--profiling=true`, records a CPU profile of it (`/debug/pprof/profile`)
from each scenario's first create, and prints the share of each kind of
request below, read from the profile with `go tool pprof`.

A write's storage work runs in a goroutine of its own (the handlers'
finisher), whose stack keeps the closures of the handler that started it
but not the HTTP handler above them, so each kind is a focus on those
closures' names; the custom-resource handler (GPUClaims, GPUClasses, ...)
is matched first and kept out of the built-in kinds'. The kinds overlap
nothing else, but do not add up to 100 %: authentication, audit, the
HTTP and TLS layers and the etcd client are the rest.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuclaimctl.controlplane import ControlPlane

_CRD = r"apiextensions-apiserver/pkg/apiserver\.\(\*crdHandler\)"

# (what, pprof focus, pprof ignore); indented ones are part of the one above.
KINDS: tuple[tuple[str, str, str], ...] = (
    ("custom resources (GPUClaim creates and status; their watches)", _CRD, ""),
    ("  of which status writes", r"crdHandler\)\.serveStatus", ""),
    ("  of which creates", r"crdHandler\)\.serveResource\.CreateResource", ""),
    ("built-in patches (pods; kwok's pods/status)",
     r"handlers\.\(\*patcher\)|handlers\.PatchResource", _CRD),
    ("  of which pods/status", r"pod/storage\.\(\*StatusREST\)", _CRD),
    ("built-in creates (pods, events, bindings)",
     r"handlers\.CreateResource|handlers\.CreateNamedResource|handlers\.createHandler", _CRD),
    ("built-in updates", r"handlers\.UpdateResource", _CRD),
    ("built-in watches and lists", r"handlers\.ListResource|handlers\.\(\*WatchServer\)", _CRD),
    ("decoding etcd's watch", r"storage/etcd3\.\(\*watchChan\)", ""),
    ("garbage collection", r"runtime\.gcBgMarkWorker", ""),
)

_ACCOUNTING = re.compile(r"accounting for (\S+), ([\d.]+)% of (\S+) total")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)([a-z]*)", text)
    if not m:
        return 0.0
    return float(m.group(1)) * _UNITS.get(m.group(2) or "s", 1.0)


@dataclass
class Recording:
    """One profile being taken in the background, then read."""

    path: Path
    seconds: int
    error: str = ""
    _thread: threading.Thread | None = field(default=None, repr=False)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def record(plane: ControlPlane, path: Path, seconds: int) -> Recording:
    """Start a `seconds`-long CPU profile of the API server, written to `path`."""
    rec = Recording(path, seconds)

    def take() -> None:
        try:
            path.write_bytes(plane.read(f"/debug/pprof/profile?seconds={seconds}",
                                        timeout=seconds + 60.0))
        except OSError as e:  # the scenario goes on without it
            rec.error = f"{type(e).__name__}: {e}"

    rec._thread = threading.Thread(target=take, name="apiserver-profile", daemon=True)
    rec._thread.start()
    return rec


def shares(binary: Path, profile: Path) -> tuple[float, list[tuple[str, float]]] | str:
    """The profile's CPU seconds and each kind's percent of them, or why not."""
    go = shutil.which("go")
    if go is None:
        return "go is not on the PATH (go tool pprof reads the profile)"
    total = 0.0
    out: list[tuple[str, float]] = []
    for what, focus, ignore in KINDS:
        argv = [go, "tool", "pprof", "-top", "-nodecount=1000000", "-nodefraction=0",
                "-edgefraction=0", f"-focus={focus}"]
        if ignore:
            argv.append(f"-ignore={ignore}")
        done = subprocess.run(argv + [str(binary), str(profile)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            return f"go tool pprof failed: {done.stderr.strip()[-300:]}"
        m = _ACCOUNTING.search(done.stdout)
        if m is None:  # nothing matched the focus
            out.append((what, 0.0))
            continue
        total = _seconds(m.group(3))
        out.append((what, float(m.group(2))))
    return total, out
