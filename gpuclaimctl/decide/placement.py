"""Where a pod's whole set of GPU claims goes (DESIGN.md §4): THE decision.

`decide` takes a plain snapshot (gpuclaimctl.model.snapshot) — the pod, its
claims, the nodes and classes (`Cluster`), the GPUs already in use per node (`Usage`) and `now` — and
returns `Placed` (one node and what to do with each claim) or `Waiting`
(a reason from `WaitReason`, a message a person can act on, and each
claim's own reason).

Pure: no client, no clock (`now` is passed in), no globals; nothing here
writes or reads the API. `Cluster` memoises per-class node indexes, and
the view's usage carries its node index (decide.nodeindex), both invisible
to callers except in speed: the index gives the node the scan would.

Rules, in the order they are applied:
1. Every entry must resolve to a live claim not used by another pod, of a
   class that exists and is not being deleted (ClaimMissing, NameTaken,
   ClaimInUse, ClassNotFound, ClassDeleting).
2. Claims already Bound keep the set on their node ("anchor"), so a Retain
   claim brings its next pod back. A claim kept where it is keeps the
   resource it was bound with (`ClaimState.held_resource`); one that moves
   or binds takes its class's resource now, checked for room like any. An anchor on a cordoned node whose
   claims' class says onCordon Stay holds the set there; one with Move, or
   one the pod cannot use any more (rejected, affinity, class selector), or
   a node that is gone, lets its claims move with the set; so does an
   anchor without room for the rest of the set when another node has room
   for all of it (issue 10, item 7). A NotReady
   anchor makes the set wait: its claim becomes Lost after a grace period
   (the claim sync decides) and is then placed again like a new one.
3. Otherwise every node offering all the set's classes is a candidate. It
   must be Ready, not cordoned, not rejected for the set, admit the pod
   (nodeSelector, required affinity, taints, and the node affinity of the
   PersistentVolumes its volume claims are bound to) and have enough free
   GPUs per resource for the claims not already on it. Among those, binpack picks
   the most allocated node afterwards (upstream MostAllocated), spread the
   least; then fewer (binpack) or more (spread) GPUs left free; then name.
"""


from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from gpuclaimctl.decide.budget import check_budgets, new_asks
from gpuclaimctl.decide.capacity import free_on, shortfall
from gpuclaimctl.decide.nodeindex import IndexedUsage
from gpuclaimctl.model.api import OnCordon, Phase, ReclaimPolicy, Strategy, WaitReason
from gpuclaimctl.model.budgets import NO_BUDGET_USE, BudgetInfo, BudgetUse
from gpuclaimctl.model.nodeaffinity import Mismatch, Taint, VolumeConstraint, untolerated_taint
from gpuclaimctl.model.resources import requests_beyond_claims
from gpuclaimctl.model.snapshot import (
    NO_USE,
    ClaimState,
    ClassInfo,
    Cluster,
    NodeInfo,
    Offer,
    PodInfo,
    Rejection,
    UnresolvedClaim,
    Usage,
)

# --- decision ---------------------------------------------------------------


class Action(StrEnum):
    KEEP = "Keep"  # already Bound on the node
    BIND = "Bind"  # Pending: bind to the node
    MOVE = "Move"  # Lost, or Bound elsewhere: bind to the node instead


@dataclass(frozen=True)
class ClaimAction:
    claim: str
    uid: str
    action: Action
    node: str
    resource: str
    count: int
    from_node: str = ""


@dataclass(frozen=True)
class Placed:
    node: str
    claims: tuple[ClaimAction, ...]
    message: str

    def new_gpus(self) -> Iterator[ClaimAction]:
        """The claims that take GPUs on `node` they do not hold yet: what the
        caller records as in flight."""
        return (a for a in self.claims if a.action is not Action.KEEP)


@dataclass(frozen=True)
class ClaimWait:
    reason: WaitReason
    message: str


@dataclass(frozen=True)
class Waiting:
    reason: WaitReason
    message: str
    # claim name -> why that claim waits (its own problem, or the set's).
    claims: Mapping[str, ClaimWait]


