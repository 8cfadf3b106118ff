"""A graceful stop with a deep queue still hands the Lease over at once
(issue 43, item 3), against the real plane.

Two `gpuclaimctl run --leader-elect` processes (tests.test_failover's), the
leader slowed to a few writes a second so that dozens of pods wait in its
queue when SIGTERM comes. Draining that queue would outlast the Lease: the
elector then lets it expire instead of releasing it, and the standby waits
out the whole term. Stopping only the syncs in progress releases it within
seconds.
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable

import pytest
from kubernetes import client

from tests.helpers import wait_for
from tests.test_e2e import Cluster
from tests.test_failover import (  # noqa: F401  (fixtures)
    SIGTERM_LEASE,
    SIGTERM_RENEW,
    ControllerProcess,
    cluster,
    controllers,
    gated_pod,
    lease_holder,
    pair,
)

# Two workers sharing two writes a second: a pod's sync (claim create, bind,
# release) takes a second or more, the queue drains at under one pod a second.
SLOW = ("--workers", "2", "--kube-api-qps", "2", "--kube-api-burst", "2")
PODS, NODES, GPUS = 30, 4, 8
# Queued at SIGTERM, at least: draining them (3 writes each at 2/s) takes
# over 20 s, past the 15 s lease.
DEEP = 15
# The syncs in progress finish (a few writes at 2/s), then the Lease is
# released and the standby takes it at its next retry (1 s). Half the lease:
# a handover this early cannot come from the lease's expiry.
HANDOVER = SIGTERM_LEASE / 2


@pytest.mark.plane
def test_sigterm_with_a_deep_queue_releases_the_lease_long_before_it_expires(
    controllers: Callable[..., ControllerProcess], cluster: Cluster,
    gpu_nodes: Callable[..., dict[str, Any]], namespace: str, api_client: client.ApiClient,
) -> None:
    for n in range(NODES):
        gpu_nodes(f"n{n}", gpus=GPUS, labels=cluster.label)
    cls = cluster.gpu_class("a100")
    leader, standby = pair(controllers, namespace, flags=SLOW, lease_duration=SIGTERM_LEASE,
                           renew_deadline=SIGTERM_RENEW)
    old_holder = lease_holder(api_client, namespace, leader.lease_name)
    for i in range(PODS):
        gated_pod(cluster, f"p{i:02d}", cls)

    def depth() -> float:
        return leader.metric("workqueue_depth", name="gpuclaimctl")

    wait_for(lambda: leader.placed() >= 1 and depth() >= DEEP, timeout=60,
             message=lambda: f"the leader placing with {DEEP} keys queued; placed {leader.placed()}, "
                             f"queued {depth()}; its log:\n{leader.log_tail()}")
    queued = depth()

    termed_at = time.monotonic()
    leader.signal(signal.SIGTERM)

    def handed_over() -> bool:
        return lease_holder(api_client, namespace, leader.lease_name) != old_holder

    wait_for(handed_over, timeout=SIGTERM_LEASE * 2, interval=0.02,
             message=lambda: f"the Lease released or taken over; leader log:\n{leader.log_tail()}")
    took = time.monotonic() - termed_at
    print(f"Lease handed over {took:.2f}s after SIGTERM with {queued:g} keys queued "
          f"(lease {SIGTERM_LEASE:g}s)")
    assert leader.wait(30) == 0, leader.log_tail()
    log = leader.log_tail(400)
    assert "released lease" in log and "not releasing the Lease" not in log, log
    assert took <= HANDOVER, (
        f"the Lease changed hands {took:.2f}s after SIGTERM ({queued:g} keys queued): "
        f"the leader kept it while draining its queue")
    wait_for(standby.leading, timeout=10, message=lambda: f"the standby to lead:\n{standby.log_tail()}")
