"""The HTTPS listener the API server calls the admission webhooks on.

`POST <path>` with an AdmissionReview v1 runs the route's function and
answers its AdmissionReview. Whatever a client sends, the server answers
and keeps serving:
- not an AdmissionReview v1 request (not JSON, no uid, ...): 400 with the
  reason, logged;
- no Content-Length, a body over MAX_BODY, a wrong method or path: 411, 413,
  405, 404;
- caches not synced yet: 503, so the API server applies the webhook's
  failurePolicy rather than a decision made on empty caches;
- the route raised: 500, logged with its traceback.

TLS from `tls.crt`/`tls.key` in the cert dir, loaded again whenever the
files change (the CertKeeper writing them, or the kubelet updating a
cert-manager Secret's volume): each new connection gets the latest pair; a
pair that does not load (written half-way) leaves the previous one in use.
The handshake runs on the connection's own thread with a timeout, so a
slow or silent client never holds up the others.
"""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuclaimctl.cmd.bindaddress import BindError, parse_bind_address
from gpuclaimctl.cmd.endpoints import tls_handshake
from gpuclaimctl.logs import get_logger
from gpuclaimctl.webhook.review import AdmissionRequest, BadReview, Verdict, parse_review, response
from metrics.admission import AdmissionMetrics

_log = get_logger(__name__)

TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
# An AdmissionReview of an UPDATE holds the object twice; etcd stores at most
# 1.5 MiB of one, so this is well above anything the API server sends.
MAX_BODY = 8 << 20
# Longer than the API server's idle keep-alive (Go's 90 s), so the client,
# not the server, closes an idle connection and never reuses a closed one.
IDLE_TIMEOUT = 120.0
# How often the cert files are checked for a change.
RELOAD_INTERVAL = 1.0

Route = Callable[[AdmissionRequest], Verdict]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    webhook: WebhookServer

    def finish_request(self, request: Any, client_address: Any) -> None:
        context = self.webhook.context
        conn = None if context is None else tls_handshake(request, client_address, context)
        if conn is None:
            request.close()
            return
        conn.settimeout(IDLE_TIMEOUT)
        self.webhook.track(conn, True)
        try:
            _Handler(conn, client_address, self)
        finally:
            self.webhook.track(conn, False)
            try:
                conn.close()
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("webhook connection failed", extra={"client": client_address[0]})


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        webhook = self.server.webhook
        # The API server adds `?timeout=5s`.
        path = self.path.split("?", 1)[0]
        route = webhook.routes.get(path)
        if route is None:
            self._drain()
            self._text(404, "no webhook at this path")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self._text(411, "Content-Length required", close=True)
            return
        length = int(length_header)
        if length > MAX_BODY:
            self._text(413, f"body over {MAX_BODY} bytes", close=True)
            self._discard()
            return
        body = self.rfile.read(length)
        started = time.monotonic()
        try:
            req = parse_review(body)
        except BadReview as e:
            _log.warning("refused a malformed admission review",
                         extra={"path": path, "client": self.client_address[0], "error": str(e)})
            webhook.failed(path, 400)
            self._text(400, f"malformed AdmissionReview: {e}")
            return
        not_ready = webhook.not_ready()
        if not_ready:
            _log.info("admission review before the webhook is ready",
                      extra={"uid": req.uid, "why": not_ready})
            webhook.failed(path, 503)
            self._text(503, f"the gpuclaimctl webhook is not ready: {not_ready}")
            return
        try:
            verdict = route(req)
        except Exception:
            _log.exception("admission webhook failed", extra={"uid": req.uid, "path": path})
            webhook.failed(path, 500)
            self._text(500, "the gpuclaimctl webhook failed on this request; see its log")
            return
        _log.v(2).info("admission", extra={
            "uid": req.uid, "path": path, "operation": req.operation.value,
            "namespace": req.namespace, "name": req.name, "user": req.username,
            "allowed": verdict.allowed, "patched": len(verdict.patch),
            "ms": round((time.monotonic() - started) * 1000, 2)})
        if not verdict.allowed:
            _log.info("admission refused", extra={
                "namespace": req.namespace, "name": req.name, "user": req.username,
                "operation": req.operation.value, "message": verdict.message})
        webhook.answered(path, verdict)
        self._send(200, "application/json", json.dumps(response(req.uid, verdict)).encode())

    def do_GET(self) -> None:
        self._text(405, "POST an AdmissionReview")

    do_PUT = do_DELETE = do_PATCH = do_GET

    def _drain(self) -> None:
        length = self.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) <= MAX_BODY:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _discard(self) -> None:
        # Closing a TLS connection with the client's bytes unread resets it,
        # and the client may lose the answer: read what comes for a moment.
        try:
            self.connection.settimeout(1.0)
            while self.rfile.read1(1 << 16):
                pass
        except (OSError, ValueError):
            pass

    def _text(self, status: int, message: str, *, close: bool = False) -> None:
        if close:
            self.close_connection = True
        self._send(status, "text/plain; charset=utf-8", (message + "\n").encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, socket.timeout, ssl.SSLError):
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        _log.v(6).info("webhook http", extra={"client": self.client_address[0], "line": format % args})


