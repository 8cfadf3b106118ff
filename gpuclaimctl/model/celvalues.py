"""The values of Kubernetes' CEL libraries that DeviceClass selectors
compare: semantic versions (`semver()`, version attributes) and quantities
(`quantity()`, device capacities), parsed and ordered as the Go code does
(github.com/blang/semver/v4; k8s.io/apimachinery resource.Quantity), for
`model.dracel`.

Pure: no client, no clock, no globals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering

@total_ordering
@dataclass(frozen=True)
class Semver:
    """A semantic version as github.com/blang/semver/v4 parses and orders it
    (what Kubernetes' `semver()` and version attributes use). Build metadata
    is kept but ignored by comparisons and equality, as `Version.Compare`."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    def compare(self, other: Semver) -> int:
        for a, b in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if a != b:
                return -1 if a < b else 1
        if not self.pre and not other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for a_id, b_id in zip(self.pre, other.pre):
            c = _compare_pre(a_id, b_id)
            if c:
                return c
        if len(self.pre) == len(other.pre):
            return 0
        return -1 if len(self.pre) < len(other.pre) else 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __lt__(self, other: Semver) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _compare_pre(a: int | str, b: int | str) -> int:
    if isinstance(a, int) and isinstance(b, int):
        return (a > b) - (a < b)
    if isinstance(a, int):
        return -1  # numeric identifiers sort before alphanumeric ones
    if isinstance(b, int):
        return 1
    return (a > b) - (a < b)


_SEMVER_IDENT = re.compile(r"[0-9A-Za-z-]+")
_UINT64_MAX = 2**64 - 1


def _semver_number(text: str, what: str) -> int:
    if not text or not text.isascii() or not text.isdigit():
        raise ValueError(f"invalid character(s) found in {what} number {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what} number must not contain leading zeroes {text!r}")
    value = int(text)
    if value > _UINT64_MAX:
        raise ValueError(f"{what} number {text!r} is out of range")
    return value


def parse_semver(text: str) -> Semver:
    """blang/semver/v4 `Parse`: MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD], no
    leading zeroes, no "v" prefix. ValueError says what is wrong."""
    if not text:
        raise ValueError("version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("no Major.Minor.Patch elements found")
    major = _semver_number(parts[0], "major")
    minor = _semver_number(parts[1], "minor")
    rest = parts[2]
    build: tuple[str, ...] = ()
    pre: tuple[int | str, ...] = ()
    if "+" in rest:
        rest, _, build_text = rest.partition("+")
        build = tuple(build_text.split("."))
        for b in build:
            if not _SEMVER_IDENT.fullmatch(b):
                raise ValueError(f"invalid build metadata {b!r}")
    if "-" in rest:
        rest, _, pre_text = rest.partition("-")
        ids: list[int | str] = []
        for p in pre_text.split("."):
            if not p:
                raise ValueError("prerelease is empty")
            if p.isascii() and p.isdigit():
                ids.append(_semver_number(p, "prerelease"))
            elif _SEMVER_IDENT.fullmatch(p):
                ids.append(p)
            else:
                raise ValueError(f"invalid character(s) found in prerelease {p!r}")
        pre = tuple(ids)
    patch = _semver_number(rest, "patch")
    return Semver(major, minor, patch, pre, build)


def normalize_semver(text: str) -> str:
    """Kubernetes' `normalizeAndParse` (semver(s, true)): no "v" prefix,
    leading zeroes dropped, missing minor and patch added as 0."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, p in enumerate(parts):
        if len(p) > 1:
            p = p.lstrip("0")
            if not p or p[0] not in "0123456789":
                p = "0" + p
            parts[i] = p
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


@dataclass(frozen=True)
class Quantity:
    """A resource.Quantity as an exact number (its value, not its spelling)."""

    value: Fraction

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)


# What resource.ParseQuantity accepts: a signed decimal number and one
# suffix (binary SI, decimal SI, or a decimal exponent).
_QUANTITY = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity_exact(text: str) -> Quantity:
    """A quantity string as an exact value; ValueError if it is not one.
    (model.resources.parse_quantity rounds to whole numbers for extended
    resources; a capacity such as "40Gi" or "1.5" is compared exactly.)"""
    m = _QUANTITY.fullmatch(text)
    if m is None or (not m.group(2) and not m.group(3)):
        raise ValueError("quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    sign, whole, frac, suffix = m.group(1), m.group(2), m.group(3) or "", m.group(4) or ""
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    if suffix in _BINARY:
        value *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    else:
        exp = int(suffix[1:])
        if abs(exp) > 10**4:  # far beyond anything a Quantity holds (int64 scaled)
            raise ValueError(f"quantity exponent out of range: {text!r}")
        value *= Fraction(10) ** exp
    return Quantity(-value if sign == "-" else value)
