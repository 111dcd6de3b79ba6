"""Cluster credentials from a kubeconfig (one context per cluster, named by cluster id) or from
the pod's service account (in-cluster config, for the home cluster).

Only what convergerd needs is understood: server URL (a path prefix is kept), the CA
(`certificate-authority-data` or a `certificate-authority` file), and static credentials (bearer
`token`, `tokenFile`, client certificate and key as data or files). `exec` and `auth-provider`
plugins and basic auth are reported as unsupported for that context only; the other contexts
still load. Relative file paths are resolved against the kubeconfig's directory, as client-go
does. A cluster's `proxy-url` is used when it is an http:// proxy; any other proxy is refused
for that context, never ignored.

Every file is read by `files.read_bounded` (a regular file, capped: the kubeconfig at
`MAX_KUBECONFIG_BYTES`, CA, certificate and key files at `MAX_CREDENTIAL_FILE_BYTES`, token
files at `MAX_TOKEN_BYTES`), and a mapping that names a key twice is refused. A token, inline
or from a file, must be one line of visible ASCII (`check_token`).

`insecure-skip-tls-verify` must be a YAML boolean: a string such as "false" is an error for
that context, never a truthy value that turns verification off. Whether an insecure cluster
(verification off, or an `http://` server that would get the bearer token in clear) may be
used at all is decided by `check_secure`, once, where clients are opened.

Secrets never appear in a repr, str, log line or exception message: `Credentials` hides them,
and messages name the context and the field, never a value.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from convergerd.core.errors import BadFile, ConfigError, NoCredentials
from convergerd.core.shown import shown
from convergerd.files import DuplicateKey, UniqueKeys, decode_utf8, read_bounded

SETTING = "CONVERGERD_KUBECONFIG"
ALLOW_INSECURE_SETTING = "CONVERGERD_ALLOW_INSECURE_CLUSTERS"
INSECURE_REASON = "insecure"
# CA, client certificate and key files: a few KiB in practice. Bounded so a path such as
# /dev/zero in a kubeconfig fails that context instead of eating the daemon's memory.
MAX_CREDENTIAL_FILE_BYTES = 1 << 20
# A bearer token: a service-account JWT is 1-2 KiB. Far above that, and far below what an API
# server takes as one header (kube-apiserver: 1 MiB for all of them).
MAX_TOKEN_BYTES = 64 * 1024
# A kubeconfig of 10,000 clusters with inline CAs, client certificates and RSA keys is tens
# of MiB (bench/RESULTS.md, "Figures once quoted in the code"); a few times that is still a
# kubeconfig, more is the wrong file.
MAX_KUBECONFIG_BYTES = 256 << 20
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_NAME = "in-cluster"


@dataclass(frozen=True, slots=True)
class Credentials:
    """How to reach and authenticate to one cluster. `repr` shows no secret."""

    name: str  # the context name (the cluster id), or "in-cluster"
    server: str  # https://host:port[/path-prefix], no trailing slash
    ca_pem: bytes | None = field(default=None, repr=False)  # None: the system trust store
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    client_cert_pem: bytes | None = field(default=None, repr=False)
    client_key_pem: bytes | None = field(default=None, repr=False)
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None  # http://host:port: requests go through it (CONNECT for TLS)

    def __str__(self) -> str:
        return f"{self.name} ({self.server}, auth: {self.auth_kind})"

    @property
    def auth_kind(self) -> str:
        if self.client_cert_pem is not None:
            return "client certificate"
        if self.token is not None:
            return "token"
        if self.token_file is not None:
            return "token file"
        return "none"

    @property
    def tls(self) -> bool:
        return self.server.startswith("https://")

    @property
    def insecurity(self) -> str | None:
        """Why requests to this cluster could be read or forged on the way, or None."""
        if not self.tls:
            return "the server is http:// (the bearer token would go out in clear)"
        if self.insecure_skip_tls_verify:
            return "insecure-skip-tls-verify is true (the server's certificate is not verified)"
        return None


def check_secure(creds: Credentials, *, allow_insecure: bool) -> str | None:
    """None for a cluster reached over verified TLS. For an insecure one: why, when insecure
    clusters are allowed; otherwise `NoCredentials` with reason `insecure` (the cluster is
    reported and not contacted)."""
    why = creds.insecurity
    if why is not None and not allow_insecure:
        raise NoCredentials(
            f"context {shown(creds.name)}: refused as insecure: {why}; fix the kubeconfig, or "
            f"set {ALLOW_INSECURE_SETTING}=true to allow insecure clusters",
            reason=INSECURE_REASON,
        )
    return why


class Kubeconfig:
    """A parsed kubeconfig. Contexts are resolved on demand, so one broken context fails only
    the cluster it belongs to (`NoCredentials`), never the whole file."""

    def __init__(self, doc: Mapping[str, Any], *, base_dir: Path, source: str) -> None:
        self._base_dir = base_dir
        self._source = source
        self._clusters = _named(doc, "clusters", "cluster", source)
        self._users = _named(doc, "users", "user", source)
        self._contexts = _named(doc, "contexts", "context", source)
        current = doc.get("current-context")
        self.current_context: str | None = current if isinstance(current, str) else None

    def __repr__(self) -> str:
        return f"Kubeconfig({self._source!r}, {len(self._contexts)} contexts)"

    @property
    def contexts(self) -> frozenset[str]:
        return frozenset(self._contexts)

    def __contains__(self, name: object) -> bool:
        return name in self._contexts

    def credentials(self, context: str) -> Credentials:
        """The credentials of one context; `NoCredentials` when it is missing or unusable."""
        ctx = self._contexts.get(context)
        if ctx is None:
            raise NoCredentials(f"no context named {shown(context)} in the kubeconfig")
        cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
        cluster = self._clusters.get(cluster_name) if isinstance(cluster_name, str) else None
        if cluster is None:
            raise NoCredentials(
                f"context {shown(context)}: cluster {shown(cluster_name)} is not in the kubeconfig"
            )
        user: Mapping[str, Any] = {}
        if user_name is not None:
            found = self._users.get(user_name) if isinstance(user_name, str) else None
            if found is None:
                raise NoCredentials(
                    f"context {shown(context)}: user {shown(user_name)} is not in the kubeconfig"
                )
            user = found
        return _credentials(context, cluster, user, self._base_dir)


def load_kubeconfig(path: Path) -> Kubeconfig:
    """Parse the file (a regular file of at most `MAX_KUBECONFIG_BYTES`); a missing, oversized
    or malformed file is a `ConfigError` naming the setting."""
    try:
        text = decode_utf8(read_bounded(path, MAX_KUBECONFIG_BYTES))
    except BadFile as exc:
        raise ConfigError(SETTING, str(path), str(exc)) from None
    return parse_kubeconfig(text, base_dir=path.parent, source=str(path))


class _Loader(_FAST_LOADER, UniqueKeys):  # type: ignore[misc,valid-type]
    """The safe loader (libyaml's when installed), refusing a key given twice: which of two
    `token:` or `server:` entries would win is not something to guess about credentials
    (client-go refuses them too)."""


def parse_kubeconfig(text: str, *, base_dir: Path, source: str = "<kubeconfig>") -> Kubeconfig:
    try:
        # A safe loader; libyaml's refuses nesting past 1,000 levels, and the file's size is
        # capped. Not store.yamlfile's pure-Python loader: kubeconfigs of 10,000 contexts.
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506, TID251
    except DuplicateKey as exc:
        # Lines only: a key of a kubeconfig is no secret, but keep to one rule for messages.
        raise ConfigError(SETTING, source, f"not valid YAML: a key given twice, at lines "
                          f"{exc.first_line} and {exc.second_line}") from None
    except yaml.YAMLError as exc:
        # The YAML error's text may quote the document (tokens): give only the position.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(SETTING, source, f"not valid YAML{where}") from None
    except (ValueError, RecursionError):
        # PyYAML's constructors raise plain ValueError for values that look typed but are not
        # (`2020-13-01`, `!!int 0xZZ`, over-long integers); their text may quote the document.
        raise ConfigError(SETTING, source, "not valid YAML (a value of an impossible type, "
                          "e.g. a date that does not exist)") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(SETTING, source, "not a kubeconfig (expected a mapping at the top)")
    return Kubeconfig(doc, base_dir=base_dir, source=source)


def in_cluster_credentials(
    env: Mapping[str, str], *, sa_dir: Path = SERVICE_ACCOUNT_DIR
) -> Credentials:
    """The pod's service account: API server from KUBERNETES_SERVICE_HOST/PORT, CA and token
    from the mounted secret. The token file is re-read by the client (it rotates)."""
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = env.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    if not host:
        raise NoCredentials(
            "not running in a cluster (KUBERNETES_SERVICE_HOST is unset): "
            "set CONVERGERD_HOME_CONTEXT to a kubeconfig context for the home cluster"
        )
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    ca_path, token_path = sa_dir / "ca.crt", sa_dir / "token"
    try:
        ca = read_bounded(ca_path, MAX_CREDENTIAL_FILE_BYTES)
    except BadFile as exc:
        raise NoCredentials(
            f"in-cluster config: the service account CA {ca_path}: {exc}"
        ) from None
    if not token_path.is_file():
        raise NoCredentials(f"in-cluster config: no service account token at {token_path}")
    return Credentials(
        name=IN_CLUSTER_NAME, server=f"https://{host}:{port}", ca_pem=ca, token_file=token_path
    )


def _named(
    doc: Mapping[str, Any], key: str, inner: str, source: str
) -> dict[str, Mapping[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise ConfigError(SETTING, source, f"{key}: expected a list")
    out: dict[str, Mapping[str, Any]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(SETTING, source, f"{key}[{i}]: expected a mapping with a name")
        body = entry.get(inner) or {}
        if not isinstance(body, dict):
            raise ConfigError(SETTING, source, f"{key}[{i}].{inner}: expected a mapping")
        out[entry["name"]] = body
    return out


def _credentials(
    context: str, cluster: Mapping[str, Any], user: Mapping[str, Any], base_dir: Path
) -> Credentials:
    for unsupported, what in (("exec", "exec credential plugins"),
                              ("auth-provider", "auth-provider plugins"),
                              ("username", "basic auth")):
        if user.get(unsupported):
            raise NoCredentials(
                f"context {shown(context)}: {what} are not supported by convergerd; "
                "use a bearer token (token or tokenFile) or a client certificate",
                reason="unsupported_auth",
            )
    server = _server(context, cluster.get("server"))
    ca = _data_or_file(context, cluster, "certificate-authority", base_dir)
    cert = _data_or_file(context, user, "client-certificate", base_dir)
    key = _data_or_file(context, user, "client-key", base_dir)
    if (cert is None) != (key is None):
        raise NoCredentials(
            f"context {shown(context)}: client-certificate and client-key must be given together"
        )
    token = user.get("token")
    if token is not None and not isinstance(token, str):
        raise NoCredentials(f"context {shown(context)}: user token must be a string")
    if token:
        token = check_token(token, f"context {shown(context)}: user token")
    token_file = _path(context, user.get("tokenFile"), "tokenFile", base_dir)
    tls_server_name = cluster.get("tls-server-name")
    return Credentials(
        name=context,
        server=server,
        proxy_url=_proxy_url(context, cluster.get("proxy-url")),
        ca_pem=ca,
        token=token or None,
        token_file=token_file,
        client_cert_pem=cert,
        client_key_pem=key,
        insecure_skip_tls_verify=_skip_verify(context, cluster),
        tls_server_name=tls_server_name if isinstance(tls_server_name, str) else None,
    )


def check_token(token: str, what: str) -> str:
    """`token` without surrounding whitespace (as client-go trims a token file), if it can go
    in an `Authorization` header as it is; else `NoCredentials` (reason `no_token`) saying
    what is wrong with it and where, never quoting it. A line break would end the header (or
    forge another), a character outside visible ASCII is not a token."""
    token = token.strip()
    if not token:
        raise NoCredentials(f"{what} is empty", reason="no_token")
    if len(token) > MAX_TOKEN_BYTES:
        raise NoCredentials(f"{what} is longer than {MAX_TOKEN_BYTES} characters",
                            reason="no_token")
    bad = next((i for i, c in enumerate(token) if not "!" <= c <= "~"), None)
    if bad is not None:
        c = token[bad]
        kind = ("a line break (a token is one line)" if c in "\r\n" else
                "a space" if c.isspace() else
                "a control character" if not c.isprintable() else "a character outside ASCII")
        raise NoCredentials(f"{what} holds {kind} at character {bad + 1}; a bearer token is "
                            "visible ASCII only", reason="no_token")
    return token


def read_token_file(context: str, path: Path) -> str:
    """The token in `path` (a regular file of at most `MAX_TOKEN_BYTES`, UTF-8, one line of
    visible ASCII once trimmed); `NoCredentials` (reason `no_token`) naming the context, the
    file and the reason, never the content. Never blocks on a pipe; reads no more than the cap
    from a device or a growing file."""
    what = f"context {shown(context)}: tokenFile {shown(str(path))}"
    try:
        data = read_bounded(path, MAX_TOKEN_BYTES)
    except BadFile as exc:
        raise NoCredentials(f"{what}: {exc}", reason="no_token") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NoCredentials(f"{what}: not text (byte {exc.start} is not UTF-8)",
                            reason="no_token") from None
    return check_token(text, what)


def _proxy_url(context: str, value: object) -> str | None:
    # aiohttp sends through an http:// proxy (CONNECT for https servers). Other schemes and
    # proxy credentials are refused by name rather than ignored: ignoring proxy-url would
    # connect directly, which a network that requires the proxy may not allow or may log.
    if value is None or value == "":
        return None
    what = f"context {shown(context)}: proxy-url"
    if not isinstance(value, str):
        raise NoCredentials(f"{what} must be a URL string")
    try:
        parsed = urllib.parse.urlsplit(value)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise NoCredentials(f"{what} is not a valid URL") from None
    if parsed.scheme != "http" or not parsed.hostname:
        scheme = shown(parsed.scheme) if parsed.scheme else "none"
        raise NoCredentials(f"{what}: only an http:// proxy with a host is supported by "
                            f"convergerd (scheme {scheme})")
    if parsed.username or parsed.password:
        raise NoCredentials(f"{what}: proxy credentials in the URL are not supported by "
                            "convergerd")
    if parsed.path.strip("/") or parsed.query or parsed.fragment:
        raise NoCredentials(f"{what} must be http://host:port, without a path or query")
    return value


def _skip_verify(context: str, cluster: Mapping[str, Any]) -> bool:
    # Only a YAML boolean counts: `bool("false")` is True, and would turn verification off.
    value = cluster.get("insecure-skip-tls-verify")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise NoCredentials(
            f"context {shown(context)}: insecure-skip-tls-verify must be a YAML boolean "
            f"(true or false, unquoted), not {type(value).__name__} {shown(value)}"
        )
    return value


def _server(context: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise NoCredentials(f"context {shown(context)}: the cluster has no server URL")
    try:
        parsed = urllib.parse.urlsplit(value)
    except ValueError:
        raise NoCredentials(f"context {shown(context)}: server is not a valid URL") from None
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        raise NoCredentials(
            f"context {shown(context)}: server must be an https:// URL with a host"
        )
    if parsed.username or parsed.password or parsed.query or parsed.fragment:
        raise NoCredentials(
            f"context {shown(context)}: server URL must not carry credentials, a query or a "
            "fragment"
        )
    return value.rstrip("/")


def _data_or_file(
    context: str, section: Mapping[str, Any], key: str, base_dir: Path
) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        if not isinstance(data, str):
            raise NoCredentials(f"context {shown(context)}: {key}-data must be a base64 string")
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise NoCredentials(
                f"context {shown(context)}: {key}-data is not valid base64"
            ) from None
    path = _path(context, section.get(key), key, base_dir)
    if path is None:
        return None
    try:
        return read_bounded(path, MAX_CREDENTIAL_FILE_BYTES)
    except BadFile as exc:
        raise NoCredentials(f"context {shown(context)}: {key} {shown(str(path))}: {exc}") from None


def _path(context: str, value: object, key: str, base_dir: Path) -> Path | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise NoCredentials(f"context {shown(context)}: {key} must be a file path")
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base_dir / path
