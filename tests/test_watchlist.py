"""WatchList: the informer's initial state from one watch stream, and the fallback to a list.

The first part drives a reflector over the in-memory lister-watcher (every
branch of client-go's ``watchList``, on a fake clock); the tests marked
``plane`` run informers against the real API server: the cache a WatchList
gives equals the one a list gives, a server that refuses it is listed, and
a 410 Gone relists.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator

import pytest

from informers.clock import FakeClock
from informers.errors import TransportError
from informers.listwatch import ADDED, BOOKMARK, INITIAL_EVENTS_END
from informers.objects import DeletedFinalStateUnknown, KubeObject
from informers.reflector import Reflector
from informers.shared_informer import SharedInformer
from informers.testing import FakeListerWatcher, WatchCall, gone, make_object, status
from informers.transforms import strip_managed_fields
from tests.helpers import wait_for
from tests.test_reflector import (
    Recorder,
    cache_state,
    config_map_lw,
    create_config_maps,
    fresh_state,
    seed,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lw() -> FakeListerWatcher:
    return FakeListerWatcher(watch_list=True)


@pytest.fixture
def run_reflector(clock: FakeClock) -> Iterator[Any]:
    started: list[tuple[Reflector, threading.Thread]] = []

    def start(lw: Any, store: Recorder, **kwargs: Any) -> Reflector:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("rand", lambda: 0.0)
        r = Reflector(lw, store, name="test", **kwargs)
        t = threading.Thread(target=r.run, daemon=True)
        t.start()
        started.append((r, t))
        return r

    yield start
    for r, t in started:
        r.stop()
        t.join(5)
        assert not t.is_alive(), "the reflector did not stop"


def kinds(store: Recorder) -> list[tuple[str, str]]:
    return [(t, k) for t, k, _ in store.events]


# -- the reflector over the in-memory API ------------------------------------


def test_the_initial_state_comes_from_one_watch_that_goes_on_as_the_watch(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    seed(lw, 3)
    store = Recorder()
    r = run_reflector(lw, store)
    wait_for(lambda: r.stats.watches == 1, message="the stream to turn into the watch")
    assert lw.list_calls == []
    assert lw.watch_calls == [WatchCall("", 300, send_initial_events=True)], "the newest state, consistently"
    assert kinds(store) == [("Replaced", f"default/o000{i}") for i in range(3)], "replaced, as after a list"
    assert r.last_sync_resource_version == str(lw.resource_version), "the end bookmark's version"
    lw.add(make_object("late"))
    wait_for(lambda: kinds(store)[-1:] == [("Added", "default/late")])
    assert len(lw.watch_calls) == 1, "the same stream carries the changes"
    assert r.stats.watch_lists == 1 and r.stats.lists == 0


def test_a_refusing_server_is_listed_and_the_next_relist_tries_watch_list_again(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 3)
    lw.fail_next_watch(status(422, "Invalid", "sendInitialEvents is forbidden for watch"))
    store = Recorder()
    r = run_reflector(lw, store)
    wait_for(lambda: r.stats.watches == 1)
    assert [c.resource_version for c in lw.list_calls] == ["0"]
    assert r.stats.watch_list_fallbacks == 1 and r.stats.lists == 1
    assert store.names() == [f"default/o000{i}" for i in range(3)]
    lw.change_silently(delete=["default/o0001"])  # the watch ends with 410
    clock.wait_for_sleepers()
    clock.step(1)
    wait_for(lambda: r.stats.watch_lists == 1, message="the relist by WatchList")
    assert lw.watch_calls[-1].send_initial_events
    wait_for(lambda: store.names() == ["default/o0000", "default/o0002"])
    assert isinstance(store.events[-1][2], DeletedFinalStateUnknown)


def test_a_relist_asks_not_older_than_the_last_version_then_the_newest_when_that_is_gone(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 2)
    r = run_reflector(lw, Recorder())
    wait_for(lambda: r.stats.watches == 1)
    lw.add(make_object("late"))
    last = str(lw.resource_version)
    wait_for(lambda: r.last_sync_resource_version == last)
    lw.fail_next_watch(gone())
    lw.expire_watches()
    clock.wait_for_sleepers()
    clock.step(1)
    wait_for(lambda: r.stats.watch_lists == 2, message=lambda: f"{lw.watch_calls}")
    assert [(c.resource_version, c.send_initial_events) for c in lw.watch_calls[1:]] == [
        (last, True),
        ("", True),
    ], "no backoff between the two, and no list"
    assert lw.list_calls == []


def test_consistent_since_is_when_the_newest_state_was_asked_for_and_only_moves_on(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    # Controller.catch_up trusts it: the store shows every write committed
    # before this moment (a consistent read sent then), and later states only newer.
    seed(lw, 2)
    before = time.monotonic()
    r = run_reflector(lw, Recorder())
    wait_for(lambda: r.stats.watches == 1)
    first = r.consistent_since
    assert first is not None and before <= first <= time.monotonic()
    lw.add(make_object("late"))
    wait_for(lambda: r.last_sync_resource_version == str(lw.resource_version))
    lw.expire_watches()  # a relist not older than the version seen
    clock.wait_for_sleepers()
    clock.step(1)
    wait_for(lambda: r.stats.watch_lists == 2)
    assert lw.watch_calls[-1].resource_version != ""
    assert r.consistent_since == first, "a state no older than one seen says nothing newer"
    lw.fail_next_watch(gone())
    lw.expire_watches()
    clock.wait_for_sleepers()
    clock.step(2)  # the backoff doubled
    wait_for(lambda: r.stats.watch_lists == 3)
    assert lw.watch_calls[-1].resource_version == ""
    later = r.consistent_since
    assert later is not None and later > first, "the newest state, asked for again"


def test_consistent_since_is_none_after_a_list_from_the_watch_cache(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    seed(lw, 2)
    lw.fail_next_watch(status(422, "Invalid", "sendInitialEvents is forbidden for watch"))
    r = run_reflector(lw, Recorder())
    wait_for(lambda: r.stats.watches == 1)
    assert [c.resource_version for c in lw.list_calls] == ["0"]
    assert r.consistent_since is None, "resourceVersion 0: any state a server has, maybe a lagging one"


def test_consistent_since_after_a_quorum_list(run_reflector: Any) -> None:
    lw = FakeListerWatcher()
    seed(lw, 2)
    before = time.monotonic()
    r = run_reflector(lw, Recorder(), initial_resource_version="", use_watch_list=False)
    wait_for(lambda: r.stats.watches == 1)
    since = r.consistent_since
    assert since is not None and since >= before


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(status(429, "TooManyRequests"), id="429"),
        pytest.param(TransportError("connection refused"), id="transport"),
    ],
)
def test_429_and_transport_errors_back_off_and_ask_for_watch_list_again(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock, error: Exception
) -> None:
    seed(lw, 2)
    lw.fail_next_watch(error)
    r = run_reflector(lw, Recorder())
    clock.wait_for_sleepers()
    assert r.in_backoff
    clock.step(1)
    wait_for(lambda: r.stats.watch_lists == 1)
    assert lw.list_calls == []
    assert [c.send_initial_events for c in lw.watch_calls] == [True, True]


class Scripted:
    """A lister-watcher whose WatchList streams are given event lists; lists come from ``inner``."""

    supports_watch_list = True

    def __init__(self, inner: FakeListerWatcher, *streams: list[tuple[str, KubeObject]]) -> None:
        self.inner = inner
        self.streams = list(streams)
        self.watch_calls: list[bool] = []

    def list_page(self, **kw: Any) -> Any:
        return self.inner.list_page(**kw)

    def watch(self, *, send_initial_events: bool = False, **kw: Any) -> Any:
        self.watch_calls.append(send_initial_events)
        if send_initial_events and self.streams:
            return Stream(self.streams.pop(0))
        return self.inner.watch(**kw)

    def abort(self) -> None:
        self.inner.abort()


class Stream:
    def __init__(self, events: list[tuple[str, KubeObject]]) -> None:
        self.events = events

    def __iter__(self) -> Iterator[tuple[str, KubeObject]]:
        yield from self.events

    def close(self) -> None:
        pass


def end_bookmark(rv: int) -> tuple[str, KubeObject]:
    return BOOKMARK, {"metadata": {"resourceVersion": str(rv), "annotations": {INITIAL_EVENTS_END: "true"}}}


def added(name: str, rv: int) -> tuple[str, KubeObject]:
    return ADDED, {"metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)}}


def test_a_stream_that_ends_before_its_initial_events_did_is_asked_again(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    seed(lw, 1)
    cut = [added("a", 5), added("b", 3)]
    whole = [added("a", 5), added("b", 3), added("c", 4), end_bookmark(int(lw.resource_version))]
    scripted = Scripted(lw, cut, whole)
    store = Recorder()
    r = run_reflector(scripted, store)
    wait_for(lambda: r.stats.watches >= 1)
    assert scripted.watch_calls[:2] == [True, True]
    assert store.names() == ["default/a", "default/b", "default/c"], "only the whole stream reached the store"
    assert r.stats.lists == 0


def test_streams_that_end_before_their_initial_events_twice_in_a_row_are_listed_instead(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    """Not asked again and again (each time the whole state): as client-go
    does after a failed WatchList, the store is filled by a list."""
    seed(lw, 2)
    cut = [added("o0000", 5)]
    scripted = Scripted(lw, list(cut), list(cut), list(cut))
    store = Recorder()
    r = run_reflector(scripted, store)
    wait_for(lambda: r.stats.watches >= 1)
    assert scripted.watch_calls[:2] == [True, True] and len(scripted.streams) == 1
    assert r.stats.watch_list_fallbacks == 1 and r.stats.lists == 1
    assert store.names() == ["default/o0000", "default/o0001"]


def test_a_stream_that_ends_at_once_with_nothing_is_listed_instead(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    seed(lw, 2)
    scripted = Scripted(lw, [])
    store = Recorder()
    r = run_reflector(scripted, store)
    wait_for(lambda: r.stats.watches == 1)
    assert r.stats.watch_list_fallbacks == 1 and r.stats.lists == 1
    assert store.names() == ["default/o0000", "default/o0001"]


def test_transform_runs_on_the_initial_events(lw: FakeListerWatcher, run_reflector: Any) -> None:
    seed(lw, 2)
    store = Recorder()

    def mark(obj: KubeObject) -> KubeObject:
        obj["seen"] = True
        return obj

    r = run_reflector(lw, store, transform=mark)
    wait_for(lambda: r.stats.watches == 1)
    assert all(o.get("seen") for o in store.indexer.list())


def test_use_watch_list_false_and_a_lister_watcher_that_cannot_both_list(run_reflector: Any) -> None:
    able, unable = FakeListerWatcher(watch_list=True), FakeListerWatcher()
    seed(able, 1)
    seed(unable, 1)
    off = run_reflector(able, Recorder(), use_watch_list=False)
    cannot = run_reflector(unable, Recorder())
    wait_for(lambda: off.stats.watches == 1 and cannot.stats.watches == 1)
    for r, fake in ((off, able), (cannot, unable)):
        assert not r.uses_watch_list
        assert r.stats.lists == 1 and r.stats.watch_list_fallbacks == 0
        assert not any(c.send_initial_events for c in fake.watch_calls)


def test_stop_interrupts_a_stream_waiting_for_its_initial_events(lw: FakeListerWatcher) -> None:
    gate = threading.Event()

    class Hanging(Stream):
        def __iter__(self) -> Iterator[tuple[str, KubeObject]]:
            yield added("a", 2)
            gate.wait(30)

        def close(self) -> None:
            gate.set()

    class HangingLW(Scripted):
        def watch(self, *, send_initial_events: bool = False, **kw: Any) -> Any:
            return Hanging([])

    store = Recorder()
    r = Reflector(HangingLW(lw), store, clock=FakeClock())
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    wait_for(lambda: r._stream is not None)
    r.stop()
    t.join(5)
    assert not t.is_alive()
    assert store.events == [], "half a stream never reaches the store"


def test_the_factory_uses_watch_list_unless_told_not_to() -> None:
    from informers.factory import SharedInformerFactory
    from informers.resource import PODS
    from tests.test_factory import offline_client

    default = SharedInformerFactory(offline_client())
    off = SharedInformerFactory(offline_client(), use_watch_list=False)
    assert default.informer_for(PODS).reflector.uses_watch_list
    assert not off.informer_for(PODS).reflector.uses_watch_list


# -- against the real API server --------------------------------------------


class RecordWatches:
    """Passes everything to a real lister-watcher and records the watches asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.supports_watch_list = inner.supports_watch_list
        self.watches: list[tuple[str, bool]] = []

    def list_page(self, **kw: Any) -> Any:
        return self.inner.list_page(**kw)

    def watch(self, **kw: Any) -> Any:
        self.watches.append((kw["resource_version"], kw.get("send_initial_events", False)))
        return self.inner.watch(**kw)

    def abort(self) -> None:
        self.inner.abort()


