"""The local control plane: built from Go modules, started on loopback.

Used by the test suite and by `gpuclaimctl run --local`.
"""

from gpuclaimctl.controlplane.build import BuildError, ensure_binaries
from gpuclaimctl.controlplane.plane import (
    APISERVER,
    CONTROLLER_MANAGER,
    KWOK,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    SCHEDULER,
    ControlPlane,
    ControlPlaneError,
)

__all__ = [
    "APISERVER",
    "BuildError",
    "CONTROLLER_MANAGER",
    "ControlPlane",
    "ControlPlaneError",
    "KWOK",
    "KWOK_NODE_ANNOTATION",
    "KWOK_NODE_ANNOTATION_VALUE",
    "SCHEDULER",
    "ensure_binaries",
]
