"""What admission adds to one request besides its verdict: HTTP `Warning` headers and audit
annotations (pure).

kube-apiserver gives every request a warning recorder (k8s.io/apiserver/pkg/endpoints/filters/
warning.go `WithWarningRecorder`) that admission adds to; the headers go on the answer whatever
it is (a denial by another binding too). The recorder drops a text it already has, and past
4,096 runes in all it cuts every warning to 256 runes (and adds none once that total is
reached again). Each header is `299 - "<text>"`, the text quoted with `"` and `\\` escaped and
refused when it holds control characters (k8s.io/apimachinery/pkg/util/net/http.go
`NewWarningHeader`). Audit annotations go to the request's audit event: the simulator keeps
them in its request log (`convergerd.sim.accounting`); a key already set keeps its first value
(admission.Attributes `AddAnnotation` refuses to overwrite one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_TOTAL_RUNES = 4 * 1024
_ITEM_RUNES = 256
_MAX_ANNOTATIONS = 64  # a bound of ours: the audit event holds a few per plugin


def warning_header(text: str) -> str | None:
    """`299 - "<text>"`, or None for a text a header cannot carry."""
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text):
        return None
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'


@dataclass
class RequestNotes:
    """One request's warnings (already as header values) and audit annotations."""

    headers: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    _texts: list[str] = field(default_factory=list)
    _written: int = 0
    _truncating: bool = False

    def warn(self, text: str) -> None:
        if not text or text in self._texts:
            return
        if self._truncating and self._written >= _TOTAL_RUNES:
            return
        self._texts.append(text)
        if self._truncating:
            self._add(text[:_ITEM_RUNES])
            return
        if self._written + len(text) <= _TOTAL_RUNES:
            self._add(text)
            return
        # Over the total: from now on every warning is cut, the ones so far again too.
        self._truncating, self._written = True, 0
        self.headers.clear()
        for kept in self._texts:
            self._add(kept[:_ITEM_RUNES])

    def _add(self, text: str) -> None:
        header = warning_header(text)
        if header is not None:
            self._written += len(text)
            self.headers.append(header)

    def annotate(self, key: str, value: str) -> None:
        if key not in self.annotations and len(self.annotations) < _MAX_ANNOTATIONS:
            self.annotations[key] = value
