"""The write fence (DESIGN I3, only the leader writes), alone and in the
Writer, on a fake clock: a write leaves only while the Lease was renewed
recently enough, judged at the moment it would leave."""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable

import pytest

from gpuclaimctl.client.fence import WRITE_DEADLINE, NotLeader, WriteFence
from gpuclaimctl.client.kube import TokenBucket
from gpuclaimctl.client.writer import Writer
from tests.test_kube_ratelimit import FakeApiClient, FakeResponse, FakeTime

# The durations of the failover story: renew deadline 3 s, lease 4 s.
RENEW, LEASE = 3.0, 4.0


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def fence(fake: FakeTime) -> WriteFence:
    return WriteFence(fake.clock)


def claim(name: str = "c") -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": "7"},
            "spec": {"className": "a100", "count": 1}}


def ok(n: int = 1) -> list[FakeResponse]:
    return [FakeResponse(200, b"{}") for _ in range(n)]


# -- the fence alone ---------------------------------------------------------------


def test_a_fence_never_armed_always_allows(fence: WriteFence, fake: FakeTime) -> None:
    fake.now += 1e6
    assert fence.check() == math.inf
    assert not fence.closed


def test_writes_are_allowed_until_the_renewal_start_plus_renew_deadline(
    fence: WriteFence, fake: FakeTime,
) -> None:
    started = fake.now
    fake.now += 0.5  # the renew's answer came half a second after it was sent
    fence.extend(started, RENEW, LEASE)
    assert fence.check() == pytest.approx(LEASE - 0.5)
    fake.now = started + RENEW - 0.001
    assert fence.check() == pytest.approx(LEASE - RENEW + 0.001)
    fake.now = started + RENEW
    with pytest.raises(NotLeader, match="renew deadline passed"):
        fence.check()


def test_each_renewal_moves_the_deadline_on_and_an_older_one_never_moves_it_back(
    fence: WriteFence, fake: FakeTime,
) -> None:
    fence.extend(fake.now, RENEW, LEASE)
    fence.extend(fake.now + 2.0, RENEW, LEASE)
    fence.extend(fake.now + 1.0, RENEW, LEASE)  # a slower, older renew answered last
    fake.now += 4.9
    assert fence.check() == pytest.approx(2.0 + LEASE - 4.9)
    fake.now += 0.1
    with pytest.raises(NotLeader):
        fence.check()


def test_close_is_for_good(fence: WriteFence, fake: FakeTime) -> None:
    fence.extend(fake.now, RENEW, LEASE)
    fence.close("leader election lost")
    with pytest.raises(NotLeader, match="leader election lost"):
        fence.check()
    fence.extend(fake.now + 1.0, RENEW, LEASE)  # a renew that raced with the loss
    with pytest.raises(NotLeader):
        fence.check()
    assert fence.closed


def test_an_unarmed_fence_that_is_closed_refuses(fence: WriteFence) -> None:
    fence.close()
    with pytest.raises(NotLeader):
        fence.check()


def test_a_fence_needs_the_lease_to_outlast_the_renew_deadline(fence: WriteFence) -> None:
    with pytest.raises(ValueError):
        fence.extend(0.0, LEASE, RENEW)


def test_checks_racing_a_close_never_pass_after_it(fake: FakeTime) -> None:
    fence = WriteFence(fake.clock)
    fence.extend(fake.now, RENEW, LEASE)
    closed = threading.Event()
    passed_after_close: list[int] = []

    def writer() -> None:
        for _ in range(20_000):
            was_closed = closed.is_set()
            try:
                fence.check()
            except NotLeader:
                continue
            if was_closed:
                passed_after_close.append(1)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    fence.close()
    closed.set()
    for t in threads:
        t.join()
    assert passed_after_close == []


# -- the Writer behind it ---------------------------------------------------------------


def test_a_writer_without_a_fence_or_with_an_unarmed_one_writes(fake: FakeTime) -> None:
    api = FakeApiClient(*ok(2))
    Writer(api).update_claim(claim())  # type: ignore[arg-type]
    Writer(api, fence=WriteFence(fake.clock)).update_claim(claim())  # type: ignore[arg-type]
    assert len(api.sent) == 2
    # Bounded all the same (issue 43: tests/test_startwait.py).
    assert api.timeouts == [WRITE_DEADLINE, WRITE_DEADLINE]


