"""`gpuclaimctl status`: the cluster's GPUs, claims, budgets and waiting pods, for a person.

Five sections, each read from one list of each resource:
1. GPUs per node and class: a node is listed under every class it offers
   (the class's nodeSelector matches and the node has the class's resource).
   BOUND is what Bound claims hold on the node for that resource (all
   classes sharing it); OTHER the GPU requests of pods that no claim
   accounts for (a pod without claims, or asking for more than its claims
   hold), which placement takes off too (DESIGN.md §4); FREE is the rest,
   so ALLOCATABLE = BOUND + OTHER + FREE on every row. FREE can be
   negative: that is an overcommitted node, shown rather than hidden.
   Placements in flight are the controller's alone and not shown. A node
   serving a class's resource through DRA (docs/dra.md) counts it as the
   controller does: ALLOCATABLE is the devices its ResourceSlices offer,
   OTHER includes the devices ResourceClaims hold there; such nodes are
   listed again under "GPUs served by DRA" with their DeviceClass and what
   was not counted.
2. Claims by phase, per class.
3. GPUBudgets per namespace, one row per limit: the limit, the GPUs the
   namespace's claims of the classes it covers hold (HELD: Bound, or Lost
   and still reserved, as capacity counts them), and how many of the
   namespace's gated pods wait with reason Budget. The controller's own
   figure (the budget's status.used) also counts its placements in flight,
   which only it knows: read from the API, HELD leaves them out and can
   trail that figure by the GPUs being placed.
4. How many of the pods of 5 wait for each reason (Preempting among them:
   pods of lower priority are being evicted for them, DESIGN.md §4d).
5. Pods still held by the `gpuclaimctl.io/claims` gate, oldest first, with
   their priority and why they wait (waiting_pods): a claim they cannot
   use, the Waiting condition of their own claims, what gpuclaimctl's
   Warning events told them, or InvalidClaims with the parse error.

`render` is pure (no client, no clock: `now` is passed in); `main` does
the reading and printing. Nothing here writes to the API server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import click
import urllib3
from kubernetes import client

from gpuclaimctl.model.api import (
    BUDGET_PLURAL,
    CLAIM_PLURAL,
    CLASS_PLURAL,
    CONDITION_WAITING,
    GROUP,
    SCHEDULING_GATE,
    TEMPLATE_PLURAL,
    VERSION,
    Phase,
    WaitReason,
)
from gpuclaimctl.decide import podplan
from gpuclaimctl.decide.capacity import claim_usage
from gpuclaimctl.decide.dra import NodeDra, SliceIndex, cluster_offers, map_resources, node_with_dra
from gpuclaimctl.decide.drausage import device_owners, dra_usage, used_with_dra
from gpuclaimctl.decide.podplan import Found, Lookup, Outdated, ToCreate
from gpuclaimctl.client import kube
from gpuclaimctl.client.events import COMPONENT
from gpuclaimctl.client.errors import ApiError, NotFound
from gpuclaimctl.model.budgets import BudgetInfo
from gpuclaimctl.model.dra import ClaimInfo, DeviceClassInfo, SliceInfo, TaintRule
from gpuclaimctl.model.snapshot import ClassInfo, NodeInfo, UnresolvedClaim, parse_time, pod_priority
from gpuclaimctl.model.podclaims import ClaimEntry, EntrySource, PodClaimsError, pod_claims

RawObject = Mapping[str, Any]

NOT_PROCESSED_REASON = "Pending"
NOT_PROCESSED_MESSAGE = "not yet processed"

# Finished pods hold no GPUs and are never gated, so the list leaves them out.
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# The controller's Warning events about pods (told_by_events).
_OUR_WARNINGS = f"type=Warning,involvedObject.kind=Pod,source={COMPONENT}"
_GAP = "  "


class StatusError(Exception):
    """Why status cannot be shown, in one line for the user."""


# --- rows ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeClassRow:
    node: str
    class_name: str
    resource: str
    allocatable: int
    bound: int
    other: int  # used by pods beyond what claims hold: allocatable == bound + other + free
    free: int
    state: str


@dataclass(frozen=True)
class PhaseRow:
    class_name: str
    pending: int
    bound: int
    lost: int


@dataclass(frozen=True)
class BudgetRow:
    namespace: str
    budget: str
    class_name: str  # a GPUClass, "*" for all classes, "-" for a budget without limits
    limit: int | None
    held: int | None
    waiting: int     # the namespace's gated pods whose reason is Budget


@dataclass(frozen=True)
class WaitingPod:
    namespace: str
    name: str
    created: datetime | None
    reason: str
    message: str
    priority: int = 0  # spec.priority


@dataclass(frozen=True)
class DraObjects:
    """resource.k8s.io/v1's lists, as `read` gets them (docs/dra.md)."""

    slices: Sequence[RawObject] = ()
    device_classes: Sequence[RawObject] = ()
    claims: Sequence[RawObject] = ()
    taint_rules: Sequence[RawObject] = ()


