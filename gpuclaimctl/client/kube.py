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

import copy
import functools
import os
import re
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Callable
from urllib.parse import quote, urlsplit

import orjson
import urllib3
from kubernetes import client, config

# Re-exported: callers and tests catch `kube.ApiError`; it is errors.ApiError.
from gpuclaimctl.client.errors import ApiError as ApiError
from gpuclaimctl.client.errors import error_from_answer
from gpuclaimctl.client.fence import NotLeader
from gpuclaimctl.client.http11 import Http11


class ConfigError(Exception):
    """No usable client configuration; str() is one line for a person."""


def load_client(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """The cluster to talk to, found as controller-runtime's GetConfig
    finds it: the kubeconfig named (`--kubeconfig`; a context alone picks
    from the default one), else $KUBECONFIG, else the in-cluster service
    account, else ~/.kube/config; ConfigError if none."""
    named = kubeconfig or os.environ.get("KUBECONFIG") or None
    if named or context:
        return _from_kubeconfig(named, context)
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        home = os.path.expanduser("~/.kube/config")
        if os.path.exists(home):
            return _from_kubeconfig(home, None)
        raise ConfigError(
            "no cluster to talk to: not running in a pod, no $KUBECONFIG, no ~/.kube/config; "
            "pass --kubeconfig (and --context)"
        ) from None
    return client.ApiClient(configuration)


def _from_kubeconfig(path: str | None, context: str | None) -> client.ApiClient:
    try:
        api: client.ApiClient = config.new_client_from_config(config_file=path, context=context)
        return api
    except Exception as e:  # a user's file: bad YAML or a wrong shape raises anything
        where = path or "the default kubeconfig"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"cannot load {where}: {first}") from None


