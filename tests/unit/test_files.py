"""The one bounded reader of every file edge (`files.read_bounded`) and the file decoders built
on it: whatever a file holds, each returns a value or its own error class (`BadFile`,
`ConfigError`, `NoCredentials`) with a short one-line message, never anything else, and never
reads past its cap or waits on a pipe."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from convergerd.config import MAX_SECRET_FILE_BYTES, read_secret_file
from convergerd.core.errors import BadFile, ConfigError, NoCredentials
from convergerd.files import NOT_REGULAR, read_bounded
from convergerd.kube.kubeconfig import (
    MAX_TOKEN_BYTES,
    Kubeconfig,
    load_kubeconfig,
    read_token_file,
)
from convergerd.store.yamlfile import load_yaml
from tests.fixtures.fifo import guarded_fifo

MAX_MESSAGE_CHARS = 400  # fixed text, a path, and a value shortened to ~100 characters


def _in_file(content: bytes, read: Callable[[Path], Any]) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f"
        path.write_bytes(content)
        return read(path)


def _outcome(read: Callable[[], Any], errors: type[Exception]) -> tuple[Any, Any]:
    """(value, None) or (None, the error of class `errors`); anything else escapes."""
    try:
        return read(), None
    except errors as exc:
        return None, exc


def _short(exc: BaseException) -> None:
    message = str(exc)
    assert 0 < len(message) <= MAX_MESSAGE_CHARS, message
    assert "\n" not in message, message
    assert "\r" not in message, message


# --- the reader -------------------------------------------------------------------------------


@given(st.binary(max_size=3000), st.integers(min_value=0, max_value=3000))
def test_a_regular_file_is_read_whole_or_refused_at_its_cap(content: bytes, cap: int) -> None:
    data, refused = _outcome(
        lambda: _in_file(content, lambda p: read_bounded(p, cap, setting="SOME_SETTING")), BadFile)
    if len(content) > cap:
        assert str(refused) == (f"{len(content)} bytes, more than {cap} bytes, the limit set by "
                                "SOME_SETTING")
    else:
        assert data == content


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/dev/null", "dir", "fifo"])
def test_anything_but_a_regular_file_is_refused_without_reading_or_waiting(
    tmp_path: Path, special: str
) -> None:
    path = tmp_path / special
    if special == "dir":
        path.mkdir()
    with guarded_fifo(tmp_path / "fifo"), pytest.raises(BadFile) as info:
        read_bounded(path, 100)
    assert str(info.value) == NOT_REGULAR


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    """Kubernetes mounts a Secret's files as symlinks into a `..data` directory."""
    (tmp_path / "real").write_bytes(b"s3cr3t")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_bounded(tmp_path / "link", 100) == b"s3cr3t"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("missing", "cannot read: No such file or directory"),
        ("with\0nul", "cannot read: not a valid path (it holds a NUL)"),
    ],
)
def test_an_unreadable_path_is_one_clear_problem(tmp_path: Path, path: str,
                                                 problem: str) -> None:
    with pytest.raises(BadFile) as info:
        read_bounded(tmp_path / path, 100)
    assert str(info.value) == problem


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_without_read_permission_is_one_clear_problem(tmp_path: Path) -> None:
    path = tmp_path / "locked"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(BadFile, match=r"^cannot read: Permission denied$"):
        read_bounded(path, 100)


# --- the decoders on top of it: a value or their own error, never anything else ---------------


def _deep(depth: int) -> bytes:
    return b"a: " + b"[" * depth + b"]" * depth


VALID_IMPORT = b"""clusters: [{id: c1}]
boundaries: [{id: b, clusters: [c1]}]
policies:
  - {id: p, boundary: b, enabled: true, rule: {type: AllowedRegistries, registries: [a.io]}}
"""
HOSTILE_YAML = [
    _deep(40), _deep(100_000), b"- " * 5000 + b"x",
    b"a: 1" + b"0" * 5000, b"a: 0x" + b"f" * 5000, b"a: 1e999999", b"a: !!float 1e99999",
    b"a: !!int " + b"9" * 10_000, b"a: 2020-13-45", b"a: !!binary '%%%'", b"a: &x [*x]",
    b"{a: 1, a: 2}", b"a: !!python/object/apply:os.system [true]", b"\xef\xbb\xbf" + b"a: 1",
    b"a: \"\\ud800\"", b"\x00", b"%YAML 9.9\n---\na: 1",
]


