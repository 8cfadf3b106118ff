"""How a listen address is written (`--metrics-bind-address`, `--health-bind-address`,
`--webhook-bind-address`), and what it means when one cannot be bound.

One parser, for the flag check in `Options.validate` and for the listener
`EndpointServer` binds: an address the flags accept is one the server can
bind, so a bad value is refused with one line before anything starts.
An address that is well written but cannot be bound here (taken by another
process, not this host's) is refused by the listener with one line naming
the flag (`BindError`), which `gpuclaimctl run` reports as it reports a
bad flag.
"""

from __future__ import annotations

import errno
import socket

# kube-controller-manager's spelling of "no listener".
DISABLED = "0"


def parse_bind_address(value: str, flag: str = "bind address") -> tuple[str, int] | None:
    """`host:port` as (host, port); None for `"0"` (disabled).

    Accepts `:8080` (every interface, host ""), `0.0.0.0:8080`,
    `127.0.0.1:0` (a free port), `localhost:8080` and `[::1]:8080`. Refuses,
    with one line naming `flag`, anything else: no port, a port that is not
    0-65535, an empty value, and an IPv6 host without brackets (`::1:8080`
    cannot tell its host from its port).
    """
    text = value.strip()
    if text == DISABLED:
        return None
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not (sep and (bracketed or ":" not in host)
            and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"{flag} must be host:port, :port, [ipv6]:port (port 0-65535) "
                         f"or 0 to disable, got {value!r}")
    return host, int(port)


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def on_loopback(value: str, flag: str = "bind address") -> str:
    """`value` with an every-interface host (`:8080`) made `127.0.0.1`.

    For `--local`: a demo on a laptop serves nothing beyond it. A host that
    is not loopback is refused with one line naming `flag`; `"0"` stays off.
    """
    parsed = parse_bind_address(value, flag)
    if parsed is None:
        return DISABLED
    host, port = parsed
    if host == "":
        return f"127.0.0.1:{port}"
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"--local serves on loopback only; {flag} {value!r} is not a loopback address "
                         "(use 127.0.0.1:PORT, [::1]:PORT or localhost:PORT)")
    return value.strip()


def format_bind_address(host: str, port: int) -> str:
    """(host, port) written as the flags take it: `:8080`, `[::1]:8080`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BindError(OSError):
    """A listener could not take its address; the message is one line that
    names the flag to change (an OSError still, for callers that catch that)."""

    def __init__(self, flag: str, address: tuple[str, int], cause: OSError) -> None:
        super().__init__(bind_failure(flag, address, cause))
        self.flag = flag


def bind_failure(flag: str, address: tuple[str, int], cause: OSError) -> str:
    """`--x-bind-address :9443: address already in use; ... (set --x-bind-address to ...)`."""
    text = format_bind_address(*address)
    if isinstance(cause, socket.gaierror):
        why, instead = f"host {address[0]!r} not found", "an address of this host"
    elif cause.errno == errno.EADDRINUSE:
        why, instead = "address already in use; another process listens there", "another port"
    elif cause.errno == errno.EADDRNOTAVAIL:
        why, instead = "no interface of this host has that address", "an address of this host, or :PORT"
    elif cause.errno == errno.EACCES:
        why, instead = "permission denied (ports below 1024 need privileges)", "a port of 1024 or more"
    else:
        why, instead = (cause.strerror or str(cause)).lower(), "another address"
    return f"{flag} {text}: {why} (set {flag} to {instead})"
