"""The deploy/ kustomize base, the Dockerfile and the samples.

The pure tests check what the API server cannot: that the objects agree with
each other (selectors and labels, named ports, the Lease name in the Role and
in the Deployment), with the CLI they configure, and that the image installs
the dependency versions the test suite runs with. The plane tests apply the
base and the samples to the real API server with kubectl, as the README tells
an operator to, and ask the API server what the service account may do.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import click
import pytest
import yaml  # type: ignore[import-untyped]
from click.core import ParameterSource
from kubernetes import client
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpuclaimctl.controlplane import ControlPlane, build
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
SYSTEM_NAMESPACE = "gpuclaimctl-system"
SERVICE_ACCOUNT = f"system:serviceaccount:{SYSTEM_NAMESPACE}:gpuclaimctl"
FIELD_MANAGER = "gpuclaimctl-deploy-test"

Obj = dict[str, Any]


# -- rendering ------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[Obj]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def render_base_in_python() -> list[Obj]:
    """The base as kustomize renders it, for a kustomization of plain resources.

    The base is kept that simple on purpose (every object names its own
    namespace); this refuses anything more, so it cannot silently differ from
    kustomize.
    """
    kustomization = load_yaml_docs(DEPLOY / "kustomization.yaml")[0]
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, (
        "deploy/kustomization.yaml uses more than `resources`; render it with kubectl")
    docs: list[Obj] = []
    for resource in kustomization["resources"]:
        docs += load_yaml_docs(DEPLOY / resource)
    return docs


def render_base_with_kubectl(kubectl: Path) -> list[Obj]:
    out = subprocess.run([str(kubectl), "kustomize", str(DEPLOY)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str, str, str], Obj]:
    return {key(o): o for o in render_base_in_python()}


def only(base: dict[tuple[str, str, str, str], Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for (_, k, _, n), o in base.items() if k == kind and n == name]
    return obj


@pytest.fixture(scope="module")
def deployment(base: dict[tuple[str, str, str, str], Obj]) -> Obj:
    return only(base, "Deployment", "gpuclaimctl")


@pytest.fixture(scope="module")
def container(deployment: Obj) -> Obj:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    result: Obj = c
    return result


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


# -- the base holds together --------------------------------------------------


def test_kustomization_lists_every_manifest_in_deploy() -> None:
    listed = set(load_yaml_docs(DEPLOY / "kustomization.yaml")[0]["resources"])
    on_disk = {str(p.relative_to(DEPLOY)) for p in DEPLOY.glob("*.yaml")
               if p.name != "kustomization.yaml"}
    on_disk |= {str(p.relative_to(DEPLOY)) for p in (DEPLOY / "crds").glob("*.yaml")}
    assert listed == on_disk


def test_crds_folder_holds_only_crds() -> None:
    # The `crds` test fixture and operators install deploy/crds/*.yaml as is.
    for path in (DEPLOY / "crds").glob("*.yaml"):
        kinds = {d["kind"] for d in load_yaml_docs(path)}
        assert kinds == {"CustomResourceDefinition"}, path


def crd_schema(plural: str) -> Obj:
    (crd,) = load_yaml_docs(DEPLOY / "crds" / f"{plural}.yaml")
    (version,) = crd["spec"]["versions"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


def test_crd_names_and_enums_are_the_controllers() -> None:
    """deploy/crds and gpuclaimctl/api.py name the same things."""
    from gpuclaimctl.model import api

    for plural, kind in ((api.CLASS_PLURAL, api.CLASS_KIND), (api.CLAIM_PLURAL, api.CLAIM_KIND),
                         (api.TEMPLATE_PLURAL, api.TEMPLATE_KIND)):
        (crd,) = load_yaml_docs(DEPLOY / "crds" / f"{plural}.yaml")
        assert crd["spec"]["group"] == api.GROUP
        assert [v["name"] for v in crd["spec"]["versions"]] == [api.VERSION]
        assert (crd["spec"]["names"]["plural"], crd["spec"]["names"]["kind"]) == (plural, kind)

    klass = crd_schema(api.CLASS_PLURAL)["properties"]["spec"]["properties"]
    assert klass["resourceName"]["default"] == api.DEFAULT_RESOURCE_NAME
    assert klass["onCordon"]["enum"] == [m.value for m in api.OnCordon]
    claim = crd_schema(api.CLAIM_PLURAL)["properties"]
    assert claim["spec"]["properties"]["reclaimPolicy"]["enum"] == [
        m.value for m in api.ReclaimPolicy]
    assert claim["status"]["properties"]["phase"]["enum"] == [m.value for m in api.Phase]
    condition = claim["status"]["properties"]["conditions"]["items"]["properties"]
    for reason in api.WaitReason:
        assert re.fullmatch(condition["reason"]["pattern"], reason.value), reason
    assert re.fullmatch(condition["type"]["pattern"], api.CONDITION_WAITING)


def test_every_namespaced_object_lives_in_the_system_namespace(
    base: dict[tuple[str, str, str, str], Obj],
) -> None:
    cluster_kinds = {"Namespace", "CustomResourceDefinition", "ClusterRole",
                     "ClusterRoleBinding", "MutatingWebhookConfiguration",
                     "ValidatingWebhookConfiguration"}
    for (_, kind, namespace, name) in base:
        expected = "" if kind in cluster_kinds else SYSTEM_NAMESPACE
        assert namespace == expected, f"{kind}/{name}"
    assert only(base, "Namespace", SYSTEM_NAMESPACE)


def test_deployment_runs_two_leader_elected_replicas_on_different_nodes(
    deployment: Obj, container: Obj,
) -> None:
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert container["args"][:2] == ["run", "--leader-elect"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["serviceAccountName"] == "gpuclaimctl"
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    spread = [c for c in pod["topologySpreadConstraints"]
              if c["topologyKey"] == "kubernetes.io/hostname"]
    assert spread and spread[0]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_deployment_probes_and_serves_on_named_ports(container: Obj) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081, "webhook": 9443}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = env_of(container)
    # The controller must listen where the ports and probes point.
    assert env["GPUCLAIMCTL_METRICS_BIND_ADDRESS"]["value"].rsplit(":", 1)[1] == "8080"
    assert env["GPUCLAIMCTL_HEALTH_BIND_ADDRESS"]["value"].rsplit(":", 1)[1] == "8081"


def test_deployment_requests_and_limits_resources(container: Obj) -> None:
    resources = container["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_deployment_runs_non_root_read_only_without_capabilities(
    deployment: Obj, container: Obj,
) -> None:
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == 65532
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_metrics_service_and_budget_select_the_controller_pods(
    base: dict[tuple[str, str, str, str], Obj], deployment: Obj, container: Obj,
) -> None:
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = only(base, "Service", "gpuclaimctl-metrics")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container["ports"]}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    assert "metrics" in port_names
    pdb = only(base, "PodDisruptionBudget", "gpuclaimctl")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_bindings_grant_the_roles_to_the_deployments_service_account(
    base: dict[tuple[str, str, str, str], Obj], deployment: Obj,
) -> None:
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert only(base, "ServiceAccount", sa)
    for kind, role_kind, name in (("ClusterRoleBinding", "ClusterRole", "gpuclaimctl"),
                                  ("RoleBinding", "Role", "gpuclaimctl-leader-election")):
        binding = only(base, kind, name)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": role_kind, "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                        "namespace": SYSTEM_NAMESPACE}]
        assert only(base, role_kind, name)


def test_leader_election_role_names_the_lease_the_deployment_uses(
    base: dict[tuple[str, str, str, str], Obj], container: Obj,
) -> None:
    env = env_of(container)
    lease = env["GPUCLAIMCTL_LEADER_ELECT_LEASE_NAME"]["value"]
    namespace_from = env["GPUCLAIMCTL_LEADER_ELECT_NAMESPACE"]["valueFrom"]
    assert namespace_from == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    role = only(base, "Role", "gpuclaimctl-leader-election")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [[lease]]


def test_deployment_settings_are_options_of_gpuclaimctl_run(
    container: Obj, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each GPUCLAIMCTL_* variable and argument must reach a `run` option."""
    cli = pytest.importorskip("gpuclaimctl.cmd.cli")
    main: click.Group = cli.main
    args = container["args"]
    settings = {name: e.get("value", SYSTEM_NAMESPACE)  # valueFrom: the pod's namespace
                for name, e in env_of(container).items() if name.startswith("GPUCLAIMCTL_")}
    assert settings

    def run_context() -> click.Context:
        parent = main.make_context("gpuclaimctl", [args[0]])
        command = main.get_command(parent, args[0])
        assert command is not None, f"gpuclaimctl has no {args[0]!r} command"
        return command.make_context(args[0], list(args[1:]), parent=parent)

    for name in settings:
        monkeypatch.delenv(name, raising=False)
    ctx = run_context()
    from_args = [p for p in ctx.params
                 if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE]
    assert from_args == ["leader_elect"]
    assert ctx.params["leader_elect"] is True

    for name, value in settings.items():
        for other in settings:
            monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(name, value)
        ctx = run_context()
        from_env = [p for p in ctx.params
                    if ctx.get_parameter_source(p) is ParameterSource.ENVIRONMENT]
        assert len(from_env) == 1, f"{name} sets no option of `gpuclaimctl run`"