def cache(inf: SharedInformer) -> dict[str, KubeObject]:
    """The cached objects without kind and apiVersion, which a watch event's
    object has and a list's item (of a built-in kind) has not."""
    return {inf.indexer.key_of(o): {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
            for o in inf.indexer.list()}


@pytest.mark.plane
def test_watch_list_gives_the_cache_a_list_gives_and_goes_on_watching(
    api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    create_config_maps(api_client, namespace, [f"cm-{i:03d}" for i in range(300)])
    recorded = RecordWatches(config_map_lw(api_client, namespace))
    by_watch_list = SharedInformer(recorded, name="watch-list", transform=strip_managed_fields)
    by_list = SharedInformer(config_map_lw(api_client, namespace), name="list",
                             transform=strip_managed_fields, use_watch_list=False)
    try:
        for inf in (by_watch_list, by_list):
            inf.start()
        assert by_watch_list.wait_for_sync(30) and by_list.wait_for_sync(30)
        assert by_watch_list.reflector.stats.watch_lists == 1 and by_watch_list.reflector.stats.lists == 0
        assert by_list.reflector.stats.lists == 1 and by_list.reflector.stats.watch_lists == 0
        assert recorded.watches == [("", True)], "one WatchList request for the newest state"
        expected = fresh_state(api_client, namespace)
        assert len(expected) == 300
        assert cache_state(by_watch_list.indexer) == expected
        assert cache(by_watch_list) == cache(by_list), "the same objects, field for field"
        newest = max(int(rv) for rv in expected.values())
        assert int(by_watch_list.last_sync_resource_version) >= newest
        changed = client.CoreV1Api(api_client).patch_namespaced_config_map(
            "cm-007", namespace, {"data": {"v": "2"}})
        wait_for(lambda: cache_state(by_watch_list.indexer)[f"{namespace}/cm-007"]
                 == changed.metadata.resource_version, message="the change through the same stream")
        assert recorded.watches == [("", True)], "no other watch was opened"
    finally:
        by_watch_list.stop()
        by_list.stop()


@pytest.mark.plane
def test_a_server_without_watch_list_is_listed_instead(
    api_client: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kubernetes import client

    from informers.api import RawClient, ResourceListerWatcher
    from informers.resource import CONFIG_MAPS
    from tests.test_reflector import NOT_PUBLISHED

    class BeforeWatchList(RawClient):
        """The real server, asked as a server that predates WatchList (v1.26)
        hears it: without the sendInitialEvents it does not know, so the
        resourceVersionMatch of a watch is refused (422)."""

        def get(self, path: str, params: list[tuple[str, str]], *, read_timeout: float) -> Any:
            kept = [(k, v) for k, v in params if k != "sendInitialEvents"]
            return super().get(path, kept, read_timeout=read_timeout)

    create_config_maps(api_client, namespace, [f"cm-{i:02d}" for i in range(40)])
    lw = ResourceListerWatcher(BeforeWatchList(api_client), CONFIG_MAPS, namespace=namespace,
                               field_selector=NOT_PUBLISHED)
    inf = SharedInformer(lw, name="old-server")
    caplog.set_level(logging.INFO, logger="informers.reflector")
    try:
        inf.start()
        assert inf.wait_for_sync(30)
        stats = inf.reflector.stats
        assert stats.watch_list_fallbacks == 1 and stats.lists == 1 and stats.watch_lists == 0
        assert any("WatchList refused (422" in r.getMessage() for r in caplog.records), caplog.text
        assert cache_state(inf.indexer) == fresh_state(api_client, namespace)
        client.CoreV1Api(api_client).delete_namespaced_config_map("cm-00", namespace)
        wait_for(lambda: f"{namespace}/cm-00" not in inf.indexer.list_keys(), message="the watch after the list")
    finally:
        inf.stop()


@pytest.mark.plane
def test_a_410_relists_by_watch_list_and_the_cache_equals_a_fresh_list(
    control_plane: Any, api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    from informers.api import RawClient, ResourceListerWatcher
    from informers.resource import Resource
    from informers.testing import GatedListerWatcher
    from tests.test_shared_informer import Recording

    # PodTemplates are watched straight from etcd (no watch cache), so a
    # compaction makes a watch, or a WatchList, from an older version end with 410.
    pod_templates = Resource("", "v1", "podtemplates", namespaced=True)
    core = client.CoreV1Api(api_client)

    def template(name: str, image: str = "busybox") -> dict[str, Any]:
        return {"metadata": {"name": name},
                "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}

    for i in range(10):
        core.create_namespaced_pod_template(namespace, template(f"t{i:02d}"))
    recorded = RecordWatches(ResourceListerWatcher(RawClient(api_client), pod_templates, namespace=namespace))
    gated = GatedListerWatcher(recorded)
    # Watches of 2-4s, so the reflector soon comes back to the gate.
    inf = SharedInformer(gated, name="podtemplates", min_watch_timeout=2)
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    try:
        assert inf.wait_for_sync(30)
        assert inf.reflector.stats.watch_lists == 1
        wait_for(lambda: len(h.events) == 10)
        gated.close_gate()
        assert gated.waiting.wait(30), "the watch did not end"
        synced_at = inf.last_sync_resource_version
        # While the reflector waits at the gate: changes it cannot see, then
        # a compaction past its resourceVersion.
        for name in ("t00", "t01"):
            core.delete_namespaced_pod_template(name, namespace)
        core.replace_namespaced_pod_template("t02", namespace, template("t02", image="alpine"))
        core.create_namespaced_pod_template(namespace, template("t-new"))
        control_plane.compact_etcd()
        expected = {
            f"{namespace}/{t.metadata.name}": t.metadata.resource_version
            for t in core.list_namespaced_pod_template(namespace).items
        }
        gated.open_gate()
        wait_for(lambda: cache_state(inf.indexer) == expected, timeout=60,
                 message=lambda: f"stats {inf.reflector.stats}, watches {recorded.watches}")
        stats = inf.reflector.stats
        assert stats.expired >= 1, "the watch ended with 410"
        assert stats.watch_lists == 2 and stats.lists == 0, "the relist was a WatchList"
        # Not older than the last version seen, even though etcd no longer has it.
        assert [rv for rv, send in recorded.watches if send] == ["", synced_at]
        wait_for(lambda: len(h.events) == 10 + 4, message=lambda: f"{h.summary()[10:]}")
        after = h.events[10:]
        deletes = [o for kind, o, _ in after if kind == "delete"]
        assert sorted(d.key for d in deletes) == [f"{namespace}/t00", f"{namespace}/t01"]
        assert all(isinstance(d, DeletedFinalStateUnknown) for d in deletes)
        assert [new["metadata"]["name"] for kind, _, new in after if kind == "update"] == ["t02"]
        assert [o["metadata"]["name"] for kind, o, _ in after if kind == "add"] == ["t-new"]
    finally:
        inf.stop()

