"""The `gpuclaimctl` command: run, status, why, simulate, snapshot, version.

Every `run` flag can also be set as GPUCLAIMCTL_<FLAG> (dashes become
underscores), as kube-controller-manager's flags can be set in a manifest.
Bad values are refused with one line, before anything starts; so is, as
the listener finds it, an address another process already listens on
(exit 2 both).
"""

from __future__ import annotations

# First: it takes the process's start time when imported (startwait.PROCESS_STARTED).
from gpuclaimctl.cmd import startwait  # noqa: F401

import re
import sys
from collections.abc import Sequence
from typing import Any

import click

from gpuclaimctl import __version__
from gpuclaimctl.logs import LogFormat
from gpuclaimctl.cmd.options import DEFAULT_WEBHOOK_CERT_DIR, Options
from gpuclaimctl.model.api import Strategy


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_DURATION_PART = re.compile(_NUMBER + r"(ms|s|m|h)")
_DURATION = re.compile(r"[-+]?(?:" + _NUMBER + r"(?:ms|s|m|h))+")


def _seconds(value: str) -> float:
    """`90`, `90s`, `10m`, `1h`, or Go-style `1m30s` → seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    text = value.strip()
    if _DURATION.fullmatch(text):
        sign = -1.0 if text.startswith("-") else 1.0
        return sign * sum(float(n) * units[u] for n, u in _DURATION_PART.findall(text))
    return float(text)


class Duration(click.ParamType[float]):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return _seconds(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a duration (examples: 30s, 10m, 1h)", param, ctx)


DURATION = Duration()


class _OneLineErrors(click.Group):
    """A refused flag is one line (`Error: ...`), not click's usage block."""

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None,
        complete_var: str | None = None, standalone_mode: bool = True, **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            return super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """gpuclaimctl places each pod's whole set of GPU claims on one node."""


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(f"gpuclaimctl {__version__}")


# GPUCLAIMCTL_<FLAG>, not click's default GPUCLAIMCTL_RUN_<FLAG>.
@main.command(context_settings={"auto_envvar_prefix": "GPUCLAIMCTL"})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file; else $KUBECONFIG, the in-cluster config, ~/.kube/config.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("--local", is_flag=True, default=False,
              help="Start a local control plane (built from Go modules) with sample GPU "
                   "nodes and run against it; its state is kept across runs in the cache.")
@click.option("--fresh", is_flag=True, default=False,
              help="With --local: wipe the local cluster's kept state first (`make run-clean`).")
@click.option("--local-webhook/--no-local-webhook", default=True, show_default=True,
              help="With --local: serve the admission webhook to the local API server "
                   "(on loopback, at --webhook-bind-address).")
@click.option("--workers", type=int, default=16, show_default=True,
              help="Concurrent sync workers.")
@click.option("--resync-period", type=DURATION, default="10m", show_default=True,
              help="Replay the caches to the handlers this often (0 disables).")
# 100ms: the first watch event after a quiet spell is read at once, and
# under load events gather into one read, for at most 100ms more before a
# busy controller sees an event. Against 20ms it cut the reflectors' CPU
# from 1.1 to 0.7 ms per placed pod, and the controller's from 2.6-2.8 to
# 2.3-2.4 ms (`make bench-controller`, alternating runs); a WatchList's
# initial events are read with 20ms at most (informers.api), as 100ms
# slowed a 10,000-pod sync by a fifth. The figures and their commands are
# in the README (the flag table and `make bench-watch`).
@click.option("--watch-batch-window", type=DURATION, default="100ms", show_default=True,
              help="Under load, how long a watch event may wait to be read together with the "
                   "ones after it, one wake-up for all (0 reads each as it comes; at most 1s).")
@click.option("--leader-elect/--no-leader-elect", default=False, show_default=True,
              help="Hold a coordination.k8s.io Lease before doing any work.")
@click.option("--leader-elect-lease-name", default="gpuclaimctl", show_default=True)
@click.option("--leader-elect-namespace", default="gpuclaimctl-system", show_default=True)
@click.option("--leader-elect-lease-duration", type=DURATION, default="15s", show_default=True)
@click.option("--leader-elect-renew-deadline", type=DURATION, default="10s", show_default=True)
@click.option("--leader-elect-retry-period", type=DURATION, default="2s", show_default=True)
@click.option("--metrics-bind-address", default=":8080", show_default=True,
              help="host:port for /metrics; 0 disables.")
# Off by default for a bare `run` (the Deployment and the chart turn it on):
# run by hand it is a developer's process, `--local` keeps it on loopback,
# and the tests, benchmarks and `make run` scrape it with plain HTTP.
@click.option("--metrics-secure/--no-metrics-secure", default=False, show_default=True,
              help="Serve /metrics over HTTPS (self-signed certificate) only to bearer tokens the "
                   "API server authenticates (TokenReview) and authorizes for get on the "
                   "non-resource URL /metrics (SubjectAccessReview); off: plain HTTP, no auth.")
