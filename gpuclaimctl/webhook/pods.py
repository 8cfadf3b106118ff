"""What the pod webhooks decide (issue 14 items 1 and 2).

Mutation, at CREATE of a pod not yet bound to a node:
- a pod that names GPU claims gets the scheduling gate if it lacks it;
- in a namespace labelled `gpuclaimctl.io/default-class: <class>`, a pod
  with no claims annotation that requests that class's resource gets an
  inline claim for as many GPUs (its effective request, as the scheduler
  counts it) and the gate.
A second pass over the result changes nothing (reinvocationPolicy
IfNeeded relies on it).

Validation, for anyone but the controller:
- CREATE of a pod naming claims or carrying the gate: the annotation must
  pass the controller's own parsing (`pod_claims`; the refusal is its
  message), the pod must be gated and not set `spec.nodeName`, and its
  containers must not request more of a class's resource than its claims
  hold;
- CREATE of a pod requesting a class's resource without claims, in a
  namespace with a GPUBudget: refused, with how to ask for claims (the
  budget would not count it otherwise);
- UPDATE: the gate is the controller's to remove; the annotation may
  change only while the pod is gated and none of its claims is reserved
  for it yet.

Pure: no client, no clock, no globals. What the caches know comes in
through `AdmissionView`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Set
from typing import Any, Protocol

from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import (
    ClaimEntry,
    EntrySource,
    PodClaimsError,
    has_gate,
    pod_claims,
)
from gpuclaimctl.model.resources import pod_request, requests_beyond_claims
from gpuclaimctl.webhook.review import (
    AdmissionRequest,
    Operation,
    Verdict,
    allow,
    deny,
    invalid,
    pointer,
)

# The entry a default-class pod gets; its claim is `<pod>-gpus`.
DEFAULT_ENTRY = "gpus"


class AdmissionView(Protocol):
    """What the webhook reads from the controller's caches. Reads only."""

    @property
    def controller_users(self) -> Set[str]:
        """Usernames whose requests are the controller's own."""

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels; None when the cache does not show it."""

    def fresh_namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels as the API server has them now (None: no
        such namespace); raises when they cannot be read."""

    def has_budget(self, namespace: str) -> bool: ...

    def class_resources(self) -> Mapping[str, str]:
        """GPUClass name -> the node resource counting its GPUs."""

    def template(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


def _is_pod(req: AdmissionRequest) -> bool:
    return req.group == "" and req.resource == "pods" and not req.sub_resource


def _annotation(pod: Mapping[str, Any] | None) -> str | None:
    value = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    text = value.get(api.CLAIMS_ANNOTATION) if isinstance(value, Mapping) else None
    return text if isinstance(text, str) else None


def _node_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def default_class(labels: Mapping[str, str] | None) -> str:
    return str((labels or {}).get(api.DEFAULT_CLASS_LABEL) or "")


# -- mutation -------------------------------------------------------------------------


def mutate(req: AdmissionRequest, view: AdmissionView) -> Verdict:
    """The patch for a pod CREATE (or none)."""
    pod = req.object
    if (req.operation is not Operation.CREATE or not _is_pod(req) or pod is None
            or req.username in view.controller_users or _node_name(pod)):
        return allow()
    patch: list[dict[str, Any]] = []
    meta = pod.get("metadata") or {}
    if _annotation(pod) is None:
        cls = default_class(view.namespace_labels(req.namespace))
        if not cls:
            # Only the default-class webhook sends a pod naming no claims,
            # and the API server sent it because the namespace carries the
            # label: the cache does not show it yet (a namespace just made
            # or just labelled). Allowing the pod as it is would let it past
            # the gate and every budget; the API server has the answer.
            try:
                cls = default_class(view.fresh_namespace_labels(req.namespace))
            except Exception as e:
                return deny(f"could not read the labels of namespace {req.namespace} to give "
                            f"this pod its GPU claims ({e}); try again")
        if not cls:
            return allow()
        # A class not created yet is read with the CRD's default resource: the
        # pod then waits with ClassNotFound, as one that named the class would.
        resource = view.class_resources().get(cls, api.DEFAULT_RESOURCE_NAME)
        count = pod_request(pod, resource)
        if count <= 0:
            return allow()
        value = json.dumps([{"name": DEFAULT_ENTRY, "className": cls, "count": count}])
        if isinstance(meta.get("annotations"), Mapping):
            patch.append({"op": "add", "path": pointer("metadata", "annotations", api.CLAIMS_ANNOTATION),
                          "value": value})
        else:
            patch.append({"op": "add", "path": pointer("metadata", "annotations"),
                          "value": {api.CLAIMS_ANNOTATION: value}})
    if not has_gate(pod):
        gate = {"name": api.SCHEDULING_GATE}
        if isinstance((pod.get("spec") or {}).get("schedulingGates"), list):
            patch.append({"op": "add", "path": pointer("spec", "schedulingGates", "-"), "value": gate})
        else:
            patch.append({"op": "add", "path": pointer("spec", "schedulingGates"), "value": [gate]})
    return allow(patch)


# -- validation -----------------------------------------------------------------------


def validate(req: AdmissionRequest, view: AdmissionView) -> Verdict:
    if not _is_pod(req) or req.username in view.controller_users:
        return allow()
    if req.operation is Operation.CREATE and req.object is not None:
        return _validate_create(req.object, req.namespace, view)
    if req.operation is Operation.UPDATE and req.object is not None and req.old_object is not None:
        return _validate_update(req.old_object, req.object, req.namespace, view)
    return allow()


def _validate_create(pod: Mapping[str, Any], namespace: str, view: AdmissionView) -> Verdict:
    if _annotation(pod) is not None or has_gate(pod):
        try:
            entries = pod_claims(pod)
        except PodClaimsError as e:
            return invalid(str(e))
        if _node_name(pod):
            return deny(f"the pod names GPU claims ({api.CLAIMS_ANNOTATION}) and sets spec.nodeName; "
                        f"a pod with GPU claims is placed by gpuclaimctl: remove spec.nodeName")
        if not has_gate(pod):
            return deny(f"the pod names GPU claims but lacks the scheduling gate {api.SCHEDULING_GATE}; "
                        f"add it to spec.schedulingGates (the gpuclaimctl mutating webhook adds it "
                        f"unless another webhook removed it)")
        return _requests_within_claims(pod, namespace, entries, view)
    return _claimless_gpu_pod(pod, namespace, view)


def _validate_update(old: Mapping[str, Any], new: Mapping[str, Any], namespace: str,
                     view: AdmissionView) -> Verdict:
    old_gated = has_gate(old)
    if old_gated and not has_gate(new):
        return deny(f"the scheduling gate {api.SCHEDULING_GATE} is removed by gpuclaimctl alone, "
                    f"when it has placed the pod's GPU claims; `gpuclaimctl status` says why the "
                    f"pod waits")
    before, after = _annotation(old), _annotation(new)
    if before == after:
        return allow()
    if not old_gated:
        return deny(f"annotation {api.CLAIMS_ANNOTATION} can change only while the pod waits "
                    f"behind the scheduling gate {api.SCHEDULING_GATE}; the claims of a released "
                    f"pod are fixed: delete and recreate the pod to change them")
    try:
        pod_claims(new)
    except PodClaimsError as e:
        return invalid(str(e))
    uid = str((old.get("metadata") or {}).get("uid") or "")
    bound = sorted(name for name in _claim_names(old)
                   if uid and _reserved_for(view.claim(namespace, name), uid))
    if bound:
        return deny(f"GPUClaim(s) {', '.join(bound)} are already reserved for this pod, so "
                    f"annotation {api.CLAIMS_ANNOTATION} can no longer change; delete and "
                    f"recreate the pod to change its claims")
    return allow()


def _claim_names(pod: Mapping[str, Any]) -> list[str]:
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return []
    name = str((pod.get("metadata") or {}).get("name") or "")
    return [e.claim_name(name) for e in entries]


def _reserved_for(claim: Mapping[str, Any] | None, uid: str) -> bool:
    refs = ((claim or {}).get("status") or {}).get("reservedFor") or ()
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)


