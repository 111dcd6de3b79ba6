"""One `ssl.SSLContext` per distinct trust and client identity, shared by every cluster that uses
it.

kubernetes-asyncio builds a fresh context per ApiClient with `ssl.create_default_context()`,
which loads the whole system CA store each time (what that cost per client: bench/RESULTS.md,
"Figures once quoted in the code"). A
fleet's clusters share a handful of CAs, so contexts are keyed by a hash of the CA bytes (plus
the client certificate and key, when a cluster authenticates with one) and built once. The
system store is loaded only for a cluster whose kubeconfig names no CA, and then once.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from convergerd.core.errors import NoCredentials
from convergerd.core.shown import shown
from convergerd.kube.kubeconfig import Credentials


@dataclass(frozen=True, slots=True)
class TlsKey:
    """What makes two clusters' contexts interchangeable (digests only, never the bytes)."""

    ca: str  # sha256 of the CA PEM, or "system"
    client: str  # sha256 of certificate + key, or ""
    verify: bool


def tls_key(creds: Credentials) -> TlsKey:
    ca = hashlib.sha256(creds.ca_pem).hexdigest() if creds.ca_pem is not None else "system"
    client = ""
    if creds.client_cert_pem is not None and creds.client_key_pem is not None:
        digest = hashlib.sha256(creds.client_cert_pem)
        digest.update(b"\0")
        digest.update(creds.client_key_pem)
        client = digest.hexdigest()
    return TlsKey(ca=ca, client=client, verify=not creds.insecure_skip_tls_verify)


class TlsContexts:
    """A cache of client SSL contexts; pass one instance to everything that opens clusters."""

    def __init__(self) -> None:
        self._contexts: dict[TlsKey, ssl.SSLContext] = {}

    def __len__(self) -> int:
        return len(self._contexts)

    def context_for(self, creds: Credentials) -> ssl.SSLContext | None:
        """The shared context for these credentials; None for a plain-http server."""
        if not creds.tls:
            return None
        key = tls_key(creds)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = _build(creds, key)
            self._contexts[key] = ctx
        return ctx

    def retain(self, keys: Collection[TlsKey]) -> None:
        """Forget the contexts no client uses any more (a rotated CA, a removed cluster): the
        cache holds the trusts in use, not every one seen since start."""
        for key in set(self._contexts) - set(keys):
            del self._contexts[key]


def _build(creds: Credentials, key: TlsKey) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname check + CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])  # aiohttp speaks HTTP/1.1 only
    try:
        if creds.ca_pem is not None:
            ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii"))
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise NoCredentials(
            f"context {shown(creds.name)}: certificate-authority is not a valid PEM certificate"
        ) from exc
    if not key.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if creds.client_cert_pem is not None and creds.client_key_pem is not None:
        _load_client_cert(ctx, creds.name, creds.client_cert_pem, creds.client_key_pem)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, name: str, cert: bytes, key: bytes) -> None:
    # The ssl module loads a certificate chain only from files: write both to a private
    # directory (0700, files 0600) and remove them at once.
    with tempfile.TemporaryDirectory(prefix="convergerd-tls-") as tmp:
        cert_path, key_path = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as exc:
            raise NoCredentials(
                f"context {shown(name)}: client-certificate and client-key do not form a valid pair"
            ) from exc
