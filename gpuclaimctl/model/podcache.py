"""What the controller keeps of a pod in its cache: the pod informer's
transform (client-go's SetTransform), run on every pod before it is cached.

A realistic pod is 9 KB of JSON and about 15 KB as Python objects -- env,
probes, commands, volume sources, status of each container -- of which the
controller reads a small part. Keeping only that part is the largest saving
there is for a controller that caches every pod of a cluster (issue 12:
at most 4,000 B per cached realistic pod); kube-scheduler and
kube-controller-manager trim their caches the same way (managedFields).

What is kept is what something in this package reads from a cached pod:

- metadata: name, namespace, uid, resourceVersion, generateName,
  creationTimestamp, deletionTimestamp, annotations, ownerReferences and
  finalizers (not labels: nothing selects pods by label). The kubectl last-applied-configuration annotation (a copy
  of the whole object) keeps its key with an empty value: the release patch
  must know whether the pod has annotations at all (it adds one key to an
  existing map, or makes the map), and nothing reads the copy;
- spec: schedulingGates, nodeName, nodeSelector, tolerations and overhead
  whole (the decision and the release's `test`s read them), and
  schedulingGroup (the PodGroup whose gang the pod is in), priority and
  preemptionPolicy (preemption, DESIGN.md §4d); of affinity
  the nodeAffinity alone (pod affinity is the scheduler's; the release
  tests and pins spec.affinity.nodeAffinity only), an empty affinity when
  it has none, so the release knows the field exists; of each
  container and init container only name, resources and restartPolicy (GPU
  requests, and sidecars count as long-running); of volumes only those
  backed by a PersistentVolumeClaim (name and claim) or generic ephemeral
  ones (name; the claim's name derives from it);
- status: phase and conditions (finished pods free GPUs; a refused pinned
  pod is seen by its PodScheduled condition).

A field added to what the controller reads must be added here; the tests in
tests/test_podcache.py run the placement on pruned pods to hold that.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_METADATA = ("name", "namespace", "uid", "resourceVersion", "generateName", "creationTimestamp",
             "deletionTimestamp", "annotations", "ownerReferences", "finalizers")
_SPEC = ("schedulingGates", "nodeName", "nodeSelector", "tolerations", "overhead", "schedulingGroup",
         "priority", "preemptionPolicy")
_CONTAINER = ("name", "resources", "restartPolicy")
_STATUS = ("phase", "conditions")


def prune_pod(pod: Obj) -> Obj:
    """`pod` with only what the controller reads (see the module)."""
    meta = pod.get("metadata")
    out: Obj = {}
    if isinstance(meta, dict):
        kept = _pick(meta, _METADATA)
        annotations = kept.get("annotations")
        if isinstance(annotations, dict) and annotations.get(LAST_APPLIED):
            kept["annotations"] = {**annotations, LAST_APPLIED: ""}
        out["metadata"] = kept
    spec = pod.get("spec")
    if isinstance(spec, dict):
        s = _pick(spec, _SPEC)
        affinity = spec.get("affinity")
        if isinstance(affinity, dict):
            s["affinity"] = _pick(affinity, ("nodeAffinity",))
        for group in ("containers", "initContainers"):
            containers = spec.get(group)
            if isinstance(containers, list):
                s[group] = [_pick(c, _CONTAINER) if isinstance(c, dict) else c for c in containers]
        volumes = spec.get("volumes")
        if isinstance(volumes, list):
            s["volumes"] = [v for v in map(_volume, volumes) if v is not None]
        out["spec"] = s
    status = pod.get("status")
    if isinstance(status, dict):
        out["status"] = _pick(status, _STATUS)
    for key in ("apiVersion", "kind"):
        if key in pod:
            out[key] = pod[key]
    return out


def _pick(obj: Obj, keys: tuple[str, ...]) -> Obj:
    return {k: obj[k] for k in keys if k in obj}


def _volume(v: Any) -> Obj | None:
    if not isinstance(v, dict):
        return None
    pvc = v.get("persistentVolumeClaim")
    if isinstance(pvc, dict):
        return {"name": v.get("name"), "persistentVolumeClaim": {"claimName": pvc.get("claimName")}}
    if isinstance(v.get("ephemeral"), dict):
        return {"name": v.get("name"), "ephemeral": {}}
    return None