# -- the samples ----------------------------------------------------------------


def samples() -> list[Obj]:
    return [d for p in sorted((DEPLOY / "samples").glob("*.yaml")) for d in load_yaml_docs(p)]


def test_sample_pods_are_gated_and_name_claims_the_samples_provide() -> None:
    """The quick start works as written: every claim, template and class a
    sample pod needs is a sample too, and each container asks the device
    plugin for as many GPUs as the pod's claims hold."""
    from gpuclaimctl.model import api
    from gpuclaimctl.model.podclaims import pod_claims

    objs = samples()
    names = {kind: {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}
             for kind in (api.CLASS_KIND, api.CLAIM_KIND, api.TEMPLATE_KIND, "Pod")}
    assert names["Pod"]
    for pod in names["Pod"].values():
        assert pod["spec"]["schedulingGates"] == [{"name": api.SCHEDULING_GATE}]
        total = 0
        for entry in pod_claims(pod):
            if entry.claim is not None:
                spec = names[api.CLAIM_KIND][entry.claim]["spec"]
            elif entry.template is not None:
                spec = names[api.TEMPLATE_KIND][entry.template]["spec"]["spec"]
            else:
                spec = {"className": entry.class_name, "count": entry.count}
            assert spec["className"] in names[api.CLASS_KIND]
            total += spec["count"]
        requested = sum(int(c["resources"]["limits"][api.DEFAULT_RESOURCE_NAME])
                        for c in pod["spec"]["containers"])
        assert requested == total, pod["metadata"]["name"]


