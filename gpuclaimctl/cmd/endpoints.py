"""The controller's HTTP endpoints: ``/metrics``, ``/healthz`` and ``/readyz``.

``/metrics`` serves the Prometheus exposition of an injected registry.
``/healthz`` (liveness: restart me) and ``/readyz`` (readiness: route to me)
each run their own named checks; a check is a callable that returns when
healthy and raises when not, and must be quick, since a probe waits for it.
The answers follow kube-apiserver's: 200 ``ok``, or 500 listing every check
as ``[+]name ok`` / ``[-]name failed: reason``; ``?verbose`` lists them on
success too, and ``/healthz/<name>`` runs one check.

Metrics and probes may listen on different addresses or share one; an
address of ``"0"`` turns that listener off. Nothing listens until
``start()``, and ``stop()`` closes the sockets and joins the threads.

Secure metrics (``--metrics-secure``, kube-controller-manager's and
kubebuilder's way): the metrics listener speaks HTTPS only, with a
self-signed certificate made in memory at start (what both do when no cert
dir is given), and ``/metrics`` answers only a bearer token the API server
authenticates and authorizes for ``get`` on ``/metrics``
(``client.metricsauth``). Probes sharing that listener are served over
HTTPS without a token, as kube-controller-manager serves ``/healthz``.
"""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import socket
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpuclaimctl.client import certs
from gpuclaimctl.client.metricsauth import Access
from gpuclaimctl.cmd.bindaddress import DISABLED, BindError, parse_bind_address
from gpuclaimctl.logs import get_logger

_log = get_logger(__name__)

# The flag each listener's address comes from, named when it cannot bind.
METRICS_FLAG, HEALTH_FLAG = "--metrics-bind-address", "--health-bind-address"

# A client that connects and says nothing holds only its own thread, and
# only this long (the metrics and the webhook listeners alike).
HANDSHAKE_TIMEOUT = 10.0


def tls_handshake(request: Any, client_address: Any, context: ssl.SSLContext) -> ssl.SSLSocket | None:
    """The server side of a TLS handshake on an accepted connection, on its
    own thread (ThreadingMixIn), bounded by HANDSHAKE_TIMEOUT; None (logged
    at -v 2) if it failed. The caller sets the socket's timeout after."""
    request.settimeout(HANDSHAKE_TIMEOUT)
    try:
        return context.wrap_socket(request, server_side=True)
    except (OSError, ssl.SSLError) as e:
        _log.v(2).info("TLS handshake failed", extra={"client": client_address[0], "error": str(e)})
        return None

# Decides a scrape from its Authorization header (None when absent).
Authorizer = Callable[[str | None], Access]


