"""`convergerd.eventloop.EventLoop` copies a private asyncio method to swap the TLS protocol
class (a 32 KiB read buffer instead of 256 KiB). These tests pin what the copy relies on, so a
Python whose asyncio changed fails here, loudly, instead of running a stale copy."""

from __future__ import annotations

import hashlib
import inspect
import sys
import tomllib
from asyncio import selector_events, sslproto
from pathlib import Path

from convergerd.eventloop import TLS_READ_BUFFER_BYTES, EventLoop

# sha256 of `BaseSelectorEventLoop._make_ssl_transport`'s source, as each checked CPython has
# it. 3.12 added `self._ensure_fd_no_transport(rawsock)`, which the override calls when present.
KNOWN_MAKE_SSL_TRANSPORT = {
    (3, 11): "038cd880ce209b29",
    (3, 12): "51b79bdb64922477",
    (3, 13): "51b79bdb64922477",
}
REVIEW = ("asyncio changed under convergerd/eventloop.py's EventLoop._make_ssl_transport on "
          "Python {version}: compare asyncio's new body with the override, update the "
          "override, then add this version here and to requires-python in pyproject.toml")


# Private, so not in typeshed.
ASYNCIO_MAKE_SSL_TRANSPORT = selector_events.BaseSelectorEventLoop._make_ssl_transport  # type: ignore[attr-defined]


def _source_digest() -> str:
    source = inspect.getsource(ASYNCIO_MAKE_SSL_TRANSPORT)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def test_asyncio_make_ssl_transport_is_the_body_the_override_copies() -> None:
    version = sys.version_info[:2]
    assert KNOWN_MAKE_SSL_TRANSPORT.get(version) == _source_digest(), REVIEW.format(
        version=".".join(map(str, version)))


def test_the_override_takes_asyncios_parameters() -> None:
    ours = inspect.signature(EventLoop._make_ssl_transport)
    theirs = inspect.signature(ASYNCIO_MAKE_SSL_TRANSPORT)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


def test_the_tls_protocol_sizes_its_buffer_from_the_class_attribute() -> None:
    """What the smaller subclass attribute changes: the buffer allocated per connection."""
    assert sslproto.SSLProtocol.max_size == 256 * 1024
    assert "bytearray(self.max_size)" in inspect.getsource(sslproto.SSLProtocol.__init__)
    assert sslproto.SSLProtocol.max_size > TLS_READ_BUFFER_BYTES


def test_requires_python_names_only_checked_versions() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11,<3.14"
    assert sorted(KNOWN_MAKE_SSL_TRANSPORT) == [(3, 11), (3, 12), (3, 13)]
