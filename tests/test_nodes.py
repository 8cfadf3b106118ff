"""Node readiness: one reading of the `Ready` condition for every caller."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from gpuclaimctl.model.nodes import node_ready, not_ready_since

CHANGED = "2025-01-02T03:04:05Z"


def node(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "status": {"conditions": list(conditions)}}


def ready(status: str, **extra: Any) -> dict[str, Any]:
    return {"type": "Ready", "status": status, **extra}


@pytest.mark.parametrize("obj, is_ready, since", [
    pytest.param(node(ready("True", lastTransitionTime=CHANGED)), True, None, id="ready"),
    pytest.param(node(ready("False", lastTransitionTime=CHANGED)), False,
                 datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc), id="not-ready-since-its-change"),
    pytest.param(node(ready("Unknown", lastTransitionTime=CHANGED)), False,
                 datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc), id="unknown-is-not-ready"),
    pytest.param(node(ready("False")), False, None, id="not-ready-without-a-time"),
    pytest.param(node({"type": "MemoryPressure", "status": "True"}), False, None, id="no-ready-condition"),
    pytest.param({"metadata": {"name": "n1"}}, False, None, id="no-status"),
    pytest.param(None, False, None, id="missing-node"),
])
def test_a_node_is_ready_only_when_its_ready_condition_says_true(
        obj: dict[str, Any] | None, is_ready: bool, since: datetime | None) -> None:
    assert node_ready(obj) is is_ready
    assert not_ready_since(obj) == since