Decision = Placed | Waiting

# When several claims have problems, the set reports the first of these: a
# claim that is not there hides everything about its class.
_CLAIM_REASON_ORDER = (
    WaitReason.CLAIM_MISSING,
    WaitReason.NAME_TAKEN,
    WaitReason.CLAIM_IN_USE,
    WaitReason.CLASS_NOT_FOUND,
    WaitReason.CLASS_DELETING,
)


def decide(
    pod: PodInfo,
    claims: Sequence[ClaimState | UnresolvedClaim],
    cluster: Cluster,
    used: Usage,
    now: datetime,
    strategy: Strategy = Strategy.BINPACK,
    budgets: Sequence[BudgetInfo] | None = (),
    budget_use: BudgetUse = NO_BUDGET_USE,
) -> Decision:
    """Place the pod's whole set of claims on one node, or say why it waits.

    Pure: no client, no clock, no globals. `used` must count every claim
    Bound on a node (this set's too), the requests of pods without claims
    still on their node, and every in-flight placement; a claim of this set
    with an in-flight placement is passed as Bound on that node, so it is
    kept there rather than placed twice.

    `budgets` are the GPUBudgets of the pod's namespace (None: they cannot
    be read yet), `budget_use` what counts against them (held and in
    flight); the set is checked against them, as a whole, before a node is
    chosen (decide.budget).
    """
    if not claims:
        raise ValueError("decide needs at least one claim")
    states, problem = _check_claims(pod, claims, cluster)
    if problem is not None:
        return problem
    asks = new_asks(states)
    if asks and budgets is None:
        return _whole_set_waits(claims, WaitReason.BUDGETS_UNKNOWN,
                                "the GPUBudgets of the namespace cannot be read yet; nothing new is "
                                "placed in it until they can")
    refusal = check_budgets(budgets or (), budget_use, asks)
    if refusal is not None:
        return _whole_set_waits(claims, WaitReason.BUDGET, refusal.message)
    return _Placer(pod, states, cluster, used, now, strategy).run()


def _whole_set_waits(claims: Sequence[ClaimState | UnresolvedClaim], reason: WaitReason,
                     message: str) -> Waiting:
    return Waiting(reason, message, {c.name: ClaimWait(reason, message) for c in claims})


def _check_claims(
    pod: PodInfo, claims: Sequence[ClaimState | UnresolvedClaim], cluster: Cluster
) -> tuple[list[ClaimState], Waiting | None]:
    states: list[ClaimState] = []
    problems: dict[str, ClaimWait] = {}
    for c in claims:
        if isinstance(c, UnresolvedClaim):
            problems[c.name] = ClaimWait(c.reason, c.message)
            continue
        states.append(c)
        others = [r for r in c.reserved_for if r.uid != pod.uid]
        cls = cluster.classes.get(c.class_name)
        if c.deleting:
            problems[c.name] = ClaimWait(WaitReason.CLAIM_MISSING, f"GPUClaim {c.name} is being deleted")
        elif others:
            problems[c.name] = ClaimWait(
                WaitReason.CLAIM_IN_USE,
                f"GPUClaim {c.name} is in use by pod {others[0].name}; a claim serves one pod at a time",
            )
        elif cls is None:
            problems[c.name] = ClaimWait(
                WaitReason.CLASS_NOT_FOUND, f"GPUClass {c.class_name} of GPUClaim {c.name} does not exist"
            )
        elif cls.deleting:
            problems[c.name] = ClaimWait(
                WaitReason.CLASS_DELETING,
                f"GPUClass {c.class_name} of GPUClaim {c.name} is being deleted and takes no new claims",
            )
    if not problems:
        return states, _requests_beyond_claims(pod, states, cluster)
    reason = min((w.reason for w in problems.values()), key=_CLAIM_REASON_ORDER.index)
    message = "; ".join(
        w.message for w in sorted(problems.values(), key=lambda w: _CLAIM_REASON_ORDER.index(w.reason))
    )
    per_claim = {
        c.name: problems.get(c.name) or ClaimWait(reason, f"waits for the rest of its set: {message}")
        for c in claims
    }
    return states, Waiting(reason, message, per_claim)