def test_a_write_after_the_renew_deadline_is_refused_unsent(
    fence: WriteFence, fake: FakeTime,
) -> None:
    api = FakeApiClient(*ok(8))
    writer = Writer(api, fence=fence)  # type: ignore[arg-type]
    fence.extend(fake.now, RENEW, LEASE)
    writer.update_claim_status(claim())
    assert api.timeouts == pytest.approx([LEASE])  # cut to when the Lease could be taken

    fake.now += RENEW
    refused: list[Callable[[], object]] = [
        lambda: writer.create_claim(claim("new")),
        lambda: writer.update_claim(claim()),
        lambda: writer.update_claim_status(claim()),
        lambda: writer.update_class_status({"metadata": {"name": "a100"}}),
        lambda: writer.delete_claim("ns", "c", "uid-1"),
        lambda: writer.patch_pod("ns", "p", []),
        lambda: writer.delete_pod("ns", "p", "uid-2", "9"),
    ]
    for write in refused:
        with pytest.raises(NotLeader):
            write()
    assert len(api.sent) == 1


def test_a_write_that_waited_for_a_rate_limiter_token_past_the_deadline_is_refused(
    fence: WriteFence, fake: FakeTime,
) -> None:
    api = FakeApiClient(*ok(2))
    limiter = TokenBucket(qps=0.25, burst=1, clock=fake.clock, sleep=fake.sleep)
    writer = Writer(api, fence=fence, limiter=limiter)  # type: ignore[arg-type]
    fence.extend(fake.now, RENEW, LEASE)
    writer.patch_pod("ns", "first", [])

    fake.now += 1.0
    fence.check()  # when the write was asked for, it was still allowed...
    with pytest.raises(NotLeader):
        # ...but its token came 3 s later, past the renew deadline.
        writer.patch_pod("ns", "second", [])
    assert fake.slept == pytest.approx([3.0])
    assert [url for _, url in api.sent] == ["https://api/api/v1/namespaces/ns/pods/first?timeout=4000ms"]


def test_a_write_near_the_deadline_gets_only_the_time_left_before_a_takeover(
    fence: WriteFence, fake: FakeTime,
) -> None:
    api = FakeApiClient(*ok())
    fence.extend(fake.now, RENEW, LEASE)
    fake.now += 2.9
    Writer(api, fence=fence).delete_claim("ns", "c", "uid")  # type: ignore[arg-type]
    assert api.timeouts == pytest.approx([LEASE - 2.9])
    # The API server gives up on it by then too: a write it has not handed
    # to storage when the Lease can be taken over is never made.
    (_, url), = api.sent
    path, _, timeout = url.partition("?timeout=")
    assert path == "https://api/apis/gpuclaimctl.io/v1alpha1/namespaces/ns/gpuclaims/c"
    assert timeout.endswith("ms") and 1090 <= int(timeout[:-2]) <= 1100  # never past the takeover


def test_reads_are_not_fenced(fence: WriteFence) -> None:
    api = FakeApiClient(FakeResponse(200, b'{"metadata": {"name": "p"}}'),
                        FakeResponse(200, b'{"items": [], "metadata": {}}'))
    writer = Writer(api, fence=fence)  # type: ignore[arg-type]
    fence.close()
    assert writer.get_pod("ns", "p") == {"metadata": {"name": "p"}}
    assert writer.list_claims() == []
    assert [m for m, _ in api.sent] == ["GET", "GET"]


def test_an_event_refused_by_the_fence_raises_while_an_api_error_is_only_logged(
    fence: WriteFence, caplog: pytest.LogCaptureFixture,
) -> None:
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "u"}}
    api = FakeApiClient(FakeResponse(500, b'{"reason": "InternalError", "message": "etcd"}'))
    writer = Writer(api, fence=fence)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        writer.event(pod, "Normal", "Placed", "placed on n1")
    assert "could not record event Placed" in caplog.text
    assert len(api.sent) == 1

    fence.close()
    caplog.clear()
    with pytest.raises(NotLeader):
        writer.event(pod, "Normal", "Placed", "placed on n1")
    assert len(api.sent) == 1
    assert "could not record event" not in caplog.text


def test_a_fence_that_needs_a_lease_refuses_until_the_first_acquire(fake: FakeTime) -> None:
    """With leader election on, a standby has never held the Lease: any write
    it would send (whatever code sends it) is refused, not let through."""
    fence = WriteFence(fake.clock, lease_required=True)
    with pytest.raises(NotLeader):
        fence.check()
    fence.extend(fake.now, RENEW, LEASE)
    assert fence.check() == pytest.approx(LEASE)
