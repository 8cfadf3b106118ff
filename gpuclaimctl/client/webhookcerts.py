"""Keeps the webhook's certificate: the Secret, the files served, the caBundle.

Every replica runs one `CertKeeper` (every replica serves the webhook, the
standby too). Each `sync`:
1. reads the Secret and asks `certs.plan` what is due; when something is,
   makes it and writes the Secret back with the resourceVersion it read
   (an update; a create when there is none). Two replicas starting at once
   both read the same version and both make a CA: one write wins, the
   other gets 409 Conflict, reads again and takes the winner's;
2. writes `tls.crt`/`tls.key` into the cert dir when they changed (each
   file replaced whole), and calls `on_files` so the server loads them;
3. makes every webhook of the two configurations trust `ca.crt`. A
   replica never replaces a bundle whose newest CA is newer than its own
   (it read the Secret before another replica rotated it): it reads the
   Secret again instead, so two replicas cannot flip the bundle back and
   forth, and the bundle never loses the CA of a certificate being served.

Between syncs it waits `interval` (and never past the next renewal), so a
rotation by another replica reaches this one's files within `interval`;
the certificate it serves meanwhile stays valid (renewal is far ahead of
expiry and the old CA stays in the bundle).

The Secret needs get and update (create only where deploy/ did not make
it); the configurations get and update, each by name (deploy/webhook-rbac.yaml).
"""

from __future__ import annotations

import base64
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client

from gpuclaimctl.client import certs, kube
from gpuclaimctl.client.errors import AlreadyExists, Conflict, NotFound
from gpuclaimctl.logs import get_logger

_log = get_logger(__name__)

ADMISSION_PATH = "/apis/admissionregistration.k8s.io/v1"
CONFIGURATION_PLURALS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
# Secret writes lost to another replica in one sync before it gives up
# (and tries again after `retry`).
_ATTEMPTS = 5


