from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuclaimctl.model.api import (
    CLAIM_FINALIZER,
    CLAIMS_ANNOTATION,
    POD_CLAIM_NAME_ANNOTATION,
    TEMPLATE_CLAIM_LABEL,
)
from gpuclaimctl.model.podclaims import (
    MAX_CLAIM_NAME,
    MAX_ENTRIES,
    ClaimEntry,
    EntrySource,
    PodClaimsError,
    is_template_claim_of,
    named_claims,
    parse_claims,
    pod_claims,
    template_claim,
    template_claim_name,
    template_owner_name,
    template_owner_uid,
)

from gpuclaimctl.state import indexes

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def pod(name: str = "trainer", annotation: str | None = None, uid: str = "uid-1") -> dict[str, Any]:
    annotations = {} if annotation is None else {CLAIMS_ANNOTATION: annotation}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations}}


def test_each_kind_of_entry_is_parsed_in_order() -> None:
    entries = parse_claims(
        json.dumps(
            [
                {"name": "pair", "template": "a100-pair"},
                {"name": "eval", "className": "a100", "count": 1},
                {"name": "mine", "claim": "notebook-gpu"},
            ]
        )
    )
    assert entries == (
        ClaimEntry(name="pair", template="a100-pair"),
        ClaimEntry(name="eval", class_name="a100", count=1),
        ClaimEntry(name="mine", claim="notebook-gpu"),
    )
    assert [e.source for e in entries] == [EntrySource.TEMPLATE, EntrySource.INLINE, EntrySource.CLAIM]


def test_entries_are_frozen() -> None:
    (entry,) = parse_claims('[{"name": "g", "claim": "c"}]')
    with pytest.raises(AttributeError):
        entry.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(None, "has no gpuclaimctl.io/claims annotation", id="missing"),
        pytest.param("[{name: gpu}]", "not valid JSON", id="not-json"),
        pytest.param("", "not valid JSON", id="empty-string"),
        pytest.param('[{"name": "g", "count": NaN, "className": "a"}]', "not valid JSON", id="nan"),
        pytest.param('{"name": "g", "claim": "c"}', "must be a JSON list", id="object-not-list"),
        pytest.param('"gpu"', "got a string", id="string-not-list"),
        pytest.param("[]", "the list is empty", id="empty-list"),
        pytest.param('["gpu"]', "entry 1 must be an object, got a string", id="entry-not-object"),
        pytest.param('[{"claim": "c"}]', "entry 1 has no name", id="no-name"),
        pytest.param('[{"name": "GPU", "claim": "c"}]', "name 'GPU' is not a DNS label", id="name-uppercase"),
        pytest.param('[{"name": "a.b", "claim": "c"}]', "is not a DNS label", id="name-with-dot"),
        pytest.param('[{"name": "' + "a" * 64 + '", "claim": "c"}]', "is not a DNS label", id="name-too-long"),
        pytest.param('[{"name": 7, "claim": "c"}]', "name 7 is not a DNS label", id="name-not-string"),
        pytest.param(
            '[{"name": "g", "claim": "c"}, {"name": "g", "template": "t"}]',
            "entry name 'g' is used more than once",
            id="duplicate-names",
        ),
        pytest.param(
            '[{"name": "g", "claim": "c", "template": "t"}]',
            "sets claim and template; an entry has exactly one of",
            id="claim-and-template",
        ),
        pytest.param(
            '[{"name": "g", "claim": "c", "className": "a", "count": 1}]',
            "sets claim and className",
            id="claim-and-class",
        ),
        pytest.param('[{"name": "g"}]', "has none of claim, template, or className", id="neither"),
        pytest.param('[{"name": "g", "count": 2}]', "count needs a className", id="count-alone"),
        pytest.param('[{"name": "g", "className": "a"}]', "className needs a count", id="class-without-count"),
        pytest.param('[{"name": "g", "className": "a", "count": 0}]', "count must be at least 1, got 0", id="count-zero"),
        pytest.param('[{"name": "g", "className": "a", "count": -3}]', "at least 1, got -3", id="count-negative"),
        pytest.param('[{"name": "g", "className": "a", "count": 1.5}]', "whole number, got 1.5", id="count-float"),
        pytest.param('[{"name": "g", "className": "a", "count": "2"}]', "whole number, got '2'", id="count-string"),
        pytest.param('[{"name": "g", "className": "a", "count": true}]', "whole number, got True", id="count-bool"),
        pytest.param('[{"name": "g", "className": "a", "count": 2147483648}]', "too large", id="count-over-int32"),
        pytest.param(
            '[{"name": "g", "claim": "c", "count": 1}]', "count goes only with className", id="count-with-claim"
        ),
        pytest.param('[{"name": "g", "claim": "Bad_Name"}]', "claim 'Bad_Name' is not a valid object name", id="bad-claim-name"),
        pytest.param('[{"name": "g", "template": ""}]', "template '' is not a valid object name", id="empty-template"),
        pytest.param('[{"name": "g", "claim": "c", "clam": 1}]', "unknown field(s) 'clam'", id="unknown-field"),
        pytest.param('[{"name": "g", "claim": "c", "claim": "d"}]', "field 'claim' appears twice", id="duplicate-key"),
        pytest.param(
            '[{"name": "a", "claim": "c"}, {"name": "b", "claim": "c"}]',
            "entries 'a' and 'b' both name GPUClaim 'c'",
            id="same-claim-twice",
        ),
        pytest.param(
            json.dumps([{"name": f"g{i}", "claim": f"c{i}"} for i in range(MAX_ENTRIES + 1)]),
            f"at most {MAX_ENTRIES}",
            id="too-many-entries",
        ),
    ],
)
def test_bad_annotation_is_refused_with_a_message_that_says_what_is_wrong(
    text: str | None, expected: str
) -> None:
    with pytest.raises(PodClaimsError) as err:
        parse_claims(text)
    assert expected in str(err.value)
    assert str(err.value).startswith(f"annotation {CLAIMS_ANNOTATION} is invalid")


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PodClaimsError) as err:
        parse_claims('[{"name": "a", "className": "x", "count": 0}, {"name": "B", "claim": "c"}]')
    assert len(err.value.problems) == 2
    assert "(1)" in str(err.value) and "(2)" in str(err.value)


