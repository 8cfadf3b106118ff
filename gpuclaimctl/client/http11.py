"""The controller's requests over kept-alive HTTP/1.1 connections, without
urllib3's and http.client's per-request machinery.

A write is the controller's main cost: each pod takes three writes and an
event. Through urllib3 (PoolManager, connection pool, http.client, headers
parsed by the `email` package) one request cost about 520 us of CPU more
than the exchange itself on the wire (`make bench-http`: 640 us vs 120 us
per PATCH against the plane's API server; about 180 us here). This
module sends the request line and headers in one `sendall` and reads the
answer with a buffered reader: status line, headers (only Content-Length,
Transfer-Encoding and Connection are interpreted), body.

Connections are still made by urllib3's connection pool for the API
server's URL, so TLS is set up exactly as the official client configures
it (CA, client certificate, server name, verification); a client with a
proxy is not served here (`Http11.for_client` says None) and keeps the
urllib3 path. Nothing is retried: an error closes the connection and is
raised, as urllib3 with `retries=False` does; the controller's syncs retry
with backoff, and every write it sends is safe to send again (creates
answer AlreadyExists, updates carry a resourceVersion, the release patch
tests what it read).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, Callable, Sequence

# A status line or header line longer than this is not the API server.
_MAX_LINE = 65536
_MAX_HEADERS = 100
_NO_BODY_STATUS = (204, 304)


class HttpError(OSError):
    """The exchange failed (connection lost, timed out, or a malformed
    answer); the connection is closed. An OSError, as urllib3's are
    caught by the callers."""


class Http11:
    """Kept-alive connections to one API server, each used by one request at a time."""

    def __init__(self, pool: Any, *, max_idle: int = 32) -> None:
        """`pool`: urllib3's HTTPConnectionPool (or HTTPSConnectionPool)
        for the server, which makes (and sets up TLS on) each connection."""
        self._pool = pool
        self._host = f"{pool.host}:{pool.port}" if pool.port else str(pool.host)
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []

    @classmethod
    def for_client(cls, api_client: Any, base: str) -> Http11 | None:
        """An Http11 for the official client's server at URL `base`, or None
        where it cannot serve (a proxy, no urllib3 pool manager)."""
        configuration = getattr(api_client, "configuration", None)
        if configuration is None or getattr(configuration, "proxy", None):
            return None
        manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
        if manager is None or not hasattr(manager, "connection_from_url"):
            return None
        pool = manager.connection_from_url(base)
        if not hasattr(pool, "_new_conn"):
            return None
        return cls(pool, max_idle=int(getattr(getattr(pool, "pool", None), "maxsize", 0) or 32))

    def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None,
                timeout: float, fence: Callable[[], float] | None = None, *,
                server_deadline: bool = False) -> tuple[int, bytes]:
        """Send one request; return (status, body). `target`: path and query.
        `timeout` bounds the whole exchange, connecting included. `fence`,
        when given, is called again once the connection is ready, right
        before the first byte of the request is sent (DESIGN I3): what it
        raises stops the request there, and what it returns cuts the time
        left. A check made earlier by the caller is not enough: a pause
        (SIGSTOP) after it, before this deadline was taken, would let the
        write leave with a fresh timeout once the process runs again.
        With `server_deadline`, the time left then is also sent as the API
        server's own deadline (`timeout=` in the query): see `_Outgoing`."""
        answers = self.pipeline([(method, target, headers, body)], timeout, fence,
                                server_deadline=server_deadline)
        answer = answers[0]
        if isinstance(answer, HttpError):
            raise answer
        return answer

    def pipeline(self, requests: Sequence[tuple[str, str, dict[str, str], bytes | None]],
                 timeout: float, fence: Callable[[], float] | None = None, *,
                 server_deadline: bool = False) -> list[tuple[int, bytes] | HttpError]:
        """Send `requests` (method, target, headers, body) back to back on one
        connection and read their answers in order (HTTP/1.1 pipelining, RFC
        9112 9.3.2); return one (status, body) per request, or an HttpError
        where no answer came: the connection could not be made, broke,
        timed out or was closed by the server before it. Such a request may
        or may not have been served, as for `request`. `timeout` bounds the
        whole exchange; `fence` is called once, right before the first byte
        leaves, and what it raises stops every request.

        The RFC's caution about pipelining a non-idempotent request (a
        POST) is about not knowing which of them were served when the
        connection breaks; the caller must be able to tell (the event
        recorder's creates have names of their own: one sent again is
        refused as AlreadyExists)."""
        deadline = time.monotonic() + timeout
        outgoing = _Outgoing(requests, self._host, server_deadline)  # a bad target raises here
        try:
            conn = self._take(deadline)
        except OSError as e:
            failed = e if isinstance(e, HttpError) else HttpError(f"connecting: {e}")
            return [failed for _ in requests]
        answers: list[tuple[int, bytes] | HttpError] = []
        keep = False
        try:
            deadline = conn.send(outgoing, deadline, fence)
            for _ in requests:
                status, body, keep = conn.answer(deadline)
                answers.append((status, body))
                if not keep:
                    break
        except HttpError as e:
            conn.close()
            answers.extend(e for _ in range(len(requests) - len(answers)))
            return answers
        except BaseException:
            conn.close()
            raise
        if keep:
            self._give(conn)
        else:
            conn.close()
            lost = HttpError("the server closed the connection before answering")
            answers.extend(lost for _ in range(len(requests) - len(answers)))
        return answers

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, deadline: float) -> _Conn:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return _Conn.open(self._pool, deadline)
            if conn.usable():
                return conn
            conn.close()  # the server closed it while it was idle

    def _give(self, conn: _Conn) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()


