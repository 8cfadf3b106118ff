"""Hand-rolled shared informers with client-go ``tools/cache`` semantics.

Reflectors list and watch the API server (raw JSON through the official
client's connection pool, decoded by orjson), fill thread-safe indexed
caches, and feed event handlers, each on its own thread. Nothing here
starts a thread or touches the network at import time.

Cached objects are plain dicts shared by every reader: read-only.
"""

from __future__ import annotations

from informers.backoff import Backoff, BackoffPolicy
from informers.clock import Clock, FakeClock, RealClock
from informers.delta_fifo import DeltaFIFO, DeltaType
from informers.errors import ApiStatusError, TransportError
from informers.factory import SharedInformerFactory
from informers.listers import (
    ClusterLister,
    GPUClaimLister,
    GPUBudgetLister,
    GPUClaimTemplateLister,
    GPUClassLister,
    NamespacedLister,
    NodeLister,
    PersistentVolumeClaimLister,
    PersistentVolumeLister,
    PodGroupLister,
    PodLister,
)
from informers.listwatch import ListerWatcher, ListPage, WatchStream
from informers.objects import (
    DeletedFinalStateUnknown,
    KubeObject,
    deletion_handling_key,
    meta_namespace_key,
    split_key,
)
from informers.processor import EventHandler, EventHandlerFuncs
from informers.reflector import Reflector
from informers.resource import (
    CONFIG_MAPS,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    GPU_BUDGETS,
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_GROUPS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    Resource,
)
from informers.shared_informer import HandlerRegistration, SharedInformer
from informers.store import NAMESPACE_INDEX, IndexConflictError, Indexer, IndexFunc
from informers.transforms import Compactor, chain, strip_managed_fields

__all__ = [
    "ApiStatusError",
    "Backoff",
    "BackoffPolicy",
    "CONFIG_MAPS",
    "DEVICE_CLASSES",
    "DEVICE_TAINT_RULES",
    "Clock",
    "ClusterLister",
    "Compactor",
    "DeletedFinalStateUnknown",
    "DeltaFIFO",
    "DeltaType",
    "EventHandler",
    "EventHandlerFuncs",
    "FakeClock",
    "GPU_CLAIMS",
    "GPU_BUDGETS",
    "GPU_CLAIM_TEMPLATES",
    "GPU_CLASSES",
    "GPUClaimLister",
    "GPUBudgetLister",
    "GPUClaimTemplateLister",
    "GPUClassLister",
    "HandlerRegistration",
    "IndexConflictError",
    "IndexFunc",
    "Indexer",
    "KubeObject",
    "ListPage",
    "ListerWatcher",
    "NAMESPACE_INDEX",
    "NODES",
    "NamespacedLister",
    "NodeLister",
    "PERSISTENT_VOLUMES",
    "PERSISTENT_VOLUME_CLAIMS",
    "PODS",
    "POD_GROUPS",
    "RESOURCE_CLAIMS",
    "RESOURCE_QUOTAS",
    "RESOURCE_SLICES",
    "PersistentVolumeClaimLister",
    "PersistentVolumeLister",
    "PodGroupLister",
    "PodLister",
    "RealClock",
    "Reflector",
    "Resource",
    "SharedInformer",
    "SharedInformerFactory",
    "TransportError",
    "WatchStream",
    "chain",
    "deletion_handling_key",
    "meta_namespace_key",
    "split_key",
    "strip_managed_fields",
]
