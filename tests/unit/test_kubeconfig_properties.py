"""Property tests of kubeconfig decoding: whatever the file holds, loading it and resolving its
contexts gives credentials or our own errors (`ConfigError` for the file, `NoCredentials` for a
context) with short messages — never another exception — and TLS verification is off only
where the file says a literal YAML `true`."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from convergerd.core.errors import ConfigError, NoCredentials
from convergerd.kube.kubeconfig import Credentials, Kubeconfig, check_secure, load_kubeconfig

# Messages quote at most ~100 characters of any value, plus fixed text and a path.
MAX_MESSAGE_CHARS = 600
SKIP = "insecure-skip-tls-verify"

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20),
    st.sampled_from(["true", "false", "True", "yes", "no", "1", "0", "", "https://h:1",
                     "http://h:1", "ca.crt", "/dev/null", "~", "aGVsbG8="]),
)
def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Named, not a lambda: Hypothesis judges a multi-line lambda by its source text.
    return st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=10) | st.sampled_from(
            ["name", "cluster", "user", "context", "server", SKIP, "token", "tokenFile"]),
            inner, max_size=4),
    )


yamlish = st.recursive(scalars, _containers, max_leaves=20)


def _section(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping that has some of a kubeconfig section's keys, each with any value."""
    return st.dictionaries(st.sampled_from(keys), yamlish, max_size=len(keys))


cluster_body = _section(["server", SKIP, "certificate-authority-data", "certificate-authority",
                         "tls-server-name", "proxy-url"]).map(
    lambda d: {"server": "https://127.0.0.1:1", **d})
user_body = _section(["token", "tokenFile", "client-certificate-data", "client-key-data",
                      "client-certificate", "client-key", "exec", "username"])
names = st.sampled_from(["a", "b", "c"]) | yamlish


def _entries(inner: str, body: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    entry = st.fixed_dictionaries({"name": names, inner: body | yamlish})
    return st.lists(entry | yamlish, max_size=4)


context_body = st.fixed_dictionaries({"cluster": names, "user": names})
kubeconfig_shaped = st.fixed_dictionaries(
    {
        "clusters": _entries("cluster", cluster_body),
        "users": _entries("user", user_body),
        "contexts": _entries("context", context_body),
    },
    optional={"current-context": yamlish, "apiVersion": yamlish},
)


def _named(doc: Mapping[str, Any], key: str, inner: str) -> dict[str, Any]:
    # The last entry of a name wins, as in the loader.
    return {e["name"]: e.get(inner) for e in doc.get(key) or [] if isinstance(e, dict)}


def _check_contexts(config: Kubeconfig, doc: Any) -> None:
    for name in config.contexts:
        try:
            creds = config.credentials(name)
        except NoCredentials as exc:
            message = str(exc)
        else:
            message = ""
            _check_verification(creds, doc, name)
        assert len(message) <= MAX_MESSAGE_CHARS, message


def _check_verification(creds: Credentials, doc: Any, name: str) -> None:
    if creds.insecure_skip_tls_verify:
        context = _named(doc, "contexts", "context")[name]
        cluster = _named(doc, "clusters", "cluster")[context["cluster"]]
        assert cluster[SKIP] is True
    else:
        # Not insecure by verification; an http:// server is insecure on its own.
        assert check_secure(creds, allow_insecure=True) in (
            None, "the server is http:// (the bearer token would go out in clear)")


def _load(content: bytes) -> tuple[Kubeconfig | None, str | None]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kubeconfig"
        path.write_bytes(content)
        try:
            return load_kubeconfig(path), None
        except ConfigError as exc:
            return None, str(exc)


@given(st.one_of(yamlish, kubeconfig_shaped))
@example({"clusters": [{"name": "c", "cluster": {"server": "https://h:1", SKIP: "false"}}],
          "contexts": [{"name": "c", "context": {"cluster": "c", "user": None}}]})
def test_any_structure_decodes_to_credentials_or_our_errors(doc: Any) -> None:
    config, error = _load(yaml.safe_dump(doc).encode())
    if config is None:
        assert error is not None
        assert len(error) <= MAX_MESSAGE_CHARS
        return
    _check_contexts(config, doc)


@given(st.text(max_size=300))
@example("a: 2020-13-01")
@example("a: !!int 0xZZ")
@example("[" * 2000)
@example("clusters: &x [*x]")
def test_any_text_decodes_or_is_a_config_error(text: str) -> None:
    config, error = _load(text.encode("utf-8", "surrogatepass"))
    if config is None:
        assert error is not None
        assert len(error) <= MAX_MESSAGE_CHARS
        return
    doc = yaml.load(text, Loader=yaml.SafeLoader)
    _check_contexts(config, doc)


@given(st.binary(max_size=300))
@example(b"\xff\xfe")
def test_any_bytes_decode_or_are_a_config_error(content: bytes) -> None:
    config, error = _load(content)
    if config is None:
        assert error is not None
        assert len(error) <= MAX_MESSAGE_CHARS
        return
    doc = yaml.load(content.decode(), Loader=yaml.SafeLoader)
    _check_contexts(config, doc)