class WebhookServer:
    """One HTTPS listener serving admission routes with a reloadable certificate."""

    def __init__(self, address: str, cert_dir: Path, routes: Mapping[str, Route], *,
                 not_ready: Callable[[], str] = lambda: "",
                 metrics: AdmissionMetrics | None = None) -> None:
        bind = parse_bind_address(address, "--webhook-bind-address")
        if bind is None:
            raise ValueError("the webhook listener is disabled (0)")
        self._bind = bind
        self.cert_dir = cert_dir
        self.routes = dict(routes)
        self._not_ready = not_ready
        self._metrics = metrics
        self._guard = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._loaded: tuple[bytes, bytes] | None = None
        self._server: _Server | None = None
        # Guarded by _guard: the TLS connections being served.
        self._conns: set[ssl.SSLSocket] = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def context(self) -> ssl.SSLContext | None:
        with self._guard:
            return self._context

    def not_ready(self) -> str:
        """Why a review cannot be decided now ("" when it can)."""
        return self._not_ready()

    def answered(self, path: str, verdict: Verdict) -> None:
        if self._metrics is not None:
            result = "denied" if not verdict.allowed else "patched" if verdict.patch else "allowed"
            self._metrics.answered(path, result)

    def failed(self, path: str, code: int) -> None:
        if self._metrics is not None:
            self._metrics.failed(path, code)

    # -- certificates ----------------------------------------------------------------

    def reload(self) -> bool:
        """Load the cert dir's pair if it changed and is whole; True if now serving a new one."""
        try:
            pair = ((self.cert_dir / TLS_CERT).read_bytes(), (self.cert_dir / TLS_KEY).read_bytes())
        except OSError:
            return False
        with self._guard:
            if pair == self._loaded:
                return False
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_dir / TLS_CERT, self.cert_dir / TLS_KEY)
        except (ssl.SSLError, OSError, ValueError) as e:
            _log.v(2).info("serving certificate not loaded (yet)", extra={"error": str(e)})
            return False
        with self._guard:
            first = self._context is None
            self._context, self._loaded = context, pair
        _log.info("serving the webhook certificate" if first else "webhook certificate reloaded",
                  extra={"dir": str(self.cert_dir)})
        return True

    def check(self) -> None:
        """Raise unless a certificate is loaded and the listener is up."""
        if self._server is None:
            raise RuntimeError("the webhook listener is not started")
        if self.context is None:
            raise RuntimeError(f"no serving certificate in {self.cert_dir} yet")

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve in the background; raises BindError (an OSError,
        one line naming --webhook-bind-address) if the address is taken.
        After `stop`, starts again on the port it had."""
        host, port = self._bind
        self._stop = threading.Event()
        cls = _Server6 if ":" in host else _Server
        server = cls((host, port), _Handler, bind_and_activate=False)
        server.webhook = self
        try:
            server.server_bind()
            server.server_activate()
        except OSError as e:
            server.server_close()
            raise BindError("--webhook-bind-address", (host, port), e) from e
        self._server = server
        self._bind = (host, self.port)
        self.reload()
        for name, target in (("webhook-https", lambda: server.serve_forever(poll_interval=0.1)),
                             ("webhook-cert-reload", self._watch_files)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        _log.info("serving", extra={"endpoint": "webhook", "address": f"{host}:{self.port}"})

    def _watch_files(self) -> None:
        while not self._stop.wait(RELOAD_INTERVAL):
            try:
                self.reload()
            except Exception:  # never let the watcher die: the next tick tries again
                _log.exception("reloading the webhook certificate failed")

    @property
    def port(self) -> int:
        """The port listened on (kept after `stop`, for the next `start`)."""
        if self._server is not None:
            return int(self._server.server_address[1])
        return self._bind[1]

    def track(self, conn: ssl.SSLSocket, open_: bool) -> None:
        with self._guard:
            if open_:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def stop(self) -> None:
        """Stop accepting, end every connection once its request in progress
        is answered, close the listener; idempotent."""
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._guard:
            conns = list(self._conns)
        for conn in conns:
            # The read side only: an idle keep-alive connection sees its end
            # at once; a request being decided still gets its answer.
            try:
                raw = socket.socket(fileno=conn.fileno())
            except OSError:
                continue
            try:
                raw.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            finally:
                raw.detach()
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
