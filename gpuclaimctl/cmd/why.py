"""`gpuclaimctl why NAMESPACE/POD`: why a pod waits for its GPU claims, or where it went.

For a pod still held by the `gpuclaimctl.io/claims` gate: its set of
claims, the reason and message the controller last wrote on them (their
Waiting condition), the decision made now by the controller's own code on
a fresh read of the API (decide.whatif, decide.explain), the namespace's
GPUBudgets, and one row per node offering the set's classes with its
verdict, free GPUs and which way it serves them (device plugin, or DRA
through a DeviceClass: a node DRA serves counts as the controller counts
it, docs/dra.md), and the devices DRA offers there that are not counted;
its priority, and for a set that waits for room the preemption the
controller would make now (which node, which pods of lower priority) or
why none, evicting nothing; what Preempting means when its claims say so.
For a pod gpuclaimctl released: the node, when it was released (the time
of the write that set `gpuclaimctl.io/node`, from the pod's
managedFields), when kube-scheduler bound it, and the Placed event while
the API server keeps it.

Reads only (GETs and lists through `kube`); nothing is written. `build`
and the renderers are pure; `main` reads and prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import orjson
import urllib3
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError, NotFound
from gpuclaimctl.client.events import COMPONENT
from gpuclaimctl.cmd import decisionview, snapshotfile, statusview
from gpuclaimctl.cmd.statusview import BudgetRow, DraObjects, DraRow, StatusError, human_duration, table
from gpuclaimctl.decide import podplan
from gpuclaimctl.decide.placement import Placed
from gpuclaimctl.decide.whatif import ClusterObjects, Outcome, PreemptionRules, WhatIf
from gpuclaimctl.model import keys
from gpuclaimctl.model.api import (
    CLAIMS_ANNOTATION,
    FINISHED_PHASES,
    PLACED_NODE_ANNOTATION,
    SCHEDULING_GATE,
    Strategy,
    WaitReason,
)
from gpuclaimctl.model.gangs import GangError, PodGroupLookup, PodGroupMissing, pod_gang
from gpuclaimctl.model.podclaims import PodClaimsError, has_gate, pod_claims
from gpuclaimctl.model.snapshot import ClaimState, UnresolvedClaim, format_time, parse_time, pod_priority

Obj = Mapping[str, Any]


class State:
    WAITING = "waiting"  # gated: gpuclaimctl has not released it
    RELEASED = "released"  # gpuclaimctl removed the gate and pinned it
    NOT_OURS = "not-using-claims"  # no gate: kube-scheduler alone places it


@dataclass(frozen=True)
class Said:
    """What the controller last wrote on the set: a claim's Waiting condition."""

    claim: str
    reason: str
    message: str
    since: datetime | None


@dataclass(frozen=True)
class Warned:
    """The latest Warning event gpuclaimctl posted about the pod: a cause
    no claim's condition can carry (a claim the API server refused to
    create has no status to write it on)."""

    reason: str
    message: str
    at: datetime | None


@dataclass(frozen=True)
class Release:
    node: str
    released_at: datetime | None
    scheduled_at: datetime | None  # PodScheduled True
    bound_node: str  # spec.nodeName, "" until kube-scheduler binds it
    phase: str
    unschedulable: str  # kube-scheduler's message while it refuses the pinned pod
    event: tuple[datetime | None, str] | None  # the latest Placed event


@dataclass(frozen=True)
class Report:
    namespace: str
    name: str
    created: datetime | None
    state: str
    read_at: datetime
    outcome: Outcome | None = None  # WAITING
    said: Said | None = None  # WAITING
    warned: Warned | None = None  # WAITING
    budgets: tuple[BudgetRow, ...] = ()
    release: Release | None = None  # RELEASED
    claims: tuple[tuple[str, Obj | None], ...] = ()  # RELEASED: (name, claim)
    detail: str = ""  # NOT_OURS: why it is not ours
    warnings: tuple[str, ...] = ()
    # The PodGroup the pod names, as read (its gang's size).
    podgroups: PodGroupLookup | None = None
    # spec.priority, and spec.preemptionPolicy (None: not set).
    priority: int = 0
    preemption_policy: str | None = None
    # WAITING: devices DRA offers of the set's resources that are not counted, and why.
    dra: tuple[DraRow, ...] = ()


