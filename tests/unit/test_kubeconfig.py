"""Kubeconfig and in-cluster credentials; no secret ever shows in a repr, str or message."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from convergerd.config import ClusterAccess
from convergerd.errors import ConfigError, NoCredentials
from convergerd.kube.kubeconfig import (
    Credentials,
    in_cluster_credentials,
    load_kubeconfig,
    parse_kubeconfig,
)
from convergerd.kube.registry import ClusterRegistry
from convergerd.kube.tlsctx import TlsContexts, tls_key

TOKEN = "s3cr3t-token-value"
CA = b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


KUBECONFIG = f"""
apiVersion: v1
kind: Config
current-context: c0001
clusters:
- name: c0001
  cluster:
    server: https://127.0.0.1:40123/clusters/c0001/
    certificate-authority-data: {b64(CA)}
- name: c0002
  cluster:
    server: https://127.0.0.1:40123/clusters/c0002
    certificate-authority: ca.crt
    tls-server-name: api.c0002
- name: plain
  cluster: {{server: "ftp://example"}}
users:
- name: u1
  user: {{token: {TOKEN}}}
- name: u2
  user: {{tokenFile: token}}
- name: cert
  user:
    client-certificate-data: {b64(b"CERT")}
    client-key-data: {b64(b"KEY")}
- name: half-cert
  user: {{client-certificate-data: {b64(b"CERT")}}}
- name: exec
  user:
    exec: {{command: aws, args: [eks, get-token]}}
- name: provider
  user:
    auth-provider: {{name: gcp}}
contexts:
- {{name: c0001, context: {{cluster: c0001, user: u1}}}}
- {{name: c0002, context: {{cluster: c0002, user: u2}}}}
- {{name: c0003, context: {{cluster: c0001, user: cert}}}}
- {{name: c0004, context: {{cluster: c0001, user: exec}}}}
- {{name: c0005, context: {{cluster: c0001, user: provider}}}}
- {{name: c0006, context: {{cluster: missing, user: u1}}}}
- {{name: c0007, context: {{cluster: c0001, user: nobody}}}}
- {{name: c0008, context: {{cluster: plain, user: u1}}}}
- {{name: c0009, context: {{cluster: c0001, user: half-cert}}}}
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text(TOKEN)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def test_token_context(kubeconfig: Path) -> None:
    creds = load_kubeconfig(kubeconfig).credentials("c0001")
    assert creds.server == "https://127.0.0.1:40123/clusters/c0001"  # path prefix kept
    assert creds.ca_pem == CA
    assert creds.token == TOKEN
    assert creds.auth_kind == "token"
    assert creds.tls


def test_files_are_relative_to_the_kubeconfig(kubeconfig: Path) -> None:
    creds = load_kubeconfig(kubeconfig).credentials("c0002")
    assert creds.ca_pem == CA
    assert creds.token is None
    assert creds.token_file == kubeconfig.parent / "token"
    assert creds.tls_server_name == "api.c0002"


def test_client_certificate_context(kubeconfig: Path) -> None:
    creds = load_kubeconfig(kubeconfig).credentials("c0003")
    assert (creds.client_cert_pem, creds.client_key_pem) == (b"CERT", b"KEY")
    assert creds.auth_kind == "client certificate"


@pytest.mark.parametrize(
    ("context", "message", "reason"),
    [
        ("c0042", "no context named 'c0042' in the kubeconfig", "no_context"),
        ("c0004", "exec credential plugins are not supported", "unsupported_auth"),
        ("c0005", "auth-provider plugins are not supported", "unsupported_auth"),
        ("c0006", "cluster 'missing' is not in the kubeconfig", "no_context"),
        ("c0007", "user 'nobody' is not in the kubeconfig", "no_context"),
        ("c0008", "server must be an https:// URL", "no_context"),
        ("c0009", "must be given together", "no_context"),
    ],
)
def test_unusable_contexts_fail_alone(
    kubeconfig: Path, context: str, message: str, reason: str
) -> None:
    config = load_kubeconfig(kubeconfig)
    with pytest.raises(NoCredentials, match=message) as info:
        config.credentials(context)
    assert info.value.reason == reason
    assert config.credentials("c0001").token == TOKEN  # the others still load


