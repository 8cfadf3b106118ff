"""Nodes by class set and by free GPUs, so a decision looks at the nodes
that can win instead of scanning them all (DESIGN.md §4, issue 48).

`placement.decide`'s search picks, among the Ready, uncordoned nodes
offering every class of the set (`Offer.usable`), the one the pod's rules
admit with the best (fraction allocated afterwards, GPUs left free
afterwards) under the strategy, the first by name on a tie. For a set
needing one resource both figures depend on a node only through its
allocatable and its free GPUs of that resource, so nodes with the same
(allocatable, free) tie, and their order among themselves is by name. The
index keeps, per class set, every such node in a bucket keyed by
(allocatable, free), each bucket sorted by name: a decision ranks the few
buckets with room, walks them best first (buckets that score the same
merged by name) and stops at the first node the pod's rules admit. What
the scan would choose, checking the pod's rules only on nodes that would
win.

Owned by the cluster view (`state/view.py`), which tells it, under its
lock, each change as it applies it: `used_changed` for every change of the
usage it keeps (claims, pods: `UsageTracker` calls it), `follow` for every
node and class change (a new `Cluster`). Placements in flight, GPUs of
unknown resource and an older gang's hold are not indexed: they are laid
over it per decision (`IndexedUsage`), and the few nodes they touch are
scored exactly, beside the walk.

What a decision pays: the buckets with room ranked (a few dozen), the
nodes walked until one admits the pod, and every node something is laid
over (the placements in flight, summed afresh per decision: O(entries)).
What a usage change pays: moving one node between two buckets of each
class set of its resource. A class set's buckets are built on first use,
O(its nodes).

The index answers only for the usage and snapshot it was made with (same
generation, same `Cluster` object); otherwise, and for sets needing more
than one resource, placement scans (`IndexedUsage.current`). Not
thread-safe on its own: read and changed with its owner's lock held. Pure
otherwise: no client, no clock, no globals.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping

from gpuclaimctl.decide.capacity import with_unknown
from gpuclaimctl.model.api import UNKNOWN_RESOURCE
from gpuclaimctl.model.nodeaffinity import Taint
from gpuclaimctl.model.snapshot import NO_USE, Cluster, Usage

# The pod's rules: admits(node name, labels, blocking taints).
Admits = Callable[[str, Mapping[str, str], tuple[Taint, ...]], bool]


class _SetIndex:
    """The usable nodes of one class set, by (allocatable, free) of its
    resource. Invariant: `at[name]` is the node's (allocatable, free), and
    `buckets[at[name]]` holds `name`; every bucket is non-empty and sorted."""

    __slots__ = ("resource", "at", "buckets")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.at: dict[str, tuple[int, int]] = {}
        self.buckets: dict[tuple[int, int], list[str]] = {}

    def put(self, name: str, alloc: int, free: int) -> None:
        key = (alloc, free)
        self.at[name] = key
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = [name]
        else:
            insort(bucket, name)

    def drop(self, name: str) -> None:
        key = self.at.pop(name, None)
        if key is None:
            return
        bucket = self.buckets[key]
        del bucket[bisect_left(bucket, name)]
        if not bucket:
            del self.buckets[key]


class NodeIndex:
    """Per class set, its usable nodes by (allocatable, free GPUs)."""

    def __init__(self, used: Mapping[str, Mapping[str, int]]) -> None:
        # The owner's usage (claims and pods), live: resource -> node -> GPUs.
        # Never replaced by the owner; every change reaches `used_changed`.
        self._used = used
        # The snapshot the sets are of; None until the owner has one.
        self.cluster: Cluster | None = None
        # class names (sorted) -> its set, built on first use.
        self._sets: dict[tuple[str, ...], _SetIndex] = {}
        # Bumped by every change: an IndexedUsage made before one is stale.
        self.generation = 0
        # Debug (the simulation sets it): every indexed search is also run as
        # the full scan, and both answers are passed here with a description.
        self.verify: Callable[[str, str, str], None] | None = None

    # -- changes (the owner's lock held) ----------------------------------------------

    def follow(self, cluster: Cluster | None, *, was: Cluster | None = None, changed: str = "") -> None:
        """The owner's snapshot is now `cluster`. With `was` and `changed`:
        it is `was` with node `changed` added, replaced or removed
        (`Cluster.with_node`, `without_node`), and the sets are patched for
        that node if they are of `was`; otherwise they are dropped and built
        again when next asked for."""
        if cluster is self.cluster:
            return
        self.generation += 1
        if cluster is None or not changed or was is None or was is not self.cluster:
            self.cluster = cluster
            self._sets.clear()
            return
        self.cluster = cluster
        for class_names, s in self._sets.items():
            s.drop(changed)
            node = cluster.offer(class_names).nodes.get(changed)
            if node is not None and node.ready and not node.unschedulable:
                alloc = node.allocatable.get(s.resource, 0)
                s.put(changed, alloc, alloc - self._used.get(s.resource, NO_USE).get(changed, 0))

    def used_changed(self, resource: str, node: str) -> None:
        """The owner's usage of `resource` on `node` has just changed."""
        self.generation += 1
        for s in self._sets.values():
            if s.resource != resource:
                continue
            at = s.at.get(node)
            if at is None:
                continue
            free = at[0] - self._used.get(resource, NO_USE).get(node, 0)
            if free != at[1]:
                s.drop(node)
                s.put(node, at[0], free)

    # -- reading (the owner's lock held) ------------------------------------------------

    def usage(self, cluster: Cluster, in_flight: dict[str, dict[str, int]],
              allocatable: Callable[[str], Mapping[str, int] | None]) -> IndexedUsage:
        """What a decision counts as used on `cluster`: the owner's usage,
        plus `in_flight` (resource -> node -> GPUs; taken, not copied), plus
        the GPUs of unknown resource counted under every resource their node
        offers (`capacity.with_unknown`, from `allocatable(node)`)."""
        self.follow(cluster)
        extra = {r: per for r, per in in_flight.items() if per}
        unknown = dict(self._used.get(UNKNOWN_RESOURCE, NO_USE))
        for node, count in extra.get(UNKNOWN_RESOURCE, NO_USE).items():
            unknown[node] = unknown.get(node, 0) + count
        if unknown:
            for r, per in with_unknown({UNKNOWN_RESOURCE: unknown}, allocatable).items():
                if r != UNKNOWN_RESOURCE:
                    _add_into(extra, r, per)
        return IndexedUsage(self, self._used, extra)

    def best(self, class_names: tuple[str, ...], resource: str, n: int, spread: bool,
             extra: Mapping[str, int], rejected: Mapping[str, object], admits: Admits) -> str | None:
        """The node `placement`'s search picks for a set of `class_names`
        needing `n` of `resource`, with `extra` used on top of the index's
        usage ("" if none fits and admits the pod); None if the index cannot
        say (the classes count another resource)."""
        cluster = self.cluster
        if cluster is None:
            return None
        s = self._sets.get(class_names)
        if s is None:
            s = self._sets[class_names] = self._build(cluster, class_names)
        if s.resource != resource:
            return None
        nodes = cluster.nodes
        # The buckets with room, best first, as search scores them (the
        # same arithmetic, so the same floats).
        ranked: list[tuple[float, int, list[str]]] = []
        for (alloc, free), names in s.buckets.items():
            if free < n:
                continue
            after = alloc - free + n
            if spread:
                ranked.append((-after / alloc, alloc - after, names))
            else:
                ranked.append((after / alloc, after - alloc, names))
        ranked.sort(key=lambda b: (b[0], b[1]), reverse=True)
        best_frac = best_slack = -float("inf")
        best_name = ""
        i = 0
        while i < len(ranked):
            frac, slack, names = ranked[i]
            j = i + 1
            while j < len(ranked) and ranked[j][0] == frac and ranked[j][1] == slack:
                j += 1
            # Buckets that score the same are one tie: by name across them.
            tied: Iterable[str] = names if j == i + 1 else heapq.merge(*(b[2] for b in ranked[i:j]))
            for name in tied:
                if name in extra or (rejected and name in rejected):
                    continue  # scored below with what is laid over; or skipped for the set
                node = nodes[name]
                if admits(name, node.labels, node.blocking_taints):
                    best_frac, best_slack, best_name = frac, slack, name
                    break
            if best_name:
                break
            i = j
        # The nodes something is laid over, each scored exactly.
        at = s.at
        base = self._used.get(resource, NO_USE)
        for name, more in extra.items():
            member = at.get(name)
            if member is None:
                continue
            alloc = member[0]
            after = base.get(name, 0) + more + n
            if after > alloc:
                continue
            if spread:
                frac, slack = -after / alloc, alloc - after
            else:
                frac, slack = after / alloc, after - alloc
            if frac < best_frac or (frac == best_frac and (slack < best_slack or (
                    slack == best_slack and name > best_name))):
                continue
            node = nodes[name]
            if (rejected and name in rejected) or not admits(name, node.labels, node.blocking_taints):
                continue
            best_frac, best_slack, best_name = frac, slack, name
        return best_name

    def _build(self, cluster: Cluster, class_names: tuple[str, ...]) -> _SetIndex:
        s = _SetIndex(cluster.classes[class_names[0]].resource_name)
        used = self._used.get(s.resource, NO_USE)
        buckets = s.buckets
        for name, alloc, _ in cluster.offer(class_names).usable:  # by name: buckets come out sorted
            key = (alloc, alloc - used.get(name, 0))
            s.at[name] = key
            bucket = buckets.get(key)
            if bucket is None:
                buckets[key] = [name]
            else:
                bucket.append(name)
        return s

    def buckets(self, class_names: tuple[str, ...]) -> dict[tuple[int, int], list[str]] | None:
        """A copy of a built set's buckets, for tests; None if not built."""
        s = self._sets.get(class_names)
        return None if s is None else {k: list(v) for k, v in s.buckets.items()}