@dataclass(frozen=True)
class DraRow:
    node: str
    resource: str
    device_class: str
    devices: int
    not_counted: str  # why devices or pools were not counted, or "-"


def dra_nodes(nodes: Iterable[NodeInfo], classes: Iterable[ClassInfo],
              dra: DraObjects) -> dict[str, NodeDra]:
    """Each node's DRA offers of the classes' resources, as the controller
    keeps them (decide.dra.cluster_offers on the lists)."""
    index = SliceIndex.build(SliceInfo.from_api(s) for s in dra.slices)
    mapping = map_resources(DeviceClassInfo.from_api(c) for c in dra.device_classes)
    return cluster_offers(list(nodes), {c.resource_name for c in classes}, index, mapping,
                          [TaintRule.from_api(r) for r in dra.taint_rules])


def dra_rows(offers: Mapping[str, NodeDra]) -> list[DraRow]:
    """A row per node and resource DRA serves there with devices, or with
    devices it did not count."""
    rows = []
    for name in sorted(offers):
        nd = offers[name]
        for resource, offer in sorted(nd.offers.items()):
            notes = [n.message for n in (*nd.notes, *offer.notes)]
            if offer.count or notes:
                rows.append(DraRow(name, resource, offer.device_class or "-", offer.count,
                                   "; ".join(notes) or "-"))
    return rows


def reason_counts(waiting: Iterable[WaitingPod]) -> list[tuple[str, int]]:
    """How many pods wait for each reason, most first (then by reason)."""
    counts = Counter(p.reason for p in waiting)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def node_state(node: NodeInfo) -> str:
    """Ready, NotReady or Cordoned; NotReady,Cordoned for both, as kubectl
    shows NotReady,SchedulingDisabled."""
    parts = [] if node.ready else ["NotReady"]
    if node.unschedulable:
        parts.append("Cordoned")
    return ",".join(parts) or "Ready"