@dataclasses.dataclass(frozen=True)
class Check:
    """A named probe check: ``run()`` returns when healthy, raises when not."""

    name: str
    run: Callable[[], None]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Set before construction by _bind; each listener knows what it serves.
    endpoints: EndpointServer
    paths: frozenset[str]
    # Set on the metrics listener when secure: every connection is TLS.
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        conn = tls_handshake(request, client_address, self.tls)
        if conn is None:
            return
        conn.settimeout(None)
        try:
            _Handler(conn, client_address, self)
        finally:
            try:
                conn.unwrap()
            except (OSError, ssl.SSLError, ValueError):
                pass
            conn.close()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _serve(self, *, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        path = url.path.rstrip("/") or "/"
        top, _, check_name = path.lstrip("/").partition("/")
        endpoint = "/" + top
        if endpoint not in self.server.paths:
            self._reply(404, "text/plain; charset=utf-8", b"404 page not found\n", head)
            return
        if endpoint == "/metrics" and not check_name:
            self._metrics(head)
            return
        if endpoint in ("/healthz", "/readyz"):
            status, body = self.server.endpoints.probe(endpoint, check_name or None, "verbose" in query)
            self._reply(status, "text/plain; charset=utf-8", body.encode(), head)
            return
        self._reply(404, "text/plain; charset=utf-8", b"404 page not found\n", head)

    def _metrics(self, head: bool) -> None:
        authorize = self.server.endpoints.authorize
        if authorize is not None:
            access = authorize(self.headers.get("Authorization"))
            if not access.allowed:
                challenge = {"WWW-Authenticate": 'Bearer realm="gpuclaimctl"'} if access.status == 401 else {}
                self._reply(access.status, "text/plain; charset=utf-8",
                            access.reason.encode() + b"\n", head, challenge)
                return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        data = encoder(self.server.endpoints.registry)
        extra: dict[str, str] = {}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            data = gzip.compress(data)
            extra["Content-Encoding"] = "gzip"
        self._reply(200, content_type, data, head, extra)

    def _reply(
        self,
        status: int,
        content_type: str,
        body: bytes,
        head: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the prober gave up; nothing to tell it

    def log_message(self, format: str, *args: object) -> None:
        _log.v(6).info("http request", extra={"client": self.client_address[0], "line": format % args})


class EndpointServer:
    """The metrics and probe listeners of one process."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        metrics_address: str = DISABLED,
        health_address: str = DISABLED,
        healthz: Sequence[Check] = (),
        readyz: Sequence[Check] = (),
        metrics_tls: ssl.SSLContext | None = None,
        authorize: Authorizer | None = None,
    ) -> None:
        """``metrics_tls`` makes the metrics listener HTTPS; ``authorize``
        decides each ``/metrics`` request (both or neither, for secure
        metrics: a token must not cross the network in clear)."""
        if authorize is not None and metrics_tls is None:
            raise ValueError("metrics authorization needs TLS: bearer tokens are never read over HTTP")
        self.registry = registry
        self.authorize = authorize
        self._metrics_tls = metrics_tls
        # Parsed now so a bad flag is refused before anything starts.
        self._metrics_bind = parse_bind_address(metrics_address, "metrics address")
        self._health_bind = parse_bind_address(health_address, "health address")
        self._same = (
            self._metrics_bind is not None
            and metrics_address.strip() == health_address.strip()
        )
        self._guard = threading.Lock()
        self._checks: dict[str, list[Check]] = {"/healthz": list(healthz), "/readyz": list(readyz)}
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []

    def add_healthz_check(self, check: Check) -> None:
        with self._guard:
            self._checks["/healthz"].append(check)

    def add_readyz_check(self, check: Check) -> None:
        with self._guard:
            self._checks["/readyz"].append(check)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Bind every enabled listener and serve in background threads.

        Raises BindError (an OSError: address in use, say), one line naming
        the flag, with nothing left listening.
        """
        plan: list[tuple[str, str, tuple[str, int], frozenset[str]]] = []
        if self._same and self._metrics_bind is not None:
            plan.append(("metrics", f"{METRICS_FLAG} and {HEALTH_FLAG}", self._metrics_bind,
                         frozenset({"/metrics", "/healthz", "/readyz"})))
        else:
            if self._metrics_bind is not None:
                plan.append(("metrics", METRICS_FLAG, self._metrics_bind, frozenset({"/metrics"})))
            if self._health_bind is not None:
                plan.append(("health", HEALTH_FLAG, self._health_bind, frozenset({"/healthz", "/readyz"})))
        for role, flag, address, paths in plan:
            try:
                self._servers[role] = self._bind(address, paths)
            except OSError as e:
                self._close_all()
                raise BindError(flag, address, e) from e
            if role == "metrics":
                self._servers[role].tls = self._metrics_tls
        for role, server in self._servers.items():
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"http-{role}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
            host, port = server.socket.getsockname()[:2]
            _log.info("serving", extra={"endpoint": role, "address": f"{host}:{port}",
                                        "scheme": "https" if server.tls else "http"})

    def stop(self) -> None:
        """Stop serving, close the sockets and join the threads; idempotent."""
        for server in self._servers.values():
            server.shutdown()
        for thread in self._threads:
            thread.join()
        self._close_all()
        self._threads.clear()

    def _bind(self, address: tuple[str, int], paths: frozenset[str]) -> _Server:
        host, port = address
        cls = _Server6 if ":" in host else _Server
        server = cls((host, port), _Handler, bind_and_activate=False)
        server.endpoints = self
        server.paths = paths
        try:
            server.server_bind()
            server.server_activate()
        except OSError:
            server.server_close()
            raise
        return server

    def _close_all(self) -> None:
        for server in self._servers.values():
            server.server_close()
        self._servers.clear()

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics listens on (after start), or None when disabled."""
        server = self._servers.get("metrics")
        return int(server.server_address[1]) if server else None

    @property
    def health_port(self) -> int | None:
        """The port the probes listen on (after start), or None when disabled."""
        server = self._servers.get("health") or (self._servers.get("metrics") if self._same else None)
        return int(server.server_address[1]) if server else None

    # -- probes ------------------------------------------------------------------

    def probe(self, endpoint: str, only: str | None, verbose: bool) -> tuple[int, str]:
        """Run the checks of ``/healthz`` or ``/readyz``; (HTTP status, body)."""
        with self._guard:
            checks = [Check("ping", lambda: None), *self._checks[endpoint]]
        if only is not None:
            checks = [c for c in checks if c.name == only]
            if not checks:
                return 404, f"no check named {only!r} in {endpoint}\n"
        lines: list[str] = []
        failed: list[str] = []
        for check in checks:
            try:
                check.run()
            except Exception as e:
                reason = " ".join(str(e).split()) or type(e).__name__
                lines.append(f"[-]{check.name} failed: {reason}")
                failed.append(check.name)
            else:
                lines.append(f"[+]{check.name} ok")
        what = endpoint.lstrip("/")
        if failed:
            _log.info(f"{what} check failed", extra={"checks": ",".join(failed)})
            return 500, "\n".join(lines) + f"\n{what} check failed\n"
        if verbose:
            return 200, "\n".join(lines) + f"\n{what} check passed\n"
        return 200, "ok"


def self_signed_tls(hosts: Sequence[str], now: datetime | None = None) -> ssl.SSLContext:
    """A server TLS context with a certificate made now for ``hosts``.

    kube-controller-manager and controller-runtime make one in memory when no
    certificate is given; a scraper skips verification (or, to verify, is
    given a cert dir's certificate instead). Python's ssl reads a chain from
    files only, so the PEMs pass through a private temporary directory that
    is gone before this returns.
    """
    made = certs.issue({}, list(hosts), now or datetime.now(timezone.utc), certs.Renewal.CA)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="gpuclaimctl-metrics-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(made[certs.TLS_CERT] + made[certs.CA_CERT])
        key.touch(mode=0o600)
        key.write_bytes(made[certs.TLS_KEY])
        context.load_cert_chain(cert, key)
    return context
