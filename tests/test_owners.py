"""Who controls an object: the one walk over ownerReferences."""

from __future__ import annotations

from typing import Any

import pytest

from gpuclaimctl.model.owners import controller_pod, controller_ref

POD = {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "u1", "controller": True}
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j1", "controller": True}


def owned_by(*refs: Any) -> dict[str, Any]:
    return {"metadata": {"name": "x", "namespace": "ml", "ownerReferences": list(refs)}}


@pytest.mark.parametrize("obj, ref, pod", [
    pytest.param(owned_by(POD), POD, POD, id="a-pod"),
    pytest.param(owned_by(JOB), JOB, None, id="a-job-is-no-pod"),
    pytest.param(owned_by({**POD, "controller": False}, JOB), JOB, None, id="the-controller-among-owners"),
    pytest.param(owned_by({**POD, "apiVersion": "example.com/v1"}), {**POD, "apiVersion": "example.com/v1"},
                 None, id="a-pod-kind-of-another-group"),
    pytest.param(owned_by({k: v for k, v in POD.items() if k != "controller"}), None, None,
                 id="an-owner-that-is-not-the-controller"),
    pytest.param({"metadata": {"name": "x"}}, None, None, id="no-owners"),
    pytest.param({"metadata": {"ownerReferences": "Pod/trainer"}}, None, None, id="malformed-list"),
    pytest.param(owned_by("Pod/trainer", None, POD), POD, POD, id="malformed-entries-skipped"),
    pytest.param({"metadata": None}, None, None, id="no-metadata"),
])
def test_the_controller_reference_and_whether_it_is_a_pod(
        obj: dict[str, Any], ref: dict[str, Any] | None, pod: dict[str, Any] | None) -> None:
    assert controller_ref(obj) == ref
    assert controller_pod(obj) == pod
