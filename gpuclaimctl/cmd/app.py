"""`gpuclaimctl run`: the process around the controller.

Order of start: logging; the local control plane when asked; the API
client; the server's version, judged in one line (client.serverversion:
the informers' initial sync by WatchList or by lists; no start where the
server is too old to hold pods for their claims); metrics registry;
informers (started at once, so a standby's caches are warm when it takes
over); /metrics, /healthz, /readyz; then either the
workers directly or, with --leader-elect, only while holding the Lease.

Shutdown on SIGTERM/SIGINT: no new work (queued keys are dropped, not
started: Controller.shutdown), in-flight syncs get --shutdown-timeout to
finish, queued events get EVENT_FLUSH_TIMEOUT to be sent (while the Lease
is still held), the Lease is released, exit 0.

A lost Lease (DESIGN I3) is kube-controller-manager's Fatalf: the write
fence is closed (it already refuses every write once the Lease went
unrenewed for the renew deadline), queued keys are dropped, not drained,
one error line is logged and the process exits 1 at once, without waiting
for its workers and without releasing the Lease.

Every request carries a User-Agent naming this process
(`gpuclaimctl/<version> <identity>`), so an audit log tells replicas apart;
what every replica sends whether it leads or not ends in a word of its own
(` leader-election`, ` webhook`, ` metrics-auth`; kube.client_for).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Callable, NoReturn

from kubernetes import client
from prometheus_client import CollectorRegistry, disable_created_metrics

from gpuclaimctl import __version__
from gpuclaimctl.client import discovery, kube, serverversion
from gpuclaimctl.client.events import BATCH_WINDOW as EVENT_BATCH_WINDOW
from gpuclaimctl.client.events import EventRecorder
from gpuclaimctl.client.fence import NotLeader, WriteFence
from gpuclaimctl.client.metricsauth import ApiServerAuth
from gpuclaimctl.client.writer import Writer
from gpuclaimctl import logs
from gpuclaimctl.controller import Controller, Settings
from gpuclaimctl.model.podcache import prune_pod
from gpuclaimctl.cmd.endpoints import Check, EndpointServer, self_signed_tls
from gpuclaimctl.client.leaderelection import (
    ElectionOutcome,
    LeaderElectionConfig,
    LeaderElector,
    default_identity,
)
from gpuclaimctl.cmd import startwait
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.cmd.statusview import waiting_pods
from gpuclaimctl.cmd.webhook import build_webhook
from informers import POD_GROUPS, PODS, ApiStatusError, SharedInformerFactory
from informers.reflector import storage_initializing
from metrics.controller import ControllerMetrics, EventMetrics, PodWait
from metrics.leaderelection import LeaderElectionMetrics
from metrics.workqueue import PrometheusWorkqueueMetricsProvider

log = logging.getLogger("gpuclaimctl")
SYNC_TIMEOUT = 120.0
# How long queued events may still be sent once the workers stopped: inside
# the Deployment's 30 s grace period after --shutdown-timeout's 20 s.
EVENT_FLUSH_TIMEOUT = 5.0


def run(options: Options) -> int:
    logs.setup_logging(options.log_format, options.verbosity)
    plane = None
    try:
        if options.local:
            from gpuclaimctl.cmd import localdemo

            # The options it returns name the controller's own kubeconfig
            # there, and put every endpoint and the webhook on loopback.
            plane, options = localdemo.start(options)
        identity = process_identity(options.leader_elect)
        api_client = _api_client(options, identity)
        server = serverversion.check(api_client)
        if not server.can_start:
            say_server_version(server)
            return 1
        return _serve(options, api_client, identity,
                      on_ready=plane.announce if plane is not None else None, server=server)
    except KeyboardInterrupt:
        return 0
    finally:
        if plane is not None:
            plane.stop()


def process_identity(leader_elect: bool) -> str:
    """The leader-election identity (`<hostname>_<uuid>`), else `<hostname>_<pid>`."""
    return default_identity() if leader_elect else f"{socket.gethostname()}_{os.getpid()}"


def say_server_version(server: serverversion.Behaviour) -> None:
    """The API server's version and what this process does about it
    (client.serverversion), said in one line: INFO on a supported minor,
    WARNING on any other it still starts against, ERROR where it will not.
    Said once the listeners are bound: a process that cannot bind says
    that one line alone (tests/test_bind_errors.py)."""
    level = (logging.ERROR if not server.can_start
             else logging.WARNING if server.warn else logging.INFO)
    log.log(level, "%s", server.message)


def user_agent(identity: str) -> str:
    return f"gpuclaimctl/{__version__} {identity}"


def _api_client(options: Options, identity: str) -> client.ApiClient:
    try:
        api_client = kube.load_client(options.kubeconfig, options.context)
    except kube.ConfigError as e:
        hint = "" if options.kubeconfig else ", or --local for a local control plane"
        raise SystemExit(f"gpuclaimctl: {e}{hint}") from None
    # Enough connections for every informer's watch plus the workers' writes.
    api_client.configuration.connection_pool_maxsize = max(16, options.workers * 2 + 8)
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = \
        api_client.configuration.connection_pool_maxsize
    # Informers, writes and (with " leader-election") the Lease all send it.
    api_client.user_agent = user_agent(identity)
    return api_client


def build_recorder(api_client: client.ApiClient, options: Options, registry: CollectorRegistry,
                   *, fence: WriteFence | None = None) -> EventRecorder:
    """The event recorder (not started): --event-qps/--event-burst, fenced
    like the Writer, its counts in `registry`."""
    return EventRecorder(api_client, fence=fence, qps=options.event_qps,
                         burst=options.event_burst, metrics=EventMetrics(registry),
                         batch_window=EVENT_BATCH_WINDOW)


def build(api_client: client.ApiClient, options: Options, registry: CollectorRegistry,
          *, fence: WriteFence | None = None,
          recorder: EventRecorder | None = None,
          use_watch_list: bool = True) -> tuple[SharedInformerFactory, Controller]:
    """Informers and the controller on them, with metrics in `registry`; the
    controller's requests wait for --kube-api-qps/--kube-api-burst tokens,
    and its writes are refused once `fence` says this process may no longer lead.
    Its events go to `recorder` (whose caller starts and stops it), or
    without one are sent from the sync like any write. `use_watch_list`:
    the caches' initial state by WatchList, else by lists (check_server_version)."""
    # Pods are cached as the controller reads them, no more (model.podcache).
    factory = SharedInformerFactory(api_client, default_resync_period=options.resync_period,
                                    transforms={PODS: prune_pod},
                                    watch_batch_window=options.watch_batch_window,
                                    use_watch_list=use_watch_list)
    settings = sync_settings(options)
    metrics = ControllerMetrics(registry, max_namespaces=options.metrics_max_namespaces)
    writer = Writer(api_client, fence=fence,
                    limiter=kube.TokenBucket(options.kube_api_qps, options.kube_api_burst),
                    recorder=recorder)
    controller = Controller(factory, writer, settings, metrics=metrics,
                            queue_metrics=PrometheusWorkqueueMetricsProvider(registry),
                            shutdown_timeout=options.shutdown_timeout,
                            podgroups_served=functools.partial(discovery.serves, api_client, POD_GROUPS))
    metrics.set_state(controller.state_sample)
    metrics.set_waiting(lambda: pod_waits(controller, fence))
    return factory, controller


