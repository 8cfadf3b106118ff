"""One shared informer per resource for the whole process (client-go's SharedInformerFactory).

Every part of the controller that asks for pods gets the same informer,
so the cluster is listed and watched once and cached once. ``start``
starts whatever was asked for since the last ``start``;
``wait_for_cache_sync`` waits for them with a timeout.
"""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping, TypeVar


from informers.api import RawClient, ResourceListerWatcher
from informers.backoff import BackoffPolicy
from informers.clock import Clock
from informers.listers import (
    GPUClaimLister,
    GPUBudgetLister,
    GPUClaimTemplateLister,
    GPUClassLister,
    NodeLister,
    PersistentVolumeClaimLister,
    PersistentVolumeLister,
    PodGroupLister,
    PodLister,
    _Lister,
)
from informers.processor import HandlerErrorCallback
from informers.reflector import DEFAULT_MIN_WATCH_TIMEOUT, DEFAULT_PAGE_SIZE
from informers.resource import Resource
from informers.shared_informer import SharedInformer
from informers.store import IndexConflictError, IndexFunc
from informers.transforms import Compactor, Transform, chain, strip_managed_fields

if TYPE_CHECKING:
    # Only for annotations: the client is used for its configuration and
    # connection pool, so importing its (large) package is the caller's business.
    from kubernetes.client import ApiClient

L = TypeVar("L", bound=_Lister)


class SharedInformerFactory:
    def __init__(
        self,
        api_client: ApiClient,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        default_resync_period: float = 0.0,
        transform: Transform | None = strip_managed_fields,
        transforms: Mapping[Resource, Transform] | None = None,
        compact: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
        min_watch_timeout: float = DEFAULT_MIN_WATCH_TIMEOUT,
        backoff: BackoffPolicy = BackoffPolicy(),
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        on_handler_error: HandlerErrorCallback | None = None,
        use_watch_list: bool = True,
        watch_batch_window: float = 0.0,
    ) -> None:
        """``namespace`` limits namespaced resources to one namespace; the
        selectors apply to every resource. ``transform`` runs on each object
        before it is cached (by default it drops ``managedFields``), or the
        one ``transforms`` gives for its resource (client-go's per-informer
        SetTransform: a controller keeps only what it reads); then,
        with ``compact``, a ``Compactor`` shares equal parts between cached
        objects (a fifth of the memory for pods; see transforms).
        ``use_watch_list`` fills each cache from a WatchList stream, falling
        back to paginated lists where the server refuses it (client-go's
        default since v0.35); False always lists. ``watch_batch_window``
        (seconds, 0 for none): under load, how long a watch event may wait
        to be read with those after it, one wake-up for all (see
        ``api._gathering``); the first event after a quiet spell is read at once."""
        self._api_client = api_client
        self._client = RawClient(api_client)
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._default_resync_period = default_resync_period
        self._transform = transform
        self._transforms = dict(transforms or {})
        self._compact = compact
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._backoff = backoff
        self._clock = clock
        self._rand = rand
        self._on_handler_error = on_handler_error
        self._use_watch_list = use_watch_list
        self._watch_batch_window = watch_batch_window
        self._lock = threading.Lock()
        self._informers: dict[Resource, SharedInformer] = {}

    @property
    def api_client(self) -> ApiClient:
        """The client the informers read through, for a caller's own reads
        of the same server (whether it serves a resource, say)."""
        return self._api_client

    def informer_for(
        self, resource: Resource, *, indexers: Mapping[str, IndexFunc] | None = None
    ) -> SharedInformer:
        """The one informer of ``resource``, made on first use.

        ``indexers`` are added if missing; the same name with another
        function is an error (two users disagree on what the index means).
        """
        with self._lock:
            informer = self._informers.get(resource)
            if informer is None:
                lw = ResourceListerWatcher(
                    self._client,
                    resource,
                    namespace=self._namespace if resource.namespaced else None,
                    label_selector=self._label_selector,
                    field_selector=self._field_selector,
                    watch_batch_window=self._watch_batch_window,
                )
                informer = SharedInformer(
                    lw,
                    name=str(resource),
                    default_resync_period=self._default_resync_period,
                    transform=self._transform_for_one_informer(resource),
                    page_size=self._page_size,
                    min_watch_timeout=self._min_watch_timeout,
                    backoff=self._backoff,
                    clock=self._clock,
                    rand=self._rand,
                    on_handler_error=self._on_handler_error,
                    use_watch_list=self._use_watch_list,
                )
                self._informers[resource] = informer
        if indexers:
            existing = informer.indexer.indexers()
            missing = {}
            for name, fn in indexers.items():
                if name not in existing:
                    missing[name] = fn
                elif existing[name] is not fn:
                    raise IndexConflictError(f"{resource}: indexer {name!r} exists with another function")
            if missing:
                informer.add_indexers(missing)
        return informer

    def _transform_for_one_informer(self, resource: Resource) -> Transform | None:
        transform = self._transforms.get(resource, self._transform)
        if not self._compact:
            return transform
        # One Compactor per informer: each runs on its informer's thread.
        compactor = Compactor()
        if transform is None:
            return compactor
        return chain(transform, compactor)

    def informers(self) -> dict[Resource, SharedInformer]:
        with self._lock:
            return dict(self._informers)

    def start(self) -> None:
        """Start every informer not started yet."""
        for informer in self.informers().values():
            informer.start()

    def wait_for_cache_sync(self, timeout: float) -> dict[Resource, bool]:
        """Wait until every started informer synced or ``timeout`` seconds
        passed; return each one's state."""
        deadline = time.monotonic() + timeout
        result: dict[Resource, bool] = {}
        for resource, informer in self.informers().items():
            if not informer.started:
                continue
            result[resource] = informer.wait_for_sync(max(0.0, deadline - time.monotonic()))
        return result

    def shutdown(self, timeout: float = 10.0) -> None:
        for informer in self.informers().values():
            informer.stop(timeout)

    # -- listers -------------------------------------------------------

    def _lister(self, cls: type[L]) -> L:
        return cls(self.informer_for(cls.resource).indexer)

    def pods(self) -> PodLister:
        return self._lister(PodLister)

    def nodes(self) -> NodeLister:
        return self._lister(NodeLister)

    def gpu_classes(self) -> GPUClassLister:
        return self._lister(GPUClassLister)

    def gpu_claims(self) -> GPUClaimLister:
        return self._lister(GPUClaimLister)

    def gpu_claim_templates(self) -> GPUClaimTemplateLister:
        return self._lister(GPUClaimTemplateLister)

    def gpu_budgets(self) -> GPUBudgetLister:
        return self._lister(GPUBudgetLister)

    def persistent_volume_claims(self) -> PersistentVolumeClaimLister:
        return self._lister(PersistentVolumeClaimLister)

    def persistent_volumes(self) -> PersistentVolumeLister:
        return self._lister(PersistentVolumeLister)

    def pod_groups(self) -> PodGroupLister:
        """PodGroups' lister; makes their informer, which ``start`` then
        starts: ask for it only where the API server serves them."""
        return self._lister(PodGroupLister)
