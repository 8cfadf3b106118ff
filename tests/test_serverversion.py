"""What the controller does against each Kubernetes version (client.serverversion)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpuclaimctl.client import serverversion
from gpuclaimctl.client.serverversion import ServerVersion, Support, decide, parse
from gpuclaimctl.controlplane import build
from tests.helpers import wait_for


@pytest.mark.parametrize("doc, expected", [
    pytest.param({"major": "1", "minor": "35", "gitVersion": "v1.35.4"},
                 ServerVersion(1, 35, "v1.35.4"), id="upstream"),
    pytest.param({"major": "1", "minor": "36+", "gitVersion": "v1.36.3-eks-4096722"},
                 ServerVersion(1, 36, "v1.36.3-eks-4096722"), id="minor-with-plus"),
    pytest.param({"major": "", "minor": "", "gitVersion": "v1.37.2-gke.1100"},
                 ServerVersion(1, 37, "v1.37.2-gke.1100"), id="only-git-version"),
    pytest.param({"gitVersion": "v1.26.0"}, ServerVersion(1, 26, "v1.26.0"), id="no-major-minor"),
])
def test_a_version_document_is_read_as_major_and_minor(doc: dict[str, str],
                                                       expected: ServerVersion) -> None:
    assert parse(doc) == expected


def test_a_build_without_a_version_stamp_is_told_by_its_minor() -> None:
    """What kube-apiserver built from its module without -X says at /version."""
    server = parse({"major": "1", "minor": "37", "gitVersion": "v0.0.0-master+$Format:%H$"})
    assert server.minor_version == (1, 37)
    assert decide(server).message.startswith("Kubernetes v1.37 (supported: 1.35-1.37)")


@pytest.mark.parametrize("doc", [{}, {"gitVersion": "devel"}, [], "v1.35.0"], ids=repr)
def test_a_document_without_a_version_is_refused(doc: Any) -> None:
    with pytest.raises(ValueError):
        parse(doc)


def v(minor: int) -> ServerVersion:
    return ServerVersion(1, minor, f"v1.{minor}.0")


@pytest.mark.parametrize("minor, support, watch_list, can_start", [
    pytest.param(37, Support.SUPPORTED, True, True, id="1.37"),
    pytest.param(36, Support.SUPPORTED, True, True, id="1.36"),
    pytest.param(35, Support.SUPPORTED, True, True, id="1.35"),
    pytest.param(38, Support.NEWER, True, True, id="1.38-newer"),
    pytest.param(34, Support.OLDER, True, True, id="1.34-watchlist-on-by-default"),
    pytest.param(33, Support.OLDER, False, True, id="1.33-watchlist-off-by-default"),
    pytest.param(32, Support.OLDER, True, True, id="1.32-watchlist-on-by-default"),
    pytest.param(30, Support.OLDER, False, True, id="1.30"),
    pytest.param(27, Support.OLDER, False, True, id="1.27-first-with-scheduling-gates"),
    pytest.param(26, Support.TOO_OLD, False, False, id="1.26-no-scheduling-gates"),
])
def test_each_minor_gets_its_support_and_initial_sync(minor: int, support: Support,
                                                      watch_list: bool, can_start: bool) -> None:
    behaviour = decide(v(minor))
    assert (behaviour.support, behaviour.watch_list, behaviour.can_start) == \
        (support, watch_list, can_start)
    assert "\n" not in behaviour.message and f"v1.{minor}.0" in behaviour.message
    assert behaviour.warn == (support is not Support.SUPPORTED)


def test_an_unsupported_older_server_is_said_in_one_line_that_names_the_supported_range() -> None:
    message = decide(v(33)).message
    assert message == ("Kubernetes v1.33.0 is older than the oldest supported minor (1.35-1.37); "
                       "starting anyway, untested: initial state by paginated lists "
                       "(WatchList is off by default there)")


def test_a_server_too_old_for_scheduling_gates_is_not_started_against() -> None:
    message = decide(v(26)).message
    assert "scheduling gates" in message and message.endswith("not starting")


def test_an_unreadable_version_starts_with_watch_list_and_says_why() -> None:
    behaviour = decide(None, "ApiError: 403")
    assert behaviour.support is Support.UNKNOWN and behaviour.can_start and behaviour.watch_list
    assert "ApiError: 403" in behaviour.message


def test_the_supported_range_is_the_one_the_planes_are_built_for() -> None:
    """The decision's range and the versions the tests run on are one list."""
    minors = [tuple(int(p) for p in m.split(".")) for m in build.KUBERNETES_VERSIONS]
    assert (min(minors), max(minors)) == (serverversion.OLDEST_SUPPORTED,
                                          serverversion.NEWEST_SUPPORTED)
    assert build.NEWEST_MINOR == "%d.%d" % serverversion.NEWEST_SUPPORTED
    for minor, pinned in build.KUBERNETES_VERSIONS.items():
        assert pinned.startswith(f"v{minor}.")
        assert decide(parse({"gitVersion": pinned})).support is Support.SUPPORTED


