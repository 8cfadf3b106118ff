"""The one bind-address parser: what `--metrics-bind-address` and
`--health-bind-address` accept is exactly what the endpoint server binds."""

from __future__ import annotations

import pytest

from gpuclaimctl.cmd.bindaddress import parse_bind_address


@pytest.mark.parametrize(
    "value, parsed",
    [
        pytest.param(":8080", ("", 8080), id="port-only-binds-every-interface"),
        pytest.param("0.0.0.0:8080", ("0.0.0.0", 8080), id="ipv4-any"),
        pytest.param("127.0.0.1:9090", ("127.0.0.1", 9090), id="ipv4"),
        pytest.param("127.0.0.1:0", ("127.0.0.1", 0), id="free-port"),
        pytest.param("localhost:10257", ("localhost", 10257), id="hostname"),
        pytest.param("[::1]:8443", ("::1", 8443), id="bracketed-ipv6"),
        pytest.param("[::]:8080", ("::", 8080), id="bracketed-ipv6-any"),
        pytest.param("0", None, id="zero-disables"),
        pytest.param(" 0 ", None, id="zero-with-spaces-disables"),
    ],
)
def test_a_bind_address_parses_to_host_and_port(value: str, parsed: tuple[str, int] | None) -> None:
    assert parse_bind_address(value) == parsed


@pytest.mark.parametrize("value", [
    pytest.param("", id="empty"),
    pytest.param("8080", id="no-colon"),
    pytest.param("localhost", id="host-only"),
    pytest.param("host:", id="no-port"),
    pytest.param("host:http", id="named-port"),
    pytest.param("host:65536", id="port-too-large"),
    pytest.param(":-1", id="negative-port"),
    pytest.param(":８０", id="non-ascii-digits"),
    pytest.param("::1:8080", id="unbracketed-ipv6"),
    pytest.param("[::1:8080", id="unclosed-bracket"),
])
def test_anything_else_is_refused_with_one_line_naming_the_flag(value: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_bind_address(value, "--metrics-bind-address")
    assert str(e.value) == ("--metrics-bind-address must be host:port, :port, [ipv6]:port "
                            f"(port 0-65535) or 0 to disable, got {value!r}")
