"""Kubeconfig and in-cluster credentials; no secret ever shows in a repr, str or message."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import pytest
import yaml

from convergerd.config import ClusterAccess
from convergerd.core.errors import ConfigError, NoCredentials
from convergerd.core.model import ClusterId
from convergerd.kube.kubeconfig import (
    MAX_CREDENTIAL_FILE_BYTES,
    MAX_TOKEN_BYTES,
    Credentials,
    check_secure,
    in_cluster_credentials,
    load_kubeconfig,
    parse_kubeconfig,
    read_token_file,
)
from convergerd.kube.registry import ClusterRegistry
from convergerd.kube.tlsctx import TlsContexts, tls_key
from convergerd.sim.kubeconfig import KubeconfigEntry, kubeconfig_document
from tests.fixtures.fifo import guarded_fifo

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



def _one_cluster(skip: str, server: str = "https://127.0.0.1:1") -> str:
    return f"""
clusters:
- name: c
  cluster: {{server: "{server}", insecure-skip-tls-verify: {skip}}}
users:
- {{name: u, user: {{token: {TOKEN}}}}}
contexts:
- {{name: c0001, context: {{cluster: c, user: u}}}}
"""


def _creds(skip: str, server: str = "https://127.0.0.1:1") -> Credentials:
    return parse_kubeconfig(_one_cluster(skip, server), base_dir=Path("/nonexistent")
                            ).credentials("c0001")


@pytest.mark.parametrize(
    ("skip", "off"), [("true", True), ("false", False), ("null", False), ("~", False)]
)
def test_insecure_skip_tls_verify_takes_yaml_booleans(skip: str, off: bool) -> None:
    assert _creds(skip).insecure_skip_tls_verify is off


@pytest.mark.parametrize(
    ("skip", "shown"),
    [
        # The string "false" used to turn verification OFF (bool("false") is True).
        ('"false"', "str 'false'"),
        ('"true"', "str 'true'"),
        ("0", "int 0"),
        ("1", "int 1"),
        ("[true]", "list [True]"),
        ("{}", "dict {}"),
    ],
)
def test_insecure_skip_tls_verify_of_another_type_rejects_that_context(
    skip: str, shown: str
) -> None:
    with pytest.raises(NoCredentials) as info:
        _creds(skip)
    assert str(info.value) == (
        "context 'c0001': insecure-skip-tls-verify must be a YAML boolean (true or false, "
        f"unquoted), not {shown}"
    )
    assert TOKEN not in str(info.value)


@pytest.mark.parametrize(
    ("skip", "server", "why"),
    [
        ("true", "https://127.0.0.1:1", "insecure-skip-tls-verify is true"),
        ("false", "http://127.0.0.1:1", "the server is http:// (the bearer token would go out "
                                        "in clear)"),
    ],
)
def test_insecure_clusters_are_refused_unless_allowed(skip: str, server: str, why: str) -> None:
    creds = _creds(skip, server)
    with pytest.raises(NoCredentials) as info:
        check_secure(creds, allow_insecure=False)
    assert info.value.reason == "insecure"
    message = str(info.value)
    assert message.startswith("context 'c0001': refused as insecure: ")
    assert why in message
    assert "CONVERGERD_ALLOW_INSECURE_CLUSTERS=true" in message
    assert TOKEN not in message
    assert why in (check_secure(creds, allow_insecure=True) or "")


def test_verified_https_is_not_insecure(kubeconfig: Path) -> None:
    config = load_kubeconfig(kubeconfig)
    for name in ("c0001", "c0002", "c0003"):
        assert check_secure(config.credentials(name), allow_insecure=False) is None


def test_the_simulators_kubeconfig_is_secure() -> None:
    doc = kubeconfig_document(
        [KubeconfigEntry(name="c0001", server="https://127.0.0.1:40123/clusters/c0001",
                         ca_pem=CA, token=TOKEN)], current="c0001")
    creds = parse_kubeconfig(yaml.safe_dump(doc), base_dir=Path("/nonexistent")
                             ).credentials("c0001")
    assert (creds.ca_pem, creds.insecure_skip_tls_verify) == (CA, False)
    assert check_secure(creds, allow_insecure=False) is None


def test_messages_quote_kubeconfig_values_shortened() -> None:
    long_name = "c" * 5000
    text = _one_cluster("false").replace("cluster: c, user: u", f"cluster: {long_name}, user: u")
    with pytest.raises(NoCredentials) as info:
        parse_kubeconfig(text, base_dir=Path("/nonexistent")).credentials("c0001")
    assert len(str(info.value)) < 300
    assert "is not in the kubeconfig" in str(info.value)


@pytest.mark.parametrize("value", ["2020-13-01", "!!int 0xZZ", "!!float abc", "1" * 5000])
def test_yaml_values_of_an_impossible_type_are_a_config_error(value: str) -> None:
    # PyYAML raises a bare ValueError for these: it used to escape as a crash.
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        parse_kubeconfig(f"users:\n- name: u\n  user: {{token: {TOKEN}, x: {value}}}\n",
                         base_dir=Path("/nonexistent"))
    assert TOKEN not in str(info.value)


def test_credential_files_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "ca.crt"
    big.write_bytes(b"x" * (MAX_CREDENTIAL_FILE_BYTES + 1))
    text = _one_cluster("false").replace('insecure-skip-tls-verify: false',
                                         f"certificate-authority: {big}")
    with pytest.raises(NoCredentials, match=r"certificate-authority .*: 1048577 bytes, more "
                                            r"than 1048576 bytes$"):
        parse_kubeconfig(text, base_dir=tmp_path).credentials("c0001")


def test_a_nul_in_a_credential_path_fails_that_context() -> None:
    text = _one_cluster("false").replace('insecure-skip-tls-verify: false',
                                         'certificate-authority: "ca\\0.crt"')
    with pytest.raises(NoCredentials, match=r"certificate-authority .*cannot read: not a valid"):
        parse_kubeconfig(text, base_dir=Path("/nonexistent")).credentials("c0001")


def _access(kubeconfig: Path, *, allow_insecure: bool) -> ClusterAccess:
    return ClusterAccess(kubeconfig=kubeconfig, request_timeout_s=1.0, connect_timeout_s=1.0,
                         qps=10.0, burst=10, apply_concurrency=1, allow_insecure=allow_insecure)


INSECURE_FLEET = KUBECONFIG + """\
- {name: skip, context: {cluster: skip, user: u1}}
- {name: plain-http, context: {cluster: plain-http, user: u1}}
- {name: system-ca, context: {cluster: system-ca, user: u1}}
"""
INSECURE_CLUSTERS = """\
- name: skip
  cluster: {server: "https://127.0.0.1:40123", insecure-skip-tls-verify: true}
