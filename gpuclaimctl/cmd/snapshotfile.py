"""What `why` and `simulate` decide on: one read of the API, or a snapshot file.

`read_live` lists what the decision looks at (nodes, GPUClasses, GPUClaims,
GPUClaimTemplates, GPUBudgets, the pods that may hold GPUs, bound
PersistentVolumeClaims and the PersistentVolumes with node affinity, and
where the API server serves resource.k8s.io/v1 its ResourceSlices,
DeviceClasses, ResourceClaims and DeviceTaintRules), through the
statusview reader and `kube.list_all`: GETs only, nothing is ever written.
Each object is trimmed to the fields placement reads, so a snapshot file is
small, and a decision on a file saved by `gpuclaimctl snapshot` is the
decision on the live read it came from. `dra_served` turns the DRA lists
into what each node offers and what uses it, as `status` and the
controller count them (docs/dra.md), once the snapshot's edits are made.

A snapshot file is JSON (or YAML):
    {"kind": "GPUClaimCtlSnapshot", "version": 1, "takenAt": "...",
     "nodes": [...], "classes": [...], "claims": [...], "pods": [...],
     "budgets": [...], "templates": [...],
     "persistentVolumeClaims": [...], "persistentVolumes": [...],
     "dra": {"resourceSlices": [...], "deviceClasses": [...],
             "resourceClaims": [...], "deviceTaintRules": [...]}}
each list holding API objects as the API server serves them (trimmed);
`"dra": null` where the API server does not serve resource.k8s.io/v1. A
file without the `dra` key (written before it existed) is read as one
whose DRA objects are unknown, and said so (`DRA_UNKNOWN`).
`--add-node NAME=RESOURCE:COUNT[,RESOURCE:COUNT][,label=value...]` and
`--without-node NAME` edit one (`add_node`, `without_node`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import orjson
import urllib3
import yaml
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError, NotFound
from gpuclaimctl.cmd import statusview
from gpuclaimctl.cmd.statusview import DraObjects, StatusError
from gpuclaimctl.decide.capacity import pod_usage
from gpuclaimctl.decide.whatif import ClusterObjects, DraServed
from gpuclaimctl.model.api import GROUP, TEMPLATE_PLURAL, VERSION
from gpuclaimctl.model.dra import EXTENDED_RESOURCE_CLAIM_ANNOTATION, ClaimInfo
from gpuclaimctl.model.snapshot import ClassInfo, NodeInfo, format_time, parse_time

Obj = dict[str, Any]
KIND = "GPUClaimCtlSnapshot"
FORMAT_VERSION = 1
# ClusterObjects field -> the snapshot file's key
_KEYS = {"nodes": "nodes", "classes": "classes", "claims": "claims", "pods": "pods",
         "budgets": "budgets", "templates": "templates", "pvcs": "persistentVolumeClaims",
         "pvs": "persistentVolumes"}
# DraObjects field -> the key in the snapshot file's "dra"
_DRA_KEYS = {"slices": "resourceSlices", "device_classes": "deviceClasses", "claims": "resourceClaims",
             "taint_rules": "deviceTaintRules"}


class SnapshotError(Exception):
    """A snapshot that cannot be read or edited; str() is one line for a person."""


@dataclass(frozen=True)
class Taken:
    objects: ClusterObjects
    taken_at: datetime
    # What the read could not see, for a note (a list the user may not read).
    warnings: tuple[str, ...] = ()
    # resource.k8s.io/v1's lists; None where it is not served (or not known).
    dra: DraObjects | None = None


# --- trimming: the fields placement reads ---------------------------------------------


def _pick(obj: Mapping[str, Any] | None, *keys: str) -> Obj:
    obj = obj or {}
    return {k: obj[k] for k in keys if obj.get(k) not in (None, "", [], {})}


def trim_node(node: Mapping[str, Any]) -> Obj:
    status = node.get("status") or {}
    ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return {"metadata": _pick(node.get("metadata"), "name", "labels"),
            "spec": _pick(node.get("spec"), "taints", "unschedulable"),
            "status": {"allocatable": dict(status.get("allocatable") or {}),
                       "conditions": [_pick(c, "type", "status") for c in ready]}}


def trim_claim(claim: Mapping[str, Any]) -> Obj:
    status = _pick(claim.get("status"), "phase", "nodeName", "resourceName", "reservedFor",
                   "rejectedNodes")
    return {"metadata": _pick(claim.get("metadata"), "name", "namespace", "uid", "labels",
                              "annotations", "ownerReferences", "deletionTimestamp"),
            "spec": dict(claim.get("spec") or {}), "status": status}


def trim_spec_object(obj: Mapping[str, Any]) -> Obj:
    """A GPUClass, GPUClaimTemplate or GPUBudget: who it is and its spec."""
    return {"metadata": _pick(obj.get("metadata"), "name", "namespace", "deletionTimestamp"),
            "spec": dict(obj.get("spec") or {})}


def trim_pod(pod: Mapping[str, Any]) -> Obj:
    spec = pod.get("spec") or {}
    containers = {group: [_pick(c, "name", "resources", "restartPolicy") for c in spec.get(group) or ()]
                  for group in ("containers", "initContainers")}
    return {"metadata": _pick(pod.get("metadata"), "name", "namespace", "uid", "creationTimestamp"),
            "spec": {**_pick(spec, "nodeName", "overhead"), **{k: v for k, v in containers.items() if v}},
            "status": _pick(pod.get("status"), "phase")}


def trim_dra(dra: DraObjects) -> DraObjects:
    """What decide.dra and decide.drausage read: each slice's, class's and
    rule's spec (a class's creation time too: the newest maps its resource),
    and of the ResourceClaims only the allocated ones, with their owner and
    devices."""
    def spec_object(obj: Mapping[str, Any], *meta: str) -> Obj:
        return {"metadata": _pick(obj.get("metadata"), "name", *meta), "spec": dict(obj.get("spec") or {})}

    def claim(c: Mapping[str, Any]) -> Obj:
        meta = c.get("metadata") or {}
        annotations = _pick(meta.get("annotations"), EXTENDED_RESOURCE_CLAIM_ANNOTATION)
        return {"metadata": {**_pick(meta, "name", "namespace", "uid", "ownerReferences"),
                             **({"annotations": annotations} if annotations else {})},
                "status": _pick(c.get("status"), "allocation", "reservedFor")}

    return DraObjects(
        slices=[spec_object(s) for s in dra.slices],
        device_classes=[spec_object(c, "creationTimestamp") for c in dra.device_classes],
        claims=[claim(c) for c in dra.claims if (c.get("status") or {}).get("allocation")],
        taint_rules=[spec_object(r) for r in dra.taint_rules])


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """On a node, not finished, requesting an extended resource: what capacity counts."""
    return next(iter(pod_usage(pod)), None) is not None


def trim(objects: ClusterObjects) -> ClusterObjects:
    pvcs = [p for p in objects.pvcs if (p.get("spec") or {}).get("volumeName")]
    pvs = [p for p in objects.pvs if ((p.get("spec") or {}).get("nodeAffinity") or {}).get("required")]
    return ClusterObjects(
        nodes=[trim_node(n) for n in objects.nodes],
        classes=[trim_spec_object(c) for c in objects.classes],
        claims=[trim_claim(c) for c in objects.claims],
        pods=[trim_pod(p) for p in objects.pods if holds_gpus(p)],
        budgets=[trim_spec_object(b) for b in objects.budgets],
        templates=[trim_spec_object(t) for t in objects.templates],
        pvcs=[{"metadata": _pick(p.get("metadata"), "name", "namespace", "uid", "ownerReferences"),
               "spec": {"volumeName": p["spec"]["volumeName"]}} for p in pvcs],
        pvs=[{"metadata": _pick(p.get("metadata"), "name"),
              "spec": {"nodeAffinity": p["spec"]["nodeAffinity"]}} for p in pvs],
    )


# --- reading the API (GETs only) ------------------------------------------------------


def read_live(api: client.ApiClient, now: datetime, *, trimmed: bool = True) -> Taken:
    """Everything a decision reads (trimmed, unless asked not to: `why`
    shows the claims' conditions). Raises StatusError with one line."""
    snap = statusview.read(api)
    warnings: list[str] = []
    dra = _dra_or_none(api, warnings)
    templates = snap.templates if snap.templates is not None else _list_or_none(
        api, f"/apis/{GROUP}/{VERSION}/{TEMPLATE_PLURAL}", "GPUClaimTemplates", warnings)
    pvcs = _list_or_none(api, "/api/v1/persistentvolumeclaims", "PersistentVolumeClaims", warnings)
    pvs = _list_or_none(api, "/api/v1/persistentvolumes", "PersistentVolumes", warnings)
    objects = ClusterObjects(nodes=snap.nodes, classes=snap.classes, claims=snap.claims, pods=snap.pods,
                             budgets=snap.budgets, templates=templates, pvcs=pvcs, pvs=pvs)
    if trimmed:
        objects, dra = trim(objects), trim_dra(dra) if dra is not None else None
    return Taken(objects, now, tuple(warnings), dra)


def _dra_or_none(api: client.ApiClient, warnings: list[str]) -> DraObjects | None:
    """resource.k8s.io/v1's lists (statusview.read_dra): None where it is
    not served; refused (RBAC), left out and said so, as the other lists
    the decision can do without."""
    try:
        return statusview.read_dra(api)
    except ApiError as e:
        warnings.append(f"{DRA_LISTS} could not be listed ({e.status} {e.reason}); {DRA_LEFT_OUT}")
        return None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise StatusError(f"cannot reach the API server at {api.configuration.host}: {e}") from None


DRA_LISTS = "ResourceSlices, DeviceClasses or ResourceClaims (resource.k8s.io/v1)"
DRA_LEFT_OUT = "GPUs served by DRA are left out: such nodes show none"
DRA_UNKNOWN = (f"the snapshot has no {DRA_LISTS} (written by an older gpuclaimctl); {DRA_LEFT_OUT}")


def dra_served(objects: ClusterObjects, dra: DraObjects | None) -> DraServed | None:
    """What DRA serves on `objects`' nodes for their GPUClasses' resources,
    counted as `status` counts it (statusview.dra_nodes, the controller's
    rules); None without resource.k8s.io/v1's objects. Pure."""
    if dra is None:
        return None
    offers = statusview.dra_nodes((NodeInfo.from_api(n) for n in objects.nodes),
                                  (ClassInfo.from_api(c) for c in objects.classes), dra)
    return DraServed(offers, [ClaimInfo.from_api(c) for c in dra.claims])


def _list_or_none(api: client.ApiClient, path: str, what: str, warnings: list[str]) -> list[Obj]:
    """A list the decision can do without: refused (RBAC) or not served, it
    is left out and said so."""
    try:
        return kube.list_all(api, path)
    except NotFound:
        return []
    except ApiError as e:
        warnings.append(f"{what} could not be listed ({e.status} {e.reason}); left out")
        return []
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise StatusError(f"cannot reach the API server at {api.configuration.host}: {e}") from None


# --- the file -------------------------------------------------------------------------


def to_document(taken: Taken) -> Obj:
    doc: Obj = {"kind": KIND, "version": FORMAT_VERSION, "takenAt": format_time(taken.taken_at)}
    for field, key in _KEYS.items():
        doc[key] = list(getattr(taken.objects, field))
    doc["dra"] = None if taken.dra is None else {key: list(getattr(taken.dra, field))
                                                 for field, key in _DRA_KEYS.items()}
    return doc


def dumps(taken: Taken, output: str = "json") -> str:
    doc = to_document(taken)
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False))
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def loads(text: str, source: str = "the snapshot") -> Taken:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SnapshotError(f"{source} is neither JSON nor YAML: {_first_line(e)}") from None
    if not isinstance(doc, Mapping) or doc.get("kind") != KIND:
        raise SnapshotError(f"{source} is not a gpuclaimctl snapshot (kind {KIND}); make one with "
                            "`gpuclaimctl snapshot > FILE`")
    if doc.get("version") != FORMAT_VERSION:
        raise SnapshotError(f"{source} is snapshot version {doc.get('version')!r}; this gpuclaimctl "
                            f"reads version {FORMAT_VERSION}")
    taken_at = parse_time(doc.get("takenAt"))
    if taken_at is None:
        raise SnapshotError(f"{source} has no takenAt time")
    lists = {field: _objects(doc, key, source, key) for field, key in _KEYS.items()}
    if "dra" not in doc:
        return Taken(ClusterObjects(**lists), taken_at, (DRA_UNKNOWN,))
    dra = doc["dra"]
    if dra is not None and not isinstance(dra, Mapping):
        raise SnapshotError(f"{source}: dra must be an object or null")
    return Taken(ClusterObjects(**lists), taken_at, (), None if dra is None else DraObjects(
        **{field: _objects(dra, key, source, f"dra.{key}") for field, key in _DRA_KEYS.items()}))


