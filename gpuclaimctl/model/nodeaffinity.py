"""Which nodes a pod may run on, and pinning a gated pod to one.

Mirrors the kube-scheduler filters a released pod must pass, so the
controller does not pin a pod where the scheduler will refuse it:
`nodeSelector`, required node affinity (k8s.io/component-helpers
`nodeaffinity`: terms ORed, requirements within a term ANDed, an empty term
or one that does not parse matches nothing) and NoSchedule/NoExecute taints
against tolerations (`v1helper.TolerationsTolerateTaint`), and the required
node affinity of the PersistentVolumes bound to the pod's
PersistentVolumeClaims (the VolumeBinding filter's `CheckNodeAffinity`).
Validation of the pod is the API server's job; here a malformed requirement
simply matches no node, as upstream's lazy-error selector does, and a
selector that is not even the API's shape (a PV written by hand, say)
matches no node rather than raising.

`pin_to_node` builds the node affinity a release writes (DESIGN.md §3).

Pure: no client, no clock, no globals. Inputs are raw API dicts (camelCase).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuclaimctl.model.api import NODE_NAME_FIELD

# Taints the node lifecycle controller sets to mirror a node's readiness and
# cordon. Placement checks Ready and spec.unschedulable itself (and keeps a
# cordoned node for an onCordon Stay set), so these would only double-count
# those checks and turn "not Ready" or "cordoned" into a misleading
# NodeAffinity. A lingering one on a node that is Ready again goes within
# seconds, and the scheduler retries the pinned pod when it does.
NODE_STATE_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)

# The effects that keep a new pod off a node; PreferNoSchedule only scores.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# strconv.ParseInt(s, 10, 64): optional sign, decimal digits, nothing else.
_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Taint:
        return cls(key=raw.get("key", ""), effect=raw.get("effect", ""), value=raw.get("value") or "")

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(
            key=raw.get("key") or "",
            operator=raw.get("operator") or "Equal",
            value=raw.get("value") or "",
            effect=raw.get("effect") or "",
        )

    def tolerates(self, taint: Taint) -> bool:
        """Toleration.ToleratesTaint: an empty effect matches every effect,
        an empty key every key (the API server allows that only with
        Exists); Equal compares values; any other operator tolerates
        nothing."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Equal", ""):
            return self.value == taint.value
        return False


