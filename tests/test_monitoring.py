"""deploy/monitoring, proven: the alerts pass `promtool check rules` and their
unit tests (tests/monitoring/*.yml), the PrometheusRule carries the same
groups as the plain rules file, every query names only metrics the
controller exports, and a real Prometheus scraping a real controller answers
every query of the dashboard with data.

promtool and prometheus come from Debian's `prometheus` package (.ci/run
installs it). Without them these tests skip, except in CI (CI=true), where
they fail: CI must never pass by not running them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from gpuclaimctl.client import kube
from gpuclaimctl.cmd import app
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.model import api
from metrics.leaderelection import LeaderElectionMetrics
from tests.helpers import die_with_parent, free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules.yml"
PROMETHEUS_RULE = MONITORING / "alerts.yaml"
DASHBOARD = MONITORING / "dashboard.json"
SCRAPE_CONFIG = MONITORING / "scrape-config.yml"
RULE_TESTS = sorted((REPO / "tests" / "monitoring").glob("*.yml"))
CLAIMS = f"/apis/{api.GROUP}/{api.VERSION}"

# Metric names in PromQL: ours, client-go's work queue and leader election.
_METRIC = re.compile(r"\b(?:gpuclaimctl|workqueue|leader_election)_[a-zA-Z0-9_:]*")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\s*\)$")


def tool(name: str) -> str:
    """The path of a Prometheus binary; skip without it, but fail in CI."""
    path = shutil.which(name)
    if path is not None:
        return path
    why = f"{name} is not installed (Debian package `prometheus`: apt-get install prometheus; .ci/run does)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}, and CI must run the monitoring tests", pytrace=False)
    pytest.skip(why)


def promtool(*args: str | Path, cwd: Path = REPO) -> str:
    done = subprocess.run([tool("promtool"), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{done.stdout}{done.stderr}"
    return done.stdout


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", ())]


def variables() -> list[dict[str, Any]]:
    return [v for v in dashboard()["templating"]["list"] if v["type"] == "query"]


def exported_metric_names() -> set[str]:
    """The sample names `gpuclaimctl run --leader-elect` exports: its
    registry as app.build fills it, plus the elector's metrics."""
    registry = CollectorRegistry()
    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    _, controller = app.build(api_client, Options(), registry)
    controller.shutdown(0)  # its queue's delay thread must not outlive the test
    LeaderElectionMetrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("_count", "_sum"), "gauge": ("",)}
    families: list[Metric] = list(registry.collect())
    return {f.name + s for f in families for s in suffixes.get(f.type, ("",))}


# --- the files, checked without a server ---------------------------------------------


def test_the_rules_pass_promtool_check() -> None:
    out = promtool("check", "rules", RULES)
    assert f"SUCCESS: {len(alerts())} rules found" in out


def test_the_prometheus_rule_embeds_exactly_the_rules_files_groups(tmp_path: Path) -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "gpuclaimctl-system"
    assert rule["spec"]["groups"] == rule_groups(), \
        "deploy/monitoring/alerts.yaml spec.groups must be rules.yml's groups, word for word"
    embedded = tmp_path / "embedded.yml"
    embedded.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool("check", "rules", embedded)


