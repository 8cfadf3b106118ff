"""Who the controller is, as deployed (issue 45 item 2).

The webhook leaves the controller's own requests alone: its configurations'
matchConditions name deploy/'s service account, and the webhook itself
never gates, mutates or refuses the user a SelfSubjectReview says the
controller runs as. So a controller run with a person's admin credentials
lets that person's pods past the gate: `gpuclaimctl run` warns, once, when
it is not a service account. And the controller the real-plane tests run
is a service account with deploy/'s roles, as deployed, never the tests'
admin (a controller with admin rights would hide a permission deploy/
forgot, and the webhook would leave the tests' own pods alone).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from gpuclaimctl.client import kube
from gpuclaimctl.cmd.webhook import SELF_SUBJECT_REVIEWS, identity_warning
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.controlplane.identity import SYSTEM_NAMESPACE, controller_rbac
from tests.conftest import CONTROLLER_NAMESPACE
from tests.controllerkit import controller_kubeconfig
from tests.helpers import die_with_parent

GPUCLAIMCTL = Path(sys.executable).parent / "gpuclaimctl"
SESSION_ACCOUNT = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:gpuclaimctl"
IDENTITY_LINE = "the webhook never refuses the controller's own requests"


def whoami(api_client: Any) -> str:
    review = kube.request_json(api_client, "POST", SELF_SUBJECT_REVIEWS, body={
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


@pytest.mark.plane
def test_the_tests_controller_runs_as_its_own_service_account_with_deploys_roles_alone(
    run_controller: Callable[..., Any],
) -> None:
    rc = run_controller()
    assert whoami(rc.api_client) == SESSION_ACCOUNT
    # deploy/'s roles, no more: nothing there lets it read Secrets cluster-wide.
    with pytest.raises(kube.ApiError) as refused:
        kube.request(rc.api_client, "GET", "/api/v1/secrets")
    assert refused.value.status == 403


def test_the_identity_elsewhere_has_deploys_rules_under_names_of_its_own() -> None:
    deployed, moved = controller_rbac(), controller_rbac("elsewhere")

    def rules(docs: list[dict[str, Any]]) -> list[Any]:
        return [(d["kind"], d.get("rules")) for d in docs]

    assert rules(moved) == rules(deployed)
    names = {(d["kind"], d["metadata"]["name"]) for d in moved}
    assert {("ClusterRole", "elsewhere"), ("ClusterRole", "elsewhere-webhook"),
            ("Namespace", "elsewhere"), ("ServiceAccount", "gpuclaimctl")} <= names
    assert not {n for kind, n in names if kind.startswith("Cluster") and n.startswith("gpuclaimctl")}
    for doc in moved:
        assert doc["metadata"].get("namespace") in (None, "elsewhere")
        for subject in doc.get("subjects") or ():
            assert (subject["namespace"], subject["name"]) == ("elsewhere", "gpuclaimctl")
        if doc["kind"] == "ClusterRoleBinding":
            assert (doc["roleRef"]["kind"], doc["roleRef"]["name"]) in names
    assert {d["metadata"].get("namespace") for d in deployed} == {None, SYSTEM_NAMESPACE}


@pytest.mark.parametrize("username, groups, warned, admin", [
    pytest.param("system:serviceaccount:gpuclaimctl-system:gpuclaimctl",
                 ["system:serviceaccounts", "system:authenticated"], False, False, id="service-account"),
    pytest.param("gpuclaimctl-admin", ["system:masters", "system:authenticated"], True, True,
                 id="cluster-admin"),
    pytest.param("alice@example.com", ["system:authenticated"], True, False, id="a-person"),
])
def test_only_a_controller_that_is_not_a_service_account_is_warned_about(
    username: str, groups: list[str], warned: bool, admin: bool,
) -> None:
    warning = identity_warning(username, groups)
    assert (warning is not None) == warned
    if warning is not None:
        assert repr(username) in warning and "skip the gate" in warning
        assert ("cluster admin" in warning) == admin


def _run_until_identity_known(kubeconfig: str, tmp_path: Path) -> list[str]:
    """`gpuclaimctl run`'s log lines up to the one naming who it is."""
    proc = subprocess.Popen(
        [str(GPUCLAIMCTL), "run", "--kubeconfig", kubeconfig, "--metrics-bind-address", "0",
         "--health-bind-address", "0", "--webhook-bind-address", "127.0.0.1:0",
         "--no-webhook-self-signed", "--webhook-cert-dir", str(tmp_path / "certs")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=die_with_parent)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(IDENTITY_LINE in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.1)
        time.sleep(0.2)  # a warning comes right after that line
    finally:
        proc.send_signal(signal.SIGKILL)  # nothing to release: no Lease, no writes yet
        proc.wait(10)
        reader.join(5)
    return lines


@pytest.mark.plane
def test_run_with_the_admins_credentials_warns_once_that_its_webhook_lets_the_admins_pods_through(
    full_plane: ControlPlane, crds: list[str], tmp_path: Path,
) -> None:
    lines = _run_until_identity_known(str(full_plane.kubeconfig), tmp_path)
    warnings = [line for line in lines if " warning " in line]
    assert len(warnings) == 1, "\n".join(lines)
    assert "runs as 'gpuclaimctl-admin' (a cluster admin: system:masters), not as a service account" \
        in warnings[0]


@pytest.mark.plane
def test_run_as_its_service_account_warns_of_nothing(
    full_plane: ControlPlane, crds: list[str], tmp_path: Path,
) -> None:
    lines = _run_until_identity_known(controller_kubeconfig(str(full_plane.kubeconfig)), tmp_path)
    assert [line for line in lines if SESSION_ACCOUNT in line and IDENTITY_LINE in line], lines
    assert not [line for line in lines if " warning " in line], "\n".join(lines)