def sync_settings(options: Options) -> Settings:
    """What the syncs read of the options (sync.context.Settings)."""
    return Settings(strategy=options.strategy, reject_for=options.reject_for,
                    node_lost_grace=options.node_lost_grace, preemption=options.preemption)


def pod_waits(controller: Controller, fence: WriteFence | None = None) -> list[PodWait]:
    """The gated pods in the controller's caches and why each waits, told
    as `gpuclaimctl status` tells them (statusview.waiting_pods). None from
    a standby: what the leader told a pod is in the leader's memory alone,
    and Pending ("not processed") would be said of every such pod."""
    try:
        if fence is not None:
            fence.check()
    except NotLeader:
        return []
    pods, claims = controller.gated_pods()
    now = controller.ctx.now()
    ctx = controller.ctx
    return [PodWait(p.namespace, p.reason, (now - p.created).total_seconds() if p.created else 0.0)
            for p in waiting_pods(pods, claims, ctx.memories.waiting_told.get, ctx.templates.get)]


def _serve(options: Options, api_client: client.ApiClient, identity: str,
           on_ready: Callable[[], None] | None = None,
           server: serverversion.Behaviour | None = None) -> int:
    # client-go exports no *_created series; neither do we.
    disable_created_metrics()
    registry = CollectorRegistry()
    # Never armed without leader election, so then it always allows; with
    # it, it refuses until the Lease is first acquired (a standby writes nothing).
    fence = WriteFence(lease_required=options.leader_elect)
    recorder = build_recorder(api_client, options, registry, fence=fence)
    factory, controller = build(api_client, options, registry, fence=fence, recorder=recorder,
                                use_watch_list=server.watch_list if server is not None else True)

    elector: LeaderElector | None = None
    leader_metrics = LeaderElectionMetrics(registry)
    if options.leader_elect:
        elector = LeaderElector.on_lease(
            LeaderElectionConfig(options.lease_name, options.lease_namespace,
                                 identity=identity,
                                 lease_duration=options.lease_duration,
                                 renew_deadline=options.renew_deadline,
                                 retry_period=options.retry_period),
            api_client, metrics=leader_metrics, fence=fence)

    def caches_synced() -> None:
        if not controller.has_synced():
            raise RuntimeError("caches not synced yet")

    # Every replica serves the admission webhook, the standby too.
    webhook = build_webhook(api_client, options, factory, registry)
    readyz = [Check("informer-sync", caches_synced)]
    if webhook is not None:
        readyz.append(Check("webhook", webhook.check))

    healthz: list[Check] = []
    if elector is not None:
        # kube-controller-manager's margin: unhealthy once the lease could
        # have expired 20 s ago without us noticing.
        le = elector
        healthz.append(Check("leaderElection", lambda: le.check(20.0)))
    metrics_tls, authorize = None, None
    if options.metrics_secure:
        metrics_tls = self_signed_tls(["localhost", "127.0.0.1", socket.gethostname()])
        authorize = ApiServerAuth(kube.client_for(api_client, "metrics-auth")).check
    endpoints = EndpointServer(registry=registry, metrics_address=options.metrics_bind_address,
                               health_address=options.health_bind_address,
                               healthz=healthz, readyz=readyz,
                               metrics_tls=metrics_tls, authorize=authorize)
    endpoints.start()
    if webhook is not None:
        try:
            webhook.start()
        except OSError:
            endpoints.stop()
            raise
    if server is not None:
        say_server_version(server)

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()
        if webhook is not None:
            webhook.begin_drain()
        if elector is not None:
            elector.cancel()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    recorder.start()
    if elector is not None:
        # A free Lease taken before the informers list saves the catch-up
        # list before the first decision (LeaderElector.try_first).
        elector.try_first()
    factory.start()
    # PodGroups' informer starts once the API server serves them (if ever).
    controller.start_podgroup_discovery(stop)
    if on_ready is not None:
        threading.Thread(target=_when_ready, args=(readyz, on_ready, stop), name="ready-hook",
                         daemon=True).start()
    try:
        if elector is None:
            # No Lease term lies between the writes of a process that died
            # and this one's first decision: wait them out before the
            # catch-up list, so that it shows every one that landed.
            if (not _wait_synced(controller, stop)
                    or not startwait.wait_out_earlier_writes(stop, options.kubeconfig)
                    or not _catch_up(controller, stop, time.monotonic())):
                return 0 if stop.is_set() else 1
            # The one writer leads while its workers run: the gauge says so,
            # or GPUClaimCtlNoLeader would page for a single replica run
            # with --no-leader-elect.
            leader_metrics.leader_on(options.lease_name)
            try:
                controller.run(options.workers, stop)
            finally:
                leader_metrics.leader_off(options.lease_name)
            recorder.flush(event_flush_budget(fence))
            return 0

        campaign = elector

        def lead(leading_stop: threading.Event) -> None:
            lead_workers(controller, recorder, fence, options.workers, leading_stop,
                         writes_landed_by=campaign.acquired_at)

        def stopped() -> None:
            log.info("stopped leading")

        outcome = elector.run(lead, stopped,
                              on_new_leader=lambda who: log.info("leader is %s", who))
        if outcome is ElectionOutcome.CANCELLED:
            return 0
        if outcome is ElectionOutcome.LOST:
            exit_lost(fence, controller)
        log.error("leader election ended: %s; exiting so a standby takes over", outcome.name)
        return 1
    finally:
        recorder.stop()
        if webhook is not None:
            webhook.stop()
        endpoints.stop()
        factory.shutdown()