def gpu_rows(
    nodes: Iterable[RawObject],
    classes: Iterable[RawObject],
    claims: Iterable[RawObject],
    pods: Iterable[RawObject],
    dra: DraObjects | None = None,
) -> list[NodeClassRow]:
    """One row per node and class it offers, sorted by node then class.
    With `dra` (resource.k8s.io/v1 served), a node serving a resource
    through DRA offers the devices its slices do, and what ResourceClaims
    hold of them is used (decide.drausage.used_with_dra)."""
    class_infos = sorted((ClassInfo.from_api(c) for c in classes), key=lambda c: c.name)
    claims = list(claims)
    resource_of_class = {c.name: c.resource_name for c in class_infos}
    infos = [NodeInfo.from_api(n) for n in nodes]
    offers = dra_nodes(infos, class_infos, dra) if dra is not None else {}
    infos = [node_with_dra(n, offers.get(n.name)) for n in infos]
    used = used_with_dra(claims, pods, resource_of_class, dra_usage(
        [ClaimInfo.from_api(c) for c in (dra.claims if dra is not None else ())],
        device_owners(offers.values())))
    bound: Counter[tuple[str, str]] = Counter()
    for claim in claims:
        held = claim_usage(claim, resource_of_class)
        if held is not None:
            node_name, resource, count = held
            bound[node_name, resource] += count
    rows = []
    for node in sorted(infos, key=lambda n: n.name):
        for cls in class_infos:
            if not cls.offered_by(node):
                continue
            resource = cls.resource_name
            allocatable = node.allocatable.get(resource, 0)
            claimed = bound[node.name, resource]
            in_use = used.get(resource, {}).get(node.name, 0)  # claimed, plus pods beyond their claims
            rows.append(
                NodeClassRow(
                    node=node.name,
                    class_name=cls.name,
                    resource=resource,
                    allocatable=allocatable,
                    bound=claimed,
                    other=in_use - claimed,
                    free=allocatable - in_use,
                    state=node_state(node),
                )
            )
    return rows


def phase_rows(classes: Iterable[RawObject], claims: Iterable[RawObject]) -> list[PhaseRow]:
    """Claims per class and phase; every class appears, and so does a class
    that claims name but that does not exist. A claim with no phase yet is
    Pending, as the controller treats it."""
    counts: dict[str, Counter[Phase]] = {
        (c.get("metadata") or {}).get("name", ""): Counter() for c in classes
    }
    for claim in claims:
        class_name = (claim.get("spec") or {}).get("className", "")
        try:
            phase = Phase((claim.get("status") or {}).get("phase") or Phase.PENDING)
        except ValueError:
            phase = Phase.PENDING  # the CRD enum refuses others
        counts.setdefault(class_name, Counter())[phase] += 1
    return [
        PhaseRow(name, c[Phase.PENDING], c[Phase.BOUND], c[Phase.LOST])
        for name, c in sorted(counts.items())
    ]


def budget_rows(budgets: Iterable[RawObject], claims: Iterable[RawObject],
                waiting: Iterable[WaitingPod]) -> list[BudgetRow]:
    """One row per limit of each GPUBudget (by namespace, then name; limits
    in the order the budget lists them, as the controller checks them)."""
    held: Counter[tuple[str, str]] = Counter()  # (namespace, class) -> GPUs
    for claim in claims:
        usage = claim_usage(claim, {})
        if usage is not None:
            held[(claim.get("metadata") or {}).get("namespace", ""),
                 (claim.get("spec") or {}).get("className", "")] += usage[2]
    on_budget = Counter(p.namespace for p in waiting if p.reason == WaitReason.BUDGET)
    infos = sorted((BudgetInfo.from_api(b) for b in budgets), key=lambda b: (b.namespace, b.name))
    rows = []
    for b in infos:
        waits = on_budget[b.namespace]
        if not b.limits:
            rows.append(BudgetRow(b.namespace, b.name, "-", None, None, waits))
        for limit in b.limits:
            covered = sum(n for (ns, cls), n in held.items() if ns == b.namespace and limit.covers(cls))
            rows.append(BudgetRow(b.namespace, b.name, limit.class_name, limit.gpus, covered, waits))
    return rows


def is_gated(pod: RawObject) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == SCHEDULING_GATE for g in gates)


def waiting_condition(claim: RawObject) -> tuple[str, str] | None:
    for cond in (claim.get("status") or {}).get("conditions") or ():
        if cond.get("type") == CONDITION_WAITING and cond.get("status") == "True":
            return str(cond.get("reason") or ""), str(cond.get("message") or "")
    return None


# Pod uid -> (reason, message) the controller last told it in a Warning
# event, or None (told_by_events; in the controller, Memories.waiting_told).
Told = Callable[[str], "tuple[str, str] | None"]
_WAIT_REASONS = frozenset(r.value for r in WaitReason)