class _Outgoing:
    """The bytes of requests about to be sent, made when they leave.

    With `server_deadline`, each request's target gets the API server's own
    deadline (`timeout=<ms>`, as client-go sends it), taken from the time
    left right before sending, after the fence's last cut: a deadline
    taken before connecting would let the server work on the write for as
    long as the connecting took past the Lease (DESIGN I3). The server
    works on pipelined requests one after another, each from when it reads
    it, so n requests get a share of the time left each and end by its end.
    """

    def __init__(self, requests: Sequence[tuple[str, str, dict[str, str], bytes | None]],
                 host: str, server_deadline: bool) -> None:
        # Made now, once: a bad target or header is refused before a
        # connection is taken. With `server_deadline`, each request is kept
        # in two parts around the end of its target (which has no space),
        # where `data` puts the deadline.
        heads = [(_head(method, target, host, headers, body), body or b"")
                 for method, target, headers, body in requests]
        self._fixed = None if server_deadline else b"".join(h + b for h, b in heads)
        self._split = [(*head.split(_AFTER_TARGET, 1), body) for head, body in heads] if server_deadline else []

    def data(self, left: float) -> bytes:
        if self._fixed is not None:
            return self._fixed
        share = b"timeout=%dms" % max(1, int(left / max(1, len(self._split)) * 1000))
        return b"".join(line + (b"&" if b"?" in line else b"?") + share + _AFTER_TARGET + rest + body
                        for line, rest, body in self._split)


_AFTER_TARGET = b" HTTP/1.1\r\n"


