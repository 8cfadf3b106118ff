"""A graceful stop finishes the syncs in progress and starts no queued key
(issue 43, item 3): SIGTERM means "no new work", not "drain the queue".

The controller is the one `gpuclaimctl run` builds; only its sync is a
stand-in, slow until the test lets it finish, so the test decides which
keys are in progress when the stop comes.
"""

from __future__ import annotations

import threading

from kubernetes import client
from prometheus_client import CollectorRegistry

from gpuclaimctl.cmd import app
from gpuclaimctl.cmd.options import Options
from gpuclaimctl.controller import Controller
from tests.helpers import wait_for

WORKERS = 2
QUEUED = 20


class SlowSyncs:
    """Each sync records its key, then waits until `finish` is set."""

    def __init__(self) -> None:
        self.finish = threading.Event()
        self.started: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, key: str) -> None:
        with self._lock:
            self.started.append(key)
        self.finish.wait(10)

    def count(self) -> int:
        with self._lock:
            return len(self.started)


def controller_with(sync: SlowSyncs) -> Controller:
    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))  # never asked
    _factory, controller = app.build(api_client, Options(shutdown_timeout=10.0), CollectorRegistry())
    controller.sync = sync  # type: ignore[method-assign]
    return controller


def test_a_stopped_controller_finishes_the_syncs_in_progress_and_starts_no_queued_key() -> None:
    syncs = SlowSyncs()
    controller = controller_with(syncs)
    keys = [f"claim:ns/c{i:02d}" for i in range(QUEUED)]
    controller.queue.add_all(keys)
    stop = threading.Event()
    finished: list[bool] = []
    running = threading.Thread(target=lambda: finished.append(controller.run(WORKERS, stop)),
                               daemon=True)
    running.start()
    wait_for(lambda: syncs.count() == WORKERS, timeout=10, message="a sync in progress on every worker")

    stop.set()  # what SIGTERM does
    wait_for(controller.queue.shutting_down, timeout=10, message="the controller to stop")
    syncs.finish.set()
    running.join(10)

    assert not running.is_alive() and finished == [True], "the syncs in progress finished"
    assert syncs.count() == WORKERS, (
        f"{syncs.count()} of {QUEUED} keys synced after the stop; only the {WORKERS} in progress may be")


def test_abandon_also_starts_no_queued_key() -> None:
    # The same flag serves the lost Lease (DESIGN I3), where the queue is dropped too.
    syncs = SlowSyncs()
    controller = controller_with(syncs)
    controller.queue.add_all(f"claim:ns/c{i:02d}" for i in range(QUEUED))
    stop = threading.Event()
    running = threading.Thread(target=controller.run, args=(WORKERS, stop), daemon=True)
    running.start()
    wait_for(lambda: syncs.count() == WORKERS, timeout=10, message="a sync in progress on every worker")

    controller.abandon()
    syncs.finish.set()
    controller.join_workers()
    stop.set()
    running.join(10)

    assert syncs.count() == WORKERS
