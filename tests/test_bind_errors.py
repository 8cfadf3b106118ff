"""A listener that cannot bind ends `gpuclaimctl run` as a bad flag does
(issue 45, item 6b): one line naming the flag to change, exit 2, no
traceback. The story: a second replica started on the same host.

The process is the real console script; no API server is needed, since
the listeners bind before the first request is sent.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuclaimctl.cmd.bindaddress import BindError
from gpuclaimctl.cmd.endpoints import EndpointServer

GPUCLAIMCTL = Path(sys.executable).parent / "gpuclaimctl"
FREE = "127.0.0.1:0"
# Nothing answers there: the process must fail before it asks.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: unused}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.fixture
def taken() -> Iterator[str]:
    """An address another process's socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


@pytest.mark.parametrize("flags", [
    pytest.param(("--metrics-bind-address",), id="metrics"),
    pytest.param(("--health-bind-address",), id="health"),
    pytest.param(("--webhook-bind-address",), id="webhook"),
    pytest.param(("--metrics-bind-address", "--health-bind-address"), id="metrics-and-health-shared"),
])
def test_an_address_in_use_exits_2_with_one_line_naming_the_flag(
    tmp_path: Path, taken: str, flags: tuple[str, ...],
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    addresses = {"--metrics-bind-address": FREE, "--health-bind-address": FREE,
                 "--webhook-bind-address": FREE, **{flag: taken for flag in flags}}
    done = subprocess.run(
        [str(GPUCLAIMCTL), "run", "--kubeconfig", str(kubeconfig),
         "--webhook-cert-dir", str(tmp_path / "certs"),
         *(arg for flag, address in addresses.items() for arg in (flag, address))],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    named = " and ".join(flags)
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (f"Error: {named} {taken}: address already in use; another process listens "
                         f"there (set {named} to another port)"), done.stderr
    # Before it, at most the lines of listeners that had started (and were closed).
    assert all(" serving " in line for line in lines[:-1]), done.stderr
    if flags[0] != "--webhook-bind-address":  # the first listener bound: nothing else said
        assert len(lines) == 1, done.stderr


def test_an_address_not_on_this_host_names_the_flag_too() -> None:
    # 192.0.2.0/24 is TEST-NET-1: documentation only, on no interface.
    server = EndpointServer(registry=CollectorRegistry(), health_address="192.0.2.1:8081")
    with pytest.raises(BindError) as e:
        server.start()
    assert str(e.value) == ("--health-bind-address 192.0.2.1:8081: no interface of this host has that "
                            "address (set --health-bind-address to an address of this host, or :PORT)")
    assert isinstance(e.value, OSError), "callers that catch OSError still do"
