"""The webhook's HTTPS server, AdmissionReview handling and certificates, on loopback."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from cryptography import x509

from gpuclaimctl.client import certs
from gpuclaimctl.cmd.webhookserver import WebhookServer
from gpuclaimctl.webhook.review import (
    AdmissionRequest,
    BadReview,
    Operation,
    Verdict,
    allow,
    deny,
    parse_review,
    response,
)
from tests.helpers import wait_for

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOSTS = ["127.0.0.1", "localhost"]


def review(**request: Any) -> dict[str, Any]:
    body = {"uid": "u-1", "operation": "CREATE", "namespace": "team", "name": "p",
            "userInfo": {"username": "alice"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"metadata": {"name": "p"}}}
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


# -- AdmissionReview ------------------------------------------------------------------


def test_a_review_is_read_into_a_request() -> None:
    req = parse_review(json.dumps(review(operation="UPDATE", oldObject={"metadata": {}},
                                         dryRun=True)).encode())
    assert (req.uid, req.operation, req.namespace, req.username, req.resource) == (
        "u-1", Operation.UPDATE, "team", "alice", "pods")
    assert req.dry_run and req.old_object == {"metadata": {}}


@pytest.mark.parametrize("body", [
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe", id="not-utf8"),
    pytest.param(b"[1, 2]", id="not-an-object"),
    pytest.param(json.dumps({**review(), "apiVersion": "admission.k8s.io/v1beta1"}).encode(), id="v1beta1"),
    pytest.param(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
                 id="no-request"),
    pytest.param(json.dumps(review(uid="")).encode(), id="no-uid"),
    pytest.param(json.dumps(review(operation="EXPLODE")).encode(), id="unknown-operation"),
    pytest.param(json.dumps(review(object=None)).encode(), id="create-without-object"),
    pytest.param(json.dumps(review(operation="UPDATE")).encode(), id="update-without-old-object"),
    pytest.param(json.dumps(review(object="pod")).encode(), id="object-not-an-object"),
    pytest.param(json.dumps(review(userInfo=None)).encode(), id="no-user"),
    # The decoder's recursion limit raised RecursionError, which no handler
    # caught: the connection dropped without an answer.
    pytest.param(b"[" * 5000 + b"]" * 5000, id="nested-too-deeply"),
    pytest.param(json.dumps(review()).encode()[:-2] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
                 id="request-nested-too-deeply"),
])
def test_anything_but_a_review_is_refused_with_a_reason(body: bytes) -> None:
    with pytest.raises(BadReview) as refused:
        parse_review(body)
    assert str(refused.value)


def test_the_answer_echoes_the_uid_with_a_status_or_a_patch() -> None:
    refused = response("u-9", deny("no\n  way"))["response"]
    assert refused == {"uid": "u-9", "allowed": False,
                       "status": {"code": 403, "reason": "Forbidden", "message": "no way"}}
    patched = response("u-9", allow([{"op": "add", "path": "/a", "value": 1}]))["response"]
    assert patched["patchType"] == "JSONPatch" and patched["allowed"] is True


# -- certificates ----------------------------------------------------------------------------

POLICY = certs.CertPolicy(ca_validity=timedelta(days=30), serving_validity=timedelta(days=3),
                          backdate=timedelta(0))


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate_for_the_hosts() -> None:
    assert certs.plan({}, HOSTS, NOW, POLICY).renewal is certs.Renewal.CA
    data = certs.issue({}, HOSTS, NOW, certs.Renewal.CA, POLICY)
    assert certs.plan(data, HOSTS, NOW, POLICY).renewal is certs.Renewal.NONE
    cert = x509.load_pem_x509_certificate(data[certs.TLS_CERT])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_the_serving_certificate_is_renewed_at_two_thirds_of_its_life_under_the_same_ca() -> None:
    data = certs.issue({}, HOSTS, NOW, certs.Renewal.CA, POLICY)
    assert certs.plan(data, HOSTS, NOW + timedelta(days=1.9), POLICY).renewal is certs.Renewal.NONE
    later = NOW + timedelta(days=2.1)
    assert certs.plan(data, HOSTS, later, POLICY).renewal is certs.Renewal.SERVING
    renewed = certs.issue(data, HOSTS, later, certs.Renewal.SERVING, POLICY)
    assert renewed[certs.CA_CERT] == data[certs.CA_CERT]
    assert renewed[certs.TLS_CERT] != data[certs.TLS_CERT]
    assert certs.next_renewal(renewed, POLICY) == later + timedelta(days=2)


def test_a_renewed_ca_keeps_the_old_one_in_the_bundle_until_it_expires() -> None:
    data = certs.issue({}, HOSTS, NOW, certs.Renewal.CA, POLICY)
    later = NOW + timedelta(days=21)
    assert certs.plan(data, HOSTS, later, POLICY).renewal is certs.Renewal.CA
    renewed = certs.issue(data, HOSTS, later, certs.Renewal.CA, POLICY)
    bundle = x509.load_pem_x509_certificates(renewed[certs.CA_CERT])
    old = x509.load_pem_x509_certificates(data[certs.CA_CERT])[0]
    assert len(bundle) == 2 and bundle[1] == old
    assert certs.newest_ca(renewed[certs.CA_CERT]) == bundle[0].not_valid_before_utc
    # Once the old CA expired it leaves the bundle at the next renewal.
    much_later = NOW + timedelta(days=45)
    again = certs.issue(renewed, HOSTS, much_later, certs.Renewal.SERVING, POLICY)
    assert len(x509.load_pem_x509_certificates(again[certs.CA_CERT])) == 1


@pytest.mark.parametrize("broken", ["tls.key", "ca.key", "hosts"])
def test_anything_that_does_not_hold_together_is_replaced(broken: str) -> None:
    data = certs.issue({}, HOSTS, NOW, certs.Renewal.CA, POLICY)
    other = certs.issue({}, HOSTS, NOW, certs.Renewal.CA, POLICY)
    hosts = HOSTS
    if broken == "hosts":
        hosts = [*HOSTS, "gpuclaimctl-webhook.gpuclaimctl-system.svc"]
    else:
        data = {**data, broken: other[broken]}
    expected = certs.Renewal.CA if broken == "ca.key" else certs.Renewal.SERVING
    assert certs.plan(data, hosts, NOW, POLICY).renewal is expected


# -- the server ----------------------------------------------------------------------------------


def write_pair(directory: Path, data: dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.key").write_bytes(data[certs.TLS_KEY])
    (directory / "tls.crt").write_bytes(data[certs.TLS_CERT])


class Served:
    def __init__(self, tmp: Path) -> None:
        self.now = datetime.now(timezone.utc)
        self.data = certs.issue({}, HOSTS, self.now, certs.Renewal.CA)
        self.dir = tmp / "certs"
        write_pair(self.dir, self.data)
        self.ca = tmp / "ca.crt"
        self.ca.write_bytes(self.data[certs.CA_CERT])
        self.ready = ""
        self.seen: list[AdmissionRequest] = []

        def route(req: AdmissionRequest) -> Verdict:
            self.seen.append(req)
            if req.name == "boom":
                raise RuntimeError("boom")
            return deny("no pods named bad") if req.name == "bad" else allow()

        self.server = WebhookServer("127.0.0.1:0", self.dir, {"/validate-pods": route},
                                    not_ready=lambda: self.ready)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def post(self, body: bytes, path: str = "/validate-pods?timeout=5s",
             headers: dict[str, str] | None = None, conn: http.client.HTTPSConnection | None = None,
             method: str = "POST") -> tuple[int, bytes]:
        c = conn or http.client.HTTPSConnection("127.0.0.1", self.server.port, context=self.context(),
                                                timeout=5)
        c.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, data

    def serial(self) -> int:
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=5) as raw:
            with self.context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return int(x509.load_der_x509_certificate(der).serial_number)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    s.server.start()
    try:
        yield s
    finally:
        s.server.stop()


def test_a_review_gets_its_answer_over_tls(served: Served) -> None:
    status, body = served.post(json.dumps(review(name="bad")).encode())
    assert status == 200
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == "no pods named bad"


def test_bad_requests_are_refused_and_the_server_keeps_serving(served: Served) -> None:
    conn = http.client.HTTPSConnection("127.0.0.1", served.server.port, context=served.context(), timeout=5)
    assert served.post(b"{not json", conn=conn)[0] == 400
    assert b"malformed AdmissionReview" in served.post(b"[]", conn=conn)[1]
    assert served.post(b"{}", path="/elsewhere", conn=conn)[0] == 404
    assert served.post(b"", method="GET", conn=conn)[0] == 405
    assert served.post(json.dumps(review(name="boom")).encode(), conn=conn)[0] == 500
    conn.close()
    assert served.post(b"x" * 10, headers={"Content-Length": str(64 << 20)})[0] == 413
    # Garbage instead of a TLS handshake, and a client that never speaks.
    with socket.create_connection(("127.0.0.1", served.server.port)) as junk:
        junk.sendall(b"GET / HTTP/1.1\r\n\r\n")
        silent = socket.create_connection(("127.0.0.1", served.server.port))
        assert served.post(json.dumps(review()).encode())[0] == 200
        silent.close()


def test_reviews_wait_for_the_caches(served: Served) -> None:
    served.ready = "caches not synced"
    status, body = served.post(json.dumps(review()).encode())
    assert status == 503 and b"caches not synced" in body
    assert served.seen == []


def test_new_connections_get_a_rotated_certificate_while_old_ones_keep_working(served: Served) -> None:
    before = served.serial()
    kept = http.client.HTTPSConnection("127.0.0.1", served.server.port, context=served.context(), timeout=5)
    assert served.post(json.dumps(review()).encode(), conn=kept)[0] == 200
    renewed = certs.issue(served.data, HOSTS, served.now, certs.Renewal.SERVING)
    write_pair(served.dir, renewed)
    wait_for(lambda: served.serial() != before, timeout=10, message="the new certificate to be served")
    assert served.serial() == x509.load_pem_x509_certificate(renewed[certs.TLS_CERT]).serial_number
    assert served.post(json.dumps(review()).encode(), conn=kept)[0] == 200
    kept.close()


def test_a_half_written_pair_leaves_the_served_one_in_place(served: Served) -> None:
    before = served.serial()
    other = certs.issue({}, HOSTS, served.now, certs.Renewal.CA)
    (served.dir / "tls.crt").write_bytes(other[certs.TLS_CERT])  # the key still the old one
    time.sleep(1.5)
    assert served.serial() == before
    assert served.post(json.dumps(review()).encode())[0] == 200


def test_many_clients_at_once_are_all_answered(served: Served) -> None:
    results: list[int] = []

    def one() -> None:
        results.append(served.post(json.dumps(review()).encode())[0])

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [200] * 16


def test_after_sigterm_the_webhook_says_it_is_going_and_keeps_answering_a_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client

    from gpuclaimctl.cmd import webhook as webhook_mod
    from gpuclaimctl.cmd.options import Options
    from informers import SharedInformerFactory

    data = certs.issue({}, HOSTS, datetime.now(timezone.utc), certs.Renewal.CA)
    write_pair(tmp_path / "certs", data)
    options = Options(webhook_bind_address="127.0.0.1:0", webhook_cert_dir=str(tmp_path / "certs"),
                      webhook_self_signed=False)
    wh = webhook_mod.Webhook(client.ApiClient(), options, SharedInformerFactory(client.ApiClient()))
    monkeypatch.setattr(webhook_mod, "DRAIN_SECONDS", 0.5)
    wh.server.start()
    try:
        with pytest.raises(RuntimeError, match="caches not synced"):
            wh.check()
        wh.begin_drain()
        with pytest.raises(RuntimeError, match="shutting down"):
            wh.check()
        started = time.monotonic()
        stopper = threading.Thread(target=wh.stop)
        stopper.start()
        time.sleep(0.1)
        ca = tmp_path / "ca.crt"
        ca.write_bytes(data[certs.CA_CERT])
        conn = http.client.HTTPSConnection("127.0.0.1", wh.port, timeout=5,
                                           context=ssl.create_default_context(cafile=str(ca)))
        conn.request("POST", "/validate-pods", body=json.dumps(review()).encode())
        assert conn.getresponse().status == 503  # answered (caches empty here), not refused
        conn.close()
        stopper.join(5)
        assert time.monotonic() - started >= 0.5
    finally:
        wh.server.stop()


@pytest.mark.parametrize("obj", [
    {"metadata": "x"}, {"metadata": {"annotations": []}}, {"metadata": {"annotations": {"a": 1}}},
    {"spec": "x"}, {"spec": {"containers": "x"}}, {"spec": {"containers": [1]}},
    {"spec": {"initContainers": [{"resources": []}]}}, {"spec": {"containers": [{"resources": {"limits": 5}}]}},
    {"spec": {"overhead": "x"}}, {"spec": {"schedulingGates": {}}}, {"spec": {"nodeName": 3}},
])
def test_a_pod_of_the_wrong_shape_is_a_bad_review_not_a_crash_of_the_webhook(obj: dict[str, Any]) -> None:
    # The webhooks read these parts of a pod without checking each step:
    # such a body made them raise AttributeError, answered 500.
    body = json.dumps(review(object=obj)).encode()
    with pytest.raises(BadReview):
        parse_review(body)
    body = json.dumps(review(operation="UPDATE", object={"metadata": {}}, oldObject=obj)).encode()
    with pytest.raises(BadReview):
        parse_review(body)