def _objects(doc: Mapping[str, Any], key: str, source: str, where: str) -> list[Obj]:
    items = doc.get(key)
    items = [] if items is None else items
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise SnapshotError(f"{source}: {where} must be a list of objects")
    return items


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# --- editing --------------------------------------------------------------------------

_RESOURCE = re.compile(r"([A-Za-z0-9.-]+/[A-Za-z0-9._-]+):([0-9]+)")
_LABEL = re.compile(r"((?:[A-Za-z0-9.-]+/)?[A-Za-z0-9._-]+)=([A-Za-z0-9._-]*)")
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def parse_node(text: str) -> Obj:
    """`NAME=RESOURCE:COUNT[,RESOURCE:COUNT...][,label=value...]` as a Ready,
    uncordoned Node with that allocatable and those labels (and
    kubernetes.io/hostname, as the kubelet sets it). ValueError says what
    is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not _NODE_NAME.fullmatch(name):
        raise ValueError(f"{text!r}: expected NAME=RESOURCE:COUNT[,label=value...], NAME a node name")
    allocatable: dict[str, str] = {}
    labels = {"kubernetes.io/hostname": name}
    for item in rest.split(","):
        resource, label = _RESOURCE.fullmatch(item), _LABEL.fullmatch(item)
        if resource:
            allocatable[resource.group(1)] = resource.group(2)
        elif label:
            labels[label.group(1)] = label.group(2)
        else:
            raise ValueError(f"{text!r}: {item!r} is neither RESOURCE:COUNT (nvidia.com/gpu:8) "
                             "nor label=value")
    if not allocatable:
        raise ValueError(f"{text!r}: name at least one RESOURCE:COUNT, e.g. {name}=nvidia.com/gpu:8")
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def without_nodes(objects: ClusterObjects, names: Iterable[str]) -> ClusterObjects:
    """The snapshot with these nodes gone (drained and removed). Claims bound
    there stay as they are: the controller would mark them Lost after its
    grace period and place their sets again."""
    names = set(names)
    have = {_key(n)[1] for n in objects.nodes}
    missing = sorted(names - have)
    if missing:
        raise SnapshotError(f"--without-node: no node {', '.join(missing)} in the snapshot")
    return dataclasses.replace(objects, nodes=[n for n in objects.nodes if _key(n)[1] not in names])


def with_nodes(objects: ClusterObjects, nodes: Sequence[Obj]) -> ClusterObjects:
    have = {_key(n)[1] for n in objects.nodes}
    taken = sorted(have & {_key(n)[1] for n in nodes})
    if taken:
        raise SnapshotError(f"--add-node: node {', '.join(taken)} is already in the snapshot "
                            "(--without-node it first to replace it)")
    return dataclasses.replace(objects, nodes=[*objects.nodes, *nodes])


def with_applied(objects: ClusterObjects, applied: Mapping[str, Sequence[Obj]]) -> ClusterObjects:
    """The snapshot with GPUClasses, GPUClaims, GPUClaimTemplates and
    GPUBudgets of a manifest as if applied (replacing those of the same
    name). `applied` is keyed by resource plural (workloads.OWN_KINDS)."""
    fields = {"gpuclasses": "classes", "gpuclaims": "claims", "gpuclaimtemplates": "templates",
              "gpubudgets": "budgets"}
    changes: dict[str, list[Obj]] = {}
    for plural, objs in applied.items():
        field = fields[plural]
        keys = {_key(o) for o in objs}
        current = [o for o in getattr(objects, field) if _key(o) not in keys]
        changes[field] = current + [trim_claim(o) if field == "claims" else trim_spec_object(o)
                                    for o in objs]
    return dataclasses.replace(objects, **changes)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def main(kubeconfig: str | None, context: str | None, output: str) -> int:
    """Print a snapshot of the live cluster; 0, or 1 with one line on stderr."""
    try:
        api = statusview.load_client(kubeconfig, context)
        with api:
            taken = read_live(api, datetime.now(timezone.utc))
    except StatusError as e:
        click.echo(f"gpuclaimctl snapshot: {e}", err=True)
        return 1
    for w in taken.warnings:
        click.echo(f"gpuclaimctl snapshot: warning: {w}", err=True)
    click.echo(dumps(taken, output), nl=False)
    return 0