@given(st.binary(max_size=2000) | st.sampled_from(HOSTILE_YAML)
       | st.integers(0, len(VALID_IMPORT)).map(lambda n: VALID_IMPORT[:n]))
@example(VALID_IMPORT)
def test_load_yaml_returns_a_value_or_bad_file(data: bytes) -> None:
    _loaded_or_bad_file(data)


def _loaded_or_bad_file(data: bytes) -> None:
    _, refused = _outcome(lambda: load_yaml(data), BadFile)
    if refused is not None:
        _short(refused)


_KEYS = st.text(alphabet="abcxyz-_", min_size=1, max_size=5)


@given(st.lists(_KEYS, min_size=1, max_size=12))
def test_a_mapping_loads_exactly_when_no_key_repeats(keys: list[str]) -> None:
    text = "".join(f"{k}: {i}\n" for i, k in enumerate(keys))
    loaded, refused = _outcome(lambda: load_yaml(text.encode()), BadFile)
    if len(set(keys)) < len(keys):
        assert str(refused).startswith("duplicate key ")
        assert str(refused).endswith("; give each key once")
    else:
        assert loaded == {k: i for i, k in enumerate(keys)}


def _kubeconfig(data: bytes) -> Any:
    return _in_file(data, load_kubeconfig)


KUBECONFIG = yaml.safe_dump({
    "clusters": [{"name": "c", "cluster": {"server": "https://h:1", "proxy-url": "http://p:3"}}],
    "users": [{"name": "u", "user": {"token": "t0k3n"}}],
    "contexts": [{"name": "c1", "context": {"cluster": "c", "user": "u"}}],
}).encode()


@given(st.binary(max_size=2000) | st.sampled_from(HOSTILE_YAML)
       | st.integers(0, len(KUBECONFIG)).map(lambda n: KUBECONFIG[:n]))
@example(KUBECONFIG)
def test_a_kubeconfig_loads_or_is_a_config_error(data: bytes) -> None:
    _kubeconfig_or_config_error(data)


def _kubeconfig_or_config_error(data: bytes) -> None:
    config, refused = _outcome(lambda: _kubeconfig(data), ConfigError)
    if refused is not None:
        _short(refused)
        return
    assert isinstance(config, Kubeconfig)
    for context in config.contexts:
        _, unusable = _outcome(functools.partial(config.credentials, context), NoCredentials)
        if unusable is not None:
            _short(unusable)


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode)
       | st.sampled_from([b"t0k3n\r\n", b"\xef\xbb\xbft0k3n", b"a" * (MAX_TOKEN_BYTES + 1)]))
def test_a_token_file_gives_a_header_safe_token_or_no_credentials(data: bytes) -> None:
    token, refused = _outcome(lambda: _in_file(data, lambda p: read_token_file("c1", p)),
                              NoCredentials)
    if refused is not None:
        _short(refused)
        assert refused.reason == "no_token"
    else:
        assert token
        assert all("!" <= c <= "~" for c in token)  # nothing aiohttp or a server would refuse
        assert token == data.decode().strip()


@given(st.binary(max_size=300) | st.sampled_from([b"x" * (MAX_SECRET_FILE_BYTES + 1)]))
def test_a_secret_file_gives_its_text_or_a_config_error(data: bytes) -> None:
    secret, refused = _outcome(lambda: _in_file(data, lambda p: read_secret_file("SOME_FILE", p)),
                               ConfigError)
    if refused is not None:
        _short(refused)
        assert refused.setting == "SOME_FILE"
    else:
        assert secret
        assert secret == data.decode().strip()


@pytest.mark.parametrize("data", HOSTILE_YAML, ids=range(len(HOSTILE_YAML)))
def test_hostile_yaml_is_a_value_or_our_error_at_every_file_edge(data: bytes) -> None:
    """Deep nesting, huge numbers, impossible values, recursive aliases, a key twice, unsafe
    tags: each decoder answers with a value or its own error."""
    _loaded_or_bad_file(data)
    _kubeconfig_or_config_error(data)
