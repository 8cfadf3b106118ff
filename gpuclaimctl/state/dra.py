"""GPUs served by DRA, kept from informer events (docs/dra.md §4).

What `decide.dra.cluster_offers` and `decide.drausage.dra_usage` compute
from whole lists, kept here per object, so that an event recomputes only
what it touches and no decision computes anything of DRA:

- ResourceSlices by pool, and which pools may reach which node (the pools
  naming or pinning it, and the rare `wide` ones reaching nodes by labels
  or allNodes: as `SliceIndex`); a slice change recomputes the nodes its
  pool reaches before and after it (every node for a wide pool);
- the DeviceClasses and the `ClassMapping` (a change that moves the
  mapping of a GPUClass resource recomputes every node);
- DeviceTaintRules (a change recomputes every node);
- per node, the node as the informer shows it and its `NodeDra`
  (recomputed when its allocatable or labels change, or any of the above);
- `device_owners`: which (node, resource) offer counts each device;
- per allocated ResourceClaim, its devices, and its `claim_use` (recomputed
  when the claim changes, or when the owners of one of its devices do).

Every recomputation is reported as `DraMoves`: the nodes whose offers
changed (their allocatable as placement sees it: `effective`) and the
claims whose use changed. The view (`state/view.py`) applies them to its
snapshot, its usage tracker and so its node index, under its lock (I1).

Until `enable` (the DRA informers have all listed once) nothing is
offered: devices offered before the claims holding them are known would be
counted free. Objects are kept meanwhile; `enable` computes everything.

Not thread-safe on its own: the view holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuclaimctl.decide.dra import (
    ClassMapping,
    NodeDra,
    node_with_dra,
    map_resources,
    node_offers,
    pools_on_node,
)
from gpuclaimctl.decide.drausage import ClaimUse, claim_use
from gpuclaimctl.model.dra import ClaimInfo, DeviceClassInfo, DeviceID, PoolID, SliceInfo, TaintRule
from gpuclaimctl.model.snapshot import NodeInfo

Owner = tuple[str, str]  # node, resource
_NO_DRA = NodeDra("")


@dataclass
class DraMoves:
    """What one change did: `nodes` whose offers changed, `claims` (uid ->
    (use before, use after); None: it uses no offered device)."""

    nodes: set[str] = field(default_factory=set)
    claims: dict[str, tuple[ClaimUse | None, ClaimUse | None]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.claims)

    def merge(self, later: DraMoves) -> DraMoves:
        """This change, then `later`."""
        self.nodes |= later.nodes
        for uid, (before, after) in later.claims.items():
            self.claims[uid] = (self.claims.get(uid, (before, None))[0], after)
        return self


def _class_key(c: DeviceClassInfo) -> tuple[Any, ...]:
    """What map_resources and node_offers read of a class (its compiled
    selectors compare by identity; their expressions stand for them)."""
    return (c.name, c.created, c.extended_resource_name, tuple(s.expression for s in c.selectors))


def _claim_key(c: ClaimInfo) -> tuple[Any, ...]:
    """What claim_use reads of a claim."""
    return (c.devices, c.extended_for_pod)


class DraState:
    """DRA's objects and what they offer and use, per object (see above)."""

    def __init__(self) -> None:
        # False until every DRA informer has listed once: nothing offered.
        self.enabled = False
        # The GPUClasses' resources: node_offers looks at these alone.
        self._resources: frozenset[str] = frozenset()
        self._nodes: dict[str, NodeInfo] = {}          # name -> as the informer shows it
        self._node_dra: dict[str, NodeDra] = {}        # name -> its offers (nodes with offers or notes)
        self._slices: dict[str, SliceInfo] = {}        # slice name -> slice
        # pool -> its slices (readable ones), by name; what pool_on_node reads.
        self._pools: dict[PoolID, dict[str, SliceInfo]] = {}
        self._pool_slices: dict[PoolID, tuple[SliceInfo, ...]] = {}
        # pool -> the nodes its slices name or pin; node -> those pools.
        self._pool_named: dict[PoolID, frozenset[str]] = {}
        self._by_node: dict[str, set[PoolID]] = {}
        # Pools with a slice reaching nodes by labels or allNodes.
        self._wide: set[PoolID] = set()
        self._classes: dict[str, DeviceClassInfo] = {}
        self._mapping = ClassMapping({})
        self._rules: dict[str, TaintRule] = {}
        # device -> the offers counting it (in practice one: a device is
        # counted on the one node it is tied to, under one resource).
        self._owners: dict[DeviceID, tuple[Owner, ...]] = {}
        self._claims: dict[str, ClaimInfo] = {}        # uid -> allocated claim with devices
        self._device_claims: dict[DeviceID, set[str]] = {}  # device -> uids of claims allocated it
        self._uses: dict[str, ClaimUse] = {}           # uid -> its use, when it uses any offered device

    # -- reading ------------------------------------------------------------------------

    def effective(self, name: str) -> NodeInfo | None:
        """The node as placement sees it: its allocatable with each
        DRA-served resource's device count (decide.dra.node_with_dra), and
        which DeviceClass serves each (`NodeInfo.dra`); the node itself
        when DRA serves nothing there."""
        raw = self._nodes.get(name)
        if raw is None:
            return None
        return node_with_dra(raw, self._node_dra.get(name))

    def offers(self) -> dict[str, NodeDra]:
        """node -> its offers, for every node known (tests compare it with
        cluster_offers)."""
        return {n: self._node_dra.get(n, NodeDra(n)) for n in self._nodes}

    # -- changes -------------------------------------------------------------------------

    def enable(self) -> DraMoves:
        """The DRA informers have listed: offer what the slices offer."""
        if self.enabled:
            return DraMoves()
        self.enabled = True
        return self._recompute(self._nodes)

    def set_resources(self, resources: Iterable[str]) -> DraMoves:
        """The GPUClasses' resources are now `resources`."""
        wanted = frozenset(resources)
        if wanted == self._resources:
            return DraMoves()
        self._resources = wanted
        return self._recompute(self._nodes)

    def set_node(self, node: NodeInfo) -> DraMoves | None:
        """The informer shows `node`; None if nothing changed."""
        old = self._nodes.get(node.name)
        if old == node:
            return None
        self._nodes[node.name] = node
        if old is not None and old.labels == node.labels and old.allocatable == node.allocatable:
            return DraMoves()  # its offers stand; the view takes the rest of the node anew
        return self._recompute((node.name,))

    def delete_node(self, name: str) -> DraMoves:
        if self._nodes.pop(name, None) is None:
            return DraMoves()
        return self._recompute((name,))

    def put_slice(self, obj: Mapping[str, Any]) -> DraMoves:
        new = SliceInfo.from_api(obj)
        old = self._slices.get(new.name)
        if old == new:
            return DraMoves()
        self._slices[new.name] = new
        return self._slice_changed(old, new)

    def delete_slice(self, name: str) -> DraMoves:
        old = self._slices.pop(name, None)
        if old is None:
            return DraMoves()
        return self._slice_changed(old, None)

    def put_class(self, obj: Mapping[str, Any]) -> DraMoves:
        new = DeviceClassInfo.from_api(obj)
        old = self._classes.get(new.name)
        if old is not None and _class_key(old) == _class_key(new):
            return DraMoves()
        self._classes[new.name] = new
        return self._classes_changed()

    def delete_class(self, name: str) -> DraMoves:
        if self._classes.pop(name, None) is None:
            return DraMoves()
        return self._classes_changed()

    def put_rule(self, obj: Mapping[str, Any]) -> DraMoves:
        new = TaintRule.from_api(obj)
        if self._rules.get(new.name) == new:
            return DraMoves()
        self._rules[new.name] = new
        return self._recompute(self._nodes)

    def delete_rule(self, name: str) -> DraMoves:
        if self._rules.pop(name, None) is None:
            return DraMoves()
        return self._recompute(self._nodes)

    def put_claim(self, obj: Mapping[str, Any]) -> DraMoves:
        info = ClaimInfo.from_api(obj)
        old = self._claims.get(info.uid)
        if old is not None and _claim_key(old) == _claim_key(info):
            return DraMoves()
        if old is None and not info.devices:
            return DraMoves()  # not allocated (or adminAccess alone), as before
        self._forget_devices(info.uid, old)
        if info.devices:
            self._claims[info.uid] = info
            for d in info.devices:
                self._device_claims.setdefault(d, set()).add(info.uid)
        moves = DraMoves()
        self._recount(info.uid, moves)
        return moves

    def delete_claim(self, uid: str) -> DraMoves:
        old = self._claims.get(uid)
        if old is None:
            return DraMoves()
        self._forget_devices(uid, old)
        moves = DraMoves()
        self._recount(uid, moves)
        return moves

    # -- internals -------------------------------------------------------------------------

    def _forget_devices(self, uid: str, old: ClaimInfo | None) -> None:
        self._claims.pop(uid, None)
        for d in old.devices if old is not None else ():
            holders = self._device_claims.get(d)
            if holders is not None:
                holders.discard(uid)
                if not holders:
                    del self._device_claims[d]

    def _recount(self, uid: str, moves: DraMoves) -> None:
        """The claim's use afresh from the owners; recorded in `moves` if it moved."""
        info = self._claims.get(uid)
        new: ClaimUse | None = None
        if info is not None and self.enabled:
            got = claim_use(info, self._owners)
            new = got if got.held else None
        old = self._uses.get(uid)
        if old == new:
            return
        if new is None:
            del self._uses[uid]
        else:
            self._uses[uid] = new
        before = moves.claims.get(uid, (old, None))[0]
        moves.claims[uid] = (before, new)

    def _slice_changed(self, old: SliceInfo | None, new: SliceInfo | None) -> DraMoves:
        pools = {s.pool_id for s in (old, new) if s is not None and s.readable}
        touched = self._touched(pools)
        for s, add in ((old, False), (new, True)):
            if s is None or not s.readable:
                continue
            members = self._pools.setdefault(s.pool_id, {})
            if add:
                members[s.name] = s
            elif members.get(s.name) == s:
                del members[s.name]
        for pid in pools:
            self._reindex_pool(pid)
        after = self._touched(pools)
        if touched is None or after is None:
            return self._recompute(self._nodes)
        return self._recompute(touched | after)

    def _reindex_pool(self, pid: PoolID) -> None:
        """SliceIndex.build's by_node and wide, for one pool."""
        members = self._pools.get(pid, {})
        named = frozenset(n for s in members.values() for n in s.named_nodes())
        was = self._pool_named.get(pid, frozenset())
        for n in was - named:
            pools = self._by_node[n]
            pools.discard(pid)
            if not pools:
                del self._by_node[n]
        for n in named - was:
            self._by_node.setdefault(n, set()).add(pid)
        if any(s.reaches_by_labels() for s in members.values()):
            self._wide.add(pid)
        else:
            self._wide.discard(pid)
        if members:
            self._pool_named[pid] = named
            self._pool_slices[pid] = tuple(members.values())
        else:
            self._pools.pop(pid, None)
            self._pool_named.pop(pid, None)
            self._pool_slices.pop(pid, None)

    def _touched(self, pools: Iterable[PoolID]) -> set[str] | None:
        """The nodes a change to `pools` can move (SliceIndex.nodes_touched),
        or None for every node."""
        out: set[str] = set()
        for pid in pools:
            if pid in self._wide:
                return None
            out |= self._pool_named.get(pid, frozenset())
        return out

    def _candidates(self, name: str) -> set[PoolID]:
        return self._by_node.get(name, set()) | self._wide

    def _classes_changed(self) -> DraMoves:
        before = self._mapping
        self._mapping = map_resources(self._classes.values())
        if self._mapping_of_ours(before) == self._mapping_of_ours(self._mapping):
            return DraMoves()
        return self._recompute(self._nodes)

    def _mapping_of_ours(self, mapping: ClassMapping) -> tuple[Any, ...]:
        """What node_offers reads of the mapping for the GPUClasses' resources."""
        out = []
        for r in sorted(self._resources):
            cls = mapping.device_class(r)
            note = mapping.uncertain.get(r)
            out.append((r, None if cls is None else _class_key(cls), note))
        return tuple(out)

    def _recompute(self, names: Iterable[str]) -> DraMoves:
        """The offers of `names` (those known) afresh; the owners of every
        device whose offer moved, and the use of every claim holding one."""
        moves = DraMoves()
        if not self.enabled:
            return moves
        changed_devices: set[DeviceID] = set()
        rules = tuple(self._rules.values())
        for name in list(names):
            old = self._node_dra.get(name, _NO_DRA)
            node = self._nodes.get(name)
            if node is None:
                new = _NO_DRA
            else:
                pools = pools_on_node(node, self._pool_slices, self._candidates(name))
                new = node_offers(node, self._resources, pools, self._mapping, rules)
            if new.offers or new.notes:
                self._node_dra[name] = new  # its notes too, which may change alone
            else:
                self._node_dra.pop(name, None)
            if _same_offers(old, new):
                continue
            moves.nodes.add(name)
            changed_devices |= self._move_owners(name, old, new)
        claims: set[str] = set()
        for d in changed_devices:
            claims |= self._device_claims.get(d, set())
        for uid in sorted(claims):
            self._recount(uid, moves)
        return moves

    def _move_owners(self, name: str, old: NodeDra, new: NodeDra) -> set[DeviceID]:
        before = {(d, r) for r, o in old.offers.items() for d in o.devices}
        after = {(d, r) for r, o in new.offers.items() for d in o.devices}
        moved = set()
        for d, r in before - after:
            kept = tuple(o for o in self._owners.get(d, ()) if o != (name, r))
            if kept:
                self._owners[d] = kept
            else:
                self._owners.pop(d, None)
            moved.add(d)
        for d, r in after - before:
            self._owners[d] = (*self._owners.get(d, ()), (name, r))
            moved.add(d)
        return moved


def _same_offers(a: NodeDra, b: NodeDra) -> bool:
    """Whether placement and usage see the two alike: the same resources,
    DeviceClasses and devices (notes aside)."""
    if a.offers.keys() != b.offers.keys():
        return False
    return all(o.device_class == b.offers[r].device_class and o.devices == b.offers[r].devices
               for r, o in a.offers.items())
