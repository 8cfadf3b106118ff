"""The MutatingWebhookConfiguration and ValidatingWebhookConfiguration for pods.

One rendering for deploy/webhook.yaml (a `service:` client config) and for
the tests (a `url:` on loopback), so both register the same scoping.

What reaches the webhook is cut down three ways before the API server
calls it (issue 14 item 3):
- `namespaceSelector`: never kube-system nor the controller's namespace;
  the default-class mutation only in namespaces carrying the label;
- `matchConditions` (CEL, evaluated by the API server): never the
  controller's own requests (a release never waits on the webhook); a
  CREATE only when the pod names claims, carries the gate or requests an
  extended resource; an UPDATE only when it removes the gate or changes the
  claims annotation, so other edits of gated pods (labels, the garbage
  collector's) never depend on the webhook;
- no `objectSelector`: labels are the pod author's to set, so a label that
  skipped the webhook would be a way past the gate.

failurePolicy Fail where a missed call lets a pod past the gate (pods naming
claims, pods of default-class namespaces, gate and annotation changes);
Ignore for the GPUBudget check of claimless GPU pods, which sees every
GPU pod of the cluster: the controller being down must not stop GPU pods of
namespaces that never opted in. timeoutSeconds is short: every call is a
lookup in the caches.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gpuclaimctl.model import api

NAME = "gpuclaimctl"
MUTATE_PATH = "/mutate-pods"
VALIDATE_PATH = "/validate-pods"
TIMEOUT_SECONDS = 5
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# The webhooks' names (unique within their configuration); the API server
# names the one that refused in its message.
MUTATE_CLAIMS = f"claims.pods.{api.GROUP}"
MUTATE_DEFAULT_CLASS = f"default-class.pods.{api.GROUP}"
VALIDATE_CLAIMS = f"claims.pods.{api.GROUP}"
VALIDATE_BUDGETS = f"budgets.pods.{api.GROUP}"


def _cel(text: str) -> str:
    return text.replace("ANNOTATION", api.CLAIMS_ANNOTATION).replace("GATE", api.SCHEDULING_GATE)


def has_annotation(obj: str) -> str:
    return _cel(f"has({obj}.metadata.annotations) && 'ANNOTATION' in {obj}.metadata.annotations")


def has_gate(obj: str) -> str:
    return _cel(f"has({obj}.spec.schedulingGates) && "
                f"{obj}.spec.schedulingGates.exists(g, g.name == 'GATE')")


def _extended(field: str) -> str:
    return (f"(has(c.resources.{field}) && c.resources.{field}.exists(r, "
            f"r.contains('/') && !r.startsWith('kubernetes.io/')))")


# Any container or init container requests or limits an extended resource
# (`vendor/name`), as model.resources.extended_resources reads them.
REQUESTS_EXTENDED = (
    "(has(object.spec.initContainers) ? object.spec.containers + object.spec.initContainers "
    ": object.spec.containers).exists(c, has(c.resources) && "
    f"({_extended('requests')} || {_extended('limits')}))")
NOT_BOUND = "!has(object.spec.nodeName) || object.spec.nodeName == ''"
ANNOTATION_CHANGED = _cel(
    f"({has_annotation('object')}) != ({has_annotation('oldObject')}) || "
    f"(({has_annotation('object')}) && "
    "object.metadata.annotations['ANNOTATION'] != oldObject.metadata.annotations['ANNOTATION'])")
GATE_REMOVED = f"({has_gate('oldObject')}) && !({has_gate('object')})"


def _not_user(username: str) -> dict[str, str]:
    return {"name": "not-the-controller",
            "expression": f"request.userInfo.username != '{username}'"}


def _namespaces(excluded: Sequence[str], extra: Sequence[Mapping[str, Any]],
                *, labelled: bool = False) -> dict[str, Any]:
    exprs: list[Mapping[str, Any]] = [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn",
                                       "values": list(excluded)}]
    if labelled:
        exprs.append({"key": api.DEFAULT_CLASS_LABEL, "operator": "Exists"})
    return {"matchExpressions": [*exprs, *extra]}


def _client(client: Mapping[str, Any], path: str, ca_bundle: str) -> dict[str, Any]:
    """`{"service": {namespace, name, port}}` or `{"url": "https://host:port"}`."""
    out: dict[str, Any]
    if "url" in client:
        out = {"url": str(client["url"]).rstrip("/") + path}
    else:
        out = {"service": {**client["service"], "path": path}}
    if ca_bundle:
        out["caBundle"] = ca_bundle
    return out


def _webhook(name: str, client: dict[str, Any], operations: list[str], failure: str,
             namespaces: dict[str, Any], conditions: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client,
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                   "resources": ["pods"], "scope": "Namespaced"}],
        "failurePolicy": failure,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "namespaceSelector": namespaces,
        "objectSelector": {},
        "matchConditions": conditions,
    }


def render(client: Mapping[str, Any], *, controller_username: str,
           excluded_namespaces: Sequence[str], name: str = NAME, ca_bundle: str = "",
           extra_namespace_requirements: Sequence[Mapping[str, Any]] = (),
           metadata: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(MutatingWebhookConfiguration, ValidatingWebhookConfiguration).

    `client` is `{"service": {"namespace", "name", "port"}}` or `{"url":
    "https://host:port"}`; `extra_namespace_requirements` narrows every
    webhook further (the tests keep theirs to their own namespaces).
    """
    meta = {"name": name, **(metadata or {})}
    not_controller = _not_user(controller_username)
    excluded, extra = list(excluded_namespaces), list(extra_namespace_requirements)
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": dict(meta),
        "webhooks": [
            {**_webhook(MUTATE_CLAIMS, _client(client, MUTATE_PATH, ca_bundle), ["CREATE"], "Fail",
                        _namespaces(excluded, extra), [
                            not_controller,
                            {"name": "names-claims-without-gate",
                             "expression": f"({has_annotation('object')}) && !({has_gate('object')})"},
                            {"name": "not-bound-to-a-node", "expression": NOT_BOUND}]),
             "reinvocationPolicy": "IfNeeded"},
            {**_webhook(MUTATE_DEFAULT_CLASS, _client(client, MUTATE_PATH, ca_bundle), ["CREATE"],
                        "Fail", _namespaces(excluded, extra, labelled=True), [
                            not_controller,
                            {"name": "names-no-claims", "expression": f"!({has_annotation('object')})"},
                            {"name": "requests-extended-resources", "expression": REQUESTS_EXTENDED},
                            {"name": "not-bound-to-a-node", "expression": NOT_BOUND}]),
             "reinvocationPolicy": "IfNeeded"},
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": dict(meta),
        "webhooks": [
            _webhook(VALIDATE_CLAIMS, _client(client, VALIDATE_PATH, ca_bundle), ["CREATE", "UPDATE"],
                     "Fail", _namespaces(excluded, extra), [
                         not_controller,
                         {"name": "claims-or-gate-at-create-gate-or-claims-changed-at-update",
                          "expression": (
                              f"request.operation == 'CREATE' ? "
                              f"({has_annotation('object')}) || ({has_gate('object')}) : "
                              f"({GATE_REMOVED}) || ({ANNOTATION_CHANGED})")}]),
            _webhook(VALIDATE_BUDGETS, _client(client, VALIDATE_PATH, ca_bundle), ["CREATE"],
                     "Ignore", _namespaces(excluded, extra), [
                         not_controller,
                         {"name": "names-no-claims",
                          "expression": f"!({has_annotation('object')}) && !({has_gate('object')})"},
                         {"name": "requests-extended-resources", "expression": REQUESTS_EXTENDED}]),
        ],
    }
    return mutating, validating


def with_url(configuration: Mapping[str, Any], url: str) -> dict[str, Any]:
    """`configuration` (one `render` made for a Service, as deploy/webhook.yaml
    holds it) calling `url` (`https://host:port`) instead, each webhook on
    its own path; everything else, the scoping first, is unchanged. Run
    outside the cluster (`run --local`), the controller is reached so."""
    out = copy.deepcopy(dict(configuration))
    for hook in out.get("webhooks") or ():
        old = hook.get("clientConfig") or {}
        path = str((old.get("service") or {}).get("path") or "")
        hook["clientConfig"] = _client({"url": url}, path, str(old.get("caBundle") or ""))
    return out


SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


def service_account_username(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def is_service_account(username: str) -> bool:
    """Whether `username` is a service account's, as the API server names them."""
    return username.startswith(SERVICE_ACCOUNT_PREFIX)
