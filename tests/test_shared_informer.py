"""Shared informers: handlers in order on their own threads, sync state, resync, tombstones.

The first part runs informers over an in-memory lister-watcher; the tests
marked ``plane`` run them against the real API server.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

import pytest

from informers.clock import FakeClock
from informers.objects import DeletedFinalStateUnknown, KubeObject
from informers.processor import EventHandlerFuncs
from informers.shared_informer import SharedInformer
from informers.testing import FakeListerWatcher, make_object
from informers.transforms import strip_managed_fields
from tests.helpers import wait_for


class Recording:
    """An EventHandler that remembers what it got; optionally blocks on a gate."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.events: list[tuple[str, Any, Any]] = []
        self.gate = gate
        self.entered = threading.Event()

    def _wait(self) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"

    def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
        self._wait()
        self.events.append(("add", obj, is_in_initial_list))

    def on_update(self, old: KubeObject, new: KubeObject) -> None:
        self._wait()
        self.events.append(("update", old, new))

    def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        self._wait()
        self.events.append(("delete", obj, None))

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for kind, a, b in self.events:
            obj = b if kind == "update" else a
            name = obj.key if isinstance(obj, DeletedFinalStateUnknown) else obj["metadata"]["name"]
            out.append((kind, name))
        return out


@pytest.fixture
def lw() -> FakeListerWatcher:
    return FakeListerWatcher()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_informer(lw: FakeListerWatcher, clock: FakeClock) -> Iterator[Any]:
    made: list[SharedInformer] = []

    def make(**kwargs: Any) -> SharedInformer:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("rand", lambda: 0.0)
        inf = SharedInformer(lw, name="test", **kwargs)
        made.append(inf)
        return inf

    yield make
    for inf in made:
        inf.stop()
        assert not any(t.is_alive() for t in inf._threads), "an informer thread survived stop"


def seed(lw: FakeListerWatcher, n: int) -> None:
    for i in range(n):
        lw.add(make_object(f"o{i:03d}", f"ns{i % 3}"))


def test_every_handler_gets_every_event_in_order(lw: FakeListerWatcher, make_informer: Any) -> None:
    seed(lw, 2)
    inf = make_informer()
    a, b = Recording(), Recording()
    inf.add_event_handler(a)
    inf.add_event_handler(b)
    inf.start()
    assert inf.wait_for_sync(10)
    lw.add(make_object("x"))
    lw.modify(make_object("x", data={"k": "v"}))
    lw.delete("default/x")
    expected = [("add", "o000"), ("add", "o001"), ("add", "x"), ("update", "x"), ("delete", "x")]
    for h in (a, b):
        wait_for(lambda: len(h.events) == 5, message=lambda: f"{h.summary()}")
        assert sorted(h.summary()[:2]) == expected[:2]
        assert h.summary()[2:] == expected[2:]


