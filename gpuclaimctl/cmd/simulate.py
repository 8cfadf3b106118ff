"""`gpuclaimctl simulate -f FILE`: where the pods of a manifest would go, with no writes.

The file's Pods, Deployments, ReplicaSets, StatefulSets, Jobs and CronJobs
become their pods (model.workloads; `--replicas N` overrides each one's
count), and each pod is decided in turn, by the controller's own code
(decide.whatif), on a snapshot of the cluster: a fresh read of the API
server, or a file saved by `gpuclaimctl snapshot` (`--snapshot FILE`, taken
as of its time), edited with `--add-node` and `--without-node`. A copy that
is placed counts for the next, as the controller's writes would. GPUClasses,
GPUClaims, GPUClaimTemplates and GPUBudgets in the file count as applied.

It answers for GPUs and the pod's node rules, as gpuclaimctl decides them;
kube-scheduler's other checks (CPU, memory, pod count, ports) come after a
release and are not simulated. Nodes whose GPUs DRA serves (docs/dra.md)
count as the controller counts them, from the ResourceSlices,
DeviceClasses and ResourceClaims read with the rest (a snapshot file keeps
them); what DRA offers and does not count is listed.

A copy that would wait for room gets the preemption the controller would
make for it (decide.whatif: which node, which pods of lower priority), and
waits Preempting as the controller's would; nothing is evicted, the copies
after it see the victims terminating and the GPUs they free held for it.
Copies take the priority the API server would give them, from the cluster's
PriorityClasses (`admitted`). A snapshot file keeps neither the pods that
hold GPUs only through their claims nor pods' priorities: on one, whom
preemption would take cannot be told, and it is said so (`preemption_unseen`).

Nothing is written: the live read is GETs and lists only (a test proves it
from the API server's audit log). `run` and the renderers are pure; `main`
reads and prints.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import orjson
import urllib3
import yaml
from kubernetes import client

from gpuclaimctl.client import kube
from gpuclaimctl.client.errors import ApiError, NotFound
from gpuclaimctl.cmd import decisionview, snapshotfile, statusview
from gpuclaimctl.cmd.snapshotfile import SnapshotError, Taken
from gpuclaimctl.cmd.statusview import DraRow, StatusError, table
from gpuclaimctl.decide.whatif import ClusterObjects, Outcome, PreemptionRules, WhatIf, admitted, simulate
from gpuclaimctl.model.api import Strategy
from gpuclaimctl.model.snapshot import claim_holds_gpus, format_time
from gpuclaimctl.model.workloads import Manifests, ManifestError, Workload, copies, read_manifests

Obj = dict[str, Any]


@dataclass(frozen=True)
class Simulation:
    source: str  # "the live cluster" or "snapshot FILE"
    taken_at: datetime
    counts: Mapping[str, int]  # nodes (draNodes: those DRA serves GPUs on), classes, claims after the edits
    edits: tuple[str, ...]
    results: tuple[tuple[Workload, tuple[Outcome, ...]], ...]
    skipped: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    dra: tuple[DraRow, ...] = ()  # devices DRA offers of the classes' resources that are not counted

    @property
    def placed(self) -> int:
        return sum(1 for _, outs in self.results for o in outs if o.placed is not None)

    @property
    def total(self) -> int:
        return sum(len(outs) for _, outs in self.results)


def read_files(texts: Sequence[tuple[str, str]], namespace: str, replicas: int | None) -> Manifests:
    """The manifests of YAML or JSON files, given as (source, text), each
    with any number of documents."""
    docs: list[Any] = []
    for source, text in texts:
        try:
            docs += yaml.safe_load_all(text)
        except yaml.YAMLError as e:
            first = (str(e).strip().splitlines() or ["invalid YAML"])[0]
            raise ManifestError(f"{source} is not YAML or JSON: {first}") from None
    manifests = read_manifests(docs, namespace, replicas)
    if not manifests.workloads:
        where = ", ".join(source for source, _ in texts)
        raise ManifestError(f"{where}: no Pod, Deployment, ReplicaSet, StatefulSet, Job or CronJob")
    return manifests


def edit(taken: Taken, add: Sequence[Obj], without: Sequence[str],
         manifests: Manifests) -> tuple[Taken, tuple[str, ...]]:
    """The snapshot with nodes removed, then added, then the file's own
    objects applied; and what was done, for the report."""
    objects, done = taken.objects, []
    if without:
        objects = snapshotfile.without_nodes(objects, without)
        done += [f"removed node {n}" for n in without]
    if add:
        objects = snapshotfile.with_nodes(objects, add)
        done += [f"added node {n['metadata']['name']} "
                 f"({decisionview.gpus({r: int(v) for r, v in n['status']['allocatable'].items()})})"
                 for n in add]
    if manifests.objects:
        objects = snapshotfile.with_applied(objects, manifests.objects)
        for plural, objs in sorted(manifests.objects.items()):
            done += [f"applied {plural} {_ref(o)}" for o in objs]
    return dataclasses.replace(taken, objects=objects), tuple(done)


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


def run(manifests: Manifests, taken: Taken, source: str, edits: Sequence[str],
        strategy: Strategy = Strategy.BINPACK, preemption: PreemptionRules | None = decisionview.PREEMPTION,
        priority_classes: Sequence[Obj] = ()) -> Simulation:
    """Decide every copy of every workload, in file order, on `taken` as
    of its time; each copy with the priority its PriorityClass gives it,
    and, given the controller's `preemption` rules, the preemption it would
    make. Pure."""
    now = taken.taken_at
    if preemption is not None and not preemption.off and source != LIVE:
        unseen = preemption_unseen(taken.objects)
        if unseen:
            preemption = dataclasses.replace(preemption, off=unseen)
    served = snapshotfile.dra_served(taken.objects, taken.dra)
    world = WhatIf(taken.objects, strategy, preemption, served)
    results = []
    warnings = list(taken.warnings)
    for workload in manifests.workloads:
        pods = []
        for made in copies(workload, now):
            pod, problem = admitted(made, priority_classes)
            pods.append(pod)
            if problem and f"{workload.ref}: {problem}" not in warnings:
                warnings.append(f"{workload.ref}: {problem}")
        results.append((workload, tuple(simulate(world, pods, now))))
    offers = served.offers if served is not None else {}
    counts = {"nodes": len(taken.objects.nodes), "draNodes": sum(1 for nd in offers.values() if nd.offers),
              "classes": len(taken.objects.classes), "claims": len(taken.objects.claims)}
    resources = {c.resource_name for c in world.cluster.classes.values()}
    return Simulation(source, now, counts, tuple(edits), tuple(results), manifests.skipped, tuple(warnings),
                      tuple(decisionview.not_counted(offers, resources)))


def preemption_unseen(objects: ClusterObjects) -> str:
    """Why `objects` cannot show whom preemption would take ("" if they
    can): a pod that a claim holding GPUs reserves is not among them, or is
    without its spec.priority (which the API server always sets), as in a
    file `gpuclaimctl snapshot` wrote."""
    pods = {str((p.get("metadata") or {}).get("uid") or ""): p for p in objects.pods}
    for claim in objects.claims:
        if not claim_holds_gpus(claim):
            continue
        for ref in (claim.get("status") or {}).get("reservedFor") or ():
            pod = pods.get(str(ref.get("uid") or ""))
            if pod is None or "priority" not in (pod.get("spec") or {}):
                return PREEMPTION_UNSEEN
    return ""


PREEMPTION_UNSEEN = ("not simulated: the snapshot lacks the pods its GPU claims serve, or their priorities "
                     "(gpuclaimctl snapshot leaves them out), so whom preemption would take cannot be told")


# --- text ------------------------------------------------------------------------------


def _result(o: Outcome) -> tuple[str, str, str]:
    """(RESULT, NODE, MESSAGE) of one copy."""
    if o.invalid:
        return "InvalidClaims", "-", o.invalid
    assert o.explanation is not None
    d = o.explanation.decision
    if o.placed is not None:
        return "placed", o.placed.node, o.placed.message
    return str(getattr(d, "reason", "")), "-", d.message


def _name(o: Outcome) -> str:
    return str((o.pod.get("metadata") or {}).get("name", ""))


def render_text(sim: Simulation) -> str:
    c = sim.counts
    dra = f", {c['draNodes']} served by DRA" if c.get("draNodes") else ""
    lines = [f"Simulated on {sim.source} as of {format_time(sim.taken_at)} ({_count(c['nodes'], 'node')}{dra}, "
             f"{_count(c['classes'], 'GPUClass')}, {_count(c['claims'], 'GPUClaim')}); nothing was written."]
    if sim.edits:
        lines.append("Edits: " + "; ".join(sim.edits) + ".")
    for workload, outs in sim.results:
        lines += ["", f"{workload.ref}: {len(outs)} {'copy' if len(outs) == 1 else 'copies'}"]
        if not outs:
            continue
        lines += table(("COPY", "POD", "RESULT", "NODE", "MESSAGE"),
                       [(i, _name(o), *_result(o)) for i, o in enumerate(outs, 1)])
        preempting = [(i, o, o.preemption) for i, o in enumerate(outs, 1) if o.preemption is not None]
        if preempting:
            lines += ["", "Preemption for the copies that would wait for room (nothing is evicted here):",
                      *table(("COPY", "POD", "PRIORITY", "NODE", "VICTIMS"),
                             [(i, _name(o), w.priority, w.plan.node if w.plan is not None else "-",
                               decisionview.victims_text(w.plan) if w.plan is not None else w.note)
                              for i, o, w in preempting])]
        first = next((o for o in outs if o.placed is None and o.explanation is not None), None)
        if first is not None and first.explanation is not None:
            lines += ["", f"Why {_name(first)} would wait, node by node (FREE: after the copies before it):",
                      *decisionview.node_lines(first.explanation)]
    if sim.dra:
        lines += ["", *decisionview.dra_lines(sim.dra)]
    lines += ["", f"{sim.placed} of {sim.total} {'copy' if sim.total == 1 else 'copies'} placed.",
              decisionview.NOT_SEEN_NOTE if sim.source == LIVE else SNAPSHOT_NOTE]
    if any(o.preemption is not None for _, outs in sim.results for o in outs):
        lines.append(decisionview.PREEMPTION_NOTE)
    if sim.skipped:
        lines.append("Not simulated (not a pod or workload): " + ", ".join(sim.skipped))
    lines += [f"warning: {w}" for w in sim.warnings]
    return "\n".join(lines) + "\n"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("s") else "s")


LIVE = "the live cluster"
SNAPSHOT_NOTE = ("Computed on a saved snapshot as of its time: what changed since, and placements in "
                 "flight when it was taken, are not in it.")


# --- JSON ------------------------------------------------------------------------------


def render_json(sim: Simulation) -> str:
    workloads = []
    for workload, outs in sim.results:
        rows = []
        for o in outs:
            row: dict[str, Any] = {"pod": _name(o)}
            if o.invalid:
                row.update(result="waiting", reason="InvalidClaims", message=o.invalid)
            else:
                assert o.explanation is not None
                row.update(decisionview.decision_json(o.explanation.decision))
                if o.placed is None:
                    row["nodes"] = decisionview.nodes_json(o.explanation)
                if o.preemption is not None:
                    row["preemption"] = decisionview.preemption_json(o.preemption)
            rows.append(row)
        workloads.append({"kind": workload.kind, "namespace": workload.namespace, "name": workload.name,
                          "copies": rows})
    doc = {"source": sim.source, "takenAt": format_time(sim.taken_at), "counts": dict(sim.counts),
           "edits": list(sim.edits), "workloads": workloads, "placed": sim.placed, "total": sim.total,
           "draNotCounted": decisionview.dra_json(sim.dra),
           "note": decisionview.NOT_SEEN_NOTE if sim.source == LIVE else SNAPSHOT_NOTE,
           "skipped": list(sim.skipped), "warnings": list(sim.warnings)}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


# --- I/O -------------------------------------------------------------------------------


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(files: Sequence[str], *, replicas: int | None, snapshot: str | None, add: Sequence[Obj],
         without: Sequence[str], namespace: str, kubeconfig: str | None, context: str | None,
         output: str, strategy: Strategy, preemption: bool = True) -> int:
    def fail(message: str) -> int:
        click.echo(f"gpuclaimctl simulate: {message}", err=True)
        return 1

    try:
        texts = [("stdin" if f == "-" else f, _read_text(f)) for f in files]
        manifests = read_files(texts, namespace, replicas)
        priority_classes: list[Obj] = []
        if snapshot is not None:
            taken = snapshotfile.loads(_read_text(snapshot), snapshot)
            source = f"snapshot {snapshot}"
        else:
            api = statusview.load_client(kubeconfig, context)
            with api:
                # Untrimmed: the pods' priorities, gangs and deletions are
                # what preemption reads (trimming keeps placement's fields).
                taken = snapshotfile.read_live(api, datetime.now(timezone.utc), trimmed=False)
                priority_classes, problem = _priority_classes(api)
            if problem:
                taken = dataclasses.replace(taken, warnings=(*taken.warnings, problem))
            source = LIVE
        taken, edits = edit(taken, add, without, manifests)
    except (ManifestError, SnapshotError, StatusError) as e:
        return fail(str(e))
    except OSError as e:
        if e.filename is not None:
            return fail(f"cannot read {e.filename}: {e.strerror}")
        return fail(f"cannot reach the API server: {e}")
    except ApiError as e:
        return fail(f"the API server refused a read: {e}")
    except urllib3.exceptions.HTTPError as e:
        return fail(f"cannot reach the API server: {e}")
    sim = run(manifests, taken, source, edits, strategy, decisionview.preemption_rules(preemption),
              priority_classes)
    click.echo(render_json(sim) if output == "json" else render_text(sim), nl=False)
    return 0


def _priority_classes(api: client.ApiClient) -> tuple[list[Obj], str]:
    """The cluster's PriorityClasses (GET only), and a warning if they
    cannot be read (then copies are taken at priority 0)."""
    try:
        return kube.list_all(api, "/apis/scheduling.k8s.io/v1/priorityclasses"), ""
    except NotFound:
        return [], ""
    except ApiError as e:
        return [], (f"PriorityClasses could not be listed ({e.status} {e.reason}): copies are taken at "
                    "priority 0 unless they set one")