class IndexedUsage(Mapping[str, Mapping[str, int]]):
    """resource -> node -> GPUs used: the index's usage with `extra` laid
    over it, read as one map (a resource something is laid over is summed
    into one dict the first time it is asked for), and the index that
    answers for it while nothing has changed (`current`). Read under the
    owner's lock: the index's usage is the owner's live map."""

    __slots__ = ("index", "generation", "_base", "_extra", "_summed")

    def __init__(self, index: NodeIndex, base: Usage, extra: dict[str, dict[str, int]]) -> None:
        self.index = index
        self.generation = index.generation
        self._base = base
        self._extra = extra
        self._summed: dict[str, Mapping[str, int]] = {}

    def current(self, cluster: Cluster) -> NodeIndex | None:
        """The index, if it still answers for this usage on `cluster`."""
        index = self.index
        if index.generation == self.generation and index.cluster is cluster:
            return index
        return None

    def extra(self, resource: str) -> Mapping[str, int]:
        """What is laid over the index's usage of `resource`, per node."""
        return self._extra.get(resource, NO_USE)

    def plus(self, *more: Usage) -> IndexedUsage:
        """This usage with `more` added (an older gang's hold, GPUs held
        for preemptors), laid over the same index: the nodes they touch are
        scored exactly, the rest still come from the index."""
        if not any(more):
            return self
        extra = {r: dict(per) for r, per in self._extra.items()}
        for usage in more:
            for r, per in usage.items():
                if per:
                    _add_into(extra, r, per)
        out = IndexedUsage(self.index, self._base, extra)
        out.generation = self.generation
        return out

    def __getitem__(self, resource: str) -> Mapping[str, int]:
        got = self.get(resource)
        if got is None:
            raise KeyError(resource)
        return got

    def get(self, resource: str, default: Mapping[str, int] | None = None) -> Mapping[str, int] | None:  # type: ignore[override]
        more = self._extra.get(resource)
        if more is None:
            return self._base.get(resource, default)
        summed = self._summed.get(resource)
        if summed is None:
            total = dict(self._base.get(resource, NO_USE))
            for node, count in more.items():
                total[node] = total.get(node, 0) + count
            summed = self._summed[resource] = total
        return summed

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (r for r in self._extra if r not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(1 for r in self._extra if r not in self._base)

    def __contains__(self, resource: object) -> bool:
        return resource in self._base or resource in self._extra


def _add_into(usage: dict[str, dict[str, int]], resource: str, per: Mapping[str, int]) -> None:
    target = usage.get(resource)
    if target is None:
        usage[resource] = dict(per)
        return
    for node, count in per.items():
        target[node] = target.get(node, 0) + count
