"""podsync's pure parts: which in-flight GPUs a failed placement frees.

The rest of podsync runs against the real plane (tests/test_e2e.py and
friends). A write whose answer is lost after the API server applied it
cannot be made to happen on purpose there, so the decision it feeds is
tested here on its own.
"""

from __future__ import annotations

import pytest
import urllib3

from gpuclaimctl.client import kube
from gpuclaimctl.state.inflight import InFlightPlacements
from gpuclaimctl.decide.placement import Action, ClaimAction, Placed
from gpuclaimctl.sync.pods import free_unwritten, surely_not_written
from gpuclaimctl.client.writer import AlreadyExists, Conflict, NotFound

GPU = "nvidia.com/gpu"


def decision() -> Placed:
    return Placed("node-a", (
        ClaimAction("kept", "u-kept", Action.KEEP, "node-a", GPU, 1),
        ClaimAction("first", "u-first", Action.BIND, "node-a", GPU, 2),
        ClaimAction("second", "u-second", Action.BIND, "node-a", GPU, 4),
        ClaimAction("third", "u-third", Action.MOVE, "node-a", GPU, 1, from_node="node-b"),
    ), "placed")


def in_flight() -> InFlightPlacements:
    inflight = InFlightPlacements()
    for a in decision().new_gpus():
        inflight.add(a.uid, a.node, a.resource, a.count)
    return inflight


@pytest.mark.parametrize(
    "error, surely",
    [
        pytest.param(Conflict("claim"), True, id="409-conflict"),
        pytest.param(NotFound("claim"), True, id="404"),
        pytest.param(AlreadyExists("claim"), True, id="409-exists"),
        pytest.param(kube.ApiError(422, "Invalid", "bad"), True, id="422"),
        pytest.param(kube.ApiError(429, "TooManyRequests", "slow down"), True, id="429"),
        pytest.param(kube.ApiError(500, "InternalError", "etcd"), False, id="500"),
        pytest.param(kube.ApiError(504, "Timeout", "did not complete"), False, id="504"),
        pytest.param(urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), False, id="read-timeout"),
        pytest.param(urllib3.exceptions.ProtocolError("connection reset"), False, id="connection-reset"),
    ],
)
def test_only_a_refusal_proves_a_write_did_not_happen(error: Exception, surely: bool) -> None:
    assert surely_not_written(error) is surely


def test_a_refused_bind_frees_its_gpus_and_those_never_written() -> None:
    inflight = in_flight()
    free_unwritten(inflight, decision(), {"u-first"}, "u-second", Conflict("claim"))
    assert inflight.usage() == {GPU: {"node-a": 2}}, "only the written bind still counts"


def test_a_bind_whose_answer_was_lost_keeps_counting_its_gpus() -> None:
    # The API server may have applied it: until the informer says, count it.
    inflight = in_flight()
    free_unwritten(inflight, decision(), {"u-first"}, "u-second",
                   urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"))
    assert inflight.usage() == {GPU: {"node-a": 6}}
    assert inflight.get("u-third") is None, "never attempted: freed"


def test_a_failed_release_after_every_bind_frees_nothing() -> None:
    inflight = in_flight()
    free_unwritten(inflight, decision(), {"u-kept", "u-first", "u-second", "u-third"}, "",
                   kube.ApiError(409, "Conflict", "pod changed"))
    assert inflight.usage() == {GPU: {"node-a": 7}}
