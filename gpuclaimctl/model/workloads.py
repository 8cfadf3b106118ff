"""The pods a manifest would make, for `gpuclaimctl simulate -f`.

A file holds one or more YAML/JSON documents (or a `List`). Each Pod,
Deployment, ReplicaSet, StatefulSet, Job or CronJob becomes a `Workload`:
its pod template and how many copies it runs at once (`replicas`;
a Job's `parallelism`, at most its `completions`). `copies` makes those
pods as the API would hold them when created: named as their controller
names them (a StatefulSet's `<name>-<ordinal>`, with its volume claim
templates' claims `<template>-<pod>`), in their namespace, with a uid and a
creation time, so that template claims get their real names and the
decision reads them as it would read the real pods.

GPUClass, GPUClaim, GPUClaimTemplate and GPUBudget documents are returned
apart (`Manifests.objects`): a simulation counts them as if they had been
applied with the pods. Any other kind is skipped, and said so.

Pure: no client, no clock (`now` is passed in), no globals.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuclaimctl.model.api import (
    BUDGET_PLURAL,
    CLAIM_KIND,
    CLAIM_PLURAL,
    CLASS_KIND,
    CLASS_PLURAL,
    GROUP,
    TEMPLATE_KIND,
    TEMPLATE_PLURAL,
)
from gpuclaimctl.model.snapshot import format_time

Obj = dict[str, Any]

# kind -> where its pod template is.
_TEMPLATE_AT: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
# Our own kinds a simulation applies with the pods, by the snapshot list they join.
OWN_KINDS: Mapping[str, str] = {
    CLASS_KIND: CLASS_PLURAL,
    CLAIM_KIND: CLAIM_PLURAL,
    TEMPLATE_KIND: TEMPLATE_PLURAL,
    "GPUBudget": BUDGET_PLURAL,
}
_CLUSTER_SCOPED = frozenset({CLASS_KIND})
# The most copies one document may ask for: simulate is a question, not a load test.
MAX_COPIES = 10_000


class ManifestError(ValueError):
    """A document that cannot be read as a workload; str() says which and why."""


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str
    namespace: str
    template: Mapping[str, Any]  # a Pod's metadata and spec
    replicas: int
    volume_claim_templates: tuple[str, ...] = ()  # a StatefulSet's

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Manifests:
    workloads: tuple[Workload, ...]
    # resource plural (gpuclasses, gpuclaims, ...) -> objects to count as applied
    objects: Mapping[str, tuple[Obj, ...]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()  # "Service default/web", for a note


def read_manifests(docs: Iterable[Any], namespace: str, replicas: int | None = None) -> Manifests:
    """The workloads and our own objects among `docs` (parsed YAML/JSON
    documents; None for an empty one). `namespace` is for documents that
    name none; `replicas` overrides every workload's own count."""
    workloads: list[Workload] = []
    objects: dict[str, list[Obj]] = {}
    skipped: list[str] = []
    for index, doc in enumerate(_flatten(docs), 1):
        if not isinstance(doc, Mapping):
            raise ManifestError(f"document {index} is not an object")
        kind = doc.get("kind")
        raw_meta = doc.get("metadata")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        name = meta.get("name") or meta.get("generateName") or ""
        if not isinstance(kind, str) or not kind:
            raise ManifestError(f"document {index} has no kind")
        ns = meta.get("namespace") or namespace
        if kind in OWN_KINDS and str(doc.get("apiVersion", "")).startswith(GROUP + "/"):
            obj = copy.deepcopy(dict(doc))
            obj["metadata"] = dict(meta)
            if kind not in _CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = ns
            objects.setdefault(OWN_KINDS[kind], []).append(obj)
            continue
        if kind != "Pod" and kind not in _TEMPLATE_AT:
            skipped.append(f"{kind} {name}".strip())
            continue
        if not isinstance(name, str) or not name:
            raise ManifestError(f"document {index} ({kind}) has no metadata.name")
        workloads.append(_workload(kind, name, ns, doc, replicas))
    return Manifests(tuple(workloads), {k: tuple(v) for k, v in objects.items()}, tuple(skipped))


def _flatten(docs: Iterable[Any]) -> Iterable[Any]:
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from _flatten(doc["items"])
        else:
            yield doc


def _workload(kind: str, name: str, ns: str, doc: Mapping[str, Any], replicas: int | None) -> Workload:
    if kind == "Pod":
        template: Any = {"metadata": doc.get("metadata") or {}, "spec": doc.get("spec")}
    else:
        template = doc
        for key in _TEMPLATE_AT[kind]:
            template = template.get(key) if isinstance(template, Mapping) else None
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        where = "spec" if kind == "Pod" else ".".join(_TEMPLATE_AT[kind]) + ".spec"
        raise ManifestError(f"{kind} {name} has no {where}")
    try:
        count = replicas if replicas is not None else _own_replicas(kind, doc)
    except ManifestError as e:
        raise ManifestError(f"{kind} {name}: {e}") from None
    if count < 0 or count > MAX_COPIES:
        raise ManifestError(f"{kind} {name}: {count} copies; between 0 and {MAX_COPIES} can be simulated")
    claims: tuple[str, ...] = ()
    if kind == "StatefulSet":
        vcts = (doc.get("spec") or {}).get("volumeClaimTemplates") or ()
        claims = tuple(str((t.get("metadata") or {}).get("name") or "") for t in vcts
                       if isinstance(t, Mapping))
    return Workload(kind, name, ns, template, count, tuple(c for c in claims if c))


def _own_replicas(kind: str, doc: Mapping[str, Any]) -> int:
    """How many pods the object runs at once, as its controller defaults it."""
    spec: Any = doc.get("spec") or {}
    if kind == "Pod":
        return 1
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
        kind = "Job"
    if kind == "Job":
        parallelism = _whole(spec.get("parallelism"), 1)
        completions = spec.get("completions")
        return parallelism if completions is None else min(parallelism, _whole(completions, 1))
    return _whole(spec.get("replicas"), 1)


def _whole(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"replicas, parallelism or completions {value!r} is not a whole number")
    return value


def pod_name(workload: Workload, index: int) -> str:
    """The name of copy `index` (from 0): a StatefulSet's ordinal name; a
    Pod's own name when it is one copy; otherwise `<name>-sim-<index>`
    (the real ones get a random suffix)."""
    base = workload.name.rstrip("-")
    if workload.kind == "StatefulSet":
        return f"{base}-{index}"
    if workload.kind == "Pod" and workload.replicas == 1:
        return base
    return f"{base}-sim-{index}"


def copies(workload: Workload, now: datetime) -> list[Obj]:
    """The workload's pods, as created: gated as the user wrote them, not
    on a node, each with its own uid and `now` as its creation time."""
    out = []
    for i in range(workload.replicas):
        name = pod_name(workload, i)
        meta = copy.deepcopy(dict(workload.template.get("metadata") or {}))
        spec = copy.deepcopy(dict(workload.template.get("spec") or {}))
        meta.pop("generateName", None)
        meta.update(name=name, namespace=workload.namespace, uid=f"simulated-{workload.namespace}-{name}",
                    creationTimestamp=format_time(now))
        spec.pop("nodeName", None)
        if workload.volume_claim_templates:
            templates = set(workload.volume_claim_templates)
            volumes = [v for v in spec.get("volumes") or () if (v or {}).get("name") not in templates]
            volumes += [{"name": t, "persistentVolumeClaim": {"claimName": f"{t}-{name}"}}
                        for t in workload.volume_claim_templates]
            spec["volumes"] = volumes
        out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                    "status": {"phase": "Pending"}})
    return out
