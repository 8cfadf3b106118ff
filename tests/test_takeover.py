"""Controller.catch_up on the real plane: binds the cache has not seen yet
count as in flight before a new leader's first decision."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from kubernetes import client, config
from prometheus_client import CollectorRegistry

from gpuclaimctl.model import api
from gpuclaimctl.cmd import app
from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import ControlPlane
from tests.controllerkit import TEST_OPTIONS
from tests.helpers import wait_for

pytestmark = pytest.mark.plane

CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"


def bound_claim(api_client: client.ApiClient, ns: str, name: str, node: str, count: int) -> dict[str, Any]:
    created = kube.request_json(api_client, "POST", f"{CLAIMS}/namespaces/{ns}/gpuclaims", body={
        "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
        "spec": {"className": "no-such-class", "count": count}})
    created["status"] = {"phase": "Bound", "nodeName": node}
    result: dict[str, Any] = kube.request_json(
        api_client, "PUT", f"{CLAIMS}/namespaces/{ns}/gpuclaims/{name}/status", body=created)
    return result


def test_bound_claims_the_cache_does_not_show_count_as_in_flight_until_it_does(
    control_plane: ControlPlane, api_client: client.ApiClient, crds: list[str], namespace: str,
) -> None:
    options = dataclasses.replace(TEST_OPTIONS, kubeconfig=str(control_plane.kubeconfig))
    ctl_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    factory, controller = app.build(ctl_client, options, CollectorRegistry())
    try:
        # The informers have not started: the cache lags behind every bind,
        # as a new leader's may behind its predecessor's last ones.
        claim = bound_claim(api_client, namespace, "just-bound", "node-x", 3)
        uid = claim["metadata"]["uid"]
        assert controller.catch_up() >= 1
        entry = controller.view.in_flight(uid)
        # Bound without status.resourceName and its class unknown: which
        # resource it holds is unknown, and it counts under every resource
        # of its node (decide.capacity.with_unknown), not a default one.
        assert entry is not None and (entry.node, entry.resource, entry.count) == ("node-x", api.UNKNOWN_RESOURCE, 3)

        # Once the informer shows the claim Bound there, the entry ends, and
        # a second catch-up finds nothing the cache does not know.
        factory.start()
        wait_for(controller.has_synced, timeout=30, message="the controller's caches to sync")
        wait_for(lambda: controller.view.in_flight(uid) is None, timeout=10,
                 message="the in-flight entry to end once the informer shows the claim Bound")
        controller.catch_up()
        assert controller.view.in_flight(uid) is None
    finally:
        controller.shutdown(1.0)  # its queue's delay thread (class keys were added)
        factory.shutdown()


def test_a_cache_read_after_earlier_writes_landed_skips_the_catch_up_list(
    control_plane: ControlPlane, crds: list[str], namespace: str,
) -> None:
    options = dataclasses.replace(TEST_OPTIONS, kubeconfig=str(control_plane.kubeconfig))
    ctl_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    factory, controller = app.build(ctl_client, options, CollectorRegistry())
    lists: list[int] = []
    list_claims = controller.ctx.writer.list_claims

    def counted() -> Any:
        lists.append(1)
        return list_claims()

    controller.ctx.writer.list_claims = counted  # type: ignore[method-assign]
    try:
        landed = time.monotonic()  # as if the Lease were taken now, before the informers list
        factory.start()
        wait_for(controller.has_synced, timeout=30, message="the controller's caches to sync")
        assert controller.catch_up(landed) == 0
        assert lists == [], "the claims' cache was read consistently after: nothing to list"
        controller.catch_up(time.monotonic())  # read before this moment: listed
        controller.catch_up(None)  # not known: listed
        assert lists == [1, 1]
    finally:
        controller.shutdown(1.0)
        factory.shutdown()