# --- building the report (pure) ------------------------------------------------------


def build(pod: Obj, objects: ClusterObjects, now: datetime, strategy: Strategy = Strategy.BINPACK,
          events: Sequence[Obj] = (), warnings: Sequence[str] = (),
          podgroups: PodGroupLookup | None = None,
          preemption: PreemptionRules | None = decisionview.PREEMPTION,
          dra: DraObjects | None = None) -> Report:
    """The report for `pod` on `objects` (read at `now`); `events` are the
    pod's own; `preemption`, the controller's rules (None: none looked
    for); `dra`, resource.k8s.io/v1's lists read with them (None: not
    served). Pure."""
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    created = parse_time(meta.get("creationTimestamp"))
    notes = tuple(warnings)
    policy = (pod.get("spec") or {}).get("preemptionPolicy")
    priority, policy = pod_priority(pod), str(policy) if policy else None
    annotations = meta.get("annotations") or {}
    claims_by_name = {((c.get("metadata") or {}).get("namespace"), (c.get("metadata") or {}).get("name")): c
                      for c in objects.claims}
    if has_gate(pod):
        served = snapshotfile.dra_served(objects, dra)
        world = WhatIf(objects, strategy, preemption, served)
        outcome = _gang_outcome(world, pod, objects, now, podgroups) or world.explain(pod, now)
        resources = {world.cluster.classes[c.class_name].resource_name for c in outcome.claims
                     if isinstance(c, ClaimState) and c.class_name in world.cluster.classes}
        uncounted = decisionview.not_counted(served.offers, resources) if served is not None else []
        waiting = [statusview.WaitingPod(ns, name, created, "", "")]
        budgets = tuple(statusview.budget_rows(
            [b for b in objects.budgets if (b.get("metadata") or {}).get("namespace") == ns],
            objects.claims, waiting))
        return Report(ns, name, created, State.WAITING, now, outcome=outcome, podgroups=podgroups,
                      said=_said(pod, claims_by_name, {c.name for c in outcome.claims
                                                       if isinstance(c, UnresolvedClaim)}
                                 | _shared(pod, objects.pods)),
                      warned=_last_warning(events), budgets=budgets,
                      warnings=notes, priority=priority, preemption_policy=policy, dra=tuple(uncounted))
    node = annotations.get(PLACED_NODE_ANNOTATION)
    if not node:
        detail = (f"it names GPU claims but carries no {SCHEDULING_GATE} scheduling gate, so gpuclaimctl "
                  "does not place it" if CLAIMS_ANNOTATION in annotations else
                  f"it has no {CLAIMS_ANNOTATION} annotation: it does not use GPU claims")
        return Report(ns, name, created, State.NOT_OURS, now, detail=detail, warnings=notes, priority=priority,
                      preemption_policy=policy)
    try:
        names = [e.claim_name(name) for e in pod_claims(pod)]
    except PodClaimsError:
        names = []
    return Report(ns, name, created, State.RELEASED, now, release=_release(pod, str(node), events),
                  claims=tuple((n, claims_by_name.get((ns, n))) for n in names), warnings=notes,
                  priority=priority, preemption_policy=policy)


def _said(pod: Obj, claims: Mapping[tuple[Any, Any], Obj], unusable: Set[str] = frozenset()) -> Said | None:
    """The Waiting condition of the first of the pod's claims (annotation
    order) that has one and that the pod can use: not another pod's, nor
    reserved by one (`unusable`: names the decision could not resolve),
    whose condition tells that other pod's wait."""
    meta = pod.get("metadata") or {}
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return None
    for entry in entries:
        name = entry.claim_name(str(meta.get("name") or ""))
        claim = claims.get((meta.get("namespace"), name))
        if claim is None or name in unusable or \
                statusview.unusable_claim(claim, str(meta.get("uid") or "")) is not None:
            continue
        cond = podplan.waiting_condition(claim)
        if cond is not None and cond.get("status") == "True":
            return Said(entry.claim_name(str(meta.get("name"))), str(cond.get("reason") or ""),
                        str(cond.get("message") or ""), parse_time(cond.get("lastTransitionTime")))
    return None


