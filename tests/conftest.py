"""Session fixtures: one real control plane per test session.

The plane starts with etcd and kube-apiserver the first time a test asks for
it; kube-scheduler, kube-controller-manager and kwok start the first time a
test asks for them (`full_plane`, `gpu_nodes`) and then keep running for the
rest of the session. Every test gets a fresh namespace.

The API server serves PodTemplates without its watch cache, straight from
etcd (`plane.UNCACHED_RESOURCE`): use them where a test needs an etcd
compaction to end a watch with 410 Gone. Every other resource goes through
the watch cache, which answers old resourceVersions from its own window and
is the only source of watch bookmarks.

The plane runs the Kubernetes minor GPUCLAIMCTL_K8S_VERSION names (1.35,
1.36; the newest, 1.37, without it); `--version-stories` keeps only the
stories `make test-versions` runs on each older minor (tests/versionstories.py).

The controller the tests run (`run_controller`, controllerkit's
RunningController) runs as a service account with deploy/'s roles, made
once per session in CONTROLLER_NAMESPACE (not deploy/'s own namespace,
which tests of deploy/ apply and delete), never as the tests' admin.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from kubernetes import client, config, utils

from gpuclaimctl.controlplane import (
    CONTROLLER_MANAGER,
    KWOK,
    SCHEDULER,
    ControlPlane,
)
from tests.helpers import gpu_node_manifest, node_is_ready, wait_for

REPO = Path(__file__).resolve().parent.parent
# Where the session's controller identity lives (see the module docstring).
CONTROLLER_NAMESPACE = "gpuclaimctl-tests"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    try:
        plane = ControlPlane(log=lambda m: print(f"[plane] {m}"), version=k8s_version())
        plane.start()
    except Exception as e:  # the message carries the component's log tail
        pytest.fail(f"the local control plane did not start: {e}", pytrace=False)
    try:
        from gpuclaimctl.controlplane.identity import controller_identity
        from tests.controllerkit import run_as

        run_as(str(plane.kubeconfig), controller_identity(
            plane, plane.workdir / "controller.kubeconfig", namespace=CONTROLLER_NAMESPACE))
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="session")
def full_plane(control_plane: ControlPlane) -> ControlPlane:
    """The plane with kube-scheduler, kube-controller-manager and kwok running."""
    control_plane.ensure(SCHEDULER, CONTROLLER_MANAGER, KWOK)
    return control_plane


@pytest.fixture
def namespace(api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core = client.CoreV1Api(api_client)
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())
    name = f"{base[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    # Without kube-controller-manager nothing makes the `default` service
    # account, and the API server refuses pods that would use it.
    try:
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def gpu_nodes(
    full_plane: ControlPlane, api_client: client.ApiClient
) -> Iterator[Callable[..., dict[str, Any]]]:
    """Factory for kwok-managed GPU nodes; they are deleted after the test.

    `gpu_nodes(name, gpus=8, labels={}, taints=[], ready=True)` returns the
    created Node (as a dict) once kwok reports it Ready (or at once when
    ready=False: such a node is not managed by kwok and never becomes Ready).
    """
    core = client.CoreV1Api(api_client)
    made: list[str] = []
    suffix = uuid.uuid4().hex[:5]

    def make(name: str, gpus: int = 8, *, ready: bool = True, **kwargs: Any) -> dict[str, Any]:
        full = f"{name}-{suffix}"
        manifest = gpu_node_manifest(full, gpus, kwok=ready, **kwargs)
        core.create_node(manifest)
        made.append(full)
        if ready:
            wait_for(lambda: node_is_ready(core, full), timeout=30,
                     message=f"kwok to report node {full} Ready")
        result: dict[str, Any] = api_client.sanitize_for_serialization(core.read_node(full))
        return result

    yield make
    for n in made:
        try:
            core.delete_node(n)
        except client.ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="session")
def crds(api_client: client.ApiClient) -> list[str]:
    """Install the project's CRDs from deploy/crds once and wait until served."""
    ext = client.ApiextensionsV1Api(api_client)
    names: list[str] = []
    for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        try:
            utils.create_from_yaml(api_client, str(path))
        except utils.FailToCreateError as e:
            if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
                raise
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    names.append(doc["metadata"]["name"])

    def established() -> bool:
        for n in names:
            crd = ext.read_custom_resource_definition(n)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") != "True":
                return False
        return True

    wait_for(established, timeout=30, message=f"CRDs {names} to be established")
    return names


def k8s_version() -> str:
    """The Kubernetes minor this session's planes run (GPUCLAIMCTL_K8S_VERSION)."""
    from gpuclaimctl.controlplane import build

    return build.selected_minor(os.environ.get(build.VERSION_ENV))


def pytest_report_header(config: pytest.Config) -> str:
    from gpuclaimctl.controlplane import build

    try:
        minor = k8s_version()
        version = f"Kubernetes {build.KUBERNETES_VERSIONS[minor]} (set {build.VERSION_ENV} to change)"
    except build.BuildError as e:
        version = str(e)
    return (f"control plane cache: {build.cache_root()} (set GPUCLAIMCTL_CACHE to move it); "
            f"{version}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--version-stories", action="store_true", default=False,
                     help="run only the stories make test-versions runs on older "
                          "Kubernetes minors (tests/versionstories.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--version-stories"):
        return
    from tests.versionstories import select

    keep, unmatched = select(item.nodeid for item in items)
    if unmatched:
        raise pytest.UsageError("tests/versionstories.py names tests that do not exist: "
                                + ", ".join(unmatched))
    kept = set(keep)
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in kept])
    items[:] = [i for i in items if i.nodeid in kept]



@pytest.fixture
def run_controller(full_plane: ControlPlane, crds: list[str]) -> Iterator[Callable[..., Any]]:
    """Factory: start the real controller in-process; stopped after the test.

    `run_controller(**option_overrides)` returns a started RunningController;
    call `.stop()` on it to take it down mid-test (then start another).
    """
    from tests.controllerkit import RunningController

    running: list[RunningController] = []

    def start(**overrides: Any) -> RunningController:
        rc = RunningController(str(full_plane.kubeconfig), **overrides).start()
        running.append(rc)
        return rc

    yield start
    for rc in running:
        rc.stop()
