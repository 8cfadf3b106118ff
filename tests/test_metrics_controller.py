"""The controller's own metrics: bounded namespace labels, the waiting-pod
gauges, the budget gauges, and on the real controller."""

from __future__ import annotations

import dataclasses
import logging
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable, cast

import pytest
from prometheus_client import CollectorRegistry

from gpuclaimctl.cmd.options import Options
from gpuclaimctl.controller import Controller
from gpuclaimctl.model.podclaims import EntrySource
from metrics.controller import (
    CLAIM_SOURCES,
    OTHER_NAMESPACE,
    ControllerMetrics,
    NamespaceLabels,
    PodWait,
    StateSample,
)
from tests.sim.fakeapi import TEMPLATES
from tests.sim.harness import NS
from tests.test_budgets import BudgetStory
from tests.helpers import wait_for
from tests.test_options_cli import captured, invoke  # noqa: F401  (captured is a fixture)
from tests.test_sync_scenarios import Story


def test_the_first_namespaces_keep_their_label_and_later_ones_are_other() -> None:
    labels = NamespaceLabels(2)
    assert [labels.label(ns) for ns in ("a", "b", "c", "a", "d", "b")] == \
        ["a", "b", OTHER_NAMESPACE, "a", OTHER_NAMESPACE, "b"]


def test_a_limit_of_zero_folds_every_namespace() -> None:
    labels = NamespaceLabels(0)
    assert {labels.label(ns) for ns in ("a", "b")} == {OTHER_NAMESPACE}


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        NamespaceLabels(-1)


def test_namespaces_asked_at_once_never_pass_the_limit() -> None:
    labels = NamespaceLabels(10)
    seen: list[str] = []
    lock = threading.Lock()

    def ask(start: int) -> None:
        got = [labels.label(f"ns-{i}") for i in range(start, start + 50)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=ask, args=(i * 7,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen) - {OTHER_NAMESPACE}) == 10


def test_release_seconds_are_observed_per_namespace_and_folded_past_the_limit() -> None:
    registry = CollectorRegistry()
    m = ControllerMetrics(registry, max_namespaces=1)
    m.observe_release("team-a", 2.0)
    m.observe_release("team-b", 3.0)
    m.observe_release("team-c", 4.0)
    m.observe_release("team-a", 1.0)

    def count(ns: str) -> float | None:
        return registry.get_sample_value("gpuclaimctl_pod_release_seconds_count", {"namespace": ns})

    assert count("team-a") == 2
    assert count(OTHER_NAMESPACE) == 2
    assert count("team-b") is None
    assert registry.get_sample_value("gpuclaimctl_pod_release_seconds_sum",
                                     {"namespace": OTHER_NAMESPACE}) == 7.0


def test_waiting_pods_are_counted_by_namespace_and_reason_with_the_longest_wait() -> None:
    registry = CollectorRegistry()
    m = ControllerMetrics(registry, max_namespaces=2)
    waits = [PodWait("ml", "Capacity", 30.0), PodWait("ml", "Capacity", 90.0),
             PodWait("ml", "ClassNotFound", 5.0), PodWait("web", "Capacity", 1.0),
             PodWait("late-1", "Capacity", 400.0), PodWait("late-2", "Capacity", 7.0)]
    m.set_waiting(lambda: waits)

    def value(name: str, ns: str, reason: str) -> float | None:
        return registry.get_sample_value(name, {"namespace": ns, "reason": reason})

    assert value("gpuclaimctl_pods_waiting", "ml", "Capacity") == 2
    assert value("gpuclaimctl_pods_waiting_longest_seconds", "ml", "Capacity") == 90.0
    assert value("gpuclaimctl_pods_waiting", "ml", "ClassNotFound") == 1
    assert value("gpuclaimctl_pods_waiting", "web", "Capacity") == 1
    assert value("gpuclaimctl_pods_waiting", OTHER_NAMESPACE, "Capacity") == 2
    assert value("gpuclaimctl_pods_waiting_longest_seconds", OTHER_NAMESPACE, "Capacity") == 400.0
    # Computed at each scrape: a pod released is gone from the next one.
    waits.clear()
    assert value("gpuclaimctl_pods_waiting", "ml", "Capacity") is None


def test_a_namespace_admitted_by_the_waiting_gauge_keeps_its_label_for_releases() -> None:
    registry = CollectorRegistry()
    m = ControllerMetrics(registry, max_namespaces=1)
    m.set_waiting(lambda: [PodWait("first", "Capacity", 1.0)])
    registry.get_sample_value("gpuclaimctl_pods_waiting", {"namespace": "first", "reason": "Capacity"})
    m.observe_release("second", 1.0)
    m.observe_release("first", 1.0)
    assert registry.get_sample_value("gpuclaimctl_pod_release_seconds_count",
                                     {"namespace": "first"}) == 1
    assert registry.get_sample_value("gpuclaimctl_pod_release_seconds_count",
                                     {"namespace": OTHER_NAMESPACE}) == 1