def untolerated_taint(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, or None.
    NODE_STATE_TAINTS are left to placement's own checks."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.effect not in BLOCKING_EFFECTS or taint.key in NODE_STATE_TAINTS:
            continue
        if not any(t.tolerates(taint) for t in tols):
            return taint
    return None


def untolerated_node_state_taint(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint of NODE_STATE_TAINTS (not ready,
    unreachable, cordoned) no toleration tolerates, or None: the node's own
    state, not its fit, keeps the pod off for now."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and taint.key in NODE_STATE_TAINTS \
                and not any(t.tolerates(taint) for t in tols):
            return taint
    return None


@dataclass(frozen=True)
class Requirement:
    """One NodeSelectorRequirement; an invalid one (`valid_for_labels`,
    `valid_for_fields`) makes its term match nothing."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    @property
    def valid_for_labels(self) -> bool:
        op, n = self.operator, len(self.values)
        if op in ("In", "NotIn"):
            return n > 0
        if op in ("Exists", "DoesNotExist"):
            return n == 0
        if op in ("Gt", "Lt"):
            return n == 1 and _parse_int64(self.values[0]) is not None
        return False

    @property
    def valid_for_fields(self) -> bool:
        return self.operator in ("In", "NotIn") and len(self.values) == 1

    def matches_labels(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "In":
            return self.key in labels and labels[self.key] in self.values
        if op == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        # Gt/Lt: the label must exist and parse as an int64, or no match.
        have = _parse_int64(labels[self.key]) if self.key in labels else None
        want = _parse_int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want

    def matches_fields(self, node_name: str) -> bool:
        # The node's only selectable field is metadata.name; another key
        # reads as "" (fields.Set semantics), which the API server never
        # lets through anyway.
        actual = node_name if self.key == NODE_NAME_FIELD else ""
        if self.operator == "In":
            return actual == self.values[0]
        return actual != self.values[0]

    def __str__(self) -> str:
        if not self.values:
            return f"{self.key} {self.operator}"
        shown = ", ".join(self.values[:_SHOWN_VALUES])
        more = f" and {len(self.values) - _SHOWN_VALUES} more" if len(self.values) > _SHOWN_VALUES else ""
        return f"{self.key} {self.operator} [{shown}{more}]"


# Values of one requirement a message spells out: messages end up in events,
# whose note the API server caps at 1 kB.
_SHOWN_VALUES = 5


def _requirements(raw: Any) -> tuple[Requirement, ...] | None:
    """A term's matchExpressions or matchFields, or None if they are not the
    API's shape (a list of {key, operator, values: [str]})."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return None
    out = []
    for r in raw:
        if not isinstance(r, Mapping):
            return None
        key, op, values = r.get("key", ""), r.get("operator", ""), r.get("values") or []
        if not (isinstance(key, str) and isinstance(op, str) and isinstance(values, list)
                and all(isinstance(v, str) for v in values)):
            return None
        out.append(Requirement(key, op, tuple(values)))
    return tuple(out)


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions all hold; an
    empty one selects everything, as a PodDisruptionBudget's does); a
    malformed one selects nothing."""
    if not isinstance(selector, Mapping):
        return False
    match = selector.get("matchLabels") or {}
    if not isinstance(match, Mapping) or any(labels.get(k) != v for k, v in match.items()):
        return False
    reqs = _requirements(selector.get("matchExpressions"))
    return reqs is not None and all(r.operator in ("In", "NotIn", "Exists", "DoesNotExist")
                                    and r.valid_for_labels and r.matches_labels(labels) for r in reqs)


@dataclass(frozen=True)
class Term:
    """A NodeSelectorTerm: all its requirements must hold."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()
    # False for an empty term or one with a malformed requirement.
    usable: bool = True

    @classmethod
    def from_api(cls, raw: Any) -> Term:
        if not isinstance(raw, Mapping):
            return cls(usable=False)
        exprs = _requirements(raw.get("matchExpressions"))
        fields = _requirements(raw.get("matchFields"))
        if exprs is None or fields is None:
            return cls(usable=False)
        usable = bool(exprs or fields) and all(r.valid_for_labels for r in exprs) and all(
            r.valid_for_fields for r in fields
        )
        return cls(exprs, fields, usable)

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        if not self.usable:
            return False
        return all(r.matches_labels(labels) for r in self.match_expressions) and all(
            r.matches_fields(node_name) for r in self.match_fields
        )

    def __str__(self) -> str:
        reqs = self.match_expressions + self.match_fields
        return " and ".join(str(r) for r in reqs) if reqs else "(an empty term)"


@dataclass(frozen=True)
class NodeSelector:
    """requiredDuringSchedulingIgnoredDuringExecution: any term may match.
    No terms at all matches nothing (the API server refuses that shape)."""

    terms: tuple[Term, ...]

    @classmethod
    def from_api(cls, raw: Any) -> NodeSelector:
        terms = raw.get("nodeSelectorTerms") if isinstance(raw, Mapping) else None
        if not isinstance(terms, list):
            return cls(())
        return cls(tuple(Term.from_api(t) for t in terms))

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        return any(t.matches(node_name, labels) for t in self.terms)

    def __str__(self) -> str:
        """`zone In [a] and disk Exists, or host In [n3]`, for messages."""
        return ", or ".join(str(t) for t in self.terms) if self.terms else "(no terms)"


@dataclass(frozen=True)
class VolumeConstraint:
    """A PersistentVolume bound to one of the pod's PersistentVolumeClaims,
    whose required node affinity says which nodes can reach it (a local
    disk, a zonal volume). Built by `model.volumes.volume_constraints`."""

    volume: str  # the pod's volume
    claim: str  # the PersistentVolumeClaim, in the pod's namespace
    pv: str  # the PersistentVolume it is bound to
    selector: NodeSelector

    def reaches(self, labels: Mapping[str, str]) -> bool:
        # CheckNodeAffinity matches the PV's terms against a node made of the
        # labels alone: a matchFields metadata.name term sees "" there, so it
        # reaches no node (In) or every node (NotIn) for the scheduler too.
        return self.selector.matches("", labels)

    def __str__(self) -> str:
        return f"PersistentVolume {self.pv} (claim {self.claim})"

    def reach(self) -> str:
        """Which nodes reach it, for messages."""
        text = f"nodes matching {self.selector}"
        if any(t.match_fields for t in self.selector.terms):
            text += " (the scheduler checks a volume's matchFields against no node name; a label such as " \
                    "kubernetes.io/hostname selects a node)"
        return text


class Mismatch(StrEnum):
    """The first of the pod's rules a node fails, for waiting messages."""

    NODE_SELECTOR = "nodeSelector"
    NODE_AFFINITY = "required node affinity"
    VOLUME = "volume node affinity"
    TAINT = "untolerated taint"


@dataclass(frozen=True)
class PodNodeRules:
    """A pod's constraints on its node, read once per sync and checked
    against many nodes."""

    node_selector: tuple[tuple[str, str], ...] = ()
    required: NodeSelector | None = None
    tolerations: tuple[Toleration, ...] = ()
    # Every one must reach the node; none for a pod without bound volumes
    # that have node affinity.
    volumes: tuple[VolumeConstraint, ...] = ()
    # Precomputed: nothing but taints can exclude a node.
    _labels_free: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_labels_free", not self.node_selector and self.required is None and not self.volumes
        )

    @classmethod
    def from_pod_spec(cls, spec: Mapping[str, Any], volumes: Sequence[VolumeConstraint] = ()) -> PodNodeRules:
        selector = tuple(sorted((spec.get("nodeSelector") or {}).items()))
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        raw_required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        required = NodeSelector.from_api(raw_required) if raw_required is not None else None
        tolerations = tuple(Toleration.from_api(t) for t in spec.get("tolerations") or ())
        return cls(node_selector=selector, required=required, tolerations=tolerations, volumes=tuple(volumes))

    def mismatch(self, node_name: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> Mismatch | None:
        """The first rule `node` breaks, or None if the pod may run there."""
        if not self._labels_free:
            for key, value in self.node_selector:
                if labels.get(key) != value:
                    return Mismatch.NODE_SELECTOR
            if self.required is not None and not self.required.matches(node_name, labels):
                return Mismatch.NODE_AFFINITY
            for v in self.volumes:
                if not v.reaches(labels):
                    return Mismatch.VOLUME
        if taints and untolerated_taint(self.tolerations, taints) is not None:
            return Mismatch.TAINT
        return None

    def unreachable_volume(self, labels: Mapping[str, str]) -> VolumeConstraint | None:
        """The first of the pod's volumes a node with `labels` cannot reach."""
        return next((v for v in self.volumes if not v.reaches(labels)), None)

    def admits(self, node_name: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> bool:
        return self.mismatch(node_name, labels, taints) is None


def pin_to_node(affinity: Mapping[str, Any] | None, node: str) -> dict[str, Any]:
    """The pod's `spec.affinity` after pinning it to `node`.

    Appends `matchFields metadata.name In [node]` to every non-empty required
    term, or adds the one term when there are none: the API server lets a
    gated pod's required node affinity only narrow, and appending to each
    term narrows the OR of the terms to `node`. An empty term matches no
    node and cannot gain requirements, so it is left as is. Idempotent: a
    term already ending with this pin is not pinned twice. The input is not
    modified.
    """
    out: dict[str, Any] = copy.deepcopy(dict(affinity)) if affinity else {}
    pin = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    node_affinity = out.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchFields": [pin]}]
        }
        return out
    for term in terms:
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue
        fields = term.setdefault("matchFields", [])
        if fields and fields[-1] == pin:
            continue
        fields.append(dict(pin, values=[node]))
    return out


def pinned_node(affinity: Mapping[str, Any] | None) -> str | None:
    """The node pin_to_node pinned to, or None: the last matchFields entry of
    the first non-empty required term, when it is `metadata.name In [one]`.
    A pod's own metadata.name requirements come before the pin."""
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or ():
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue
        fields: list[Mapping[str, Any]] = term.get("matchFields") or []
        if fields:
            last = fields[-1]
            values: list[Any] = last.get("values") or []
            if last.get("key") == NODE_NAME_FIELD and last.get("operator") == "In" and len(values) == 1:
                return str(values[0])
        return None
    return None


def _parse_int64(text: str) -> int | None:
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None