def told_by_events(events: Iterable[RawObject]) -> dict[str, tuple[str, str]]:
    """Per pod uid, the latest Warning event gpuclaimctl posted with a
    waiting reason: why a pod waits when no claim can carry a Waiting
    condition (a claim that does not exist, or that another pod holds)."""
    latest: dict[str, tuple[str, str, str]] = {}
    for e in events:
        involved = e.get("involvedObject") or {}
        reason = str(e.get("reason") or "")
        if e.get("type") != "Warning" or involved.get("kind") != "Pod" or reason not in _WAIT_REASONS:
            continue
        if COMPONENT not in ((e.get("source") or {}).get("component"), e.get("reportingComponent")):
            continue
        uid = str(involved.get("uid") or "")
        at = str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
        if uid and (uid not in latest or at >= latest[uid][0]):
            latest[uid] = (at, reason, str(e.get("message") or ""))
    return {uid: (reason, message) for uid, (_, reason, message) in latest.items()}


def waiting_pods(pods: Iterable[RawObject], claims: Iterable[RawObject], told: Told | None = None,
                 get_template: Lookup | None = None) -> list[WaitingPod]:
    """Gated pods, oldest first, each with why it waits, as the controller's
    last decision about it says, read from what every replica can see:
    1. a claim it cannot use, resolved as the pod sync resolves it (a GPUClaim
       or GPUClaimTemplate that does not exist or is being deleted, another
       pod's claim, a name taken): the reason decide() puts first;
    2. else the Waiting condition of its first claim (annotation order) that
       is its own: a claim no other gated pod names (a shared claim says the
       reason of the oldest gated pod naming it);
    3. else what the controller last told the pod (`told`: the leader's
       memory, or its Warning events), unless that was a claim it could not
       use and 1 finds none now (fixed meanwhile: the next decision tells);
    4. else a shared claim's Waiting condition;
    5. else Pending: not processed yet, or being placed.
    `get_template` (namespace, name) finds GPUClaimTemplates; without it
    none is known, and a template entry is never said to be missing."""
    get_claim = _lookup(claims)
    parsed = _gated_entries(pods)
    naming = _named_claims(parsed)
    out = []
    for pod, got in parsed:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if isinstance(got, PodClaimsError):
            reason, message = WaitReason.INVALID_CLAIMS.value, str(got)
        else:
            reason, message = _why_waiting(pod, got, get_claim, get_template, told, naming) \
                or (NOT_PROCESSED_REASON, NOT_PROCESSED_MESSAGE)
        out.append(WaitingPod(namespace, name, parse_time(meta.get("creationTimestamp")), reason, message,
                              pod_priority(pod)))
    # Oldest first, as the controller serves them; no timestamp sorts last.
    far = datetime.max.replace(tzinfo=timezone.utc)
    out.sort(key=lambda p: (p.created or far, p.namespace, p.name))
    return out


def claims_named_by_gated(pods: Iterable[RawObject], skip_uid: str = "") -> Counter[tuple[str, str]]:
    """(namespace, GPUClaim) -> how many gated pods (but the one of uid
    `skip_uid`) name it in a `claim:` entry."""
    return _named_claims([(p, e) for p, e in _gated_entries(pods)
                          if (p.get("metadata") or {}).get("uid") != skip_uid or not skip_uid])


def _gated_entries(pods: Iterable[RawObject]) -> list[tuple[RawObject, Sequence[ClaimEntry] | PodClaimsError]]:
    """Each gated pod with its annotation's entries, or why they do not parse."""
    out: list[tuple[RawObject, Sequence[ClaimEntry] | PodClaimsError]] = []
    for pod in pods:
        if not is_gated(pod):
            continue
        try:
            out.append((pod, pod_claims(pod)))
        except PodClaimsError as e:
            out.append((pod, e))
    return out