def client_for(api_client: client.ApiClient, role: str, *,
               retries: int | None = None) -> client.ApiClient:
    """Its own client for one part of the process, from a copy of
    `api_client`'s configuration, whose User-Agent ends in `role`: the
    Lease ("leader-election"), the webhook's certificates, the metrics
    endpoint's reviews. The controller's own reads and writes keep the bare
    User-Agent, so an audit log tells them apart from what every replica
    sends whether it leads or not."""
    configuration = copy.deepcopy(api_client.configuration)
    if retries is not None:
        configuration.retries = retries
    made = client.ApiClient(configuration)
    made.user_agent = f"{api_client.user_agent} {role}"
    return made


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
    given, is called after that wait (which may be long) and again right
    before the request's bytes leave (the lean transport; after connecting):
    it raises to stop the request, or returns the most seconds the request
    may take.
    """
    if limiter is not None:
        limiter.wait()
    base, headers = _prepared(api_client, content_type)
    transport = _transport(api_client, base)
    if fence is not None:
        timeout = min(timeout, fence())
        # The API server's own deadline too (client-go sends it as well): a
        # write it is still working on when this process gives up must not
        # land after another replica took the Lease over, as it could for
        # up to --request-timeout (60 s) otherwise. It bounds the handler's
        # context, so a write not yet handed to storage by then never is.
        # The lean transport takes it from the time left right before the
        # send (Http11.request's server_deadline); through urllib3, from now.
        if transport is None:
            query = [*(query or ()), ("timeout", f"{max(1, int(timeout * 1000))}ms")]
    target = path
    if query:
        target += "?" + "&".join(f"{k}={_quoted(str(v))}" for k, v in query)  # as param_serialize
    # Encoded here, once, by orjson: the client's own path walks every body
    # with sanitize_for_serialization and json.dumps.
    payload = None if body is None else orjson.dumps(body)
    if transport is not None:
        # The fence again, once the connection is ready: see Http11.request.
        status, data = transport.request(method, _base_path(base) + target, headers, payload,
                                         timeout, fence, server_deadline=fence is not None)
    else:
        # urllib3 (a proxy): no hook before the send; the check above stands.
        resp = api_client.rest_client.pool_manager.request(
            method, base + target, body=payload, headers=headers, retries=False,
            timeout=urllib3.Timeout(total=timeout), preload_content=True)
        status, data = resp.status, resp.data
    answer = _answer(api_client, status, data)
    if isinstance(answer, ApiError):
        raise answer
    return answer


def _answer(api_client: client.ApiClient, status: int, data: bytes) -> bytes | ApiError:
    """The body of a 2xx answer, or the ApiError any other means."""
    if 200 <= status < 300:
        return data
    if status == 401:
        _PREPARED.pop(api_client, None)  # the token was refused: read it again next time
    return error_from_answer(status, data)


Sent = tuple[str, str, Any, str]
"""One request of `request_many`: method, path, body (encoded as JSON; None
for none), content type."""


def request_many(
    api_client: client.ApiClient,
    requests: Sequence[Sent],
    *,
    timeout: float = 30.0,
    fence: Callable[[], float] | None = None,
) -> list[bytes | ApiError | OSError | NotLeader]:
    """Send `requests` in order; return, for each, its body, the ApiError its
    answer means, or an OSError where no answer came (it may or may not
    have been served). What `fence` raises before the first request stops
    them all, as in `request`; raised before a later one (through urllib3),
    it takes that request's place and the rest's, none of which was sent.

    Over the lean transport they go back to back on one connection
    (Http11.pipeline): a batch of small writes costs the round trip and the
    wake-ups once, not once each (`make bench-http`). A caller pipelining
    creates must be able to tell a create sent again (see Http11.pipeline).
    Each gets a share of `timeout` (and of the fenced time) as the API
    server's deadline, as the server works on them one after another.
    Through urllib3 (a proxy) they are sent one after another, each with
    its share of the time.
    """
    if fence is not None:
        timeout = min(timeout, fence())
    base = _prepared(api_client, "application/json")[0]
    transport = _transport(api_client, base)
    if transport is None:
        share = timeout / max(1, len(requests))
        results: list[bytes | ApiError | OSError | NotLeader] = []
        for method, path, body, content_type in requests:
            try:
                results.append(request(api_client, method, path, body=body, content_type=content_type,
                                       timeout=share, fence=fence))
            except (ApiError, OSError) as e:
                results.append(e)
            except urllib3.exceptions.HTTPError as e:
                results.append(OSError(f"{method} {path}: {e}"))
            except NotLeader as e:
                if not results:
                    raise  # nothing was sent
                results.extend(e for _ in range(len(requests) - len(results)))
                break
        return results
    prefix = _base_path(base)
    headers = {t: _prepared(api_client, t)[1] for t in {r[3] for r in requests}}
    prepared = [(method, prefix + path, headers[content_type],
                 None if body is None else orjson.dumps(body))
                for method, path, body, content_type in requests]
    out: list[bytes | ApiError | OSError | NotLeader] = []
    for answer in transport.pipeline(prepared, timeout, fence, server_deadline=fence is not None):
        out.append(answer if isinstance(answer, OSError) else _answer(api_client, *answer))
    return out


# How long the URL base and headers (the bearer token above all) the
# client makes are reused. Making them runs the kubeconfig loader's token
# refresh hook, which rebuilds the client's configuration (proxy settings
# from the environment included) on every call: about a tenth of the
# controller's CPU when it did so per request. client-go re-reads a token
# file once a minute; a refused token (401) is read again at once.
PREPARED_FOR = 30.0

_PREPARED: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, str, dict[str, str]]]] = \
    weakref.WeakKeyDictionary()


_TRANSPORTS: weakref.WeakKeyDictionary[Any, tuple[str, Http11 | None]] = weakref.WeakKeyDictionary()
_TRANSPORTS_LOCK = threading.Lock()


def _transport(api_client: client.ApiClient, base: str) -> Http11 | None:
    """The client's lean HTTP/1.1 transport (client.http11) for `base`, made
    once; None where it cannot serve, and the request goes through urllib3."""
    made = _TRANSPORTS.get(api_client)
    if made is None or made[0] != base:
        with _TRANSPORTS_LOCK:
            made = _TRANSPORTS.get(api_client)
            if made is None or made[0] != base:
                made = (base, Http11.for_client(api_client, base))
                _TRANSPORTS[api_client] = made
    return made[1]


@functools.lru_cache(maxsize=16)
def _base_path(base: str) -> str:
    """The path of the server's URL (a proxy's prefix, as in
    https://rancher/k8s/clusters/c-1), put before every request's path.
    Cached: the URL does not change, and it was split for every request."""
    return urlsplit(base).path.rstrip("/")


_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]*").fullmatch


def _quoted(value: str) -> str:
    """`quote(value)`; a value with nothing to quote (the write deadline's
    "1000ms", a name) is taken as it is, without quote's own work."""
    return value if _UNRESERVED(value) else quote(value)


def _prepared(api_client: client.ApiClient, content_type: str) -> tuple[str, dict[str, str]]:
    """The URL base (scheme, host, port) and the headers of a request with
    `content_type`, made by the client (auth, user agent), reused for
    PREPARED_FOR seconds. Threads racing to make them make them twice: harmless."""
    now = time.monotonic()
    per_type = _PREPARED.get(api_client)
    if per_type is None:
        per_type = _PREPARED.setdefault(api_client, {})
    made = per_type.get(content_type)
    if made is None or made[0] <= now:
        _method, url, headers, _body, _post = api_client.param_serialize(
            "GET", "", query_params=[],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        made = (now + PREPARED_FOR, url, dict(headers))
        per_type[content_type] = made
    return made[1], dict(made[2])  # a copy: nothing may change the shared one


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
