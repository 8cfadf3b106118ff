"""A private CA, serving and client certificates for the local control plane.

Made with the `openssl` command (Debian ships it), so the launcher needs no
crypto package. ECDSA P-256 keys: every Kubernetes component accepts them and
they take milliseconds to make, where RSA takes a noticeable fraction of a
second each.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path


class PKIError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class PKI:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _paths(d: Path) -> PKI:
    return PKI(
        ca_cert=d / "ca.crt", ca_key=d / "ca.key",
        serving_cert=d / "apiserver.crt", serving_key=d / "apiserver.key",
        admin_cert=d / "admin.crt", admin_key=d / "admin.key",
        sa_key=d / "sa.key", sa_pub=d / "sa.pub",
    )


def load_or_make_pki(directory: Path) -> PKI:
    """The PKI already in directory, else a fresh one made there.

    A plane whose etcd data is kept must keep its PKI too: the objects in
    etcd were made with it (service-account tokens are signed with sa.key,
    the kubeconfigs handed out trust ca.crt), so a new one would break them.
    A directory missing any file (a make_pki that was interrupted) is made
    afresh, whole."""
    pki = _paths(directory)
    if all(p.is_file() and p.stat().st_size > 0 for p in dataclasses.astuple(pki)):
        return pki
    return make_pki(directory)


def make_pki(directory: Path) -> PKI:
    """Write a fresh CA and the certificates the plane needs into directory."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PKIError("openssl is not installed; the local control plane needs it to make its CA")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    pki = _paths(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run(openssl, "req", "-x509", *ec, "-days", "3650",
         "-keyout", pki.ca_key, "-out", pki.ca_cert,
         "-subj", "/CN=gpuclaimctl-local-ca",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    sans = ",".join([
        "IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ])
    _leaf(openssl, ec, pki, pki.serving_cert, pki.serving_key, "/CN=kube-apiserver",
          ["subjectAltName=" + sans, "extendedKeyUsage=serverAuth"])
    # O=system:masters: the admin identity the launcher hands to the tests,
    # the scheduler, the controller-manager and kwok.
    _leaf(openssl, ec, pki, pki.admin_cert, pki.admin_key, "/O=system:masters/CN=gpuclaimctl-admin",
          ["extendedKeyUsage=clientAuth"])
    _run(openssl, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", pki.sa_key)
    _run(openssl, "ec", "-in", pki.sa_key, "-pubout", "-out", pki.sa_pub)
    return pki


def _leaf(openssl: str, ec: list[str], pki: PKI, cert: Path, key: Path, subject: str,
          extensions: list[str]) -> None:
    ext: list[str | Path] = []
    for e in ["basicConstraints=critical,CA:FALSE",
              "keyUsage=critical,digitalSignature,keyEncipherment", *extensions]:
        ext += ["-addext", e]
    # OpenSSL 3's `req -x509 -CA` signs with the CA in one step.
    _run(openssl, "req", "-x509", *ec, "-days", "3650", "-keyout", key, "-out", cert,
         "-subj", subject, "-CA", pki.ca_cert, "-CAkey", pki.ca_key, *ext)


def _run(*argv: str | Path) -> None:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PKIError(f"openssl {argv[1]} failed: {last}")