def _entry_gpus(entry: ClaimEntry, namespace: str,
                view: AdmissionView) -> tuple[str, int, str] | None:
    """(class, count, where from) of an entry, or None when the caches do
    not show its claim or template (the controller reports those)."""
    if entry.source is EntrySource.INLINE:
        return str(entry.class_name), int(entry.count or 0), "inline"
    if entry.source is EntrySource.TEMPLATE:
        template = view.template(namespace, entry.template or "")
        spec = ((template or {}).get("spec") or {}).get("spec") or {}
        where = f"GPUClaimTemplate {entry.template}"
    else:
        claim = view.claim(namespace, entry.claim or "")
        spec = (claim or {}).get("spec") or {}
        where = f"GPUClaim {entry.claim}"
    cls, count = spec.get("className"), spec.get("count")
    if not isinstance(cls, str) or not isinstance(count, int) or isinstance(count, bool):
        return None
    return cls, count, where


def _requests_within_claims(pod: Mapping[str, Any], namespace: str, entries: tuple[ClaimEntry, ...],
                            view: AdmissionView) -> Verdict:
    """Refuse a pod whose containers request more of a class's resource
    than its claims hold. Checked only when every entry's class and count
    are known: otherwise the controller reports the missing piece."""
    resources = view.class_resources()
    given: dict[str, int] = {}
    parts: dict[str, list[str]] = {}
    for entry in entries:
        found = _entry_gpus(entry, namespace, view)
        if found is None or found[0] not in resources:
            return allow()
        cls, count, where = found
        resource = resources[cls]
        given[resource] = given.get(resource, 0) + count
        parts.setdefault(resource, []).append(f"entry {entry.name!r}: {count} {cls} ({where})")
    counted = set(resources.values())
    refusal = requests_beyond_claims(((r, pod_request(pod, r)) for r in counted), given, counted, parts)
    return allow() if refusal is None else invalid(refusal)


