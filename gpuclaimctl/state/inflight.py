"""Placements decided but not yet seen back from the watch (DESIGN.md §4).

A worker that decides to bind a claim on a node counts those GPUs here
from the moment of the decision until the claim informer shows a version
of the claim that accounts for the write — whatever the write's fate:

- written: the answer carried the new resourceVersion; the entry ends when
  the informer shows that version or a later one (`rv_seen >= written`);
- refused (a 4xx: nothing was written) or its answer lost (a timeout, a
  dropped connection, a 5xx: it may or may not have landed): every write
  carries the resourceVersion it was computed from, so the next version of
  the claim after that one is our write if it landed, or someone else's
  change that made it fail. The entry ends once the informer shows any
  version newer than the base (`rv_seen > base`);
- still on the wire: the entry never ends by observation.

There is no time-to-live: an entry that ended on a clock while the watch
lagged behind would uncount GPUs in use (DESIGN I1). A lost answer whose
write did not land and that nothing else follows leaves the claim at its
base version; `unresolved()` lists those, and the claim sync settles each
with one live read -- but only once LOST_WRITE_WINDOW has passed since the
answer was lost: until the API server itself has given up on the request,
a read showing the base version says nothing, as the write may still land
after it.

resourceVersions are compared as integers, as the scheduler's assume cache
does (etcd revisions); one that does not parse never ends an entry by
observation.

Each entry carries the pod it was decided for, so another pod naming the
same claim sees it reserved (ClaimInUse) rather than free.

Not thread-safe on its own: `ClusterView` owns the lock and calls these
methods with it held.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime

from gpuclaimctl.model.snapshot import PodRef


# How long after a write's answer was lost the write may still land: the
# API server works on a request until its deadline (kube-apiserver's
# --request-timeout, 60 s by default) even when the client has given up,
# plus a margin for the storage write it had begun by then.
LOST_WRITE_WINDOW = 65.0


def may_still_land_for(lost_at: datetime, now: datetime) -> float:
    """Seconds (0 once past) during which a write whose answer was lost at
    `lost_at` may still land."""
    return max(0.0, LOST_WRITE_WINDOW - (now - lost_at).total_seconds())


# Deleted claims remembered (their uids): far more than can be deleted
# between a decision's read of the cache and its record.
GONE_REMEMBERED = 10_000


class WriteState(enum.Enum):
    SENDING = "sending"    # decided; the write is on the wire
    WRITTEN = "written"    # the API server answered with a new resourceVersion
    SETTLING = "settling"  # refused or answer lost: ends with any newer version


@dataclass(frozen=True)
class InFlight:
    claim_uid: str
    pod: PodRef
    node: str
    resource: str
    count: int
    # The claim's resourceVersion the write is based on.
    base: int
    state: WriteState = WriteState.SENDING
    # With WRITTEN, the resourceVersion the API server answered.
    written: int = 0
    # Where the claim counts against GPUBudgets (decide.budget).
    namespace: str = ""
    class_name: str = ""
    # With SETTLING: when the answer was lost (None: refused, nothing was
    # written). A live read settles it only LOST_WRITE_WINDOW after this.
    lost_at: datetime | None = None
    # The claim's name, and when the entry began: an entry for a claim the
    # informer has never shown is checked by a live read once it is old
    # (sync.claims.audit_inflight).
    name: str = ""
    added_at: datetime | None = None
    # WRITTEN by an answer of the API server to our write (`written`), or
    # seen Bound by a live read (`add_seen_elsewhere`): the claim is bound
    # on the server. Not a WRITTEN that a live read inferred from any newer
    # version (`settled`): that version may be someone else's change.
    answered: bool = False
    # Put back on the wire by `resend` (it was settling): a write never
    # sent after all returns it to settling (`not_sent`), as the earlier
    # write in doubt may land yet.
    resent: bool = False

    def settle_after(self, now: datetime) -> float:
        """Seconds until a live read may tell whether this write landed."""
        return 0.0 if self.lost_at is None else may_still_land_for(self.lost_at, now)

    def answered_with(self, rv_seen: int) -> bool:
        """Whether `rv_seen` is the version the API server answered this
        process's own bind with (`written`; not a new leader's catch-up,
        `add_seen_elsewhere`, whose base is -1)."""
        return self.state is WriteState.WRITTEN and self.answered and self.base >= 0 \
            and rv_seen == self.written

    def ended_by(self, rv_seen: int) -> bool:
        """Does a claim version `rv_seen` account for this write?"""
        if self.state is WriteState.WRITTEN:
            return rv_seen >= self.written
        if self.state is WriteState.SETTLING:
            return rv_seen > self.base
        return False


def parse_rv(value: object) -> int:
    """A resourceVersion as an int; -1 (older than any) when absent or opaque."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return -1


