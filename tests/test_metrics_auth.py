"""Secure metrics (issue 15, item 6): /metrics over HTTPS, only for a bearer
token the API server authenticates (TokenReview) and authorizes for `get` on
the non-resource URL /metrics (SubjectAccessReview), as kube-controller-manager
and kubebuilder's scaffold serve it; `--local` keeps every endpoint on loopback.

The story on the real plane runs the real `gpuclaimctl run --metrics-secure`
process and scrapes it as Prometheus would, with service-account tokens:
one bound to deploy/'s gpuclaimctl-metrics-reader ClusterRole, one not.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from gpuclaimctl.client import kube
from gpuclaimctl.client.metricsauth import Access, ApiServerAuth
from gpuclaimctl.cmd.bindaddress import on_loopback
from gpuclaimctl.cmd.endpoints import EndpointServer, self_signed_tls
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.controlplane import ControlPlane
from tests.helpers import wait_for
from tests.test_deploy_manifests import DEPLOY, load_yaml_docs
from tests.test_failover import ControllerProcess

READER_ROLE = "gpuclaimctl-metrics-reader"


def scrape(port: int, token: str | None = None, *, scheme: str = "https") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/metrics", headers=headers)
    context = ssl._create_unverified_context() if scheme == "https" else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


# -- --local: loopback only ------------------------------------------------------------


@pytest.mark.parametrize(("given", "bound"), [
    pytest.param(":8080", "127.0.0.1:8080", id="every-interface-becomes-loopback"),
    pytest.param("127.0.0.1:9090", "127.0.0.1:9090", id="ipv4-loopback-kept"),
    pytest.param("[::1]:9090", "[::1]:9090", id="ipv6-loopback-kept"),
    pytest.param("localhost:9090", "localhost:9090", id="localhost-kept"),
    pytest.param("0", "0", id="disabled-stays-off"),
])
def test_local_serves_its_endpoints_on_loopback(given: str, bound: str) -> None:
    assert on_loopback(given, "--metrics-bind-address") == bound


@pytest.mark.parametrize("address", ["0.0.0.0:8080", "[::]:8080", "10.0.0.7:8080"])
def test_local_refuses_an_address_beyond_loopback(address: str) -> None:
    with pytest.raises(ValueError, match="--local serves on loopback only; --health-bind-address"):
        Options(local=True, health_bind_address=address).validate()
    # Without --local the same address is the operator's choice.
    Options(health_bind_address=address).validate()


# -- the listener: TLS, and the authorizer's answer ------------------------------------


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("gpuclaimctl_test_things", "Things counted by the test.", registry=reg).inc(3)
    return reg


@pytest.fixture
def secure_server(registry: CollectorRegistry) -> Iterator[tuple[EndpointServer, list[str | None]]]:
    seen: list[str | None] = []

    def authorize(header: str | None) -> Access:
        seen.append(header)
        return {None: Access(401, "Unauthorized"), "Bearer good": Access(200, "OK")}.get(
            header, Access(403, "Forbidden"))

    # Two addresses (identical ones would share one listener, TLS for both).
    server = EndpointServer(registry=registry, metrics_address="127.0.0.1:0",
                            health_address="localhost:0",
                            metrics_tls=self_signed_tls(["127.0.0.1"]), authorize=authorize)
    server.start()
    yield server, seen
    server.stop()


def test_secure_metrics_answer_only_what_the_authorizer_allows(
    secure_server: tuple[EndpointServer, list[str | None]],
) -> None:
    server, seen = secure_server
    assert server.metrics_port is not None
    status, _ = scrape(server.metrics_port)
    assert status == 401
    assert scrape(server.metrics_port, "bad")[0] == 403
    status, body = scrape(server.metrics_port, "good")
    assert status == 200 and "gpuclaimctl_test_things_total 3.0" in body
    assert seen == [None, "Bearer bad", "Bearer good"]


def test_secure_metrics_speak_no_plain_http_and_probes_stay_plain(
    secure_server: tuple[EndpointServer, list[str | None]],
) -> None:
    server, seen = secure_server
    assert server.metrics_port is not None and server.health_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    conn.close()
    assert seen == []  # a plain request never reaches the authorizer
    with urllib.request.urlopen(f"http://localhost:{server.health_port}/healthz", timeout=5) as r:
        assert r.status == 200


def test_authorization_without_tls_is_refused(registry: CollectorRegistry) -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        EndpointServer(registry=registry, metrics_address="127.0.0.1:0",
                       authorize=lambda _h: Access(200, "OK"))


# -- the cache of the API server's answers ----------------------------------------------


class FakeReviews:
    """Answers TokenReviews and SubjectAccessReviews as an API server would."""

    def __init__(self) -> None:
        self.users = {"tok-reader": "system:serviceaccount:monitoring:prometheus",
                      "tok-other": "system:serviceaccount:team:app"}
        self.allowed = {"system:serviceaccount:monitoring:prometheus"}
        self.requests: list[tuple[str, Any]] = []
        self.down = False

    def __call__(self, _api: object, method: str, path: str, *, body: Any) -> Any:
        self.requests.append((path.rsplit("/", 1)[1], body["spec"]))
        if self.down:
            raise kube.ApiError(503, "unavailable")
        if path.endswith("tokenreviews"):
            user = self.users.get(body["spec"]["token"])
            return {"status": {"authenticated": user is not None,
                               **({"user": {"username": user, "groups": ["system:authenticated"]}}
                                  if user else {})}}
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


@pytest.fixture
def reviews(monkeypatch: pytest.MonkeyPatch) -> FakeReviews:
    fake = FakeReviews()
    monkeypatch.setattr(kube, "request_json", fake)
    return fake


def test_the_reviews_ask_for_get_on_the_metrics_url(reviews: FakeReviews) -> None:
    auth = ApiServerAuth(object())  # type: ignore[arg-type]
    assert auth.check("Bearer tok-reader").status == 200
    assert auth.check("Bearer tok-other").status == 403
    assert auth.check("Bearer nobody").status == 401
    assert auth.check("Basic dXNlcjpwYXNz").status == 401
    assert auth.check(None).status == 401
    sar = [spec for kind, spec in reviews.requests if kind == "subjectaccessreviews"]
    assert sar[0] == {"user": "system:serviceaccount:monitoring:prometheus",
                      "groups": ["system:authenticated"], "uid": "",
                      "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    # No review is sent for a request that carries no bearer token.
    assert len(reviews.requests) == 5


def test_answers_are_kept_for_the_ttl_and_failures_not_at_all(reviews: FakeReviews) -> None:
    now = [100.0]
    auth = ApiServerAuth(object(), ttl=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert auth.check("Bearer tok-reader").status == 200
    reviews.allowed.clear()  # the binding is removed
    now[0] += 9.0
    assert auth.check("Bearer tok-reader").status == 200 and len(reviews.requests) == 2
    now[0] += 1.5
    assert auth.check("Bearer tok-reader").status == 403 and len(reviews.requests) == 4

    reviews.down = True
    assert auth.check("Bearer tok-other").status == 500
    reviews.down = False
    assert auth.check("Bearer tok-other").status == 403


# -- on the real plane ------------------------------------------------------------------


def _token(api_client: client.ApiClient, namespace: str, name: str) -> str:
    kube.request(api_client, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 body={"metadata": {"name": name}})
    review = kube.request_json(
        api_client, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 3600}})
    return str(review["status"]["token"])


def _create(api_client: client.ApiClient, path: str, body: dict[str, Any]) -> bool:
    """POST; False when it already exists."""
    try:
        kube.request(api_client, "POST", path, body=body)
        return True
    except kube.ApiError as e:
        if e.status != 409:
            raise
        return False


@pytest.mark.plane
def test_real_controller_serves_metrics_only_to_a_token_allowed_to_get_them(
    full_plane: ControlPlane, api_client: client.ApiClient, crds: list[str],
    namespace: str, tmp_path: Path,
) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    (role,) = load_yaml_docs(DEPLOY / "metrics-reader-rbac.yaml")
    binding = f"metrics-reader-{uuid.uuid4().hex[:6]}"
    made_role = _create(api_client, f"{rbac}/clusterroles", role)
    proc = None
    try:
        scraper = _token(api_client, namespace, "prometheus")
        stranger = _token(api_client, namespace, "app")
        _create(api_client, f"{rbac}/clusterrolebindings", {
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": READER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": "prometheus"}]})
        proc = ControllerProcess("secure", str(full_plane.kubeconfig), tmp_path,
                                 lease_namespace=namespace, lease_name="secure-metrics",
                                 metrics_token=scraper).start()
        wait_for(lambda: proc is not None and proc.ready() and proc.leading(), timeout=60,
                 message=lambda: f"the controller to lead and be ready:\n{proc.log_tail() if proc else ''}")

        status, body = scrape(proc.metrics_port)
        assert (status, body) == (401, "Unauthorized\n")
        assert scrape(proc.metrics_port, "not-a-token")[0] == 401
        status, body = scrape(proc.metrics_port, stranger)
        assert status == 403
        assert f"system:serviceaccount:{namespace}:app" in body
        status, body = scrape(proc.metrics_port, scraper)
        assert status == 200
        assert 'leader_election_master_status{name="secure-metrics"} 1.0' in body
        # Nothing is served in clear on the metrics port; the probes' port is
        # plain HTTP for the kubelet.
        with pytest.raises((http.client.HTTPException, OSError)):
            scrape(proc.metrics_port, scraper, scheme="http")
        assert proc.http_status("/healthz") == 200
    finally:
        if proc is not None:
            proc.stop()
        kube.request(api_client, "DELETE", f"{rbac}/clusterrolebindings/{binding}")
        if made_role:
            kube.request(api_client, "DELETE", f"{rbac}/clusterroles/{READER_ROLE}")


def test_the_deployment_serves_metrics_secure_and_probes_plain() -> None:
    (deployment,) = [d for d in load_yaml_docs(DEPLOY / "deployment.yaml") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUCLAIMCTL_METRICS_SECURE"] == "true"
    assert env["GPUCLAIMCTL_METRICS_BIND_ADDRESS"] != env["GPUCLAIMCTL_HEALTH_BIND_ADDRESS"]
    assert container["livenessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"
