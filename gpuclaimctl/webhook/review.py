"""AdmissionReview v1 in, AdmissionReview v1 out.

The API server POSTs an `admission.k8s.io/v1` AdmissionReview whose
`request` carries the uid, the operation, who asks (`userInfo`) and the
object (and, for UPDATE, the old object); the answer echoes the uid with
`allowed`, a `status` (code, reason, message) when refused, and a
base64-encoded JSON patch (RFC 6902, `patchType: JSONPatch`) when a mutating
webhook changes the object.

`parse_review` refuses anything else with `BadReview`, whose message says
what is wrong in one line: the server answers it with HTTP 400 and logs it,
and the API server then applies the webhook's failurePolicy. Nothing here
raises anything but BadReview for bad input.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class Operation(StrEnum):
    CREATE = "CREATE"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    CONNECT = "CONNECT"


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request; str() says why."""


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of `AdmissionReview.request` the webhooks read."""

    uid: str
    operation: Operation
    namespace: str
    # Empty for a pod made with generateName: the name is chosen after admission.
    name: str
    username: str
    group: str
    resource: str
    sub_resource: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool = False


def parse_review(body: bytes) -> AdmissionRequest:
    """The request of an AdmissionReview v1 body, or BadReview."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadReview(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise BadReview("the body is JSON nested too deeply") from None
    if not isinstance(review, dict):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise BadReview(f"expected apiVersion {API_VERSION} kind {KIND}, got "
                        f"{review.get('apiVersion')!r} {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the request has no uid")
    try:
        operation = Operation(str(request.get("operation")))
    except ValueError:
        raise BadReview(f"unknown operation {request.get('operation')!r}") from None
    resource = request.get("resource")
    user = request.get("userInfo")
    if not isinstance(resource, dict) or not isinstance(user, dict):
        raise BadReview("the request has no resource or userInfo")
    obj, old = request.get("object"), request.get("oldObject")
    for what, value, needed in (("object", obj, operation in (Operation.CREATE, Operation.UPDATE)),
                                ("oldObject", old, operation is Operation.UPDATE)):
        if needed and not isinstance(value, dict):
            raise BadReview(f"a {operation.value} request needs an {what}")
        if value is not None and not isinstance(value, dict):
            raise BadReview(f"{what} is not an object")
    if resource.get("group") in ("", None) and resource.get("resource") == "pods" \
            and not request.get("subResource"):
        for what, value in (("object", obj), ("oldObject", old)):
            if value is not None:
                _check_pod_shape(what, value)
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        namespace=_text(request.get("namespace")),
        name=_text(request.get("name")),
        username=_text(user.get("username")),
        group=_text(resource.get("group")),
        resource=_text(resource.get("resource")),
        sub_resource=_text(request.get("subResource")),
        object=obj,
        old_object=old,
        dry_run=request.get("dryRun") is True,
    )


def _check_pod_shape(what: str, pod: Mapping[str, Any]) -> None:
    """BadReview unless the parts of a pod the webhooks read have the API's
    shape (the API server never sends another; a hand-made review may): the
    webhooks then read them without checking each step."""
    def expect(path: str, value: Any, kind: type, name: str) -> None:
        if value is not None and not isinstance(value, kind):
            raise BadReview(f"{what}.{path} is not {name}")

    meta, spec = pod.get("metadata"), pod.get("spec")
    expect("metadata", meta, dict, "an object")
    expect("spec", spec, dict, "an object")
    annotations = (meta or {}).get("annotations")
    expect("metadata.annotations", annotations, dict, "an object")
    for key, value in (annotations or {}).items():
        expect(f"metadata.annotations[{key!r}]", value, str, "a string")
    spec = spec or {}
    expect("spec.nodeName", spec.get("nodeName"), str, "a string")
    expect("spec.overhead", spec.get("overhead"), dict, "an object")
    expect("spec.schedulingGates", spec.get("schedulingGates"), list, "a list")
    for group in ("containers", "initContainers"):
        containers = spec.get(group)
        expect(f"spec.{group}", containers, list, "a list")
        for i, c in enumerate(containers or ()):
            expect(f"spec.{group}[{i}]", c, dict, "an object")
            resources = (c or {}).get("resources")
            expect(f"spec.{group}[{i}].resources", resources, dict, "an object")
            for part in ("requests", "limits"):
                expect(f"spec.{group}[{i}].resources.{part}", (resources or {}).get(part), dict, "an object")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Verdict:
    """What a webhook answers: allowed (perhaps with a patch), or refused
    with an HTTP-style code, a reason and a one-line message."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = field(default=())


def allow(patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()) -> Verdict:
    return Verdict(True, patch=tuple(patch), warnings=tuple(warnings))


def deny(message: str, *, code: int = 403, reason: str = "Forbidden") -> Verdict:
    # The API server shows the message after "admission webhook "<name>"
    # denied the request: "; one line, so kubectl prints it whole.
    return Verdict(False, message=" ".join(message.split()), code=code, reason=reason)


def invalid(message: str) -> Verdict:
    return deny(message, code=422, reason="Invalid")


def response(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview v1 that answers request `uid`."""
    answer: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        answer["status"] = {"code": verdict.code, "reason": verdict.reason,
                            "message": verdict.message}
    if verdict.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if verdict.warnings:
        answer["warnings"] = list(verdict.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}


def pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) to the path `parts`: `~` and `/` escaped."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)
