"""Certificates and kubeconfigs for the local control plane.

One CA signs the apiserver's serving certificate and the client certificates of two identities:
``admin`` (group ``system:masters``: everything) and ``restricted`` (no groups, no RBAC grants:
every request is authenticated and then refused with 403). The service-account key pair signs
and verifies service-account tokens.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True, kw_only=True, slots=True)
class Identity:
    name: str
    certificate: Path
    key: Path


@dataclass(frozen=True, kw_only=True, slots=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def identity(self, name: str) -> Identity:
        return Identity(
            name=name,
            certificate=self.directory / f"{name}.crt",
            key=self.directory / f"{name}.key",
        )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, *organizations: str) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(
    *,
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    is_ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=not is_ca,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def create(directory: Path) -> Pki:
    """Create the CA, serving and client certificates and the service-account keys (once)."""
    pki = Pki(directory=directory)
    if pki.ca_cert.exists():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("warmwatch-test-ca")
    ca = _sign(
        subject=ca_name,
        public_key=ca_key.public_key(),
        issuer=ca_name,
        issuer_key=ca_key,
        is_ca=True,
    )
    serving_key = _key()
    serving = _sign(
        subject=_name("kube-apiserver"),
        public_key=serving_key.public_key(),
        issuer=ca_name,
        issuer_key=ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ],
    )
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving)
    clients = {
        "admin": _name("warmwatch-admin", "system:masters"),
        "restricted": _name("warmwatch-restricted"),
        "controller-manager": _name("system:kube-controller-manager"),
    }
    for name, subject in clients.items():
        key = _key()
        certificate = _sign(
            subject=subject,
            public_key=key.public_key(),
            issuer=ca_name,
            issuer_key=ca_key,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        identity = pki.identity(name)
        _write_key(identity.key, key)
        _write_cert(identity.certificate, certificate)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    # Written last: its presence means the whole set exists.
    _write_cert(pki.ca_cert, ca)
    return pki


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(*, path: Path, pki: Pki, identity: str, server: str) -> Path:
    """A self-contained kubeconfig (certificates embedded) for ``identity`` at ``server``."""
    user = pki.identity(identity)
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: warmwatch-test
  cluster:
    server: {server}
    certificate-authority-data: {_b64(pki.ca_cert)}
users:
- name: {identity}
  user:
    client-certificate-data: {_b64(user.certificate)}
    client-key-data: {_b64(user.key)}
contexts:
- name: {identity}
  context:
    cluster: warmwatch-test
    user: {identity}
current-context: {identity}
"""
    )
    path.chmod(0o600)
    return path
