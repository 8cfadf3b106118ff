"""What `gpuclaimctl run` was asked to do: one frozen, validated value.

The CLI builds it from flags and GPUCLAIMCTL_* variables; the controller and
the process around it read it. Validation lives here so that a bad value is
refused with one line before anything starts.
"""

from __future__ import annotations

import dataclasses
import math

from gpuclaimctl.cmd.bindaddress import on_loopback, parse_bind_address
from gpuclaimctl.logs import LogFormat
from gpuclaimctl.model.api import Strategy


# controller-runtime's default; /tmp is the Deployment's writable emptyDir.
DEFAULT_WEBHOOK_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"


def parse_service_ref(value: str) -> tuple[str, str]:
    """`--webhook-service NAMESPACE/NAME` as (namespace, name); ValueError otherwise."""
    namespace, sep, name = value.partition("/")
    if not (sep and namespace and name and "/" not in name):
        raise ValueError(f"--webhook-service must be NAMESPACE/NAME, got {value!r}")
    return namespace, name


# Past this a watch event could wait long enough to be noticed.
MAX_WATCH_BATCH_WINDOW = 1.0


@dataclasses.dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    # This process starts the local plane and runs against it (`run
    # --local`); localdemo.start then sets `kubeconfig` to the controller's
    # own there.
    local: bool = False
    # With --local: serve the admission webhook to the local API server
    # (localdemo registers it with a `url:` on loopback).
    local_webhook: bool = True
    # With --local: wipe the local cluster's kept state first.
    fresh: bool = False
    workers: int = 16
    resync_period: float = 600.0
    # Under load, how long a watch event may wait to be read together with
    # those after it (informers.api._gathering); cli.py says why 100ms.
    watch_batch_window: float = 0.1
    leader_elect: bool = False
    lease_name: str = "gpuclaimctl"
    lease_namespace: str = "gpuclaimctl-system"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_bind_address: str = ":8080"
    # Namespaces with a `namespace` label of their own in /metrics, first
    # come first served; the rest are `other` (metrics.controller).
    metrics_max_namespaces: int = 100
    # HTTPS, and /metrics only for a token the API server lets `get` it;
    # the Deployment and the chart turn it on (see cli.py for the default).
    metrics_secure: bool = False
    health_bind_address: str = ":8081"
    kube_api_qps: float = 200.0
    kube_api_burst: int = 400
    # The event recorder's own budget, apart from --kube-api-qps/burst.
    event_qps: float = 20.0
    event_burst: int = 50
    strategy: Strategy = Strategy.BINPACK
    reject_for: float = 600.0
    node_lost_grace: float = 300.0
    # Sets of higher priority evict pods of lower priority this controller
    # placed, where that makes them fit (DESIGN.md §4d).
    preemption: bool = True
    shutdown_timeout: float = 20.0
    log_format: LogFormat = LogFormat.TEXT
    verbosity: int = 0
    # The admission webhook (issue 14): served by every replica.
    webhook_bind_address: str = ":9443"
    webhook_cert_dir: str = DEFAULT_WEBHOOK_CERT_DIR
    # Off where cert-manager writes the cert dir and injects the CA.
    webhook_self_signed: bool = True
    webhook_service: str = "gpuclaimctl-system/gpuclaimctl-webhook"
    webhook_configuration: str = "gpuclaimctl"
    # More names or IPs the self-signed certificate is valid for (a `url:`
    # client config, when the controller runs outside the cluster).
    webhook_hosts: tuple[str, ...] = ()

    def validate(self) -> None:
        """Raise ValueError with one line naming the first bad value."""
        # NaN passes every comparison below, and an infinite duration
        # overflows the timers it reaches (Event.wait, TTL caches).
        for flag, number in (("--resync-period", self.resync_period),
                             ("--watch-batch-window", self.watch_batch_window),
                             ("--leader-elect-lease-duration", self.lease_duration),
                             ("--leader-elect-renew-deadline", self.renew_deadline),
                             ("--leader-elect-retry-period", self.retry_period),
                             ("--kube-api-qps", self.kube_api_qps),
                             ("--event-qps", self.event_qps),
                             ("--reject-for", self.reject_for),
                             ("--node-lost-grace", self.node_lost_grace),
                             ("--shutdown-timeout", self.shutdown_timeout)):
            if not math.isfinite(number):
                raise ValueError(f"{flag} must be a finite number, got {number}")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.resync_period < 0:
            raise ValueError("--resync-period must not be negative (0 disables resync)")
        if not 0 <= self.watch_batch_window <= MAX_WATCH_BATCH_WINDOW:
            raise ValueError(f"--watch-batch-window must be between 0 and {MAX_WATCH_BATCH_WINDOW:g}s, "
                             f"got {self.watch_batch_window:g}s")
        for flag, value in (("--reject-for", self.reject_for),
                            ("--node-lost-grace", self.node_lost_grace),
                            ("--shutdown-timeout", self.shutdown_timeout)):
            if value < 0:
                raise ValueError(f"{flag} must not be negative, got {value}")
        if self.kube_api_qps <= 0 or self.kube_api_burst < 1:
            raise ValueError("--kube-api-qps must be > 0 and --kube-api-burst at least 1")
        if self.kube_api_burst < self.kube_api_qps:
            raise ValueError("--kube-api-burst must be at least --kube-api-qps")
        if self.event_qps <= 0 or self.event_burst < 1:
            raise ValueError("--event-qps must be > 0 and --event-burst at least 1")
        if self.event_burst < self.event_qps:
            raise ValueError("--event-burst must be at least --event-qps")
        if self.verbosity < 0:
            raise ValueError("-v must not be negative")
        if self.local and (self.kubeconfig or self.context):
            # The local plane's kubeconfig has one context of its own.
            raise ValueError("--local starts its own control plane; "
                             "do not also give --kubeconfig or --context")
        if self.fresh and not self.local:
            raise ValueError("--fresh wipes the local control plane's state; give it with --local")
        for flag, addr in (("--metrics-bind-address", self.metrics_bind_address),
                           ("--health-bind-address", self.health_bind_address),
                           ("--webhook-bind-address", self.webhook_bind_address)):
            parse_bind_address(addr, flag)
            if self.local and (flag != "--webhook-bind-address" or self.local_webhook):
                on_loopback(addr, flag)
        if not self.webhook_cert_dir.strip():
            raise ValueError("--webhook-cert-dir must not be empty")
        parse_service_ref(self.webhook_service)
        if not self.webhook_configuration.strip():
            raise ValueError("--webhook-configuration must not be empty")
        if self.metrics_max_namespaces < 0:
            raise ValueError("--metrics-max-namespaces must not be negative, "
                             f"got {self.metrics_max_namespaces}")
        if self.leader_elect:
            # client-go's rules: LeaseDuration > RenewDeadline >
            # JitterFactor(1.2) * RetryPeriod.
            if not self.lease_duration > self.renew_deadline:
                raise ValueError("--leader-elect-lease-duration must be greater than "
                                 "--leader-elect-renew-deadline")
            if not self.renew_deadline > 1.2 * self.retry_period:
                raise ValueError("--leader-elect-renew-deadline must be greater than "
                                 "1.2 × --leader-elect-retry-period")
            if self.retry_period <= 0:
                raise ValueError("--leader-elect-retry-period must be positive")
