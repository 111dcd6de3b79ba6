"""CEL as kube-apiserver's admission policies see it, on Google's CEL runtime (cel-expr-python).

One environment with the variables an admission expression may use (`object`, `oldObject`,
`request`, `params`, `namespaceObject`, `variables`), all dynamically typed as for
unstructured objects, plus the string extension library Kubernetes enables. `authorizer` is
not declared: an expression that uses it fails to compile, which the failure policy decides.
Compiled programs are cached by expression text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "variables")
_CACHE_LIMIT = 4096


class CelError(Exception):
    """An expression that did not compile or evaluate; the message is the runtime's."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    program: Any | None  # cel.Expression
    error: str | None


class CelRuntime:
    """Compiles (cached) and evaluates admission expressions. Not thread-safe; one per loop."""

    def __init__(self, cache_limit: int = _CACHE_LIMIT) -> None:
        self._env = cel.NewEnv(
            variables=dict.fromkeys(VARIABLES, cel.Type.DYN),
            extensions=[ext_strings.ExtStrings()],
        )
        self._cache: dict[str, _Compiled] = {}
        self._cache_limit = cache_limit

    def _compile(self, expression: str) -> _Compiled:
        compiled = self._cache.get(expression)
        if compiled is None:
            try:
                compiled = _Compiled(self._env.compile(expression), None)
            except Exception as exc:
                compiled = _Compiled(None, _one_line(str(exc)))
            if len(self._cache) >= self._cache_limit:
                self._cache.clear()
            self._cache[expression] = compiled
        return compiled

    def compile_error(self, expression: str) -> str | None:
        """None if `expression` compiles, else the compiler's message."""
        return self._compile(expression).error

    def evaluate(self, expression: str, data: Mapping[str, Any]) -> Any:
        """The plain (JSON-like) value of `expression` over `data`; `CelError` on a compile
        or evaluation error."""
        compiled = self._compile(expression)
        if compiled.program is None:
            raise CelError(f"compilation failed: {compiled.error}")
        try:
            result = compiled.program.eval(data=dict(data))
        except Exception as exc:
            raise CelError(_one_line(str(exc))) from None
        if result.type() == cel.Type.ERROR:
            raise CelError(_one_line(str(result.value())))
        return result.plain_value()


def _one_line(text: str) -> str:
    return " ".join(text.split())
