"""client.http11: the controller's requests over kept-alive HTTP/1.1
connections, against a scripted server on loopback (a real socket; the
real-plane tests send every write of the controller through it over TLS)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import urllib3
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError
from gpuclaimctl.client.http11 import Http11, HttpError

# What the server does with one request on a connection: returns the bytes
# to answer, or None to close the connection without answering.
Answer = Callable[[bytes], "bytes | None"]


class Server:
    """Accepts connections; answers each request by the next scripted answer
    (the last one repeats). Counts connections and keeps the requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.hang_up_after_answer = False  # close the connection without saying so
        self.trickle = False  # send each answer a few bytes at a time
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        with conn:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + (f.read(length) if length else b"")
                self.requests.append(request)
                answer = (self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])(request)
                if answer is None:
                    return
                if self.trickle:
                    for i in range(0, len(answer), 3):
                        conn.sendall(answer[i:i + 3])
                        time.sleep(0.001)
                else:
                    conn.sendall(answer)
                if b"Connection: close" in answer.split(b"\r\n\r\n")[0] or self.hang_up_after_answer:
                    return

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def ok(body: bytes, extra: str = "") -> Answer:
    return lambda _r: (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body)


def chunked(*pieces: bytes) -> Answer:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return lambda _r: b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + body


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Server, Http11]]]:
    made: list[tuple[Server, Http11]] = []

    def make(*answers: Answer) -> tuple[Server, Http11]:
        server = Server(*answers)
        pool = urllib3.PoolManager().connection_from_url(f"http://127.0.0.1:{server.port}")
        made.append((server, Http11(pool)))
        return made[-1]

    yield make
    for server, transport in made:
        transport.close()
        server.close()


def test_answers_with_a_length_or_in_chunks_come_back_whole_over_one_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(ok(b'{"a":1}'), chunked(b'{"b":', b"2}"), ok(b""))
    assert http.request("GET", "/x", {"Accept": "application/json"}, None, 5) == (200, b'{"a":1}')
    assert http.request("POST", "/y?z=1", {}, b'{"c":3}', 5) == (201, b'{"b":2}')
    assert http.request("PATCH", "/y", {}, b"[]", 5) == (200, b"")
    assert server.connections == 1  # kept alive
    first, second, _ = server.requests
    assert first.startswith(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:") and b"Accept: application/json" in first
    assert second.startswith(b"POST /y?z=1 HTTP/1.1\r\n") and second.endswith(b'Content-Length: 7\r\n\r\n{"c":3}')


def test_a_connection_the_server_closed_while_idle_is_not_reused(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(ok(b"1", "Connection: keep-alive\r\n"))
    assert http.request("GET", "/", {}, None, 5) == (200, b"1")
    server.answers = [ok(b"2", "Connection: close\r\n")]
    assert http.request("GET", "/", {}, None, 5) == (200, b"2")  # then closed by both
    server.answers = [ok(b"3")]
    assert http.request("GET", "/", {}, None, 5) == (200, b"3")
    assert server.connections == 2


def test_an_idle_connection_closed_by_the_server_is_replaced(serve) -> None:  # type: ignore[no-untyped-def]
    """As an idle timeout closes it: the next request notices (the socket
    is readable at EOF) and opens a new connection instead of failing."""
    server, http = serve(ok(b"1"))
    server.hang_up_after_answer = True
    assert http.request("GET", "/", {}, None, 5) == (200, b"1")
    assert len(http._idle) == 1  # the answer did not say it would close
    time.sleep(0.1)  # the FIN arrives
    server.hang_up_after_answer = False
    assert http.request("GET", "/", {}, None, 5) == (200, b"1")
    assert server.connections == 2


def test_no_answer_in_time_is_an_error_and_the_connection_is_dropped(serve) -> None:  # type: ignore[no-untyped-def]
    def silent(_r: bytes) -> bytes | None:
        time.sleep(2)
        return None

    server, http = serve(silent)
    started = time.monotonic()
    with pytest.raises(HttpError):
        http.request("POST", "/", {}, b"{}", 0.3)
    assert time.monotonic() - started < 1.5
    assert http._idle == []


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # cut short
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
])
def test_a_malformed_or_cut_answer_is_an_error(serve, answer: bytes) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(lambda _r: answer)
    with pytest.raises(HttpError):
        http.request("GET", "/", {}, None, 1)
    assert http._idle == []


def test_an_answer_with_no_length_runs_to_the_end_of_the_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(lambda _r: b"HTTP/1.1 200 OK\r\n\r\nall of it")
    server.hang_up_after_answer = True
    assert http.request("GET", "/", {}, None, 5) == (200, b"all of it")
    assert http._idle == []