def _requests_beyond_claims(pod: PodInfo, states: Sequence[ClaimState], cluster: Cluster) -> Waiting | None:
    """The set waits if the pod's containers request more of a class's
    resource than its claims hold of it: kube-scheduler and the device
    plugin count the requests, so the node chosen for the claims could not
    run the pod, and the excess would be GPUs no claim (and no budget)
    counts. The webhook refuses such a pod at create when it can tell; this
    catches the rest (no webhook, a template that did not exist yet)."""
    if not pod.requests:
        return None
    held: dict[str, int] = {}
    parts: dict[str, list[str]] = {}
    for c in states:
        resource = c.held_resource(cluster.classes) if c.bound else cluster.classes[c.class_name].resource_name
        held[resource] = held.get(resource, 0) + c.count
        parts.setdefault(resource, []).append(f"{c.name}: {c.count} {c.class_name}")
    counted = {cls.resource_name for cls in cluster.classes.values()}
    refusal = requests_beyond_claims(pod.requests, held, counted, parts)
    return None if refusal is None else _whole_set_waits(states, WaitReason.INVALID_CLAIMS, refusal)


class _Placer:
    """One decision's working state; lives for one `decide` call."""

    def __init__(
        self,
        pod: PodInfo,
        claims: list[ClaimState],
        cluster: Cluster,
        used: Usage,
        now: datetime,
        strategy: Strategy,
    ) -> None:
        self.pod = pod
        self.claims = claims
        self.cluster = cluster
        self.used = used
        self.strategy = strategy
        self.rejected: dict[str, Rejection] = {}
        for c in claims:
            for r in c.rejected:
                if r.until > now:
                    self.rejected.setdefault(r.node_name, r)
        self.set_desc = describe(claims)

    # -- helpers --

    def cls(self, claim: ClaimState) -> ClassInfo:
        return self.cluster.classes[claim.class_name]

    def need_on(self, node_name: str) -> dict[str, int]:
        """GPUs per resource the set still needs on `node_name`."""
        need: dict[str, int] = {}
        for c in self.claims:
            if c.bound and c.node_name == node_name:
                continue
            r = self.cls(c).resource_name
            need[r] = need.get(r, 0) + c.count
        return need

    def free(self, node: NodeInfo, resource: str) -> int:
        return node.allocatable.get(resource, 0) - self.used.get(resource, NO_USE).get(node.name, 0)

    def wait(self, reason: WaitReason, message: str) -> Waiting:
        per = ClaimWait(reason, message)
        return Waiting(reason, message, {c.name: per for c in self.claims})

    def placed(self, node: str, message: str) -> Placed:
        actions = []
        for c in self.claims:
            if c.bound and c.node_name == node:
                # It stays: what it holds there is what it was bound with,
                # whatever its class says now (a class edited or recreated
                # under another resource): rewriting it would count its GPUs
                # under a resource nothing checked for room (I1).
                action, source, resource = Action.KEEP, "", c.held_resource(self.cluster.classes)
            elif c.bound or c.phase is Phase.LOST:
                action, source, resource = Action.MOVE, c.node_name, self.cls(c).resource_name
            else:
                action, source, resource = Action.BIND, "", self.cls(c).resource_name
            actions.append(ClaimAction(c.name, c.uid, action, node, resource, c.count, source))
        return Placed(node, tuple(actions), message)

    # -- the decision --

    def run(self) -> Decision:
        anchors: dict[str, list[ClaimState]] = {}
        for c in self.claims:
            if c.bound:
                anchors.setdefault(c.node_name, []).append(c)
        if not anchors:
            return self.search(moved_from_cordon=())

        stay: list[str] = []
        not_ready: list[str] = []
        valid: list[str] = []
        cordoned: list[str] = []
        for name in sorted(anchors):
            node = self.cluster.nodes.get(name)
            held = anchors[name]
            if node is None:
                continue  # gone: its claims move with the set
            if node.unschedulable:
                if any(self.cls(c).on_cordon is OnCordon.STAY for c in held):
                    stay.append(name)
                else:
                    cordoned.append(name)
            elif not node.ready:
                not_ready.append(name)
            elif (
                name not in self.rejected
                and self.pod.rules.admits(name, node.labels, node.blocking_taints)
                and all(self.cls(c).selects(node) for c in held)
            ):
                valid.append(name)
        if stay:
            return self.stay(stay, anchors)
        if not_ready:
            held = [c for n in not_ready for c in anchors[n]]
            return self.wait(
                WaitReason.CAPACITY,
                f"{describe(held)} bound to node {', '.join(not_ready)}, which is not Ready; the set waits "
                f"for the node, or for the claim to be marked Lost and placed again",
            )
        if valid:
            kept = self.keep(valid, anchors)
            if isinstance(kept, Placed):
                return kept
            # No node holding part of the set has room for the rest: the
            # whole set may still fit together elsewhere (its bound claims
            # move with it) rather than wait for the anchor forever.
            moved = self.search(moved_from_cordon=())
            if isinstance(moved, Placed) or moved.reason is WaitReason.UNSATISFIABLE:
                return moved  # placed elsewhere; or no node, its own neither, can ever hold it
            return kept
        return self.search(moved_from_cordon=cordoned)

    def stay(self, stay: list[str], anchors: dict[str, list[ClaimState]]) -> Decision:
        if len(stay) > 1:
            return self.wait(
                WaitReason.CORDONED,
                f"{self.set_desc}: claims of classes with onCordon Stay are held on cordoned nodes "
                f"{', '.join(stay)}; the set cannot be gathered on one node",
            )
        name = stay[0]
        node = self.cluster.nodes[name]
        held = anchors[name]
        rest = [c for c in self.claims if not (c.bound and c.node_name == name)]
        if rest:
            return self.wait(
                WaitReason.CORDONED,
                f"{describe(held)} stays on cordoned node {name} (onCordon Stay); {describe(rest)} "
                f"cannot be bound on a cordoned node, so the set waits for {name} to be uncordoned",
            )
        if not node.ready:
            return self.wait(
                WaitReason.CORDONED,
                f"{self.set_desc} stays on node {name} (onCordon Stay), which is cordoned and not Ready",
            )
        mismatch = self.pod.rules.mismatch(name, node.labels, node.blocking_taints)
        if mismatch is not None:
            volume = self.pod.rules.unreachable_volume(node.labels) if mismatch is Mismatch.VOLUME else None
            why = f"which {volume} cannot reach" if volume else f"which the pod's {mismatch} excludes"
            return self.wait(WaitReason.NODE_AFFINITY, f"{self.set_desc} stays on node {name} (onCordon Stay), {why}")
        if name in self.rejected:
            return self.wait(WaitReason.NODE_REJECTED, self.rejected_message(self.set_desc, [name]))
        return self.placed(
            name, f"{self.set_desc} stays on cordoned node {name} (onCordon Stay); the pod waits for it there"
        )

    def keep(self, valid: list[str], anchors: dict[str, list[ClaimState]]) -> Decision:
        """The set goes to one of the nodes that already hold its claims."""
        best: tuple[Any, ...] | None = None
        best_name = ""
        shortfalls: list[str] = []
        for name in valid:
            node = self.cluster.nodes[name]
            missing = [
                c for c in self.claims
                if not (c.bound and c.node_name == name) and not self.cls(c).offered_by(node)
            ]
            if missing:
                shortfalls.append(f"node {name} does not offer the class of {describe(missing)}")
                continue
            need = self.need_on(name)
            free = free_on(node.allocatable, self.used, name)
            short = [(r, need[r], free.get(r, 0)) for r in sorted(shortfall(need, free))]
            if short:
                shortfalls.append(
                    f"node {name} has "
                    + ", ".join(f"{max(f, 0)} free {r} where {n} are needed" for r, n, f in short)
                )
                continue
            in_place = sum(c.count for c in anchors[name])
            key = (in_place, self.score(node, need))
            if best is None or key > best:
                best, best_name = key, name
        if best is not None:
            return self.placed(
                best_name, f"{self.set_desc} placed on node {best_name}, where {describe(anchors[best_name])} is bound"
                f"{by_dra(self.cluster.nodes.get(best_name), self.need_on(''))}"
            )
        held = [c for n in valid for c in anchors[n]]
        retain = " (reclaimPolicy Retain)" if any(c.reclaim_policy is ReclaimPolicy.RETAIN for c in held) else ""
        reason = WaitReason.CAPACITY if any(" free " in s for s in shortfalls) else WaitReason.NODE_AFFINITY
        return self.wait(
            reason,
            f"{describe(held)}{retain} bound to node {', '.join(valid)} keeps the set there, but "
            + "; ".join(shortfalls),
        )

    def score(self, node: NodeInfo, need: Mapping[str, int]) -> tuple[float, int]:
        """Larger is better under the strategy."""
        frac = 0.0
        free_after = 0
        for r, n in need.items():
            alloc = node.allocatable.get(r, 0)
            use = self.used.get(r, NO_USE).get(node.name, 0) + n
            frac += use / alloc if alloc > 0 else 1.0
            free_after += alloc - use
        if need:
            frac /= len(need)
        if self.strategy is Strategy.SPREAD:
            return (-frac, free_after)
        return (frac, -free_after)

    def search(self, moved_from_cordon: Sequence[str]) -> Decision:
        """Every node offering all the set's classes competes. The hot loop
        of the controller. A set needing one resource, decided on the
        view's usage, asks the node index (the nodes in score order, the
        pod's rules checked until one admits it); otherwise every node is
        looked at: capacity first (cheapest, and in a busy cluster the test
        most nodes fail), the pod's rules only for a node that would beat
        the best so far."""
        need = self.need_on("")  # nothing stays: every claim needs GPUs
        class_names = tuple(sorted({c.class_name for c in self.claims}))
        offer = self.cluster.offer(class_names)
        admits = self.pod.rules.admits
        rejected = self.rejected
        spread = self.strategy is Strategy.SPREAD
        # Best so far, larger is better: (fraction allocated afterwards,
        # GPUs left free afterwards), each negated as the strategy wants.
        best_frac = best_slack = -math.inf
        best_name = ""

        if len(need) == 1:
            # The common case: one resource. The view's usage comes with
            # its node index (decide.nodeindex), which walks the nodes in
            # score order and stops at the first the pod admits: the same
            # node as the scan, which is used where the index cannot say.
            ((resource, n),) = need.items()
            used = self.used
            index = None
            found = None
            if isinstance(used, IndexedUsage):
                index = used.current(self.cluster)
                if index is not None:
                    found = index.best(class_names, resource, n, spread, used.extra(resource), rejected, admits)
            if found is None:
                best_name = self.scan(offer, resource, n)
            else:
                best_name = found
                if index is not None and index.verify is not None:
                    index.verify(found, self.scan(offer, resource, n),
                                 f"pod {self.pod.namespace}/{self.pod.name} needs {n} {resource} "
                                 f"of {', '.join(class_names)} ({self.strategy.value})")
        else:
            checks = [(r, n, self.used.get(r, NO_USE).get) for r, n in sorted(need.items())]
            for name, _, node in offer.usable:
                allocatable = node.allocatable
                total = 0.0
                free_after = 0
                for r, n, use in checks:
                    alloc = allocatable.get(r, 0)
                    after = use(name, 0) + n
                    if after > alloc:
                        break
                    total += after / alloc
                    free_after += alloc - after
                else:
                    frac = total / len(checks)
                    if spread:
                        frac, slack = -frac, free_after
                    else:
                        slack = -free_after
                    if frac < best_frac or (frac == best_frac and slack <= best_slack):
                        continue
                    if (rejected and name in rejected) or not admits(name, node.labels, node.blocking_taints):
                        continue
                    best_frac, best_slack, best_name = frac, slack, name

        if best_name:
            return self.placed(best_name, f"{self.set_desc} placed on node {best_name}"
                               f"{by_dra(self.cluster.nodes.get(best_name), need)}")
        return self.explain(offer, class_names, need, moved_from_cordon)

    def scan(self, offer: Offer, resource: str, n: int) -> str:
        """search for a set needing `n` of one `resource`, node by node:
        capacity first, the pod's rules only for a node that would beat
        the best so far. The reference the node index is held equal to."""
        admits = self.pod.rules.admits
        rejected = self.rejected
        spread = self.strategy is Strategy.SPREAD
        best_frac = best_slack = -math.inf
        best_name = ""
        use = self.used.get(resource, NO_USE).get
        for name, alloc, node in offer.usable:
            after = use(name, 0) + n
            if after > alloc:
                continue
            if spread:
                frac, slack = -after / alloc, alloc - after
            else:
                frac, slack = after / alloc, after - alloc
            if frac < best_frac or (frac == best_frac and slack <= best_slack):
                continue
            if (rejected and name in rejected) or not admits(name, node.labels, node.blocking_taints):
                continue
            best_frac, best_slack, best_name = frac, slack, name
        return best_name

    def explain(
        self,
        offer: Offer,
        class_names: tuple[str, ...],
        need: Mapping[str, int],
        moved_from_cordon: Sequence[str],
    ) -> Waiting:
        """Why no node fits: the most useful of the reasons, with counts.

        Retried for every waiting pod whenever a node or claim changes, so
        it is kept to one cheap pass over the nodes; the pod's rules are
        checked only on nodes with room, on the fullest few, and until one
        node admits the pod.
        """
        if not offer.nodes:
            empty = [cn for cn in class_names if not self.cluster.offer((cn,)).nodes]
            if empty:
                return self.wait(WaitReason.UNSATISFIABLE,
                                 f"{self.set_desc}: no node offers GPUClass {', '.join(empty)}")
            return self.wait(
                WaitReason.UNSATISFIABLE,
                f"{self.set_desc}: no single node offers all of GPUClass {', '.join(class_names)}")
        classes = "GPUClass " + ", ".join(class_names)
        admits = self.pod.rules.admits
        rejected = self.rejected
        checks = [(r, n, self.used.get(r, NO_USE).get) for r, n in sorted(need.items())]

        # One pass: every node that is Ready and uncordoned either has room
        # (then the pod's rules or a rejection kept it out) or not (then it
        # is filed by how many GPUs it has free).
        roomy: list[tuple[str, NodeInfo]] = []
        by_free: dict[int, list[NodeInfo]] = {}
        full = n_rejected = 0
        single = len(checks) == 1
        _, n0, use0 = checks[0]
        for name, alloc, node in offer.usable:
            if single:
                free = alloc - use0(name, 0) - n0
            else:
                free = min(node.allocatable.get(r, 0) - use(name, 0) - n for r, n, use in checks)
            if rejected and name in rejected:
                n_rejected += 1
                if free >= 0:
                    roomy.append(("rejected", node))
            elif free >= 0:
                roomy.append(("excluded", node))
            else:
                full += 1
                bucket = by_free.get(free)
                if bucket is None:
                    by_free[free] = [node]
                else:
                    bucket.append(node)
        n_not_ready = n_cordoned = 0
        for node in offer.idle:
            what = "not Ready" if not node.ready else "cordoned"
            if what == "cordoned":
                n_cordoned += 1
            else:
                n_not_ready += 1
            if all(node.allocatable.get(r, 0) - use(node.name, 0) >= n for r, n, use in checks):
                roomy.append((what, node))

        def usable(node: NodeInfo) -> bool:
            return admits(node.name, node.labels, node.blocking_taints)

        roomy_but: Counter[str] = Counter()
        roomy_excluded = 0
        for what, node in roomy:
            if usable(node):
                roomy_but[what] += 1
            else:
                roomy_excluded += 1
        if not roomy_but and not any(usable(n) for n in offer.ordered):
            return self.no_node_suits(offer.ordered, classes)
        if not roomy_but:
            too_small = self.too_small(offer.ordered, need, usable)
            if too_small is not None:
                return too_small
        if roomy_but["rejected"]:
            names = [n.name for w, n in roomy if w == "rejected"]
            return self.wait(WaitReason.NODE_REJECTED, self.rejected_message(self.set_desc, names))

        needs = ", ".join(f"{n} {r}" for r, n, _ in checks)
        counts = ", ".join(
            f"{count} {label}"
            for count, label in (
                (full, "without enough free GPUs"),
                (n_not_ready, "not Ready"),
                (n_cordoned, "cordoned"),
                (n_rejected, "rejected for the set"),
            )
            if count
        )
        detail = f"of the {_nodes(len(offer.nodes))} offering {classes}, {counts}"
        # Bounded: a pod that few nodes admit must not make this a second
        # full pass; past the bound the message goes without the figure.
        budget = 256
        for free in sorted(by_free, reverse=True):
            candidates = by_free[free][:budget]
            budget -= len(candidates)
            near = next((n for n in candidates if usable(n)), None)
            if near is not None:
                short = ", ".join(
                    f"{max(near.allocatable.get(r, 0) - use(near.name, 0), 0)} {r}" for r, _, use in checks
                )
                detail += f"; the most free on a node the pod can use: {short} on {near.name}{by_dra(near, need)}"
                break
            if budget <= 0:
                break
        if roomy_excluded:
            detail += f"; {_nodes(roomy_excluded)} with room the pod's {self.excluders()} exclude"
        if moved_from_cordon:
            return self.wait(
                WaitReason.CORDONED,
                f"{self.set_desc} must leave cordoned node {', '.join(moved_from_cordon)} (onCordon Move) "
                f"and needs {needs} on one node; {detail}",
            )
        if roomy_but["cordoned"]:
            return self.wait(WaitReason.CORDONED, f"{self.set_desc} needs {needs} on one node; {detail}")
        return self.wait(WaitReason.CAPACITY, f"{self.set_desc} needs {needs} on one node; {detail}")

    def too_small(self, universe: Sequence[NodeInfo], need: Mapping[str, int],
                  usable: Callable[[NodeInfo], bool]) -> Waiting | None:
        """Unsatisfiable when no node the set may use -- offering its classes
        and admitting the pod, in any state (one not Ready or cordoned may
        come back) -- has as many GPUs allocatable as the whole set needs;
        None when one has. Allocatable first (cheap), the pod's rules only
        on nodes big enough, until one passes."""
        checks = sorted(need.items())
        if any(all(node.allocatable.get(r, 0) >= n for r, n in checks) and usable(node)
               for node in universe):
            return None
        needs = ", ".join(f"{n} {r}" for r, n in checks)
        largest = max((n for n in universe if usable(n)),
                      key=lambda n: (tuple(n.allocatable.get(r, 0) for r, _ in checks), n.name))
        has = ", ".join(f"{largest.allocatable.get(r, 0)} {r}" for r, _ in checks) + by_dra(largest, need)
        excluded = sum(1 for node in universe if all(node.allocatable.get(r, 0) >= n for r, n in checks))
        but = (f"; {_nodes(excluded)} that large the pod's {self.excluders()} exclude" if excluded else "")
        return self.wait(
            WaitReason.UNSATISFIABLE,
            f"{self.set_desc} needs {needs} on one node, and no node it may use has that many allocatable "
            f"(the largest: {has} on {largest.name}){but}; it waits for a larger node, or a smaller set")

    def excluders(self) -> str:
        return "nodeSelector, affinity, tolerations or volumes" if self.pod.rules.volumes else \
            "nodeSelector, affinity or tolerations"

    def no_node_suits(self, universe: Sequence[NodeInfo], classes: str) -> Waiting:
        rules = self.pod.rules
        mismatches: Counter[Mismatch] = Counter()
        example_taint: Taint | None = None
        # PV name -> nodes where it is the first volume the node cannot reach.
        unreached: Counter[str] = Counter()
        for node in universe:
            mismatch = rules.mismatch(node.name, node.labels, node.blocking_taints)
            if mismatch is not None:
                mismatches[mismatch] += 1
            if mismatch is Mismatch.TAINT and example_taint is None:
                example_taint = untolerated_taint(rules.tolerations, node.blocking_taints)
            elif mismatch is Mismatch.VOLUME:
                volume = rules.unreachable_volume(node.labels)
                if volume is not None:
                    unreached[volume.pv] += 1
        volumes = {v.pv: v for v in rules.volumes}
        if len(unreached) == 1 and set(mismatches) == {Mismatch.VOLUME}:
            # Every node offering the classes passes the pod's own rules
            # but not this volume's: say where the volume is.
            only = volumes[next(iter(unreached))]
            return self.wait(
                WaitReason.NODE_AFFINITY,
                f"{self.set_desc}: {only} is reachable only from {only.reach()}; none of them offers {classes}",
            )
        parts: list[str] = []
        for m in Mismatch:
            if not mismatches[m]:
                continue
            if m is Mismatch.VOLUME:
                parts += [_unreached(volumes[pv], n) for pv, n in unreached.most_common(_SHOWN_VOLUMES)]
            else:
                parts.append(f"{mismatches[m]} {_MISMATCH_TEXT[m]}"
                             + (f" ({example_taint})" if m is Mismatch.TAINT and example_taint else ""))
        return self.wait(
            WaitReason.NODE_AFFINITY,
            f"{self.set_desc}: none of the {_nodes(len(universe))} offering {classes} suits the pod: "
            + ", ".join(parts),
        )

    def rejected_message(self, set_desc: str, names: Sequence[str]) -> str:
        parts = []
        for name in sorted(names)[:3]:
            r = self.rejected[name]
            why = f": {r.reason}" if r.reason else ""
            parts.append(f"{name} until {r.until.isoformat()}{why}")
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return f"{set_desc}: the nodes with room refused the pod and are skipped for the set: " + "; ".join(
            parts
        ) + more


