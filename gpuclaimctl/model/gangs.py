"""Which gang a pod is in (DESIGN.md §4c), declared one of two ways:

- annotations `gpuclaimctl.io/gang` (a DNS label) and
  `gpuclaimctl.io/gang-size` (N >= 1), same namespace;
- `spec.schedulingGroup.podGroupName` naming a PodGroup
  (scheduling.k8s.io/v1beta1) of the pod's namespace whose
  `spec.schedulingPolicy.gang.minCount` is N. A PodGroup with the `basic`
  policy is no gang: its pods are placed one by one.

The annotation wins when a pod has both (it is the one written for
gpuclaimctl; the PodGroup is still kube-scheduler's to read).

A gang is placed all at once or not at all: no member is released until N
members exist, are gated, and every member's set fits at the same moment
(decide.gang). Pure: parsing only; PodGroups are looked up through the
callable the caller passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuclaimctl.model import keys
from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION

# More members than this is a typo, not a training job (the largest jobs
# run a few thousand pods); it also bounds one decision's work.
MAX_GANG_SIZE = 10_000


# A PodGroup gang's key and index value: `ns/podgroup:<name>`. No DNS label
# has a ':', so it never meets an annotation gang's `ns/<name>`.
PODGROUP_PREFIX = "podgroup:"

# PodGroups by namespace and name (None: not known). Cache objects: read-only.
PodGroupLookup = Callable[[str, str], "Mapping[str, Any] | None"]


def podgroup_gang_key(namespace: str, podgroup: str) -> str:
    """The key of the gang of the pods naming PodGroup `podgroup`."""
    return keys.namespaced(namespace, PODGROUP_PREFIX + podgroup)


class GangError(ValueError):
    """A pod's gang annotations (or its PodGroup's gang policy) are wrong;
    the message says how."""


class PodGroupMissing(LookupError):
    """The pod names a PodGroup the lookup does not know (not made yet, or
    PodGroups not read yet): it waits until it is known."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"PodGroup {name} is not known")
        self.namespace = namespace
        self.name = name


@dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    size: int
    source: Literal["annotation", "podgroup"] = "annotation"

    @property
    def key(self) -> str:
        """The PODS_BY_GANG index value: `ns/name`, `ns/podgroup:name`."""
        if self.source == "podgroup":
            return podgroup_gang_key(self.namespace, self.name)
        return keys.namespaced(self.namespace, self.name)

    @property
    def label(self) -> str:
        """How messages name it: `train`, `train (PodGroup)`."""
        return f"{self.name} (PodGroup)" if self.source == "podgroup" else self.name


def gang_name(pod: Mapping[str, Any]) -> str | None:
    """The gang annotation's value as written (None: not in a gang)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_ANNOTATION)
    return value if isinstance(value, str) else None


def pod_group_name(pod: Mapping[str, Any]) -> str | None:
    """`spec.schedulingGroup.podGroupName` (None: it names no PodGroup)."""
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def podgroup_gang_size(podgroup: Mapping[str, Any]) -> int | None:
    """A PodGroup's `spec.schedulingPolicy.gang.minCount`; None for a PodGroup
    that is no gang (the `basic` policy); GangError for a count out of range."""
    spec = podgroup.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, Mapping) else None
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    if not isinstance(gang, Mapping):
        return None
    name = (podgroup.get("metadata") or {}).get("name")
    count = gang.get("minCount")
    # The API server holds minCount >= 1; only our own bound can be passed.
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GANG_SIZE:
        raise GangError(f"PodGroup {name}: schedulingPolicy.gang.minCount={count!r} is out of range: "
                        f"gpuclaimctl places gangs of 1 to {MAX_GANG_SIZE} pods")
    return count


def pod_gang(pod: Mapping[str, Any], podgroups: PodGroupLookup | None = None) -> Gang | None:
    """The pod's gang, None if it is in none; GangError if its annotations
    are wrong (a name that is not a DNS label, a size that is not a whole
    number from 1 to MAX_GANG_SIZE, a size without a name).

    Without annotations, a pod naming a PodGroup is in that PodGroup's gang
    if it has the gang policy (`podgroups` finds it; PodGroupMissing if it
    does not). Without `podgroups` PodGroups are not looked at."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    name = annotations.get(GANG_ANNOTATION)
    size_text = annotations.get(GANG_SIZE_ANNOTATION)
    if name is None:
        if size_text is not None:
            raise GangError(f"annotation {GANG_SIZE_ANNOTATION} is set but {GANG_ANNOTATION} is not: "
                            "name the gang")
        return _podgroup_gang(pod, podgroups)
    if not isinstance(name, str) or not keys.is_dns_label(name):
        raise GangError(f"annotation {GANG_ANNOTATION}={name!r} is not a DNS label (lower-case letters, "
                        "digits and '-', at most 63)")
    if size_text is None:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION} is missing: say how many pods gang {name} has")
    try:
        size = int(str(size_text).strip())
    except ValueError:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION}={size_text!r} is not a whole number") from None
    if not 1 <= size <= MAX_GANG_SIZE:
        raise GangError(f"annotation {GANG_SIZE_ANNOTATION}={size} is out of range: from 1 to "
                        f"{MAX_GANG_SIZE}")
    return Gang(str(meta.get("namespace") or ""), name, size)


def _podgroup_gang(pod: Mapping[str, Any], podgroups: PodGroupLookup | None) -> Gang | None:
    group = pod_group_name(pod)
    if group is None or podgroups is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    podgroup = podgroups(namespace, group)
    if podgroup is None:
        raise PodGroupMissing(namespace, group)
    size = podgroup_gang_size(podgroup)
    return None if size is None else Gang(namespace, group, size, source="podgroup")
