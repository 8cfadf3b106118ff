"""What is logged while start-up requests are retried (issue 45, item 6a).

A fresh API server answers every informer's first list or WatchList with
`429 TooManyRequests: storage is (re)initializing` until its watch cache
is filled: that is start-up, logged at INFO, by the reflectors and by the
new leader's catch-up list alike. Any other failure they retry stays a
WARNING.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from gpuclaimctl.client.errors import api_error
from gpuclaimctl.cmd import app
from informers.clock import FakeClock
from informers.delta_fifo import DeltaFIFO
from informers.errors import ApiStatusError
from informers.reflector import Reflector
from informers.store import Indexer
from informers.testing import FakeListerWatcher, make_object
from tests.helpers import wait_for

INITIALIZING = ApiStatusError(429, "TooManyRequests", "storage is (re)initializing", retry_after=1)

FAILURES = [
    pytest.param(INITIALIZING, logging.INFO, id="storage-initializing-429-is-info"),
    pytest.param(ApiStatusError(429, "TooManyRequests", "too many requests, please try again later"),
                 logging.WARNING, id="throttled-429-is-a-warning"),
    pytest.param(ApiStatusError(403, "Forbidden", 'pods is forbidden: User "x" cannot list'),
                 logging.WARNING, id="forbidden-is-a-warning"),
    pytest.param(ApiStatusError(500, "InternalError", "etcdserver: request timed out"),
                 logging.WARNING, id="server-error-is-a-warning"),
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def run_reflector(clock: FakeClock) -> Iterator[Callable[[FakeListerWatcher], Reflector]]:
    started: list[tuple[Reflector, threading.Thread]] = []

    def start(lw: FakeListerWatcher) -> Reflector:
        reflector = Reflector(lw, DeltaFIFO(Indexer()), name="pods", clock=clock, rand=lambda: 0.0)
        thread = threading.Thread(target=reflector.run, daemon=True)
        thread.start()
        started.append((reflector, thread))
        return reflector

    yield start
    for reflector, thread in started:
        reflector.stop()
        thread.join(5)
        assert not thread.is_alive(), "the reflector did not stop"


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The reflector's lines about a failure it retries: (level, message)."""
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name == "informers.reflector" and ("; retrying in" in r.getMessage()
                                                    or "; relisting in" in r.getMessage())]


@pytest.mark.parametrize(("error", "level"), FAILURES)
def test_a_failed_list_is_logged_at_info_only_while_storage_initializes(
    error: ApiStatusError, level: int, run_reflector: Callable[[FakeListerWatcher], Reflector],
    clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    lw = FakeListerWatcher()
    lw.add(make_object("p0"))
    lw.fail_next_list(error)
    with caplog.at_level(logging.INFO, logger="informers.reflector"):
        run_reflector(lw)
        clock.wait_for_sleepers()  # backing off before it lists again
    ((logged_level, message),) = retry_lines(caplog)
    assert message.startswith(f"pods: {error};")
    assert logged_level == level


def test_a_watch_list_refused_while_storage_initializes_is_info_and_then_fills_the_store(
    run_reflector: Callable[[FakeListerWatcher], Reflector], clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lw = FakeListerWatcher(watch_list=True)
    lw.add(make_object("p0"))
    lw.fail_next_watch(INITIALIZING)
    with caplog.at_level(logging.INFO, logger="informers.reflector"):
        reflector = run_reflector(lw)
        clock.wait_for_sleepers()
        clock.step(1.0)  # the server's retryAfterSeconds
        wait_for(lambda: reflector.stats.watch_lists == 1, timeout=10,
                 message="the store filled by a WatchList after the retry")
    assert retry_lines(caplog) == [(logging.INFO, f"pods: {INITIALIZING}; retrying in 1.0s")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("error", "level"), FAILURES)
def test_a_failed_catch_up_list_is_logged_at_info_only_while_storage_initializes(
    error: ApiStatusError, level: int, caplog: pytest.LogCaptureFixture,
) -> None:
    answer = api_error(error.code, error.reason, error.message)  # as the Writer raises it
    stop = threading.Event()
    calls: list[int] = []

    class FailingOnce:
        def catch_up(self, writes_landed_by: float | None = None) -> int:
            calls.append(1)
            if len(calls) == 1:
                raise answer
            return 0

    with caplog.at_level(logging.INFO, logger="gpuclaimctl"):
        assert app._catch_up(FailingOnce(), stop, None)  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if "listing claims" in r.getMessage()]
    assert record.levelno == level