def test_bad_input_of_any_json_type_raises_only_pod_claims_error() -> None:
    values: list[Any] = [None, True, 1, 1.5, "x", [], {}, [None], [[1]], [{"name": None}], [{"name": "g", "claim": 3}]]
    for value in values:
        with pytest.raises(PodClaimsError):
            parse_claims(json.dumps(value))


@pytest.mark.parametrize("depth", [999, 1000, 5000, 100_000])
def test_deeply_nested_json_is_a_pod_claims_error_not_a_recursion_error(depth: int) -> None:
    # An annotation is any string up to 256 KiB: "[[[[...]]]]" hit the JSON
    # decoder's recursion limit, and the RecursionError escaped the pod sync
    # (a retry loop, no event), the claim sync and the pods-by-claim index.
    with pytest.raises(PodClaimsError):
        parse_claims("[" * depth + "]" * depth)
    with pytest.raises(PodClaimsError):
        pod_claims({"metadata": {"name": "p", "annotations": {CLAIMS_ANNOTATION: '[{"a":' * depth + "1" + "}" * depth + "]"}}})
    deep = {"metadata": {"name": "p", "namespace": "ns", "annotations": {CLAIMS_ANNOTATION: "[" * depth}}}
    assert named_claims(deep) == frozenset()
    assert indexes.pods_by_claim(deep) == []


def test_template_claim_name_is_pod_dash_entry_when_short() -> None:
    assert template_claim_name("trainer", "pair") == "trainer-pair"
    assert ClaimEntry(name="pair", template="t").claim_name("trainer") == "trainer-pair"
    assert ClaimEntry(name="mine", claim="notebook-gpu").claim_name("trainer") == "notebook-gpu"


@pytest.mark.parametrize(
    "pod_name, entry",
    [
        pytest.param("p" * 253, "gpu", id="longest-pod-name"),
        pytest.param("p", "e" * 63, id="longest-entry"),
        pytest.param("a" * 40 + "-" + "b" * 40, "x-" + "y" * 30, id="cut-on-hyphen"),
        pytest.param("web.a" * 50 + "x", "gpu", id="dotted-pod-name"),
        pytest.param("job-1234567890-abcdefghij-klmnopqrstu-vwxyz-0123456789", "gpu-0", id="statefulset-like"),
    ],
)
def test_long_template_claim_names_are_cut_to_a_valid_name_with_a_hash(pod_name: str, entry: str) -> None:
    name = template_claim_name(pod_name, entry)
    assert len(name) <= MAX_CLAIM_NAME
    assert DNS_SUBDOMAIN.fullmatch(name), name
    # Deterministic: a sync that crashed after creating it finds it again.
    assert template_claim_name(pod_name, entry) == name
    # Both parts stay recognisable.
    assert name.startswith(pod_name[:1])