def test_an_answer_whose_head_comes_in_pieces_or_with_bare_line_feeds_is_read_whole(serve) -> None:  # type: ignore[no-untyped-def]
    """The head is split at once when the reader holds all of it, else read
    line by line: both give the same answer."""
    server, http = serve(ok(b'{"a":1}', "Audit-Id: 1\r\nConnection: keep-alive\r\n"),
                         lambda _r: b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi")
    server.trickle = True
    assert http.request("GET", "/", {}, None, 5) == (200, b'{"a":1}')
    server.trickle = False
    assert http.request("GET", "/", {}, None, 5) == (200, b"hi")
    assert server.connections == 1


def test_204_and_interim_answers(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(lambda _r: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert http.request("DELETE", "/", {}, None, 5) == (204, b"")
    assert http.request("DELETE", "/", {}, None, 5) == (204, b"")
    assert server.connections == 1


def test_a_header_or_target_with_a_line_break_is_refused_before_sending(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(ok(b""))
    with pytest.raises(ValueError):
        http.request("GET", "/", {"Authorization": "Bearer x\r\nX-Evil: 1"}, None, 5)
    with pytest.raises(ValueError):
        http.request("GET", "/a b", {}, None, 5)
    assert server.requests == []


def test_kube_request_goes_through_it_with_the_servers_path_prefix() -> None:
    """A real kubernetes ApiClient: kube.request uses the lean transport for
    it, keeps the URL's path (a proxy's prefix), and still maps answers to
    ApiError."""
    server = Server(ok(b'{"kind":"Pod"}'), lambda _r: (
        b'HTTP/1.1 409 Conflict\r\nContent-Length: 62\r\n\r\n'
        b'{"kind":"Status","reason":"Conflict","message":"it moved on!"}'))
    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.port}/k8s/c-1"))
        assert kube.request_json(api, "GET", "/api/v1/pods", query=[("labelSelector", "a b")]) == {"kind": "Pod"}
        with pytest.raises(ApiError) as e:
            kube.request(api, "PUT", "/api/v1/x", body={"a": 1})
        assert e.value.status == 409
        assert server.requests[0].startswith(b"GET /k8s/c-1/api/v1/pods?labelSelector=a%20b HTTP/1.1")
        assert server.connections == 1
        assert kube._transport(api, f"http://127.0.0.1:{server.port}/k8s/c-1") is not None
    finally:
        server.close()


def test_a_client_with_a_proxy_keeps_urllib3() -> None:
    configuration = client.Configuration(host="https://10.0.0.1:6443")
    configuration.proxy = "http://proxy:3128"
    assert Http11.for_client(client.ApiClient(configuration), "https://10.0.0.1:6443") is None


def test_a_write_whose_process_paused_after_the_fence_check_never_leaves() -> None:
    """DESIGN I3: the fence passed, then the process was stopped (SIGSTOP)
    past its lease before the request went out. When it runs again, the
    request must not leave with a timeout taken afresh: the fence is asked
    again right before the bytes are sent."""
    from gpuclaimctl.client.fence import NotLeader, WriteFence
    from tests.test_kube_ratelimit import FakeTime

    server = Server(ok(b"{}"))
    fake = FakeTime()
    fence = WriteFence(fake.clock)
    fence.extend(fake.now, 3.0, 4.0)

    def stopped_right_after_the_check() -> float:
        left = fence.check()
        fake.now += 30.0  # SIGSTOP ... SIGCONT, well past the lease
        return left

    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.port}"))
        with pytest.raises(NotLeader):
            kube.request(api, "PUT", "/apis/x/v1/namespaces/ns/things/a", body={"a": 1},
                         fence=stopped_right_after_the_check)
        time.sleep(0.2)  # anything sent would have reached the server by now
        assert server.requests == []
    finally:
        server.close()


# -- pipelining (the event recorder's batches) ---------------------------------------------


def _requests(n: int) -> list[tuple[str, str, dict[str, str], bytes | None]]:
    return [("POST", f"/e/{i}", {"Content-Type": "application/json"}, b'{"n":%d}' % i) for i in range(n)]


def test_pipelined_requests_are_answered_in_order_over_one_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server, http = serve(ok(b"one"), chunked(b"tw", b"o"), ok(b"three"))
    assert http.pipeline(_requests(3), 5) == [(200, b"one"), (201, b"two"), (200, b"three")]
    assert [r.split(b" ")[1] for r in server.requests] == [b"/e/0", b"/e/1", b"/e/2"]
    assert all(r.endswith(b'{"n":%d}' % i) for i, r in enumerate(server.requests))
    assert http.request("GET", "/after", {}, None, 5) == (200, b"three")
    assert server.connections == 1


@pytest.mark.parametrize("then", [
    pytest.param([ok(b"one", "Connection: close\r\n")], id="an answer that closes the connection"),
    pytest.param([ok(b"one"), lambda _r: None], id="a hang-up after the first answer"),
])
def test_requests_left_without_an_answer_are_errors_and_the_connection_is_dropped(serve, then) -> None:  # type: ignore[no-untyped-def]
    """Whether they were served or not (after a close they were not, after a
    hang-up a caller cannot know), each is an HttpError, as a request
    without an answer; the next request goes on a new connection."""
    server, http = serve(*then, ok(b"later"))
    answers = http.pipeline(_requests(3), 5)
    assert answers[0] == (200, b"one")
    assert all(isinstance(a, HttpError) for a in answers[1:]), answers
    assert http.request("GET", "/after", {}, None, 5) == (200, b"later")
    assert server.connections == 2


def test_a_fence_that_refuses_keeps_the_whole_pipeline_in(serve) -> None:  # type: ignore[no-untyped-def]
    from gpuclaimctl.client.fence import NotLeader

    def refuse() -> float:
        raise NotLeader("the lease is gone")

    server, http = serve(ok(b"{}"))
    with pytest.raises(NotLeader):
        http.pipeline(_requests(2), 5, refuse)
    time.sleep(0.2)
    assert server.requests == []


def test_kube_request_many_maps_each_answer_and_keeps_the_order() -> None:
    server = Server(ok(b'{"n":0}'), lambda _r: (
        b'HTTP/1.1 409 Conflict\r\nContent-Length: 67\r\n\r\n'
        b'{"kind":"Status","reason":"AlreadyExists","message":"it is there!"}'), ok(b""))
    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.port}/k8s"))
        out = kube.request_many(api, [("POST", "/api/v1/namespaces/a/events", {"n": 0}, "application/json"),
                                      ("POST", "/api/v1/namespaces/a/events", {"n": 1}, "application/json"),
                                      ("PATCH", "/api/v1/namespaces/a/events/x", {"count": 2},
                                       "application/strategic-merge-patch+json")],
                                fence=lambda: 3.0)  # the server's deadline: a third each
        assert out[0] == b'{"n":0}' and out[2] == b""
        assert isinstance(out[1], ApiError) and out[1].status == 409
        assert server.connections == 1
        lines = [re.sub(rb"timeout=\d+ms", b"timeout=Tms", r.split(b"\r\n")[0]) for r in server.requests]
        assert lines == [b"POST /k8s/api/v1/namespaces/a/events?timeout=Tms HTTP/1.1",
                         b"POST /k8s/api/v1/namespaces/a/events?timeout=Tms HTTP/1.1",
                         b"PATCH /k8s/api/v1/namespaces/a/events/x?timeout=Tms HTTP/1.1"]
        assert all(900 <= t <= 1000 for t in _server_deadlines(server))
        assert b"Content-Type: application/strategic-merge-patch+json" in server.requests[2]
    finally:
        server.close()


def _server_deadlines(server: Server) -> list[int]:
    return [int(m.group(1)) for r in server.requests if (m := re.search(rb"timeout=(\d+)ms", r))]


def test_the_servers_deadline_is_the_time_left_at_the_send_not_before_connecting() -> None:
    """DESIGN I3: the fence's first answer (10 s) came before a connection
    was made; by the send it says 2 s. The API server is given 2 s, not 10:
    else it could work on the write for 8 s past the Lease. A pipeline's
    requests share it."""
    answers = iter([10.0, 2.0, 10.0, 2.0])
    server = Server(ok(b"{}"))
    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.port}"))
        kube.request(api, "PUT", "/apis/x/v1/namespaces/ns/things/a", body={"a": 1},
                     fence=lambda: next(answers))
        kube.request_many(api, [("POST", "/api/v1/namespaces/a/events", {"n": i}, "application/json")
                                for i in range(4)], fence=lambda: next(answers))
        first, *shares = _server_deadlines(server)
        assert 1900 <= first <= 2000
        assert len(shares) == 4 and all(450 <= t <= 500 for t in shares), shares
    finally:
        server.close()


