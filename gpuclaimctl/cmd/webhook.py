"""The admission webhook of one `gpuclaimctl run` process (issue 14).

Every replica serves it, the standby too: it needs no Lease, only the
informer caches every replica keeps warm (namespaces, classes, budgets,
templates, claims). What it decides is gpuclaimctl.webhook's; this wires
the caches to it (`CacheView`), serves it (`WebhookServer`) and, unless
--no-webhook-self-signed, keeps its certificate (`CertKeeper`).

/readyz includes `webhook`: ready once a serving certificate is loaded,
the configurations trust its CA (self-signed mode) and the caches synced.
Until then a review is answered 503, which the API server settles by the
webhook's failurePolicy.

Who the controller is (its own requests are never refused, even where the
configurations' matchConditions did not already skip them) is asked of the
API server once (a SelfSubjectReview of this process's credentials). A
controller that is not a service account is warned about, once: it would
let its user's own pods past the gate (`identity_warning`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from gpuclaimctl.client import kube
from gpuclaimctl.client.certs import CertPolicy
from gpuclaimctl.client.errors import NotFound
from gpuclaimctl.client.webhookcerts import CertKeeper, service_hosts
from gpuclaimctl.cmd.options import Options, parse_service_ref
from gpuclaimctl.cmd.webhookserver import WebhookServer
from gpuclaimctl.cmd.bindaddress import parse_bind_address
from gpuclaimctl.logs import get_logger
from gpuclaimctl.model import api, keys
from gpuclaimctl.webhook import configurations
from gpuclaimctl.webhook.pods import mutate, validate
from informers import (
    GPU_BUDGETS,
    GPU_CLAIM_TEMPLATES,
    GPU_CLAIMS,
    GPU_CLASSES,
    SharedInformerFactory,
)
from informers.listers import ClusterLister
from informers.resource import Resource
from metrics.admission import AdmissionMetrics

_log = get_logger(__name__)

NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
WHOAMI_RETRY = 5.0
# After SIGTERM the webhook keeps answering this long (while /readyz says it
# is going): the Service's endpoints reach every API server and kube-proxy a
# moment after the pod is marked terminating, and a call still routed here
# meanwhile would be refused (failurePolicy Fail) if nothing listened.
# `run --local` registers a `url:` on loopback and no Service: nothing to
# wait for there.
DRAIN_SECONDS = 5.0
# A live read of a namespace the cache does not show labelled yet.
NAMESPACE_READ_TIMEOUT = 2.0


class CacheView:
    """gpuclaimctl.webhook.pods.AdmissionView over the informers' listers."""

    def __init__(self, factory: SharedInformerFactory,
                 read_namespace: Callable[[str], Mapping[str, Any] | None] | None = None) -> None:
        """`read_namespace`: a live read of one namespace (None if it does
        not exist), for `fresh_namespace_labels`."""
        self._namespaces = ClusterLister(factory.informer_for(NAMESPACES).indexer)
        self._read_namespace = read_namespace
        self._classes = factory.gpu_classes()
        self._budgets = factory.gpu_budgets()
        self._templates = factory.gpu_claim_templates()
        self._claims = factory.gpu_claims()
        self._informers = [factory.informer_for(r) for r in
                           (NAMESPACES, GPU_CLASSES, GPU_BUDGETS, GPU_CLAIM_TEMPLATES, GPU_CLAIMS)]
        self._users: frozenset[str] = frozenset()

    @property
    def controller_users(self) -> Set[str]:
        return self._users

    def set_controller_user(self, username: str) -> None:
        self._users = frozenset({username})

    def synced(self) -> bool:
        return all(i.has_synced() for i in self._informers)

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return _labels(self._namespaces.get(namespace))

    def fresh_namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        if self._read_namespace is None:
            raise RuntimeError("no live read of namespaces")
        if not keys.is_dns_label(namespace):
            return None  # not a namespace the API server could have sent
        return _labels(self._read_namespace(namespace))

    def has_budget(self, namespace: str) -> bool:
        return bool(self._budgets.list(namespace))

    def class_resources(self) -> Mapping[str, str]:
        out: dict[str, str] = {}
        for cls in self._classes.list():
            name = (cls.get("metadata") or {}).get("name")
            resource = (cls.get("spec") or {}).get("resourceName")
            if isinstance(name, str):
                out[name] = resource if isinstance(resource, str) and resource else \
                    api.DEFAULT_RESOURCE_NAME
        return out

    def template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._templates.get(namespace, name)

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._claims.get(namespace, name)


