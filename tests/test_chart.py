"""The Helm chart in deploy/chart/gpuclaimctl.

Its defaults render the very objects of the kustomize base (whatever
deploy/kustomization.yaml lists: a resource added there fails the comparison
until the chart has it too), less the Namespace, which helm installs into
rather than owns. Its values reach the objects they name, `helm lint` passes,
and `helm install` on the real plane creates every object it renders and
`helm uninstall` removes them. helm is built from its Go module like the
plane's binaries (`make controlplane`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import click
import pytest
import yaml  # type: ignore[import-untyped]
from click.core import ParameterSource
from kubernetes import client

from gpuclaimctl.cmd import chartschema
from gpuclaimctl.controlplane import ControlPlane, build
from tests.helpers import wait_for
from tests.test_deploy_manifests import (
    DEPLOY,
    SYSTEM_NAMESPACE,
    kubectl,
    load_yaml_docs,
    render_base_in_python,
    render_base_with_kubectl,
)

CHART = DEPLOY / "chart" / "gpuclaimctl"
RELEASE = "gpuclaimctl"
# The labels Helm's conventions add to each object's metadata; nothing else
# may differ from the base.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

Obj = dict[str, Any]
Key = tuple[str, str, str, str]


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """helm's argv, with its cache, config and data in a temporary folder."""
    path = build.ensure_binaries(components=(build.HELM,))["helm"]
    home = tmp_path_factory.mktemp("helm-home")
    saved = {k: os.environ.get(k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME",
                                            "HELM_DATA_HOME")}
    for k in saved:
        os.environ[k] = str(home / k.lower())
    try:
        yield [str(path)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_helm(helm: list[str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*helm, *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return done


def render(helm: list[str], *values: str, values_json: Obj | None = None) -> list[Obj]:
    """`helm template` of the chart in the system namespace, CRDs included."""
    extra: list[str] = []
    for v in values:
        extra += ["--set", v]
    if values_json is not None:
        for k, v in values_json.items():
            extra += ["--set-json", f"{k}={json.dumps(v)}"]
    out = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", SYSTEM_NAMESPACE,
                   "--include-crds", *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def without_helm_labels(obj: Obj) -> Obj:
    obj = json.loads(json.dumps(obj))
    labels = obj["metadata"].get("labels") or {}
    for label in HELM_LABELS:
        labels.pop(label, None)
    return obj


def only(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    (obj,) = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def container(objs: list[Obj]) -> Obj:
    (c,) = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    result: Obj = c
    return result


def kustomize_base() -> list[Obj]:
    """deploy/ as kustomize renders it: with the plane's kubectl where it is
    built, else the test's rendering of a kustomization of plain resources."""
    kubectl_bin = build.binary_path("kubectl")
    if kubectl_bin.is_file():
        return render_base_with_kubectl(kubectl_bin)
    return render_base_in_python()


# -- helm lint and helm template --------------------------------------------------


def test_chart_passes_helm_lint_strict(helm: list[str]) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_chart_defaults_render_exactly_the_kustomize_base(helm: list[str]) -> None:
    base = {key(o): o for o in kustomize_base()}
    # helm installs into a namespace that exists (`kubectl apply -f
    # deploy/namespace.yaml`, or --create-namespace) and never owns it.
    namespace = ("v1", "Namespace", "", SYSTEM_NAMESPACE)
    assert namespace in base
    del base[namespace]
    chart = {key(o): without_helm_labels(o) for o in render(helm)}

    missing = sorted(set(base) - set(chart))
    assert not missing, (
        "deploy/kustomization.yaml renders objects the chart lacks (add them to "
        f"{CHART.relative_to(DEPLOY.parent)}/templates): "
        + ", ".join(f"{k}/{n}" for _, k, _, n in missing))
    extra = sorted(set(chart) - set(base))
    assert not extra, "the chart renders objects the kustomize base lacks: " + ", ".join(
        f"{k}/{n}" for _, k, _, n in extra)
    for k, obj in base.items():
        assert chart[k] == obj, f"{k[1]}/{k[3]} differs between the chart and deploy/"


def test_every_object_carries_helms_labels(helm: list[str]) -> None:
    for obj in render(helm):
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is installed as is, never templated
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm", key(obj)
        assert labels["helm.sh/chart"] == "gpuclaimctl-0.1.0", key(obj)


def test_chart_and_app_version_are_the_projects() -> None:
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(DEPLOY.parent / "setup.cfg")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == cfg["metadata"]["version"]


def test_objects_go_to_the_release_namespace(helm: list[str]) -> None:
    out = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", "gpu-ops").stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    namespaced = [o for o in objs if o["kind"] not in ("ClusterRole", "ClusterRoleBinding",
                                                       "MutatingWebhookConfiguration",
                                                       "ValidatingWebhookConfiguration")]
    assert namespaced and {o["metadata"]["namespace"] for o in namespaced} == {"gpu-ops"}
    subjects = [s for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
                for s in o["subjects"]]
    assert subjects and {s["namespace"] for s in subjects} == {"gpu-ops"}
    webhooks = [h for o in objs if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]]
    assert webhooks and {h["clientConfig"]["service"]["namespace"] for h in webhooks} == {"gpu-ops"}


def test_image_replicas_and_resources_reach_the_deployment(helm: list[str]) -> None:
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"},
                 "limits": {"cpu": "2", "memory": "4Gi"}}
    objs = render(helm, "image.repository=registry.example/gpuclaimctl", "image.tag=0.2.0",
                  "image.pullPolicy=Always", "replicas=3",
                  values_json={"resources": resources,
                               "imagePullSecrets": [{"name": "pull"}]})
    deployment = only(objs, "Deployment")
    c = container(objs)
    assert deployment["spec"]["replicas"] == 3
    assert c["image"] == "registry.example/gpuclaimctl:0.2.0"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == resources
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "pull"}]