def test_every_alert_passes_its_unit_tests() -> None:
    assert RULE_TESTS, "no promtool rule tests in tests/monitoring/"
    out = promtool("test", "rules", *RULE_TESTS, cwd=REPO / "tests" / "monitoring")
    assert "SUCCESS" in out


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_keeps_it_quiet() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", ()):
                (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    assert set(alerts()) - fires == set(), "alerts no test shows firing"
    assert set(alerts()) - quiet == set(), "alerts no test shows staying quiet"


def test_the_alerts_are_the_ones_an_operator_is_promised() -> None:
    assert set(alerts()) == {"GPUClaimPodWaitingTooLong", "GPUClaimPodWaitingForGPUs",
                             "GPUClaimPodUnsatisfiable", "GPUClaimsLost", "GPUBudgetNearlyExhausted", "GPUClaimCtlNoLeader",
                             "GPUClaimCtlSyncErrors"}
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_dashboard_and_the_rules_name_only_metrics_the_controller_exports() -> None:
    exported = exported_metric_names()
    exprs = [e for _, e in panel_queries()] + [r["expr"] for r in alerts().values()]
    exprs += [v["definition"] for v in variables()]
    used = {m for e in exprs for m in _METRIC.findall(e)}
    assert used, "no metric found in the queries"
    assert used - exported == set(), f"not exported by gpuclaimctl: {sorted(used - exported)}"


def test_the_dashboard_shows_what_an_operator_looks_for() -> None:
    exprs = " ".join(e for _, e in panel_queries())
    for metric in ("gpuclaimctl_gpus_allocatable", "gpuclaimctl_gpus_bound", "gpuclaimctl_pods_waiting",
                   "gpuclaimctl_pod_release_seconds_bucket", "gpuclaimctl_placements_total",
                   "gpuclaimctl_budget_gpus", "workqueue_depth",
                   "workqueue_work_duration_seconds_bucket", "leader_election_master_status"):
        assert metric in exprs, f"no panel shows {metric}"
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert {v["name"] for v in variables()} == {"job", "class", "namespace"}


def test_the_dashboard_plots_failed_syncs_not_the_retries_a_healthy_controller_makes() -> None:
    """Issue 45: workqueue_retries_total counts every delayed re-queue (as in
    client-go), so it grew on a healthy controller under a panel that called
    it failed syncs."""
    panels = dashboard()["panels"]
    for p in panels:
        if any("workqueue_retries_total" in t["expr"] for t in p.get("targets", ())):
            assert "delayed re-queue" in p.get("description", ""), f"{p['title']}: says what retries count"
    failed = [p for p in panels if "Failed" in p["title"]]
    assert failed and all('result="error"' in t["expr"] for p in failed for t in p["targets"])


def test_the_dashboard_counts_claims_created_by_source() -> None:
    exprs = [e for _, e in panel_queries()]
    assert any("gpuclaimctl_claims_created_total" in e and "by (source)" in e for e in exprs)
    assert not any("gpuclaimctl_template_claims_created_total" in e for e in exprs), "the deprecated name"


# --- a real Prometheus scraping a real controller ------------------------------------------


def scrape_job(folder: Path, targets: list[str], token: str | None) -> dict[str, Any]:
    """The gpuclaimctl job for `targets`: plain, or deploy/monitoring's with `token`."""
    if token is None:
        return {"job_name": "gpuclaimctl", "static_configs": [{"targets": targets}]}
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    del job["kubernetes_sd_configs"], job["relabel_configs"]
    (folder / "token").write_text(token)
    job["authorization"]["credentials_file"] = str(folder / "token")
    return {**job, "static_configs": [{"targets": targets}]}


class Prometheus:
    """`prometheus` on loopback, scraping the targets every second and
    evaluating the rules every second, its data in a temporary folder."""

    def __init__(self, folder: Path, targets: list[str], token: str | None = None) -> None:
        """`token` given: the targets are scraped as deploy/monitoring's job
        says (HTTPS, bearer token, certificate not verified), with it."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [scrape_job(folder, targets, token)],
        }))
        self.argv = [tool("prometheus"), f"--config.file={config}",
                     f"--storage.tsdb.path={folder / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        wait_for(self.ready, timeout=20, interval=0.1,
                 message=lambda: f"Prometheus to be ready; its log:\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:]) if self.log.exists() else ""

    def ready(self) -> bool:
        assert self.popen is not None
        if self.popen.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.popen.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def label_values(self, selector: str, label: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": selector})
        return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables in `expr`: `$name` and `${name}`."""
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a variable left unsubstituted: {expr}"
    return expr


@pytest.fixture
def prometheus_binaries() -> None:
    tool("promtool")
    tool("prometheus")


@pytest.fixture
def controller_process(full_plane: Any, crds: list[str], namespace: str,
                       tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """`gpuclaimctl run --leader-elect` as a process, its Lease (named
    gpuclaimctl, as the rules expect) in the test's namespace."""
    from tests.test_failover import ControllerProcess

    started: list[ControllerProcess] = []

    def start(metrics_token: str | None = None) -> ControllerProcess:
        proc = ControllerProcess("controller", str(full_plane.kubeconfig), tmp_path,
                                 lease_namespace=namespace, lease_name="gpuclaimctl",
                                 metrics_token=metrics_token).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


READER_BINDING = "gpuclaimctl-metrics-reader"


def metrics_reader_token(api_client: client.ApiClient, namespace: str) -> str:
    """A token of `prometheus` in `namespace`, bound to deploy/'s metrics reader role."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    (role,) = yaml.safe_load_all((REPO / "deploy" / "metrics-reader-rbac.yaml").read_text())
    try:
        kube.request(api_client, "POST", f"{rbac}/clusterroles", body=role)
    except kube.ApiError as e:
        if e.status != 409:
            raise
    kube.request(api_client, "POST", f"{rbac}/clusterrolebindings", body={
        "metadata": {"name": f"{READER_BINDING}-{namespace}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": "prometheus"}]})
    kube.request(api_client, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                 body={"metadata": {"name": "prometheus"}})
    review = kube.request_json(
        api_client, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/prometheus/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 3600}})
    return str(review["status"]["token"])


def test_the_scrape_config_passes_promtool_and_scrapes_secure_metrics(tmp_path: Path) -> None:
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    # Debian's prometheus is built without Kubernetes service discovery:
    # the rest of the job is checked as written, its targets given statically.
    checked = {**job, "static_configs": [{"targets": ["127.0.0.1:8080"]}]}
    del checked["kubernetes_sd_configs"]
    (tmp_path / "token").write_text("t")
    checked["authorization"] = {**job["authorization"], "credentials_file": str(tmp_path / "token")}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [checked]}))
    promtool("check", "config", tmp_path / "prometheus.yml")
    assert job["scheme"] == "https"
    assert job["authorization"]["credentials_file"] == \
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert job["tls_config"] == {"insecure_skip_verify": True}


@pytest.mark.plane
def test_prometheus_scraping_the_controller_answers_every_dashboard_query_with_data(
    prometheus_binaries: None, api_client: client.ApiClient, namespace: str,
    gpu_nodes: Callable[..., dict[str, Any]], controller_process: Callable[..., Any], tmp_path: Path,
) -> None:
    from tests.test_e2e import Cluster

    cluster = Cluster(api_client, namespace)
    prometheus: Prometheus | None = None
    try:
        gpu_nodes("mon", gpus=4, labels=cluster.label)
        cls = cluster.gpu_class("a100")
        kube.request(api_client, "POST", f"{CLAIMS}/namespaces/{namespace}/{api.BUDGET_PLURAL}", body={
            "apiVersion": api.API_VERSION, "kind": "GPUBudget", "metadata": {"name": "quota"},
            "spec": {"limits": [{"className": cls, "gpus": 16}]}})
        # Prometheus scrapes as deploy/monitoring/scrape-config.yml says, with
        # a service account's token bound to deploy/'s reader role; the
        # controller serves its metrics secure, as the Deployment does.
        token = metrics_reader_token(api_client, namespace)
        controller = controller_process(token)
        target = f"127.0.0.1:{controller.metrics_port}"
        prometheus = Prometheus(tmp_path, [target], token).start()
        prom = prometheus

        def leader() -> bool:
            assert controller.alive(), f"the controller exited:\n{controller.log_tail()}"
            return prom.value('max(leader_election_master_status{job="gpuclaimctl"})') == 1

        wait_for(leader, timeout=30, interval=0.2,
                 message=lambda: f"Prometheus to scrape a leading controller; its log:\n{controller.log_tail()}")

        # Two releases a scrape apart, so rates (and quantiles) have an
        # increase to show; and one pod that waits for Capacity.
        released = f'gpuclaimctl_pod_release_seconds_count{{job="gpuclaimctl", namespace="{namespace}"}}'
        cluster.pod("first", [{"name": "g", "className": cls, "count": 1}])
        cluster.pod("too-big", [{"name": "g", "className": cls, "count": 4}])  # the node's 4, 1 taken
        wait_for(lambda: prom.value(released) == 1, timeout=30, interval=0.2,
                 message="Prometheus to see the first release")
        cluster.pod("second", [{"name": "g", "className": cls, "count": 1}])
        wait_for(lambda: prom.value(released) == 2, timeout=30, interval=0.2,
                 message="Prometheus to see the second release")
        waiting = f'gpuclaimctl_pods_waiting{{namespace="{namespace}", reason="Capacity"}}'
        wait_for(lambda: prom.value(waiting) == 1, timeout=30, interval=0.2,
                 message="Prometheus to see the pod waiting for Capacity")
        time.sleep(2.5)  # two more scrapes, and the rules evaluated on them

        # The variables: each query lists what this test made.
        chosen = {"__rate_interval": "1m"}
        expect = {"job": "gpuclaimctl", "class": cls, "namespace": namespace}
        for var in variables():
            m = _LABEL_VALUES.match(var["definition"])
            assert m, f"variable {var['name']}: not label_values(selector, label): {var['definition']}"
            values = prom.label_values(substitute(m["selector"], chosen), m["label"])
            assert expect[var["name"]] in values, f"variable {var['name']} offers {values}"
            chosen[var["name"]] = expect[var["name"]]

        # Every query, with the values chosen and with All (.*) where a variable allows it.
        all_values = {**chosen, **{v["name"]: v["allValue"] for v in variables() if v.get("includeAll")}}
        empty = []
        for given in (chosen, all_values):
            for title, expr in panel_queries():
                query = substitute(expr, given)
                result = prom.query(query)
                finite = [s for s in result if math.isfinite(float(s["value"][1]))]
                if not finite:
                    empty.append(f"{title}: {query} -> {result}")
        assert not empty, "queries without data:\n" + "\n".join(empty)

        # The rules load and evaluate against the real series without error.
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert {r["name"] for r in rules} == set(alerts())
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
        # A leader is scraped, so the no-leader alert is quiet.
        assert next(r for r in rules if r["name"] == "GPUClaimCtlNoLeader")["state"] == "inactive"
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.cleanup()
        kube.request(api_client, "DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/"
                                           f"{READER_BINDING}-{namespace}")
