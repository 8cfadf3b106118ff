"""The reflector: client-go's list/watch rules, relists with tombstones, backoff, stop.

The first part drives a reflector with an in-memory lister-watcher and a
fake clock; the tests marked ``plane`` run it against the real API server.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest

from informers.backoff import Backoff, BackoffPolicy
from informers.clock import FakeClock
from informers.delta_fifo import DeltaFIFO, DeltaType
from informers.errors import ApiStatusError, TransportError
from informers.objects import DeletedFinalStateUnknown, KubeObject
from informers.reflector import Reflector
from informers.store import Indexer
from informers.testing import FakeListerWatcher, ListCall, make_object, status
from tests.helpers import wait_for


class Recorder:
    """A store that applies deltas at once and remembers what it was told."""

    def __init__(self) -> None:
        self.indexer = Indexer()
        self.fifo = DeltaFIFO(self.indexer)
        self.events: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()

    def replace(self, items: list[KubeObject]) -> None:
        self.fifo.replace(items)
        self._drain()

    def add(self, obj: KubeObject) -> None:
        self.fifo.add(obj)
        self._drain()

    def update(self, obj: KubeObject) -> None:
        self.fifo.update(obj)
        self._drain()

    def delete(self, obj: KubeObject) -> None:
        self.fifo.delete(obj)
        self._drain()

    def _drain(self) -> None:
        def apply(batch: list[Any]) -> None:
            for dtype, obj, key, _ in batch:
                with self._lock:
                    self.events.append((dtype.value, key, obj))
                if dtype is DeltaType.DELETED:
                    self.indexer.pop(key)
                else:
                    self.indexer.set(key, obj)

        while len(self.fifo):
            self.fifo.pop_batch(apply)

    def names(self) -> list[str]:
        return sorted(k for k in self.indexer.list_keys())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lw() -> FakeListerWatcher:
    return FakeListerWatcher()


@pytest.fixture
def run_reflector(clock: FakeClock) -> Iterator[Any]:
    started: list[tuple[Reflector, threading.Thread]] = []

    def start(lw: FakeListerWatcher, store: Recorder, **kwargs: Any) -> Reflector:
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


def seed(lw: FakeListerWatcher, n: int, namespace: str = "default") -> None:
    for i in range(n):
        lw.add(make_object(f"o{i:04d}", namespace))


def watching(lw: FakeListerWatcher, count: int = 1) -> bool:
    return len(lw.watch_calls) >= count and lw.open_watches() >= 1


# -- backoff --------------------------------------------------------------


def test_backoff_doubles_from_800ms_up_to_30s_with_client_go_defaults(clock: FakeClock) -> None:
    b = Backoff(clock=clock, rand=lambda: 0.0)
    assert [b.next_delay() for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]


def test_backoff_jitter_adds_up_to_the_base_again(clock: FakeClock) -> None:
    b = Backoff(clock=clock, rand=lambda: 0.5)
    assert b.next_delay() == pytest.approx(1.2)
    top = Backoff(clock=clock, rand=lambda: 0.999999)
    assert top.next_delay() == pytest.approx(1.6, rel=1e-5)


def test_backoff_starts_over_after_two_healthy_minutes(clock: FakeClock) -> None:
    b = Backoff(clock=clock, rand=lambda: 0.0)
    for _ in range(5):
        b.next_delay()
    clock.step(119)
    assert b.next_delay() == 25.6, "two minutes have not passed yet"
    clock.step(121)
    assert b.next_delay() == 0.8


def test_an_invalid_backoff_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(initial=0)
    with pytest.raises(ValueError):
        BackoffPolicy(initial=5, cap=1)


# -- list ---------------------------------------------------------------


def test_first_list_asks_resource_version_0_in_pages(lw: FakeListerWatcher, run_reflector: Any) -> None:
    seed(lw, 1201)
    store = Recorder()
    r = run_reflector(lw, store, page_size=500)
    wait_for(lambda: watching(lw), message="the reflector to watch")
    assert [(c.resource_version, c.limit, bool(c.continue_token)) for c in lw.list_calls] == [
        ("0", 500, False),
        ("", 500, True),
        ("", 500, True),
    ], "a continued page carries no resourceVersion"
    assert len(store.indexer) == 1201
    assert r.stats.last_list_pages == 3
    assert lw.watch_calls[0].resource_version == str(lw.resource_version)


def test_a_quorum_first_list_asks_resource_version_empty(lw: FakeListerWatcher, run_reflector: Any) -> None:
    seed(lw, 3)
    run_reflector(lw, Recorder(), initial_resource_version="")
    wait_for(lambda: watching(lw))
    assert lw.list_calls[0] == ListCall("", 500, "")


def test_relist_asks_the_last_resource_version_unpaginated(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    # client-go lists a known version whole: the watch cache serves it.
    seed(lw, 3)
    r = run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    lw.add(make_object("late"))
    last = str(lw.resource_version)
    wait_for(lambda: r.last_sync_resource_version == last)
    lw.expire_watches()
    clock.wait_for_sleepers()  # client-go backs off before relisting, too
    clock.step(1)
    wait_for(lambda: len(lw.list_calls) == 2, message="a relist")
    assert lw.list_calls[1] == ListCall(last, 0, "")


def test_relist_keeps_paging_when_the_first_list_was_paginated(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 7)
    run_reflector(lw, Recorder(), page_size=5)
    wait_for(lambda: watching(lw))
    lw.expire_watches()
    clock.wait_for_sleepers()
    clock.step(1)
    wait_for(lambda: len(lw.list_calls) >= 4, message="a paginated relist")
    assert lw.list_calls[2].limit == 5


def test_a_relist_whose_version_is_compacted_lists_the_newest_state(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 3)
    store = Recorder()
    run_reflector(lw, store)
    wait_for(lambda: watching(lw))
    synced_at = str(lw.resource_version)
    lw.change_silently(delete=["default/o0001"], upsert=[make_object("o0009")])
    clock.wait_for_sleepers()  # the watch saw a 410 and backs off
    clock.step(1)
    wait_for(lambda: len(lw.list_calls) >= 3, message="the fallback list")
    # A known version is asked whole; the newest state in pages again.
    assert lw.list_calls[1:3] == [ListCall(synced_at, 0, ""), ListCall("", 500, "")]
    wait_for(lambda: store.names() == ["default/o0000", "default/o0002", "default/o0009"])


def test_a_too_large_resource_version_lists_the_newest_state(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 2)
    run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    lw.fail_next_list(
        ApiStatusError(504, "Timeout", "Too large resource version", causes=("ResourceVersionTooLarge",))
    )
    lw.expire_watches()
    clock.wait_for_sleepers()
    clock.step(1)
    wait_for(lambda: len(lw.list_calls) >= 3)
    assert lw.list_calls[2].resource_version == ""


def test_an_expired_continue_token_falls_back_to_one_unpaginated_list(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    seed(lw, 12)
    original = lw.list_page

    def compact_after_first_page(**kw: Any) -> Any:
        page = original(**kw)
        if not kw["continue_token"]:
            lw.compact()
        return page

    lw.list_page = compact_after_first_page  # type: ignore[method-assign]
    store = Recorder()
    r = run_reflector(lw, store, page_size=5)
    wait_for(lambda: watching(lw))
    calls = lw.list_calls
    assert [(c.resource_version, c.limit) for c in calls] == [("0", 5), ("", 5), ("0", 0)]
    assert r.stats.paginated_fallbacks == 1
    assert len(store.indexer) == 12, "the fallback list replaces, it does not append"


# -- watch --------------------------------------------------------------


def test_events_reach_the_store_in_order(lw: FakeListerWatcher, run_reflector: Any) -> None:
    store = Recorder()
    run_reflector(lw, store)
    wait_for(lambda: watching(lw))
    lw.add(make_object("a"))
    lw.modify(make_object("a", data={"v": "2"}))
    lw.add(make_object("b"))
    lw.delete("default/a")
    wait_for(lambda: len(store.events) == 4)
    assert [(t, k) for t, k, _ in store.events] == [
        ("Added", "default/a"),
        ("Updated", "default/a"),
        ("Added", "default/b"),
        ("Deleted", "default/a"),
    ]


def test_a_watch_the_server_ended_resumes_from_the_last_event(
    lw: FakeListerWatcher, run_reflector: Any
) -> None:
    store = Recorder()
    run_reflector(lw, store)
    wait_for(lambda: watching(lw))
    lw.add(make_object("a"))
    wait_for(lambda: len(store.events) == 1)
    lw.end_watches()
    wait_for(lambda: watching(lw, 2), message="a second watch")
    assert lw.watch_calls[1].resource_version == store.events[0][2]["metadata"]["resourceVersion"]
    assert len(lw.list_calls) == 1, "a normal end does not relist"


def test_bookmarks_advance_the_resource_version(lw: FakeListerWatcher, run_reflector: Any) -> None:
    r = run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    lw.bookmark()
    wait_for(lambda: r.last_sync_resource_version == str(lw.resource_version))
    assert r.stats.bookmarks == 1
    lw.end_watches()
    wait_for(lambda: watching(lw, 2))
    assert lw.watch_calls[1].resource_version == str(lw.resource_version)


@pytest.mark.parametrize(("rand", "timeout"), [(0.0, 300), (0.5, 450), (0.9999, 599)])
def test_watch_timeout_is_drawn_from_five_to_ten_minutes(
    lw: FakeListerWatcher, run_reflector: Any, rand: float, timeout: int
) -> None:
    run_reflector(lw, Recorder(), rand=lambda: rand)
    wait_for(lambda: watching(lw))
    assert lw.watch_calls[0].timeout_seconds == timeout


def test_a_410_during_the_watch_relists_and_tombstones_what_vanished(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 4)
    store = Recorder()
    r = run_reflector(lw, store)
    wait_for(lambda: watching(lw))
    lw.change_silently(delete=["default/o0001", "default/o0003"])
    clock.wait_for_sleepers()
    clock.step(2)
    wait_for(lambda: store.names() == ["default/o0000", "default/o0002"])
    tombstones = [o for t, _, o in store.events if t == "Deleted"]
    assert sorted(t.key for t in tombstones) == ["default/o0001", "default/o0003"]
    assert all(isinstance(t, DeletedFinalStateUnknown) and t.obj is not None for t in tombstones)
    assert r.stats.expired == 1


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(TransportError("connection refused"), id="connection-refused"),
        pytest.param(status(429, "TooManyRequests"), id="429"),
        pytest.param(status(503, "ServiceUnavailable"), id="503"),
        pytest.param(status(500, "InternalError"), id="500"),
    ],
)
def test_connection_errors_429_and_5xx_back_off_then_rewatch_without_relisting(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock, error: Exception
) -> None:
    seed(lw, 2)
    r = run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    rv = r.last_sync_resource_version
    lw.fail_next_watch(error, error)
    lw.break_watches()
    # Broken watch, then two failed re-watches: three growing delays.
    for expected in (0.8, 1.6, 3.2):
        (deadline,) = clock.wait_for_sleepers()
        assert deadline == pytest.approx(clock.monotonic() + expected)
        assert r.in_backoff
        clock.step(expected)
    wait_for(lambda: watching(lw, 4), message="the watch to come back")
    assert [c.resource_version for c in lw.watch_calls[1:]] == [rv, rv, rv]
    assert len(lw.list_calls) == 1


def test_retry_after_is_honoured_when_longer_than_the_backoff(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    lw.fail_next_watch(ApiStatusError(429, "TooManyRequests", "slow down", retry_after=7))
    lw.break_watches()
    clock.wait_for_sleepers()  # the broken watch
    clock.step(0.8)
    (deadline,) = clock.wait_for_sleepers()
    assert deadline == pytest.approx(clock.monotonic() + 7)


def test_other_errors_relist_after_a_backoff(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    run_reflector(lw, Recorder())
    wait_for(lambda: watching(lw))
    lw.fail_next_watch(status(403, "Forbidden"))
    lw.break_watches()
    clock.wait_for_sleepers()
    clock.step(0.8)
    clock.wait_for_sleepers()
    assert len(lw.list_calls) == 1, "nothing happens before the backoff ends"
    clock.step(1.6)
    wait_for(lambda: len(lw.list_calls) == 2)


def test_a_failed_first_list_is_retried_after_a_backoff(
    lw: FakeListerWatcher, run_reflector: Any, clock: FakeClock
) -> None:
    seed(lw, 1)
    lw.fail_next_list(TransportError("refused"))
    store = Recorder()
    run_reflector(lw, store)
    clock.wait_for_sleepers()
    assert len(store.indexer) == 0
    clock.step(0.8)
    wait_for(lambda: len(store.indexer) == 1)


def test_transform_runs_on_listed_and_watched_objects(lw: FakeListerWatcher, run_reflector: Any) -> None:
    lw.add(make_object("a", managed=True))

    def strip(obj: KubeObject) -> KubeObject:
        obj.pop("managed", None)
        obj["seen"] = True
        return obj

    store = Recorder()
    run_reflector(lw, store, transform=strip)
    wait_for(lambda: watching(lw))
    lw.add(make_object("b", managed=True))
    wait_for(lambda: len(store.indexer) == 2)
    assert all(o.get("seen") and "managed" not in o for o in store.indexer.list())


def test_stop_interrupts_a_watch_waiting_for_events(lw: FakeListerWatcher, clock: FakeClock) -> None:
    r = Reflector(lw, Recorder(), clock=clock)
    t = threading.Thread(target=r.run)
    t.start()
    wait_for(lambda: watching(lw))
    r.stop()
    t.join(2)
    assert not t.is_alive()
    assert lw.aborted == 1


def test_stop_interrupts_a_backoff(lw: FakeListerWatcher, clock: FakeClock) -> None:
    lw.fail_next_list(TransportError("refused"))
    r = Reflector(lw, Recorder(), clock=clock)
    t = threading.Thread(target=r.run)
    t.start()
    clock.wait_for_sleepers()
    r.stop()
    t.join(2)
    assert not t.is_alive()


def test_initial_resource_version_must_be_0_or_empty(lw: FakeListerWatcher) -> None:
    with pytest.raises(ValueError):
        Reflector(lw, Recorder(), initial_resource_version="12")


# -- against the real API server --------------------------------------------
#
# ConfigMaps stand in for any resource: they are cheap to make by the hundred.


def create_config_maps(api_client: Any, namespace: str, names: list[str], workers: int = 8) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def make(name: str) -> None:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"v": "1"}})

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(make, names))


# kube-controller-manager (running once any test of the session started it)
# publishes this ConfigMap into every namespace, at a moment of its choosing;
# the tests watch only the ConfigMaps they make.
NOT_PUBLISHED = "metadata.name!=kube-root-ca.crt"


def fresh_state(api_client: Any, namespace: str) -> dict[str, str]:
    """key → resourceVersion of every test ConfigMap in ``namespace``, read from the server now."""
    from kubernetes import client

    items = client.CoreV1Api(api_client).list_namespaced_config_map(
        namespace, field_selector=NOT_PUBLISHED).items
    return {f"{namespace}/{c.metadata.name}": c.metadata.resource_version for c in items}


def cache_state(indexer: Indexer) -> dict[str, str]:
    return {indexer.key_of(o): o["metadata"]["resourceVersion"] for o in indexer.list()}


def config_map_lw(api_client: Any, namespace: str) -> Any:
    from informers.api import RawClient, ResourceListerWatcher
    from informers.resource import CONFIG_MAPS

    return ResourceListerWatcher(RawClient(api_client), CONFIG_MAPS, namespace=namespace,
                                 field_selector=NOT_PUBLISHED)


def compact_like_the_apiserver(etcd_endpoint: str) -> int:
    """Compact etcd the way kube-apiserver's own compactor does.

    Besides compacting, it records the revision under ``compact_rev_key``:
    that key is how the API server (and its watch cache's list snapshots)
    learns of a compaction; a bare compaction goes unnoticed by the caches.
    """
    import base64
    import json
    import urllib.request

    def post(path: str, payload: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            etcd_endpoint + path, data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    key = base64.b64encode(b"compact_rev_key").decode()
    current = post("/v3/kv/range", {"key": key})
    rev = int(current["header"]["revision"])
    version = int(current["kvs"][0].get("version", 0)) if current.get("kvs") else 0
    post("/v3/kv/txn", {
        "compare": [{"key": key, "target": "VERSION", "result": "EQUAL", "version": str(version)}],
        "success": [{"requestPut": {"key": key, "value": base64.b64encode(str(rev).encode()).decode()}}],
        "failure": [{"requestRange": {"key": key}}],
    })
    post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
    return rev


@pytest.fixture
def run_real_reflector() -> Iterator[Any]:
    started: list[tuple[Reflector, threading.Thread]] = []

    def start(lw: Any, store: Recorder, **kwargs: Any) -> Reflector:
        r = Reflector(lw, store, name="plane", **kwargs)
        t = threading.Thread(target=r.run, daemon=True)
        t.start()
        started.append((r, t))
        return r

    yield start
    for r, t in started:
        r.stop()
        t.join(10)
        assert not t.is_alive(), "the reflector did not stop"


@pytest.mark.plane
@pytest.mark.parametrize(
    ("initial_rv", "pages"),
    [
        # A quorum list is paginated by etcd: 620 objects in pages of 200.
        pytest.param("", 4, id="quorum-list-in-pages"),
        # client-go's default; the watch cache answers it whole, limit or not.
        pytest.param("0", 1, id="watch-cache-list"),
    ],
)
def test_more_than_500_objects_are_listed_and_match_a_fresh_list(
    api_client: Any, namespace: str, run_real_reflector: Any, initial_rv: str, pages: int
) -> None:
    create_config_maps(api_client, namespace, [f"cm-{i:04d}" for i in range(620)])
    store = Recorder()
    # The paginated list itself, which WatchList (the default) would skip.
    r = run_real_reflector(
        config_map_lw(api_client, namespace), store, page_size=200, initial_resource_version=initial_rv,
        use_watch_list=False,
    )
    wait_for(lambda: r.stats.lists == 1, timeout=60, message="the first list")
    assert r.stats.last_list_pages == pages
    assert cache_state(store.indexer) == fresh_state(api_client, namespace)
    assert len(store.indexer) == 620


@pytest.mark.plane
def test_adds_updates_and_deletes_arrive_in_the_order_they_were_made(
    api_client: Any, namespace: str, run_real_reflector: Any
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    store = Recorder()
    r = run_real_reflector(config_map_lw(api_client, namespace), store)
    wait_for(lambda: r.stats.watches == 1, message="the watch to open")
    expected: list[tuple[str, str, str]] = []
    for i in range(5):
        made = core.create_namespaced_config_map(namespace, {"metadata": {"name": f"c{i}"}})
        expected.append(("Added", f"c{i}", made.metadata.resource_version))
        changed = core.patch_namespaced_config_map(f"c{i}", namespace, {"data": {"n": str(i)}})
        expected.append(("Updated", f"c{i}", changed.metadata.resource_version))
        if i % 2:
            core.delete_namespaced_config_map(f"c{i - 1}", namespace)
            expected.append(("Deleted", f"c{i - 1}", ""))
    wait_for(lambda: len(store.events) == len(expected), message=lambda: f"{store.events}")
    got = [(t, o["metadata"]["name"], o["metadata"]["resourceVersion"]) for t, _, o in store.events]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    assert [g[2] for g in got if g[0] != "Deleted"] == [e[2] for e in expected if e[0] != "Deleted"]
    rvs = [int(g[2]) for g in got]
    assert rvs == sorted(rvs), "resourceVersions only go up"
    assert cache_state(store.indexer) == fresh_state(api_client, namespace)


@pytest.mark.plane
def test_bookmarks_advance_the_resource_version_of_a_quiet_watch(
    api_client: Any, namespace: str, run_real_reflector: Any
) -> None:
    from kubernetes import client

    store = Recorder()
    inner = config_map_lw(api_client, namespace)
    watched_from: list[str] = []

    class RecordWatches:
        def list_page(self, **kw: Any) -> Any:
            return inner.list_page(**kw)

        def watch(self, **kw: Any) -> Any:
            watched_from.append(kw["resource_version"])
            return inner.watch(**kw)

        def abort(self) -> None:
            inner.abort()

    # The API server sends a bookmark 2s before a watch's timeout, so short
    # timeouts (3-6s) bring one soon.
    r = run_real_reflector(RecordWatches(), store, min_watch_timeout=3)
    wait_for(lambda: r.stats.watches >= 1)
    start_rv = int(r.last_sync_resource_version)
    # A ConfigMap in another namespace moves the ConfigMaps' resourceVersion
    # on; this watch (of one namespace) gets no event for it.
    core = client.CoreV1Api(api_client)
    elsewhere = core.create_namespace({"metadata": {"generateName": "elsewhere-"}}).metadata.name
    try:
        made = core.create_namespaced_config_map(elsewhere, {"metadata": {"name": "other"}})
        target = int(made.metadata.resource_version)
        assert target > start_rv
        wait_for(lambda: int(r.last_sync_resource_version) >= target, timeout=30,
                 message="a bookmark to carry the watch past the other write")
        assert r.stats.bookmarks >= 1
        assert r.stats.events == 0 and store.events == []
        # A later watch resumes from a bookmark's version, not the list's.
        wait_for(lambda: any(int(rv) >= target for rv in watched_from), timeout=30,
                 message=lambda: f"a watch from a bookmark's version; watched from {watched_from}")
    finally:
        core.delete_namespace(elsewhere)


@pytest.mark.plane
def test_an_etcd_compaction_in_the_middle_of_a_paginated_list_falls_back_to_a_full_list(
    control_plane: Any, api_client: Any, namespace: str, run_real_reflector: Any
) -> None:
    from kubernetes import client

    from informers.errors import ApiStatusError

    core = client.CoreV1Api(api_client)
    create_config_maps(api_client, namespace, [f"cm-{i:03d}" for i in range(300)])
    inner = config_map_lw(api_client, namespace)
    first_page_done = threading.Event()
    proceed = threading.Event()
    tokens: list[str] = []

    class PauseAfterFirstPage:
        def list_page(self, **kw: Any) -> Any:
            page = inner.list_page(**kw)
            if not kw["continue_token"] and page.continue_token and not first_page_done.is_set():
                tokens.append(page.continue_token)
                first_page_done.set()
                assert proceed.wait(120)
            return page

        def watch(self, **kw: Any) -> Any:
            return inner.watch(**kw)

        def abort(self) -> None:
            proceed.set()
            inner.abort()

    store = Recorder()
    r = run_real_reflector(PauseAfterFirstPage(), store, page_size=100, initial_resource_version="")
    assert first_page_done.wait(60)
    # Changes the first page's snapshot does not have, then a compaction past it.
    core.delete_namespaced_config_map("cm-000", namespace)
    core.delete_namespaced_config_map("cm-250", namespace)
    core.patch_namespaced_config_map("cm-001", namespace, {"data": {"v": "2"}})
    create_config_maps(api_client, namespace, ["cm-new"])
    compact_like_the_apiserver(control_plane.etcd_endpoint)

    def token_expired() -> bool:
        try:
            inner.list_page(resource_version="", limit=100, continue_token=tokens[0])
        except ApiStatusError as e:
            return e.expired
        return False

    # The API server's caches poll for compactions every 15s.
    wait_for(token_expired, timeout=60, interval=1, message="the continue token to expire")
    proceed.set()
    wait_for(lambda: r.stats.lists == 1, timeout=60, message="the list to finish")
    assert r.stats.paginated_fallbacks == 1
    assert cache_state(store.indexer) == fresh_state(api_client, namespace)
    assert "default/cm-000" not in store.indexer.list_keys()
