"""One error vocabulary: what an error answer of the API server means,
whichever request (a write, a read, the Lease, a list) it answered."""

from __future__ import annotations

import orjson
import pytest

from gpuclaimctl.client.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    NotFound,
    error_from_answer,
    surely_not_written,
)
from gpuclaimctl.client.fence import NotLeader
from informers.errors import ApiStatusError


def status(code: int, reason: str, message: str = "m") -> bytes:
    return orjson.dumps({"kind": "Status", "code": code, "reason": reason, "message": message})


@pytest.mark.parametrize("code, body, kind, reason", [
    pytest.param(404, status(404, "NotFound"), NotFound, "NotFound", id="not-found"),
    pytest.param(409, status(409, "Conflict"), Conflict, "Conflict", id="conflict"),
    pytest.param(409, status(409, "AlreadyExists"), AlreadyExists, "AlreadyExists", id="already-exists"),
    pytest.param(422, status(422, "Invalid"), ApiError, "Invalid", id="invalid"),
    pytest.param(500, status(500, "InternalError"), ApiError, "InternalError", id="internal-error"),
    pytest.param(502, b"<html>bad gateway", ApiError, "", id="not-a-status"),
])
def test_an_error_answer_is_the_error_its_status_and_reason_mean(
        code: int, body: bytes, kind: type[ApiError], reason: str) -> None:
    e = error_from_answer(code, body)
    assert type(e) is kind
    assert (e.status, e.code, e.reason) == (code, code, reason)
    assert isinstance(e, ApiError) and isinstance(e, ApiStatusError)


def test_an_error_made_from_a_message_alone_has_its_status() -> None:
    assert (Conflict("changed").status, Conflict("changed").reason) == (409, "Conflict")
    assert (NotFound("gone").status, AlreadyExists("there").reason) == (404, "AlreadyExists")
    assert str(Conflict("claim ns/c exists")) == "409 Conflict: claim ns/c exists"


def test_the_status_details_informers_read_are_kept() -> None:
    body = orjson.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow",
                         "details": {"retryAfterSeconds": 3}})
    e = error_from_answer(429, body)
    assert (e.retriable, e.retry_after) == (True, 3.0)


@pytest.mark.parametrize("error, not_written", [
    (Conflict("stale"), True),
    (NotFound("gone"), True),
    (ApiError(422, "Invalid", "bad"), True),
    (ApiError(429, "TooManyRequests", "later"), True),
    (NotLeader("fence closed"), True),
    (ApiError(500, "InternalError", "etcd"), False),
    (ApiError(504, "Timeout", "the server's own timeout; its handler goes on"), False),
    (TimeoutError("no answer"), False),
    (ConnectionResetError("dropped"), False),
], ids=["409", "404", "422", "429", "fence", "500", "504", "timeout", "reset"])
def test_only_a_4xx_or_the_fence_means_a_write_surely_changed_nothing(
        error: BaseException, not_written: bool) -> None:
    assert surely_not_written(error) is not_written
