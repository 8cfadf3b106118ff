"""Errors a list or a watch can end with, classified the way client-go's reflector needs.

An ``ApiStatusError`` carries the API server's ``Status`` (an HTTP error, or
an ``ERROR`` event inside a watch); a ``TransportError`` means no answer
came: the connection was refused, reset or timed out.
"""

from __future__ import annotations

from typing import Any

from informers.objects import KubeObject


class ApiStatusError(Exception):
    """The API server answered with a failure ``Status``."""

    def __init__(
        self,
        code: int,
        reason: str = "",
        message: str = "",
        *,
        causes: tuple[str, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}".strip())
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes
        self.retry_after = retry_after

    @classmethod
    def from_status(
        cls, status: KubeObject | Any, http_code: int = 0, retry_after: float | None = None
    ) -> ApiStatusError:
        """Build from a decoded ``Status`` object (falls back to the HTTP code)."""
        if not isinstance(status, dict):
            return cls(http_code, "", str(status)[:200], retry_after=retry_after)
        details = status.get("details") or {}
        causes = tuple(str(c.get("reason", "")) for c in (details.get("causes") or []))
        if retry_after is None and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
        return cls(
            int(status.get("code") or http_code),
            str(status.get("reason") or ""),
            str(status.get("message") or ""),
            causes=causes,
            retry_after=retry_after,
        )

    @property
    def expired(self) -> bool:
        """410: the resourceVersion (or continue token) is older than what is kept.

        client-go's IsResourceExpired or IsGone; both mean "relist".
        """
        return self.code == 410

    @property
    def too_large_resource_version(self) -> bool:
        """The server has not seen this resourceVersion yet (client-go's isTooLargeResourceVersionError)."""
        if "ResourceVersionTooLarge" in self.causes:
            return True
        return self.code == 504 and "too large resource version" in self.message.lower()

    @property
    def retriable(self) -> bool:
        """429 and 5xx: the server is overloaded or restarting; back off and try again."""
        return self.code == 429 or self.code >= 500


class TransportError(Exception):
    """No usable answer: connection refused, reset, closed early or timed out."""