- name: plain-http
  cluster: {server: "http://127.0.0.1:40123"}
- name: system-ca
  cluster: {server: "https://127.0.0.1:40123", insecure-skip-tls-verify: false}
"""


@pytest.fixture
def insecure_kubeconfig(kubeconfig: Path) -> Path:
    kubeconfig.write_text(
        INSECURE_FLEET.replace("clusters:\n", "clusters:\n" + INSECURE_CLUSTERS, 1))
    return kubeconfig


async def test_registry_refuses_insecure_clusters_and_home_alike(
    insecure_kubeconfig: Path
) -> None:
    seen: list[tuple[str, bool]] = []
    registry = ClusterRegistry(
        kubeconfig=insecure_kubeconfig, access=_access(insecure_kubeconfig, allow_insecure=False),
        identity="test", on_insecure=lambda c, i: seen.append((c, i)),
    )
    try:
        for name in ("skip", "plain-http"):
            with pytest.raises(NoCredentials) as info:
                registry.get(ClusterId(name))
            assert info.value.reason == "insecure"
            with pytest.raises(NoCredentials, match="refused as insecure"):
                registry.home(name)  # the Lease's cluster follows the same rule
        registry.get(ClusterId("system-ca"))  # the others are opened
        assert seen == [("system-ca", False)]
    finally:
        await registry.close()


async def test_registry_allows_insecure_clusters_when_told_and_warns_once(
    insecure_kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, bool]] = []
    registry = ClusterRegistry(
        kubeconfig=insecure_kubeconfig, access=_access(insecure_kubeconfig, allow_insecure=True),
        identity="test", on_insecure=lambda c, i: seen.append((c, i)),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="convergerd.kube.registry"):
            before = registry.client(ClusterId("skip"))
            registry.get(ClusterId("plain-http"))
            assert registry.client(ClusterId("skip")) is before  # reused: no second warning
            # A reload that changes the insecure cluster's credentials rebuilds its client,
            # and still does not warn again.
            insecure_kubeconfig.write_text(
                insecure_kubeconfig.read_text().replace("127.0.0.1:40123\", insecure",
                                                        "127.0.0.1:40124\", insecure"))
            os.utime(insecure_kubeconfig, ns=(1, 1))
            assert await registry.refresh()
            assert registry.client(ClusterId("skip")) is not before
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2, warnings
        assert "cluster skip is reached insecurely" in warnings[0]
        assert "insecure-skip-tls-verify is true" in warnings[0]
        assert "cluster plain-http is reached insecurely" in warnings[1]
        assert all(TOKEN not in w for w in warnings)
        assert seen == [("skip", True), ("plain-http", True), ("skip", True)]
    finally:
        await registry.close()



# --- every file through the one bounded reader; tokens one line of visible ASCII ----------------


def test_a_kubeconfig_that_is_a_pipe_or_device_is_refused_without_blocking(
    tmp_path: Path
) -> None:
    with guarded_fifo(tmp_path / "kubeconfig") as fifo, pytest.raises(
            ConfigError, match=r"^CONVERGERD_KUBECONFIG=.*: not a regular file \(a directory, "
                               r"pipe or device\)"):
        load_kubeconfig(fifo)
    with pytest.raises(ConfigError, match=r"not a regular file"):
        load_kubeconfig(Path("/dev/zero"))


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/urandom", "dir"])
def test_a_token_file_that_is_not_a_regular_file_is_refused_without_blocking(
    tmp_path: Path, special: str
) -> None:
    """Issue 17, item 5: a FIFO blocked the event loop in open(), /dev/zero was read until
    MemoryError. Now both are a credentials error naming the context and the file."""
    path = tmp_path / special
    if special == "dir":
        path.mkdir()
    with guarded_fifo(tmp_path / "fifo"), pytest.raises(NoCredentials) as info:
        read_token_file("c0001", path)
    assert str(info.value) == (f"context 'c0001': tokenFile {str(path)!r}: not a regular file "
                               "(a directory, pipe or device); give a file path")
    assert info.value.reason == "no_token"


ASCII_ONLY = "; a bearer token is visible ASCII only"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x80\x81" + TOKEN.encode(), ": not text (byte 0 is not UTF-8)"),
        (f"{TOKEN}\n{TOKEN}\n".encode(), " holds a line break (a token is one line) at "
                                         f"character {len(TOKEN) + 1}{ASCII_ONLY}"),
        (f"{TOKEN}\r\nX-Other: 1".encode(), " holds a line break (a token is one line) at "
                                           f"character {len(TOKEN) + 1}{ASCII_ONLY}"),
        (f"{TOKEN} {TOKEN}".encode(), f" holds a space at character {len(TOKEN) + 1}"
                                      f"{ASCII_ONLY}"),
        (f"{TOKEN}\x00".encode(), f" holds a control character at character {len(TOKEN) + 1}"
                                   f"{ASCII_ONLY}"),
        (f"{TOKEN}é".encode(), " holds a character outside ASCII at character "
                               f"{len(TOKEN) + 1}{ASCII_ONLY}"),
        (b" \r\n\t", " is empty"),
        (b"x" * (MAX_TOKEN_BYTES + 1), f": {MAX_TOKEN_BYTES + 1} bytes, more than "
                                       f"{MAX_TOKEN_BYTES} bytes"),
    ],
    ids=["binary", "two-lines", "crlf-inside", "space", "nul", "non-ascii", "blank", "huge"],
)
def test_a_token_file_that_is_not_one_token_is_a_credentials_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    """Issue 17, item 14: a binary or multi-line token file gave a traceback (or a header
    aiohttp refuses at send time). Now: which context, which file, what is wrong, never the
    token."""
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(NoCredentials) as info:
        read_token_file("c0001", path)
    assert str(info.value) == f"context 'c0001': tokenFile {str(path)!r}{problem}"
    assert info.value.reason == "no_token"
    assert TOKEN not in str(info.value)


def test_a_token_file_ending_in_crlf_is_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(f"  {TOKEN}\r\n".encode())
    assert read_token_file("c0001", path) == TOKEN


def test_an_inline_token_with_a_line_break_fails_that_context_only() -> None:
    text = _one_cluster("false").replace(f"token: {TOKEN}", f'token: "{TOKEN}\\r\\nX-Evil: 1"')
    config = parse_kubeconfig(text, base_dir=Path("/nonexistent"))
    with pytest.raises(NoCredentials) as info:
        config.credentials("c0001")
    assert str(info.value) == (
        f"context 'c0001': user token holds a line break (a token is one line) at character "
        f"{len(TOKEN) + 1}; a bearer token is visible ASCII only")
    assert info.value.reason == "no_token"


def test_a_duplicate_key_in_a_kubeconfig_is_refused_with_both_lines(tmp_path: Path) -> None:
    """Which of two `token:` lines a client uses is a guess; client-go refuses the file too.
    The message gives the lines, never a value."""
    path = tmp_path / "kubeconfig"
    path.write_text(_one_cluster("false").replace(
        f"{{token: {TOKEN}}}", f"{{token: {TOKEN},\n    token: other-{TOKEN}}}"))
    with pytest.raises(ConfigError) as info:
        load_kubeconfig(path)
    assert str(info.value) == (f"CONVERGERD_KUBECONFIG={str(path)!r}: not valid YAML: a key "
                               "given twice, at lines 6 and 7")
    assert TOKEN not in str(info.value)


def test_merge_keys_may_be_overridden_in_a_kubeconfig() -> None:
    text = f"""
