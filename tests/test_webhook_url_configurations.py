"""deploy/webhook.yaml's configurations, called at a `url:` (`run --local`,
the controller outside the cluster): only the client config differs, so
the local demo's webhook is scoped exactly as the deployed one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuclaimctl.controlplane.identity import deploy_docs
from gpuclaimctl.webhook import configurations

URL = "https://127.0.0.1:9443"


def deployed(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in deploy_docs("webhook.yaml") if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_each_webhook_calls_the_url_on_its_own_path_and_nothing_else_changes(kind: str) -> None:
    service = deployed(kind)
    original = copy.deepcopy(service)
    local = configurations.with_url(service, URL)
    assert service == original  # not changed in place
    assert [h["clientConfig"] for h in local["webhooks"]] == [
        {"url": URL + h["clientConfig"]["service"]["path"]} for h in service["webhooks"]]
    assert {configurations.MUTATE_PATH, configurations.VALIDATE_PATH} & {
        h["clientConfig"]["url"].removeprefix(URL) for h in local["webhooks"]}

    def without_client(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "webhooks": [{k: v for k, v in h.items() if k != "clientConfig"}
                                    for h in doc["webhooks"]]}

    assert without_client(local) == without_client(service)


def test_a_ca_bundle_already_there_is_kept() -> None:
    service = deployed("ValidatingWebhookConfiguration")
    for hook in service["webhooks"]:
        hook["clientConfig"]["caBundle"] = "Q0E="
    local = configurations.with_url(service, URL)
    assert {h["clientConfig"]["caBundle"] for h in local["webhooks"]} == {"Q0E="}