def lead_workers(controller: Controller, recorder: EventRecorder, fence: WriteFence,
                 workers: int, stop: threading.Event, writes_landed_by: float | None = None) -> None:
    """on_started_leading: run the workers until `stop`, then flush events.

    `writes_landed_by`: when this process took the Lease (Controller.catch_up).

    Returns only once every worker has finished: the elector releases the
    Lease only if this returned in time, and a worker still in a sync after
    --shutdown-timeout may have a write on the wire that a successor's
    first list would not show. Such a worker keeps this waiting, so the
    elector gives up at the Lease's expiry and lets it run out instead.
    """
    log.info("became leader; starting %d workers", workers)
    if not _wait_synced(controller, stop):
        if stop.is_set():
            return
        # Returning would leave the elector renewing a Lease no worker
        # uses: the standby could never take over and /healthz would pass.
        # Raising makes the elector close the fence and release the Lease,
        # and the process exits 1, as it does without leader election.
        raise RuntimeError(f"caches did not sync in {SYNC_TIMEOUT:.0f}s; giving the Lease up")
    if not _catch_up(controller, stop, writes_landed_by):
        return  # stopped
    if not controller.run(workers, stop):
        log.error("workers still busy after --shutdown-timeout; the Lease will not be "
                  "released while they may write")
        controller.join_workers()
    # Before the elector closes the fence and releases the Lease; a
    # lost Lease has closed the fence already, so this sends nothing.
    recorder.flush(event_flush_budget(fence))


