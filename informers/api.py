"""Raw GETs to the API server through the official client's connection pool.

The official ``kubernetes`` client supplies configuration, authentication
and TLS only: requests go straight through its urllib3 pool and the bytes
are decoded by orjson into plain dicts, never into models (several times
faster, and what the cache stores anyway).

This is the only informers module that knows about HTTP, urllib3 or the
``kubernetes`` package; everything above it sees ``ListerWatcher``.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import urlencode

import orjson
import urllib3

from informers import gcpause
from informers.errors import ApiStatusError, TransportError
from informers.listwatch import ListPage, is_initial_events_end
from informers.objects import KubeObject
from informers.resource import Resource
from informers.transforms import Transform

if TYPE_CHECKING:
    # Only for annotations: the client is used for its configuration and
    # connection pool, so importing its (large) package is the caller's business.
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

# How long a list page may take to arrive; a page of 500 objects comes in
# well under a second, a full unpaginated list of a big cluster in seconds.
DEFAULT_LIST_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 10.0
# The client-side read timeout of a watch is the server's timeoutSeconds
# plus this much: a healthy server ends the watch first, so hitting it
# means the connection died without a FIN (a host gone, a dropped route).
WATCH_READ_MARGIN = 30.0
# The most a WatchList stream's initial events wait to be read together
# (the watch batch window applies after them; see ResourceListerWatcher.watch).
INITIAL_EVENTS_BATCH_WINDOW = 0.02
_STREAM_CHUNK = 1 << 16
# Only a list's kind, apiVersion and (for built-in kinds) metadata come
# before its items; more than this before "items":[ means an unexpected shape.
_MAX_LIST_HEAD = 1 << 16
# Consumed bytes are dropped from the read buffer once this many pile up.
_STREAM_KEEP = 1 << 20


def decode(body: bytes) -> Any:
    """orjson.loads with the cyclic garbage collector paused (see ``gcpause``)."""
    with gcpause.paused():
        return orjson.loads(body)


def _retry_after(resp: urllib3.BaseHTTPResponse) -> float | None:
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _status_error(resp: urllib3.BaseHTTPResponse, body: bytes) -> ApiStatusError:
    try:
        status: Any = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        status = body[:200].decode("utf-8", "replace")
    return ApiStatusError.from_status(status, resp.status, _retry_after(resp))


class _UnexpectedListFormat(Exception):
    pass


def _read_list_streamed(
    resp: urllib3.BaseHTTPResponse, transform: Transform | None
) -> tuple[list[KubeObject], dict[str, Any]]:
    """Decode a list answer item by item while it arrives.

    Why: decoding the whole answer at the end holds all its bytes and every
    item at full size at once (for 20,000 pods: 58 MB of JSON and 200 MB of
    objects, memory the process keeps), and leaves the CPU idle while the
    server encodes. Item by item, each one is decoded and transformed (made
    small) while the server is still writing the next ones.

    How: the API server writes ``"items":[`` and then the items with no
    space between them. Every item starts the way the first one does (its
    first key: ``{"metadata":`` for built-in kinds, ``{"apiVersion":`` for
    custom resources), so ``},`` followed by that start marks a boundary.
    The same bytes can also occur deeper inside an item (a list of embedded
    objects), never inside a string (quotes there are escaped); a cut at a
    deeper level leaves unclosed brackets, so such a piece does not decode
    and is joined with the next one. Whatever comes before and after the
    array (kind, metadata: custom resource lists put it after) is decoded
    as one document with the array emptied. Anything unexpected raises
    ``_UnexpectedListFormat`` and the caller asks again and decodes whole.
    """
    loads = orjson.loads
    buf = bytearray()
    items: list[KubeObject] = []
    head = b""
    start = -1  # offset in buf of the next item, once "items":[ was seen
    sep = b""
    scan = 0
    for chunk in resp.stream(_STREAM_CHUNK, decode_content=True):
        buf += chunk
        if start < 0:
            at = buf.find(b'"items":[')
            if at < 0:
                if len(buf) > _MAX_LIST_HEAD:
                    raise _UnexpectedListFormat("no items array near the start")
                continue
            head = bytes(buf[:at])
            start = scan = at + len(b'"items":[')
        if not sep:
            if buf[start : start + 1] == b"]":
                continue  # no items; the rest is the tail
            key_end = buf.find(b'":', start)
            if key_end < 0:
                continue
            sep = b"}," + bytes(buf[start : key_end + 2])
        # A view decodes items in place; it is released before buf grows.
        with memoryview(buf) as view:
            while True:
                cut = buf.find(sep, scan)
                if cut < 0:
                    scan = max(start, len(buf) - len(sep) + 1)
                    break
                try:
                    obj = loads(view[start : cut + 1])
                except orjson.JSONDecodeError:
                    scan = cut + 1  # a cut inside an item: join with the next piece
                    continue
                items.append(transform(obj) if transform is not None else obj)
                start = scan = cut + 2
        if start > _STREAM_KEEP:
            del buf[:start]
            scan -= start
            start = 0
    if start < 0:
        raise _UnexpectedListFormat("no items array")
    rest = bytes(buf[start:])
    if rest.startswith(b"]"):
        after = rest[1:]
    else:
        # The last item ends at the first "}]" that closes it whole.
        end = rest.find(b"}]")
        while True:
            if end < 0:
                raise _UnexpectedListFormat("the items array does not end")
            try:
                obj = loads(rest[: end + 1])
                break
            except orjson.JSONDecodeError:
                end = rest.find(b"}]", end + 1)
        items.append(transform(obj) if transform is not None else obj)
        after = rest[end + 2 :]
    try:
        doc = loads(head + b'"items":[]' + after)
    except orjson.JSONDecodeError as e:
        raise _UnexpectedListFormat(f"what surrounds the items is not JSON: {e}") from e
    meta = (doc.get("metadata") or {}) if isinstance(doc, dict) else {}
    return items, meta


class RawClient:
    """GET requests with the credentials and TLS of a ``kubernetes.client.ApiClient``."""

    def __init__(
        self, api_client: ApiClient, *, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    ) -> None:
        self._api_client = api_client
        self._pool = api_client.rest_client.pool_manager
        self._host = str(api_client.configuration.host).rstrip("/")
        self._connect_timeout = connect_timeout

    def _headers(self, path: str) -> dict[str, str]:
        headers: dict[str, str] = {"Accept": "application/json"}
        headers.update(self._api_client.default_headers)
        # Adds the bearer token, refreshing it first when the kubeconfig
        # uses an exec plugin or a token file (refresh_api_key_hook).
        self._api_client.update_params_for_auth(headers, [], ["BearerToken"], path, "GET", None)
        return headers

    def get(
        self, path: str, params: list[tuple[str, str]], *, read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        """Start a GET and return the unread response; non-2xx raises ``ApiStatusError``.

        The caller must ``release_conn`` (or ``close``) the response.
        """
        url = self._host + path
        if params:
            url += "?" + urlencode(params)
        try:
            resp = self._pool.request(
                "GET",
                url,
                headers=self._headers(path),
                preload_content=False,
                timeout=urllib3.Timeout(connect=self._connect_timeout, read=read_timeout),
                # The reflector has its own backoff; hidden retries would
                # only delay noticing that the server is gone.
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise TransportError(f"GET {path}: {e}") from e
        if resp.status >= 300:
            try:
                body = resp.read()
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise TransportError(f"GET {path}: HTTP {resp.status}, body lost: {e}") from e
            finally:
                resp.release_conn()
            raise _status_error(resp, body)
        return resp


class HttpWatchStream:
    """The events of one watch response, one JSON document per line."""

    def __init__(
        self, resp: urllib3.BaseHTTPResponse, on_done: Any = None, *, gather: float = 0.0,
        initial_gather: float | None = None,
    ) -> None:
        """``gather`` (seconds; 0 for none): once nothing more is waiting
        on the socket, wait this long before the next read, so that events
        arriving meanwhile come in one read (see ``_gathering``).
        ``initial_gather``: the wait until the bookmark that ends a
        WatchList stream's initial events, ``gather`` after it (None: a
        stream without initial events, ``gather`` throughout)."""
        self._resp = resp
        self._closed = False
        self._on_done = on_done
        self._gather = gather
        self._initial = initial_gather is not None
        self._gather_now = gather if initial_gather is None else initial_gather

    def __iter__(self) -> Iterator[tuple[str, KubeObject]]:
        loads = orjson.loads
        rest = b""
        raw = _raw_chunked(self._resp)
        try:
            before_read = None
            if raw is not None and max(self._gather, self._gather_now) > 0:
                before_read = _gathering(raw, lambda: self._gather_now)
            blocks = (_dechunked(raw.read1, before_read) if raw is not None
                      else self._resp.stream(_STREAM_CHUNK, decode_content=True))
            for chunk in blocks:
                if rest:
                    chunk = rest + chunk
                lines = chunk.split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line:
                        event = loads(line)
                        if self._initial and event["type"] == "BOOKMARK" \
                                and is_initial_events_end(event["object"]):
                            self._initial = False
                            self._gather_now = self._gather
                        yield event["type"], event["object"]
            if rest.strip() and not self._closed:
                raise TransportError("watch ended in the middle of an event")
        except (urllib3.exceptions.HTTPError, OSError, orjson.JSONDecodeError, KeyError) as e:
            if not self._closed:
                raise TransportError(f"watch broke: {e}") from e
        finally:
            self.close()

    def close(self) -> None:
        first = not self._closed
        self._closed = True
        resp = self._resp
        try:
            # shutdown() wakes a thread blocked reading this socket; close()
            # alone would leave it waiting for the read timeout.
            resp.shutdown()
        except (ValueError, RuntimeError, OSError):
            pass
        resp.close()
        if first and self._on_done is not None:
            self._on_done(self)


def _raw_chunked(resp: urllib3.BaseHTTPResponse) -> Any:
    """The buffered socket reader under a chunked, unencoded response (the
    API server's watch), or None to read through urllib3.

    The server sends each watch event as one HTTP chunk; urllib3 reads
    chunk by chunk (a readline and a read each), which made a WatchList of
    20,000 pods cost a second more than the same pods listed. Reading big
    blocks and taking the chunk framing apart here costs a `find` per chunk.
    """
    fp = getattr(getattr(resp, "_fp", None), "fp", None)
    encoding = (resp.headers.get("Content-Encoding") or "identity").lower()
    if fp is None or not getattr(resp, "chunked", False) or encoding != "identity" \
            or not hasattr(fp, "read1"):
        return None
    return fp


def _gathering(
    fp: Any, gather: Callable[[], float], sleep: Callable[[float], None] = time.sleep
) -> Callable[[], None] | None:
    """What ``_dechunked`` calls before each read of `fp` (the buffered
    reader of ``_raw_chunked``): when nothing is waiting to be read, sleep
    `gather()` seconds, so that events arriving meanwhile come in one read.
    None when the socket is out of reach.

    Why: the API server flushes each watch event by itself, so events read
    as they come cost a blocking read and a wake-up each, which in CPython
    is most of what an event costs its reader (``make bench-watch``). The
    first event after a quiet spell is read at once (the sleep came before
    the blocking read, not after it); under load, events gather for up to
    `gather` seconds and are read without waiting.

    How "nothing is waiting" is told: ``read1`` returns what the reader has
    buffered, or else makes one raw read straight into its answer, so after
    a ``read1`` of ``_STREAM_CHUNK`` (more than the reader's buffer) nothing
    is left buffered above the socket. What TLS decrypted but not yet
    handed over is ``pending()``; what the kernel holds, a poll says.
    """
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    if sock is None or not hasattr(sock, "fileno"):
        return None
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
    except (OSError, ValueError):
        return None
    pending = getattr(sock, "pending", None)

    def wait() -> None:
        seconds = gather()
        if seconds > 0 and not ((pending is not None and pending()) or poller.poll(0)):
            sleep(seconds)

    return wait


def _dechunked(
    read1: Callable[[int], bytes], before_read: Callable[[], None] | None = None
) -> Iterator[bytes]:
    """The payload of an HTTP/1.1 chunked body (RFC 9112 7.1) read with
    `read1`, one piece per block read: every chunk complete in the block,
    joined. Ends at the last (zero) chunk; a body cut short raises OSError.
    `before_read`, if given, is called before each read (``_gathering``).
    """
    buf = b""
    pos = 0
    while True:
        if before_read is not None:
            before_read()
        block = read1(_STREAM_CHUNK)
        if not block:
            raise OSError("the connection closed in the middle of a chunked body")
        buf = buf[pos:] + block if pos < len(buf) else block
        pos = 0
        pieces: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size_field = buf[pos:eol].split(b";", 1)[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise OSError(f"bad chunk size {size_field[:20]!r}") from None
            if size == 0:
                if pieces:
                    yield b"".join(pieces)
                return  # trailers, if any, are left unread with the connection
            start = eol + 2
            end = start + size
            if len(buf) < end + 2:
                break  # the rest of this chunk is in a later block
            pieces.append(buf[start:end])
            pos = end + 2
        if pieces:
            yield b"".join(pieces)


class ResourceListerWatcher:
    """Lists and watches one resource (optionally one namespace, selectors) over HTTP."""

    supports_watch_list = True

    def __init__(
        self,
        client: RawClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        list_timeout: float = DEFAULT_LIST_TIMEOUT,
        watch_batch_window: float = 0.0,
    ) -> None:
        """``watch_batch_window``: see ``HttpWatchStream``'s ``gather``."""
        self.resource = resource
        self._client = client
        self._path = resource.collection_path(namespace)
        self._selectors: list[tuple[str, str]] = []
        if label_selector:
            self._selectors.append(("labelSelector", label_selector))
        if field_selector:
            self._selectors.append(("fieldSelector", field_selector))
        self._list_timeout = list_timeout
        self._watch_batch_window = watch_batch_window
        self._lock = threading.Lock()
        self._inflight: set[urllib3.BaseHTTPResponse] = set()
        self._streams: set[HttpWatchStream] = set()

    def list_page(
        self,
        *,
        resource_version: str,
        limit: int,
        continue_token: str,
        transform: Transform | None = None,
    ) -> ListPage:
        params = list(self._selectors)
        if continue_token:
            # The API server refuses a resourceVersion beside a continue token.
            params.append(("continue", continue_token))
        elif resource_version:
            params.append(("resourceVersion", resource_version))
        if limit > 0:
            params.append(("limit", str(limit)))
        try:
            return self._get_list(params, transform, streamed=True)
        except _UnexpectedListFormat as e:
            log.warning("list %s: %s; decoding it whole", self.resource, e)
            return self._get_list(params, transform, streamed=False)

    def _get_list(
        self, params: list[tuple[str, str]], transform: Transform | None, streamed: bool
    ) -> ListPage:
        resp = self._client.get(self._path, params, read_timeout=self._list_timeout)
        with self._lock:
            self._inflight.add(resp)
        try:
            if streamed:
                items, meta = _read_list_streamed(resp, transform)
            else:
                data = decode(resp.read())
                meta = data.get("metadata") or {}
                items = data.get("items") or []
                if transform is not None:
                    items = [transform(o) for o in items]
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise TransportError(f"list {self.resource}: {e}") from e
        except orjson.JSONDecodeError as e:
            raise TransportError(f"list {self.resource}: bad JSON: {e}") from e
        finally:
            with self._lock:
                self._inflight.discard(resp)
            resp.release_conn()
        return ListPage(
            items=items,
            resource_version=str(meta.get("resourceVersion") or ""),
            continue_token=str(meta.get("continue") or ""),
        )

    def watch(
        self, *, resource_version: str, timeout_seconds: int, send_initial_events: bool = False
    ) -> HttpWatchStream:
        params = list(self._selectors)
        params += [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version:
            params.append(("resourceVersion", resource_version))
        if send_initial_events:
            # The API server allows this pair only together (and only with
            # bookmarks): a server without WatchList refuses it with 422.
            params += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        resp = self._client.get(
            self._path, params, read_timeout=timeout_seconds + WATCH_READ_MARGIN
        )
        # A WatchList's initial events come as fast as the server encodes
        # them: a long sleep whenever the reader has caught up would hold
        # the sync back (10,000 pods: 2.4 s with 20 ms, 2.9 s with 100 ms).
        stream = HttpWatchStream(
            resp, on_done=self._forget, gather=self._watch_batch_window,
            initial_gather=min(self._watch_batch_window, INITIAL_EVENTS_BATCH_WINDOW)
            if send_initial_events else None)
        with self._lock:
            self._streams.add(stream)
        return stream

    def _forget(self, stream: HttpWatchStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def abort(self) -> None:
        with self._lock:
            responses = list(self._inflight)
            streams = list(self._streams)
        for resp in responses:
            try:
                resp.shutdown()
            except (ValueError, RuntimeError, OSError):
                pass
        for stream in streams:
            stream.close()
