"""Probe: would reading pods as protobuf make our informer faster? (issue 12, item 6)

    python -m benchmarks.protobuf_probe [--pods 4000] [--repeat 3]

client-go reads built-in types as protobuf by default, and kube-apiserver
serves protobuf faster than JSON (``make bench-informers``). This probe
answers the question on our side of the wire, without a plane: it makes
``--pods`` pods with ``informer_bench.pod_manifest`` and the metadata and
status the API server adds, has the Go program ``benchmarks/go/informer/cmd/podproto``
encode each with k8s.io/api's own ``Pod.Marshal``, and times two ways of
turning the bytes into what the controller caches:

- JSON: ``orjson.loads`` then ``podcache.prune_pod`` (what the controller does);
- protobuf: the decoder below, a pure-Python wire reader that descends only
  into the fields ``prune_pod`` keeps and skips every other field by its
  length, building the same dicts (Go's JSON rules for those fields:
  empty strings and lists omitted where the field is ``omitempty``, the
  zero metav1.Time as null, times in RFC 3339 seconds).

It fails unless both give equal dicts for every pod. Each figure is the
best of ``--repeat`` runs of CPU time with the cyclic collector paused.
This is a probe of a design choice, not a reader: the protobuf decoder
covers the kept fields as the probe's pods hold them (no envelope, no
Status frames), and nothing in the controller uses it.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import struct
import subprocess
import time
from typing import Any, Iterator

import orjson

from benchmarks.informer_bench import BIN_DIR, GO_MODULE, pod_manifest
from gpuclaimctl.model.podcache import prune_pod

PODPROTO = BIN_DIR / "podproto"


def build() -> None:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("protobuf_probe: needs `go` on the PATH to build cmd/podproto")
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-trimpath", "-o", str(PODPROTO), "./cmd/podproto"], cwd=GO_MODULE, check=True)


def fields_v1(value: Any) -> Any:
    """The managedFields set a create by its manager records for ``value`` (keyed list items by name)."""
    if isinstance(value, dict):
        out = {f"f:{k}": fields_v1(v) for k, v in value.items()}
        return {".": {}, **out} if out else {}
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return {f'k:{{"name":"{v["name"]}"}}': {".": {}, **fields_v1(v)} for v in value}
    return {}


def server_pod(i: int) -> dict[str, Any]:
    """``pod_manifest`` with what the API server adds that the cache keeps or skips:
    uid, times, an owner, the creator's managedFields, a status."""
    pod = pod_manifest(i, f"team-{i % 10}")
    created = fields_v1({"metadata": {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")},
                         "spec": pod["spec"]})
    pod["metadata"].update(
        uid=f"0c1b2a3d-{i:08x}-4e5f-8a9b-c0d1e2f3a4b5", resourceVersion=str(100_000 + i),
        creationTimestamp="2026-12-03T14:42:16Z", generateName=pod["metadata"]["name"][:-6],
        ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer", "uid": f"job-{i}",
                          "controller": True, "blockOwnerDeletion": True}],
        managedFields=[{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                        "time": "2026-12-03T14:42:16Z", "fieldsType": "FieldsV1", "fieldsV1": created}])
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [
        {"type": "PodScheduled", "status": "False", "lastProbeTime": None,
         "lastTransitionTime": "2026-12-03T14:42:16Z", "reason": "SchedulingGated",
         "message": "Scheduling is blocked due to non-empty scheduling gates"}]}
    return pod


# -- the protobuf side: field numbers from k8s.io/api and apimachinery's generated.proto

Fields = Iterator[tuple[int, int, int]]


def _varint(b: bytes, i: int, first: int) -> tuple[int, int]:
    """The rest of a varint whose first byte ``first`` (continued) came before ``i``."""
    value = first & 0x7F
    shift = 7
    while True:
        x = b[i]
        i += 1
        value |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return value, i


def fields(b: bytes, i: int, end: int) -> Fields:
    """(field number, start, end) of each length-delimited field, (number, value, -1) of each varint.
    One-byte varints, nearly all of them, are read inline."""
    while i < end:
        tag = b[i]
        i += 1
        if tag & 0x80:
            tag, i = _varint(b, i, tag)
        wire = tag & 7
        if wire in (0, 2):
            n = b[i]
            i += 1
            if n & 0x80:
                n, i = _varint(b, i, n)
            if wire == 2:
                yield tag >> 3, i, i + n
                i += n
            else:
                yield tag >> 3, n, -1
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")


