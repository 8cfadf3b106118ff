"""Gangs declared by PodGroups (scheduling.k8s.io/v1beta1), without a plane:
which gang a pod naming one is in (model.gangs), how its members find each
other (the pods-by-gang index), what the sync does while PodGroups are not
read, and the discovery check that starts reading them.

The real plane's story (the API served, kube-scheduler's gang plugin on) is
tests/test_podgroup_gangs.py.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuclaimctl.model import api
from gpuclaimctl.model.api import GANG_ANNOTATION, GANG_SIZE_ANNOTATION
from gpuclaimctl.model.gangs import Gang, GangError, PodGroupMissing, pod_gang, podgroup_gang_size
from gpuclaimctl.state.indexes import pods_by_gang
from informers import POD_GROUPS, Resource
from tests.test_gang import released as gang_released, sync_all

Obj = dict[str, Any]


def podgroup(name: str, policy: Obj) -> Obj:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns"}, "spec": {"schedulingPolicy": policy}}


GANG3 = podgroup("train", {"gang": {"minCount": 3}})
BASIC = podgroup("loose", {"basic": {}})


def member(group: str | None, **annotations: str) -> Obj:
    spec: Obj = {"containers": [{"name": "c"}]}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}, "spec": spec}


def lookup(*groups: Obj) -> Any:
    found = {(g["metadata"]["namespace"], g["metadata"]["name"]): g for g in groups}
    return lambda ns, name: found.get((ns, name))


# -- which gang ------------------------------------------------------------------------------------


def test_a_pod_naming_a_gang_podgroup_is_in_a_gang_of_its_min_count() -> None:
    gang = pod_gang(member("train"), lookup(GANG3))
    assert gang == Gang("ns", "train", 3, source="podgroup")
    assert gang.key == "ns/podgroup:train" and gang.label == "train (PodGroup)"


def test_a_podgroup_with_the_basic_policy_is_no_gang() -> None:
    assert pod_gang(member("loose"), lookup(BASIC)) is None


def test_the_annotation_wins_over_the_podgroup() -> None:
    pod = member("train", **{GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "2"})
    assert pod_gang(pod, lookup(GANG3)) == Gang("ns", "train", 2)
    assert pods_by_gang(pod) == ["ns/train"]


def test_a_podgroup_gang_never_meets_an_annotation_gang_of_the_same_name() -> None:
    by_annotation = member(None, **{GANG_ANNOTATION: "train", GANG_SIZE_ANNOTATION: "3"})
    by_podgroup = member("train")
    assert pods_by_gang(by_annotation) != pods_by_gang(by_podgroup) == ["ns/podgroup:train"]
    assert pod_gang(by_annotation, lookup(GANG3)).key != pod_gang(by_podgroup, lookup(GANG3)).key  # type: ignore[union-attr]


def test_a_podgroup_not_known_is_said_and_without_a_lookup_podgroups_are_not_looked_at() -> None:
    with pytest.raises(PodGroupMissing) as e:
        pod_gang(member("train"), lookup())
    assert (e.value.namespace, e.value.name) == ("ns", "train")
    assert pod_gang(member("train")) is None  # simulate, why: annotations alone


@pytest.mark.parametrize("count", [0, -1, "3", True, 10_001, None], ids=repr)
def test_a_min_count_out_of_range_is_a_gang_error(count: Any) -> None:
    with pytest.raises(GangError, match="minCount"):
        podgroup_gang_size(podgroup("g", {"gang": {"minCount": count}}))


@pytest.mark.parametrize("pod", [
    {"spec": {"schedulingGroup": None}}, {"spec": {"schedulingGroup": {"podGroupName": 3}}},
    {"spec": "x"}, {}], ids=["null", "number", "spec-not-object", "empty"])
def test_odd_scheduling_groups_are_no_gang_and_index_under_nothing(pod: Obj) -> None:
    assert pod_gang(pod, lookup(GANG3)) is None
    assert pods_by_gang(pod) == []


# -- the sync, on the in-memory API ---------------------------------------------------------------


def podgroup_story(nodes: tuple[int, ...], groups: tuple[Obj, ...] | None, *, size: int = 3,
                   gpus: int = 4, group: str = "train") -> Any:
    """`size` gated pods naming PodGroup `group`; `groups` the PodGroups the
    sync reads (None: they are not read)."""
    from tests.sim.fakeapi import PODS
    from tests.sim.harness import NS
    from tests.test_sync_scenarios import Story

    s = Story(nodes=nodes)
    for i in range(size):
        s.t += 1.0
        s.fake.create(PODS, {"metadata": {
            "name": f"train-{i}", "namespace": NS,
            "annotations": {api.CLAIMS_ANNOTATION: json.dumps([{"name": "g", "className": "alpha", "count": gpus}])},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid",
                                 "controller": True}]},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": [{"name": "c"}],
                     "schedulingGroup": {"podGroupName": group}}})
    found = {} if groups is None else {(NS, g["metadata"]["name"]): g for g in groups}
    s.ctl.ctx = dataclasses.replace(s.ctl.ctx, podgroups=lambda ns, n: found.get((ns, n)),
                                    podgroups_synced=lambda: groups is not None)
    s.see_all()
    return s


def released(s: Any, size: int = 3) -> list[bool]:
    return gang_released(s, size)


def told(s: Any) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in s.fake.events if e.type == "Warning"]


def test_a_podgroup_gang_whose_sets_all_fit_is_released_whole() -> None:
    s = podgroup_story((4, 4, 4), (podgroup("train", {"gang": {"minCount": 3}}),))
    sync_all(s)
    assert released(s) == [True] * 3
    s.drain()
    s.check_quiet()


def test_a_podgroup_gang_that_does_not_fit_releases_nobody() -> None:
    s = podgroup_story((4, 4), (podgroup("train", {"gang": {"minCount": 3}}),))
    sync_all(s)
    assert released(s) == [False] * 3
    assert any(r == "GangCapacity" and "gang train (PodGroup): 2 of 3 sets fit at once" in m
               for r, m in told(s)), told(s)


def test_a_podgroup_gang_short_of_its_min_count_waits_incomplete() -> None:
    s = podgroup_story((4, 4, 4, 4), (podgroup("train", {"gang": {"minCount": 4}}),))
    sync_all(s)
    assert released(s) == [False] * 3
    assert any(r == "GangIncomplete" and "3 of 4 members exist" in m for r, m in told(s)), told(s)


def test_pods_of_a_basic_podgroup_are_placed_one_by_one() -> None:
    s = podgroup_story((4, 4), (podgroup("train", {"basic": {}}),))
    sync_all(s)
    assert sorted(released(s)) == [False, True, True]


def test_while_podgroups_are_not_read_their_pods_wait_incomplete_and_look_again() -> None:
    from tests.sim.harness import NS

    s = podgroup_story((4, 4, 4), None)
    sync_all(s)
    assert released(s) == [False] * 3
    assert told(s) and all(r == "GangIncomplete" and "PodGroups (scheduling.k8s.io/v1beta1) are not read yet"
                           in m for r, m in told(s)), told(s)
    assert {k for k in s.ctl.queue.delayed if k.startswith("pod:")} == {
        f"pod:{NS}/train-{i}" for i in range(3)}, "they look again later"


def test_a_pod_naming_a_podgroup_that_does_not_exist_waits_incomplete() -> None:
    s = podgroup_story((4, 4, 4), (podgroup("other", {"gang": {"minCount": 3}}),))
    sync_all(s)
    assert released(s) == [False] * 3
    assert told(s) and all(r == "GangIncomplete" and "PodGroup train, which the pod names, is not found" in m
                           for r, m in told(s)), told(s)


# -- the discovery check ---------------------------------------------------------------------------


class _Discovery(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server: the client reuses its connection
    answers: dict[str, tuple[int, Obj]] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        code, body = self.answers.get(self.path, (404, {"kind": "Status", "code": 404,
                                                        "reason": "NotFound", "message": "404 page not found"}))
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def discovery_server() -> Iterator[tuple[str, dict[str, tuple[int, Obj]]]]:
    answers: dict[str, tuple[int, Obj]] = {}
    handler = type("Handler", (_Discovery,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


def test_the_discovery_check_says_served_only_when_the_group_version_lists_podgroups(
        discovery_server: tuple[str, dict[str, tuple[int, Obj]]]) -> None:
    from kubernetes import client

    from gpuclaimctl.client.discovery import serves

    url, answers = discovery_server
    api_client = client.ApiClient(client.Configuration(host=url))
    assert serves(api_client, POD_GROUPS) is False  # 404: the group version is not served
    answers["/apis/scheduling.k8s.io/v1beta1"] = (200, {
        "kind": "APIResourceList", "groupVersion": "scheduling.k8s.io/v1beta1",
        "resources": [{"name": "workloads", "namespaced": True, "kind": "Workload"}]})
    assert serves(api_client, POD_GROUPS) is False  # served, but without PodGroups
    answers["/apis/scheduling.k8s.io/v1beta1"][1]["resources"].append(
        {"name": "podgroups", "namespaced": True, "kind": "PodGroup"})
    assert serves(api_client, POD_GROUPS) is True
    assert serves(api_client, Resource("", "v1", "pods", namespaced=True)) is False  # /api/v1: 404 here


def test_the_controller_asks_until_podgroups_are_served_and_never_raises() -> None:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))  # never asked
    factory, controller = app.build(api_client, Options(), CollectorRegistry())
    controller.queue.shut_down()
    answers: list[Any] = [OSError("connection refused"), False, True]
    asked: list[int] = []
    watched: list[bool] = []

    def served() -> bool:
        asked.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    controller.watch_podgroups = lambda: watched.append(True)  # type: ignore[method-assign]
    stop = threading.Event()
    assert controller.discover_podgroups(stop, served, period=0.01) is True
    assert len(asked) == 3 and watched == [True]
    assert POD_GROUPS not in factory.informers()  # the real watch_podgroups makes it; none before
    assert not controller.podgroups_synced()


def test_a_controller_on_a_cluster_without_podgroups_makes_no_informer_for_them() -> None:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    factory, controller = app.build(api_client, Options(), CollectorRegistry())
    controller.queue.shut_down()
    stop = threading.Event()
    calls: list[int] = []

    def served() -> bool:
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        return False

    assert controller.discover_podgroups(stop, served, period=0.01) is False
    assert len(calls) == 3 and POD_GROUPS not in factory.informers()
    assert controller.ctx.podgroups("ns", "train") is None and not controller.ctx.podgroups_synced()
