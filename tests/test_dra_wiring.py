"""GPUs served by DRA as the rest of the controller sees them (docs/dra.md):
discovery of resource.k8s.io/v1 and its informers started only where it
is served; the handlers' wake-ups; why, status and the class figures
telling DRA nodes like device-plugin nodes, and saying which way a node
serves a resource."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from gpuclaimctl.controller import DRA_OPTIONAL, DRA_RESOURCES
from gpuclaimctl.cmd import statusview
from gpuclaimctl.decide.explain import Verdict, explain
from gpuclaimctl.model.snapshot import ClaimState, ClassInfo, PodInfo
from gpuclaimctl.sync.classes import class_figures
from informers import DEVICE_TAINT_RULES, GPU_CLASSES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.test_dra_state import (
    DRIVER,
    GPU,
    NOW,
    device_class,
    gpu,
    gpu_class,
    node_obj,
    pod,
    rclaim,
    rslice,
    view_with,
)

Obj = dict[str, Any]


def offline_controller() -> Any:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))  # never asked
    factory, controller = app.build(api_client, Options(), CollectorRegistry())
    controller.queue.shut_down()
    return factory, controller


# -- discovery --------------------------------------------------------------------------------


def test_dra_is_read_once_served_with_taint_rules_where_they_are_and_the_check_never_raises() -> None:
    factory, controller = offline_controller()
    answers: list[Any] = [OSError("connection refused"), frozenset(),
                          frozenset({RESOURCE_SLICES, RESOURCE_CLAIMS}),  # not all three: not yet
                          frozenset(DRA_RESOURCES + DRA_OPTIONAL)]
    watched: list[Any] = []

    def served() -> frozenset[Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return frozenset(answer)

    controller.watch_dra = lambda resources, stop=None: watched.append(list(resources))
    assert controller.discover_dra(threading.Event(), served, period=0.01) is True
    assert answers == [] and watched == [list(DRA_RESOURCES) + [DEVICE_TAINT_RULES]]
    assert not set(DRA_RESOURCES) & set(factory.informers())  # the real watch_dra makes them; none before
    assert not controller.dra_synced()


def test_without_resource_k8s_io_nothing_starts_and_one_info_line_says_so(caplog: pytest.LogCaptureFixture) -> None:
    factory, controller = offline_controller()
    stop = threading.Event()
    calls: list[int] = []

    def served() -> frozenset[Any]:
        calls.append(1)
        if len(calls) == 4:
            stop.set()
        return frozenset()

    with caplog.at_level(logging.DEBUG, logger="gpuclaimctl"):
        assert controller.discover_dra(stop, served, period=0.01) is False
    assert len(calls) == 4
    assert not set(DRA_RESOURCES + DRA_OPTIONAL) & set(factory.informers())
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "resource.k8s.io" in r.getMessage()]
    assert len(said) == 1 and said[0][0] == logging.INFO and "does not serve resource.k8s.io/v1" in said[0][1]


def test_watching_dra_counts_it_once_every_informer_has_listed() -> None:
    factory, controller = offline_controller()
    stop = threading.Event()
    try:
        controller.watch_dra(DRA_RESOURCES, stop)
        assert set(DRA_RESOURCES) <= set(factory.informers())
        assert DEVICE_TAINT_RULES not in factory.informers()
        assert not controller.dra_synced()  # nothing listed: the server is not there
    finally:
        stop.set()
        factory.shutdown(timeout=1.0)


# -- handlers: what a DRA event wakes -------------------------------------------------------------


class Queue:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def add(self, key: str) -> None:
        self.keys.append(key)

    def add_all(self, keys: list[str]) -> None:
        self.keys += keys

    def add_after(self, key: str, _delay: float) -> None:
        self.keys.append(key)


def test_a_deallocated_claim_wakes_the_pods_that_fit_on_its_node_and_a_new_slice_its_classes_status() -> None:
    from gpuclaimctl.sync.handlers import Handlers

    factory, controller = offline_controller()
    view = controller.view
    for obj in (gpu_class("a"),):
        view.apply_class(obj)
    view.apply_node(node_obj("dra-0"), ready=True, not_ready_since=None, health_changed=False, recreated=False)
    view.dra_synced()
    gated = pod("w", 2, None)
    gated["spec"]["schedulingGates"] = [{"name": "gpuclaimctl.io/claims"}]
    gated["metadata"]["annotations"] = {"gpuclaimctl.io/claims": '[{"name": "g", "className": "a", "count": 2}]'}
    factory.informer_for(PODS).indexer.add(gated)
    factory.informer_for(GPU_CLASSES).indexer.add(gpu_class("a"))
    queue = Queue()
    h = Handlers(controller.ctx, queue)  # type: ignore[arg-type]
    h.device_class_added(device_class())
    h.slice_added(rslice("s0", "dra-0", [gpu("g0"), gpu("g1")]))
    assert "pod:ns/pod-w" in queue.keys and "class:a" in queue.keys
    taken = rclaim("r1", [("dra-0", "g0")])
    queue.keys.clear()
    h.resource_claim_added(taken)
    assert queue.keys == []  # nothing freed, nothing about the node changed
    freed = rclaim("r1", None)
    freed["metadata"]["resourceVersion"] = "2"
    h.resource_claim_updated(taken, freed)
    assert queue.keys == ["pod:ns/pod-w"]


# -- why, status, class figures --------------------------------------------------------------------


def test_why_says_which_way_each_node_serves_the_resource_and_what_dra_offers() -> None:
    view = view_with(node_obj("dp-0", 2), node_obj("dra-0"), node_obj("dra-1"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1"), gpu("g2")]))
    view.apply_resource_slice(rslice("s1", "dra-1", [gpu("g0", "H100", taints=[{"key": "x", "effect": "NoSchedule"}])]))
    p = PodInfo.from_api(pod("why", 3, None))
    with view.deciding() as d:
        got = explain(p, [ClaimState("c", "c-uid", "a", 3)], d.cluster, d.used(), NOW)
    rows = {r.node: r for r in got.nodes}
    assert rows["dra-0"].chosen and rows["dra-0"].served == {GPU: f"DRA, DeviceClass {DRIVER}"}
    assert rows["dp-0"].served == {GPU: "device plugin"} and rows["dp-0"].verdict is Verdict.TOO_SMALL
    assert "served by DRA" not in rows["dp-0"].summary
    assert f"DeviceClass {DRIVER}" in got.decision.message
    assert "dra-1" not in rows  # it offers none of the set's classes: its one device is tainted


def test_why_says_dra_offers_no_device_on_a_node_that_offers_the_sets_other_class() -> None:
    amd = node_obj("dra-1")
    amd["status"]["allocatable"]["amd.com/gpu"] = "1"
    view = view_with(amd, classes=(gpu_class("a"), gpu_class("b", "amd.com/gpu")))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s1", "dra-1", [gpu("g0", taints=[{"key": "x", "effect": "NoSchedule"}])]))
    p = PodInfo.from_api(pod("why", 1, None))
    with view.deciding() as d:
        got = explain(p, [ClaimState("c", "c-uid", "a", 1), ClaimState("d", "d-uid", "b", 1)], d.cluster, d.used(),
                      NOW)
    (row,) = got.nodes
    assert row.verdict is Verdict.CLASS_SELECTOR
    assert row.summary == f"does not offer GPUClass a: DRA (DeviceClass {DRIVER}) offers no device of {GPU} there"
    assert row.served == {GPU: f"DRA, DeviceClass {DRIVER}", "amd.com/gpu": "device plugin"}


def test_status_counts_a_dra_node_and_lists_what_it_did_not_count() -> None:
    nodes = [node_obj("dp-0", 4), node_obj("dra-0")]
    for n in nodes:
        n["spec"] = {}
    classes = [gpu_class("a")]
    dra = statusview.DraObjects(
        slices=[rslice("s0", "dra-0", [gpu("g0"), gpu("g1"), gpu("g2", taints=[{"key": "x", "effect": "NoExecute"}])])],
        device_classes=[device_class()],
        claims=[rclaim("r1", [("dra-0", "g0")])])
    rows = {r.node: r for r in statusview.gpu_rows(nodes, classes, [], [], dra)}
    assert (rows["dra-0"].allocatable, rows["dra-0"].bound, rows["dra-0"].other, rows["dra-0"].free) == (2, 0, 1, 1)
    assert rows["dp-0"].allocatable == 4
    text = statusview.render(nodes, classes, [], [], datetime(2026, 5, 1, tzinfo=timezone.utc), dra=dra)
    section = text.split(statusview.DRA_TITLE)[1].split("\n\n")[0]
    assert "dra-0" in section and DRIVER in section and "tainted" in section and "dp-0" not in section
    # Without resource.k8s.io/v1 the node offers nothing and no such section is shown.
    plain = statusview.render(nodes, classes, [], [], datetime(2026, 5, 1, tzinfo=timezone.utc))
    assert statusview.DRA_TITLE not in plain and "dra-0" not in plain


def test_the_class_figures_and_metrics_count_a_dra_nodes_devices() -> None:
    view = view_with(node_obj("dp-0", 4), node_obj("dra-0"))
    view.apply_device_class(device_class())
    view.apply_resource_slice(rslice("s0", "dra-0", [gpu("g0"), gpu("g1")]))
    figures = class_figures(ClassInfo("a", GPU), view.cluster().nodes.values(), 0)
    assert figures == {"nodes": 2, "allocatable": 6, "bound": 0}