def _claimless_gpu_pod(pod: Mapping[str, Any], namespace: str, view: AdmissionView) -> Verdict:
    """A pod requesting a class's resource without claims: refused where a
    GPUBudget applies (it would use GPUs the budget never counts), and in a
    default-class namespace where the mutating webhook should have given it
    claims (it did not run: another webhook undid it, or it is not installed)."""
    resources = view.class_resources()
    by_resource: dict[str, list[str]] = {}
    for cls, resource in resources.items():
        by_resource.setdefault(resource, []).append(cls)
    requested = {r: n for r in by_resource if (n := pod_request(pod, r)) > 0}
    if not requested:
        return allow()
    labels = view.namespace_labels(namespace)
    default = default_class(labels)
    resource, count = sorted(requested.items())[0]
    example = json.dumps([{"name": DEFAULT_ENTRY, "className": sorted(by_resource[resource])[0],
                           "count": count}])
    ask = (f"name its claims in annotation {api.CLAIMS_ANNOTATION} (for example '{example}') "
           f"together with the scheduling gate {api.SCHEDULING_GATE}")
    if default and resources.get(default, api.DEFAULT_RESOURCE_NAME) in requested:
        return deny(f"namespace {namespace} is labelled {api.DEFAULT_CLASS_LABEL}={default}, but "
                    f"this pod requests {count} {resource} without GPU claims (the gpuclaimctl "
                    f"mutating webhook did not give it any); {ask}")
    if view.has_budget(namespace):
        return deny(f"namespace {namespace} has a GPUBudget, so its pods get GPUs through GPU "
                    f"claims, and this pod requests {count} {resource} without any: {ask}, or ask "
                    f"an admin to label the namespace {api.DEFAULT_CLASS_LABEL}=<class> so that "
                    f"GPU pods get claims on their own")
    return allow()
