"""Decoding list answers item by item as they arrive, and classifying API errors."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import orjson
import pytest

from informers.api import _read_list_streamed, _UnexpectedListFormat
from informers.errors import ApiStatusError


class ChunkedResponse:
    """Stands in for a urllib3 response: yields ``body`` in pieces of ``size``."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body = body
        self.size = size

    def stream(self, amt: int, decode_content: bool = True) -> Iterator[bytes]:
        for i in range(0, len(self.body), self.size):
            yield self.body[i : i + self.size]


def go_json(doc: Any) -> bytes:
    # The API server's encoding: compact, no spaces.
    return orjson.dumps(doc)


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p{i}", "namespace": "ns", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs"},
            {"apiVersion": "apps/v1", "kind": "Other", "name": "x"}]},
        "spec": {
            # Embedded objects whose first key is the item's first key: cuts
            # inside an item that must be joined again.
            "templates": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
            "tolerations": [{"key": "k", "value": '},{"metadata": inside a string'}],
        },
    }


def custom(i: int) -> dict[str, Any]:
    return {"apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClaim",
            "metadata": {"name": f"c{i}", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p"}, {"apiVersion": "v1", "kind": "Pod", "name": "q"}]},
            "spec": {"className": "a100", "count": 1}}


BUILTIN_LIST = go_json({
    "kind": "PodList", "apiVersion": "v1",
    "metadata": {"resourceVersion": "42", "continue": "tok"},
    "items": [pod(i) for i in range(7)],
})
# Custom resource lists are encoded from a map: sorted keys, metadata last.
CUSTOM_LIST = go_json({
    "apiVersion": "gpuclaimctl.io/v1alpha1",
    "items": [custom(i) for i in range(5)],
    "kind": "GPUClaimList",
    "metadata": {"continue": "", "resourceVersion": "77"},
})
EMPTY_LIST = go_json({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": []})


@pytest.mark.parametrize("body", [BUILTIN_LIST, CUSTOM_LIST, EMPTY_LIST], ids=["builtin", "custom", "empty"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1000, 1 << 20])
def test_a_list_decoded_item_by_item_equals_the_list_decoded_whole(body: bytes, size: int) -> None:
    items, meta = _read_list_streamed(ChunkedResponse(body, size), None)  # type: ignore[arg-type]
    whole = orjson.loads(body)
    assert items == whole["items"]
    assert meta == whole["metadata"]


def test_each_item_is_transformed_as_it_is_decoded() -> None:
    seen: list[str] = []

    def mark(obj: dict[str, Any]) -> dict[str, Any]:
        seen.append(obj["metadata"]["name"])
        return {"name": obj["metadata"]["name"]}

    items, _ = _read_list_streamed(ChunkedResponse(BUILTIN_LIST, 100), mark)  # type: ignore[arg-type]
    assert items == [{"name": f"p{i}"} for i in range(7)]
    assert seen == [f"p{i}" for i in range(7)]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(orjson.dumps({"kind": "Status", "code": 200}), id="no-items"),
        pytest.param(b'{"metadata":{},"items":[{"metadata":{}}, {"metadata":{}}]}', id="spaces-between-items"),
        pytest.param(b'{"metadata":{},"items":[{"metadata":{}},{"metadata":', id="cut-short"),
    ],
)
def test_an_unexpected_shape_is_reported_so_the_caller_decodes_whole(body: bytes) -> None:
    with pytest.raises((_UnexpectedListFormat, orjson.JSONDecodeError)):
        _read_list_streamed(ChunkedResponse(body, 5), None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "expired", "too_large", "retriable"),
    [
        pytest.param({"code": 410, "reason": "Expired"}, True, False, False, id="410-expired"),
        pytest.param({"code": 410, "reason": "Gone"}, True, False, False, id="410-gone"),
        pytest.param({"code": 429, "reason": "TooManyRequests"}, False, False, True, id="429"),
        pytest.param({"code": 503}, False, False, True, id="503"),
        pytest.param({"code": 504, "reason": "Timeout", "message": "Too large resource version: 5, current: 3",
                      "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]}},
                     False, True, True, id="too-large-rv"),
        pytest.param({"code": 403, "reason": "Forbidden"}, False, False, False, id="403"),
    ],
)
def test_status_errors_are_classified_the_way_the_reflector_needs(
    status: dict[str, Any], expired: bool, too_large: bool, retriable: bool
) -> None:
    e = ApiStatusError.from_status({"kind": "Status", **status})
    assert (e.expired, e.too_large_resource_version, e.retriable) == (expired, too_large, retriable)


def test_retry_after_comes_from_the_status_details_or_the_header() -> None:
    e = ApiStatusError.from_status({"code": 429, "details": {"retryAfterSeconds": 3}})
    assert e.retry_after == 3
    e = ApiStatusError.from_status({"code": 429}, retry_after=5)
    assert e.retry_after == 5


# -- a silent server: read timeout and prompt close ------------------------------


class SilentServer:
    """Answers one request with the start of a chunked 200, then says nothing more."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.conns: list[Any] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def lister_watcher_for(port: int) -> Any:
    from kubernetes import client

    from informers.api import RawClient, ResourceListerWatcher
    from informers.resource import CONFIG_MAPS

    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    return ResourceListerWatcher(RawClient(api), CONFIG_MAPS)


def test_a_watch_on_a_dead_connection_ends_after_the_client_read_timeout(
    silent_server: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import informers.api
    from informers.errors import TransportError

    # Server timeout 1s + margin 0.5s: a healthy server would have ended the
    # watch by then, so silence that long means the connection is dead.
    monkeypatch.setattr(informers.api, "WATCH_READ_MARGIN", 0.5)
    stream = lister_watcher_for(silent_server.port).watch(resource_version="1", timeout_seconds=1)
    started = time.monotonic()
    with pytest.raises(TransportError):
        list(stream)
    assert 1.0 <= time.monotonic() - started < 10


def test_closing_a_watch_from_another_thread_ends_its_reader_at_once(silent_server: SilentServer) -> None:
    import sys
    import threading
    import time

    from tests.helpers import wait_for

    stream = lister_watcher_for(silent_server.port).watch(resource_version="1", timeout_seconds=600)
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(list(stream))
        except Exception as e:  # pragma: no cover - reported below
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def reader_blocked_in_a_socket_read() -> bool:
        frame = sys._current_frames().get(reader.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "readinto" and "socket" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    wait_for(reader_blocked_in_a_socket_read, timeout=10, message="the reader to block on the socket")
    started = time.monotonic()
    stream.close()
    reader.join(5)
    assert not reader.is_alive() and time.monotonic() - started < 2
    assert outcome == [[]], "a closed watch ends quietly, not with an error"


# -- the watch's chunked body, taken apart by informers.api._dechunked ------------------

def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _events(n: int) -> list[bytes]:
    return [orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": f"p{i}"}, "pad": "x" * (i * 37)}})
            + b"\n" for i in range(n)]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1000, 1 << 16])
def test_a_chunked_body_read_in_blocks_of_any_size_gives_back_its_payload(block: int) -> None:
    from informers.api import _dechunked

    events = _events(40)
    # One event per chunk (as the API server writes), an event split over
    # two chunks, two events in one chunk, and a chunk extension.
    pieces = events[:10] + [events[10][:5], events[10][5:]] + [events[11] + events[12]] + events[13:]
    body = _chunked(pieces).replace(b"\r\n", b";ext=1\r\n", 1)
    stream = iter(body[i:i + block] for i in range(0, len(body), block))
    out = b"".join(_dechunked(lambda _n: next(stream, b"")))
    assert out == b"".join(events)


def test_a_chunked_body_cut_short_or_malformed_is_an_error() -> None:
    from informers.api import _dechunked

    body = _chunked(_events(3))
    for bad in (body[:-5], b"zz\r\nabc\r\n"):
        blocks = iter([bad])
        with pytest.raises(OSError):
            b"".join(_dechunked(lambda _n: next(blocks, b"")))


class ChunkedServer:
    """A local HTTP/1.1 server answering every GET with `write(wfile)`'s
    chunked body, each chunk flushed by itself as the API server does."""

    def __init__(self, write: Callable[[Any], None]) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                write(self.wfile)
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def watch(self, gather: float = 0.0, initial_gather: float | None = None) -> Any:
        import urllib3

        from informers.api import HttpWatchStream, _raw_chunked

        resp = urllib3.PoolManager().request(
            "GET", f"http://127.0.0.1:{self._server.server_address[1]}/", preload_content=False)
        assert _raw_chunked(resp) is not None  # the fast path is taken
        return HttpWatchStream(resp, gather=gather, initial_gather=initial_gather)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _write_chunk(wfile: Any, payload: bytes) -> None:
    wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
    wfile.flush()


@pytest.mark.parametrize("gather", [0.0, 0.01], ids=["read-as-they-come", "gathered"])
def test_a_real_chunked_watch_response_is_read_around_urllib3(gather: float) -> None:
    """The API server's shape end to end: a chunked HTTP/1.1 response read
    with urllib3's response object, as HttpWatchStream gets it."""
    events = _events(200)

    def write(wfile: Any) -> None:
        for e in events:
            _write_chunk(wfile, e)

    server = ChunkedServer(write)
    try:
        got = [obj["metadata"]["name"] for _t, obj in server.watch(gather)]
    finally:
        server.close()
    assert got == [f"p{i}" for i in range(200)]


def test_a_gathering_reader_sleeps_only_when_nothing_is_waiting_on_the_socket() -> None:
    import socket

    from informers.api import _STREAM_CHUNK, _gathering

    ours, theirs = socket.socketpair()
    fp = ours.makefile("rb")  # a BufferedReader over a SocketIO, as http.client reads
    slept: list[float] = []
    try:
        idle = _gathering(fp, lambda: 0.0, sleep=slept.append)
        assert idle is not None
        idle()
        assert slept == [], "no window, no wait"
        wait = _gathering(fp, lambda: 0.25, sleep=slept.append)
        assert wait is not None
        wait()
        assert slept == [0.25], "nothing waiting: the events to come gather first"
        theirs.sendall(b"x" * 100)
        wait()
        assert slept == [0.25], "bytes waiting in the kernel are read at once"
        assert fp.read1(_STREAM_CHUNK) == b"x" * 100
        wait()
        assert slept == [0.25, 0.25], "all read: gather again"
    finally:
        fp.close()
        ours.close()
        theirs.close()


def test_a_watch_event_after_a_quiet_spell_is_read_at_once_however_long_the_window() -> None:
    """The window delays only events that come while the reader gathers:
    the one that ends a quiet spell finds the reader blocked and is read at
    once. A reader that slept after a read would hold it up to the window."""
    import threading
    import time

    events = _events(2)
    sent: list[float] = []
    go = threading.Event()

    def write(wfile: Any) -> None:
        _write_chunk(wfile, events[0])
        go.wait(10)
        time.sleep(1.5)  # quiet for longer than the window
        sent.append(time.monotonic())
        _write_chunk(wfile, events[1])

    server = ChunkedServer(write)
    try:
        stream = iter(server.watch(gather=1.0))
        next(stream)
        go.set()
        next(stream)
        received = time.monotonic()
    finally:
        server.close()
    assert received - sent[0] < 0.5, f"the event waited {received - sent[0]:.2f}s for the window"


def test_a_watch_list_reads_its_initial_events_with_the_short_window_and_the_rest_with_the_long() -> None:
    """Initial events come as fast as the server encodes them: the long
    window would hold the sync back, so it applies only after the bookmark
    that ends them. Here the initial window is 0 and the long one 1 s: the
    bookmark, sent 0.2 s after the first event, is read at once; the event
    after it, sent 0.2 s later, waits for the reader's 1 s sleep."""
    import threading
    import time

    bookmark = orjson.dumps({"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": "9", "annotations": {"k8s.io/initial-events-end": "true"}}}}) + b"\n"
    first, last = _events(2)
    go = threading.Event()

    def write(wfile: Any) -> None:
        _write_chunk(wfile, first)
        go.wait(10)
        time.sleep(0.2)
        _write_chunk(wfile, bookmark)
        time.sleep(0.2)
        _write_chunk(wfile, last)

    server = ChunkedServer(write)
    try:
        stream = iter(server.watch(gather=1.0, initial_gather=0.0))
        assert next(stream)[0] == "ADDED"
        started = time.monotonic()
        go.set()
        assert next(stream)[0] == "BOOKMARK"
        bookmarked = time.monotonic()
        assert next(stream)[0] == "ADDED"
        received = time.monotonic()
    finally:
        server.close()
    assert bookmarked - started < 0.9, f"an initial event waited {bookmarked - started:.2f}s"
    assert received - bookmarked >= 0.9, f"after the initial events, {received - bookmarked:.2f}s"