def text(b: bytes, a: int, e: int) -> str:
    return b[a:e].decode()


def timestamp(b: bytes, a: int, e: int) -> str | None:
    seconds = 0
    for f, x, _ in fields(b, a, e):
        if f == 1:
            seconds = x
    # metav1.Time: the zero time travels as an empty Timestamp and is JSON's null
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else None


def string_map(b: bytes, a: int, e: int, into: dict[str, str]) -> None:
    key = value = ""
    for f, x, y in fields(b, a, e):
        if f == 1:
            key = text(b, x, y)
        elif f == 2:
            value = text(b, x, y)
    into[key] = value


def quantity_map(b: bytes, a: int, e: int, into: dict[str, str]) -> None:
    key = value = ""
    for f, x, y in fields(b, a, e):
        if f == 1:
            key = text(b, x, y)
        elif f == 2:
            for g, p, q in fields(b, x, y):
                if g == 1:
                    value = text(b, p, q)
    into[key] = value


_META = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
_OWNER = {5: "apiVersion", 1: "kind", 3: "name", 4: "uid"}


def metadata(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    owners = []
    finalizers = []
    for f, x, y in fields(b, a, e):
        if f in _META:
            if y > x:
                out[_META[f]] = text(b, x, y)
        elif f == 8:
            out["creationTimestamp"] = timestamp(b, x, y)
        elif f == 9:
            out["deletionTimestamp"] = timestamp(b, x, y)
        elif f == 12:
            string_map(b, x, y, annotations)
        elif f == 13:
            owner: dict[str, Any] = {}
            for g, p, q in fields(b, x, y):
                if g in _OWNER:
                    owner[_OWNER[g]] = text(b, p, q)
                elif g == 6:
                    owner["controller"] = bool(p)
                elif g == 7:
                    owner["blockOwnerDeletion"] = bool(p)
            owners.append(owner)
        elif f == 14:
            finalizers.append(text(b, x, y))
    if annotations:
        out["annotations"] = annotations
    if owners:
        out["ownerReferences"] = owners
    if finalizers:
        out["finalizers"] = finalizers
    return out


def container(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, x, y in fields(b, a, e):
        if f == 1:
            out["name"] = text(b, x, y)
        elif f == 8:
            resources: dict[str, Any] = {}
            for g, p, q in fields(b, x, y):
                if g == 1:
                    quantity_map(b, p, q, resources.setdefault("limits", {}))
                elif g == 2:
                    quantity_map(b, p, q, resources.setdefault("requests", {}))
            out["resources"] = resources
        elif f == 24:
            out["restartPolicy"] = text(b, x, y)
    return out


def requirement(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    values = []
    for f, x, y in fields(b, a, e):
        if f == 1:
            out["key"] = text(b, x, y)
        elif f == 2:
            out["operator"] = text(b, x, y)
        elif f == 3:
            values.append(text(b, x, y))
    if values:
        out["values"] = values
    return out


def term(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, x, y in fields(b, a, e):
        if f == 1:
            out.setdefault("matchExpressions", []).append(requirement(b, x, y))
        elif f == 2:
            out.setdefault("matchFields", []).append(requirement(b, x, y))
    return out


def affinity(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, x, y in fields(b, a, e):
        if f == 1:
            node: dict[str, Any] = {}
            for g, p, q in fields(b, x, y):
                if g == 1:
                    node["requiredDuringSchedulingIgnoredDuringExecution"] = {
                        "nodeSelectorTerms": [term(b, s, t) for h, s, t in fields(b, p, q) if h == 1]}
                elif g == 2:
                    preferred: dict[str, Any] = {}
                    for h, s, t in fields(b, p, q):
                        if h == 1:
                            preferred["weight"] = s
                        elif h == 2:
                            preferred["preference"] = term(b, s, t)
                    node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(preferred)
            out["nodeAffinity"] = node
    return out


_TOLERATION = {1: "key", 2: "operator", 3: "value", 4: "effect"}


def spec(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    volumes = []
    containers = []
    init_containers = []
    tolerations = []
    node_selector: dict[str, str] = {}
    gates: list[dict[str, str]] = []
    for f, x, y in fields(b, a, e):
        if f == 1:
            name = ""
            kept: dict[str, Any] | None = None
            for g, p, q in fields(b, x, y):
                if g == 1:
                    name = text(b, p, q)
                elif g == 2:
                    for h, s, t in fields(b, p, q):
                        if h == 10:
                            claim = "".join(text(b, u, v) for k, u, v in fields(b, s, t) if k == 1)
                            kept = {"persistentVolumeClaim": {"claimName": claim}}
                        elif h == 29:
                            kept = {"ephemeral": {}}
            if kept is not None:
                volumes.append({"name": name, **kept})
        elif f == 2:
            containers.append(container(b, x, y))
        elif f == 20:
            init_containers.append(container(b, x, y))
        elif f == 7:
            string_map(b, x, y, node_selector)
        elif f == 10:
            if y > x:
                out["nodeName"] = text(b, x, y)
        elif f == 18:
            out["affinity"] = affinity(b, x, y)
        elif f == 22:
            toleration: dict[str, Any] = {}
            for g, p, q in fields(b, x, y):
                if g in _TOLERATION:
                    if q > p:
                        toleration[_TOLERATION[g]] = text(b, p, q)
                elif g == 5:
                    toleration["tolerationSeconds"] = p
            tolerations.append(toleration)
        elif f == 38:
            gates.extend({"name": text(b, p, q)} for g, p, q in fields(b, x, y) if g == 1)
    if gates:
        out["schedulingGates"] = gates
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    if containers:
        out["containers"] = containers
    if init_containers:
        out["initContainers"] = init_containers
    out["volumes"] = volumes
    return out


_CONDITION = {1: "type", 2: "status", 5: "reason", 6: "message"}


def status(b: bytes, a: int, e: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conditions = []
    for f, x, y in fields(b, a, e):
        if f == 1:
            if y > x:
                out["phase"] = text(b, x, y)
        elif f == 2:
            condition: dict[str, Any] = {}
            for g, p, q in fields(b, x, y):
                if g in _CONDITION:
                    condition[_CONDITION[g]] = text(b, p, q)
                elif g == 3:
                    condition["lastProbeTime"] = timestamp(b, p, q)
                elif g == 4:
                    condition["lastTransitionTime"] = timestamp(b, p, q)
            conditions.append(condition)
    if conditions:
        out["conditions"] = conditions
    return out


def pruned_from_protobuf(b: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, x, y in fields(b, 0, len(b)):
        if f == 1:
            out["metadata"] = metadata(b, x, y)
        elif f == 2:
            out["spec"] = spec(b, x, y)
        elif f == 3:
            out["status"] = status(b, x, y)
    return out


def pruned_from_json(line: bytes) -> dict[str, Any]:
    pod = prune_pod(orjson.loads(line))
    # a watch event's object has them; the Go encoder puts them in the Unknown envelope instead
    pod.pop("apiVersion", None)
    pod.pop("kind", None)
    return pod


def best_cpu(fn: Any, items: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            for item in items:
                fn(item)
            best = min(best, time.process_time() - start)
        finally:
            gc.enable()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    build()
    lines = [orjson.dumps(server_pod(i)) for i in range(args.pods)]
    encoded = subprocess.run([str(PODPROTO)], input=b"\n".join(lines) + b"\n",
                             capture_output=True, check=True).stdout
    messages = []
    i = 0
    while i < len(encoded):
        (size,) = struct.unpack_from(">I", encoded, i)
        messages.append(encoded[i + 4:i + 4 + size])
        i += 4 + size
    if len(messages) != len(lines):
        raise SystemExit(f"podproto wrote {len(messages)} pods for {len(lines)}")
    differ = [n for n, (m, j) in enumerate(zip(messages, lines)) if pruned_from_protobuf(m) != pruned_from_json(j)]
    if differ:
        raise SystemExit(f"the decoders disagree on {len(differ)} pods, the first {differ[0]}")
    json_s = best_cpu(pruned_from_json, lines, args.repeat)
    proto_s = best_cpu(pruned_from_protobuf, messages, args.repeat)
    n = len(lines)
    print(f"protobuf_probe: {n} pods, {sum(map(len, lines)) / n:.0f} B of JSON and "
          f"{sum(map(len, messages)) / n:.0f} B of protobuf each; both decoders give equal dicts for all {n}")
    print(f"CPU per pod, best of {args.repeat}, collector paused:")
    print(f"  JSON: orjson.loads + prune_pod (the controller)   {json_s / n * 1e6:7.1f} us")
    print(f"  protobuf: pure-Python pruning wire reader         {proto_s / n * 1e6:7.1f} us  "
          f"({proto_s / json_s:.2f}x JSON)")


if __name__ == "__main__":
    main()