def _shared(pod: Obj, pods: Sequence[Obj]) -> set[str]:
    """The GPUClaims another gated pod of `pod`'s namespace names too: their
    Waiting condition says the wait of the oldest gated pod naming it."""
    meta = pod.get("metadata") or {}
    named = statusview.claims_named_by_gated(pods, skip_uid=str(meta.get("uid") or ""))
    return {name for (ns, name) in named if ns == meta.get("namespace")}


def _last_warning(events: Sequence[Obj]) -> Warned | None:
    """The latest of the pod's Warning events that gpuclaimctl posted."""
    ours = [e for e in events if e.get("type") == "Warning" and COMPONENT in (
        e.get("reportingComponent"), _field(e.get("source"), "component"))]
    if not ours:
        return None
    last = max(ours, key=lambda e: str(_event_time(e) or ""))
    return Warned(str(last.get("reason") or ""), str(last.get("message") or ""), _event_time(last))


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else None


def refused(r: Report) -> list[str]:
    """The set's claims not created because the API server refused them,
    as the latest warning says (the decision shown assumes they exist)."""
    if r.outcome is None or r.warned is None:
        return []
    exists = _exists(r.outcome)
    return [n for n, made in exists.items() if not made and podplan.refused_create_of(r.warned.message, n)]


def released_at(pod: Obj) -> datetime | None:
    """When the write that set `gpuclaimctl.io/node` (the release) was made:
    the time of the managedFields entry that owns that annotation."""
    wanted = f"f:{PLACED_NODE_ANNOTATION}"
    for entry in (pod.get("metadata") or {}).get("managedFields") or ():
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations") or {}
        if wanted in fields:
            return parse_time(entry.get("time"))
    return None


def _release(pod: Obj, node: str, events: Sequence[Obj]) -> Release:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    scheduled: Obj = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), {})
    refused = ""
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        refused = str(scheduled.get("message") or "Unschedulable")
    placed = [e for e in events if e.get("reason") == "Placed"]
    event = None
    if placed:
        last = max(placed, key=lambda e: str(_event_time(e) or ""))
        event = (_event_time(last), str(last.get("message") or ""))
    return Release(
        node=node, released_at=released_at(pod),
        scheduled_at=parse_time(scheduled.get("lastTransitionTime")) if scheduled.get("status") == "True"
        else None,
        bound_node=str(spec.get("nodeName") or ""), phase=str(status.get("phase") or "Pending"),
        unschedulable=refused, event=event)


def _event_time(event: Obj) -> datetime | None:
    return parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))


# --- text ------------------------------------------------------------------------------


def _when(t: datetime | None, now: datetime) -> str:
    if t is None:
        return "unknown"
    return f"{format_time(t)} ({human_duration((now - t).total_seconds())} ago)"


def render_text(r: Report) -> str:
    head = f"Pod {r.namespace}/{r.name}"
    if r.state == State.NOT_OURS:
        lines = [f"{head} is not placed by gpuclaimctl: {r.detail}."]
    elif r.state == State.RELEASED:
        lines = _released_text(head, r)
    else:
        lines = _waiting_text(head, r)
    lines += [f"warning: {w}" for w in r.warnings]
    return "\n".join(lines) + "\n"


def _released_text(head: str, r: Report) -> list[str]:
    rel = r.release
    assert rel is not None
    lines = [f"{head} was released by gpuclaimctl to node {rel.node} at {_when(rel.released_at, r.read_at)}."]
    if rel.bound_node:
        lines.append(f"kube-scheduler bound it to {rel.bound_node} at {_when(rel.scheduled_at, r.read_at)}; "
                     f"phase {rel.phase}.")
    elif rel.unschedulable:
        lines.append(f"kube-scheduler refuses it there: {rel.unschedulable}")
    else:
        lines.append("kube-scheduler has not bound it yet.")
    if rel.event is not None:
        lines.append(f"Placed event ({_when(rel.event[0], r.read_at)}): {rel.event[1]}")
    rows = []
    for name, claim in r.claims:
        st, spec = (claim or {}).get("status") or {}, (claim or {}).get("spec") or {}
        rows.append((name, spec.get("className", "-"), spec.get("count", "-"),
                     st.get("phase") or ("Pending" if claim else "-"), st.get("nodeName") or "-",
                     "-" if claim else "not found"))
    if rows:
        lines += ["", *table(decisionview.CLAIM_HEADERS, rows)]
    return lines


