"""The pod annotation `gpuclaimctl.io/claims`: parsing, validation, naming.

A pod names its GPU claims in a JSON list (DESIGN.md §3). This module turns
that text into frozen `ClaimEntry` values or a `PodClaimsError` whose
message a user can act on; it never raises anything else for bad input, so
a malformed annotation cannot crash a sync. It also derives the
deterministic name of the claim a `template` or inline entry gets and the
body of that claim.

Pure: no client, no clock, no globals.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuclaimctl.model.api import (
    API_VERSION,
    CLAIM_FINALIZER,
    CLAIM_KIND,
    CLAIMS_ANNOTATION,
    FINISHED_PHASES,
    PLACED_NODE_ANNOTATION,
    POD_CLAIM_NAME_ANNOTATION,
    SCHEDULING_GATE,
    TEMPLATE_CLAIM_LABEL,
    TEMPLATE_CLAIM_LABEL_VALUE,
)
from gpuclaimctl.model import keys
from gpuclaimctl.model.owners import controller_pod

# Bounds the work a malformed pod can cause; far above any node's GPU set.
MAX_ENTRIES = 32

# Template claim names stay within 63 characters, so besides being a valid
# object name (DNS subdomain, 253) a claim name is also a valid label value.
MAX_CLAIM_NAME = 63
# 10 hex digits = 40 bits: a collision between two cut names of one
# namespace is not a practical concern, and a collision still shows up as
# NameTaken rather than two pods sharing a claim.
_HASH_LEN = 10


_FIELDS = ("name", "claim", "template", "className", "count")


class EntrySource(StrEnum):
    """Where an entry's claim comes from."""

    CLAIM = "claim"  # an existing GPUClaim, referenced by name
    TEMPLATE = "template"  # created from a GPUClaimTemplate
    INLINE = "inline"  # created from the entry's className and count


@dataclass(frozen=True)
class ClaimEntry:
    """One validated entry of the annotation; exactly one source is set."""

    name: str
    claim: str | None = None
    template: str | None = None
    class_name: str | None = None
    count: int | None = None

    @property
    def source(self) -> EntrySource:
        if self.claim is not None:
            return EntrySource.CLAIM
        if self.template is not None:
            return EntrySource.TEMPLATE
        return EntrySource.INLINE

    def claim_name(self, pod_name: str) -> str:
        """The GPUClaim this entry uses for pod `pod_name`."""
        if self.claim is not None:
            return self.claim
        return template_claim_name(pod_name, self.name)


class PodClaimsError(ValueError):
    """The annotation is unusable; `str()` is the message for the user."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"annotation {CLAIMS_ANNOTATION} is invalid: "
        if len(self.problems) == 1:
            return head + self.problems[0]
        return head + "; ".join(f"({i}) {p}" for i, p in enumerate(self.problems, 1))


# Texts memoized by parse_claims: at most this long. MAX_ENTRIES entries
# of real names fit in far less; a text padded to the API server's 256 KiB
# of annotations is parsed each time instead, or 4,096 such pods would pin
# a gigabyte in the cache.
MEMOIZED_TEXT_MAX = 8192


def parse_claims(text: str | None) -> tuple[ClaimEntry, ...]:
    """Parse and validate the annotation's text.

    Raises PodClaimsError listing every problem found (not only the first),
    so a user fixes the annotation in one edit.

    Memoized on the text (the entries are immutable) up to
    MEMOIZED_TEXT_MAX characters: the pods of one job carry the same
    annotation, and every pod event and sync reads it; an invalid text (an
    error, which is not memoized) is parsed each time.
    """
    if text is not None and len(text) <= MEMOIZED_TEXT_MAX:
        return _parse_claims_memoized(text)
    return _parse_claims(text)


@functools.lru_cache(maxsize=4096)
def _parse_claims_memoized(text: str) -> tuple[ClaimEntry, ...]:
    return _parse_claims(text)


def _parse_claims(text: str | None) -> tuple[ClaimEntry, ...]:
    if text is None:
        raise PodClaimsError(
            [f"the pod has no {CLAIMS_ANNOTATION} annotation; it must list the pod's GPU claims"]
        )
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except _DuplicateKey as e:
        raise PodClaimsError([str(e)]) from None
    except ValueError as e:
        # json.JSONDecodeError and _no_constant's error both land here.
        raise PodClaimsError([f"not valid JSON: {e}"]) from None
    except RecursionError:
        # "[[[[...]]]]" a thousand deep: the decoder's recursion limit, a
        # RuntimeError that would otherwise escape every caller.
        raise PodClaimsError(["nested too deeply; it must be a flat JSON list of entries"]) from None
    if not isinstance(raw, list):
        raise PodClaimsError(
            [f"must be a JSON list of entries like "
             f'[{{"name": "gpu", "className": "a100", "count": 1}}], got {_kind(raw)}']
        )
    if not raw:
        raise PodClaimsError(["the list is empty; name at least one claim or remove the scheduling gate"])
    if len(raw) > MAX_ENTRIES:
        raise PodClaimsError([f"has {len(raw)} entries; at most {MAX_ENTRIES} are allowed"])

    problems: list[str] = []
    entries: list[ClaimEntry] = []
    for index, item in enumerate(raw):
        entry = _entry(index, item, problems)
        if entry is not None:
            entries.append(entry)

    seen_names: dict[str, int] = {}
    seen_claims: dict[str, str] = {}
    for entry in entries:
        if entry.name in seen_names:
            problems.append(f"entry name {entry.name!r} is used more than once; names must be unique")
        seen_names[entry.name] = 1
        if entry.claim is not None:
            other = seen_claims.get(entry.claim)
            if other is not None:
                problems.append(
                    f"entries {other!r} and {entry.name!r} both name GPUClaim {entry.claim!r}; "
                    f"a claim is used once per pod"
                )
            seen_claims.setdefault(entry.claim, entry.name)
    if problems:
        raise PodClaimsError(problems)
    return tuple(entries)


def pod_claims(pod: Mapping[str, Any]) -> tuple[ClaimEntry, ...]:
    """parse_claims on a raw pod's annotation, plus the checks that need the
    pod's name: two entries must not resolve to the same claim."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    entries = parse_claims(annotations.get(CLAIMS_ANNOTATION))
    pod_name = meta.get("name", "")
    owner: dict[str, str] = {}
    problems = []
    for entry in entries:
        name = entry.claim_name(pod_name)
        if name in owner:
            problems.append(
                f"entries {owner[name]!r} and {entry.name!r} both resolve to GPUClaim {name!r}"
            )
        owner.setdefault(name, entry.name)
    if problems:
        raise PodClaimsError(problems)
    return entries


