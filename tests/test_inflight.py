"""Placements in flight end when the informer shows a version that accounts
for the write, never on a clock (issue 10, item 5)."""

from __future__ import annotations

import pytest

from gpuclaimctl.model.snapshot import PodRef
from gpuclaimctl.state.inflight import InFlightPlacements, parse_rv

GPU = "nvidia.com/gpu"
P1 = PodRef("p1", "uid-p1")


@pytest.fixture
def inflight() -> InFlightPlacements:
    f = InFlightPlacements()
    f.observe("c1", "10")
    f.add("c1", P1, "node-a", GPU, 2, base="10")
    return f


def test_a_placement_counts_from_the_decision(inflight: InFlightPlacements) -> None:
    assert inflight.usage() == {GPU: {"node-a": 2}}


def test_a_write_on_the_wire_is_never_ended_by_what_the_informer_shows(inflight: InFlightPlacements) -> None:
    inflight.observe("c1", "11")
    inflight.observe("c1", "99")
    assert inflight.usage() == {GPU: {"node-a": 2}}


def test_a_written_bind_ends_when_the_informer_shows_its_version(inflight: InFlightPlacements) -> None:
    inflight.written("c1", "15")
    inflight.observe("c1", "14")  # an older version (another field changed) ends nothing
    assert inflight.get("c1") is not None
    assert inflight.observe("c1", "15")
    assert inflight.usage() == {}


def test_a_written_bind_the_informer_already_passed_ends_at_once(inflight: InFlightPlacements) -> None:
    inflight.observe("c1", "20")
    inflight.written("c1", "15")
    assert inflight.get("c1") is None


@pytest.mark.parametrize("what", ["refused", "answer lost"])
def test_a_failed_write_ends_with_the_first_version_after_its_base(inflight: InFlightPlacements,
                                                                     what: str) -> None:
    """Refused or lost, the next version after the base shows what happened:
    our bind if it landed, the change that made it fail if not."""
    inflight.settling("c1")
    inflight.observe("c1", "10")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    assert [e.claim_uid for e in inflight.unresolved()] == ["c1"]
    inflight.observe("c1", "11")
    assert inflight.usage() == {}


def test_a_lost_answer_that_did_not_land_is_settled_by_a_live_read(inflight: InFlightPlacements) -> None:
    inflight.settling("c1")
    inflight.settled("c1", "10")  # the claim is still at the base: nothing landed
    assert inflight.usage() == {}


def test_a_lost_answer_that_landed_waits_for_the_informer_to_show_it(inflight: InFlightPlacements) -> None:
    inflight.settling("c1")
    inflight.settled("c1", "12")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    inflight.observe("c1", "12")
    assert inflight.usage() == {}


def test_a_lost_write_put_back_on_the_wire_from_an_older_cache_still_ends_only_after_its_base() -> None:
    """Simulation seed 5013: a bind based on 18 (after our finalizer's
    update) lost its answer; the next decision, from a cache still at 10,
    wrote the bind again from 10 and was refused. The informer showing 18
    (the finalizer) must not end the entry: the first bind may land yet."""
    f = InFlightPlacements()
    f.observe("c1", "10")
    f.add("c1", P1, "node-a", GPU, 2, base="18")
    f.settling("c1", lost_at=None)
    f.resend("c1", "10")
    f.settling("c1", "10")  # the second write refused: 409
    f.observe("c1", "18")
    assert f.usage() == {GPU: {"node-a": 2}}
    f.observe("c1", "27")  # the first bind lands
    assert f.usage() == {}


def test_a_write_never_sent_ends_a_new_entry_and_settles_a_resent_one_again() -> None:
    """Simulation seed 10024: an entry put back on the wire by a decision
    whose writes stopped before its bind (an earlier bind of the set
    failed) must not stay on the wire for ever: it settles again, as the
    earlier write in doubt may land yet. A new entry never sent ends."""
    f = InFlightPlacements()
    f.observe("c1", "10")
    f.add("c1", P1, "node-a", GPU, 2, base="10")
    f.settling("c1", lost_at=None)
    assert f.resend("c1", "10")
    f.not_sent("c1")
    entry = f.get("c1")
    assert entry is not None and entry.state.value == "settling" and not entry.resent
    f.observe("c1", "11")  # the next version shows what the earlier write did
    assert f.usage() == {}
    f.add("c2", P1, "node-a", GPU, 1, base="5")
    f.not_sent("c2")
    assert f.get("c2") is None
    f.add("c3", P1, "node-a", GPU, 1, base="5")
    f.written("c3", "6")
    f.not_sent("c3")  # its fate is known: left as it is
    assert f.usage() == {GPU: {"node-a": 1}}
    assert not f.resend("c3", "5"), "a written entry is not put back on the wire"


def test_a_deleted_claim_holds_nothing(inflight: InFlightPlacements) -> None:
    assert inflight.gone("c1")
    assert inflight.usage() == {}


