"""Read-only views of the caches, one per resource (client-go's listers).

A lister never calls the API server. What it returns are the cache's own
objects: read-only; copy (``copy.deepcopy``) before changing anything.
"""

from __future__ import annotations

from typing import Mapping

from informers.objects import KubeObject
from informers.resource import (
    GPU_BUDGETS,
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_GROUPS,
    PODS,
    Resource,
)
from informers.store import NAMESPACE_INDEX, Indexer


def labels_match(obj: KubeObject, selector: Mapping[str, str]) -> bool:
    """Equality-based label selector: every key present with that value."""
    labels = obj["metadata"].get("labels") or {}
    for k, v in selector.items():
        if labels.get(k) != v:
            return False
    return True


class _Lister:
    resource: Resource

    def __init__(self, indexer: Indexer) -> None:
        self._indexer = indexer

    def by_index(self, index_name: str, value: str) -> list[KubeObject]:
        """Objects filed under ``value`` in a custom index (read-only)."""
        return self._indexer.by_index(index_name, value)

    def _select(self, objs: list[KubeObject], selector: Mapping[str, str] | None) -> list[KubeObject]:
        if not selector:
            return objs
        return [o for o in objs if labels_match(o, selector)]


class NamespacedLister(_Lister):
    def list(
        self, namespace: str | None = None, selector: Mapping[str, str] | None = None
    ) -> list[KubeObject]:
        """Objects of one namespace (all namespaces when None), optionally by labels."""
        if namespace is None:
            objs = self._indexer.list()
        else:
            objs = self._indexer.by_index(NAMESPACE_INDEX, namespace)
        return self._select(objs, selector)

    def get(self, namespace: str, name: str) -> KubeObject | None:
        return self._indexer.get_by_key(f"{namespace}/{name}")


class ClusterLister(_Lister):
    def list(self, selector: Mapping[str, str] | None = None) -> list[KubeObject]:
        return self._select(self._indexer.list(), selector)

    def get(self, name: str) -> KubeObject | None:
        return self._indexer.get_by_key(name)


class PodLister(NamespacedLister):
    resource = PODS


class NodeLister(ClusterLister):
    resource = NODES


class GPUClassLister(ClusterLister):
    resource = GPU_CLASSES


class GPUClaimLister(NamespacedLister):
    resource = GPU_CLAIMS


class GPUClaimTemplateLister(NamespacedLister):
    resource = GPU_CLAIM_TEMPLATES


class GPUBudgetLister(NamespacedLister):
    resource = GPU_BUDGETS


class PersistentVolumeClaimLister(NamespacedLister):
    resource = PERSISTENT_VOLUME_CLAIMS


class PersistentVolumeLister(ClusterLister):
    resource = PERSISTENT_VOLUMES


class PodGroupLister(NamespacedLister):
    resource = POD_GROUPS