class InFlightPlacements:
    """claim uid -> the placement being written for it. Invariant: every
    entry's claim has not yet been shown by the informer at a version that
    ends it (`InFlight.ended_by`), and the informer's last seen version of
    each claim is in `_seen`."""

    def __init__(self) -> None:
        self._entries: dict[str, InFlight] = {}
        # claim uid -> the newest resourceVersion the informer has shown.
        self._seen: dict[str, int] = {}
        # Claims the informer showed deleted, newest last (a bounded memory):
        # a decision made from a cache read before the delete was applied
        # counts nothing for them, as no later version can ever end it.
        self._gone: dict[str, None] = {}

    def add(self, claim_uid: str, pod: PodRef, node: str, resource: str, count: int,
            base: str | int, *, namespace: str = "", class_name: str = "", name: str = "",
            added_at: datetime | None = None) -> None:
        """Count the GPUs from now on. A claim with an entry already may
        not get another: the first may be bound on the server yet, and
        replacing it would uncount its GPUs (I1); a move waits for it to
        end (sync.pods._place). Raises ValueError then, counting nothing new."""
        if claim_uid in self._entries:
            raise ValueError(f"claim {claim_uid} has a placement in flight already")
        if claim_uid in self._gone:
            # Deleted: it holds nothing, and the bind's precondition (uid or
            # resourceVersion of the version read) makes it fail.
            return
        b = base if isinstance(base, int) else parse_rv(base)
        self._entries[claim_uid] = InFlight(claim_uid, pod, node, resource, count, b,
                                            namespace=namespace, class_name=class_name,
                                            name=name, added_at=added_at)

    def add_seen_elsewhere(self, claim_uid: str, pod: PodRef, node: str, resource: str,
                           count: int, rv: str, *, namespace: str = "",
                           class_name: str = "", name: str = "",
                           added_at: datetime | None = None) -> None:
        """A claim a live read shows Bound at `rv` that the informer has not
        shown yet (a new leader's catch-up): counted until it does."""
        if claim_uid in self._gone:
            return  # the informer has shown it deleted since the read
        self._entries[claim_uid] = InFlight(claim_uid, pod, node, resource, count, -1,
                                            WriteState.WRITTEN, parse_rv(rv),
                                            namespace=namespace, class_name=class_name,
                                            name=name, added_at=added_at, answered=True)
        self._end_if_seen(claim_uid)

    def resend(self, claim_uid: str, base: str) -> bool:
        """A decision keeps the claim where its entry counts it and writes
        the bind again, computed from `base`: the entry is on the wire once
        more, and ends only by that write's fate. (Left settling, a live
        read of the claim before the new write lands would end it, and the
        GPUs the new write takes would count nowhere until the informer
        shows them: simulation seed 3203.) An earlier lost answer's
        `lost_at` stays: that write may land yet.

        Only a settling entry is put back on the wire. A written one knows
        the version that holds the GPUs (an answer, or a catch-up's live
        list): the new write, from an older cached version, can only be
        refused, and the entry must keep waiting for that version (put on
        the wire from the older base, the refusal would end it on a version
        in between: simulation seed 5172). One on the wire already is
        another write's.

        The base never goes back: a decision from a cache older than the
        lost write's base (the claim changed between the two reads) must
        not let the version the lost write was based on end the entry while
        that write may land yet (simulation seed 5013: an entry based on 18
        put back on the wire from 10 was ended by the informer showing 18,
        and the bind landing after counted nowhere).

        True if the entry was put back on the wire: the caller sends the
        write, or says it never did (`not_sent`)."""
        entry = self._entries.get(claim_uid)
        if entry is None or entry.state is not WriteState.SETTLING:
            return False
        self._entries[claim_uid] = replace(entry, state=WriteState.SENDING, resent=True,
                                           base=max(entry.base, parse_rv(base)))
        return True

    def written(self, claim_uid: str, rv: str) -> None:
        """The write was answered with resourceVersion `rv`."""
        entry = self._entries.get(claim_uid)
        if entry is not None:
            self._entries[claim_uid] = replace(entry, state=WriteState.WRITTEN, written=parse_rv(rv),
                                               answered=True, resent=False)
            self._end_if_seen(claim_uid)

    def settling(self, claim_uid: str, base: str | None = None, *,
                 lost_at: datetime | None = None) -> None:
        """The write failed (refused, or its answer lost at `lost_at`): the
        entry ends with the next version after `base` (default: the entry's
        own base)."""
        entry = self._entries.get(claim_uid)
        if entry is not None:
            b = entry.base if base is None else parse_rv(base)
            if entry.state is WriteState.WRITTEN and b < entry.written:
                # A later write computed from a version older than the one
                # our earlier write produced cannot have landed (its
                # precondition is stale); what we know landed still needs
                # seeing. Settling on the older base would end the entry on
                # a version between the two, before the bind shows.
                return
            if b < entry.base:
                # Likewise for an earlier write in doubt (settling, or put
                # back on the wire by `resend`): the claim is past the older
                # version already, so the later write cannot land, and the
                # earlier one still may, as the version after its own base.
                # Going back to the older base would end the entry on a
                # version in between (say our finalizer's, when the bind
                # after it landed with its answer lost: simulation seed 5013).
                b = entry.base
            if entry.lost_at is not None and (lost_at is None or entry.lost_at > lost_at):
                lost_at = entry.lost_at  # an earlier lost answer may still land
            self._entries[claim_uid] = replace(entry, state=WriteState.SETTLING, base=b,
                                               lost_at=lost_at, resent=False)
            self._end_if_seen(claim_uid)

    def settled(self, claim_uid: str, live_rv: str) -> None:
        """A live read shows the claim at `live_rv`: once the informer shows
        that version, it accounts for whatever the write did. The caller
        reads only once `settle_after` is 0 (a lost write can land no more)."""
        entry = self._entries.get(claim_uid)
        if entry is None:
            return
        rv = parse_rv(live_rv)
        if rv <= entry.base and entry.state is WriteState.SETTLING:
            # Nothing changed since the base: the write did not land.
            del self._entries[claim_uid]
            return
        self._entries[claim_uid] = replace(entry, state=WriteState.WRITTEN, written=rv, answered=False)
        self._end_if_seen(claim_uid)

    def observe(self, claim_uid: str, rv: str) -> bool:
        """The informer shows the claim at `rv`; True if that ended an entry."""
        seen = parse_rv(rv)
        if seen > self._seen.get(claim_uid, -1):
            self._seen[claim_uid] = seen
        return self._end_if_seen(claim_uid)

    def not_sent(self, claim_uid: str) -> None:
        """The write a decision put on the wire was never sent (an earlier
        write of the set failed, or a gang let go of its decision): a new
        entry ends, the claim holds nothing for it; one put back by `resend`
        is settling again, as before (left on the wire, nothing would ever
        end it: simulation seed 10024, six nodes of 2). An entry with its
        fate known meanwhile is left as it is."""
        entry = self._entries.get(claim_uid)
        if entry is None or entry.state is not WriteState.SENDING:
            return
        if entry.resent:
            self._entries[claim_uid] = replace(entry, state=WriteState.SETTLING, resent=False)
        else:
            del self._entries[claim_uid]

    def gone(self, claim_uid: str) -> bool:
        """The informer shows the claim deleted: it holds nothing any more."""
        self._seen.pop(claim_uid, None)
        self._gone[claim_uid] = None
        if len(self._gone) > GONE_REMEMBERED:
            del self._gone[next(iter(self._gone))]
        return self._entries.pop(claim_uid, None) is not None

    def get(self, claim_uid: str) -> InFlight | None:
        return self._entries.get(claim_uid)

    def unresolved(self) -> list[InFlight]:
        """Settling entries whose claim the informer still shows at the base."""
        return [e for e in self._entries.values()
                if e.state is WriteState.SETTLING and self._seen.get(e.claim_uid, -1) <= e.base]

    def usage(self) -> dict[str, dict[str, int]]:
        """resource -> node -> GPUs in flight."""
        out: dict[str, dict[str, int]] = {}
        for e in self._entries.values():
            per_node = out.setdefault(e.resource, {})
            per_node[e.node] = per_node.get(e.node, 0) + e.count
        return out

    def __iter__(self) -> Iterator[InFlight]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def _end_if_seen(self, claim_uid: str) -> bool:
        entry = self._entries.get(claim_uid)
        seen = self._seen.get(claim_uid)
        if entry is not None and seen is not None and entry.ended_by(seen):
            del self._entries[claim_uid]
            return True
        return False

