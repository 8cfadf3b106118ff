"""kube.TokenBucket (--kube-api-qps/--kube-api-burst) on a fake clock, and
the one-request seam that consults it (and the paged list built on it)."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError
from gpuclaimctl.client.kube import TokenBucket
from gpuclaimctl.client.writer import Writer


class FakeTime:
    """A clock and a sleep that advances it, so waits are exact and instant."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


def test_a_full_bucket_lets_a_burst_through_then_spaces_requests_at_qps(fake: FakeTime) -> None:
    bucket = TokenBucket(qps=10, burst=3, clock=fake.clock, sleep=fake.sleep)
    delays = [bucket.wait() for _ in range(6)]
    assert delays[:3] == [0.0, 0.0, 0.0]
    assert delays[3:] == pytest.approx([0.1, 0.1, 0.1])
    assert fake.slept == pytest.approx([0.1, 0.1, 0.1])
    assert fake.now == pytest.approx(100.3)


def test_idle_time_refills_the_bucket_but_never_beyond_the_burst(fake: FakeTime) -> None:
    bucket = TokenBucket(qps=10, burst=3, clock=fake.clock, sleep=fake.sleep)
    for _ in range(3):
        bucket.wait()
    fake.now += 3600  # an hour idle is worth 36,000 tokens, capped at 3
    assert [bucket.wait() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


def test_a_partly_refilled_bucket_waits_only_for_the_missing_part(fake: FakeTime) -> None:
    bucket = TokenBucket(qps=10, burst=1, clock=fake.clock, sleep=fake.sleep)
    assert bucket.wait() == 0.0
    fake.now += 0.06
    assert bucket.wait() == pytest.approx(0.04)


def test_callers_arriving_together_are_given_successive_slots(fake: FakeTime) -> None:
    # Nobody's sleep has ended yet (the clock stands still): each caller
    # reserves the next slot, so they leave 1/qps apart, not all at once.
    waits: list[float] = []
    bucket = TokenBucket(qps=4, burst=2, clock=fake.clock, sleep=waits.append)
    assert [bucket.wait() for _ in range(5)] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75])
    assert waits == pytest.approx([0.25, 0.5, 0.75])


def test_concurrent_callers_never_exceed_burst_plus_qps_times_elapsed(fake: FakeTime) -> None:
    lock = threading.Lock()
    granted: list[float] = []  # when each caller's token became due

    def sleep(seconds: float) -> None:
        pass  # the due time is clock + delay; the clock stands still

    bucket = TokenBucket(qps=50, burst=5, clock=fake.clock, sleep=sleep)

    def caller() -> None:
        for _ in range(20):
            delay = bucket.wait()
            with lock:
                granted.append(fake.now + delay)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted.sort()
    assert len(granted) == 80
    for i, due in enumerate(granted):
        # The (i+1)th token is due no earlier than (i+1 - burst)/qps after the start.
        assert due - 100.0 >= (i + 1 - 5) / 50 - 1e-9


# --- request() and its limiter ------------------------------------------------------


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.data = body


class FakePool:
    def __init__(self, owner: FakeApiClient) -> None:
        self.owner = owner

    def request(self, method: str, url: str, *, body: bytes | None = None, **kw: Any) -> FakeResponse:
        self.owner.sent.append((method, url))
        self.owner.bodies.append(body)
        self.owner.timeouts.append(kw["timeout"].total)
        return self.owner.responses.pop(0)


class FakeApiClient:
    """What request() uses of kubernetes.client.ApiClient: param_serialize
    for the URL and auth headers, and the REST client's connection pool."""

    def __init__(self, *responses: FakeResponse) -> None:
        self.responses = list(responses)
        self.sent: list[tuple[str, str]] = []
        self.bodies: list[bytes | None] = []
        self.timeouts: list[float | None] = []  # each request's total timeout
        self.queries: list[list[tuple[str, str]]] = []
        self.rest_client = type("Rest", (), {"pool_manager": FakePool(self)})()

    def param_serialize(self, method: str, path: str, **kw: Any) -> tuple[Any, ...]:
        self.queries.append(list(kw.get("query_params") or ()))
        return method, "https://api" + path, kw["header_params"], None, []


def test_request_returns_the_body_of_a_success() -> None:
    api = FakeApiClient(FakeResponse(200, b'{"kind":"Pod"}'), FakeResponse(201, b""))
    assert kube.request_json(api, "GET", "/api/v1/pods") == {"kind": "Pod"}  # type: ignore[arg-type]
    assert kube.request_json(api, "POST", "/api/v1/pods", body={"a": [1]}) == {}  # type: ignore[arg-type]
    assert api.bodies == [None, b'{"a":[1]}']