# -- the image ----------------------------------------------------------------


def read_requirements() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (DEPLOY / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"requirements.txt: {line!r} is not pinned with =="
        pins[canonicalize_name(name)] = version
    return pins


def runtime_requirements() -> list[Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return [Requirement(line) for line in cfg["options"]["install_requires"].splitlines()
            if line.strip() and not line.strip().startswith("#")]


def installed_closure(roots: list[Requirement]) -> dict[str, str]:
    """Installed distributions the roots need on Linux, without extras."""
    found: dict[str, str] = {}
    todo = [r.name for r in roots]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def test_image_installs_exactly_the_dependency_versions_the_tests_run_with() -> None:
    pins = read_requirements()
    roots = runtime_requirements()
    for req in roots:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a runtime dependency but not pinned"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks {req}"
    assert pins == installed_closure(roots)


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def test_image_is_a_pinned_slim_python_running_gpuclaimctl_as_uid_65532(
    deployment: Obj,
) -> None:
    steps = dockerfile_instructions()
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    bases = [a.split()[0] for w, a in steps if w == "FROM"]
    assert bases and all(b == "${PYTHON_IMAGE}" for b in bases)
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", args["PYTHON_IMAGE"])
    user = [a for w, a in steps if w == "USER"]
    assert user == ["65532:65532"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532
    assert [json.loads(a) for w, a in steps if w == "ENTRYPOINT"] == [["gpuclaimctl"]]
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert "gpuclaimctl = gpuclaimctl.cmd.cli:main" in cfg["options.entry_points"]["console_scripts"]
    installs = [a for w, a in steps if w == "RUN" and "pip install" in a]
    assert installs and all("--no-cache-dir" in a and "--no-deps" in a for a in installs)
    assert any("-r /src/deploy/requirements.txt" in a for a in installs)


def test_image_copies_only_what_the_build_context_lets_through() -> None:
    allowed = {line[1:] for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")}
    for word, rest in dockerfile_instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for source in sources:
            assert source in allowed, f"COPY {source}: excluded by Dockerfile.dockerignore"
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"


# -- on the real API server -----------------------------------------------------


def kubectl_path(plane: ControlPlane) -> Path:
    path = plane.bin.get("kubectl") or build.binary_path("kubectl")
    assert path.is_file(), path
    return path


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([str(kubectl_path(plane)), f"--kubeconfig={plane.kubeconfig}", *args],
                          input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def applied_base(full_plane: ControlPlane, api_client: client.ApiClient,
                 crds: list[str]) -> Iterator[list[Obj]]:
    """`kubectl apply --server-side -k deploy/`; everything but the CRDs removed after.

    Except the webhook configurations: they would send every pod with claims
    in the session's plane to a Service nothing serves here (failurePolicy
    Fail). tests/test_webhook_deploy.py has the API server check them with a
    dry run; tests/test_webhook_plane.py serves the same rendering."""
    rendered = [o for o in render_base_with_kubectl(kubectl_path(full_plane))
                if not o["kind"].endswith("WebhookConfiguration")]
    out = kubectl(full_plane, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
                  "-f", "-", stdin=yaml.safe_dump_all(rendered))
    try:
        yield rendered
    finally:
        # CRDs stay: the session's other tests use them.
        others = [o for o in rendered if o["kind"] != "CustomResourceDefinition"]
        kubectl(full_plane, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                stdin=yaml.safe_dump_all(others))
        core = client.CoreV1Api(api_client)

        def namespace_gone() -> bool:
            try:
                core.read_namespace(SYSTEM_NAMESPACE)
            except client.ApiException as e:
                return e.status == 404
            return False

        # The next test that applies the base must not meet a Terminating namespace.
        wait_for(namespace_gone, timeout=60, message=f"namespace {SYSTEM_NAMESPACE} to go")
    assert out


@pytest.mark.plane
def test_kustomize_renders_exactly_the_listed_manifests(full_plane: ControlPlane) -> None:
    by_kubectl = {key(o): o for o in render_base_with_kubectl(kubectl_path(full_plane))}
    by_python = {key(o): o for o in render_base_in_python()}
    assert by_kubectl == by_python


@pytest.mark.plane
def test_every_manifest_of_the_base_is_stored_by_the_api_server(
    full_plane: ControlPlane, applied_base: list[Obj],
) -> None:
    stored = json.loads(kubectl(full_plane, "get", "-o", "json", "--show-managed-fields",
                                "-f", "-", stdin=yaml.safe_dump_all(applied_base)))["items"]
    assert sorted(key(o) for o in stored) == sorted(key(o) for o in applied_base)
    deployment = next(o for o in stored if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    managers = {m["manager"] for o in stored for m in o["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers


@pytest.mark.plane
def test_controller_pod_passes_the_restricted_pod_security_standard(
    api_client: client.ApiClient, applied_base: list[Obj],
) -> None:
    """The namespace enforces `restricted`; a pod of the Deployment is admitted."""
    deployment = next(o for o in applied_base if o["kind"] == "Deployment")
    # The typed client takes plain dicts as bodies; its hints ask for models.
    pod: Any = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "gpuclaimctl-admission-check",
                        "labels": deployment["spec"]["template"]["metadata"]["labels"]},
           "spec": deployment["spec"]["template"]["spec"]}
    core = client.CoreV1Api(api_client)
    _pod, status, headers = core.create_namespaced_pod_with_http_info(
        SYSTEM_NAMESPACE, pod, dry_run="All")
    assert status == 201
    assert not (headers or {}).get("Warning")

    privileged = json.loads(json.dumps(pod))
    privileged["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(SYSTEM_NAMESPACE, privileged, dry_run="All")
    assert refused.value.status == 403
    assert "allowPrivilegeEscalation" in str(refused.value.body)


def can(api_client: client.ApiClient, user: str, groups: list[str], verb: str, resource: str,
        *, group: str = "", subresource: str = "", namespace: str = "", name: str = "") -> bool:
    review = client.AuthorizationV1Api(api_client).create_subject_access_review(
        client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=groups, resource_attributes=client.V1ResourceAttributes(
                verb=verb, group=group, resource=resource, subresource=subresource,
                namespace=namespace, name=name))))
    assert review.status is not None
    return bool(review.status.allowed)


SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{SYSTEM_NAMESPACE}",
             "system:authenticated"]

# (verb, group, resource, subresource, namespace, name), allowed
SERVICE_ACCOUNT_ACCESS = [
    pytest.param(("watch", "", "pods", "", "", ""), True, id="watch-pods"),
    pytest.param(("patch", "", "pods", "", "team-a", "trainer"), True, id="release-pod"),
    pytest.param(("update", "", "pods", "", "team-a", "trainer"), False, id="no-pod-update"),
    pytest.param(("delete", "", "pods", "", "team-a", "trainer"), True, id="delete-refused-pod"),
    pytest.param(("create", "", "pods", "", "team-a", ""), False, id="no-pod-create"),
    pytest.param(("update", "", "pods", "status", "team-a", "trainer"), False,
                 id="no-pod-status"),
    pytest.param(("list", "", "nodes", "", "", ""), True, id="list-nodes"),
    pytest.param(("patch", "", "nodes", "", "", "n1"), False, id="no-node-writes"),
    pytest.param(("get", "", "secrets", "", "team-a", ""), False, id="no-secrets"),
    pytest.param(("watch", "gpuclaimctl.io", "gpuclasses", "", "", ""), True,
                 id="watch-classes"),
    pytest.param(("update", "gpuclaimctl.io", "gpuclasses", "", "", "a100"), False,
                 id="no-class-writes"),
    pytest.param(("update", "gpuclaimctl.io", "gpuclasses", "status", "", "a100"), True,
                 id="write-class-status"),
    pytest.param(("create", "gpuclaimctl.io", "gpuclaims", "", "team-a", ""), True,
                 id="create-template-claim"),
    pytest.param(("update", "gpuclaimctl.io", "gpuclaims", "status", "team-a", "c"), True,
                 id="write-claim-status"),
    pytest.param(("watch", "gpuclaimctl.io", "gpuclaimtemplates", "", "", ""), True,
                 id="watch-templates"),
    pytest.param(("create", "gpuclaimctl.io", "gpuclaimtemplates", "", "team-a", ""), False,
                 id="no-template-writes"),
    pytest.param(("create", "", "events", "", "team-a", ""), True, id="core-events"),
    # The controller writes core/v1 Events only (tests/test_rbac.py reads the
    # audit log): nothing under events.k8s.io is granted.
    pytest.param(("patch", "events.k8s.io", "events", "", "team-a", "e"), False,
                 id="events-api-events"),
    pytest.param(("create", "coordination.k8s.io", "leases", "", SYSTEM_NAMESPACE, ""), True,
                 id="create-lease"),
    pytest.param(("update", "coordination.k8s.io", "leases", "", SYSTEM_NAMESPACE,
                  "gpuclaimctl"), True, id="renew-own-lease"),
    pytest.param(("update", "coordination.k8s.io", "leases", "", SYSTEM_NAMESPACE,
                  "kube-scheduler"), False, id="not-other-leases"),
    pytest.param(("update", "coordination.k8s.io", "leases", "", "kube-system",
                  "gpuclaimctl"), False, id="not-leases-elsewhere"),
]


@pytest.mark.plane
@pytest.mark.parametrize(("request_", "allowed"), SERVICE_ACCOUNT_ACCESS)
def test_service_account_may_do_what_the_controller_needs_and_no_more(
    api_client: client.ApiClient, applied_base: list[Obj],
    request_: tuple[str, str, str, str, str, str], allowed: bool,
) -> None:
    verb, group, resource, subresource, namespace, name = request_
    assert can(api_client, SERVICE_ACCOUNT, SA_GROUPS, verb, resource, group=group,
               subresource=subresource, namespace=namespace, name=name) is allowed


@pytest.mark.plane
def test_namespace_editors_may_request_gpus_but_not_write_claim_status(
    api_client: client.ApiClient, applied_base: list[Obj], namespace: str,
) -> None:
    rbac = client.RbacAuthorizationV1Api(api_client)
    binding: Any = {
        "metadata": {"name": "alice-edits"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "alice"}]}
    rbac.create_namespaced_role_binding(namespace, binding)

    def alice(verb: str, resource: str, subresource: str = "") -> bool:
        return can(api_client, "alice", ["system:authenticated"], verb, resource,
                   group="gpuclaimctl.io", subresource=subresource, namespace=namespace)

    # kube-controller-manager aggregates gpuclaimctl-edit into `edit`.
    wait_for(lambda: alice("create", "gpuclaims"), timeout=30,
             message="the edit role to gain gpuclaims")
    assert alice("delete", "gpuclaimtemplates")
    assert alice("list", "gpuclaims")
    assert not alice("patch", "gpuclaims", "status")


@pytest.mark.plane
def test_samples_apply_in_a_namespace(
    full_plane: ControlPlane, api_client: client.ApiClient, crds: list[str], namespace: str,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    objs = samples()
    classes = [d["metadata"]["name"] for d in objs if d["kind"] == "GPUClass"]
    listed: Any = custom.list_cluster_custom_object("gpuclaimctl.io", "v1alpha1", "gpuclasses")
    existing = {c["metadata"]["name"] for c in listed["items"]}
    try:
        kubectl(full_plane, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
                "-n", namespace, "-f", str(DEPLOY / "samples"))
        stored = json.loads(kubectl(full_plane, "get", "-n", namespace, "-o", "json",
                                    "-f", str(DEPLOY / "samples")))["items"]
        assert sorted((o["kind"], o["metadata"]["name"]) for o in stored) == sorted(
            (d["kind"], d["metadata"]["name"]) for d in objs)
        for obj in stored:
            if obj["kind"] == "Pod":
                # Applied gated: nothing schedules them until gpuclaimctl releases them.
                assert obj["spec"]["schedulingGates"] == [{"name": "gpuclaimctl.io/claims"}]
                assert obj["status"]["phase"] == "Pending"
                json.loads(obj["metadata"]["annotations"]["gpuclaimctl.io/claims"])
    finally:
        for name in classes:
            if name not in existing:
                custom.delete_cluster_custom_object("gpuclaimctl.io", "v1alpha1",
                                                    "gpuclasses", name)
