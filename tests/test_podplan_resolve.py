"""`podplan.resolve`: a pod's own inline claim made from an earlier version of its entry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuclaimctl.decide.podplan import Found, Outdated, resolve
from gpuclaimctl.model import api
from gpuclaimctl.model.podclaims import pod_claims, template_claim


def gated_pod(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid",
                         "annotations": {api.CLAIMS_ANNOTATION: json.dumps(entries)}},
            "spec": {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "containers": []}}


def made_from(entries: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    pod = gated_pod(entries)
    claim = template_claim(pod, pod_claims(pod)[0], None)
    claim["metadata"]["uid"] = "claim-uid"
    claim["status"] = status
    return claim


OLD = [{"name": "g", "className": "big", "count": 4}]
NEW = [{"name": "g", "className": "a100", "count": 1}]


def resolved(claim: dict[str, Any], entries: list[dict[str, Any]]) -> Any:
    pod = gated_pod(entries)
    return resolve(pod, pod_claims(pod), lambda ns, name: claim if name == "p-g" else None,
                   lambda ns, name: None)[0]


def test_an_unused_claim_of_an_edited_inline_entry_is_outdated_and_made_again_as_the_entry_says() -> None:
    r = resolved(made_from(OLD), NEW)
    assert isinstance(r, Outdated) and r.claim["metadata"]["uid"] == "claim-uid"
    assert r.body["spec"] == {"className": "a100", "count": 1}
    assert "(4 × big)" in r.message and "(1 × a100)" in r.message


@pytest.mark.parametrize("status", [
    {"phase": "Bound", "nodeName": "n1", "reservedFor": [{"name": "p", "uid": "pod-uid"}]},
    {"phase": "Pending", "reservedFor": [{"name": "p", "uid": "pod-uid"}]},
    {"phase": "Lost", "nodeName": "n1"},
], ids=["bound", "reserved", "lost"])
def test_a_claim_that_holds_or_is_held_is_kept_whatever_the_entry_says_now(status: dict[str, Any]) -> None:
    assert isinstance(resolved(made_from(OLD, **status), NEW), Found)


def test_an_unchanged_entry_finds_its_claim() -> None:
    assert isinstance(resolved(made_from(NEW), NEW), Found)