@pytest.mark.plane
def test_the_real_server_is_read_and_judged_supported(api_client: Any) -> None:
    """Whichever supported minor the session's plane runs (GPUCLAIMCTL_K8S_VERSION)."""
    behaviour = serverversion.check(api_client)
    assert behaviour.support is Support.SUPPORTED, behaviour.message
    assert behaviour.server is not None
    assert "%d.%d" % behaviour.server.minor_version == build.selected_minor()
    assert behaviour.watch_list


# -- at the process's start (cmd.app) ---------------------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`app.run` up to the point it would serve: what it would serve with."""
    from gpuclaimctl.cmd import app

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(app.logs, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(app, "_api_client", lambda options, identity: object())
    def serve(*a: Any, **k: Any) -> int:
        app.say_server_version(k["server"])  # as _serve does once its listeners are bound
        calls.append(k)
        return 0
    monkeypatch.setattr(app, "_serve", serve)
    return calls


def answer_version(monkeypatch: pytest.MonkeyPatch, doc: Any) -> None:
    def request_json(api_client: Any, method: str, path: str, **kw: Any) -> Any:
        assert (method, path) == ("GET", "/version")
        if isinstance(doc, Exception):
            raise doc
        return doc

    monkeypatch.setattr(serverversion.kube, "request_json", request_json)


@pytest.mark.parametrize("git_version, level, watch_list", [
    pytest.param("v1.36.3", "INFO", True, id="supported"),
    pytest.param("v1.34.2", "WARNING", True, id="older-watchlist-on"),
    pytest.param("v1.33.5", "WARNING", False, id="older-watchlist-off"),
    pytest.param("v1.39.0", "WARNING", True, id="newer"),
])
def test_the_process_logs_one_line_and_serves_with_the_chosen_initial_sync(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, served: list[dict[str, Any]],
    git_version: str, level: str, watch_list: bool,
) -> None:
    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    answer_version(monkeypatch, {"major": "1", "minor": git_version.split(".")[1],
                                 "gitVersion": git_version})
    caplog.set_level(logging.INFO, logger="gpuclaimctl")
    assert app.run(Options()) == 0
    assert [k["server"].watch_list for k in served] == [watch_list]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "Kubernetes" in r.getMessage()]
    assert len(lines) == 1 and lines[0][0] == level and git_version in lines[0][1], lines


def test_the_process_does_not_start_against_a_server_without_scheduling_gates(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, served: list[dict[str, Any]],
) -> None:
    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    answer_version(monkeypatch, {"major": "1", "minor": "26", "gitVersion": "v1.26.15"})
    caplog.set_level(logging.INFO, logger="gpuclaimctl")
    assert app.run(Options()) == 1
    assert served == []
    assert [r.levelname for r in caplog.records if "v1.26.15" in r.getMessage()] == ["ERROR"]


def test_an_unreadable_version_still_starts_with_watch_list(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, served: list[dict[str, Any]],
) -> None:
    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.options import Options

    answer_version(monkeypatch, ConnectionRefusedError("refused"))
    caplog.set_level(logging.INFO, logger="gpuclaimctl")
    assert app.run(Options()) == 0
    assert [k["server"].watch_list for k in served] == [True]
    assert any(r.levelname == "WARNING" and "could not read the API server's version" in r.getMessage()
               for r in caplog.records)


@pytest.mark.plane
def test_the_real_process_says_which_kubernetes_it_met_and_what_it_chose(
    full_plane: Any, crds: list[str], namespace: str, tmp_path: Path,
) -> None:
    from tests.test_failover import ControllerProcess

    proc = ControllerProcess("version", str(full_plane.kubeconfig), tmp_path,
                             lease_namespace=namespace, lease_name="version-check").start()
    try:
        line = wait_for(lambda: next((l for l in proc.log.read_text().splitlines()
                                      if "Kubernetes v1." in l), None) if proc.log.exists() else None,
                        timeout=30, message=lambda: f"the version line; log:\n{proc.log_tail()}")
        minor = build.selected_minor()
        assert f"Kubernetes v{minor}" in str(line)
        assert "(supported: 1.35-1.37): initial state by WatchList" in str(line)
        # No plane of the suite's serves PodGroups (1.35 has none, 1.36 only
        # alpha ones, 1.37 only behind a feature gate): the controller says
        # so and runs, gangs declared by annotations.
        wait_for(lambda: "does not serve PodGroups" in proc.log.read_text(), timeout=30,
                 message=lambda: f"the PodGroups line; log:\n{proc.log_tail()}")
        assert proc.alive(), proc.log_tail()
    finally:
        proc.stop()
