"""CPU per write request: gpuclaimctl's transport beside urllib3 and the floor.

A program, not a test (``make bench-http`` runs ``python -m benchmarks.http_bench``).
It starts a control plane (etcd and kube-apiserver only are needed; the
plane starts its usual set) and sends the same JSON patch to one ConfigMap
again and again, one request at a time, through:

- ``kube.request`` as the controller sends its writes (client.http11);
- ``kube.request`` with the lean transport turned off: urllib3's
  PoolManager, as before (the baseline);
- urllib3's connection pool directly, and one urllib3 connection directly;
- a raw TLS socket writing the request and reading the answer by hand: the
  floor, what the exchange costs with no HTTP library at all.

It prints the process's CPU microseconds per request (``time.process_time``,
only this thread works) and the wall time per request, the best of
``--repeat`` rounds each, all rounds interleaved. It never fails on a figure.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import urllib3


def measure(name: str, fn: Callable[[], Any], n: int) -> tuple[float, float]:
    for _ in range(min(50, n)):
        fn()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.process_time() - c0) / n, 1e6 * (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="per variant and round")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from gpuclaimctl.client import kube
    from gpuclaimctl.controlplane import ControlPlane

    with ControlPlane(log=lambda m: print(f"[plane] {m}", file=sys.stderr)) as plane:
        api = kube.load_client(str(plane.kubeconfig), None)
        plain = kube.load_client(str(plane.kubeconfig), None)
        path = "/api/v1/namespaces/default/configmaps/http-bench"
        kube.request(api, "POST", "/api/v1/namespaces/default/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "http-bench", "namespace": "default"}, "data": {"a": "b"}})
        patch = [{"op": "replace", "path": "/data/a", "value": "c"}]
        ctype = "application/json-patch+json"
        base, headers = kube._prepared(api, ctype)
        kube._TRANSPORTS[plain] = (base, None)  # keeps urllib3 (see kube._transport)
        pool = api.rest_client.pool_manager.connection_from_url(base)
        conn = pool._new_conn()

        def via_pool() -> bytes:
            r = pool.urlopen("PATCH", path, body=orjson.dumps(patch), headers=headers, retries=False,
                             timeout=urllib3.Timeout(total=30), preload_content=True,
                             assert_same_host=False, redirect=False)
            return bytes(r.data)

        def via_conn() -> bytes:
            conn.request("PATCH", path, body=orjson.dumps(patch), headers=headers)
            r = conn.getresponse()
            return bytes(r.read())

        cfg = api.configuration
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        raw = ctx.wrap_socket(socket.create_connection((pool.host, pool.port)), server_hostname=pool.host)
        reader = raw.makefile("rb")
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

        def via_socket() -> bytes:
            body = orjson.dumps(patch)
            raw.sendall(f"PATCH {path} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\n{head}"
                        f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            reader.readline()
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            return bytes(reader.read(length))

        variants: list[tuple[str, Callable[[], Any]]] = [
            ("kube.request (client.http11, shipped)",
             lambda: kube.request(api, "PATCH", path, body=patch, content_type=ctype)),
            ("kube.request through urllib3 (baseline)",
             lambda: kube.request(plain, "PATCH", path, body=patch, content_type=ctype)),
            ("urllib3 connection pool, directly", via_pool),
            ("one urllib3 connection, directly", via_conn),
            ("raw TLS socket (the floor)", via_socket),
        ]
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):
            for name, fn in variants:
                cpu, wall = measure(name, fn, args.requests)
                old = best.get(name)
                best[name] = (min(cpu, old[0]), min(wall, old[1])) if old else (cpu, wall)
        print(f"\n{args.requests} JSON patches of one ConfigMap per variant and round, best of "
              f"{args.repeat} interleaved rounds; {os.cpu_count()} CPUs, the API server on this machine; "
              f"load {os.getloadavg()[0]:.2f}")
        base_cpu = best["kube.request through urllib3 (baseline)"][0]
        print(f"{'variant':42} {'CPU us/req':>10} {'wall us/req':>11} {'CPU vs baseline':>15}")
        for name, _fn in variants:
            cpu, wall = best[name]
            print(f"{name:42} {cpu:>10.0f} {wall:>11.0f} {cpu / base_cpu:>14.2f}x")


if __name__ == "__main__":
    main()
