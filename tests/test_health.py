"""The HTTP endpoints, exercised with real requests on 127.0.0.1."""

from __future__ import annotations

import gzip
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuclaimctl.cmd.endpoints import Check, EndpointServer
from gpuclaimctl.cmd.options import Options

LOCAL = "127.0.0.1:0"


def get(port: int, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("gpuclaimctl_test_things", "Things counted by the test.", registry=reg).inc(3)
    return reg


@pytest.fixture
def servers() -> Iterator[list[EndpointServer]]:
    made: list[EndpointServer] = []
    yield made
    for s in made:
        s.stop()


def started(servers: list[EndpointServer], **kwargs: object) -> EndpointServer:
    server = EndpointServer(**kwargs)  # type: ignore[arg-type]
    servers.append(server)
    server.start()
    return server


def failing(message: str) -> Callable[[], None]:
    def run() -> None:
        raise RuntimeError(message)
    return run


def test_metrics_and_probes_on_separate_ports(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    # Identical addresses share one listener; these differ, so there are two.
    s = started(servers, registry=registry, metrics_address="127.0.0.1:0", health_address="localhost:0")
    assert s.metrics_port and s.health_port and s.metrics_port != s.health_port

    status, body, headers = get(s.metrics_port, "/metrics")
    assert status == 200
    assert b"gpuclaimctl_test_things_total 3.0" in body
    assert headers["Content-Type"].startswith("text/plain")
    assert get(s.health_port, "/healthz")[:2] == (200, b"ok")
    assert get(s.health_port, "/readyz")[:2] == (200, b"ok")

    assert get(s.health_port, "/metrics")[0] == 404
    assert get(s.metrics_port, "/healthz")[0] == 404


def test_one_address_serves_everything(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(servers, registry=registry, metrics_address=LOCAL, health_address=LOCAL)
    assert s.metrics_port == s.health_port
    port = s.metrics_port
    assert port is not None
    assert get(port, "/metrics")[0] == 200
    assert get(port, "/healthz")[:2] == (200, b"ok")
    assert get(port, "/readyz")[:2] == (200, b"ok")
    assert get(port, "/other")[0] == 404


def test_zero_disables_a_listener(servers: list[EndpointServer], registry: CollectorRegistry) -> None:
    s = started(servers, registry=registry, metrics_address="0", health_address=LOCAL)
    assert s.metrics_port is None
    assert s.health_port is not None
    assert get(s.health_port, "/healthz")[0] == 200

    off = started(servers, registry=registry, metrics_address="0", health_address="0")
    assert off.metrics_port is None and off.health_port is None


def test_a_failing_check_fails_healthz_and_names_itself(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(
        servers,
        registry=registry,
        health_address=LOCAL,
        healthz=[
            Check("informers", lambda: None),
            Check("leaderElection", failing("failed election to renew leadership\non lease ns/x")),
        ],
    )
    assert s.health_port is not None
    status, body, _ = get(s.health_port, "/healthz")
    assert status == 500
    assert body.decode().splitlines() == [
        "[+]ping ok",
        "[+]informers ok",
        "[-]leaderElection failed: failed election to renew leadership on lease ns/x",
        "healthz check failed",
    ]
    # Readiness has its own checks.
    assert get(s.health_port, "/readyz")[:2] == (200, b"ok")


def test_readyz_turns_ready_when_its_check_passes(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    synced = threading.Event()

    def caches_synced() -> None:
        if not synced.is_set():
            raise RuntimeError("informer caches not synced")

    s = started(servers, registry=registry, health_address=LOCAL,
                readyz=[Check("informer-sync", caches_synced)])
    assert s.health_port is not None
    status, body, _ = get(s.health_port, "/readyz")
    assert status == 500
    assert b"[-]informer-sync failed: informer caches not synced" in body
    assert get(s.health_port, "/healthz")[0] == 200

    synced.set()
    assert get(s.health_port, "/readyz")[:2] == (200, b"ok")


def test_checks_added_after_start_are_run(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(servers, registry=registry, health_address=LOCAL)
    assert s.health_port is not None
    assert get(s.health_port, "/healthz")[0] == 200
    s.add_healthz_check(Check("late", failing("stuck")))
    assert get(s.health_port, "/healthz")[0] == 500
    s.add_readyz_check(Check("late", failing("not yet")))
    assert get(s.health_port, "/readyz")[0] == 500


def test_verbose_lists_every_check_and_single_checks_have_paths(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(servers, registry=registry, health_address=LOCAL,
                healthz=[Check("good", lambda: None), Check("bad", failing("nope"))])
    port = s.health_port
    assert port is not None
    assert get(port, "/healthz/good")[:2] == (200, b"ok")
    status, body, _ = get(port, "/healthz/bad")
    assert (status, body) == (500, b"[-]bad failed: nope\nhealthz check failed\n")
    assert get(port, "/healthz/missing")[0] == 404
    status, body, _ = get(port, "/healthz/good?verbose")
    assert (status, body) == (200, b"[+]good ok\nhealthz check passed\n")


def test_metrics_are_gzipped_when_asked_and_head_has_no_body(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(servers, registry=registry, metrics_address=LOCAL)
    assert s.metrics_port is not None
    status, body, headers = get(s.metrics_port, "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert b"gpuclaimctl_test_things_total 3.0" in gzip.decompress(body)

    status, body, headers = get(s.metrics_port, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_openmetrics_is_served_when_asked(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    s = started(servers, registry=registry, metrics_address=LOCAL)
    assert s.metrics_port is not None
    _, body, headers = get(s.metrics_port, "/metrics", {"Accept": "application/openmetrics-text"})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_stop_closes_the_port_and_is_idempotent(registry: CollectorRegistry) -> None:
    s = EndpointServer(registry=registry, metrics_address=LOCAL, health_address=LOCAL)
    s.start()
    port = s.metrics_port
    assert port is not None and get(port, "/healthz")[0] == 200
    s.stop()
    s.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # The port can be taken again at once.
    again = EndpointServer(registry=registry, metrics_address=f"127.0.0.1:{port}")
    again.start()
    try:
        assert get(port, "/metrics")[0] == 200
    finally:
        again.stop()


def test_an_address_in_use_fails_start_and_leaves_nothing_listening(
    servers: list[EndpointServer], registry: CollectorRegistry
) -> None:
    busy = started(servers, registry=registry, metrics_address=LOCAL)
    taken = busy.metrics_port
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()
    s = EndpointServer(registry=registry, metrics_address=f"127.0.0.1:{free_port}",
                       health_address=f"127.0.0.1:{taken}")
    with pytest.raises(OSError):
        s.start()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", free_port), timeout=5).close()
    s.stop()


@pytest.mark.parametrize("address", [":8080", "0.0.0.0:8080", "127.0.0.1:0", "[::1]:9090",
                                     "localhost:10257", "0"])
def test_an_address_the_flags_accept_is_one_the_server_takes(address: str) -> None:
    Options(metrics_bind_address=address, health_bind_address=address).validate()
    EndpointServer(registry=CollectorRegistry(), metrics_address=address, health_address=address)


@pytest.mark.parametrize("address", ["8080", "host:", "host:http", ":70000", "::1:80", ""])
def test_bad_bind_addresses_are_refused_with_one_line_by_the_flags_and_the_server(address: str) -> None:
    with pytest.raises(ValueError) as err:
        EndpointServer(registry=CollectorRegistry(), metrics_address=address)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError):
        Options(metrics_bind_address=address).validate()
