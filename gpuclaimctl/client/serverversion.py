"""Which Kubernetes the API server is, and what the controller does about it.

One GET of /version at start (`check`); the rest is a pure decision
(`decide`: no I/O, no clock) that docs/versions.md tells in prose:

- 1.35, 1.36 and 1.37 are supported: each is proven by `make test-versions`
  (1.37 by `make test`) on its own real control plane.
- Newer than 1.37: the skew policy lets an older client talk to it; the
  controller runs as on 1.37 and says once that this minor is untested.
- Older than 1.35 but from 1.27 on: unsupported, said in one warning line;
  it still starts. Scheduling gates (PodSchedulingReadiness) are served
  from 1.27 (beta, on by default; GA in 1.30), so a gated pod still waits
  for the controller; matchConditions (AdmissionWebhookMatchConditions) are
  beta from 1.28 and GA in 1.30, and a server that lacks them drops them
  from the webhook configurations, which then see every pod of the
  namespaces they select.
- Older than 1.27: the API server drops `spec.schedulingGates` (1.26 has
  them only as an alpha feature, off by default), so no pod would wait for
  its claims; the controller says so in one line and does not start.
- WatchList: kube-apiserver's WatchList gate is on by default in 1.32 and
  from 1.34 (off in 1.33 and before 1.32; k8s.io/apiserver
  pkg/features/kube_features.go). Where it is off by default the informers
  list from the start instead of being refused (422) at every relist; where
  it is on they fill their caches from one WatchList stream and still fall
  back to a list should this server refuse it.

An unreadable /version (the server away for now, a proxy that hides it)
is one warning line: the controller starts with the newest's behaviour,
which falls back on its own where the server says no.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

from kubernetes import client

from gpuclaimctl.client import kube

# The supported minors (docs/versions.md); the tests' planes are built from
# the same list (gpuclaimctl/controlplane/build.py KUBERNETES_VERSIONS).
OLDEST_SUPPORTED = (1, 35)
NEWEST_SUPPORTED = (1, 37)
# Scheduling gates served (PodSchedulingReadiness beta, on by default).
OLDEST_STARTABLE = (1, 27)
# Where kube-apiserver's WatchList gate is on by default.
_WATCH_LIST_BY_DEFAULT = ((1, 32), (1, 34))  # 1.32, and 1.34 onward


class Support(enum.Enum):
    SUPPORTED = "supported"
    NEWER = "newer than supported"
    OLDER = "older than supported"
    TOO_OLD = "too old to run against"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class ServerVersion:
    major: int
    minor: int
    git_version: str

    @property
    def minor_version(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        # A build without a version stamp says v0.0.0-master here, and its
        # source's minor in major/minor: that minor is the truth.
        ours = f"v{self.major}.{self.minor}"
        return self.git_version if self.git_version.startswith(ours + ".") else ours


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What the controller does against this server, and the line it logs."""

    server: ServerVersion | None
    support: Support
    watch_list: bool
    message: str

    @property
    def can_start(self) -> bool:
        return self.support is not Support.TOO_OLD

    @property
    def warn(self) -> bool:
        return self.support is not Support.SUPPORTED


def _minor_text(t: tuple[int, int]) -> str:
    return f"{t[0]}.{t[1]}"


SUPPORTED_RANGE = f"{_minor_text(OLDEST_SUPPORTED)}-{_minor_text(NEWEST_SUPPORTED)}"


def parse(doc: Any) -> ServerVersion:
    """A /version document as a ServerVersion.

    `major` and `minor` may carry a suffix ("35+" on EKS and GKE); where
    they are missing or unreadable, gitVersion ("v1.35.4-gke.100") says.
    Raises ValueError when neither does.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"not a version document: {doc!r}")
    git = str(doc.get("gitVersion") or "")
    major = re.match(r"\d+", str(doc.get("major") or ""))
    minor = re.match(r"\d+", str(doc.get("minor") or ""))
    if major and minor:
        return ServerVersion(int(major.group()), int(minor.group()), git)
    m = re.match(r"v?(\d+)\.(\d+)", git)
    if m:
        return ServerVersion(int(m.group(1)), int(m.group(2)), git)
    raise ValueError(f"no version in {doc!r}")


def watch_list_by_default(minor: tuple[int, int]) -> bool:
    """Whether kube-apiserver of this minor serves WatchList unless told not to."""
    exact, onward = _WATCH_LIST_BY_DEFAULT
    return minor == exact or minor >= onward


def decide(server: ServerVersion | None, error: str = "") -> Behaviour:
    """The behaviour against `server` (None: /version could not be read,
    `error` says why). Pure: no I/O."""
    if server is None:
        return Behaviour(None, Support.UNKNOWN, True,
                         f"could not read the API server's version ({error}); starting as on "
                         f"{_minor_text(NEWEST_SUPPORTED)}: initial state by WatchList, listing "
                         "where the server refuses it")
    v = server.minor_version
    watch_list = watch_list_by_default(v)
    how = ("initial state by WatchList" if watch_list
           else "initial state by paginated lists (WatchList is off by default there)")
    if v < OLDEST_STARTABLE:
        return Behaviour(server, Support.TOO_OLD, False,
                         f"Kubernetes {server} is not supported ({SUPPORTED_RANGE} are) and too old "
                         f"to run against: before {_minor_text(OLDEST_STARTABLE)} the API server "
                         "drops pods' scheduling gates, so no pod would wait for its claims; "
                         "not starting")
    if v < OLDEST_SUPPORTED:
        return Behaviour(server, Support.OLDER, watch_list,
                         f"Kubernetes {server} is older than the oldest supported minor "
                         f"({SUPPORTED_RANGE}); starting anyway, untested: {how}")
    if v > NEWEST_SUPPORTED:
        return Behaviour(server, Support.NEWER, watch_list,
                         f"Kubernetes {server} is newer than the newest supported minor "
                         f"({SUPPORTED_RANGE}); starting as on {_minor_text(NEWEST_SUPPORTED)}, "
                         f"untested: {how}")
    return Behaviour(server, Support.SUPPORTED, watch_list,
                     f"Kubernetes {server} (supported: {SUPPORTED_RANGE}): {how}")


def check(api_client: client.ApiClient, *, timeout: float = 10.0) -> Behaviour:
    """GET /version and decide; a failed GET is `decide(None, why)`."""
    try:
        doc = kube.request_json(api_client, "GET", "/version", timeout=timeout)
        server = parse(doc)
    except Exception as e:  # any failure is the UNKNOWN line, never a failed start
        return decide(None, f"{type(e).__name__}: {e}")
    return decide(server)
