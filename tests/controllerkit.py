"""Run the real controller in-process against the test session's plane.

As deployed, the controller runs as a service account of its own with
deploy/'s roles, never as the admin the tests hold: the webhook leaves the
controller's own requests alone, and admin rights would hide a permission
deploy/ forgot. conftest makes that identity once per session
(`run_as`); a RunningController given the plane's admin kubeconfig runs
with the identity's instead. One given any other kubeconfig (a test's own
service account) runs with that.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from kubernetes import client, config
from prometheus_client import CollectorRegistry

from gpuclaimctl.cmd import app
from gpuclaimctl.client import kube
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.controlplane.identity import ControllerIdentity
from tests.helpers import wait_for

TEST_OPTIONS = Options(workers=4, resync_period=30.0, metrics_bind_address="0",
                       health_bind_address="0", shutdown_timeout=10.0,
                       kube_api_qps=1000.0, kube_api_burst=2000)


# The session plane's admin kubeconfig -> the controller's identity there.
_IDENTITIES: dict[str, ControllerIdentity] = {}


def run_as(admin_kubeconfig: str, identity: ControllerIdentity) -> None:
    """Controllers given `admin_kubeconfig` run as `identity` instead."""
    _IDENTITIES[admin_kubeconfig] = identity


def controller_kubeconfig(kubeconfig: str) -> str:
    """The kubeconfig a controller given `kubeconfig` runs with."""
    identity = _IDENTITIES.get(kubeconfig)
    return kubeconfig if identity is None else str(identity.kubeconfig)


class RunningController:
    """The controller with its informers, workers and a private registry.

    `options.kubeconfig` is the kubeconfig it runs with (controller_kubeconfig)."""

    def __init__(self, kubeconfig: str, **overrides: Any) -> None:
        kubeconfig = controller_kubeconfig(kubeconfig)
        self.options = dataclasses.replace(TEST_OPTIONS, kubeconfig=kubeconfig, **overrides)
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 32
        self.registry = CollectorRegistry()
        self.factory, self.controller = app.build(self.api_client, self.options, self.registry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RunningController:
        self.factory.start()
        wait_for(self.controller.has_synced, timeout=30, message="the controller's caches to sync")
        self.controller.start_podgroup_discovery(self._stop)  # as app._serve does
        self._thread = threading.Thread(target=self.controller.run,
                                        args=(self.options.workers, self._stop), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.factory.shutdown()

    def metric(self, metric: str, /, **labels: str) -> float:
        value = self.registry.get_sample_value(metric, labels)
        return 0.0 if value is None else float(value)


def objects(api_client: client.ApiClient, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.request_json(api_client, "GET", path)["items"]
    return items