@click.option("--metrics-max-namespaces", type=int, default=100, show_default=True,
              help="Namespaces that get a namespace label of their own in /metrics, the first "
                   "seen keeping theirs; later ones are counted as `other`.")
@click.option("--health-bind-address", default=":8081", show_default=True,
              help="host:port for /healthz and /readyz; 0 disables.")
@click.option("--kube-api-qps", type=float, default=200.0, show_default=True)
@click.option("--kube-api-burst", type=int, default=400, show_default=True)
@click.option("--event-qps", type=float, default=20.0, show_default=True,
              help="Events sent per second, apart from --kube-api-qps.")
@click.option("--event-burst", type=int, default=50, show_default=True,
              help="Events sent at once before --event-qps applies.")
@click.option("--placement-strategy", type=click.Choice([s.value for s in Strategy]),
              default=Strategy.BINPACK.value, show_default=True,
              help="binpack fills the most-allocated node; spread the least.")
@click.option("--reject-for", type=DURATION, default="10m", show_default=True,
              help="How long a node that refused a pinned pod is skipped for its set.")
@click.option("--node-lost-grace", type=DURATION, default="5m", show_default=True,
              help="How long a bound claim's node may be gone or NotReady before the claim is Lost.")
@click.option("--preemption/--no-preemption", default=True, show_default=True,
              help="Let a set (or gang) that fits nowhere evict pods of lower priority that gpuclaimctl "
                   "placed on one node, when that makes it fit (PodDisruptionBudgets honoured); off: it "
                   "waits.")
@click.option("--shutdown-timeout", type=DURATION, default="20s", show_default=True,
              help="How long in-flight syncs may take to finish on SIGTERM.")
@click.option("--log-format", type=click.Choice([f.value for f in LogFormat]),
              default=LogFormat.TEXT.value, show_default=True)
@click.option("-v", "--verbosity", type=int, default=0, show_default=True,
              help="Log verbosity: 0 info, 2 more, 4 debug.")
@click.option("--webhook-bind-address", default=":9443", show_default=True,
              help="host:port the admission webhook serves HTTPS on (every replica); 0 disables.")
@click.option("--webhook-cert-dir", default=DEFAULT_WEBHOOK_CERT_DIR, show_default=True,
              help="Where the webhook's tls.crt and tls.key are: written here when self-signed, "
                   "read from here (and reloaded on change) otherwise.")
@click.option("--webhook-self-signed/--no-webhook-self-signed", default=True, show_default=True,
              help="Keep a self-signed CA and serving certificate in a Secret and the CA in the "
                   "webhook configurations; off where cert-manager does both.")
@click.option("--webhook-service", default="gpuclaimctl-system/gpuclaimctl-webhook", show_default=True,
              help="NAMESPACE/NAME of the Service the API server calls the webhook through; the "
                   "certificate is made for it and kept in the Secret NAME-cert there.")
@click.option("--webhook-configuration", default="gpuclaimctl", show_default=True,
              help="Name of the Mutating- and ValidatingWebhookConfiguration whose caBundle is kept.")
@click.option("--webhook-host", "webhook_hosts", multiple=True,
              help="Another DNS name or IP the self-signed certificate is valid for (repeatable), "
                   "for a url: client config when running outside the cluster.")
def run(**flags: Any) -> None:
    """Run the controller."""
    options = Options(
        kubeconfig=flags["kubeconfig"],
        context=flags["context"],
        local=flags["local"],
        local_webhook=flags["local_webhook"],
        fresh=flags["fresh"],
        workers=flags["workers"],
        resync_period=flags["resync_period"],
        watch_batch_window=flags["watch_batch_window"],
        leader_elect=flags["leader_elect"],
        lease_name=flags["leader_elect_lease_name"],
        lease_namespace=flags["leader_elect_namespace"],
        lease_duration=flags["leader_elect_lease_duration"],
        renew_deadline=flags["leader_elect_renew_deadline"],
        retry_period=flags["leader_elect_retry_period"],
        metrics_bind_address=flags["metrics_bind_address"],
        metrics_max_namespaces=flags["metrics_max_namespaces"],
        metrics_secure=flags["metrics_secure"],
        health_bind_address=flags["health_bind_address"],
        kube_api_qps=flags["kube_api_qps"],
        kube_api_burst=flags["kube_api_burst"],
        event_qps=flags["event_qps"],
        event_burst=flags["event_burst"],
        strategy=Strategy(flags["placement_strategy"]),
        reject_for=flags["reject_for"],
        node_lost_grace=flags["node_lost_grace"],
        preemption=flags["preemption"],
        shutdown_timeout=flags["shutdown_timeout"],
        log_format=LogFormat(flags["log_format"]),
        verbosity=flags["verbosity"],
        webhook_bind_address=flags["webhook_bind_address"],
        webhook_cert_dir=flags["webhook_cert_dir"],
        webhook_self_signed=flags["webhook_self_signed"],
        webhook_service=flags["webhook_service"],
        webhook_configuration=flags["webhook_configuration"],
        webhook_hosts=tuple(flags["webhook_hosts"]),
    )
    try:
        options.validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    from gpuclaimctl.cmd import app
    from gpuclaimctl.cmd.bindaddress import BindError

    try:
        code = app.run(options)
    except BindError as e:  # a listener's address is taken: the flag is what to change
        raise click.UsageError(str(e)) from None
    sys.exit(code)