def _waiting_text(head: str, r: Report) -> list[str]:
    out = r.outcome
    assert out is not None
    age = f", created {human_duration((r.read_at - r.created).total_seconds())} ago" if r.created else ""
    lines = [f"{head} waits for its GPU claims (gated by {SCHEDULING_GATE}{age}).",
             f"Its {decisionview.priority_text(r.priority, r.preemption_policy, _gang_priority(r))}."]
    if out.invalid:
        return lines + [f"InvalidClaims: {out.invalid}"]
    exists = _exists(out)
    not_made = refused(r)
    rows = decisionview.claim_rows(out.claims, exists, {n: REFUSED_NOTE for n in not_made})
    lines += ["", *table(decisionview.CLAIM_HEADERS, rows), ""]
    assert out.explanation is not None
    decision = out.explanation.decision
    # The claims' Waiting condition, the latest warning event and a decision
    # made now usually say the same: it is shown once, and another one in
    # full only where it says something else (issue 45).
    decided = None if isinstance(decision, Placed) else (str(decision.reason), decision.message)
    said = None if r.said is None else (r.said.reason, r.said.message)
    warned = None if r.warned is None else (r.warned.reason, r.warned.message)
    event = "" if r.warned is None else f"its latest warning event ({_when(r.warned.at, r.read_at)})"
    decided_note: list[str] = []
    if not_made:
        decided_note.append(f"  as if GPUClaim {', '.join(not_made)} could be created: until the API server "
                            "accepts it, the pod waits whatever the decision")
    if r.said is not None:
        since = f" (since {_when(r.said.since, r.read_at)})" if r.said.since else ""
        lines.append(f"The controller says{since}: {r.said.reason}: {r.said.message}")
        if r.said.reason == WaitReason.PREEMPTING:
            lines.append(PREEMPTING_SAID)
    elif r.warned is not None and (not_made or any(isinstance(c, UnresolvedClaim) for c in out.claims)):
        lines.append("The controller says: no Waiting condition on the claims (none it could write: missing, "
                     "refused or another pod's); its warning event tells why")
    else:
        lines.append("The controller says: nothing yet (no Waiting condition on the claims: not processed, "
                     "or being placed)")
    if said is not None:
        lines += _agreeing(said, [(event, warned), (_DECIDED, decided)], decided_note)
    if warned is not None and warned != said:
        lines.append(f"{event[0].upper()}{event[1:]}: {warned[0]}: {warned[1]}")
        lines += _agreeing(warned, [(_DECIDED, decided)], decided_note)
    if decided is None or decided not in (said, warned):
        lines += [f"Decided now: {decisionview.decision_line(decision)}", *decided_note]
    if out.preemption is not None:
        lines += decisionview.preemption_lines(out.preemption)
    gang = gang_note(out.pod, r.podgroups)
    if gang:
        lines.append(gang)
    if r.budgets:
        lines += ["", f"GPU budgets of {r.namespace} (HELD: GPUs its claims hold now):",
                  *table(("BUDGET", "CLASS", "LIMIT", "HELD"),
                         [(b.budget, b.class_name, "-" if b.limit is None else b.limit,
                           "-" if b.held is None else b.held) for b in r.budgets])]
    lines += ["", "Nodes (FREE: GPUs free now; NEED: GPUs the set needs there):",
              *decisionview.node_lines(out.explanation)]
    if r.dra:
        lines += ["", *decisionview.dra_lines(r.dra)]
    lines += ["", decisionview.NOT_SEEN_NOTE]
    if out.preemption is not None:
        lines.append(decisionview.PREEMPTION_NOTE)
    return lines


PREEMPTING_SAID = (
    "Preempting: the controller evicts (or has evicted) the pods of lower priority named for it; the GPUs "
    "they free are held for it, in the controller's memory (not seen here), and it is placed once they "
    "are free. While they terminate, a decision made now sees their GPUs still in use.")


def _gang_priority(r: Report) -> int | None:
    """The priority the pod's gang preempts at, when the decision says."""
    out = r.outcome
    if out is None or out.preemption is None or not gang_note(out.pod, r.podgroups):
        return None
    return out.preemption.priority