def test_a_pipeline_that_cannot_connect_answers_each_request_with_an_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    http = Http11(urllib3.PoolManager().connection_from_url(f"http://127.0.0.1:{port}"))
    answers = http.pipeline(_requests(3), 2)
    assert len(answers) == 3 and all(isinstance(a, HttpError) for a in answers)


def test_through_urllib3_a_fence_closing_midway_takes_the_unsent_requests_places() -> None:
    """Behind a proxy the requests go one by one, each fenced: once the
    fence refuses, that request and the rest are the NotLeader, not sent."""
    from gpuclaimctl.client.fence import NotLeader

    server = Server(ok(b"{}"))
    checks = iter([5.0, 5.0, 5.0])

    def fence() -> float:
        left = next(checks, None)
        if left is None:
            raise NotLeader("the lease is gone")
        return left

    try:
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.port}"))
        kube._TRANSPORTS[api] = (kube._prepared(api, "application/json")[0], None)  # urllib3
        out = kube.request_many(api, [("POST", "/api/v1/namespaces/a/events", {"n": i}, "application/json")
                                      for i in range(4)], fence=fence)
        assert out[:2] == [b"{}", b"{}"]
        assert all(isinstance(o, NotLeader) for o in out[2:])
        assert len(server.requests) == 2
    finally:
        server.close()
