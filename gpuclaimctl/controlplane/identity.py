"""The controller's own identity on a local plane, as deployed: deploy/'s
namespace, service account and roles applied, a token of that account, and
a kubeconfig holding that token and nothing else.

The admission webhook leaves the controller's own requests alone (by
username: the configurations' matchConditions, and the webhook's own
SelfSubjectReview), so a controller sharing a person's admin credentials
would leave that person's pods ungated; and a controller with admin rights
would hide a permission deploy/ forgot. `run --local` runs the controller
with `controller_identity()`, and so do the real-plane tests (once per
session, in a namespace of their own: tests that apply and delete deploy/
itself must not take the session's identity with them).

Objects are applied server-side, so a second start changes nothing and a
deploy/ file changed since the last start updates what it applied.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from gpuclaimctl.client import kube
from gpuclaimctl.controlplane.plane import ControlPlane

# The repository's deploy/ (gpuclaimctl/controlplane/ is two levels below it).
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# deploy/'s namespace, service account and every role bound to that account.
RBAC_FILES = ("namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml",
              "clusterrolebinding.yaml", "leader-election-rbac.yaml", "webhook-rbac.yaml")
SYSTEM_NAMESPACE = "gpuclaimctl-system"
SERVICE_ACCOUNT = "gpuclaimctl"
FIELD_MANAGER = "gpuclaimctl-local"
# A token the local plane honours as long as a demo may reasonably run; the
# next start asks for a new one (the API server may cap it shorter).
TOKEN_SECONDS = 30 * 24 * 3600

# kind -> (path prefix, plural) of every kind apply() is given.
_RESOURCES = {
    "Namespace": ("/api/v1", "namespaces"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Secret": ("/api/v1", "secrets"),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1",
                                     "mutatingwebhookconfigurations"),
    "ValidatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1",
                                       "validatingwebhookconfigurations"),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
}


@dataclasses.dataclass(frozen=True)
class ControllerIdentity:
    namespace: str
    name: str
    # A kubeconfig for the plane with this account's token alone.
    kubeconfig: Path

    @property
    def username(self) -> str:
        """As the API server names it (and the webhook configurations match it)."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def deploy_docs(filename: str) -> list[dict[str, Any]]:
    with open(DEPLOY / filename) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def controller_rbac(namespace: str = SYSTEM_NAMESPACE) -> list[dict[str, Any]]:
    """deploy/'s namespace, service account and roles, as deploy/ has them.

    In another namespace every object moves there, and the cluster-scoped
    roles and bindings are named after it (`gpuclaimctl-webhook` becomes
    `<namespace>-webhook`), so they stand beside deploy/'s own; the rules
    are deploy/'s, unchanged."""
    docs = [d for f in RBAC_FILES for d in deploy_docs(f)]
    if namespace == SYSTEM_NAMESPACE:
        return docs

    def renamed(name: str) -> str:
        return namespace + name.removeprefix("gpuclaimctl") if name.startswith("gpuclaimctl") else name

    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] == "Namespace":
            meta["name"] = namespace
        elif doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = renamed(meta["name"])
        if "namespace" in meta:
            meta["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["kind"] == "ClusterRole":
            doc["roleRef"]["name"] = renamed(doc["roleRef"]["name"])
        for subject in doc.get("subjects") or ():
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
    return docs


def object_path(doc: dict[str, Any]) -> str:
    prefix, plural = _RESOURCES[doc["kind"]]
    meta = doc["metadata"]
    scope = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{prefix}{scope}/{plural}/{meta['name']}"


def apply(admin: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Server-side apply each object, taking over fields another manager set."""
    for doc in docs:
        kube.request(admin, "PATCH", object_path(doc), body=doc,
                     content_type="application/apply-patch+yaml",
                     query=[("fieldManager", FIELD_MANAGER), ("force", "true")])


def controller_identity(plane: ControlPlane, kubeconfig: Path, *,
                        namespace: str = SYSTEM_NAMESPACE) -> ControllerIdentity:
    """Apply the controller's service account and roles (controller_rbac)
    on `plane`, mint a token of that account and write a kubeconfig holding
    it to `kubeconfig` (mode 0600)."""
    assert plane.pki is not None, "the plane has not started"
    admin = config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        apply(admin, controller_rbac(namespace))
        review = kube.request_json(
            admin, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{SERVICE_ACCOUNT}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                  "spec": {"expirationSeconds": TOKEN_SECONDS}})
    finally:
        admin.close()
    identity = ControllerIdentity(namespace, SERVICE_ACCOUNT, kubeconfig)
    user = identity.username
    text = json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": plane.server, "certificate-authority": str(plane.pki.ca_cert)}}],
        "users": [{"name": user, "user": {"token": review["status"]["token"]}}],
        "contexts": [{"name": "controller", "context": {"cluster": "local", "user": user}}],
        "current-context": "controller",
    }, indent=2)
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    tmp = kubeconfig.with_name(f".{kubeconfig.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(kubeconfig)
    return identity
