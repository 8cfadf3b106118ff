"""The controller's writes to the API server, and nothing else.

Every write that changes an object we read carries the resourceVersion it
was computed from, so a stale decision fails with 409 Conflict and is
retried from fresh state instead of overwriting someone else's change.
Deletes carry uid (and where it matters resourceVersion) preconditions.

Only the leader writes (DESIGN I3): with a `WriteFence`, every mutating
request is checked against it right before it leaves -- after any wait for
a rate-limiter token -- and its timeout is cut to the time left before the
Lease could be taken over; a refused write raises `fence.NotLeader`. Reads
are not fenced. Every write, fenced or not, takes at most
`fence.WRITE_DEADLINE` and asks the API server to give up on it by then
(`?timeout=`): a process restarted without leader election waits that out
before its first decision (cmd.startwait).

An error answer raises what `errors` says it means (NotFound, Conflict,
AlreadyExists, or ApiError). Every request, read or write, waits for a token
of the Writer's `limiter` (--kube-api-qps/--kube-api-burst) when it has one.

Responses are not decoded into client models: the informers will show the
result, and the few callers that need the written object get a dict.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any

from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError
# Re-exported for callers that import them from here; errors is their home.
from gpuclaimctl.client.errors import AlreadyExists as AlreadyExists
from gpuclaimctl.client.errors import Conflict as Conflict
from gpuclaimctl.client.errors import NotFound as NotFound
from gpuclaimctl.client.events import COMPONENT, EventRecorder, make_event
from gpuclaimctl.client.fence import WRITE_DEADLINE, WriteFence
from gpuclaimctl.model import api

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def _unfenced() -> float:
    """A Writer's fence when it has none: every write may leave, for up to
    WRITE_DEADLINE (kube.request cuts the timeout to the lesser)."""
    return math.inf


class Writer:
    """Thin seam over the official client for the controller's writes."""

    def __init__(self, api_client: client.ApiClient, component: str = COMPONENT,
                 *, fence: WriteFence | None = None,
                 limiter: kube.TokenBucket | None = None,
                 recorder: EventRecorder | None = None) -> None:
        self._api = api_client
        self._component = component
        self._host = uuid.uuid4().hex[:8]
        # Checked by kube.request right before each mutating request is sent;
        # without a fence, one that always allows, so that the API server's
        # deadline (`?timeout=`) is sent all the same.
        self._fence = fence.check if fence is not None else _unfenced
        self._limiter = limiter
        # Events go to it, off the sync path, on its own budget (and the
        # same fence); without one, `event` sends them itself.
        self._recorder = recorder

    # -- raw calls ----------------------------------------------------------

    def _write(self, method: str, path: str, body: Any = None) -> Obj:
        result: Obj = kube.request_json(self._api, method, path, body=body, fence=self._fence,
                                        limiter=self._limiter, timeout=WRITE_DEADLINE)
        return result

    def _read(self, path: str) -> Obj:
        result: Obj = kube.request_json(self._api, "GET", path, limiter=self._limiter)
        return result

    # -- claims -------------------------------------------------------------

    @staticmethod
    def _claim_path(namespace: str, name: str = "", sub: str = "") -> str:
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.CLAIM_PLURAL}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def create_claim(self, claim: Obj) -> Obj:
        return self._write("POST", self._claim_path(claim["metadata"]["namespace"]), claim)

    def update_claim(self, claim: Obj) -> Obj:
        """Replace metadata/spec (finalizers); claim carries its resourceVersion."""
        m = claim["metadata"]
        return self._write("PUT", self._claim_path(m["namespace"], m["name"]), claim)

    def update_claim_status(self, claim: Obj) -> Obj:
        m = claim["metadata"]
        return self._write("PUT", self._claim_path(m["namespace"], m["name"], "status"), claim)

    def update_class_status(self, cls: Obj) -> Obj:
        """Replace a GPUClass's status; cls carries its resourceVersion."""
        name = cls["metadata"]["name"]
        return self._write("PUT", f"/apis/{api.GROUP}/{api.VERSION}/{api.CLASS_PLURAL}/{name}/status",
                           cls)

    def update_budget_status(self, budget: Obj) -> Obj:
        """Replace a GPUBudget's status; budget carries its resourceVersion."""
        m = budget["metadata"]
        return self._write("PUT", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{m['namespace']}/"
                                  f"{api.BUDGET_PLURAL}/{m['name']}/status", budget)

    def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        """Delete a claim if it is still that object (`uid`) and, given
        `resource_version`, unchanged since it was read (else 409 Conflict)."""
        preconditions = {"uid": uid} if resource_version is None else {"uid": uid, "resourceVersion": resource_version}
        try:
            self._write("DELETE", self._claim_path(namespace, name), {"preconditions": preconditions})
        except NotFound:
            pass

    # -- pods -----------------------------------------------------------------

    def list_claims(self, page_size: int = 500) -> list[Obj]:
        """Every claim, by a consistent (quorum) read in pages: what is
        stored now, whatever the watch has delivered so far."""
        return kube.list_all(self._api, f"/apis/{api.GROUP}/{api.VERSION}/{api.CLAIM_PLURAL}",
                             page_size=page_size, limiter=self._limiter)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        """A live read, for confirming a pod the cache does not show."""
        try:
            return self._read(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None

    def get_node(self, name: str) -> Obj | None:
        """A live read, for confirming the node a preemption is planned on
        before anything is evicted (sync.preemption)."""
        try:
            return self._read(f"/api/v1/nodes/{name}")
        except NotFound:
            return None

    def get_claim(self, namespace: str, name: str) -> Obj | None:
        """A live read, for settling a bind whose answer was lost (fenced,
        as the bind it settles)."""
        try:
            return self._write("GET", self._claim_path(namespace, name))
        except NotFound:
            return None

    def patch_pod(self, namespace: str, name: str, ops: list[Obj]) -> None:
        """Apply a JSON patch (RFC 6902); its `test` ops stand for the
        preconditions (a failed one is 422 Invalid). The answer, the whole
        pod, is not decoded: nothing reads it (the watch brings the pod).
        Decoding the writes' answers was about a tenth of the workers' time
        (py-spy, unthrottled bench)."""
        kube.request(self._api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                     body=ops, content_type="application/json-patch+json",
                     fence=self._fence, limiter=self._limiter, timeout=WRITE_DEADLINE)

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str) -> bool:
        """Delete with uid and resourceVersion preconditions; False if it changed or is gone."""
        try:
            self._write("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                        {"preconditions": {"uid": uid, "resourceVersion": resource_version}})
            return True
        except (NotFound, Conflict):
            return False

    def evict_pod(self, namespace: str, name: str, uid: str) -> str:
        """Ask the Eviction API (policy/v1) to evict the pod, which honours
        its PodDisruptionBudgets: "evicted"; "gone" (deleted already, or
        another pod under the name); or "refused" (429: a budget allows no
        disruption now)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"namespace": namespace, "name": name},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        try:
            self._write("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
        except (NotFound, Conflict):
            return "gone"
        except ApiError as e:
            if e.status == 429:
                return "refused"
            raise
        return "evicted"

    def list_disruption_budgets(self, namespace: str) -> list[Obj]:
        """The namespace's PodDisruptionBudgets, live (preemption's check)."""
        got = self._read(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets")
        return list(got.get("items") or ())

    def patch_pod_status(self, namespace: str, name: str, patch: Obj) -> None:
        """A strategic merge patch of the pod's status (conditions merge by type)."""
        kube.request(self._api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                     body=patch, content_type="application/strategic-merge-patch+json",
                     fence=self._fence, limiter=self._limiter, timeout=WRITE_DEADLINE)

    # -- events -----------------------------------------------------------------

    def event(self, obj: Obj, type_: str, reason: str, message: str) -> bool:
        """Record a core/v1 Event about obj; True if it was handed over (or
        sent), False if it was dropped or failed.

        With a recorder, hand it over and return at once: the recorder
        queues it (or drops it when full) and sends it from its own thread,
        correlated and on its own budget. Without one, POST it now through
        the Writer's limiter; failure to record is logged, not raised --
        except `NotLeader`: a refused write is never an API error."""
        if self._recorder is not None:
            return self._recorder.event(obj, type_, reason, message)
        event = make_event(obj, type_, reason, message, component=self._component,
                           instance=f"{self._component}-{self._host}", now=time.time())
        ns, name = event["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            kube.request(self._api, "POST", f"/api/v1/namespaces/{ns}/events", body=event,
                         fence=self._fence, limiter=self._limiter, timeout=WRITE_DEADLINE)
        except (ApiError, OSError) as e:
            log.warning("could not record event %s on %s/%s: %s", reason, ns, name, e)
            return False
        return True