def _labels(ns: Mapping[str, Any] | None) -> Mapping[str, str] | None:
    """A namespace's labels; None for no namespace."""
    if ns is None:
        return None
    labels = (ns.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def identity_warning(username: str, groups: Sequence[str]) -> str | None:
    """What to say when the controller runs as `username`, if anything.

    The webhook never gates, mutates or refuses the controller's own
    requests, so a controller running with a person's credentials (the
    admin kubeconfig of whoever started it) lets that person's pods past
    the gate and every check. In a cluster it is its service account, and
    deploy/webhook.yaml's matchConditions name that account alone."""
    if configurations.is_service_account(username):
        return None
    admin = " (a cluster admin: system:masters)" if "system:masters" in groups else ""
    return (f"the controller runs as {username!r}{admin}, not as a service account: its webhook "
            "never gates, mutates or refuses that user's own requests, so pods they create skip "
            "the gate and its checks; run it with its service account's credentials "
            "(deploy/serviceaccount.yaml and its roles)")


def secret_name(service: str) -> str:
    """The Secret holding the webhook's CA and certificate: `<service>-cert`."""
    return f"{service}-cert"


class Webhook:
    """Server, certificate keeper and caches of the webhook; `start`, `check`, `stop`."""

    def __init__(self, api_client: client.ApiClient, options: Options, factory: SharedInformerFactory,
                 *, registry: CollectorRegistry | None = None, policy: CertPolicy = CertPolicy(),
                 cert_interval: float = 60.0, drain_seconds: float | None = None) -> None:
        """`drain_seconds`: how long `stop` keeps answering after `begin_drain`
        (DRAIN_SECONDS unless given)."""
        # Every replica's webhook sends these, the standby's too: a User-Agent
        # of their own keeps them apart from the leader's writes.
        self._api = kube.client_for(api_client, "webhook")
        self.view = CacheView(factory, self._read_namespace)
        cert_dir = Path(options.webhook_cert_dir)
        self.server = WebhookServer(
            options.webhook_bind_address, cert_dir,
            {configurations.MUTATE_PATH: lambda r: mutate(r, self.view),
             configurations.VALIDATE_PATH: lambda r: validate(r, self.view)},
            not_ready=self._not_ready,
            metrics=AdmissionMetrics(registry) if registry is not None else None)
        self.keeper: CertKeeper | None = None
        if options.webhook_self_signed:
            namespace, service = parse_service_ref(options.webhook_service)
            self.keeper = CertKeeper(
                self._api, namespace=namespace, secret=secret_name(service),
                hosts=[*service_hosts(namespace, service), *options.webhook_hosts],
                configuration=options.webhook_configuration, cert_dir=cert_dir,
                on_files=self.server.reload, policy=policy, interval=cert_interval)
        self._stop = threading.Event()
        self._whoami: threading.Thread | None = None
        self._draining_since: float | None = None
        self._drain_seconds = drain_seconds

    def _read_namespace(self, name: str) -> Mapping[str, Any] | None:
        """One namespace from the API server, well inside the API server's
        wait for the webhook (configurations.TIMEOUT_SECONDS)."""
        try:
            ns: Mapping[str, Any] = kube.request_json(self._api, "GET", f"/api/v1/namespaces/{name}",
                                                      timeout=NAMESPACE_READ_TIMEOUT)
        except NotFound:
            return None
        return ns

    @property
    def port(self) -> int:
        return self.server.port

    def _not_ready(self) -> str:
        return "" if self.view.synced() else "caches not synced"

    def check(self) -> None:
        """The /readyz check: raises until the webhook can answer, and once it is going."""
        if self._draining_since is not None:
            raise RuntimeError("shutting down")
        self.server.check()
        if self.keeper is not None:
            self.keeper.check()
        if not self.view.synced():
            raise RuntimeError("webhook caches not synced yet")

    def start(self) -> None:
        """Bind (raises OSError if the address is taken), then keep the
        certificate and learn who the controller is in the background."""
        self.server.start()
        if self.keeper is not None:
            self.keeper.start()
        self._whoami = threading.Thread(target=self._learn_identity, name="webhook-whoami",
                                        daemon=True)
        self._whoami.start()

    def _learn_identity(self) -> None:
        while not self._stop.is_set():
            try:
                review = kube.request_json(self._api, "POST", SELF_SUBJECT_REVIEWS, body={
                    "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, timeout=10)
                info = (review.get("status") or {}).get("userInfo") or {}
                username = str(info.get("username") or "")
                if username:
                    self.view.set_controller_user(username)
                    _log.info("the webhook never refuses the controller's own requests",
                              extra={"user": username})
                    warning = identity_warning(username, [str(g) for g in info.get("groups") or ()])
                    if warning is not None:
                        _log.warning(warning, extra={"user": username})
                    return
            except Exception as e:  # the configurations' matchConditions still skip it
                _log.v(2).info("SelfSubjectReview failed, will retry", extra={"error": str(e)})
            self._stop.wait(WHOAMI_RETRY)

    def begin_drain(self) -> None:
        """Shutdown is coming: not ready from now on, still answering."""
        if self._draining_since is None:
            self._draining_since = time.monotonic()

    def stop(self) -> None:
        """Stop serving, once `drain_seconds` passed since `begin_drain` (if called)."""
        if self._draining_since is not None:
            drain = DRAIN_SECONDS if self._drain_seconds is None else self._drain_seconds
            left = self._draining_since + drain - time.monotonic()
            if left > 0:
                time.sleep(left)
        self._stop.set()
        if self.keeper is not None:
            self.keeper.stop()
        self.server.stop()
        if self._whoami is not None:
            self._whoami.join(5)


def build_webhook(api_client: client.ApiClient, options: Options, factory: SharedInformerFactory,
                  registry: CollectorRegistry | None = None) -> Webhook | None:
    """The webhook (its informers asked for, nothing started), or None with
    --webhook-bind-address 0."""
    if parse_bind_address(options.webhook_bind_address, "--webhook-bind-address") is None:
        return None
    return Webhook(api_client, options, factory, registry=registry,
                   drain_seconds=0.0 if options.local else None)
