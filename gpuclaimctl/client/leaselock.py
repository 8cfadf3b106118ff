"""The Lease that leader election is stored in (client-go's ``resourcelock``).

``LeaseLock`` reads and writes one ``coordination.k8s.io/v1`` Lease with
optimistic concurrency: every write carries the resourceVersion last read,
and a 409 is reported as ``errors.Conflict`` (``AlreadyExists`` for a create)
for the elector to answer by reading again; any other error answer is an
``errors.ApiError``. ``LeaderElectionRecord`` is what the elector reads and
writes; the Lease's other fields are kept as the API server has them.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any, Protocol

from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import NotFound


@dataclasses.dataclass(frozen=True)
class LeaderElectionRecord:
    """The election state a Lease's spec holds (client-go's LeaderElectionRecord).

    Times are kept as the API server's strings: they are compared for change
    only, never read as time.
    """

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    leader_transitions: int


class ResourceLock(Protocol):
    """Storage for the election record, with optimistic concurrency.

    ``update`` writes against the version last returned by ``get``,
    ``create`` or ``update`` and raises ``errors.Conflict`` when the
    stored version moved on. Any other exception is a failed attempt.
    """

    def get(self, timeout: float) -> LeaderElectionRecord | None:
        """The stored record, or None when there is no Lease."""
        ...

    def create(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        ...

    def update(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        ...

    def describe(self) -> str:
        ...


class LeaseLock:
    """A ``ResourceLock`` on one ``coordination.k8s.io/v1`` Lease.

    It sends its requests (``kube.request``, which never retries) through its
    own ``ApiClient`` built from a copy of the given one's configuration,
    with urllib3's retries turned off too: the elector is the retry loop,
    and a library retrying behind its back could stretch one attempt past
    the renew deadline. No rate limiter and no write fence: renewing is what
    keeps the fence open. The Lease travels as plain JSON so the MicroTime
    fields stay exactly as the API server wrote them.
    """

    _API = "/apis/coordination.k8s.io/v1"

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str) -> None:
        self._client = kube.client_for(api_client, "leader-election", retries=0)
        self._namespace = namespace
        self._name = name
        self._collection = f"{self._API}/namespaces/{namespace}/leases"
        # The Lease as last returned by the API server; its resourceVersion
        # is the one the next update is conditional on. Only the elector's
        # thread touches it.
        self._lease: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"{self._namespace}/{self._name}"

    def close(self) -> None:
        self._client.close()

    def get(self, timeout: float) -> LeaderElectionRecord | None:
        try:
            lease = self._request("GET", f"{self._collection}/{self._name}", None, timeout)
        except NotFound:
            self._lease = None
            return None
        return self._keep(lease)

    def create(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": _spec_from_record(record, {}),
        }
        return self._keep(self._request("POST", self._collection, lease, timeout))

    def update(self, record: LeaderElectionRecord, timeout: float) -> LeaderElectionRecord:
        if self._lease is None:
            raise RuntimeError(f"Lease {self.describe()} must be read or created before an update")
        metadata = dict(self._lease.get("metadata") or {})
        # Left out, the API server keeps the stored managedFields.
        metadata.pop("managedFields", None)
        lease = dict(self._lease)
        lease["metadata"] = metadata
        lease["spec"] = _spec_from_record(record, self._lease.get("spec") or {})
        return self._keep(self._request("PUT", f"{self._collection}/{self._name}", lease, timeout))

    def _keep(self, lease: dict[str, Any]) -> LeaderElectionRecord:
        """The Lease as the API server answered it: the next update's base."""
        self._lease = lease
        return record_from_lease(lease)

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        answer = kube.request_json(self._client, method, path, body=body,
                                   timeout=max(timeout, 0.001))
        return answer if isinstance(answer, dict) else {}


def record_from_lease(lease: dict[str, Any]) -> LeaderElectionRecord:
    spec = lease.get("spec") or {}
    return LeaderElectionRecord(
        holder_identity=spec.get("holderIdentity") or "",
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        leader_transitions=int(spec.get("leaseTransitions") or 0),
    )


def _spec_from_record(record: LeaderElectionRecord, old: dict[str, Any]) -> dict[str, Any]:
    spec = dict(old)  # keeps fields we do not manage (strategy, preferredHolder)
    spec["holderIdentity"] = record.holder_identity
    spec["leaseDurationSeconds"] = record.lease_duration_seconds
    spec["leaseTransitions"] = record.leader_transitions
    for key, value in (("acquireTime", record.acquire_time), ("renewTime", record.renew_time)):
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def micro_time(epoch_seconds: float) -> str:
    """RFC 3339 with microseconds in UTC, the wire form of a MicroTime."""
    ts = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.timezone.utc)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