def test_leader_election_values_name_one_lease_in_the_role_and_the_deployment(
    helm: list[str],
) -> None:
    objs = render(helm, "leaderElection.leaseName=gpu-leader",
                  "leaderElection.leaseDuration=30s", "leaderElection.renewDeadline=20s",
                  "leaderElection.retryPeriod=4s")
    env = {e["name"]: e.get("value") for e in container(objs)["env"]}
    assert env["GPUCLAIMCTL_LEADER_ELECT_LEASE_NAME"] == "gpu-leader"
    assert (env["GPUCLAIMCTL_LEADER_ELECT_LEASE_DURATION"],
            env["GPUCLAIMCTL_LEADER_ELECT_RENEW_DEADLINE"],
            env["GPUCLAIMCTL_LEADER_ELECT_RETRY_PERIOD"]) == ("30s", "20s", "4s")
    role = only(objs, "Role", "gpuclaimctl-leader-election")
    assert [r["resourceNames"] for r in role["rules"] if r.get("resourceNames")] == [
        ["gpu-leader"]]


def test_one_replica_runs_without_leader_election_and_without_the_lease_role(
    helm: list[str],
) -> None:
    objs = render(helm, "leaderElection.enabled=false", "replicas=1")
    c = container(objs)
    assert c["args"] == ["run", "--no-leader-elect"]
    assert not [e for e in c["env"] if e["name"].startswith("GPUCLAIMCTL_LEADER_ELECT")]
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding")
                and o["metadata"]["name"] == "gpuclaimctl-leader-election"]


def test_chart_refuses_several_replicas_without_leader_election(helm: list[str]) -> None:
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set",
                    "leaderElection.enabled=false", ok=False)
    assert done.returncode != 0
    assert "replicas > 1 needs leaderElection.enabled" in done.stderr


@pytest.mark.parametrize("value", [
    pytest.param("replica=3", id="misspelt-key"),
    pytest.param("logFormat=yaml", id="unknown-log-format"),
    pytest.param("flags.workerz=8", id="unknown-flag"),
])
def test_chart_refuses_values_it_does_not_know(helm: list[str], value: str) -> None:
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set", value, ok=False)
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr


