"""One raw request through the official client's configured transport.

The official client gives us configuration, authentication and TLS; this
sends a request through it and hands back status and bytes without decoding
into models. Version 37 of the client does not raise on an error status, so
this does: the `errors.ApiError` (or NotFound, Conflict, AlreadyExists) the
API server's Status means.

--kube-api-qps/--kube-api-burst are a `TokenBucket` that whoever sends the
requests holds and passes to each one (the Writer does); nothing here keeps
state between calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

import orjson
import urllib3
from kubernetes import client, config

# Re-exported: callers and tests catch `kube.ApiError`; it is errors.ApiError.
from gpuclaimctl.client.errors import ApiError as ApiError
from gpuclaimctl.client.errors import error_from_answer


class ConfigError(Exception):
    """No usable client configuration; str() is one line for a person."""


def load_client(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """A kubeconfig when one is named (a context alone picks from the default
    kubeconfig), else the in-cluster service account; ConfigError if neither."""
    if kubeconfig or context:
        try:
            api: client.ApiClient = config.new_client_from_config(
                config_file=kubeconfig, context=context)
            return api
        except (config.ConfigException, OSError) as e:
            where = kubeconfig or "the default kubeconfig"
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"cannot load {where}: {first}") from None
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        raise ConfigError(
            "no cluster to talk to: not running in a pod; pass --kubeconfig (and --context)"
        ) from None
    return client.ApiClient(configuration)


class TokenBucket:
    """client-go's --kube-api-qps/--kube-api-burst: a caller waits for a token."""

    def __init__(self, qps: float, burst: int, clock: Any = time.monotonic,
                 sleep: Any = time.sleep) -> None:
        self._qps, self._burst = qps, float(burst)
        self._tokens, self._last = float(burst), clock()
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Take a token, sleeping until one is due; return the seconds slept."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            self._tokens -= 1.0
            delay = -self._tokens / self._qps if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)
        return delay


def request(
    api_client: client.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
    fence: Callable[[], float] | None = None,
    limiter: TokenBucket | None = None,
) -> bytes:
    """Send one request; return the body bytes or raise ApiError.

    `limiter`, when given, is waited on for a token first. `fence`, when
    given, is called right before the request leaves (after that wait,
    which may be long): it raises to stop the request, or returns the most
    seconds the request may take.
    """
    if limiter is not None:
        limiter.wait()
    # The client makes the URL and the auth headers (a token it may refresh);
    # the body is encoded here, once, by orjson: the client's own path walks
    # every body with sanitize_for_serialization and json.dumps, which was
    # the largest cost of a write in the controller's benchmark.
    method, url, headers, _body, _post = api_client.param_serialize(
        method, path, query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    payload = None if body is None else orjson.dumps(body)
    if fence is not None:
        timeout = min(timeout, fence())
    resp = api_client.rest_client.pool_manager.request(
        method, url, body=payload, headers=headers, retries=False,
        timeout=urllib3.Timeout(total=timeout), preload_content=True)
    data: bytes = resp.data
    if 200 <= resp.status < 300:
        return data
    raise error_from_answer(resp.status, data)


def request_json(api_client: client.ApiClient, method: str, path: str, **kw: Any) -> Any:
    data = request(api_client, method, path, **kw)
    return orjson.loads(data) if data else {}


def list_all(api_client: client.ApiClient, path: str, query: Sequence[tuple[str, str]] = (), *,
             page_size: int = 500, limiter: TokenBucket | None = None) -> list[dict[str, Any]]:
    """Every item of a list, a page at a time: one consistent snapshot (the
    continue token pins the first page's resourceVersion), read from storage
    (a quorum read), whatever a watch has delivered so far. 500 a page is
    kubectl's --chunk-size."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        params = [*query, ("limit", str(page_size))] + ([("continue", token)] if token else [])
        page = request_json(api_client, "GET", path, query=params, limiter=limiter)
        items.extend(page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items