def gang_note(pod: Obj, podgroups: PodGroupLookup | None = None) -> str:
    """What a member of a gang is told beside the decision."""
    try:
        gang = pod_gang(pod, podgroups)
    except GangError as e:
        return f"Its gang annotations are wrong: {e}"
    except PodGroupMissing as e:
        return f"It names PodGroup {e.name}, which is not found: it waits until it exists."
    if gang is None:
        return ""
    return (f"It is a member of gang {gang.label} (size {gang.size}): the decision made now is the gang's, "
            "its members all at once or none, as the controller decides it; each node's verdict below is "
            "this member's own set's.")


def _gang_outcome(world: WhatIf, pod: Obj, objects: ClusterObjects, now: datetime,
                  podgroups: PodGroupLookup | None = None) -> Outcome | None:
    """The gang's decision for a member of a gang (its gated mates read with
    the pods), as this member's outcome; None for a pod in no gang."""
    try:
        gang = pod_gang(pod, podgroups)
    except (GangError, PodGroupMissing):
        return None
    if gang is None:
        return None
    uid = (pod.get("metadata") or {}).get("uid")
    gated: list[Obj] = [pod]
    released = 0
    for other in objects.pods:
        meta = other.get("metadata") or {}
        if meta.get("uid") == uid or meta.get("namespace") != gang.namespace or meta.get("deletionTimestamp") \
                or (other.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        try:
            theirs = pod_gang(other, podgroups)
        except (GangError, PodGroupMissing):
            continue
        if theirs is None or theirs.key != gang.key:
            continue
        if has_gate(other):
            gated.append(other)
        else:
            released += 1
    outcomes = world.explain_gang(gang, gated, now, released=released)
    return next((o for o in outcomes if (o.pod.get("metadata") or {}).get("uid") == uid), None)


REFUSED_NOTE = "not created: the API server refused it (see the warning)"
_DECIDED = "a decision made now"


def _agreeing(shown: tuple[str, str], others: Sequence[tuple[str, tuple[str, str] | None]],
              decided_note: Sequence[str]) -> list[str]:
    """The line under a reason and message shown that names the `others`
    (who, what they say) saying the same, instead of repeating it; and the
    decision's note when the decision is among them."""
    same = [who for who, what in others if what == shown]
    if not same:
        return []
    line = f"{same[0][0].upper()}{' and '.join(same)[1:]} {'say' if len(same) > 1 else 'says'} the same."
    return [line, *(decided_note if _DECIDED in same else ())]


def _exists(out: Outcome) -> dict[str, bool]:
    return {name: bool((c.get("metadata") or {}).get("uid")) for name, c in out.raw.items()}


# --- JSON ------------------------------------------------------------------------------


def render_json(r: Report) -> str:
    doc: dict[str, Any] = {"pod": f"{r.namespace}/{r.name}", "state": r.state,
                           "created": format_time(r.created) if r.created else None,
                           "readAt": format_time(r.read_at), "priority": r.priority,
                           "preemptionPolicy": r.preemption_policy}
    if r.state == State.NOT_OURS:
        doc["detail"] = r.detail
    elif r.state == State.RELEASED and r.release is not None:
        rel = r.release
        doc["release"] = {
            "node": rel.node, "releasedAt": _time(rel.released_at), "boundNode": rel.bound_node or None,
            "scheduledAt": _time(rel.scheduled_at), "phase": rel.phase,
            "unschedulable": rel.unschedulable or None,
            "placedEvent": None if rel.event is None else {"time": _time(rel.event[0]), "message": rel.event[1]}}
        doc["claims"] = [{"name": n, "className": ((c or {}).get("spec") or {}).get("className"),
                          "count": ((c or {}).get("spec") or {}).get("count"),
                          "phase": ((c or {}).get("status") or {}).get("phase") or ("Pending" if c else None),
                          "node": ((c or {}).get("status") or {}).get("nodeName"), "exists": c is not None}
                         for n, c in r.claims]
    elif r.outcome is not None:
        out = r.outcome
        if out.invalid:
            doc["invalid"] = out.invalid
        else:
            assert out.explanation is not None
            doc["claims"] = decisionview.claims_json(out.claims, _exists(out))
            doc["controller"] = None if r.said is None else {
                "claim": r.said.claim, "reason": r.said.reason, "message": r.said.message,
                "since": _time(r.said.since)}
            doc["lastWarning"] = None if r.warned is None else {
                "reason": r.warned.reason, "message": r.warned.message, "time": _time(r.warned.at)}
            doc["refused"] = refused(r)
            doc["decision"] = decisionview.decision_json(out.explanation.decision)
            doc["budgets"] = [{"budget": b.budget, "className": b.class_name, "limit": b.limit,
                               "held": b.held} for b in r.budgets]
            doc["nodes"] = decisionview.nodes_json(out.explanation)
            doc["draNotCounted"] = decisionview.dra_json(r.dra)
            doc["gang"] = gang_note(out.pod, r.podgroups) or None
            doc["preemption"] = None if out.preemption is None else decisionview.preemption_json(out.preemption)
        doc["note"] = decisionview.NOT_SEEN_NOTE
    doc["warnings"] = list(r.warnings)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def _time(t: datetime | None) -> str | None:
    return format_time(t) if t is not None else None


# --- I/O -------------------------------------------------------------------------------


def target(text: str, namespace: str | None) -> tuple[str, str]:
    """`NAMESPACE/POD`, or `POD` with -n (default: `default`). Both must be
    names the API server could hold: they go into the request's path, where
    an empty one would read a list and `?watch=true` would never end."""
    ns, sep, name = text.partition("/")
    if not sep:
        ns, name = namespace or "default", text
    elif not ns or not name or "/" in name:
        raise click.UsageError(f"{text!r}: expected NAMESPACE/POD")
    elif namespace and namespace != ns:
        raise click.UsageError(f"{text!r} names namespace {ns}, but -n says {namespace}")
    if not keys.is_dns_label(ns):
        raise click.UsageError(f"{ns!r} is not a namespace name")
    if not keys.is_dns_subdomain(name):
        raise click.UsageError(f"{name!r} is not a pod name")
    return ns, name


def main(ns: str, name: str, kubeconfig: str | None, context: str | None, output: str,
         strategy: Strategy, preemption: bool = True) -> int:
    try:
        api = statusview.load_client(kubeconfig, context)
        with api:
            try:
                pod = kube.request_json(api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            except NotFound:
                raise StatusError(f"pod {ns}/{name} not found") from None
            now = datetime.now(timezone.utc)
            taken = snapshotfile.read_live(api, now, trimmed=False)
            events = _events(api, ns, str(pod["metadata"].get("uid") or ""))
            podgroups = _podgroup(api, pod)
    except StatusError as e:
        click.echo(f"gpuclaimctl why: {e}", err=True)
        return 1
    except ApiError as e:
        click.echo(f"gpuclaimctl why: the API server refused a read: {e}", err=True)
        return 1
    except (urllib3.exceptions.HTTPError, OSError) as e:
        click.echo(f"gpuclaimctl why: cannot reach the API server: {e}", err=True)
        return 1
    report = build(pod, taken.objects, now, strategy, events, taken.warnings, podgroups,
                   decisionview.preemption_rules(preemption), taken.dra)
    click.echo(render_json(report) if output == "json" else render_text(report), nl=False)
    return 0


def _podgroup(api: client.ApiClient, pod: Obj) -> PodGroupLookup | None:
    """The PodGroup the pod names (spec.schedulingGroup.podGroupName), read
    once; None when it names none. Not found, or the API not served: a
    lookup that finds nothing (the pod then waits GangIncomplete)."""
    name = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    if not name:
        return None
    ns = str((pod.get("metadata") or {}).get("namespace") or "")
    try:
        found: Obj | None = kube.request_json(
            api, "GET", f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/{name}")
    except (ApiError, OSError):
        found = None
    return lambda n, g: found if (n, g) == (ns, name) else None


def _events(api: client.ApiClient, ns: str, uid: str) -> list[dict[str, Any]]:
    try:
        return kube.list_all(api, f"/api/v1/namespaces/{ns}/events",
                             [("fieldSelector", f"involvedObject.uid={uid}")])
    except ApiError:
        return []  # events are a nicety: a user who may not list them still gets the rest