def test_flags_are_options_of_gpuclaimctl_run(
    helm: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each entry of .Values.flags reaches `gpuclaimctl run` as its option."""
    flags = {"workers": 8, "placement-strategy": "spread", "node-lost-grace": "10m",
             "resync-period": "0", "event-qps": 2.5}
    args = container(render(helm, values_json={"flags": flags}))["args"]
    assert args[:2] == ["run", "--leader-elect"]
    ctx = parsed_by_gpuclaimctl(args, monkeypatch)
    from_args = {p for p in ctx.params
                 if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE}
    assert from_args == {"leader_elect"} | {f.replace("-", "_") for f in flags}
    assert ctx.params["workers"] == 8


def parsed_by_gpuclaimctl(args: list[str], monkeypatch: pytest.MonkeyPatch) -> click.Context:
    """The container's arguments as `gpuclaimctl` parses them (no GPUCLAIMCTL_* set)."""
    cli = pytest.importorskip("gpuclaimctl.cmd.cli")
    main: click.Group = cli.main
    for name in list(os.environ):
        if name.startswith("GPUCLAIMCTL_"):
            monkeypatch.delenv(name)
    parent = main.make_context("gpuclaimctl", [args[0]])
    command = main.get_command(parent, args[0])
    assert command is not None
    return command.make_context(args[0], list(args[1:]), parent=parent)


# -- flags: the schema knows `gpuclaimctl run`'s options (issue 45) ---------------

SCHEMA = CHART / "values.schema.json"
FLAGS_TEMPLATE = CHART / "templates" / "_flags.tpl"


def schema_flags() -> Obj:
    flags: Obj = json.loads(SCHEMA.read_text())["properties"]["flags"]
    return flags


def test_the_flags_schema_and_template_are_what_make_chart_schema_writes() -> None:
    """Both are generated from `run`'s click options: an option added,
    renamed or retyped fails here until `make chart-schema` is run."""
    from gpuclaimctl.cmd.cli import run

    assert SCHEMA.read_text() == chartschema.render_values_schema(SCHEMA.read_text(), run), \
        "values.schema.json's flags are not run's options: run `make chart-schema`"
    assert FLAGS_TEMPLATE.read_text() == chartschema.render_flags_template(), \
        "templates/_flags.tpl is not chartschema.NOT_HERE: run `make chart-schema`"


def test_the_flags_schema_lists_every_run_option_and_nothing_else() -> None:
    from gpuclaimctl.cmd.cli import run

    flags = schema_flags()
    assert flags["additionalProperties"] is False
    options = [p for p in run.params if isinstance(p, click.Option)]
    assert list(flags["properties"]) == [chartschema.flag_name(o) for o in options]
    for name, why in chartschema.NOT_HERE.items():
        assert why in flags["properties"][name]["description"], name


@pytest.mark.parametrize("command", [
    pytest.param(("template", RELEASE, str(CHART)), id="template"),
    pytest.param(("lint", "--strict", str(CHART)), id="lint"),
])
def test_a_flag_run_does_not_have_is_refused_by_name(helm: list[str], command: tuple[str, ...]) -> None:
    """It used to render --workerz=8, and the pod crash-looped."""
    done = run_helm(helm, *command, "--set-json", 'flags={"workerz":8}', ok=False)
    assert done.returncode != 0
    assert "at '/flags': additional properties 'workerz' not allowed" in done.stdout + done.stderr


def test_a_flag_of_the_wrong_type_is_refused(helm: list[str]) -> None:
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set-json", 'flags={"workers":"many"}', ok=False)
    assert done.returncode != 0 and "at '/flags/workers': got string, want integer" in done.stderr


def test_leader_elect_in_flags_is_refused_pointing_at_leader_election_enabled(helm: list[str]) -> None:
    """It used to fail with a schema error about an unrelated key
    (/podDisruptionBudget, /tolerations: whichever helm reported)."""
    said = "flags.leader-elect is not allowed: the chart sets it from leaderElection.enabled"
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set-json", 'flags={"leader-elect":false}', ok=False)
    assert done.returncode != 0 and said in done.stderr
    # helm lint evaluates no template's `fail` (nor the replicas rule's):
    # it passes, printing the message.
    linted = run_helm(helm, "lint", str(CHART), "--set-json", 'flags={"leader-elect":false}', ok=False)
    assert said in linted.stdout + linted.stderr


def test_every_flag_the_chart_sets_itself_is_refused_with_what_sets_it(helm: list[str]) -> None:
    for name, why in chartschema.NOT_HERE.items():
        done = run_helm(helm, "template", RELEASE, str(CHART), "--set-json", f'flags={{"{name}":"x"}}', ok=False)
        assert done.returncode != 0, f"flags.{name} rendered"
        assert f"flags.{name} is not allowed: {why}" in done.stderr, done.stderr


def sample(schema: Obj) -> Any:
    """A value of the JSON type `schema` says, other than a default."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema.get("type")
    samples = {"boolean": False, "integer": 3, "number": 2.5, "string": "x", "array": None}
    if kind == "array":
        return [sample(schema["items"]), sample(schema["items"])]
    if isinstance(kind, list):  # a duration
        return "90s"
    return samples[kind]


def test_a_value_of_each_flag_s_schema_type_renders_options_run_accepts(
    helm: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuclaimctl.cmd.cli import run

    flags = {name: sample(s) for name, s in schema_flags()["properties"].items()
             if name not in chartschema.NOT_HERE}
    args = container(render(helm, values_json={"flags": flags}))["args"]
    ctx = parsed_by_gpuclaimctl(args, monkeypatch)
    from_args = {p for p in ctx.params if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE}
    names = {chartschema.flag_name(p): p.name for p in run.params if isinstance(p, click.Option)}
    assert from_args == {"leader_elect"} | {names[f] for f in flags}
    assert ctx.params["webhook_hosts"] == ("x", "x") and ctx.params["webhook_self_signed"] is False


def test_service_monitor_scrapes_the_metrics_port_of_every_controller_pod(
    helm: list[str],
) -> None:
    assert not [o for o in render(helm) if o["kind"] == "ServiceMonitor"]
    objs = render(helm, "monitoring.serviceMonitor.enabled=true",
                  "monitoring.serviceMonitor.labels.release=prom")
    monitor = only(objs, "ServiceMonitor")
    service = only(objs, "Service", "gpuclaimctl-metrics")
    assert monitor["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # Secure metrics by default: HTTPS with Prometheus's own token, the
    # self-signed certificate not verified.
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    env = {e["name"]: e.get("value") for e in container(objs)["env"]}
    assert env["GPUCLAIMCTL_METRICS_SECURE"] == "true"


def test_plain_metrics_are_scraped_over_http(helm: list[str]) -> None:
    objs = render(helm, "monitoring.serviceMonitor.enabled=true", "metricsSecure=false")
    (endpoint,) = only(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert "scheme" not in endpoint and "bearerTokenFile" not in endpoint
    env = {e["name"]: e.get("value") for e in container(objs)["env"]}
    assert env["GPUCLAIMCTL_METRICS_SECURE"] == "false"


def test_metrics_reader_role_is_bound_to_the_scrapers_named(helm: list[str]) -> None:
    assert not [o for o in render(helm) if o["kind"] == "ClusterRoleBinding"
                and o["metadata"]["name"] == "gpuclaimctl-metrics-reader"]
    objs = render(helm, "monitoring.metricsReader.serviceAccounts[0].namespace=monitoring",
                  "monitoring.metricsReader.serviceAccounts[0].name=prometheus-k8s")
    binding = only(objs, "ClusterRoleBinding", "gpuclaimctl-metrics-reader")
    role = only(objs, "ClusterRole", "gpuclaimctl-metrics-reader")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": "monitoring",
                                    "name": "prometheus-k8s"}]


def test_prometheus_rule_is_deploy_monitorings(helm: list[str]) -> None:
    assert not [o for o in render(helm) if o["kind"] == "PrometheusRule"]
    rule = only(render(helm, "monitoring.prometheusRule.enabled=true"), "PrometheusRule")
    (shipped,) = load_yaml_docs(DEPLOY / "monitoring" / "alerts.yaml")
    assert without_helm_labels(rule) == shipped


def test_prometheus_rule_watches_the_lease_the_chart_names(helm: list[str]) -> None:
    rule = only(render(helm, "monitoring.prometheusRule.enabled=true",
                       "leaderElection.leaseName=gpu-leader"), "PrometheusRule")
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert 'leader_election_master_status{name="gpu-leader"}' in exprs["GPUClaimCtlNoLeader"]
    # Without leader election the process reports leading under the default name.
    rule = only(render(helm, "monitoring.prometheusRule.enabled=true", "leaderElection.enabled=false",
                       "replicas=1", "leaderElection.leaseName=gpu-leader"), "PrometheusRule")
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert 'leader_election_master_status{name="gpuclaimctl"}' in exprs["GPUClaimCtlNoLeader"]


def test_chart_files_are_copies_of_deploys() -> None:
    """helm reads nothing outside the chart: these copies must not drift."""
    pairs = [(CHART / "files" / "rules.yml", DEPLOY / "monitoring" / "rules.yml")]
    pairs += [(CHART / "crds" / p.name, p) for p in sorted((DEPLOY / "crds").glob("*.yaml"))]
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(
        p.name for _, p in pairs[1:])
    for copy, original in pairs:
        assert copy.read_text() == original.read_text(), (
            f"cp {original.relative_to(DEPLOY.parent)} {copy.relative_to(DEPLOY.parent)}")


# -- helm install on the real plane ------------------------------------------------


@pytest.mark.plane
def test_helm_install_creates_every_object_and_uninstall_removes_them(
    full_plane: ControlPlane, api_client: client.ApiClient, helm: list[str],
) -> None:
    core = client.CoreV1Api(api_client)
    rendered = render(helm)
    templated = [o for o in rendered if o["kind"] != "CustomResourceDefinition"]
    kubeconfig = f"--kubeconfig={full_plane.kubeconfig}"
    # The README's way: the base's Namespace (restricted Pod Security), then helm.
    kubectl(full_plane, "apply", "-f", str(DEPLOY / "namespace.yaml"))
    try:
        run_helm(helm, "install", RELEASE, str(CHART), kubeconfig,
                 "--namespace", SYSTEM_NAMESPACE)

        stored = json.loads(kubectl(full_plane, "get", "-o", "json", "-f", "-",
                                    stdin=yaml.safe_dump_all(rendered)))["items"]
        assert sorted(key(o) for o in stored) == sorted(key(o) for o in rendered)
        for obj in stored:
            if obj["kind"] == "CustomResourceDefinition":
                continue
            annotations = obj["metadata"].get("annotations") or {}
            assert annotations.get("meta.helm.sh/release-name") == RELEASE, key(obj)
        deployment = next(o for o in stored if o["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == 2
        status = json.loads(run_helm(helm, "status", RELEASE, kubeconfig, "--namespace",
                                     SYSTEM_NAMESPACE, "-o", "json").stdout)
        assert status["info"]["status"] == "deployed"

        run_helm(helm, "uninstall", RELEASE, kubeconfig, "--namespace", SYSTEM_NAMESPACE,
                 "--wait", "--timeout", "60s")
        left = kubectl(full_plane, "get", "--ignore-not-found", "-o", "name", "-f", "-",
                       stdin=yaml.safe_dump_all(templated))
        assert left.strip() == ""
        # crds/ is never deleted by helm: claims would go with their CRDs.
        ext = client.ApiextensionsV1Api(api_client)
        for crd in (o for o in rendered if o["kind"] == "CustomResourceDefinition"):
            ext.read_custom_resource_definition(crd["metadata"]["name"])
    finally:
        run_helm(helm, "uninstall", RELEASE, kubeconfig, "--namespace", SYSTEM_NAMESPACE,
                 "--ignore-not-found", ok=False)
        core.delete_namespace(SYSTEM_NAMESPACE, propagation_policy="Background")

        def namespace_gone() -> bool:
            try:
                core.read_namespace(SYSTEM_NAMESPACE)
            except client.ApiException as e:
                return e.status == 404
            return False

        # The next test that installs into it must not meet a Terminating namespace.
        wait_for(namespace_gone, timeout=60, message=f"namespace {SYSTEM_NAMESPACE} to go")