def _named_claims(parsed: Iterable[tuple[RawObject, Sequence[ClaimEntry] | PodClaimsError]]
                  ) -> Counter[tuple[str, str]]:
    naming: Counter[tuple[str, str]] = Counter()
    for pod, got in parsed:
        if isinstance(got, PodClaimsError):
            continue
        meta = pod.get("metadata") or {}
        for entry in got:
            if entry.source is EntrySource.CLAIM:
                naming[meta.get("namespace", ""), entry.claim_name(meta.get("name", ""))] += 1
    return naming


def _why_waiting(pod: RawObject, entries: Sequence[ClaimEntry], get_claim: Lookup, get_template: Lookup | None,
                 told: Told | None, naming: Mapping[tuple[str, str], int]) -> tuple[str, str] | None:
    """waiting_pods' reason for one pod with a valid annotation, or None."""
    meta = pod.get("metadata") or {}
    namespace, uid = meta.get("namespace", ""), str(meta.get("uid") or "")
    try:
        resolved = podplan.resolve(pod, entries, get_claim, get_template or _ANY_TEMPLATE)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # an object not as the API server makes them
    problems: list[tuple[WaitReason, str]] = []
    own: list[Mapping[str, Any]] = []
    shared: list[Mapping[str, Any]] = []
    for entry, r in zip(entries, resolved):
        if isinstance(r, UnresolvedClaim):
            problems.append((r.reason, r.message))
        elif isinstance(r, Outdated):
            problems.append((WaitReason.CLAIM_MISSING, r.message))
        elif isinstance(r, Found):
            problem = unusable_claim(r.claim, uid)
            if problem is not None:
                problems.append(problem)
            elif naming.get((namespace, entry.claim_name(meta.get("name", ""))), 0) > 1:
                shared.append(r.claim)
            else:
                own.append(r.claim)
    if problems:
        problems.sort(key=lambda p: _UNUSABLE_ORDER.index(p[0]) if p[0] in _UNUSABLE_ORDER else len(_UNUSABLE_ORDER))
        return str(problems[0][0]), "; ".join(m for _, m in problems)
    for claim in own:
        if (found := waiting_condition(claim)) is not None:
            return found
    said = told(uid) if told is not None else None
    if said is not None and (said[0] not in _UNUSABLE_REASONS or (
            said[0] == WaitReason.CLAIM_MISSING and any(isinstance(r, ToCreate) for r in resolved))):
        return said
    for claim in shared:
        if (found := waiting_condition(claim)) is not None:
            return found
    return None


# The reasons of a claim a pod cannot use, first first (decide's order).
_UNUSABLE_ORDER = (WaitReason.CLAIM_MISSING, WaitReason.NAME_TAKEN, WaitReason.CLAIM_IN_USE)
_UNUSABLE_REASONS = frozenset(str(r) for r in _UNUSABLE_ORDER)


def unusable_claim(claim: Mapping[str, Any], pod_uid: str) -> tuple[WaitReason, str] | None:
    """Why a claim the pod names cannot serve it now, as decide() checks it:
    being deleted, or reserved by another pod."""
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    name = meta.get("name", "")
    if meta.get("deletionTimestamp"):
        return WaitReason.CLAIM_MISSING, f"GPUClaim {name} is being deleted"
    others = [r for r in status.get("reservedFor") or () if isinstance(r, Mapping) and r.get("uid") != pod_uid]
    if others:
        return (WaitReason.CLAIM_IN_USE,
                f"GPUClaim {name} is in use by pod {others[0].get('name')}; a claim serves one pod at a time")
    return None