def event_flush_budget(fence: WriteFence) -> float:
    """How long queued events may be sent at shutdown: EVENT_FLUSH_TIMEOUT,
    cut so that the leader returns a second before its Lease could be taken
    over (the elector releases the Lease only if the leader returned by
    then); nothing once the fence refuses."""
    try:
        left = fence.check()
    except NotLeader:
        return 0.0
    return max(0.0, min(EVENT_FLUSH_TIMEOUT, left - 1.0))


def exit_lost(fence: WriteFence, controller: Controller,
              _exit: Callable[[int], object] = os._exit) -> NoReturn:
    """Leadership lost: nothing more leaves this process, and it ends now.

    No graceful stop: the workers are not waited for (the fence refuses
    what they still try), queued keys are dropped, and nothing that runs at
    interpreter exit (atexit, the informers' shutdown) gets a chance to run.
    """
    fence.close("leader election lost")
    try:
        controller.abandon()
    except Exception:  # exiting matters more; the fence is shut already
        log.exception("abandoning the queue failed")
    log.error("leader election ended: LOST; exiting so a standby takes over")
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(1)
    raise SystemExit(1)  # only reached when a test stands in for os._exit


# After /readyz first passes, how long the API server may take to see the
# webhook configurations' caBundle the certificate keeper wrote (its own
# informer of them; well under a second on the local plane).
_WEBHOOK_SETTLE = 1.0


def _when_ready(readyz: list[Check], on_ready: Callable[[], None], stop: threading.Event) -> None:
    """Call `on_ready` once every /readyz check passes (run --local: the
    lines to use the cluster are said only then)."""
    while not stop.is_set():
        try:
            for check in readyz:
                check.run()
        except Exception:
            stop.wait(0.1)
            continue
        if not stop.wait(_WEBHOOK_SETTLE):
            on_ready()
        return


def _catch_up(controller: Controller, stop: threading.Event, writes_landed_by: float | None) -> bool:
    """Controller.catch_up, retried each second until it works or `stop` is set."""
    while not stop.is_set():
        try:
            controller.catch_up(writes_landed_by)
            return True
        except Exception as e:  # the API server is away: nothing is decided meanwhile
            starting = isinstance(e, ApiStatusError) and storage_initializing(e)
            log.log(logging.INFO if starting else logging.WARNING,
                    "listing claims before the first decision failed, will retry: %s", e)
            stop.wait(1.0)
    return False


def _wait_synced(controller: Controller, stop: threading.Event) -> bool:
    waited = 0.0
    while not stop.is_set():
        if controller.has_synced():
            log.info("caches synced")
            return True
        stop.wait(0.1)
        waited += 0.1
        if waited > SYNC_TIMEOUT:
            log.error("caches did not sync in %.0fs; are the CRDs installed?", SYNC_TIMEOUT)
            return False
    return False

