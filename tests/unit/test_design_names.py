"""docs/design.md stays true: every module, class, function, file, setting and metric it names
in backticks exists where it says. A rename that forgets the design fails here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import convergerd
from convergerd.config import SETTINGS

ROOT = Path(__file__).parents[2]
DESIGN = ROOT / "docs" / "design.md"
PACKAGE = ROOT / "convergerd"

# Backticked dotted names that start with these are Kubernetes or database fields, not code.
FIELD_ROOTS = {"status", "spec", "metadata", "rule", "policies", "details", "items"}
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+(\(\))?")
PATH = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*(\.py|\.md|\.yaml|\.json|\.sql|/)")


def _modules() -> dict[str, ModuleType]:
    found = {"convergerd": convergerd}
    for info in pkgutil.walk_packages(convergerd.__path__, "convergerd."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        found[info.name] = importlib.import_module(info.name)
    return found


MODULES = _modules()
PACKAGES = {name for name, module in MODULES.items() if hasattr(module, "__path__")}
CLASSES: dict[str, list[type]] = {}
for _module in MODULES.values():
    for _name, _value in vars(_module).items():
        if inspect.isclass(_value) and _value.__module__ == _module.__name__:
            CLASSES.setdefault(_name, []).append(_value)


def _names() -> Iterator[str]:
    for match in re.finditer(r"`([^`\n]+)`", DESIGN.read_text()):
        yield match.group(1)


def _resolves(parts: list[str]) -> bool:
    """`parts` name a module (by its dotted path's tail) or a class, then attributes of it; a
    class or function named on a module must be defined there, not just imported."""
    for cut in range(len(parts), 0, -1):
        head, rest = parts[:cut], parts[cut:]
        suffix = "." + ".".join(head)
        starts: list[object] = [m for name, m in MODULES.items() if ("." + name).endswith(suffix)]
        if "convergerd" + suffix in PACKAGES:  # `store.X` is the package's, not `store.store.X`
            starts = [MODULES["convergerd" + suffix]]
        if cut == 1:
            starts += CLASSES.get(head[0], [])
        if any(_attributes_exist(start, rest) for start in starts):
            return True
    return False


def _attributes_exist(value: object, attributes: list[str]) -> bool:
    for attr in attributes:
        owner, value = value, getattr(value, attr, _MISSING)
        if value is _MISSING:
            return False
        defined_in = getattr(value, "__module__", None)
        if isinstance(owner, ModuleType) and (inspect.isclass(value) or inspect.isfunction(
                value)) and defined_in != owner.__name__:
            return False
    return True


_MISSING = object()


def _is_code_name(parts: list[str]) -> bool:
    if parts[0] in FIELD_ROOTS:
        return False
    tails = {name.rsplit(".", 1)[-1] for name in MODULES}
    return parts[0] in tails or parts[0] in CLASSES


def _code_names() -> list[str]:
    return sorted({n for n in _names() if DOTTED.fullmatch(n) and not PATH.fullmatch(n)
                   and _is_code_name(n.removesuffix("()").split("."))})


def _paths() -> list[str]:
    return sorted({n for n in _names() if PATH.fullmatch(n) and "NNNN" not in n})


@pytest.mark.parametrize("name", _code_names())
def test_a_named_module_class_or_function_exists(name: str) -> None:
    assert _resolves(name.removesuffix("()").split(".")), (
        f"docs/design.md names `{name}`, which is not in the package")


@pytest.mark.parametrize("path", _paths())
def test_a_named_file_exists(path: str) -> None:
    """A path is the repository's or the package's; a bare file name is somewhere in either."""
    found = (ROOT / path).exists() or (PACKAGE / path).exists() or (
        "/" not in path.rstrip("/") and any(ROOT.glob(f"**/{path}")))
    assert found, f"docs/design.md names `{path}`, which is not in the repository"


def test_named_settings_and_metrics_exist() -> None:
    source = "\n".join(p.read_text() for p in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.sql")])
    envs = {s.env for s in SETTINGS}
    missing = [n for n in _names() if re.fullmatch(r"CONVERGERD_[A-Z0-9_]+", n)
               and n not in envs and n not in source]
    missing += [n for n in _names() if re.fullmatch(r"convergerd_[a-z0-9_]+(\{[a-z_,]*\})?", n)
                and n.split("{")[0].removesuffix("_total") not in source]  # counters add it
    assert not missing, f"docs/design.md names settings or metrics that do not exist: {missing}"