# --- text ---------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it (apimachinery's duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last one is not padded, so
    a long message does not push every line wide."""
    cells = [list(headers)] + [[_one_line(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers) - 1)]
    return [
        _GAP.join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in cells
    ]


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _ANY_TEMPLATE(namespace: str, name: str) -> Mapping[str, Any]:
    """A lookup that finds every template (none is known to be missing)."""
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {}}


def _lookup(objects: Iterable[RawObject]) -> Lookup:
    """(namespace, name) -> the object, of `objects`."""
    by_name = {((o.get("metadata") or {}).get("namespace", ""), (o.get("metadata") or {}).get("name", "")): o
               for o in objects}
    return lambda namespace, name: by_name.get((namespace, name))


def render(
    nodes: Iterable[RawObject],
    classes: Iterable[RawObject],
    claims: Iterable[RawObject],
    pods: Iterable[RawObject],
    now: datetime,
    budgets: Iterable[RawObject] = (),
    told: Told | None = None,
    templates: Iterable[RawObject] | None = None,
    dra: DraObjects | None = None,
) -> str:
    """The status text for one snapshot. Pure: `now` only ages the pods.

    `pods` are the pods that may hold GPUs or wait (finished ones may be
    left out); `now` must be timezone-aware, like the API's timestamps.
    `dra`: resource.k8s.io/v1's objects, None where it is not served.
    """
    nodes, classes, claims, pods = list(nodes), list(classes), list(claims), list(pods)
    gpus = gpu_rows(nodes, classes, claims, pods, dra)
    served = [] if dra is None else dra_rows(dra_nodes(
        (NodeInfo.from_api(n) for n in nodes), (ClassInfo.from_api(c) for c in classes), dra))
    phases = phase_rows(classes, claims)
    waiting = waiting_pods(pods, claims, told, None if templates is None else _lookup(templates))
    per_limit = budget_rows(budgets, claims, waiting)
    sections = [
        _section(
            GPUS_TITLE,
            ("NODE", "CLASS", "RESOURCE", "ALLOCATABLE", "BOUND", "OTHER", "FREE", "STATE"),
            [(r.node, r.class_name, r.resource, r.allocatable, r.bound, r.other, r.free, r.state)
             for r in gpus],
        ),
        *([_section(
            DRA_TITLE,
            ("NODE", "RESOURCE", "DEVICECLASS", "DEVICES", "NOT COUNTED"),
            [(r.node, r.resource, r.device_class, r.devices, r.not_counted) for r in served],
        )] if served else []),
        _section(
            "Claims by phase",
            ("CLASS", "PENDING", "BOUND", "LOST"),
            [(r.class_name, r.pending, r.bound, r.lost) for r in phases],
        ),
        _section(
            BUDGETS_TITLE,
            ("NAMESPACE", "BUDGET", "CLASS", "LIMIT", "HELD", "WAITING"),
            [(r.namespace, r.budget, r.class_name, _or_dash(r.limit), _or_dash(r.held), r.waiting)
             for r in per_limit],
        ),
        _section(
            REASONS_TITLE,
            ("REASON", "PODS"),
            reason_counts(waiting),
        ),
        _section(
            "Waiting pods",
            ("NAMESPACE/NAME", "AGE", "PRIORITY", "REASON", "MESSAGE"),
            [
                (
                    f"{p.namespace}/{p.name}",
                    human_duration((now - p.created).total_seconds()) if p.created else "<unknown>",
                    p.priority,
                    p.reason,
                    p.message,
                )
                for p in waiting
            ],
        ),
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


GPUS_TITLE = ("GPUs per node and class (OTHER: in use by pods without a claim for them; "
              "FREE = ALLOCATABLE - BOUND - OTHER)")
DRA_TITLE = ("GPUs served by DRA (DEVICES: what the node's ResourceSlices offer through the DeviceClass "
             "kube-scheduler maps the resource to; docs/dra.md)")
REASONS_TITLE = "Waiting pods by reason (Preempting: pods of lower priority are being evicted for them)"
BUDGETS_TITLE = "GPU budgets per namespace (HELD: GPUs claims hold now; placements in flight are not seen here)"


def _or_dash(value: int | None) -> object:
    return "-" if value is None else value


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return [title, *(table(headers, rows) if rows else ["none"])]


# --- I/O ----------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    budgets: list[dict[str, Any]]
    told: dict[str, tuple[str, str]]
    templates: list[dict[str, Any]] | None
    # resource.k8s.io/v1's lists (read(dra=True)); None when not asked for, or not served.
    dra: DraObjects | None = field(default=None)


def load_client(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    try:
        return kube.load_client(kubeconfig, context)
    except kube.ConfigError as e:
        raise StatusError(str(e)) from None


def read(api: client.ApiClient, *, events: bool = False, dra: bool = False) -> Snapshot:
    """The lists status shows; with `events`, also what gpuclaimctl's
    Warning events told pods (told_by_events); with `dra`, resource.k8s.io/v1's
    objects (read_dra)."""
    base = f"/apis/{GROUP}/{VERSION}"
    try:
        nodes = kube.list_all(api, "/api/v1/nodes")
        try:
            classes = kube.list_all(api, f"{base}/{CLASS_PLURAL}")
            claims = kube.list_all(api, f"{base}/{CLAIM_PLURAL}")
        except NotFound:
            raise StatusError(
                f"the {GROUP} CRDs are not installed on this cluster (deploy/crds)"
            ) from None
        try:
            budgets = kube.list_all(api, f"{base}/{BUDGET_PLURAL}")
        except NotFound:
            budgets = []  # installed before GPUBudgets existed: no namespace is limited
        try:
            templates: list[dict[str, Any]] | None = kube.list_all(api, f"{base}/{TEMPLATE_PLURAL}")
        except ApiError:
            templates = None  # not listable: no template entry is said to be missing
        pods = kube.list_all(api, "/api/v1/pods", [("fieldSelector", _LIVE_PODS)])
        dra_objects = read_dra(api) if dra else None
        told: dict[str, tuple[str, str]] = {}
        if events:
            try:
                ours = kube.list_all(api, "/api/v1/events", [("fieldSelector", _OUR_WARNINGS)])
                told = told_by_events(ours)
            except ApiError:
                pass  # events are a nicety: a user who may not list them gets the rest
    except ApiError as e:
        raise StatusError(f"the API server refused a list: {_one_line(e)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        host = api.configuration.host
        raise StatusError(f"cannot reach the API server at {host}: {_one_line(e)}") from None
    return Snapshot(nodes, classes, claims, pods, budgets, told, templates, dra_objects)


_DRA = "/apis/resource.k8s.io/v1"


def read_dra(api: client.ApiClient) -> DraObjects | None:
    """resource.k8s.io/v1's ResourceSlices, DeviceClasses, ResourceClaims
    and DeviceTaintRules; None where the API server does not serve the
    group version (a 404), no rules where it does not serve them."""
    try:
        slices = kube.list_all(api, f"{_DRA}/resourceslices")
        device_classes = kube.list_all(api, f"{_DRA}/deviceclasses")
        claims = kube.list_all(api, f"{_DRA}/resourceclaims")
    except NotFound:
        return None
    try:
        rules = kube.list_all(api, f"{_DRA}/devicetaintrules")
    except NotFound:
        rules = []
    return DraObjects(slices, device_classes, claims, rules)


def main(kubeconfig: str | None, context: str | None) -> int:
    """Print the status; 0, or 1 with one line on stderr when it cannot."""
    try:
        api = load_client(kubeconfig, context)
        with api:
            snap = read(api, events=True, dra=True)
    except StatusError as e:
        click.echo(f"gpuclaimctl status: {e}", err=True)
        return 1
    click.echo(render(snap.nodes, snap.classes, snap.claims, snap.pods, datetime.now(timezone.utc),
                      snap.budgets, snap.told.get, snap.templates, snap.dra), nl=False)
    return 0
