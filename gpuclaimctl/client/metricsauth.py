"""Who may read /metrics: the API server decides, as for kube-controller-manager.

A scrape's bearer token is sent in a TokenReview (authentication), and the
user it names in a SubjectAccessReview for `get` on the non-resource URL
`/metrics` (authorization) -- controller-runtime's
`filters.WithAuthenticationAndAuthorization`. No token or a token the API
server does not accept: 401; a user without the grant: 403; 200 otherwise.

Answers are kept for `ttl` seconds per token (by its SHA-256, never the
token itself), so a Prometheus scraping every few seconds costs two
requests per `ttl`, not two per scrape; a revoked binding takes effect
within `ttl`. A failed review (the API server unreachable) is not kept:
the scrape gets 500 and the next one asks again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.logs import get_logger

_log = get_logger(__name__)

# controller-runtime's filter keeps TokenReviews for a minute and
# SubjectAccessReviews 5 min (allowed) / 30 s (denied); 10 s for both here,
# so removing a scraper's binding shuts it out within one or two scrapes.
DEFAULT_TTL = 10.0
# More distinct tokens than any set of scrapers has; past it the cache is
# emptied rather than grown (a client sending random tokens).
MAX_ENTRIES = 1024

METRICS_PATH = "/metrics"


@dataclasses.dataclass(frozen=True)
class Access:
    """An HTTP status for the scrape (200, 401, 403 or 500) and why."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


class ApiServerAuth:
    """Authenticates and authorizes scrapes with the API server; thread-safe."""

    def __init__(self, api_client: client.ApiClient, *, path: str = METRICS_PATH,
                 ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api_client
        self._path = path
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        # sha256(token) -> (expires at, answer); entries older than ttl are stale.
        self._cache: dict[bytes, tuple[float, Access]] = {}

    def check(self, authorization: str | None) -> Access:
        """The answer for a request's Authorization header (None when absent)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Access(401, "Unauthorized")
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            access = self._review(token)
        except Exception as e:  # the API server unreachable or refusing us
            _log.info("metrics access review failed", extra={"error": str(e)})
            return Access(500, "Internal Server Error: the access review failed")
        with self._lock:
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.clear()
            self._cache[key] = (now + self._ttl, access)
        return access

    def _review(self, token: str) -> Access:
        review = kube.request_json(self._api, "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                                   body={"apiVersion": "authentication.k8s.io/v1",
                                         "kind": "TokenReview", "spec": {"token": token}})
        status: dict[str, Any] = review.get("status") or {}
        if not status.get("authenticated"):
            return Access(401, "Unauthorized")
        user: dict[str, Any] = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "uid": user.get("uid", ""),
            "nonResourceAttributes": {"path": self._path, "verb": "get"},
        }
        if user.get("extra"):
            spec["extra"] = user["extra"]
        sar = kube.request_json(self._api, "POST",
                                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                body={"apiVersion": "authorization.k8s.io/v1",
                                      "kind": "SubjectAccessReview", "spec": spec})
        if (sar.get("status") or {}).get("allowed"):
            return Access(200, "OK")
        return Access(403, f"Forbidden: user {spec['user']!r} may not get {self._path}")