def _head(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        value = str(value)
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break")
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    if " " in target or "\r" in target or "\n" in target:
        raise ValueError(f"request target {target[:80]!r} has a space or a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _status(line: bytes) -> int:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.1 status line: {parts[:2]!r}")
    return int(parts[1])


def _fields(lines: list[bytes]) -> dict[str, str]:
    """The header fields this client interprets (Content-Length,
    Transfer-Encoding, Connection), lower-cased names."""
    fields: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError("a header line without a colon")
        key = name.strip().lower().decode("latin-1")
        if key in ("content-length", "transfer-encoding", "connection"):
            fields[key] = value.strip().decode("latin-1")
    return fields


class _Conn:
    def __init__(self, conn: Any) -> None:
        self._conn = conn  # urllib3's connection: closes the socket (TLS included)
        self.sock: socket.socket = conn.sock
        self._file = self.sock.makefile("rb")
        # For `usable`: made once, as select.select per reuse cost a write
        # about 7 us of CPU (make bench-http's Http11 beside the floor).
        self._readable = select.poll()
        self._readable.register(self.sock.fileno(), select.POLLIN)

    @classmethod
    def open(cls, pool: Any, deadline: float) -> _Conn:
        conn = pool._new_conn()
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError("timed out before connecting")
        conn.timeout = left
        try:
            conn.connect()
        except Exception as e:
            conn.close()
            raise HttpError(f"connecting to {pool.host}:{pool.port}: {e}") from e
        return cls(conn)

    def usable(self) -> bool:
        """False if the server closed the connection (or sent something
        unasked) while it was idle, as urllib3 checks before reuse."""
        try:
            return not self._readable.poll(0)
        except (OSError, ValueError):
            return False

    def send(self, outgoing: _Outgoing, deadline: float, fence: Callable[[], float] | None = None) -> float:
        """Send the requests; return the deadline, cut by what `fence`,
        called right before, allows."""
        if fence is not None:
            # Raises (NotLeader: not an OSError) to keep the request in.
            deadline = min(deadline, time.monotonic() + fence())
        try:
            self._timeout(deadline)
            self.sock.sendall(outgoing.data(deadline - time.monotonic()))
        except (OSError, ValueError) as e:
            if isinstance(e, HttpError):
                raise
            raise HttpError(f"HTTP exchange failed: {e}") from e
        return deadline

    def answer(self, deadline: float) -> tuple[int, bytes, bool]:
        """The next answer: status, body, and whether the connection may be
        used again."""
        try:
            status, fields = self._read_head(deadline)
            while 100 <= status < 200:  # an interim answer: the real one follows
                status, fields = self._read_head(deadline)
            data, to_eof = self._read_body(status, fields, deadline)
        except (OSError, ValueError) as e:
            if isinstance(e, HttpError):
                raise
            raise HttpError(f"HTTP exchange failed: {e}") from e
        keep = not to_eof and fields.get("connection", "").lower() != "close"
        return status, data, keep

    def _timeout(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError("timed out")
        self.sock.settimeout(left)

    def _line(self, deadline: float) -> bytes:
        self._timeout(deadline)
        line: bytes = self._file.readline(_MAX_LINE + 1)
        if not line:
            raise HttpError("the server closed the connection")
        if len(line) > _MAX_LINE or not line.endswith(b"\n"):
            raise HttpError("an answer line too long or cut off")
        return line

    def _read_head(self, deadline: float) -> tuple[int, dict[str, str]]:
        """The status and the interpreted header fields. Where the whole
        head is in what the reader holds already (the API server's answer
        comes in one TLS record: nearly always), it is taken and split at
        once; else line by line, each read with the time left."""
        self._timeout(deadline)
        ahead = self._file.peek(1)  # what is buffered; one read if nothing is
        end = ahead.find(b"\r\n\r\n", 0, _MAX_LINE)
        if end >= 0:
            lines = self._file.read(end + 4).split(b"\r\n")
            del lines[-2:]  # the blank line that ends the head
            if len(lines) > _MAX_HEADERS + 1:
                raise HttpError("too many header lines")
            return _status(lines[0]), _fields(lines[1:])
        status = _status(self._line(deadline))
        lines = []
        for _ in range(_MAX_HEADERS):
            line = self._line(deadline)
            if line in (b"\r\n", b"\n"):
                return status, _fields(lines)
            lines.append(line)
        raise HttpError("too many header lines")

    def _read_body(self, status: int, fields: dict[str, str], deadline: float) -> tuple[bytes, bool]:
        """The body, and whether it ran to the end of the connection."""
        if status in _NO_BODY_STATUS:
            return b"", False
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return self._read_chunked(deadline), False
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HttpError(f"bad Content-Length {length[:20]!r}")
            return self._read_exactly(int(length), deadline), False
        # Neither: the body runs to the end of the connection.
        out: list[bytes] = []
        while True:
            self._timeout(deadline)
            piece = self._file.read1(1 << 16)
            if not piece:
                return b"".join(out), True
            out.append(piece)

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        out: list[bytes] = []
        while n > 0:
            self._timeout(deadline)
            piece = self._file.read1(n)
            if not piece:
                raise HttpError("the server closed the connection in the middle of the body")
            out.append(piece)
            n -= len(piece)
        return b"".join(out)

    def _read_chunked(self, deadline: float) -> bytes:
        out: list[bytes] = []
        while True:
            size_field = self._line(deadline).split(b";", 1)[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise HttpError(f"bad chunk size {size_field[:20]!r}") from None
            if size == 0:
                while self._line(deadline) not in (b"\r\n", b"\n"):  # trailers
                    pass
                return b"".join(out)
            out.append(self._read_exactly(size, deadline))
            if self._line(deadline) not in (b"\r\n", b"\n"):
                raise HttpError("a chunk not followed by its line end")

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._conn.close()
