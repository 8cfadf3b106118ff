"""An in-memory API server for the deterministic simulation (CONVENTIONS.md,
"Invariants are checked, not hoped for").

`FakeApi` stands where the controller's `Writer` stands and answers as
kube-apiserver would: one resourceVersion counter bumped on every write,
409 Conflict on an update at a stale resourceVersion, uid/resourceVersion
preconditions on deletes, finalizers and deletionTimestamp, the status
subresource, the GPUClaim schema (spec immutable, one reservation at most)
and the narrow spec changes a gated pod allows. Beside the Writer methods it
offers what the harness needs to play users, kube-scheduler, kubelet and the
garbage collector; a per-kind watch log the harness reads at any lag; and
injected faults (an error instead of the answer, after the write landed or
without it).

It must stay plain: no threads, no wall clock, no randomness. Time comes
from the injected clock, names and uids from counters, so one seed is one
run. Every object handed in or out is a deep copy: nothing the caller keeps
aliases the store. Errors of the user-side methods are the API server's
answer as is (`ApiError`); the Writer methods turn them into what the real
Writer raises.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Callable, NamedTuple, TypeVar

from gpuclaimctl.client.kube import ApiError
from gpuclaimctl.client.writer import AlreadyExists, Conflict, NotFound
from gpuclaimctl.model import api

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
T = TypeVar("T")

PODS = "pods"
NODES = "nodes"
PVCS = "persistentvolumeclaims"
PVS = "persistentvolumes"
CLASSES = api.CLASS_PLURAL
CLAIMS = api.CLAIM_PLURAL
TEMPLATES = api.TEMPLATE_PLURAL
BUDGETS = "gpubudgets"


@dataclass(frozen=True)
class KindInfo:
    api_version: str
    kind: str
    namespaced: bool


KINDS: dict[str, KindInfo] = {
    PODS: KindInfo("v1", "Pod", True),
    NODES: KindInfo("v1", "Node", False),
    PVCS: KindInfo("v1", "PersistentVolumeClaim", True),
    PVS: KindInfo("v1", "PersistentVolume", False),
    CLASSES: KindInfo(api.API_VERSION, api.CLASS_KIND, False),
    CLAIMS: KindInfo(api.API_VERSION, api.CLAIM_KIND, True),
    TEMPLATES: KindInfo(api.API_VERSION, api.TEMPLATE_KIND, True),
    BUDGETS: KindInfo(api.API_VERSION, "GPUBudget", True),
}
_PLURAL_OF_KIND = {info.kind: plural for plural, info in KINDS.items()}

# The Writer's methods, the ones `inject` can fail. tests/test_fakeapi.py
# holds this equal to the public methods of the real Writer.
WRITER_METHODS = ("create_claim", "update_claim", "update_claim_status", "update_class_status",
                  "update_budget_status",
                  "delete_claim", "list_claims", "get_pod", "get_node", "get_claim", "patch_pod", "delete_pod", "event",
                  "evict_pod", "list_disruption_budgets", "patch_pod_status")

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# kube-apiserver's grace period for a running pod deleted without one.
POD_GRACE_SECONDS = 30
# The alphabet of generateName suffixes (apiserver's SimpleNameGenerator).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# ObjectMeta fields only the server sets; an update never changes them.
_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "generation", "resourceVersion", "namespace", "name")
# Spec fields a gated pod may change (KEP-3838); every other spec change is refused.
_GATED_MUTABLE = ("schedulingGates", "nodeSelector", "affinity")
# (The real server also lets images, tolerations and activeDeadlineSeconds
# change; the controller never touches them, so the fake refuses them too.)
_POD_SPEC_FORBIDDEN = ("spec: Forbidden: pod updates may not change fields other than "
                       "`spec.schedulingGates` (only deletions) and, while gated, "
                       "`spec.nodeSelector` (only additions) and `spec.affinity.nodeAffinity` "
                       "(only narrowing)")


class WatchEvent(NamedTuple):
    position: int  # in its kind's log; read on with events_after(kind, position + 1)
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj


# Inside FakeApi `list` is its method, so its signatures use these.
Objs = list[Obj]
Names = list[str]
WatchEvents = list[WatchEvent]


class Listing(NamedTuple):
    items: Objs
    resource_version: str
    cursor: int  # the log position this listing is consistent with: watch on from here


class RecordedEvent(NamedTuple):
    involved: str  # "Pod/ns/name", or "GPUClass/name" for a cluster-scoped object
    type: str
    reason: str
    message: str


class ForcedWrite(AssertionError):
    """The controller sent an update without the resourceVersion it read.

    The real server applies such an update unconditionally, over whatever
    changed meanwhile; the controller must never send one (DESIGN §4: "a
    conflict is retried, never forced"), so the simulation fails on it.
    """


def lost_answer() -> TimeoutError:
    """The error of a request whose answer never came back."""
    return TimeoutError("lost answer (fake)")


def writer_error(e: ApiError) -> Exception:
    """What the real Writer makes of an error status (test_fakeapi.py drives
    the real Writer with the same answers to keep the two equal)."""
    if e.status == 404:
        return NotFound(str(e))
    if e.status == 409:
        return AlreadyExists(str(e)) if e.reason == "AlreadyExists" else Conflict(str(e))
    return e


def _invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def _conflict(message: str) -> ApiError:
    return ApiError(409, "Conflict", message)


class _Part(Enum):
    """Which part of an object an update replaces."""

    MAIN = "main"      # metadata and spec; status is kept (a PUT with a status subresource)
    STATUS = "status"  # status only (PUT .../status)
    ALL = "all"        # all of it: the harness writing as any component would


@dataclass(frozen=True)
class _Fault:
    error: BaseException
    landed: bool
    # Neither yet: the server is still working on the write when its answer
    # is lost, and it lands (or not) later; see `late`.
    later: bool = False


@dataclass(frozen=True)
class LateWrite:
    """A write whose answer was lost while the server still had it."""

    method: str
    sent_at: datetime
    perform: Callable[[], Any]
    # What was sent (a copy), for the harness's bookkeeping of what may land.
    body: Obj | None = None


class FakeApi:
    """kube-apiserver in memory, answering the Writer and the harness.

    Invariants: every stored object's resourceVersion is the one on the last
    event of its key in its kind's log, and at most `resource_version`;
    (namespace, name) is unique per kind; an object whose deletionTimestamp
    is set and which has no finalizers and no grace period left is gone.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._rv = 0
        self._uids = 0
        self._names = 0
        self._store: dict[str, dict[Key, Obj]] = {kind: {} for kind in KINDS}
        self._log: dict[str, list[WatchEvent]] = {kind: [] for kind in KINDS}
        self._faults: dict[str, deque[_Fault]] = {}
        # Writes answered with a lost answer that have not landed yet, oldest
        # first: the harness lands or drops each (`resolve_late`).
        self.late: list[LateWrite] = []
        # Events the controller recorded, in order.
        self.events: list[RecordedEvent] = []
        # Every Writer method called, in order (reads too), injected or not.
        self.writer_calls: list[str] = []
        # Called with (method, a copy of the body) as each Writer write starts,
        # before any injected fault: the harness interleaves steps here.
        self.before_write: Callable[[str, Obj], None] | None = None
        # PodDisruptionBudgets (policy/v1), by namespace: not a watched kind
        # (preemption reads them live); the Eviction API honours them.
        self.disruption_budgets: dict[str, list[Obj]] = {}
        # Pods evicted, in order (namespace, name, uid), as the Eviction API
        # accepted them.
        self.evicted: list[tuple[str, str, str]] = []
        self.on_evict: Callable[[str, str, str], None] | None = None

    # -- the Writer seam ---------------------------------------------------------

    def create_claim(self, claim: Obj) -> Obj:
        return self._writer_call("create_claim", claim,
                                 lambda: self._create(CLAIMS, claim, keep_status=False))

    def update_claim(self, claim: Obj) -> Obj:
        """Replace metadata (finalizers, labels, owners); spec must not change."""
        return self._writer_call("update_claim", claim,
                                 lambda: self._update(CLAIMS, claim, _Part.MAIN, forced_ok=False))

    def update_claim_status(self, claim: Obj) -> Obj:
        return self._writer_call("update_claim_status", claim,
                                 lambda: self._update(CLAIMS, claim, _Part.STATUS, forced_ok=False))

    def update_class_status(self, cls: Obj) -> Obj:
        return self._writer_call("update_class_status", cls,
                                 lambda: self._update(CLASSES, cls, _Part.STATUS, forced_ok=False))

    def update_budget_status(self, budget: Obj) -> Obj:
        return self._writer_call("update_budget_status", budget,
                                 lambda: self._update(BUDGETS, budget, _Part.STATUS, forced_ok=False))

    def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        preconditions = {"uid": uid} if resource_version is None else {"uid": uid, "resourceVersion": resource_version}
        body = {"metadata": {"namespace": namespace, "name": name}, "preconditions": preconditions}
        try:
            self._writer_call("delete_claim", body, lambda: self._delete(
                CLAIMS, namespace, name, uid=uid, resource_version=resource_version))
        except NotFound:
            pass

    def list_claims(self, page_size: int = 500) -> Objs:
        # The real list goes around Writer._call: an error status stays an ApiError.
        return self._writer_call("list_claims", None, lambda: self.list(CLAIMS).items,
                                 translate=False)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._writer_call("get_pod", None, lambda: self._get_or_404(PODS, namespace, name))
        except NotFound:
            return None

    def get_node(self, name: str) -> Obj | None:
        try:
            return self._writer_call("get_node", None, lambda: self._get_or_404(NODES, "", name))
        except NotFound:
            return None

    def get_claim(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._writer_call("get_claim", None,
                                     lambda: self._get_or_404(CLAIMS, namespace, name))
        except NotFound:
            return None

    def update_pod(self, pod: Obj) -> Obj:
        """A pod update with its resourceVersion (what a user or another
        component may send; the controller patches, see patch_pod)."""
        return self._update(PODS, pod, _Part.MAIN, forced_ok=False)

    def patch_pod(self, namespace: str, name: str, ops: list[Obj]) -> Obj:
        """A JSON patch (RFC 6902) of the pod as stored now: a failed `test`
        is 422, as kube-apiserver answers; the result is then an update,
        with the same rules for what a pod may change."""
        body = {"metadata": {"namespace": namespace, "name": name}, "patch": ops}

        def apply() -> Obj:
            current = self._get_or_404(PODS, namespace, name)
            patched = json_patch(current, ops)
            patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self._update(PODS, patched, _Part.MAIN, forced_ok=False)
        return self._writer_call("patch_pod", body, apply)

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str) -> bool:
        body = {"metadata": {"namespace": namespace, "name": name},
                "preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            self._writer_call("delete_pod", body, lambda: self._delete(
                PODS, namespace, name, uid=uid, resource_version=resource_version))
            return True
        except (NotFound, Conflict):
            return False

    def evict_pod(self, namespace: str, name: str, uid: str) -> str:
        """The Eviction API: refused (429) while a PodDisruptionBudget that
        selects the pod allows no disruption; else a graceful delete."""
        body = {"metadata": {"namespace": namespace, "name": name}, "deleteOptions": {"preconditions": {"uid": uid}}}

        def evict() -> str:
            pod = self._store[PODS].get(self._key(PODS, namespace, name))
            if pod is None or pod["metadata"]["uid"] != uid:
                return "gone"
            labels = pod["metadata"].get("labels") or {}
            for pdb in self.disruption_budgets.get(namespace, ()):
                match = (pdb["spec"].get("selector") or {}).get("matchLabels") or {}
                if all(labels.get(k) == v for k, v in match.items()) and \
                        pdb["status"]["disruptionsAllowed"] < 1:
                    return "refused"
            if self.on_evict is not None:
                self.on_evict(namespace, name, uid)
            self._delete(PODS, namespace, name, uid=uid)
            self.evicted.append((namespace, name, uid))
            return "evicted"
        try:
            return self._writer_call("evict_pod", body, evict)
        except (NotFound, Conflict):
            return "gone"  # as the real Writer answers
        except ApiError as e:
            if e.status == 429:
                return "refused"
            raise

    def list_disruption_budgets(self, namespace: str) -> list[Obj]:
        return self._writer_call("list_disruption_budgets", None,
                                 lambda: copy.deepcopy(self.disruption_budgets.get(namespace, [])))

    def patch_pod_status(self, namespace: str, name: str, patch: Obj) -> None:
        """A strategic merge patch of status.conditions (merged by type)."""
        body = {"metadata": {"namespace": namespace, "name": name}, **patch}

        def apply() -> None:
            pod = self._get_or_404(PODS, namespace, name)
            conditions = (pod.setdefault("status", {})).setdefault("conditions", [])
            for c in (patch.get("status") or {}).get("conditions") or ():
                conditions[:] = [x for x in conditions if x.get("type") != c["type"]] + [c]
            self._write(PODS, pod, "MODIFIED")
        self._writer_call("patch_pod_status", body, apply)

    def event(self, obj: Obj, type_: str, reason: str, message: str) -> bool:
        m = obj["metadata"]
        kind = obj.get("kind", "Pod")
        involved = f"{kind}/{m['namespace']}/{m['name']}" if m.get("namespace") else f"{kind}/{m['name']}"
        recorded = RecordedEvent(involved, type_, reason, message[:1024])
        body = {"involvedObject": {"kind": kind, "namespace": m.get("namespace"), "name": m["name"],
                                   "uid": m.get("uid")},
                "type": type_, "reason": reason, "message": recorded.message}
        try:
            self._writer_call("event", body, lambda: self.events.append(recorded), translate=False)
        except (ApiError, OSError):
            return False  # the real Writer logs a failed event and goes on
        return True

    # -- fault injection ---------------------------------------------------------

    def inject(self, method_name: str, error: BaseException, *, landed: bool,
               later: bool = False) -> None:
        """Make the next call of a Writer method raise `error`, after applying
        the write when `landed` (an answer lost after the write landed) or
        without applying it; with `later`, the write is kept in `late` to
        land (or not) when the harness says, as a server still working on a
        request whose client gave up does. Several injections on one method
        queue up. An ApiError is turned into what the real Writer raises for
        that status."""
        if method_name not in WRITER_METHODS:
            raise ValueError(f"{method_name!r} is not a Writer method: {WRITER_METHODS}")
        self._faults.setdefault(method_name, deque()).append(_Fault(error, landed, later))

    def resolve_late(self, write: LateWrite, land: bool) -> None:
        """A late write lands now (against what the store holds now: a stale
        resourceVersion makes it fail, as it would on the server) or never."""
        self.late.remove(write)
        if land:
            try:
                write.perform()
            except ApiError:
                pass  # refused: its precondition no longer holds

    def clear_faults(self) -> None:
        self._faults.clear()

    def _writer_call(self, method: str, body: Obj | None, perform: Callable[[], T], *,
                     translate: bool = True) -> T:
        """One Writer request: the hook (writes only), then the injected fault or the answer."""
        self.writer_calls.append(method)
        if body is not None and self.before_write is not None:
            self.before_write(method, copy.deepcopy(body))
        queue = self._faults.get(method)
        fault = queue.popleft() if queue else None
        try:
            if fault is None:
                return perform()
            if fault.later:
                self.late.append(LateWrite(method, self._clock(), perform,
                                           copy.deepcopy(body) if body is not None else None))
            elif fault.landed:
                try:
                    perform()
                except ApiError:
                    pass  # refused after all; the answer is lost just the same
            raise fault.error
        except ApiError as e:
            translated = writer_error(e) if translate else e
            if translated is e:
                raise
            raise translated from e

    # -- reads and the watch log -------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        obj = self._store[kind].get(self._key(kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str) -> Listing:
        """Every object of a kind (all namespaces), with the resourceVersion and
        the log cursor it is consistent with, as a relist sees it."""
        items = [copy.deepcopy(obj) for _, obj in sorted(self._store[kind].items())]
        return Listing(items, self.resource_version, len(self._log[kind]))

    def cursor(self, kind: str) -> int:
        """The log position after the newest event of a kind."""
        return len(self._log[kind])

    def events_after(self, kind: str, cursor: int) -> WatchEvents:
        """The watch events of a kind from position `cursor` on (the log is
        never compacted), as deep copies."""
        return [WatchEvent(e.position, e.type, copy.deepcopy(e.obj)) for e in self._log[kind][cursor:]]

    # -- users and other components ------------------------------------------------

    def create(self, kind: str, obj: Obj) -> Obj:
        """Create as a user would (status as given, so a node can arrive Ready)."""
        return self._create(kind, obj, keep_status=True)

    def update(self, kind: str, obj: Obj) -> Obj:
        """Replace a whole object, status too; the resourceVersion is checked
        when the object carries one. Pod and GPUClaim spec rules still hold."""
        return self._update(kind, obj, _Part.ALL, forced_ok=True)

    def patch(self, kind: str, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj:
        """Read, let `change` edit the copy in place, write it back."""
        obj = self._get_or_404(kind, namespace, name)
        change(obj)
        return self.update(kind, obj)

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        self._delete(kind, namespace, name, uid=uid, resource_version=resource_version)

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        """kube-scheduler's binding: set spec.nodeName and PodScheduled True."""
        pod = self._get_or_404(PODS, namespace, name)
        spec = pod.setdefault("spec", {})
        if spec.get("schedulingGates"):
            raise ValueError(f"kube-scheduler does not bind the gated pod {namespace}/{name}")
        if spec.get("nodeName"):
            raise _conflict(f"pod {name} is already assigned to node {spec['nodeName']!r}")
        if pod["metadata"].get("deletionTimestamp"):
            raise _conflict(f"pod {name} is being deleted, cannot be assigned to a host")
        spec["nodeName"] = node
        self._set_pod_condition(pod, "True", "", "")
        return self._write(PODS, pod, "MODIFIED")

    def mark_unschedulable(self, namespace: str, name: str, message: str, since: str = "") -> Obj:
        """kube-scheduler could not place the pod: PodScheduled False/Unschedulable
        (`since`: the condition's lastTransitionTime, none by default)."""
        pod = self._get_or_404(PODS, namespace, name)
        self._set_pod_condition(pod, "False", "Unschedulable", message)
        if since:
            next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")[
                "lastTransitionTime"] = since
        pod["status"].setdefault("phase", "Pending")
        return self._write(PODS, pod, "MODIFIED")

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Obj:
        """kubelet reports the pod's phase (Running, Succeeded, Failed)."""
        pod = self._get_or_404(PODS, namespace, name)
        pod.setdefault("status", {})["phase"] = phase
        return self._write(PODS, pod, "MODIFIED")

    def finish_pod_deletion(self, namespace: str, name: str) -> None:
        """kubelet has stopped a pod being deleted gracefully: it goes (once
        its finalizers, if any, are removed)."""
        pod = self._get_or_404(PODS, namespace, name)
        if not pod["metadata"].get("deletionTimestamp"):
            raise ValueError(f"pod {namespace}/{name} is not being deleted")
        pod["metadata"]["deletionGracePeriodSeconds"] = 0
        self._write(PODS, pod, "MODIFIED")

    def collect_garbage(self) -> Names:
        """One pass of kube-controller-manager's garbage collector: delete each
        object all of whose owners are gone (by uid). An owner of a kind this
        fake does not store (a ReplicaSet) is taken to exist; an owner being
        deleted still exists. Returns "plural/ns/name" of each object deleted."""
        uids = {kind: {o["metadata"]["uid"] for o in objs.values()}
                for kind, objs in self._store.items()}

        def gone(ref: Obj) -> bool:
            plural = _PLURAL_OF_KIND.get(ref.get("kind", ""))
            return plural is not None and ref.get("uid") not in uids[plural]

        collected: Names = []
        for kind, objs in self._store.items():
            for (ns, name), obj in list(objs.items()):
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                if refs and not meta.get("deletionTimestamp") and all(gone(r) for r in refs):
                    self._delete(kind, ns, name, uid=meta["uid"])
                    collected.append(f"{kind}/{ns}/{name}" if ns else f"{kind}/{name}")
        return collected

    # -- the store -------------------------------------------------------------------

    def _key(self, kind: str, namespace: str | None, name: str) -> Key:
        return ((namespace or "") if KINDS[kind].namespaced else "", name)

    def _get_or_404(self, kind: str, namespace: str, name: str) -> Obj:
        obj = self.get(kind, namespace, name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return obj

    def _now(self) -> str:
        return self._clock().strftime(TIME_FORMAT)

    def _create(self, kind: str, obj: Obj, *, keep_status: bool) -> Obj:
        info = KINDS[kind]
        new = copy.deepcopy(obj)
        new["apiVersion"], new["kind"] = info.api_version, info.kind
        meta = new.setdefault("metadata", {})
        if info.namespaced and not meta.get("namespace"):
            raise ApiError(400, "BadRequest", f"a {info.kind} needs a namespace")
        if not info.namespaced:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _invalid("metadata.name: Required value: name or generateName is required")
            meta["name"] = self._generate_name(kind, meta.get("namespace", ""), meta["generateName"])
        if self._key(kind, meta.get("namespace"), meta["name"]) in self._store[kind]:
            raise ApiError(409, "AlreadyExists", f'{kind} "{meta["name"]}" already exists')
        if not keep_status:
            new.pop("status", None)
        _default_and_validate(kind, new)
        for field in _SYSTEM_META:
            if field not in ("namespace", "name"):
                meta.pop(field, None)
        _prune_meta(meta)
        self._uids += 1
        meta.update(uid=f"00000000-0000-4000-8000-{self._uids:012d}",
                    creationTimestamp=self._now(), generation=1)
        return self._write(kind, new, "ADDED")

    def _generate_name(self, kind: str, namespace: str, prefix: str) -> str:
        while True:
            self._names += 1
            n, suffix = self._names, ""
            for _ in range(5):
                n, digit = divmod(n, len(_NAME_ALPHABET))
                suffix += _NAME_ALPHABET[digit]
            if self._key(kind, namespace, prefix + suffix) not in self._store[kind]:
                return prefix + suffix

    def _update(self, kind: str, obj: Obj, part: _Part, *, forced_ok: bool) -> Obj:
        meta_in = obj.get("metadata") or {}
        key = self._key(kind, meta_in.get("namespace"), meta_in.get("name") or "")
        old = self._store[kind].get(key)
        if old is None:
            raise ApiError(404, "NotFound", f'{kind} "{key[1]}" not found')
        old_meta = old["metadata"]
        rv = meta_in.get("resourceVersion")
        if not rv and not forced_ok:
            raise ForcedWrite(f"update of {kind} {key} without a resourceVersion")
        if rv and rv != old_meta["resourceVersion"]:
            raise _conflict(f'Operation cannot be fulfilled on {kind} "{key[1]}": the object has '
                            "been modified; please apply your changes to the latest version and "
                            "try again")
        if meta_in.get("uid") and meta_in["uid"] != old_meta["uid"]:
            raise _conflict(f"Precondition failed: UID in precondition: {meta_in['uid']}, "
                            f"UID in object meta: {old_meta['uid']}")
        if part is _Part.STATUS:
            new = copy.deepcopy(old)
            new.pop("status", None)
            if "status" in obj:
                new["status"] = copy.deepcopy(obj["status"])
        else:
            new = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
            new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
            new["metadata"].update({f: old_meta[f] for f in _SYSTEM_META if f in old_meta})
            for f in _SYSTEM_META:
                if f not in old_meta:
                    new["metadata"].pop(f, None)
            _prune_meta(new["metadata"])
            source = obj if part is _Part.ALL else old
            if "status" in source:
                new["status"] = copy.deepcopy(source["status"])
        _check_update(kind, old, new)
        if new == old:
            return copy.deepcopy(old)  # a no-op update writes nothing, as etcd3's GuaranteedUpdate
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        return self._write(kind, new, "MODIFIED")

    def _delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
                resource_version: str | None = None) -> None:
        obj = self._get_or_404(kind, namespace, name)
        meta = obj["metadata"]
        if uid is not None and uid != meta["uid"]:
            raise _conflict(f"Precondition failed: UID in precondition: {uid}, "
                            f"UID in object meta: {meta['uid']}")
        if resource_version is not None and resource_version != meta["resourceVersion"]:
            raise _conflict(f"Precondition failed: ResourceVersion in precondition: "
                            f"{resource_version}, ResourceVersion in object meta: "
                            f"{meta['resourceVersion']}")
        if meta.get("deletionTimestamp"):
            return  # already being deleted: nothing changes
        status = obj.get("status") or {}
        grace = (POD_GRACE_SECONDS if kind == PODS and (obj.get("spec") or {}).get("nodeName")
                 and status.get("phase") not in ("Succeeded", "Failed") else 0)
        if not meta.get("finalizers") and grace == 0:
            self._write(kind, obj, "DELETED")
            return
        meta.update(deletionTimestamp=self._now(), deletionGracePeriodSeconds=grace,
                    generation=meta.get("generation", 1) + 1)
        self._write(kind, obj, "MODIFIED")

    def _write(self, kind: str, obj: Obj, type_: str) -> Obj:
        """Store `obj` (owned by the store from here on) at the next
        resourceVersion and log the event; an update that leaves a deleted
        object without finalizers or grace period removes it."""
        meta = obj["metadata"]
        if (type_ == "MODIFIED" and meta.get("deletionTimestamp") and not meta.get("finalizers")
                and not meta.get("deletionGracePeriodSeconds")):
            type_ = "DELETED"
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        key = self._key(kind, meta.get("namespace"), meta["name"])
        if type_ == "DELETED":
            del self._store[kind][key]
        else:
            self._store[kind][key] = obj
        log = self._log[kind]
        log.append(WatchEvent(len(log), type_, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    @staticmethod
    def _set_pod_condition(pod: Obj, status: str, reason: str, message: str) -> None:
        st = pod.setdefault("status", {})
        conds = [c for c in st.get("conditions") or () if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": status, "reason": reason, "message": message})
        st["conditions"] = [{k: v for k, v in c.items() if v != ""} for c in conds]


# -- what the API server checks ------------------------------------------------------


def _prune_meta(meta: Obj) -> None:
    """ObjectMeta's omitempty: an empty list or map is no field at all."""
    for field in ("labels", "annotations", "finalizers", "ownerReferences"):
        if field in meta and not meta[field]:
            del meta[field]


def _pruned(value: Any) -> Any:
    """`value` without empty fields anywhere (how built-in objects round-trip)."""
    if isinstance(value, dict):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _default_and_validate(kind: str, obj: Obj) -> None:
    """The CRD schemas' defaults and the rules of them the controller can break."""
    if kind == CLASSES:
        spec = obj.setdefault("spec", {})
        spec.setdefault("resourceName", api.DEFAULT_RESOURCE_NAME)
        spec.setdefault("onCordon", str(api.OnCordon.MOVE))
    elif kind == CLAIMS:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise _invalid("spec: Required value")
        if not isinstance(spec.get("className"), str) or not spec["className"]:
            raise _invalid("spec.className: Required value")
        count = spec.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise _invalid(f"spec.count: Invalid value: {count!r}: should be an integer >= 1")
        spec.setdefault("reclaimPolicy", str(api.ReclaimPolicy.RELEASE))
        if spec["reclaimPolicy"] not in {str(p) for p in api.ReclaimPolicy}:
            raise _invalid(f"spec.reclaimPolicy: Unsupported value: {spec['reclaimPolicy']!r}")
        _check_claim_status(obj)


def _check_claim_status(claim: Obj) -> None:
    st = claim.get("status") or {}
    phase = st.get("phase")
    if phase is not None and phase not in {str(p) for p in api.Phase}:
        raise _invalid(f"status.phase: Unsupported value: {phase!r}")
    if phase == api.Phase.BOUND and not st.get("nodeName"):
        raise _invalid("status: Invalid value: a Bound claim must name its node")
    reserved = st.get("reservedFor") or []
    if len(reserved) > 1:
        raise _invalid(f"status.reservedFor: Too many: {len(reserved)}: must have at most 1 items")
    if any(not r.get("name") or not r.get("uid") for r in reserved):
        raise _invalid("status.reservedFor: Required value: name and uid")


def _check_update(kind: str, old: Obj, new: Obj) -> None:
    old_meta, new_meta = old["metadata"], new["metadata"]
    if old_meta.get("deletionTimestamp"):
        added = set(new_meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if added:
            raise _invalid("metadata.finalizers: Forbidden: no new finalizers can be added if the "
                           f"object is being deleted, found new finalizers {sorted(added)}")
    if kind == CLAIMS:
        if new.get("spec") != old.get("spec"):
            raise _invalid('spec: Invalid value: "object": spec is immutable')
        _check_claim_status(new)
    if kind == PODS:
        problem = pod_update_problem(old.get("spec") or {}, new.get("spec") or {})
        if problem is not None:
            raise _invalid(problem)


def pod_update_problem(old: Obj, new: Obj) -> str | None:
    """Why kube-apiserver refuses changing a pod's spec from `old` to `new`,
    or None. The part the controller touches: scheduling gates may only be
    removed; while the pod is gated its nodeSelector may only gain keys and
    its required node affinity only narrow; nodeName, containers and the
    rest of spec never change."""
    old, new = _pruned(old), _pruned(new)
    if ({k: v for k, v in old.items() if k not in _GATED_MUTABLE}
            != {k: v for k, v in new.items() if k not in _GATED_MUTABLE}):
        return _POD_SPEC_FORBIDDEN
    old_gates = [g.get("name") for g in old.get("schedulingGates", [])]
    if any(g.get("name") not in old_gates for g in new.get("schedulingGates", [])):
        return "spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate"
    if new.get("nodeSelector") == old.get("nodeSelector") and new.get("affinity") == old.get("affinity"):
        return None
    if not old_gates:
        return _POD_SPEC_FORBIDDEN
    new_selector = new.get("nodeSelector", {})
    if any(new_selector.get(k) != v for k, v in old.get("nodeSelector", {}).items()):
        return ("spec.nodeSelector: Invalid value: only additions to spec.nodeSelector are "
                "allowed (no mutations or deletions)")
    old_aff, new_aff = old.get("affinity", {}), new.get("affinity", {})
    if ({k: v for k, v in old_aff.items() if k != "nodeAffinity"}
            != {k: v for k, v in new_aff.items() if k != "nodeAffinity"}):
        return _POD_SPEC_FORBIDDEN
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    old_req = old_aff.get("nodeAffinity", {}).get(required)
    if old_req is None:
        return None  # no required affinity before: any may be set
    path = f"spec.affinity.nodeAffinity.{required}.nodeSelectorTerms"
    old_terms = old_req.get("nodeSelectorTerms", [])
    new_terms = new_aff.get("nodeAffinity", {}).get(required, {}).get("nodeSelectorTerms", [])
    if old_terms and len(old_terms) != len(new_terms):
        return f"{path}: Invalid value: no additions/deletions to non-empty NodeSelectorTerms list are allowed"
    for i, (old_term, new_term) in enumerate(zip(old_terms, new_terms)):
        for field in ("matchExpressions", "matchFields"):
            before, after = old_term.get(field, []), new_term.get(field, [])
            if after[:len(before)] != before:
                return f"{path}[{i}]: Invalid value: only additions are allowed (no mutations or deletions)"
    return None


def json_patch(doc: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 on a copy of `doc`: test, add, replace, remove on object
    members (what the controller sends); a failed op is 422."""
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent: Any = out
        for t in tokens[:-1]:
            if not isinstance(parent, dict) or t not in parent:
                raise ApiError(422, "Invalid", f"jsonpatch {op['op']}: doc is missing path {op['path']}")
            parent = parent[t]
        last = tokens[-1]
        kind = op["op"]
        if not isinstance(parent, dict):
            raise ApiError(422, "Invalid", f"jsonpatch {kind}: {op['path']} is not in an object")
        if kind == "test":
            if parent.get(last, _MISSING) != op["value"]:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in "
                                               f"our request: testing value {op['path']} failed")
        elif kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if last not in parent:
                raise ApiError(422, "Invalid", f"jsonpatch replace: missing path {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if parent.pop(last, _MISSING) is _MISSING:
                raise ApiError(422, "Invalid", f"jsonpatch remove: missing path {op['path']}")
        else:
            raise ApiError(400, "BadRequest", f"unsupported jsonpatch op {kind!r}")
    return out


_MISSING = object()
