"""deploy/'s admission webhook (issue 14 item 7): the objects agree with the
code that renders them, with each other and with the controller's flags;
the cert-manager component renders."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from gpuclaimctl.client.webhookcerts import service_hosts
from gpuclaimctl.cmd.options import Options, parse_service_ref
from gpuclaimctl.cmd.webhook import secret_name
from gpuclaimctl.controlplane import build
from gpuclaimctl.webhook import configurations
from tests.test_deploy_manifests import (
    DEPLOY,
    SERVICE_ACCOUNT,
    SYSTEM_NAMESPACE,
    env_of,
    load_yaml_docs,
    render_base_in_python,
)

Obj = dict[str, Any]


def webhook_docs() -> dict[str, Obj]:
    return {d["kind"]: d for d in load_yaml_docs(DEPLOY / "webhook.yaml")}


def deployment() -> Obj:
    (d,) = [o for o in render_base_in_python() if o["kind"] == "Deployment"]
    return d


def test_the_configurations_are_the_rendered_ones_for_the_service() -> None:
    docs = webhook_docs()
    service = docs["Service"]
    client = {"service": {"namespace": service["metadata"]["namespace"], "name": service["metadata"]["name"],
                          "port": service["spec"]["ports"][0]["port"]}}
    mutating, validating = configurations.render(
        client, controller_username=SERVICE_ACCOUNT,
        excluded_namespaces=["kube-system", SYSTEM_NAMESPACE],
        metadata={"labels": docs["MutatingWebhookConfiguration"]["metadata"]["labels"]})
    assert docs["MutatingWebhookConfiguration"] == mutating
    assert docs["ValidatingWebhookConfiguration"] == validating


def test_the_webhooks_fail_closed_only_where_a_pod_would_slip_past_the_gate() -> None:
    docs = webhook_docs()
    policies = {h["name"]: h["failurePolicy"] for kind in ("MutatingWebhookConfiguration",
                                                           "ValidatingWebhookConfiguration")
                for h in docs[kind]["webhooks"]}
    assert policies == {configurations.MUTATE_CLAIMS: "Fail", configurations.MUTATE_DEFAULT_CLASS: "Fail",
                        configurations.VALIDATE_CLAIMS: "Fail", configurations.VALIDATE_BUDGETS: "Ignore"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in docs[kind]["webhooks"]:
            assert hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
            assert hook["matchConditions"][0]["expression"] == \
                f"request.userInfo.username != '{SERVICE_ACCOUNT}'"
            excluded = hook["namespaceSelector"]["matchExpressions"][0]
            assert excluded["operator"] == "NotIn"
            assert set(excluded["values"]) == {"kube-system", SYSTEM_NAMESPACE}
            assert "caBundle" not in hook["clientConfig"], "the controller injects it"


def test_service_secret_and_flags_agree() -> None:
    docs = webhook_docs()
    pod = deployment()["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    service = docs["Service"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert env["GPUCLAIMCTL_WEBHOOK_BIND_ADDRESS"]["value"].rsplit(":", 1)[1] == str(ports["webhook"])
    namespace, name = parse_service_ref(env["GPUCLAIMCTL_WEBHOOK_SERVICE"]["value"])
    assert (namespace, name) == (service["metadata"]["namespace"], service["metadata"]["name"])
    assert docs["Secret"]["metadata"]["name"] == secret_name(name)
    assert parse_service_ref(Options().webhook_service) == (namespace, name)
    # The default cert dir is under the writable /tmp volume.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert any(Options().webhook_cert_dir.startswith(m + "/") for m in mounts)


def test_webhook_rbac_names_the_secret_and_configurations_the_controller_keeps() -> None:
    docs = load_yaml_docs(DEPLOY / "webhook-rbac.yaml")
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": [webhook_docs()["Secret"]["metadata"]["name"]],
                              "verbs": ["get", "update"]}]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    named = [r for r in cluster_role["rules"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [[Options().webhook_configuration]]
    for binding in (d for d in docs if d["kind"].endswith("Binding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuclaimctl",
                                        "namespace": SYSTEM_NAMESPACE}]


def test_the_cert_manager_certificate_covers_the_names_the_controller_would() -> None:
    certificate = next(d for d in load_yaml_docs(DEPLOY / "components" / "cert-manager" / "certificate.yaml")
                       if d["kind"] == "Certificate")
    assert certificate["spec"]["dnsNames"] == service_hosts(SYSTEM_NAMESPACE, "gpuclaimctl-webhook")
    assert certificate["spec"]["secretName"] == webhook_docs()["Secret"]["metadata"]["name"]


def test_the_cert_manager_component_renders_onto_the_base(tmp_path: Path) -> None:
    kubectl = build.binary_path("kubectl")
    if not kubectl.is_file():
        pytest.skip("kubectl is not built yet (make controlplane)")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../deploy"], "components": ["../deploy/components/cert-manager"]}))
    out = subprocess.run([str(kubectl), "kustomize", str(tmp_path / "overlay")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("Certificate", "gpuclaimctl-webhook") in kinds and ("Issuer", "gpuclaimctl-selfsigned") in kinds
    assert ("Secret", "gpuclaimctl-webhook-cert") not in kinds
    assert ("Role", "gpuclaimctl-webhook") not in kinds
    for d in docs:
        if d["kind"].endswith("WebhookConfiguration"):
            assert d["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
                f"{SYSTEM_NAMESPACE}/gpuclaimctl-webhook"
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpuclaimctl-webhook":
            assert [r["resources"] for r in d["rules"]] == [["namespaces"]]
    (container,) = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["GPUCLAIMCTL_WEBHOOK_SELF_SIGNED"]["value"] == "false"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-cert")
    assert mount["mountPath"] == Options().webhook_cert_dir


@pytest.mark.plane
def test_the_api_server_accepts_the_configurations_and_compiles_their_cel(full_plane: Any) -> None:
    from tests.test_deploy_manifests import kubectl

    docs = webhook_docs()
    out = kubectl(full_plane, "apply", "--dry-run=server", "-o", "name", "-f", "-",
                  stdin=yaml.safe_dump_all([docs["MutatingWebhookConfiguration"],
                                            docs["ValidatingWebhookConfiguration"]]))
    assert out.split() == ["mutatingwebhookconfiguration.admissionregistration.k8s.io/gpuclaimctl",
                           "validatingwebhookconfiguration.admissionregistration.k8s.io/gpuclaimctl"]
