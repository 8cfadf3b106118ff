"""Which API resource an informer watches: group, version, plural, scope.

Built-in kinds and the project's CRDs are described the same way, so one
reflector serves them all over the plain REST paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str
    """API group; ``""`` for the core group (``/api/v1``)."""
    version: str
    plural: str
    namespaced: bool

    def __post_init__(self) -> None:
        if not self.version or not self.plural:
            raise ValueError(f"a resource needs a version and a plural: {self!r}")

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        """The list/watch URL path, across namespaces unless ``namespace`` is given."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace:
            if not self.namespaced:
                raise ValueError(f"{self} is cluster-scoped; it has no namespace {namespace!r}")
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{base}/{self.plural}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods", namespaced=True)
NODES = Resource("", "v1", "nodes", namespaced=False)
CONFIG_MAPS = Resource("", "v1", "configmaps", namespaced=True)
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims", namespaced=True)
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", namespaced=False)
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", namespaced=True)
# Served only where the cluster enables it (Kubernetes 1.37: the GenericWorkload
# feature gate and --runtime-config=scheduling.k8s.io/v1beta1=true).
POD_GROUPS = Resource("scheduling.k8s.io", "v1beta1", "podgroups", namespaced=True)
# Dynamic resource allocation (resource.k8s.io/v1, on by default since
# Kubernetes 1.34; a cluster may turn it off with --runtime-config).
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", namespaced=True)
DEVICE_TAINT_RULES = Resource("resource.k8s.io", "v1", "devicetaintrules", namespaced=False)

CRD_GROUP = "gpuclaimctl.io"
CRD_VERSION = "v1alpha1"
GPU_CLASSES = Resource(CRD_GROUP, CRD_VERSION, "gpuclasses", namespaced=False)
GPU_CLAIMS = Resource(CRD_GROUP, CRD_VERSION, "gpuclaims", namespaced=True)
GPU_CLAIM_TEMPLATES = Resource(CRD_GROUP, CRD_VERSION, "gpuclaimtemplates", namespaced=True)
GPU_BUDGETS = Resource(CRD_GROUP, CRD_VERSION, "gpubudgets", namespaced=True)
