"""The admission webhook on the real plane (issue 14 item 6).

The real controller runs in-process as a service account of its own (as it
does in a cluster, so the configurations' matchConditions can tell its
requests from everyone else's, kube-controller-manager's included), with
its webhook on loopback: the API server calls it over TLS through a
`url:` client config rendered by gpuclaimctl.webhook.configurations (the
same scoping deploy/webhook.yaml registers with `service:`), trusting the
CA the webhook made and injected itself. The configurations are narrowed
to the namespaces these tests label, so nothing else of the session meets
them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from cryptography import x509
from kubernetes import client

from gpuclaimctl.client import certs, kube
from gpuclaimctl.client.webhookcerts import CertKeeper
from gpuclaimctl.cmd.webhook import Webhook, secret_name
from gpuclaimctl.controlplane import ControlPlane, build
from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import PodClaimsError, pod_claims
from gpuclaimctl.webhook import configurations
from tests.controllerkit import RunningController
from tests.helpers import gpu_node_manifest, node_is_ready, wait_for

pytestmark = pytest.mark.plane

CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
TEST_LABEL = "webhook-test.gpuclaimctl.io/run"


@dataclasses.dataclass
class Admission:
    plane: ControlPlane
    admin: client.ApiClient
    tag: str
    system_ns: str
    controller_user: str
    webhook: Webhook
    controller: RunningController
    config_name: str
    gpu_class: str
    node: str
    workdir: Path

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.system_ns}/secrets/{secret_name('gpuclaimctl-webhook')}"

    def namespace(self, labels: dict[str, str] | None = None) -> str:
        name = f"wh-{uuid.uuid4().hex[:8]}"
        kube.request(self.admin, "POST", "/api/v1/namespaces", body={
            "metadata": {"name": name, "labels": {TEST_LABEL: self.tag, **(labels or {})}}})
        try:
            kube.request(self.admin, "POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                         body={"metadata": {"name": "default"}})
        except kube.ApiError as e:
            if e.status != 409:
                raise
        return name

    def create_pod(self, ns: str, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        query = [("dryRun", "All")] if dry_run else []
        created: dict[str, Any] = kube.request_json(self.admin, "POST", f"/api/v1/namespaces/{ns}/pods",
                                                    body=manifest, query=query)
        return created

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = kube.request_json(self.admin, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            return found
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise

    def admission_calls(self) -> float:
        return sum(s.value for m in self.controller.registry.collect()
                   if m.name == "gpuclaimctl_admission_requests" for s in m.samples
                   if s.name.endswith("_total"))


def gpu_pod(name: str, gpus: int = 0, claims: list[dict[str, Any]] | str | None = None,
            gated: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if claims is not None:
        meta["annotations"] = {api.CLAIMS_ANNOTATION: claims if isinstance(claims, str) else json.dumps(claims)}
    container: dict[str, Any] = {"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "10m"}}}
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if gated:
        spec["schedulingGates"] = [{"name": api.SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gated(pod: dict[str, Any] | None) -> bool:
    return any(g.get("name") == api.SCHEDULING_GATE
               for g in ((pod or {}).get("spec") or {}).get("schedulingGates") or ())


def token_kubeconfig(plane: ControlPlane, admin: client.ApiClient, ns: str, sa: str, path: Path) -> Path:
    assert plane.pki is not None
    review = kube.request_json(admin, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 3600}})
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": plane.server,
                                                   "certificate-authority": str(plane.pki.ca_cert)}}],
        "users": [{"name": sa, "user": {"token": review["status"]["token"]}}],
        "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
        "current-context": sa}))
    return path


def register(admin: client.ApiClient, mutating: dict[str, Any], validating: dict[str, Any]) -> None:
    for obj, plural in ((mutating, "mutatingwebhookconfigurations"),
                        (validating, "validatingwebhookconfigurations")):
        kube.request(admin, "POST", f"{ADMISSION}/{plural}", body=obj)


def unregister(admin: client.ApiClient, name: str) -> None:
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        try:
            kube.request(admin, "DELETE", f"{ADMISSION}/{plural}/{name}")
        except kube.ApiError as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="module")
def admission(full_plane: ControlPlane, api_client: client.ApiClient, crds: list[str],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admission]:
    admin = api_client
    tag = uuid.uuid4().hex[:6]
    workdir = tmp_path_factory.mktemp("webhook")
    system_ns = f"gpuclaimctl-wh-{tag}"
    sa = "gpuclaimctl"
    kube.request(admin, "POST", "/api/v1/namespaces", body={"metadata": {"name": system_ns}})
    kube.request(admin, "POST", f"/api/v1/namespaces/{system_ns}/serviceaccounts",
                 body={"metadata": {"name": sa}})
    binding = f"gpuclaimctl-wh-{tag}"
    kube.request(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": system_ns}]})
    node = f"wh-gpu-{tag}"
    kube.request(admin, "POST", "/api/v1/nodes",
                 body=gpu_node_manifest(node, 8, labels={TEST_LABEL: tag}))
    core = client.CoreV1Api(admin)
    wait_for(lambda: node_is_ready(core, node), timeout=30, message=f"node {node} Ready")
    gpu_class = f"wh-{tag}"
    kube.request(admin, "POST", f"{CLAIMS}/gpuclasses", body={
        "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": gpu_class},
        "spec": {"nodeSelector": {TEST_LABEL: tag}}})
    config_name = f"gpuclaimctl-test-{tag}"
    controller: RunningController | None = None
    webhook: Webhook | None = None
    try:
        kubeconfig = token_kubeconfig(full_plane, admin, system_ns, sa, workdir / "sa.kubeconfig")
        controller = RunningController(
            str(kubeconfig), webhook_bind_address="127.0.0.1:0", webhook_cert_dir=str(workdir / "certs"),
            webhook_service=f"{system_ns}/gpuclaimctl-webhook", webhook_configuration=config_name,
            webhook_hosts=("127.0.0.1",))
        # Short syncs, so the rotation story does not wait a minute.
        webhook = Webhook(controller.api_client, controller.options, controller.factory,
                          registry=controller.registry, cert_interval=0.5)
        webhook.start()
        controller.start()
        user = configurations.service_account_username(system_ns, sa)
        mutating, validating = configurations.render(
            {"url": f"https://127.0.0.1:{webhook.port}"}, controller_username=user,
            excluded_namespaces=["kube-system", system_ns], name=config_name,
            extra_namespace_requirements=[{"key": TEST_LABEL, "operator": "In", "values": [tag]}])
        register(admin, mutating, validating)

        def ready() -> bool:
            try:
                webhook.check()
            except RuntimeError:
                return False
            # Registered after the webhook started (it needed the port): the
            # keeper looks for them again within its retry period.
            return all(h["clientConfig"].get("caBundle")
                       for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
                       for h in kube.request_json(admin, "GET", f"{ADMISSION}/{plural}/{config_name}")["webhooks"])

        wait_for(ready, timeout=30, message="the webhook to be ready (certificate made and injected)")
        wait_for(lambda: user in webhook.view.controller_users, timeout=30,
                 message="the webhook to learn the controller's username")
        yield Admission(full_plane, admin, tag, system_ns, user, webhook, controller, config_name,
                        gpu_class, node, workdir)
    finally:
        unregister(admin, config_name)
        if webhook is not None:
            webhook.stop()
        if controller is not None:
            controller.stop()
        for path in (f"{CLAIMS}/gpuclasses/{gpu_class}", f"/api/v1/nodes/{node}",
                     f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}",
                     f"/api/v1/namespaces/{system_ns}"):
            try:
                kube.request(admin, "DELETE", path)
            except kube.ApiError:
                pass


def kubectl_apply(plane: ControlPlane, ns: str, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    kubectl = plane.bin.get("kubectl") or build.binary_path("kubectl")
    return subprocess.run([str(kubectl), f"--kubeconfig={plane.kubeconfig}", "apply", "-n", ns, "-f", "-"],
                          input=json.dumps(manifest), capture_output=True, text=True, timeout=60)


# -- the stories -------------------------------------------------------------------------------


def test_a_pod_with_claims_and_no_gate_is_gated_and_then_placed(admission: Admission) -> None:
    ns = admission.namespace()
    created = admission.create_pod(ns, gpu_pod("trainer", 2, [{"name": "g", "className": admission.gpu_class,
                                                               "count": 2}]))
    assert gated(created), "the API server stored the pod without the gate"

    def placed() -> bool:
        pod = admission.pod(ns, "trainer") or {}
        return (pod.get("spec") or {}).get("nodeName") == admission.node \
            and (pod.get("status") or {}).get("phase") == "Running"

    wait_for(placed, timeout=60, message=lambda: f"trainer placed: {admission.pod(ns, 'trainer')}")
    claim = kube.request_json(admission.admin, "GET", f"{CLAIMS}/namespaces/{ns}/gpuclaims/trainer-g")
    assert claim["status"]["phase"] == "Bound" and claim["status"]["nodeName"] == admission.node


def test_a_bad_annotation_is_refused_at_create_with_the_controllers_message(admission: Admission) -> None:
    ns = admission.namespace()
    bad = '[{"name": "g", "template": "pair", "claim": "mine"}, {"name": "g", "className": "x", "count": 0}]'
    manifest = gpu_pod("broken", 1, bad)
    with pytest.raises(PodClaimsError) as parsed:
        pod_claims(manifest)
    done = kubectl_apply(admission.plane, ns, manifest)
    assert done.returncode != 0
    assert (f'admission webhook "{configurations.VALIDATE_CLAIMS}" denied the request: '
            f"{parsed.value}") in done.stderr
    assert admission.pod(ns, "broken") is None


def test_an_unchanged_job_in_a_labelled_namespace_gets_claims_and_runs(admission: Admission) -> None:
    ns = admission.namespace({api.DEFAULT_CLASS_LABEL: admission.gpu_class})
    template = gpu_pod("worker", 3)
    template["metadata"] = {"labels": {"app": "worker"}}
    template["spec"]["restartPolicy"] = "Never"
    kube.request(admission.admin, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"backoffLimit": 0, "template": template}})

    def ran() -> dict[str, Any] | None:
        # kwok runs a Job's pod to completion at once.
        pods = kube.request_json(admission.admin, "GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return next((p for p in pods if p["status"].get("phase") in ("Running", "Succeeded")), None)

    pod = wait_for(ran, timeout=60, message=lambda: "the Job's pod to run: " + json.dumps(
        [(p["metadata"]["name"], p["spec"].get("schedulingGates"), p["status"]) for p in
         kube.request_json(admission.admin, "GET", f"/api/v1/namespaces/{ns}/pods")["items"]]))
    # Placed by gpuclaimctl on the class's node, with the claim the webhook gave it.
    assert pod["spec"]["nodeName"] == admission.node
    assert pod["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] == admission.node
    entries = pod_claims(pod)
    assert [(e.name, e.class_name, e.count) for e in entries] == [("gpus", admission.gpu_class, 3)]
    wait_for(lambda: (kube.request_json(admission.admin, "GET", f"/apis/batch/v1/namespaces/{ns}/jobs/train")
                      .get("status") or {}).get("succeeded") == 1, timeout=30, message="the Job to succeed")


def test_a_pod_without_gpus_in_a_labelled_namespace_is_untouched(admission: Admission) -> None:
    ns = admission.namespace({api.DEFAULT_CLASS_LABEL: admission.gpu_class})
    calls = admission.admission_calls()
    manifest = gpu_pod("web")
    created = admission.create_pod(ns, manifest)
    assert not gated(created)
    assert api.CLAIMS_ANNOTATION not in (created["metadata"].get("annotations") or {})
    # The API server did not even call the webhook (matchConditions).
    assert admission.admission_calls() == calls


def test_a_user_removing_the_gate_is_refused(admission: Admission) -> None:
    ns = admission.namespace()
    # A class nobody made: the pod waits, gated.
    admission.create_pod(ns, gpu_pod("waiting", 1, [{"name": "g", "className": "nowhere", "count": 1}],
                                     gated=True))
    with pytest.raises(kube.ApiError) as refused:
        kube.request(admission.admin, "PATCH", f"/api/v1/namespaces/{ns}/pods/waiting",
                     body=[{"op": "remove", "path": "/spec/schedulingGates/0"}],
                     content_type="application/json-patch+json")
    assert refused.value.status == 403
    assert "removed by gpuclaimctl alone" in refused.value.message
    assert gated(admission.pod(ns, "waiting"))


def test_a_gpu_pod_without_claims_is_refused_where_a_budget_applies(admission: Admission) -> None:
    ns = admission.namespace()
    kube.request(admission.admin, "POST", f"{CLAIMS}/namespaces/{ns}/{api.BUDGET_PLURAL}", body={
        "apiVersion": api.API_VERSION, "kind": "GPUBudget", "metadata": {"name": "team"},
        "spec": {"limits": [{"className": "*", "gpus": 4}]}})
    # The webhook's cache shows the budget a moment after it was made.
    wait_for(lambda: admission.webhook.view.has_budget(ns), timeout=10, message="the budget in the cache")
    with pytest.raises(kube.ApiError) as refused:
        admission.create_pod(ns, gpu_pod("sneaky", 2))
    assert refused.value.status == 403
    assert f"namespace {ns} has a GPUBudget" in refused.value.message
    assert admission.create_pod(ns, gpu_pod("no-gpus"))  # pods without GPUs pass


def test_with_the_webhook_down_pods_with_claims_are_refused_and_others_unaffected(
    admission: Admission,
) -> None:
    ns = admission.namespace()
    claims = [{"name": "g", "className": admission.gpu_class, "count": 1}]
    admission.webhook.server.stop()
    try:
        with pytest.raises(kube.ApiError) as refused:
            admission.create_pod(ns, gpu_pod("claims", 1, claims), dry_run=True)
        assert refused.value.status == 500
        assert "failed calling webhook" in refused.value.message
        # Pods naming no claims never reach the webhook; a GPU pod where no
        # budget applies is let through (that webhook's failurePolicy is Ignore).
        assert admission.create_pod(ns, gpu_pod("plain"), dry_run=True)
        assert admission.create_pod(ns, gpu_pod("gpu-no-claims", 1), dry_run=True)
    finally:
        admission.webhook.server.start()
    created = admission.create_pod(ns, gpu_pod("claims", 1, claims), dry_run=True)
    assert gated(created)


def served_serial(port: int, ca: bytes) -> int:
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_the_certificate_is_rotated_while_the_webhook_serves(admission: Admission) -> None:
    """A serving certificate, then a CA, come due while pods are created
    through the webhook without a pause; none is refused, and the CA
    bundle keeps the CA before the rotation."""
    ns = admission.namespace()
    claims = [{"name": "g", "className": admission.gpu_class, "count": 1}]
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def keep_creating() -> None:
        while not stop.is_set():
            try:
                created = admission.create_pod(ns, gpu_pod(f"p-{uuid.uuid4().hex[:6]}", 1, claims), dry_run=True)
                if not gated(created):
                    failures.append("created without the gate")
                answered[0] += 1
            except kube.ApiError as e:
                failures.append(e.message)
            time.sleep(0.02)

    def secret_data() -> dict[str, bytes]:
        secret = kube.request_json(admission.admin, "GET", admission.secret_path)
        return {k: base64.b64decode(v) for k, v in secret["data"].items()}

    def put_secret(data: dict[str, bytes]) -> None:
        secret = kube.request_json(admission.admin, "GET", admission.secret_path)
        secret["data"] = {k: base64.b64encode(v).decode() for k, v in data.items()}
        kube.request(admission.admin, "PUT", admission.secret_path, body=secret)

    def bundle_in_configuration() -> bytes:
        config = kube.request_json(admission.admin, "GET",
                                   f"{ADMISSION}/validatingwebhookconfigurations/{admission.config_name}")
        return base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])

    assert admission.webhook.keeper is not None
    hosts = admission.webhook.keeper.hosts
    worker = threading.Thread(target=keep_creating, daemon=True)
    worker.start()
    try:
        now = datetime.now(timezone.utc)
        # 1. A serving certificate with seconds to live: it is served, then renewed.
        short = certs.CertPolicy(serving_validity=timedelta(seconds=6))
        data = secret_data()
        first_ca = data[certs.CA_CERT]
        soon = certs.issue(data, hosts, now, certs.Renewal.SERVING, short)
        put_secret(soon)
        soon_serial = x509.load_pem_x509_certificate(soon[certs.TLS_CERT]).serial_number
        wait_for(lambda: served_serial(admission.webhook.port, first_ca) == soon_serial, timeout=15,
                 message="the short-lived certificate to be served")
        wait_for(lambda: served_serial(admission.webhook.port, first_ca) != soon_serial, timeout=20,
                 message="the short-lived certificate to be renewed")
        renewed = secret_data()
        assert renewed[certs.CA_CERT] == first_ca
        # 2. A CA with seconds to live: a new CA signs the next certificate and
        #    the bundle trusts both until the old one expires.
        old = x509.load_pem_x509_certificates(first_ca)[0]
        aging = certs.issue(renewed, hosts, datetime.now(timezone.utc), certs.Renewal.CA,
                            certs.CertPolicy(ca_validity=timedelta(seconds=8)))
        put_secret(aging)
        aging_ca = x509.load_pem_x509_certificates(aging[certs.CA_CERT])[0]

        def ca_rotated() -> bool:
            cas = x509.load_pem_x509_certificates(secret_data()[certs.CA_CERT])
            return cas[0] not in (old, aging_ca)

        wait_for(ca_rotated, timeout=30, message="the CA to be renewed")
        bundle = x509.load_pem_x509_certificates(bundle_in_configuration())
        wait_for(lambda: x509.load_pem_x509_certificates(bundle_in_configuration())[0]
                 == x509.load_pem_x509_certificates(secret_data()[certs.CA_CERT])[0],
                 timeout=10, message="the new CA injected")
        bundle = x509.load_pem_x509_certificates(bundle_in_configuration())
        assert aging_ca in bundle, "the CA before the rotation left the bundle while still valid"
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(30)
    assert failures == []
    assert answered[0] > 20


def test_two_replicas_starting_at_once_make_one_ca(admission: Admission, tmp_path: Path) -> None:
    secret = f"race-{uuid.uuid4().hex[:6]}"
    name = f"race-{admission.tag}-{uuid.uuid4().hex[:4]}"
    mutating, validating = configurations.render(
        {"url": "https://127.0.0.1:1"}, controller_username=admission.controller_user,
        excluded_namespaces=["kube-system"], name=name,
        extra_namespace_requirements=[{"key": "never", "operator": "In", "values": ["matched"]}])
    register(admission.admin, mutating, validating)
    try:
        keepers = [CertKeeper(admission.controller.api_client, namespace=admission.system_ns, secret=secret,
                              hosts=["127.0.0.1"], configuration=name, cert_dir=tmp_path / str(i))
                   for i in range(2)]
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def start(keeper: CertKeeper) -> None:
            barrier.wait()
            try:
                keeper.sync()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=(k,)) for k in keepers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        stored = kube.request_json(admission.admin, "GET",
                                   f"/api/v1/namespaces/{admission.system_ns}/secrets/{secret}")
        ca = base64.b64decode(stored["data"][certs.CA_CERT])
        assert len(x509.load_pem_x509_certificates(ca)) == 1
        served = [(tmp_path / str(i) / "tls.crt").read_bytes() for i in range(2)]
        assert served[0] == served[1] == base64.b64decode(stored["data"][certs.TLS_CERT])
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            config = kube.request_json(admission.admin, "GET", f"{ADMISSION}/{plural}/{name}")
            assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {stored["data"][certs.CA_CERT]}
    finally:
        unregister(admission.admin, name)