base: &base {{server: "https://127.0.0.1:9", tls-server-name: a}}
clusters:
- name: c
  cluster: {{<<: *base, server: "https://127.0.0.1:1"}}
users:
- {{name: u, user: {{token: {TOKEN}}}}}
contexts:
- {{name: c0001, context: {{cluster: c, user: u}}}}
"""
    creds = parse_kubeconfig(text, base_dir=Path("/nonexistent")).credentials("c0001")
    assert (creds.server, creds.tls_server_name) == ("https://127.0.0.1:1", "a")


def _with_proxy(proxy: str) -> str:
    return _one_cluster("false").replace("insecure-skip-tls-verify: false",
                                         f'proxy-url: "{proxy}"')


def test_an_http_proxy_url_is_used() -> None:
    config = parse_kubeconfig(_with_proxy("http://proxy.internal:3128"),
                              base_dir=Path("/nonexistent"))
    assert config.credentials("c0001").proxy_url == "http://proxy.internal:3128"


@pytest.mark.parametrize(
    ("proxy", "problem"),
    [
        ("socks5://proxy.internal:1080", "only an http:// proxy with a host is supported by "
                                         "convergerd (scheme 'socks5')"),
        ("https://proxy.internal:3128", "only an http:// proxy with a host is supported by "
                                        "convergerd (scheme 'https')"),
        ("proxy.internal:3128", "only an http:// proxy with a host is supported by convergerd "
                                "(scheme 'proxy.internal')"),
        ("http://user:s3cr3t-pw@proxy.internal:3128", "proxy credentials in the URL are not "
                                                      "supported by convergerd"),
        ("http://proxy.internal:x", "is not a valid URL"),
        ("http://proxy.internal:3128/path", "must be http://host:port, without a path or query"),
    ],
)
def test_a_proxy_url_convergerd_cannot_use_fails_that_context_by_name(
    proxy: str, problem: str
) -> None:
    """Issue 17, item 14: proxy-url was silently ignored (a direct connection). Now it is used,
    or the context is refused saying why, never quoting the URL (it may hold a password)."""
    config = parse_kubeconfig(_with_proxy(proxy), base_dir=Path("/nonexistent"))
    with pytest.raises(NoCredentials) as info:
        config.credentials("c0001")
    assert str(info.value).startswith("context 'c0001': proxy-url")
    assert str(info.value).endswith(problem)
    assert "s3cr3t-pw" not in str(info.value)


@pytest.mark.parametrize("field", ["certificate-authority", "client-certificate"])
def test_a_credential_file_that_is_a_pipe_fails_that_context_without_blocking(
    tmp_path: Path, field: str
) -> None:
    """The CA, certificate and key files were capped but still opened blocking: a pipe hung
    the daemon in open() like a token file did."""
    with guarded_fifo(tmp_path / "pipe") as fifo:
        text = _one_cluster("false").replace(
            "insecure-skip-tls-verify: false", f"certificate-authority: {fifo}")
        if field == "client-certificate":
            text = text.replace(f"certificate-authority: {fifo}", "").replace(
                f"{{token: {TOKEN}}}", f"{{client-certificate: {fifo}, client-key: {fifo}}}")
        with pytest.raises(NoCredentials) as info:
            parse_kubeconfig(text, base_dir=tmp_path).credentials("c0001")
    assert str(info.value) == (f"context 'c0001': {field} {str(fifo)!r}: not a regular file (a "
                               "directory, pipe or device); give a file path")
