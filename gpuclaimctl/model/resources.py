"""Resource quantities, and what a pod requests of extended resources (GPUs)
as kube-scheduler counts it.

The requests are read by the node usage (decide.capacity: pods on a
node), by placement (model.snapshot.PodInfo: a pod's own requests must fit
in what its claims hold) and by the webhook. Pure: no client, no clock, no
globals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from gpuclaimctl.model.api import CLAIMS_ANNOTATION

_QUANTITY = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
# suffix -> (power of 2, power of 10). "E" alone is exa (10^18), "Ei" exbi;
# only "e"/"E" followed by digits is a decimal exponent.
_SUFFIX = {
    "n": (0, -9), "u": (0, -6), "m": (0, -3), "": (0, 0),
    "k": (0, 3), "M": (0, 6), "G": (0, 9), "T": (0, 12), "P": (0, 15), "E": (0, 18),
    "Ki": (10, 0), "Mi": (20, 0), "Gi": (30, 0), "Ti": (40, 0), "Pi": (50, 0), "Ei": (60, 0),
}
# What a quantity is capped at: int64, as Kubernetes counts resources. A
# larger one (the API server accepts "1e30", even "1e100000") is "more than
# anything": a bigger figure would only break int64 status fields and the
# formatting of huge ints in messages.
QUANTITY_MAX = 2**63 - 1
# Digits of a mantissa worth reading: beyond them a figure cannot change
# the whole number by more than rounding at the int64 cap.
_MANTISSA_DIGITS = 60


def parse_quantity(value: Any) -> int | None:
    """A resource.Quantity as a whole number (rounded down, capped at
    QUANTITY_MAX in size), or None if it is not one. Extended resources such
    as GPUs are always whole. Exact: no float or limited-precision decimal
    is involved, so "1E" is 10^18 and "123456789012345678901k" loses no digit."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return max(-QUANTITY_MAX, min(value, QUANTITY_MAX))
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) <= 18 and text.isascii() and text.isdigit():
        return int(text)
    m = _QUANTITY.fullmatch(text)
    if m is None:
        return None
    sign, whole, frac, suffix = m.group(1), m.group(2), m.group(3) or "", m.group(4) or ""
    if not whole and not frac:
        return None
    if suffix in _SUFFIX:
        pow2, pow10 = _SUFFIX[suffix]
    else:
        exp = suffix[1:].lstrip("+")
        negative = exp.startswith("-")
        digits = exp.lstrip("-").lstrip("0") or "0"
        # An exponent past this bound is far beyond the cap either way.
        pow2, pow10 = 0, (-(10**6) if negative else 10**6) if len(digits) > 6 else int(exp)
    mantissa = (whole + frac).lstrip("0")
    if not mantissa:
        return 0
    pow10 -= len(frac)
    if len(mantissa) > _MANTISSA_DIGITS:
        pow10 += len(mantissa) - _MANTISSA_DIGITS
        mantissa = mantissa[:_MANTISSA_DIGITS]
    # |value| = mantissa * 2^pow2 * 10^pow10, with 10^(len-1) <= mantissa < 10^len.
    if len(mantissa) + pow10 > 40:
        amount = QUANTITY_MAX  # at least 10^40 > int64
    elif len(mantissa) + pow10 < -20:
        amount = 0  # below 10^-20 * 2^60 < 1
    else:
        n = int(mantissa) << pow2
        amount = n * 10**pow10 if pow10 >= 0 else n // 10**-pow10
    amount = min(amount, QUANTITY_MAX)
    return -amount if sign == "-" else amount


def extended_resources(pod: Mapping[str, Any]) -> frozenset[str]:
    """The extended resources (`vendor/name`, not `kubernetes.io/…`) any
    container of the pod requests or limits."""
    spec = pod.get("spec") or {}
    out: set[str] = set()
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or ():
            res = c.get("resources") or {}
            for key in list(res.get("requests") or ()) + list(res.get("limits") or ()):
                if "/" in key and not key.startswith("kubernetes.io/"):
                    out.add(key)
    return frozenset(out)


def pod_request(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request of `resource`, as the scheduler counts it
    (component-helpers PodRequests): the sum over containers and sidecars,
    or the largest init container plus the sidecars started before it, if
    larger; plus overhead. Requests default to limits, as the API server
    defaults them for extended resources."""
    spec = pod.get("spec") or {}
    total = sum(_container_request(c, resource) for c in spec.get("containers") or ())
    sidecars = 0
    init_peak = 0
    for c in spec.get("initContainers") or ():
        amount = _container_request(c, resource)
        if c.get("restartPolicy") == "Always":
            total += amount
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount + sidecars)
    total = max(total, init_peak)
    overhead = parse_quantity((spec.get("overhead") or {}).get(resource)) or 0
    return total + overhead


def _container_request(container: Mapping[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("requests") or {}).get(resource)
    if value is None:
        value = (resources.get("limits") or {}).get(resource)
    return parse_quantity(value) or 0


def requests_beyond_claims(requests: Iterable[tuple[str, int]], held: Mapping[str, int], counted: Set[str],
                           detail: Mapping[str, Sequence[str]]) -> str | None:
    """Why a pod may not have its claims: its containers request more of a
    resource some class counts in than its claims hold of it (`held`;
    `detail`, per resource, says what each claim gives). None if they do
    not. The webhook refuses with this at create, placement waits with it."""
    for resource, requested in sorted(requests):
        if resource in counted and requested > held.get(resource, 0):
            what = "; ".join(detail.get(resource, ())) or "none of its claims is of a class counted in it"
            return (f"the pod's containers request {requested} {resource} but its GPU claims hold "
                    f"{held.get(resource, 0)} ({what}); request at most what the claims hold, or "
                    f"claim more in {CLAIMS_ANNOTATION}")
    return None
