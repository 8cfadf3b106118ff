"""Names and types of the gpuclaimctl.io API (DESIGN.md §2, §3).

Every string the controller shares with the API server, with users or with
deploy/ lives here once, so a typo is an import error rather than a silent
second name.

This module imports nothing but the standard library and does nothing at
import time.
"""

from __future__ import annotations

from enum import StrEnum

GROUP = "gpuclaimctl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

CLASS_KIND = "GPUClass"
CLAIM_KIND = "GPUClaim"
TEMPLATE_KIND = "GPUClaimTemplate"
BUDGET_KIND = "GPUBudget"
CLASS_PLURAL = "gpuclasses"
CLAIM_PLURAL = "gpuclaims"
BUDGET_PLURAL = "gpubudgets"
TEMPLATE_PLURAL = "gpuclaimtemplates"

# The pod opts in with this scheduling gate and names its claims in the
# annotation of the same name.
SCHEDULING_GATE = f"{GROUP}/claims"
CLAIMS_ANNOTATION = f"{GROUP}/claims"

# A claim created for a pod's `template` or inline entry carries this label
# (value TEMPLATE_CLAIM_LABEL_VALUE) and the entry's name in the annotation,
# as upstream's resourceclaim controller records
# `resource.kubernetes.io/pod-claim-name`.
TEMPLATE_CLAIM_LABEL = f"{GROUP}/template-claim"
TEMPLATE_CLAIM_LABEL_VALUE = "true"
POD_CLAIM_NAME_ANNOTATION = f"{GROUP}/pod-claim-name"

# A namespace labelled with this (value: a GPUClass name) opts in as a
# whole: the admission webhook gives each pod there that requests the
# class's resource without claims an inline claim and the gate.
DEFAULT_CLASS_LABEL = f"{GROUP}/default-class"

# Set on a pod in the update that releases it: the node we pinned it to.
# Marks the pod as ours when the scheduler later refuses it.
PLACED_NODE_ANNOTATION = f"{GROUP}/node"
# A gang: pods placed all at once or none (model.gangs, decide.gang).
GANG_ANNOTATION = f"{GROUP}/gang"
GANG_SIZE_ANNOTATION = f"{GROUP}/gang-size"

# A pod in one of these phases is done: it holds no GPUs and never runs again.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

# Removed only when nothing reserves the claim.
CLAIM_FINALIZER = f"{GROUP}/claim"

# GPUClass.spec.resourceName when unset (the CRD default too).
DEFAULT_RESOURCE_NAME = "nvidia.com/gpu"

# What a claim that holds GPUs is counted under while nothing tells which
# resource it holds: bound by a version that did not record
# `status.resourceName`, its class gone, and no pod of it requesting one
# resource. Never a real resource name (those have a domain and a slash);
# its node takes no new placement of any resource meanwhile
# (decide.capacity.with_unknown).
UNKNOWN_RESOURCE = "?"

# The claim condition that is True, with a WaitReason, while the set waits.
CONDITION_WAITING = "Waiting"
# True on a claim that holds GPUs without a recorded resource while nothing
# tells which (UNKNOWN_RESOURCE): its node takes nothing new until it goes.
CONDITION_RESOURCE_UNKNOWN = "ResourceUnknown"

# The only field a node selector requirement can match (matchFields).
NODE_NAME_FIELD = "metadata.name"


class Phase(StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


class WaitReason(StrEnum):
    """Why a set waits: the reason of the claims' Waiting condition and of
    the pod's Warning event (DESIGN.md §4)."""

    CAPACITY = "Capacity"
    # No node the set may use (offering its classes, admitting the pod) has
    # that many GPUs allocatable at all, or a class has no node: waiting
    # frees nothing; only a bigger node (or a smaller set) can help.
    UNSATISFIABLE = "Unsatisfiable"
    CLASS_NOT_FOUND = "ClassNotFound"
    CLASS_DELETING = "ClassDeleting"
    CLAIM_MISSING = "ClaimMissing"
    CLAIM_IN_USE = "ClaimInUse"
    NAME_TAKEN = "NameTaken"
    NODE_AFFINITY = "NodeAffinity"
    NODE_REJECTED = "NodeRejected"
    CORDONED = "Cordoned"
    INVALID_CLAIMS = "InvalidClaims"
    BUDGET = "Budget"
    BUDGETS_UNKNOWN = "BudgetsUnknown"
    # Gangs (decide.gang): fewer members than its size exist or are gated;
    # its members' sets do not all fit at once; its annotations are wrong
    # or its members disagree on them.
    GANG_INCOMPLETE = "GangIncomplete"
    GANG_CAPACITY = "GangCapacity"
    GANG_INVALID = "GangInvalid"
    # Pods of lower priority are being evicted for it; the GPUs they free
    # are held for it (decide.preempt).
    PREEMPTING = "Preempting"


class OnCordon(StrEnum):
    MOVE = "Move"
    STAY = "Stay"


class ReclaimPolicy(StrEnum):
    RELEASE = "Release"
    RETAIN = "Retain"


class Strategy(StrEnum):
    """How placement chooses among nodes that fit a set."""

    BINPACK = "binpack"
    SPREAD = "spread"