@main.command(context_settings={"auto_envvar_prefix": "GPUCLAIMCTL"})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--context", default=None)
def status(kubeconfig: str | None, context: str | None) -> None:
    """Show GPUs per node and class, claims by phase, budgets per namespace, and waiting pods."""
    from gpuclaimctl.cmd import statusview as status_mod

    sys.exit(status_mod.main(kubeconfig, context))


class _NodeSpec(click.ParamType[dict[str, Any]]):
    """--add-node NAME=RESOURCE:COUNT[,label=value...]"""

    name = "NAME=RESOURCE:COUNT[,label=value...]"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        from gpuclaimctl.cmd.snapshotfile import parse_node

        try:
            return parse_node(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


_STRATEGY = click.option(
    "--placement-strategy", type=click.Choice([s.value for s in Strategy]), default=Strategy.BINPACK.value,
    show_default=True, help="The controller's --placement-strategy (it cannot be read from the cluster).")
_OUTPUT = click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
_PREEMPTION = click.option(
    "--preemption/--no-preemption", default=True, show_default=True,
    help="The controller's --preemption (it cannot be read from the cluster): the preemption it would make "
         "for a set that waits for room is shown; nothing is evicted.")


@main.command(context_settings={"auto_envvar_prefix": "GPUCLAIMCTL"})
@click.argument("pod", metavar="NAMESPACE/POD")
@click.option("-n", "--namespace", default=None, help="The pod's namespace, for a POD given without one.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--context", default=None)
@_OUTPUT
@_STRATEGY
@_PREEMPTION
def why(pod: str, namespace: str | None, kubeconfig: str | None, context: str | None, output: str,
        placement_strategy: str, preemption: bool) -> None:
    """Why a pod waits for its GPU claims, node by node; or where it went and when."""
    from gpuclaimctl.cmd import why as why_mod

    ns, name = why_mod.target(pod, namespace)
    sys.exit(why_mod.main(ns, name, kubeconfig, context, output, Strategy(placement_strategy), preemption))


@main.command(context_settings={"auto_envvar_prefix": "GPUCLAIMCTL"})
@click.option("-f", "--filename", "files", required=True, multiple=True,
              help="A Pod, Deployment, ReplicaSet, StatefulSet, Job or CronJob (YAML or JSON, several "
                   "documents allowed; - for stdin; repeatable).")
@click.option("--replicas", type=click.IntRange(0, 10_000), default=None,
              help="Copies of each workload to place in turn; default: its own replicas (a Job's parallelism).")
@click.option("--snapshot", type=click.Path(dir_okay=False), default=None,
              help="Decide on a file from `gpuclaimctl snapshot` instead of the live cluster.")
@click.option("--add-node", "add_nodes", type=_NodeSpec(), multiple=True,
              help="Add a Ready node, e.g. big-0=nvidia.com/gpu:8,nvidia.com/gpu.product=H100 (repeatable).")
@click.option("--without-node", "without_nodes", multiple=True,
              help="Leave a node out, as if drained and removed (repeatable).")
@click.option("-n", "--namespace", default="default", show_default=True,
              help="Namespace of the documents that name none.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--context", default=None)
@_OUTPUT
@_STRATEGY
@_PREEMPTION
def simulate(files: tuple[str, ...], replicas: int | None, snapshot: str | None,
             add_nodes: tuple[dict[str, Any], ...], without_nodes: tuple[str, ...], namespace: str,
             kubeconfig: str | None, context: str | None, output: str, placement_strategy: str,
             preemption: bool) -> None:
    """Where the pods of a manifest would go, or why they would wait; writes nothing."""
    from gpuclaimctl.cmd import simulate as simulate_mod

    sys.exit(simulate_mod.main(
        files, replicas=replicas, snapshot=snapshot, add=add_nodes, without=without_nodes,
        namespace=namespace, kubeconfig=kubeconfig, context=context, output=output,
        strategy=Strategy(placement_strategy), preemption=preemption))


@main.command(context_settings={"auto_envvar_prefix": "GPUCLAIMCTL"})
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--context", default=None)
@click.option("-o", "--output", type=click.Choice(["json", "yaml"]), default="json", show_default=True)
def snapshot(kubeconfig: str | None, context: str | None, output: str) -> None:
    """Print what placement reads of the cluster, for `simulate --snapshot`."""
    from gpuclaimctl.cmd import snapshotfile

    sys.exit(snapshotfile.main(kubeconfig, context, output))
