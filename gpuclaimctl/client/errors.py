"""What an error answer of the API server means: one hierarchy for every request.

`ApiError` is any non-2xx answer: `status` (the HTTP code), the Status'
`reason` and `message`. It is informers' `ApiStatusError`, so a Status body
is read one way (`from_status`) for the informers' lists and watches and for
our own requests, and `retriable`/`expired` mean the same for both.
`NotFound`, `Conflict` and `AlreadyExists` are the answers a sync or the
elector acts on; `api_error` is the one place that says which answer is
which, so `except Conflict` catches the same thing wherever the request was
sent from.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from gpuclaimctl.client.fence import NotLeader
from informers.errors import ApiStatusError


class ApiError(ApiStatusError):
    """A non-2xx answer: status code, the Status reason and its message."""

    @property
    def status(self) -> int:
        """The HTTP status code (`code`, as informers names it)."""
        return self.code

    @classmethod
    def from_status(cls, status: Any, http_code: int = 0,
                    retry_after: float | None = None) -> ApiError:
        """The error a decoded Status (or any body) means: a NotFound,
        Conflict or AlreadyExists where it is one of those."""
        parsed = ApiStatusError.from_status(status, http_code, retry_after)
        return api_error(parsed.code, parsed.reason, parsed.message, causes=parsed.causes,
                         retry_after=parsed.retry_after)


class _KnownAnswer(ApiError):
    """An answer whose status its class fixes; made from a message alone."""

    STATUS: ClassVar[int]
    REASON: ClassVar[str]

    def __init__(self, message: str = "", reason: str = "", *, causes: tuple[str, ...] = (),
                 retry_after: float | None = None) -> None:
        super().__init__(self.STATUS, reason or self.REASON, message, causes=causes,
                         retry_after=retry_after)


class NotFound(_KnownAnswer):
    """404: the object is gone."""

    STATUS, REASON = 404, "NotFound"


class Conflict(_KnownAnswer):
    """409: the object changed since it was read; retry from fresh state."""

    STATUS, REASON = 409, "Conflict"


class AlreadyExists(_KnownAnswer):
    """409 on create: an object of that name exists."""

    STATUS, REASON = 409, "AlreadyExists"


def api_error(status: int, reason: str, message: str, *, causes: tuple[str, ...] = (),
              retry_after: float | None = None) -> ApiError:
    """The error an answer with this status and Status reason is."""
    known: type[_KnownAnswer] | None = None
    if status == 404:
        known = NotFound
    elif status == 409:
        known = AlreadyExists if reason == AlreadyExists.REASON else Conflict
    if known is None:
        return ApiError(status, reason, message, causes=causes, retry_after=retry_after)
    return known(message, reason, causes=causes, retry_after=retry_after)


def error_from_answer(status: int, body: bytes) -> ApiError:
    """The error an answer with HTTP `status` and `body` (a Status, mostly) means."""
    try:
        decoded: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        decoded = body.decode(errors="replace")
    return ApiError.from_status(decoded, status)


def surely_not_written(e: BaseException) -> bool:
    """Did the request that raised `e` surely change nothing? A 4xx answer
    is the API server refusing it before any write (a conflict, a refused
    body, a missing object, throttling); a write the fence kept in never
    left. Anything else -- a timeout, a dropped connection, a 5xx (the
    server's own timeout answers 504 while its handler goes on) -- may have
    landed, or may land yet."""
    if isinstance(e, NotLeader):
        return True
    return isinstance(e, ApiError) and 400 <= e.status < 500