def template_claim_name(pod_name: str, entry_name: str) -> str:
    """The claim name for a pod's template or inline entry: `<pod>-<entry>`.

    Deterministic, as the upstream resourceclaim controller's names were
    before it moved to generateName, so a sync that crashed after creating
    the claim finds it again by name. A name longer than MAX_CLAIM_NAME has
    both parts cut in proportion to their length (upstream's rule, so the
    entry's part survives a long pod name) and a hash of the uncut pair
    appended, which keeps distinct pairs apart.
    """
    full = f"{pod_name}-{entry_name}"
    if len(full) <= MAX_CLAIM_NAME:
        return full
    digest = hashlib.sha256(f"{pod_name}\x00{entry_name}".encode()).hexdigest()[:_HASH_LEN]
    # Two parts, the hash and two hyphens.
    budget = MAX_CLAIM_NAME - _HASH_LEN - 2
    pod_len = max(1, len(pod_name) * budget // (len(pod_name) + len(entry_name)))
    entry_len = budget - pod_len
    pod_part, entry_part = pod_name[:pod_len], entry_name[:entry_len]
    # A cut may end a part on "-" or "." (invalid before another character
    # class); strip back to an alphanumeric.
    parts = [p.rstrip("-.") for p in (pod_part, entry_part)]
    return "-".join([p for p in parts if p] + [digest])


def template_claim(
    pod: Mapping[str, Any],
    entry: ClaimEntry,
    template_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The GPUClaim object to create for `entry` of `pod`.

    `template_spec` is the GPUClaimTemplate's `spec` for a template entry;
    an inline entry passes None. Owned by the pod with a controller
    reference, as upstream's template claims are; the claim's own finalizer,
    not the garbage collector, decides when it goes.
    """
    if entry.source is EntrySource.CLAIM:
        raise ValueError(f"entry {entry.name!r} references an existing claim; nothing to create")
    meta = pod.get("metadata") or {}
    if entry.source is EntrySource.TEMPLATE:
        if template_spec is None:
            raise ValueError(f"entry {entry.name!r} needs its template's spec")
        tmeta = template_spec.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        annotations = dict(tmeta.get("annotations") or {})
        spec = dict(template_spec.get("spec") or {})
    else:
        labels, annotations = {}, {}
        spec = {"className": entry.class_name, "count": entry.count}
    labels[TEMPLATE_CLAIM_LABEL] = TEMPLATE_CLAIM_LABEL_VALUE
    annotations[POD_CLAIM_NAME_ANNOTATION] = entry.name
    return {
        "apiVersion": API_VERSION,
        "kind": CLAIM_KIND,
        "metadata": {
            "name": template_claim_name(meta["name"], entry.name),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "finalizers": [CLAIM_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def template_owner(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference of the pod a template claim was made for; None for
    any other claim (no template label, or no controller pod)."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    if labels.get(TEMPLATE_CLAIM_LABEL) != TEMPLATE_CLAIM_LABEL_VALUE:
        return None
    return controller_pod(claim)


def template_owner_uid(claim: Mapping[str, Any]) -> str:
    """The uid of the pod a template claim was made for, or "" for any other claim."""
    return str((template_owner(claim) or {}).get("uid") or "")


def template_owner_name(claim: Mapping[str, Any]) -> str:
    """The name of the pod a template claim was made for, or "" for any other claim."""
    return str((template_owner(claim) or {}).get("name") or "")


def is_template_claim_of(claim: Mapping[str, Any], pod_uid: str) -> bool:
    """True if `claim` is a template claim controlled by the pod `pod_uid`
    (anything else under a template claim's name is NameTaken or an older
    pod's claim)."""
    return bool(pod_uid) and template_owner_uid(claim) == pod_uid


# --- validation helpers ---------------------------------------------------


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys; a user who wrote a field
    # twice meant one of them, and we cannot tell which.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"field {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _entry(index: int, item: Any, problems: list[str]) -> ClaimEntry | None:
    where = f"entry {index + 1}"
    if not isinstance(item, dict):
        problems.append(f"{where} must be an object, got {_kind(item)}")
        return None
    before = len(problems)
    name = item.get("name")
    if isinstance(name, str) and name:
        where = f"entry {name!r}"
    unknown = sorted(set(item) - set(_FIELDS))
    if unknown:
        problems.append(
            f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(_FIELDS)}"
        )

    if name is None:
        problems.append(f"{where} has no name")
    elif not isinstance(name, str) or not keys.is_dns_label(name):
        problems.append(
            f"{where}: name {name!r} is not a DNS label "
            f"(lowercase letters, digits and '-', starting and ending alphanumeric, at most 63)"
        )

    claim = item.get("claim")
    template = item.get("template")
    class_name = item.get("className")
    count = item.get("count")
    for field, value in (("claim", claim), ("template", template), ("className", class_name)):
        if value is not None and (not isinstance(value, str) or not keys.is_dns_subdomain(value)):
            problems.append(f"{where}: {field} {value!r} is not a valid object name")

    sources = [f for f, v in (("claim", claim), ("template", template), ("className", class_name)) if v is not None]
    if len(sources) > 1:
        problems.append(
            f"{where} sets {' and '.join(sources)}; an entry has exactly one of "
            f"claim, template, or className with count"
        )
    elif not sources:
        problems.append(
            f"{where} has none of claim, template, or className with count"
            + ("; count needs a className" if count is not None else "")
        )

    if count is not None:
        if class_name is None and sources:
            problems.append(f"{where}: count goes only with className (a claim or template sets its own)")
        elif isinstance(count, bool) or not isinstance(count, int):
            problems.append(f"{where}: count must be a whole number, got {count!r}")
        elif count < 1:
            problems.append(f"{where}: count must be at least 1, got {count}")
        elif count > 2**31 - 1:
            problems.append(f"{where}: count {count} is too large")
    elif class_name is not None:
        problems.append(f"{where}: className needs a count")

    if len(problems) > before or not isinstance(name, str):
        return None
    return ClaimEntry(
        name=name,
        claim=claim,
        template=template,
        class_name=class_name,
        count=count,
    )




def has_gate(pod: Mapping[str, Any]) -> bool:
    """The pod carries our scheduling gate.

    Called several times for every pod event (indexes, handlers, the view):
    the plain-dict test comes first, as an `isinstance` against the
    `Mapping` ABC costs more than the rest of the check."""
    spec = pod.get("spec") if type(pod) is dict or isinstance(pod, Mapping) else None
    gates = spec.get("schedulingGates") if type(spec) is dict or isinstance(spec, Mapping) else None
    if type(gates) is not list:
        return False
    for g in gates:
        if (type(g) is dict or isinstance(g, Mapping)) and g.get("name") == SCHEDULING_GATE:
            return True
    return False


def named_claims(pod: Mapping[str, Any]) -> frozenset[str]:
    """The names of the GPUClaims the pod's annotation names (none if it is invalid)."""
    try:
        entries = pod_claims(pod)
    except PodClaimsError:
        return frozenset()
    name = (pod.get("metadata") or {}).get("name", "")
    return frozenset(e.claim_name(name) for e in entries)


def names_claims_ungated(pod: Mapping[str, Any]) -> bool:
    """A pod that names GPU claims (the annotation) but does not carry our
    gate and was never released by us: created without it where no webhook
    adds it, or ungated by someone else before its claims were placed.
    Only while it is not yet on a node and not finished: once it runs, the
    telling is late, and a restart would tell every such running pod again."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if CLAIMS_ANNOTATION not in annotations or PLACED_NODE_ANNOTATION in annotations or has_gate(pod):
        return False
    return not (pod.get("spec") or {}).get("nodeName") and \
        (pod.get("status") or {}).get("phase") not in FINISHED_PHASES