def test_cut_names_of_different_pairs_differ() -> None:
    long = "p" * 70
    names = {template_claim_name(long, "gpu-a"), template_claim_name(long, "gpu-b"),
             template_claim_name(long + "q", "gpu-a")}
    assert len(names) == 3


def test_entries_that_resolve_to_the_same_claim_are_refused() -> None:
    # Entry "b" (template) becomes claim "trainer-b", which entry "a" names.
    text = json.dumps([{"name": "a", "claim": "trainer-b"}, {"name": "b", "template": "t"}])
    parse_claims(text)  # fine without the pod's name
    with pytest.raises(PodClaimsError, match="both resolve to GPUClaim 'trainer-b'"):
        pod_claims(pod("trainer", text))


def test_pod_claims_reads_the_annotation_of_a_raw_pod() -> None:
    entries = pod_claims(pod("trainer", '[{"name": "g", "className": "a", "count": 2}]'))
    assert entries == (ClaimEntry(name="g", class_name="a", count=2),)
    with pytest.raises(PodClaimsError, match="has no"):
        pod_claims(pod("trainer", None))


def test_inline_entry_gets_a_claim_owned_by_the_pod() -> None:
    p = pod("trainer")
    (entry,) = parse_claims('[{"name": "eval", "className": "a100", "count": 1}]')
    claim = template_claim(p, entry)
    meta = claim["metadata"]
    assert meta["name"] == "trainer-eval"
    assert meta["namespace"] == "ns"
    assert meta["finalizers"] == [CLAIM_FINALIZER]
    assert meta["labels"][TEMPLATE_CLAIM_LABEL] == "true"
    assert meta["annotations"][POD_CLAIM_NAME_ANNOTATION] == "eval"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "uid-1",
         "controller": True, "blockOwnerDeletion": True}
    ]
    assert claim["spec"] == {"className": "a100", "count": 1}
    assert is_template_claim_of(claim, "uid-1")
    assert not is_template_claim_of(claim, "uid-2")
    assert (template_owner_uid(claim), template_owner_name(claim)) == ("uid-1", "trainer")


def test_template_entry_copies_the_templates_metadata_and_spec() -> None:
    (entry,) = parse_claims('[{"name": "pair", "template": "a100-pair"}]')
    template_spec: dict[str, Any] = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
        "spec": {"className": "a100", "count": 2, "reclaimPolicy": "Retain"},
    }
    claim = template_claim(pod("trainer"), entry, template_spec)
    assert claim["metadata"]["labels"] == {"team": "ml", TEMPLATE_CLAIM_LABEL: "true"}
    assert claim["metadata"]["annotations"] == {"note": "x", POD_CLAIM_NAME_ANNOTATION: "pair"}
    assert claim["spec"] == {"className": "a100", "count": 2, "reclaimPolicy": "Retain"}
    # The template is not modified.
    assert template_spec["metadata"]["labels"] == {"team": "ml"}


def test_a_users_claim_with_a_template_claims_name_is_not_the_pods() -> None:
    users = {"metadata": {"name": "trainer-pair", "ownerReferences": [
        {"kind": "Pod", "uid": "uid-1", "controller": True}]}}
    assert not is_template_claim_of(users, "uid-1")  # no template label
    assert (template_owner_uid(users), template_owner_name(users)) == ("", "")


def test_a_claim_reference_has_nothing_to_create() -> None:
    (entry,) = parse_claims('[{"name": "g", "claim": "c"}]')
    with pytest.raises(ValueError):
        template_claim(pod(), entry)


def test_a_padded_annotation_parses_alike_and_is_not_kept_in_the_memo() -> None:
    """Whitespace up to the API server's 256 KiB of annotations is valid
    JSON; memoizing 4,096 such texts would pin a gigabyte."""
    from gpuclaimctl.model import podclaims

    entry = '{"name": "g", "className": "only-in-this-test", "count": 2}'
    padded = "[" + " " * 200_000 + entry + "]"
    before = podclaims._parse_claims_memoized.cache_info().currsize
    assert parse_claims(padded) == parse_claims("[" + entry + "]")
    assert podclaims._parse_claims_memoized.cache_info().currsize == before + 1  # the short one only
    assert parse_claims("[" + entry + "]") is parse_claims("[" + entry + "]")
