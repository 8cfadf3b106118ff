"""The webhook's own CA and serving certificate, without cert-manager.

What the Secret holds (cert-manager's key names, so tools read it alike):
- `ca.crt`: the CA bundle the API server is given: the current CA first,
  then earlier CAs not yet expired, so a serving certificate of the CA
  before a rotation is still trusted while some replica serves it;
- `ca.key`: the current CA's key;
- `tls.crt`, `tls.key`: the serving certificate (signed by the current CA,
  valid for the Service's names and any extra hosts) and its key.

`plan` says what must be made anew at a given time: nothing, the serving
certificate, or the CA and the serving certificate. A certificate is
renewed once `renew_at` of its lifetime has passed (2/3: a one-year
certificate four months before it expires), and anything that does not
parse, match its key, chain to the current CA or cover the hosts is
replaced at once. `issue` makes what `plan` asked for.

ECDSA P-256: every API server accepts it and a key takes a millisecond.
No client here: the caller reads and writes the Secret.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import Enum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"


@dataclasses.dataclass(frozen=True)
class CertPolicy:
    # cert-controller's (Kueue's) CA lifetime; a year for what is served.
    ca_validity: timedelta = timedelta(days=3650)
    serving_validity: timedelta = timedelta(days=365)
    renew_at: float = 2 / 3
    # Valid from a little before now: a replica or API server whose clock
    # is behind still accepts a certificate made a moment ago.
    backdate: timedelta = timedelta(hours=1)


class Renewal(Enum):
    NONE = "none"
    SERVING = "serving"
    CA = "ca"


@dataclasses.dataclass(frozen=True)
class Plan:
    renewal: Renewal
    reason: str


def _load_certs(pem: bytes | None) -> list[x509.Certificate]:
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _load_key(pem: bytes | None) -> ec.EllipticCurvePrivateKey | None:
    if not pem:
        return None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _pub(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def _cert_pub(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)


def renew_time(cert: x509.Certificate, policy: CertPolicy) -> datetime:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    # Counted from the backdated start: the lifetime asked for, not the margin.
    begin = start + policy.backdate
    return begin + (end - begin) * policy.renew_at


def _hosts_covered(cert: x509.Certificate, hosts: Sequence[str]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not hosts
    names = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    for host in hosts:
        ip = _ip(host)
        if (str(ip) not in ips) if ip is not None else (host not in names):
            return False
    return True


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def plan(data: Mapping[str, bytes], hosts: Sequence[str], now: datetime,
         policy: CertPolicy = CertPolicy()) -> Plan:
    """What to make anew for `data` (a Secret's decoded data) at `now`."""
    cas = _load_certs(data.get(CA_CERT))
    ca_key = _load_key(data.get(CA_KEY))
    if not cas or ca_key is None:
        return Plan(Renewal.CA, "no CA yet")
    ca = cas[0]
    if _cert_pub(ca) != _pub(ca_key):
        return Plan(Renewal.CA, "the CA key does not match the CA certificate")
    if now >= renew_time(ca, policy):
        return Plan(Renewal.CA, f"the CA expires at {ca.not_valid_after_utc.isoformat()}")
    served = _load_certs(data.get(TLS_CERT))
    key = _load_key(data.get(TLS_KEY))
    if not served or key is None:
        return Plan(Renewal.SERVING, "no serving certificate yet")
    cert = served[0]
    if _cert_pub(cert) != _pub(key):
        return Plan(Renewal.SERVING, "the serving key does not match its certificate")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return Plan(Renewal.SERVING, "the serving certificate is not signed by the current CA")
    if not _hosts_covered(cert, hosts):
        return Plan(Renewal.SERVING, f"the serving certificate does not cover {', '.join(hosts)}")
    if now >= renew_time(cert, policy):
        return Plan(Renewal.SERVING,
                    f"the serving certificate expires at {cert.not_valid_after_utc.isoformat()}")
    return Plan(Renewal.NONE, "valid")


def next_renewal(data: Mapping[str, bytes], policy: CertPolicy = CertPolicy()) -> datetime | None:
    """When `plan` will next ask for something (None: it already does, or data is unreadable)."""
    cas, served = _load_certs(data.get(CA_CERT)), _load_certs(data.get(TLS_CERT))
    if not cas or not served:
        return None
    return min(renew_time(cas[0], policy), renew_time(served[0], policy))


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _new_ca(now: datetime, policy: CertPolicy) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    # A name of its own per CA (as kube-apiserver's self-signed `host@time`),
    # so two CAs in one bundle are told apart by name as well as by key.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                         f"gpuclaimctl-webhook-ca@{int(now.timestamp())}")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - policy.backdate)
            .not_valid_after(now + policy.ca_validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _new_serving(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str],
                 now: datetime, policy: CertPolicy) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        ip = _ip(host)
        sans.append(x509.IPAddress(ip) if ip is not None else x509.DNSName(host))
    # Never valid beyond its CA.
    end = min(now + policy.serving_validity, ca.not_valid_after_utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                        hosts[0] if hosts else "gpuclaimctl-webhook")]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - policy.backdate)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                         content_commitment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def issue(data: Mapping[str, bytes], hosts: Sequence[str], now: datetime, renewal: Renewal,
          policy: CertPolicy = CertPolicy()) -> dict[str, bytes]:
    """The Secret's new data: `renewal` made anew, the rest kept."""
    if renewal is Renewal.NONE:
        return dict(data)
    old_cas = _load_certs(data.get(CA_CERT))
    if renewal is Renewal.CA:
        ca, ca_key = _new_ca(now, policy)
        # Earlier CAs stay trusted until they expire: replicas that have not
        # read the new Secret yet still serve certificates they signed.
        cas = [ca] + [c for c in old_cas if c.not_valid_after_utc > now
                      and _cert_pub(c) != _cert_pub(ca)]
    else:
        key = _load_key(data.get(CA_KEY))
        if not old_cas or key is None:
            raise ValueError("a serving certificate needs a CA; plan asks for Renewal.CA")
        ca, ca_key, cas = old_cas[0], key, [c for c in old_cas if c.not_valid_after_utc > now]
    cert, key = _new_serving(ca, ca_key, hosts, now, policy)
    return {CA_CERT: b"".join(_pem(c) for c in cas), CA_KEY: _pem_key(ca_key),
            TLS_CERT: _pem(cert), TLS_KEY: _pem_key(key)}


def newest_ca(bundle: bytes) -> datetime | None:
    """When the newest CA of a PEM bundle was made (its notBefore), or None."""
    certs = _load_certs(bundle)
    return max((c.not_valid_before_utc for c in certs), default=None)


def serial_of(pem: bytes) -> int | None:
    certs = _load_certs(pem)
    return certs[0].serial_number if certs else None