def test_a_claim_a_live_list_shows_bound_counts_until_the_informer_catches_up() -> None:
    f = InFlightPlacements()
    f.observe("c2", "5")
    f.add_seen_elsewhere("c2", P1, "node-b", GPU, 4, "8")
    assert f.usage() == {GPU: {"node-b": 4}}
    f.observe("c2", "8")
    assert f.usage() == {}


def test_entries_carry_the_pod_they_were_decided_for(inflight: InFlightPlacements) -> None:
    entry = inflight.get("c1")
    assert entry is not None and entry.pod == P1


@pytest.mark.parametrize("rv, parsed", [("12", 12), ("", -1), (None, -1), ("abc", -1)])
def test_resource_versions_compare_as_integers(rv: object, parsed: int) -> None:
    assert parse_rv(rv) == parsed


def test_a_later_write_from_an_older_version_failing_does_not_end_a_written_bind_early(
        inflight: InFlightPlacements) -> None:
    """The bind landed at 15; a second sync, reading the cache still at 10,
    writes again and fails: the entry must still wait for 15, not end with
    the first version after 10 (a version between the two, seen meanwhile,
    does not show the bind). Found by the simulation's budget invariant
    (seed 2060)."""
    inflight.written("c1", "15")
    inflight.settling("c1", "10")
    inflight.observe("c1", "12")
    assert inflight.get("c1") is not None
    assert inflight.observe("c1", "15")


def test_a_later_write_from_an_older_version_failing_does_not_end_a_bind_in_doubt_early(
        inflight: InFlightPlacements) -> None:
    """The finalizer landed at 29 and the bind after it, based on 29, lost
    its answer (it landed: 30). A second sync, reading the cache still at
    10, writes again and is refused: the entry must still end only after
    29, not with the finalizer's version. Found by the simulation's
    undercount check (seed 100143)."""
    from datetime import datetime, timezone

    inflight.settling("c1", "29", lost_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    inflight.settling("c1", "10")
    assert not inflight.observe("c1", "29")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    assert inflight.observe("c1", "30")


def test_a_claim_in_flight_cannot_get_a_second_placement(inflight: InFlightPlacements) -> None:
    """The first may be bound on the server yet: replacing it would uncount
    its GPUs (I1); a move waits for it to end (sync.pods._place)."""
    inflight.written("c1", "15")
    with pytest.raises(ValueError):
        inflight.add("c1", P1, "node-b", GPU, 2, base="10")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    inflight.observe("c1", "15")
    inflight.add("c1", P1, "node-b", GPU, 2, base="15")
    assert inflight.usage() == {GPU: {"node-b": 2}}


def test_a_claim_the_informer_showed_deleted_gets_no_placement() -> None:
    """A decision made from a cache read before the delete was applied: no
    later version of the claim can ever end an entry for it, so it would
    count its GPUs for good (I4). A deleted claim holds nothing."""
    f = InFlightPlacements()
    f.observe("c1", "10")
    f.gone("c1")
    f.add("c1", P1, "node-a", GPU, 2, base="10")
    f.add_seen_elsewhere("c1", P1, "node-a", GPU, 2, "12")
    assert f.usage() == {} and f.get("c1") is None


def test_only_a_bind_the_api_server_answered_or_a_live_read_showed_bound_is_answered(
        inflight: InFlightPlacements) -> None:
    """What a Budget message tells as bound rather than being placed
    (ClusterView.budget_use): not a version a live read found newer than
    the base after a lost answer, which may be someone else's change."""
    assert not inflight.get("c1").answered  # type: ignore[union-attr]
    inflight.settling("c1")
    inflight.settled("c1", "12")
    assert not inflight.get("c1").answered  # type: ignore[union-attr]
    inflight.add_seen_elsewhere("c2", P1, "node-a", GPU, 1, "30")
    assert inflight.get("c2").answered  # type: ignore[union-attr]
    inflight.observe("c3", "40")
    inflight.add("c3", P1, "node-a", GPU, 1, base="40")
    inflight.written("c3", "41")
    assert inflight.get("c3").answered  # type: ignore[union-attr]


def test_a_refused_bind_written_again_is_back_on_the_wire_until_its_new_fate(inflight: InFlightPlacements) -> None:
    """Seed 3203: settling on base 10, the bind is written again from 12:
    a version in between (11, 12) no longer ends it; the new answer does."""
    inflight.settling("c1", "10")
    inflight.resend("c1", "12")
    inflight.observe("c1", "12")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    inflight.written("c1", "13")
    inflight.observe("c1", "13")
    assert inflight.usage() == {}


def test_a_written_bind_is_not_put_back_on_the_wire_by_a_write_from_an_older_version(
        inflight: InFlightPlacements) -> None:
    """Seed 5172: the claim is known Bound at 23 (an answer, or a catch-up's
    list); a sync keeps it there from its cached version 10 and writes again:
    that write is refused (409), and the entry still waits for 23, not for
    any version after 10."""
    inflight.written("c1", "23")
    inflight.resend("c1", "10")
    inflight.settling("c1", "10")
    inflight.observe("c1", "22")
    assert inflight.usage() == {GPU: {"node-a": 2}}
    inflight.observe("c1", "23")
    assert inflight.usage() == {}