def test_a_slow_handler_delays_neither_the_watch_nor_other_handlers(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    inf = make_informer()
    gate = threading.Event()
    slow, fast = Recording(gate), Recording()
    slow_reg = inf.add_event_handler(slow)
    inf.add_event_handler(fast)
    inf.start()
    assert inf.wait_for_sync(10)
    for i in range(50):
        lw.add(make_object(f"p{i}"))
    wait_for(lambda: len(fast.events) == 50, message="the fast handler to get everything")
    wait_for(lambda: len(inf.indexer) == 50, message="the cache to fill")
    assert slow.entered.is_set() and slow.events == []
    assert inf.last_sync_resource_version == str(lw.resource_version)
    gate.set()
    wait_for(lambda: len(slow.events) == 50)
    assert slow.summary() == fast.summary()
    assert slow_reg.delivered == 50


def test_waiting_for_sync_returns_as_soon_as_an_empty_first_list_arrives(make_informer: Any) -> None:
    import time

    inf = make_informer()
    reg = inf.add_event_handler(Recording())
    inf.start()
    started = time.monotonic()
    assert inf.wait_for_sync(30) and reg.wait_for_sync(30)
    assert time.monotonic() - started < 5, "the waiter was not woken by the sync"


def test_a_late_handler_gets_the_cache_as_initial_adds_and_syncs_only_after_them(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    seed(lw, 30)
    inf = make_informer()
    inf.start()
    assert inf.wait_for_sync(10)
    gate = threading.Event()
    late = Recording(gate)
    reg = inf.add_event_handler(late)
    late.entered.wait(10)
    assert inf.has_synced() and not reg.has_synced()
    gate.set()
    assert reg.wait_for_sync(10)
    assert len(late.events) == 30
    assert all(kind == "add" and initial for kind, _, initial in late.events)
    lw.add(make_object("after"))
    wait_for(lambda: len(late.events) == 31)
    assert late.events[-1][2] is False, "a watch add is not part of the initial list"


def test_a_handler_is_synced_only_after_it_handled_the_first_list(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    seed(lw, 10)
    inf = make_informer()
    gate = threading.Event()
    h = Recording(gate)
    reg = inf.add_event_handler(h)
    inf.start()
    assert inf.wait_for_sync(10), "the cache is filled whatever the handler does"
    assert not reg.has_synced()
    gate.set()
    assert reg.wait_for_sync(10)
    assert len(h.events) == 10


def test_a_failing_handler_is_logged_and_counted_and_keeps_receiving(
    lw: FakeListerWatcher, make_informer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    reported: list[tuple[str, str]] = []
    inf = make_informer(on_handler_error=lambda name, e: reported.append((name, str(e))))
    got: list[str] = []

    def add(obj: KubeObject) -> None:
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        got.append(obj["metadata"]["name"])

    reg = inf.add_event_handler(EventHandlerFuncs(add=add), name="picky")
    inf.start()
    assert inf.wait_for_sync(10)
    with caplog.at_level(logging.ERROR):
        for name in ("a", "bad", "c"):
            lw.add(make_object(name))
        wait_for(lambda: got == ["a", "c"], message=lambda: f"{got}")
    assert reg.errors == 1 and inf.handler_errors == 1
    assert reported == [("picky", "boom")]
    assert "picky" in caplog.text and "boom" in caplog.text


def test_deletes_missed_while_disconnected_reach_handlers_as_tombstones(
    lw: FakeListerWatcher, make_informer: Any, clock: FakeClock
) -> None:
    seed(lw, 5)
    inf = make_informer()
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    assert inf.wait_for_sync(10)
    lw.change_silently(delete=["ns1/o001", "ns0/o003"], upsert=[make_object("o004", "ns1", data={"k": "2"})])
    clock.wait_for_sleepers()
    clock.step(2)
    wait_for(lambda: len(h.events) == 5 + 3, message=lambda: f"{h.summary()}")
    deletes = [obj for kind, obj, _ in h.events if kind == "delete"]
    assert sorted(d.key for d in deletes) == ["ns0/o003", "ns1/o001"]
    assert all(isinstance(d, DeletedFinalStateUnknown) for d in deletes)
    updates = [(old, new) for kind, old, new in h.events if kind == "update"]
    assert len(updates) == 1, "unchanged objects are not redelivered by a relist"
    assert updates[0][1]["data"] == {"k": "2"}
    assert sorted(inf.indexer.list_keys()) == sorted(lw.objects())


def test_resync_replays_the_cache_to_the_handler_that_asked_for_it_only(
    lw: FakeListerWatcher, make_informer: Any, clock: FakeClock
) -> None:
    seed(lw, 6)
    inf = make_informer()
    every_30s, never = Recording(), Recording()
    inf.add_event_handler(every_30s, resync_period=30)
    inf.add_event_handler(never)
    inf.start()
    assert inf.wait_for_sync(10)
    wait_for(lambda: len(every_30s.events) == 6 and len(never.events) == 6)
    lists = len(lw.list_calls)
    clock.wait_for_sleepers()
    clock.step(29)
    assert len(every_30s.events) == 6
    clock.step(1)
    wait_for(lambda: len(every_30s.events) == 12, message=lambda: f"{every_30s.summary()}")
    resynced = every_30s.events[6:]
    assert all(kind == "update" and old is new for kind, old, new in resynced)
    assert len(lw.list_calls) == lists, "a resync replays the cache; it does not ask the API"
    # The other handler got nothing; prove delivery is not merely slow.
    lw.add(make_object("marker"))
    wait_for(lambda: len(never.events) == 7)
    assert never.summary()[-1] == ("add", "marker")
    assert [k for k, _, _ in never.events].count("update") == 0


def test_a_resync_period_below_a_second_is_raised_to_one(
    lw: FakeListerWatcher, make_informer: Any, clock: FakeClock
) -> None:
    lw.add(make_object("a"))
    inf = make_informer()
    h = Recording()
    inf.add_event_handler(h, resync_period=0.01)
    inf.start()
    assert inf.wait_for_sync(10)
    wait_for(lambda: len(h.events) == 1)
    (deadline,) = clock.wait_for_sleepers()
    assert deadline is not None and deadline - clock.monotonic() == pytest.approx(1.0)


def test_transform_strips_managed_fields_before_anything_sees_the_object(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    lw.add({"metadata": {"name": "a", "namespace": "d", "managedFields": [{"manager": "x"}]}})
    inf = make_informer(transform=strip_managed_fields)
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    assert inf.wait_for_sync(10)
    lw.add({"metadata": {"name": "b", "namespace": "d", "managedFields": [{"manager": "x"}]}})
    wait_for(lambda: len(h.events) == 2)
    assert all("managedFields" not in o["metadata"] for o in inf.indexer.list())
    assert all("managedFields" not in obj["metadata"] for _, obj, _ in h.events)


def test_indexes_added_after_start_answer_queries(lw: FakeListerWatcher, make_informer: Any) -> None:
    for i in range(6):
        lw.add(make_object(f"p{i}", spec={"nodeName": f"n{i % 2}"}))
    inf = make_informer()
    inf.start()
    assert inf.wait_for_sync(10)
    inf.add_indexers({"node": lambda o: [o["spec"]["nodeName"]]})
    assert sorted(o["metadata"]["name"] for o in inf.indexer.by_index("node", "n0")) == ["p0", "p2", "p4"]
    lw.modify(make_object("p0", spec={"nodeName": "n1"}))
    wait_for(lambda: len(inf.indexer.by_index("node", "n1")) == 4)


def test_handlers_receive_the_cached_objects_themselves(lw: FakeListerWatcher, make_informer: Any) -> None:
    # The documented read-only contract: no copies are made for handlers.
    lw.add(make_object("a"))
    inf = make_informer()
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    assert inf.wait_for_sync(10)
    wait_for(lambda: len(h.events) == 1)
    assert h.events[0][1] is inf.indexer.get_by_key("default/a")


def test_a_removed_handler_gets_nothing_more(lw: FakeListerWatcher, make_informer: Any) -> None:
    inf = make_informer()
    gone, kept = Recording(), Recording()
    reg = inf.add_event_handler(gone)
    inf.add_event_handler(kept)
    inf.start()
    assert inf.wait_for_sync(10)
    lw.add(make_object("a"))
    wait_for(lambda: len(gone.events) == 1)
    reg.remove()
    lw.add(make_object("b"))
    wait_for(lambda: len(kept.events) == 2)
    assert gone.summary() == [("add", "a")]


def test_stop_ends_every_thread_even_with_a_stuck_watch(lw: FakeListerWatcher, make_informer: Any) -> None:
    inf = make_informer()
    inf.add_event_handler(Recording())
    inf.start()
    assert inf.wait_for_sync(10)
    inf.stop(timeout=5)
    assert not any(t.is_alive() for t in inf._threads)


# -- against the real API server --------------------------------------------


@pytest.mark.plane
def test_an_api_server_restart_with_changes_made_while_it_was_away_leaves_the_cache_equal_to_a_fresh_list(
    control_plane: Any, api_client: Any, namespace: str
) -> None:
    from kubernetes import client, config

    from tests.test_reflector import cache_state, config_map_lw, create_config_maps, fresh_state

    create_config_maps(api_client, namespace, [f"cm-{i:02d}" for i in range(40)])
    # A fake clock holds the reflector in its backoff until the test moves
    # time, so the changes below surely happen while it is away.
    clock = FakeClock()
    inf = SharedInformer(config_map_lw(api_client, namespace), name="restart", clock=clock)
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    try:
        assert inf.wait_for_sync(30)
        wait_for(lambda: len(h.events) == 40)
        try:
            control_plane.stop_apiserver()
            wait_for(lambda: inf.reflector.in_backoff, timeout=60,
                     message="the reflector to lose its watch and back off")
        finally:
            control_plane.start_apiserver()
        watches = inf.reflector.stats.watches
        other = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        core = client.CoreV1Api(other)
        deleted = ["cm-00", "cm-01", "cm-02"]
        for name in deleted:
            core.delete_namespaced_config_map(name, namespace)
        core.patch_namespaced_config_map("cm-03", namespace, {"data": {"v": "changed"}})
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm-new"}})
        expected = fresh_state(other, namespace)
        assert inf.reflector.in_backoff and inf.reflector.stats.watches == watches, (
            "the changes were made while the reflector was away"
        )

        def caught_up() -> bool:
            if inf.reflector.in_backoff:
                clock.step(60)
            return cache_state(inf.indexer) == expected

        wait_for(caught_up, timeout=60, message=lambda: f"cache {len(inf.indexer)} objects, stats {inf.reflector.stats}")
        wait_for(lambda: len(h.events) >= 40 + 5, message=lambda: f"{h.summary()[40:]}")
        after = h.events[40:]
        deletes = sorted(
            (o.key.split("/")[1] if isinstance(o, DeletedFinalStateUnknown) else o["metadata"]["name"])
            for kind, o, _ in after if kind == "delete"
        )
        assert deletes == deleted
        # The restarted server's watch cache starts after the informer's
        # resourceVersion (the server writes at startup), so the re-watch got
        # 410 and the deletes were found by the relist: tombstones.
        assert inf.reflector.stats.expired >= 1
        assert all(isinstance(o, DeletedFinalStateUnknown) for kind, o, _ in after if kind == "delete")
        updates = [new for kind, _, new in after if kind == "update"]
        assert [u["metadata"]["name"] for u in updates] == ["cm-03"], "unchanged objects are not redelivered"
        assert updates[0]["data"] == {"v": "changed"}
        assert [o["metadata"]["name"] for kind, o, _ in after if kind == "add"] == ["cm-new"]
    finally:
        inf.stop()


@pytest.mark.plane
def test_late_handler_resync_indexes_and_transform_work_on_real_objects(api_client: Any, namespace: str) -> None:
    from kubernetes import client

    from tests.test_reflector import config_map_lw

    core = client.CoreV1Api(api_client)
    for i in range(30):
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": f"cm-{i:02d}", "labels": {"team": "a" if i % 3 else "b"}}}
        )
    clock = FakeClock()
    inf = SharedInformer(config_map_lw(api_client, namespace), name="real", clock=clock,
                         transform=strip_managed_fields)
    early = Recording()
    inf.add_event_handler(early)
    inf.start()
    try:
        assert inf.wait_for_sync(30)
        # Index added after the informer started and filled its cache.
        inf.add_indexers({"team": lambda o: [(o["metadata"].get("labels") or {}).get("team", "")]})
        assert len(inf.indexer.by_index("team", "b")) == 10
        assert len(inf.indexer.by_index("team", "a")) == 20
        # A late handler, resynced every minute.
        late = Recording()
        reg = inf.add_event_handler(late, resync_period=60)
        assert reg.wait_for_sync(10)
        assert len(late.events) == 30 and all(initial for _, _, initial in late.events)
        lists = inf.reflector.stats.lists
        clock.wait_for_sleepers()
        clock.step(60)
        wait_for(lambda: len(late.events) == 60, message=lambda: f"{len(late.events)} events")
        assert all(kind == "update" and old is new for kind, old, new in late.events[30:])
        assert inf.reflector.stats.lists == lists, "the resync came from the cache"
        # A real change moves the object between index values, and reaches both handlers.
        core.patch_namespaced_config_map("cm-00", namespace, {"metadata": {"labels": {"team": "a"}}})
        wait_for(lambda: len(inf.indexer.by_index("team", "b")) == 9)
        wait_for(lambda: early.summary()[-1:] == [("update", "cm-00")])
        wait_for(lambda: late.summary()[-1:] == [("update", "cm-00")])
        assert len(early.events) == 31, "the early handler never resynced"
        assert all("managedFields" not in o["metadata"] for o in inf.indexer.list())
    finally:
        inf.stop()


@pytest.mark.plane
def test_stop_ends_an_open_watch_on_the_real_server_at_once(api_client: Any, namespace: str) -> None:
    import time

    from tests.test_reflector import config_map_lw

    inf = SharedInformer(config_map_lw(api_client, namespace), name="stop")
    inf.add_event_handler(Recording())
    inf.start()
    assert inf.wait_for_sync(30)
    wait_for(lambda: inf.reflector.stats.watches >= 1, message="the watch to open")
    started = time.monotonic()
    inf.stop(timeout=10)
    # The watch was asked to last 5 to 10 minutes; stop closes it.
    assert time.monotonic() - started < 2
    assert not any(t.is_alive() for t in inf._threads)


@pytest.mark.plane
def test_a_410_forced_by_an_etcd_compaction_relists_and_the_cache_equals_a_fresh_list(
    control_plane: Any, api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    from informers.api import RawClient, ResourceListerWatcher
    from informers.resource import Resource
    from informers.testing import GatedListerWatcher

    # PodTemplates are watched straight from etcd (the API server keeps no
    # watch cache for them), so a compaction is what makes a watch from an
    # older resourceVersion end with 410.
    pod_templates = Resource("", "v1", "podtemplates", namespaced=True)
    core = client.CoreV1Api(api_client)

    def template(name: str, image: str = "busybox") -> dict[str, Any]:
        return {"metadata": {"name": name},
                "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}

    for i in range(20):
        core.create_namespaced_pod_template(namespace, template(f"t{i:02d}"))
    gated = GatedListerWatcher(ResourceListerWatcher(RawClient(api_client), pod_templates, namespace=namespace))
    # Watches of 2-4s, so the reflector soon comes back to the gate.
    inf = SharedInformer(gated, name="podtemplates", min_watch_timeout=2)
    h = Recording()
    inf.add_event_handler(h)
    inf.start()
    try:
        assert inf.wait_for_sync(30)
        wait_for(lambda: len(h.events) == 20)
        gated.close_gate()
        assert gated.waiting.wait(30), "the watch did not end"
        # While the reflector waits at the gate: changes it cannot see, then
        # a compaction past its resourceVersion.
        for name in ("t00", "t01", "t02"):
            core.delete_namespaced_pod_template(name, namespace)
        core.replace_namespaced_pod_template("t03", namespace, template("t03", image="alpine"))
        core.create_namespaced_pod_template(namespace, template("t-new"))
        control_plane.compact_etcd()
        expected = {
            f"{namespace}/{t.metadata.name}": t.metadata.resource_version
            for t in core.list_namespaced_pod_template(namespace).items
        }
        gated.open_gate()
        wait_for(lambda: {inf.indexer.key_of(o): o["metadata"]["resourceVersion"] for o in inf.indexer.list()}
                 == expected, timeout=60, message=lambda: f"stats {inf.reflector.stats}")
        assert inf.reflector.stats.expired >= 1, "the watch ended with 410"
        wait_for(lambda: len(h.events) == 20 + 5, message=lambda: f"{h.summary()[20:]}")
        after = h.events[20:]
        deletes = [o for kind, o, _ in after if kind == "delete"]
        assert sorted(d.key for d in deletes) == [f"{namespace}/t0{i}" for i in range(3)]
        assert all(isinstance(d, DeletedFinalStateUnknown) for d in deletes)
        assert [new["metadata"]["name"] for kind, _, new in after if kind == "update"] == ["t03"]
        assert [o["metadata"]["name"] for kind, o, _ in after if kind == "add"] == ["t-new"]
    finally:
        inf.stop()


# -- inline handlers --------------------------------------------------------------------


class ThreadRecording(Recording):
    """A Recording that also notes the thread each call ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def _wait(self) -> None:
        self.threads.append(threading.current_thread().name)


def test_an_inline_handler_runs_in_order_on_the_watch_thread_before_the_next_delta(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    seed(lw, 2)
    inf = make_informer()
    inline, threaded = ThreadRecording(), ThreadRecording()
    cache_when_called: list[int] = []
    inline_reg = inf.add_event_handler(inline, inline=True)
    inf.add_event_handler(threaded)
    inf.add_event_handler(EventHandlerFuncs(add=lambda _o: cache_when_called.append(len(inf.indexer))),
                          inline=True)
    inf.start()
    assert inf.wait_for_sync(10)
    assert inline_reg.has_synced(), "an inline handler returned from its initial adds before sync"
    for i in range(20):
        lw.add(make_object(f"x{i:02d}"))
    lw.modify(make_object("x00", data={"k": "v"}))
    lw.delete("default/x01")
    wait_for(lambda: len(inline.events) == 24 and len(threaded.events) == 24,
             message=lambda: f"{inline.summary()} / {threaded.summary()}")
    assert inline.summary() == threaded.summary()
    assert set(inline.threads) == {"test:reflector"}
    assert "test:reflector" not in set(threaded.threads)
    # The first list is applied as one batch; after it, each watch event's
    # add was handled before the next object reached the cache.
    assert cache_when_called == [2, 2] + list(range(3, 23))


def test_a_failing_inline_handler_is_counted_and_delivery_goes_on(
    lw: FakeListerWatcher, make_informer: Any
) -> None:
    reported: list[str] = []
    inf = make_informer(on_handler_error=lambda name, e: reported.append(f"{name}: {e}"))
    got: list[str] = []

    def add(obj: KubeObject) -> None:
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        got.append(obj["metadata"]["name"])

    reg = inf.add_event_handler(EventHandlerFuncs(add=add), name="picky", inline=True)
    inf.start()
    assert inf.wait_for_sync(10)
    for name in ("a", "bad", "c"):
        lw.add(make_object(name))
    wait_for(lambda: got == ["a", "c"], message=lambda: f"{got}")
    assert reg.errors == 1 and reported == ["picky: boom"]
    assert inf.reflector.stats.events == 3, "the watch went on past the failure"


def test_a_late_inline_handler_gets_the_cache_before_add_returns_and_resyncs(
    lw: FakeListerWatcher, make_informer: Any, clock: FakeClock
) -> None:
    seed(lw, 4)
    inf = make_informer()
    inf.start()
    assert inf.wait_for_sync(10)
    late = ThreadRecording()
    reg = inf.add_event_handler(late, inline=True, resync_period=30)
    assert reg.has_synced() and len(late.events) == 4
    assert all(initial for _kind, _obj, initial in late.events)
    clock.wait_for_sleepers()
    clock.step(30)
    wait_for(lambda: len(late.events) == 8, message=lambda: f"{late.summary()}")
    assert all(kind == "update" and old is new for kind, old, new in late.events[4:])
    assert set(late.threads[4:]) == {"test:resync"}
    reg.remove()
    lw.add(make_object("after"))
    wait_for(lambda: "default/after" in inf.indexer.list_keys())
    assert len(late.events) == 8, "a removed inline handler gets nothing more"
