"""The start wait without leader election (issue 43, item 4), on a fake
clock: a process's first decision comes only once no write of the process
before it can still land, and every write says by when that is.

The real plane shows the race it closes: tests/test_restart_window.py."""

from __future__ import annotations

import logging
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuclaimctl.client.fence import WRITE_DEADLINE, WriteFence
from gpuclaimctl.client.writer import Writer
from gpuclaimctl.cmd import startwait
from gpuclaimctl.cmd.startwait import RESTART_WAIT, STORAGE_MARGIN, wait_out_earlier_writes
from gpuclaimctl.state.inflight import LOST_WRITE_WINDOW
from tests.test_kube_ratelimit import FakeApiClient, FakeResponse, FakeTime

STARTED = 100.0


class FakeStop(threading.Event):
    """A stop event whose waits pass on the fake clock; set, if asked, once
    the clock reaches `set_at`."""

    def __init__(self, fake: FakeTime, set_at: float | None = None) -> None:
        super().__init__()
        self.fake, self.set_at = fake, set_at
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None, "the start wait is bounded"
        self.waits.append(timeout)
        if self.set_at is not None and self.fake.now + timeout >= self.set_at:
            self.fake.now = self.set_at
            self.set()
        else:
            self.fake.now += timeout
        return self.is_set()


@pytest.fixture
def fake() -> FakeTime:
    t = FakeTime()
    t.now = STARTED
    return t


def wait(fake: FakeTime, stop: FakeStop, kubeconfig: str | None = None) -> bool:
    return wait_out_earlier_writes(stop, kubeconfig, started=STARTED, monotonic=fake.clock)


def test_a_process_just_started_decides_only_once_a_write_of_the_one_before_can_no_longer_land(
    fake: FakeTime, caplog: pytest.LogCaptureFixture,
) -> None:
    fake.now = STARTED + 2.5  # its caches took 2.5 s to sync
    stop = FakeStop(fake)
    with caplog.at_level(logging.INFO, logger="gpuclaimctl"):
        assert wait(fake, stop)
    assert fake.now == pytest.approx(STARTED + RESTART_WAIT)
    assert stop.waits == pytest.approx([RESTART_WAIT - 2.5])
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(f"waiting {RESTART_WAIT - 2.5:.1f}s before the first decision: "
                                          "without leader election")
    assert f"deadline, {WRITE_DEADLINE:.0f}s, plus {STORAGE_MARGIN:.0f}s" in record.getMessage()


def test_a_process_up_longer_than_the_wait_does_not_wait_or_say_so(
    fake: FakeTime, caplog: pytest.LogCaptureFixture,
) -> None:
    fake.now = STARTED + RESTART_WAIT + 0.001
    stop = FakeStop(fake)
    with caplog.at_level(logging.DEBUG, logger="gpuclaimctl"):
        assert wait(fake, stop)
    assert stop.waits == [] and caplog.records == []


def test_a_stop_during_the_wait_ends_it_and_nothing_is_decided(fake: FakeTime) -> None:
    stop = FakeStop(fake, set_at=STARTED + 3.0)
    assert not wait(fake, stop)
    assert fake.now == STARTED + 3.0


def test_an_api_server_this_process_started_has_no_earlier_writes_to_wait_for(
    fake: FakeTime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(startwait, "_OWN_API_SERVERS", set())
    startwait.own_api_server("/tmp/plane-1/kubeconfig")
    stop = FakeStop(fake)
    assert wait(fake, stop, "/tmp/plane-1/kubeconfig")
    assert stop.waits == []
    # Another cluster, or one named by no kubeconfig (in-cluster), still waits.
    assert wait(fake, FakeStop(fake), "/tmp/plane-2/kubeconfig")
    assert fake.now == pytest.approx(STARTED + RESTART_WAIT)
    assert not startwait.started_here(None)


def test_the_wait_covers_the_deadline_every_write_carries_plus_what_storage_may_take() -> None:
    assert RESTART_WAIT == WRITE_DEADLINE + STORAGE_MARGIN
    # No wider than the margin the lost-answer rule allows past the API server's own 60 s.
    assert LOST_WRITE_WINDOW - 60.0 >= STORAGE_MARGIN


@pytest.mark.parametrize("fenced", [False, True], ids=["no-fence", "unarmed-fence"])
def test_a_write_without_a_lease_asks_the_api_server_to_give_up_by_the_write_deadline(
    fenced: bool, fake: FakeTime,
) -> None:
    """What the wait relies on: without an armed fence (no leader election)
    every write still carries `?timeout=` no longer than WRITE_DEADLINE."""
    api = FakeApiClient(*[FakeResponse(200, b"{}") for _ in range(4)])
    writer = Writer(api, fence=WriteFence(fake.clock) if fenced else None)  # type: ignore[arg-type]
    claim = {"metadata": {"namespace": "ns", "name": "c", "resourceVersion": "7"}}
    writer.update_claim_status(claim)
    writer.patch_pod("ns", "p", [])
    writer.delete_pod("ns", "p", "uid", "8")
    writer.create_claim(claim)
    assert api.timeouts == pytest.approx([WRITE_DEADLINE] * 4)
    deadlines = [parse_qs(urlsplit(url).query).get("timeout") for _, url in api.sent]
    assert deadlines == [[f"{WRITE_DEADLINE * 1000:.0f}ms"]] * 4