def test_no_context_message_is_exact(kubeconfig: Path) -> None:
    with pytest.raises(NoCredentials) as info:
        load_kubeconfig(kubeconfig).credentials("c0042")
    assert str(info.value) == "no context named 'c0042' in the kubeconfig"


def test_secrets_never_in_repr_or_str(kubeconfig: Path) -> None:
    config = load_kubeconfig(kubeconfig)
    for name in ("c0001", "c0003"):
        creds = config.credentials(name)
        for text in (repr(creds), str(creds), repr(config)):
            assert TOKEN not in text
            assert "CERT" not in text
            assert "KEY" not in text
            assert b64(CA) not in text


def test_bad_yaml_does_not_echo_the_document(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(f"users:\n- name: u\n  user: {{token: {TOKEN}\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_kubeconfig(path)
    assert TOKEN not in str(info.value)
    assert info.value.setting == "CONVERGERD_KUBECONFIG"


def test_missing_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CONVERGERD_KUBECONFIG"):
        load_kubeconfig(tmp_path / "nope")


def test_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # A Secret written with the wrong encoding, or caught half-written: the daemon keeps its
    # last good kubeconfig only if this is the ConfigError it expects.
    path = tmp_path / "kubeconfig"
    path.write_bytes(KUBECONFIG.encode() + b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"CONVERGERD_KUBECONFIG.*not UTF-8") as info:
        load_kubeconfig(path)
    assert TOKEN not in str(info.value)


def test_unparsable_server_url_fails_that_context_only() -> None:
    config = parse_kubeconfig(
        KUBECONFIG.replace("https://127.0.0.1:40123/clusters/c0002", "https://[::1"),
        base_dir=Path("/nonexistent"),
    )
    with pytest.raises(NoCredentials, match="'c0002': server is not a valid URL"):
        config.credentials("c0002")
    assert config.credentials("c0001").token == TOKEN


async def test_registry_refresh_of_a_broken_file_is_a_config_error(kubeconfig: Path) -> None:
    access = ClusterAccess(kubeconfig=kubeconfig, request_timeout_s=1.0, connect_timeout_s=1.0,
                           qps=10.0, burst=10, apply_concurrency=1)
    registry = ClusterRegistry(kubeconfig=kubeconfig, access=access, identity="test")
    try:
        kubeconfig.write_bytes(b"\xff" + KUBECONFIG.encode())
        with pytest.raises(ConfigError):
            await registry.refresh()
        assert "c0001" in registry.contexts  # the last good one is kept
    finally:
        await registry.close()


def test_contexts_listed() -> None:
    config = parse_kubeconfig(KUBECONFIG, base_dir=Path("/nonexistent"))
    assert "c0001" in config
    assert "c0042" not in config
    assert len(config.contexts) == 9


def test_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text(TOKEN)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = in_cluster_credentials(env, sa_dir=tmp_path)
    assert creds.server == "https://10.0.0.1:443"
    assert creds.ca_pem == CA
    assert creds.token_file == tmp_path / "token"
    assert TOKEN not in repr(creds)


def test_in_cluster_ipv6(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text(TOKEN)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_credentials(env, sa_dir=tmp_path).server == "https://[fd00::1]:6443"


def test_outside_a_cluster_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(NoCredentials, match="CONVERGERD_HOME_CONTEXT"):
        in_cluster_credentials({}, sa_dir=tmp_path)


def test_tls_key_shares_by_ca() -> None:
    a = Credentials(name="a", server="https://x", ca_pem=CA, token="t1")
    b = Credentials(name="b", server="https://y", ca_pem=CA, token="t2")
    c = Credentials(name="c", server="https://y", ca_pem=CA + b"\n", token="t2")
    d = Credentials(name="d", server="https://y", ca_pem=CA, client_cert_pem=b"C",
                    client_key_pem=b"K")
    assert tls_key(a) == tls_key(b)
    assert tls_key(a) != tls_key(c)
    assert tls_key(a) != tls_key(d)


def test_invalid_ca_is_a_clear_error() -> None:
    creds = Credentials(name="c0001", server="https://x", ca_pem=CA)
    with pytest.raises(NoCredentials, match="certificate-authority is not a valid PEM"):
        TlsContexts().context_for(creds)