_MISMATCH_TEXT = {
    Mismatch.NODE_SELECTOR: "do not match its nodeSelector",
    Mismatch.NODE_AFFINITY: "do not match its required node affinity",
    Mismatch.TAINT: "have a taint it does not tolerate",
}

# Volumes a message names: it ends up in an event, whose note is capped at 1 kB.
_SHOWN_VOLUMES = 2


def _unreached(volume: VolumeConstraint, nodes: int) -> str:
    return f"{nodes} cannot reach {volume}, reachable only from {volume.reach()}"


def by_dra(node: NodeInfo | None, resources: Iterable[str]) -> str:
    """` (nvidia.com/gpu served by DRA, DeviceClass gpu.example.com)` for
    those of `resources` the node serves through DRA (docs/dra.md: its
    allocatable of them is the devices its ResourceSlices offer), for
    messages; "" for a node whose device plugin serves them."""
    if node is None or not node.dra:
        return ""
    parts = [f"{r} served by DRA, DeviceClass {node.dra[r]}" if node.dra[r] else
             f"{r} served by DRA, no DeviceClass kube-scheduler is sure to map" for r in sorted(resources)
             if r in node.dra]
    return f" ({'; '.join(parts)})" if parts else ""


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def describe(claims: Iterable[ClaimState]) -> str:
    """`GPUClaim a (2 × a100), b (1 × h100)` for messages."""
    items = [f"{c.name} ({c.count} × {c.class_name})" for c in claims]
    return ("GPUClaim " if len(items) == 1 else "GPUClaims ") + ", ".join(items)