def test_claims_created_are_counted_by_source_and_the_old_name_keeps_the_total() -> None:
    registry = CollectorRegistry()
    m = ControllerMetrics(registry)

    def created(source: str) -> float | None:
        return registry.get_sample_value("gpuclaimctl_claims_created_total", {"source": source})

    assert (created("template"), created("inline")) == (0, 0), "both series exist before the first claim"
    m.claim_created("inline")
    m.claim_created("inline")
    m.claim_created("template")
    assert (created("template"), created("inline")) == (1, 2)
    # The deprecated name, for dashboards built on it: every claim, as before.
    assert registry.get_sample_value("gpuclaimctl_template_claims_created_total") == 3
    # The sources are the entries that make a claim (a `claim:` entry names one).
    assert set(CLAIM_SOURCES) == {s.value for s in EntrySource} - {EntrySource.CLAIM.value}


def test_a_claim_made_from_an_inline_entry_is_counted_and_logged_as_inline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 45: every claim made for a pod was counted and logged as a
    template claim, the inline ones too."""
    s = Story(nodes=(8,))
    s.fake.create(TEMPLATES, {"metadata": {"name": "pair", "namespace": NS},
                              "spec": {"spec": {"className": "alpha", "count": 2}}})
    registry = CollectorRegistry()
    s.ctl.ctx = dataclasses.replace(s.ctl.ctx, metrics=ControllerMetrics(registry))
    s.pod("p", [{"name": "two", "template": "pair"}, {"name": "one", "className": "alpha", "count": 1}])
    s.see_all()
    with caplog.at_level(logging.DEBUG, logger="gpuclaimctl.sync.pods"):
        s.sync(f"pod:{NS}/p")
    assert not s.gated("p")
    assert registry.get_sample_value("gpuclaimctl_claims_created_total", {"source": "template"}) == 1
    assert registry.get_sample_value("gpuclaimctl_claims_created_total", {"source": "inline"}) == 1
    made = {r.__dict__["claim"]: r for r in caplog.records if "created" in r.getMessage()}
    assert set(made) == {"p-two", "p-one"}
    assert {claim: r.__dict__.get("source") for claim, r in made.items()} == {"p-two": "template",
                                                                             "p-one": "inline"}
    assert "template" not in made["p-one"].getMessage()


def test_budget_gauges_show_each_limit_and_its_use_and_fold_namespaces_past_the_limit() -> None:
    registry = CollectorRegistry()
    figures = {("team-a", "quota", "a100", "limit"): 16, ("team-a", "quota", "a100", "used"): 12,
               ("team-a", "quota", "*", "limit"): 20, ("team-a", "quota", "*", "used"): 14,
               ("team-b", "quota", "h100", "limit"): 4, ("team-b", "quota", "h100", "used"): 1,
               ("team-c", "quota", "h100", "limit"): 2, ("team-c", "quota", "h100", "used"): 2}
    ControllerMetrics(registry, state=lambda: StateSample(budgets=figures), max_namespaces=1)

    def value(ns: str, cls: str, kind: str) -> float | None:
        return registry.get_sample_value("gpuclaimctl_budget_gpus", {
            "namespace": ns, "budget": "quota", "class": cls, "kind": kind})

    assert (value("team-a", "a100", "limit"), value("team-a", "a100", "used")) == (16, 12)
    assert (value("team-a", "*", "limit"), value("team-a", "*", "used")) == (20, 14)
    # Past --metrics-max-namespaces, budgets of one name and class add up under `other`.
    assert (value(OTHER_NAMESPACE, "h100", "limit"), value(OTHER_NAMESPACE, "h100", "used")) == (6, 3)
    assert value("team-b", "h100", "limit") is None
    # Computed at each scrape: a budget deleted is gone from the next one.
    figures.clear()
    assert value("team-a", "a100", "limit") is None


def test_the_controller_counts_a_placement_in_flight_as_used_by_its_budget() -> None:
    """The gauge's `used` is the figure the placement checks: held, plus
    placed and not yet seen back (here: sampled while the bind is written)."""
    s = BudgetStory()
    s.budget({"alpha": 4, "*": 6})

    def sample() -> StateSample:
        return Controller.state_sample(cast(Controller, SimpleNamespace(ctx=s.ctl.ctx)))

    before = sample().budgets
    assert before == {(NS, "team-a", "alpha", "limit"): 4, (NS, "team-a", "alpha", "used"): 0,
                      (NS, "team-a", "*", "limit"): 6, (NS, "team-a", "*", "used"): 0}
    during: list[StateSample] = []
    s.at_write("update_claim_status", lambda: during.append(sample()))
    s.place("p1", [{"name": "g", "className": "alpha", "count": 3}])
    assert not s.gated("p1") and len(during) == 1
    assert during[0].budgets[(NS, "team-a", "alpha", "used")] == 3, "in flight counts"
    after = sample().budgets
    assert after[(NS, "team-a", "alpha", "used")] == after[(NS, "team-a", "*", "used")] == 3
    s.budget(None)
    assert sample().budgets == {}


def test_metrics_max_namespaces_is_a_flag_and_a_variable(captured: list[Options]) -> None:
    assert invoke("run").exit_code == 0
    assert invoke("run", "--metrics-max-namespaces", "5").exit_code == 0
    assert invoke("run", env={"GPUCLAIMCTL_METRICS_MAX_NAMESPACES": "0"}).exit_code == 0
    assert [o.metrics_max_namespaces for o in captured] == [100, 5, 0]


def test_a_negative_metrics_max_namespaces_is_refused(captured: list[Options]) -> None:
    result = invoke("run", "--metrics-max-namespaces", "-1")
    assert result.exit_code == 2 and captured == []
    assert "--metrics-max-namespaces must not be negative" in result.output


@pytest.mark.plane
def test_the_controller_gauges_a_waiting_pod_by_reason_and_times_a_release_in_its_namespace(
    api_client: Any, namespace: str, gpu_nodes: Callable[..., dict[str, Any]],
    run_controller: Callable[..., Any],
) -> None:
    from tests.test_e2e import Cluster

    cluster = Cluster(api_client, namespace)
    try:
        gpu_nodes("one", gpus=2, labels=cluster.label)
        cls = cluster.gpu_class("a100")
        rc = run_controller()
        cluster.pod("fits", [{"name": "g", "className": cls, "count": 1}])
        wait_for(lambda: rc.metric("gpuclaimctl_pod_release_seconds_count", namespace=namespace) == 1,
                 timeout=30, message="the pod that fits released first")
        # 2 on the node of 2, 1 taken: Capacity (4 would be Unsatisfiable).
        cluster.pod("too-big", [{"name": "g", "className": cls, "count": 2}])
        cluster.pod("no-class", [{"name": "g", "className": f"{cls}-missing", "count": 1}])
        # No claim to carry a Waiting condition: counted by what it was told, not as Pending.
        cluster.pod("no-claim", [{"name": "g", "claim": "nosuchclaim"}])

        def waiting(reason: str) -> float:
            return float(rc.metric("gpuclaimctl_pods_waiting", namespace=namespace, reason=reason))

        wait_for(lambda: waiting("Capacity") == 1 and waiting("ClassNotFound") == 1
                 and waiting("ClaimMissing") == 1, timeout=30,
                 message=lambda: f"one pod waiting for Capacity, one for ClassNotFound, one for "
                                 f"ClaimMissing; {waiting('Capacity')}, {waiting('ClassNotFound')}, "
                                 f"{waiting('ClaimMissing')}")
        assert waiting("Pending") == 0
        assert rc.metric("gpuclaimctl_pods_waiting_longest_seconds", namespace=namespace,
                         reason="Capacity") >= 0
        wait_for(lambda: rc.metric("gpuclaimctl_pod_release_seconds_count", namespace=namespace) == 1,
                 timeout=30, message=f"one release observed in namespace {namespace}")
    finally:
        cluster.cleanup()


def test_a_standby_exports_no_waiting_pods() -> None:
    """What the leader told a pod is in its memory alone: a standby would
    say Pending ("not processed") of it, and the alert on Pending would fire."""
    from gpuclaimctl.client.fence import WriteFence
    from gpuclaimctl.cmd.app import pod_waits

    class NotRead:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a standby read the controller's {name}")

    assert pod_waits(NotRead(), WriteFence(lease_required=True)) == []  # type: ignore[arg-type]
    closed = WriteFence()
    closed.close()
    assert pod_waits(NotRead(), closed) == []  # type: ignore[arg-type]


def test_a_pod_released_before_the_watch_shows_it_is_not_gauged_waiting() -> None:
    """The pod cache lags the release by up to the watch batch window; the
    gauge must not count the released pod as Pending meanwhile (the alert
    on Pending asks whether the controller runs at all)."""
    from gpuclaimctl.cmd.app import pod_waits

    s = BudgetStory()
    s.pod("p1", [{"name": "g", "className": "alpha", "count": 1}])
    s.see_all()
    controller = cast(Controller, SimpleNamespace(ctx=s.ctl.ctx))
    controller.gated_pods = partial(Controller.gated_pods, controller)  # type: ignore[method-assign]
    assert [w.reason for w in pod_waits(controller)] == ["Pending"]
    s.sync("pod:team/p1")  # released; no pod event delivered yet
    assert not s.gated("p1")
    assert pod_waits(controller) == []