def test_an_error_status_raises_with_the_api_servers_reason_and_message() -> None:
    status = {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"}
    api = FakeApiClient(FakeResponse(409, orjson.dumps(status)), FakeResponse(502, b"<html>bad gateway"))
    with pytest.raises(ApiError) as e:
        kube.request(api, "PUT", "/x")  # type: ignore[arg-type]
    assert (e.value.status, e.value.reason, e.value.message) == (409, "Conflict", "the object has been modified")
    with pytest.raises(ApiError) as e:
        kube.request(api, "GET", "/x")  # type: ignore[arg-type]
    assert (e.value.status, e.value.reason, e.value.message) == (502, "", "<html>bad gateway")


def test_requests_given_a_limiter_wait_for_their_token(fake: FakeTime) -> None:
    limiter = TokenBucket(qps=2, burst=2, clock=fake.clock, sleep=fake.sleep)
    api = FakeApiClient(*[FakeResponse(200, b"") for _ in range(8)])
    for _ in range(4):
        kube.request(api, "GET", "/x", limiter=limiter)  # type: ignore[arg-type]
        kube.request(api, "GET", "/x")  # type: ignore[arg-type]
    assert fake.slept == pytest.approx([0.5, 0.5])
    assert len(api.sent) == 8


def test_the_fence_is_consulted_after_the_token_wait_and_cuts_the_timeout(fake: FakeTime) -> None:
    limiter = TokenBucket(qps=1, burst=1, clock=fake.clock, sleep=fake.sleep)
    api = FakeApiClient(*[FakeResponse(200, b"") for _ in range(2)])
    consulted_at: list[float] = []

    def fence() -> float:
        consulted_at.append(fake.now)
        return 2.5

    kube.request(api, "PUT", "/x", body={}, fence=fence, limiter=limiter)  # type: ignore[arg-type]
    kube.request(api, "PUT", "/x", body={}, fence=fence, limiter=limiter)  # type: ignore[arg-type]
    # The second request waited a second for its token; the fence was asked
    # after that wait, not before it.
    assert fake.slept == pytest.approx([1.0])
    assert consulted_at == pytest.approx([100.0, 101.0])
    assert api.timeouts == pytest.approx([2.5, 2.5])


def test_a_fence_that_raises_keeps_the_request_unsent() -> None:
    api = FakeApiClient(FakeResponse(200, b""))

    def fence() -> float:
        raise PermissionError("not the leader")

    with pytest.raises(PermissionError):
        kube.request(api, "POST", "/x", body={}, fence=fence)  # type: ignore[arg-type]
    assert api.sent == []
    kube.request(api, "POST", "/x", body={}, timeout=7.0)  # type: ignore[arg-type]
    assert api.timeouts == [7.0]


def page(names: list[str], token: str = "") -> FakeResponse:
    return FakeResponse(200, orjson.dumps({"items": [{"metadata": {"name": n}} for n in names],
                                           "metadata": {"continue": token}}))


def test_a_paged_list_follows_continue_tokens_to_the_last_page() -> None:
    api = FakeApiClient(page(["a", "b"], "t1"), page(["c"], "t2"), page([]))
    items = kube.list_all(api, "/api/v1/nodes", [("fieldSelector", "x")], page_size=2)  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert [url for _, url in api.sent] == [
        "https://api/api/v1/nodes?fieldSelector=x&limit=2",
        "https://api/api/v1/nodes?fieldSelector=x&limit=2&continue=t1",
        "https://api/api/v1/nodes?fieldSelector=x&limit=2&continue=t2",
    ]


def test_the_client_makes_the_auth_headers_once_in_a_while_and_again_after_a_401(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Making them runs the kubeconfig's token refresh hook (costly per
    request); a token refused is read again at once."""
    now = [100.0]
    monkeypatch.setattr(kube.time, "monotonic", lambda: now[0])
    api = FakeApiClient(*[FakeResponse(200, b"{}")] * 3, FakeResponse(401, b""), FakeResponse(200, b"{}"))
    for _ in range(3):
        kube.request(api, "GET", "/api/v1/nodes", query=[("labelSelector", "a b/c")])  # type: ignore[arg-type]
    assert len(api.queries) == 1  # made once
    assert api.sent[0][1] == "https://api/api/v1/nodes?labelSelector=a%20b/c"
    now[0] += kube.PREPARED_FOR
    with pytest.raises(ApiError):
        kube.request(api, "GET", "/x")  # type: ignore[arg-type]
    assert len(api.queries) == 2  # made again when it ran out
    kube.request(api, "GET", "/x")  # type: ignore[arg-type]
    assert len(api.queries) == 3  # and after the 401


def test_every_request_the_writer_sends_waits_for_its_limiter(fake: FakeTime) -> None:
    limiter = TokenBucket(qps=1, burst=1, clock=fake.clock, sleep=fake.sleep)
    api = FakeApiClient(page(["c"], "t1"), page([]), FakeResponse(200, b"{}"), FakeResponse(201, b"{}"))
    writer = Writer(api, limiter=limiter)  # type: ignore[arg-type]
    assert len(writer.list_claims()) == 1  # two pages
    writer.get_pod("ns", "p")
    writer.event({"metadata": {"namespace": "ns", "name": "p"}}, "Normal", "Placed", "on n1")
    assert fake.slept == pytest.approx([1.0, 1.0, 1.0])  # the first token was in the bucket
    assert len(api.sent) == 4


def test_a_part_of_the_process_gets_a_client_whose_user_agent_names_it() -> None:
    """The Lease, the webhook's certificates and the metrics reviews are sent
    by every replica, leading or not: an audit log must tell them apart from
    the leader's writes, which keep the bare User-Agent."""
    from kubernetes import client as k8s

    base = k8s.ApiClient(k8s.Configuration(host="https://10.0.0.1:6443"))
    base.user_agent = "gpuclaimctl/1 host 42"
    made = kube.client_for(base, "webhook", retries=0)
    assert made.user_agent == "gpuclaimctl/1 host 42 webhook"
    assert base.user_agent == "gpuclaimctl/1 host 42"
    assert made.configuration.host == base.configuration.host
    assert made.configuration.retries == 0 and made.configuration is not base.configuration