class StaleSecret(Exception):
    """A configuration trusts a newer CA than the Secret this replica read."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def service_hosts(namespace: str, name: str) -> list[str]:
    """The names the API server uses for a `service:` client config."""
    return [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


class CertKeeper:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        secret: str,
        hosts: Sequence[str],
        configuration: str,
        cert_dir: Path,
        on_files: Callable[[], object] = lambda: None,
        policy: certs.CertPolicy = certs.CertPolicy(),
        interval: float = 60.0,
        retry: float = 5.0,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._api = api_client
        self._namespace, self._secret = namespace, secret
        self._hosts = list(hosts)
        self._configuration = configuration
        self._cert_dir = cert_dir
        self._on_files = on_files
        self._policy = policy
        self._interval, self._retry = interval, retry
        self._now = now
        self._lock = threading.Lock()
        # Guarded by _lock: what the last sync achieved.
        self._files_written = False
        self._injected = False
        self._last_error = "not synced yet"
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def hosts(self) -> list[str]:
        """The names and IPs the serving certificate is made for."""
        return list(self._hosts)

    @property
    def _secret_path(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/secrets/{self._secret}"

    # -- readiness -----------------------------------------------------------------

    def check(self) -> None:
        """Raise unless the serving files are written and every existing
        configuration trusts their CA."""
        with self._lock:
            if not (self._files_written and self._injected):
                raise RuntimeError(f"webhook certificate not ready: {self._last_error}")

    # -- the loop ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="webhook-certs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.sync()
            except Exception as e:  # the API server is away, or a write lost: try again soon
                with self._lock:
                    self._last_error = " ".join(str(e).split()) or type(e).__name__
                _log.warning("webhook certificate sync failed, will retry",
                             extra={"error": self._last_error, "retry": self._retry})
                wait = self._retry
            self._stop.wait(wait)

    def sync(self) -> float:
        """One pass; the seconds until the next one is due."""
        for _ in range(_ATTEMPTS):
            data = self._ensure_secret()
            self._write_files(data)
            try:
                all_found = self._inject(data[certs.CA_CERT])
            except StaleSecret:
                continue
            with self._lock:
                self._files_written = self._injected = True
                self._last_error = ""
            due = certs.next_renewal(data, self._policy)
            left = (due - self._now()).total_seconds() if due else 0.0
            # A configuration not there yet (applied after the Deployment) is
            # looked for again soon: until it has our CA, calls would fail.
            return max(0.1, min(self._interval if all_found else self._retry, left))
        raise RuntimeError("the webhook configurations trust a newer CA than the Secret shows")

    # -- 1. the Secret ---------------------------------------------------------------

    def _ensure_secret(self) -> dict[str, bytes]:
        for _ in range(_ATTEMPTS):
            secret = self._read_secret()
            data = _decode((secret or {}).get("data") or {})
            decision = certs.plan(data, self._hosts, self._now(), self._policy)
            if decision.renewal is certs.Renewal.NONE:
                return data
            fresh = certs.issue(data, self._hosts, self._now(), decision.renewal, self._policy)
            try:
                self._write_secret(secret, fresh)
            except (Conflict, AlreadyExists):
                _log.info("another replica wrote the webhook certificate first; reading it")
                continue
            _log.info("webhook certificate renewed",
                      extra={"what": decision.renewal.value, "why": decision.reason,
                             "secret": f"{self._namespace}/{self._secret}"})
            return fresh
        raise RuntimeError(f"the Secret {self._namespace}/{self._secret} kept changing under us")

    def _read_secret(self) -> dict[str, Any] | None:
        try:
            secret: dict[str, Any] = kube.request_json(self._api, "GET", self._secret_path)
            return secret
        except NotFound:
            return None

    def _write_secret(self, secret: Mapping[str, Any] | None, data: Mapping[str, bytes]) -> None:
        encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
        if secret is None:
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": self._secret, "namespace": self._namespace,
                                 "labels": {"app.kubernetes.io/name": "gpuclaimctl",
                                            "app.kubernetes.io/component": "webhook"}},
                    "data": encoded}
            kube.request(self._api, "POST", f"/api/v1/namespaces/{self._namespace}/secrets", body=body)
            return
        # The resourceVersion read: a write of another replica in between is a Conflict.
        body = {**secret, "data": {**(secret.get("data") or {}), **encoded}}
        kube.request(self._api, "PUT", self._secret_path, body=body)

    # -- 2. the files served -----------------------------------------------------------

    def _write_files(self, data: Mapping[str, bytes]) -> None:
        self._cert_dir.mkdir(parents=True, exist_ok=True)
        changed = False
        # The key first: a server that reloads between the two writes finds
        # a pair that does not match and keeps what it serves until the next.
        for name, mode in ((certs.TLS_KEY, 0o600), (certs.TLS_CERT, 0o644)):
            path = self._cert_dir / name
            try:
                if path.read_bytes() == data[name]:
                    continue
            except OSError:
                pass
            _replace(path, data[name], mode)
            changed = True
        if changed:
            self._on_files()

    # -- 3. the caBundle ------------------------------------------------------------------

    def _inject(self, bundle: bytes) -> bool:
        """Make every webhook of the existing configurations trust `bundle`;
        False if a configuration is missing (it has nothing to trust us with)."""
        wanted = base64.b64encode(bundle).decode()
        ours = certs.newest_ca(bundle)
        all_found = True
        for plural in CONFIGURATION_PLURALS:
            path = f"{ADMISSION_PATH}/{plural}/{self._configuration}"
            for _ in range(_ATTEMPTS):
                try:
                    config: dict[str, Any] = kube.request_json(self._api, "GET", path)
                except NotFound:
                    all_found = False
                    _log.v(2).info("no webhook configuration to inject the CA into",
                                   extra={"configuration": f"{plural}/{self._configuration}"})
                    break
                hooks = config.get("webhooks") or []
                current = [str((h.get("clientConfig") or {}).get("caBundle") or "") for h in hooks]
                if all(c == wanted for c in current):
                    break
                for c in current:
                    theirs = certs.newest_ca(_b64(c))
                    if theirs is not None and ours is not None and theirs > ours:
                        raise StaleSecret()
                for hook in hooks:
                    hook.setdefault("clientConfig", {})["caBundle"] = wanted
                try:
                    kube.request(self._api, "PUT", path, body=config)
                except Conflict:
                    continue
                _log.info("webhook CA bundle injected",
                          extra={"configuration": f"{plural}/{self._configuration}"})
                break
        return all_found


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text)
    except ValueError:
        return b""


def _decode(data: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: _b64(v) for k, v in data.items() if isinstance(v, str)}


def _replace(path: Path, content: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

