"""A throwaway certificate authority and serving certificates for the simulator's listeners.

Real clusters are https and client-go sends kubeconfig credentials only over TLS, so every
simulated API server is https, each listener with its own CA (the product keeps one SSL
context per distinct CA, and that path deserves exercise). EC P-256 keys: generating one takes
well under a millisecond, so a fresh CA per start costs nothing.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names a client may use to reach a loopback listener.
SERVING_DNS_NAMES = ("localhost",)
SERVING_IPS = ("127.0.0.1", "::1")
VALIDITY = datetime.timedelta(days=365)
# Clock skew allowance: a certificate that is "not yet valid" by a second breaks handshakes.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class ServingCert:
    """A PEM certificate chain (leaf, then CA) and its private key."""

    chain_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CertAuthority:
    """A self-signed CA that can issue serving certificates."""

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, name: str) -> CertAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"convergerd-sim {name} CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(name=name, cert=cert, key=key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue_serving_cert(self) -> ServingCert:
        """A leaf certificate for the loopback names, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVING_DNS_NAMES]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
        cert = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"convergerd-sim {self.name}")])
            )
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem
        return ServingCert(chain_pem=chain, key_pem=key_pem)


def server_ssl_context(serving: ServingCert) -> ssl.SSLContext:
    """A server-side SSL context presenting `serving`.

    The ssl module only loads key material from files, so the PEMs go through a private
    temporary directory that is removed before returning.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="convergerd-sim-tls-") as tmp:
        cert_path = os.path.join(tmp, "tls.crt")
        key_path = os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, serving.chain_pem), (key_path, serving.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


def client_ssl_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client-side context trusting exactly `ca_pem` (used by tests and the admin helpers)."""
    return ssl.create_default_context(cadata=ca_pem.decode("ascii"))
