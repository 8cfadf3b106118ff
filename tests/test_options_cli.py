"""`gpuclaimctl run` options: flags and GPUCLAIMCTL_* variables become one
validated Options value; a bad value is refused with one line and exit
code 2 before anything starts. `app.run` is replaced, so nothing runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpuclaimctl import __version__
from gpuclaimctl.cmd import app
from gpuclaimctl.cmd.cli import main
from gpuclaimctl.logs import LogFormat
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.model.api import Strategy

# --- Options.validate -------------------------------------------------------------


def test_the_defaults_are_valid_with_and_without_leader_election() -> None:
    Options().validate()
    Options(leader_elect=True).validate()


@pytest.mark.parametrize(
    "changes, message",
    [
        pytest.param({"workers": 0}, "--workers must be at least 1, got 0", id="no-workers"),
        pytest.param({"resync_period": -1.0}, "--resync-period must not be negative", id="negative-resync"),
        pytest.param({"reject_for": -1.0}, "--reject-for must not be negative", id="negative-reject-for"),
        pytest.param({"node_lost_grace": -1.0}, "--node-lost-grace must not be negative",
                     id="negative-node-lost-grace"),
        pytest.param({"shutdown_timeout": -1.0}, "--shutdown-timeout must not be negative",
                     id="negative-shutdown-timeout"),
        pytest.param({"kube_api_qps": 0.0}, "--kube-api-qps must be > 0", id="no-qps"),
        pytest.param({"kube_api_burst": 0}, "--kube-api-burst at least 1", id="no-burst"),
        pytest.param({"kube_api_qps": 500.0}, "--kube-api-burst must be at least --kube-api-qps",
                     id="burst-below-qps"),
        pytest.param({"verbosity": -1}, "-v must not be negative", id="negative-verbosity"),
        pytest.param({"local": True, "kubeconfig": "/k"}, "do not also give --kubeconfig",
                     id="local-with-kubeconfig"),
        pytest.param({"local": True, "context": "prod"}, "do not also give --kubeconfig or --context",
                     id="local-with-context"),
        pytest.param({"metrics_bind_address": "8080"}, "--metrics-bind-address must be host:port",
                     id="metrics-address-without-colon"),
        pytest.param({"health_bind_address": "localhost:99999"}, "--health-bind-address must be host:port",
                     id="health-port-out-of-range"),
        pytest.param({"metrics_bind_address": "::1:8080"}, "--metrics-bind-address must be host:port",
                     id="metrics-address-unbracketed-ipv6"),
        pytest.param({"health_bind_address": ""}, "--health-bind-address must be host:port",
                     id="health-address-empty"),
        pytest.param({"leader_elect": True, "lease_duration": 10.0},
                     "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline",
                     id="lease-equal-to-renew"),
        pytest.param({"leader_elect": True, "lease_duration": 5.0},
                     "--leader-elect-lease-duration must be greater than", id="lease-below-renew"),
        pytest.param({"leader_elect": True, "renew_deadline": 2.4, "retry_period": 2.0},
                     "--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period",
                     id="renew-equal-to-1.2-retry"),
        pytest.param({"leader_elect": True, "retry_period": 0.0},
                     "--leader-elect-retry-period must be positive", id="no-retry-period"),
        pytest.param({"resync_period": float("nan")}, "--resync-period must be a finite number",
                     id="nan-resync"),
        pytest.param({"watch_batch_window": -0.01}, "--watch-batch-window must be between 0 and 1s",
                     id="negative-watch-batch-window"),
        pytest.param({"watch_batch_window": 1.5}, "--watch-batch-window must be between 0 and 1s, got 1.5s",
                     id="watch-batch-window-past-a-second"),
        pytest.param({"watch_batch_window": float("nan")}, "--watch-batch-window must be a finite number",
                     id="nan-watch-batch-window"),
        pytest.param({"reject_for": float("inf")}, "--reject-for must be a finite number", id="infinite-reject-for"),
        pytest.param({"kube_api_qps": float("nan")}, "--kube-api-qps must be a finite number", id="nan-qps"),
        pytest.param({"leader_elect": True, "lease_duration": float("inf")},
                     "--leader-elect-lease-duration must be a finite number", id="infinite-lease"),
    ],
)
def test_a_bad_value_is_refused_with_one_line_naming_it(changes: dict[str, Any], message: str) -> None:
    options = dataclasses.replace(Options(), **changes)
    with pytest.raises(ValueError) as e:
        options.validate()
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_lease_timings_are_not_checked_without_leader_election() -> None:
    Options(leader_elect=False, lease_duration=1.0, renew_deadline=5.0, retry_period=0.0).validate()


# --- the command --------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Options]]:
    """The Options `run` would start the controller with; nothing starts."""
    seen: list[Options] = []

    def fake_run(options: Options) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(app, "run", fake_run)
    # The caller's environment must not leak into what the tests read.
    for name in list(__import__("os").environ):
        if name.startswith("GPUCLAIMCTL_"):
            monkeypatch.delenv(name)
    yield seen


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_version_prints_the_version() -> None:
    result = invoke("version")
    assert result.exit_code == 0
    assert result.output == f"gpuclaimctl {__version__}\n"


def test_run_without_flags_starts_with_the_defaults(captured: list[Options]) -> None:
    result = invoke("run")
    assert result.exit_code == 0, result.output
    assert captured == [Options()]


def test_every_flag_reaches_the_options(captured: list[Options]) -> None:
    result = invoke(
        "run", "--kubeconfig", "/etc/kube.conf", "--context", "lab", "--workers", "8",
        "--resync-period", "90", "--watch-batch-window", "50ms", "--leader-elect",
        "--leader-elect-lease-name", "gpu-lease",
        "--leader-elect-namespace", "kube-system", "--leader-elect-lease-duration", "30s",
        "--leader-elect-renew-deadline", "20s", "--leader-elect-retry-period", "4s",
        "--metrics-bind-address", "127.0.0.1:9090", "--health-bind-address", "0",
        "--kube-api-qps", "20", "--kube-api-burst", "40", "--placement-strategy", "spread",
        "--reject-for", "1h", "--node-lost-grace", "1.5m", "--shutdown-timeout", "500ms",
        "--log-format", "json", "-v", "4", "--no-preemption",
    )
    assert result.exit_code == 0, result.output
    assert captured == [Options(
        kubeconfig="/etc/kube.conf", context="lab", workers=8, resync_period=90.0,
        watch_batch_window=0.05, leader_elect=True,
        lease_name="gpu-lease", lease_namespace="kube-system", lease_duration=30.0, renew_deadline=20.0,
        retry_period=4.0, metrics_bind_address="127.0.0.1:9090", health_bind_address="0",
        kube_api_qps=20.0, kube_api_burst=40, strategy=Strategy.SPREAD, reject_for=3600.0,
        node_lost_grace=90.0, shutdown_timeout=0.5, log_format=LogFormat.JSON, verbosity=4,
        preemption=False,
    )]


def test_environment_variables_set_flags_and_flags_win(captured: list[Options]) -> None:
    env = {
        "GPUCLAIMCTL_WORKERS": "7",
        "GPUCLAIMCTL_LEADER_ELECT": "true",
        "GPUCLAIMCTL_LEADER_ELECT_LEASE_NAME": "from-env",
        "GPUCLAIMCTL_RESYNC_PERIOD": "2m",
        "GPUCLAIMCTL_PLACEMENT_STRATEGY": "spread",
        "GPUCLAIMCTL_KUBE_API_QPS": "5",
        "GPUCLAIMCTL_KUBE_API_BURST": "10",
    }
    assert invoke("run", env=env).exit_code == 0
    assert invoke("run", "--workers", "2", env=env).exit_code == 0
    from_env, overridden = captured
    assert (from_env.workers, from_env.leader_elect, from_env.lease_name, from_env.resync_period,
            from_env.strategy, from_env.kube_api_qps, from_env.kube_api_burst) \
        == (7, True, "from-env", 120.0, Strategy.SPREAD, 5.0, 10)
    assert overridden.workers == 2


def test_preemption_is_on_unless_turned_off_and_reaches_the_syncs_settings(captured: list[Options]) -> None:
    """Issue 46: --preemption/--no-preemption (or GPUCLAIMCTL_PREEMPTION)
    is what the pod and gang syncs read as Settings.preemption."""
    assert invoke("run").exit_code == 0
    assert invoke("run", "--no-preemption").exit_code == 0
    assert invoke("run", env={"GPUCLAIMCTL_PREEMPTION": "false"}).exit_code == 0
    assert invoke("run", "--preemption", env={"GPUCLAIMCTL_PREEMPTION": "false"}).exit_code == 0
    assert [o.preemption for o in captured] == [True, False, False, True]
    assert [app.sync_settings(o).preemption for o in captured] == [True, False, False, True]
    settings = app.sync_settings(Options(strategy=Strategy.SPREAD, reject_for=5.0, node_lost_grace=7.0))
    assert (settings.strategy, settings.reject_for, settings.node_lost_grace, settings.preemption) == \
        (Strategy.SPREAD, 5.0, 7.0, True)


def test_a_bad_environment_variable_is_refused_like_a_bad_flag(captured: list[Options]) -> None:
    result = invoke("run", env={"GPUCLAIMCTL_WORKERS": "0"})
    assert result.exit_code == 2
    assert "Error: --workers must be at least 1, got 0" in result.output
    assert captured == []


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--workers", "0"], "--workers must be at least 1, got 0", id="no-workers"),
        pytest.param(["--workers", "many"], "'many' is not a valid integer", id="workers-not-a-number"),
        pytest.param(["--resync-period", "10x"], "'10x' is not a duration", id="bad-duration"),
        pytest.param(["--reject-for", "m"], "'m' is not a duration", id="unit-without-number"),
        pytest.param(["--resync-period", "nan"], "--resync-period must be a finite number", id="nan-duration"),
        pytest.param(["--node-lost-grace", "-5m"], "--node-lost-grace must not be negative",
                     id="negative-duration"),
        pytest.param(["--leader-elect", "--leader-elect-lease-duration", "10s"],
                     "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline",
                     id="lease-not-above-renew"),
        pytest.param(["--leader-elect", "--leader-elect-renew-deadline", "2s",
                      "--leader-elect-retry-period", "2s"],
                     "--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period",
                     id="renew-not-above-1.2-retry"),
        pytest.param(["--metrics-bind-address", "localhost"], "--metrics-bind-address must be host:port",
                     id="bad-bind-address"),
        # Both once passed the flag check and crashed the endpoint server at start-up.
        pytest.param(["--metrics-bind-address", "::1:8080"],
                     "--metrics-bind-address must be host:port, :port, [ipv6]:port (port 0-65535) "
                     "or 0 to disable, got '::1:8080'", id="unbracketed-ipv6-bind-address"),
        pytest.param(["--metrics-bind-address", ""],
                     "--metrics-bind-address must be host:port, :port, [ipv6]:port (port 0-65535) "
                     "or 0 to disable, got ''", id="empty-bind-address"),
        pytest.param(["--placement-strategy", "random"], "'random' is not one of 'binpack', 'spread'",
                     id="unknown-strategy"),
        pytest.param(["--log-format", "xml"], "'xml' is not one of 'text', 'json'", id="unknown-log-format"),
        pytest.param(["--local", "--kubeconfig", "/k"], "do not also give --kubeconfig",
                     id="local-with-kubeconfig"),
    ],
)
def test_a_bad_flag_is_refused_with_one_line_and_exit_code_2(
    captured: list[Options], args: list[str], message: str
) -> None:
    result = invoke("run", *args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert result.output.rstrip("\n").endswith(errors[0]), "the message is the last, single line"
    assert "Traceback" not in result.output
    assert captured == []


@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1m30s", 90.0),
    ("500ms", 0.5), ("2h0m5s", 7205.0),
], ids=lambda v: str(v))
def test_durations_read_like_kubernetes_flags(text: str, seconds: float) -> None:
    from gpuclaimctl.cmd.cli import _seconds

    assert _seconds(text) == seconds
