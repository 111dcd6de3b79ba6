"""A public face per subpackage (docs/design.md, "Modules"): `convergerd/X/__init__.py`'s
`__all__` lists what the rest of convergerd may import from X: its modules (and, where the
`__init__` holds code, the names defined there). From a module of the face, any name without a
leading underscore. Every import in the package that crosses into a subpackage is checked here;
the tests, the benchmarks and a subpackage's own modules may import anything."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "convergerd"
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


@dataclass(frozen=True)
class Import:
    where: str  # file:line
    importer: str  # the importing module's subpackage, "" for a root module
    module: str  # the module imported from, dotted
    name: str | None  # the name imported from it (None: `import module`)


def _faces() -> dict[str, list[str]]:
    faces = {}
    for package in SUBPACKAGES:
        tree = ast.parse((PACKAGE / package / "__init__.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None)
                                                 for t in node.targets] == ["__all__"]:
                faces[package] = list(ast.literal_eval(node.value))
    return faces


FACES = _faces()


def _imports() -> Iterator[Import]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        importer = rel.parts[0] if len(rel.parts) > 1 else ""
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"convergerd/{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "convergerd" or node.module.startswith("convergerd.")):
                for alias in node.names:
                    yield Import(where, importer, node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("convergerd."):
                        yield Import(where, importer, alias.name, None)


def _crossings() -> list[Import]:
    """The imports of a subpackage's modules or names from outside that subpackage."""
    found = []
    for imp in _imports():
        parts = imp.module.split(".")
        target = parts[1] if len(parts) > 1 else ""
        if target in SUBPACKAGES and target != imp.importer:
            found.append(imp)
    return found


CROSSINGS = _crossings()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _violation(imp: Import) -> str | None:
    parts = imp.module.split(".")
    package = parts[1]
    face = FACES.get(package, [])
    # `from convergerd.X import m` takes a module or a name of X's __init__; `from
    # convergerd.X.m import n` and `import convergerd.X.m` take module m.
    entry = imp.name if len(parts) == 2 else parts[2]
    if entry is not None and entry not in face:
        return (f"{imp.where}: `{imp.module}{'.' + entry if len(parts) == 2 else ''}` is not in "
                f"{package}'s public face (convergerd/{package}/__init__.py __all__ = {face})")
    if imp.name is not None and len(parts) > 2 and _private(imp.name):
        return f"{imp.where}: `{imp.name}` of `{imp.module}` is private (a leading underscore)"
    return None


def test_every_subpackage_declares_its_public_face() -> None:
    assert sorted(FACES) == SUBPACKAGES, (
        f"no __all__ in the __init__.py of {sorted(set(SUBPACKAGES) - set(FACES))}")


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_a_face_names_what_exists_and_what_is_used(package: str) -> None:
    """An entry is a module of the package or a name its `__init__` defines; a module in the
    face is imported from outside the package (else the face is wider than the design)."""
    init = ast.parse((PACKAGE / package / "__init__.py").read_text())
    defined = {n.name for n in init.body if isinstance(
        n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    modules = {p.stem for p in (PACKAGE / package).glob("*.py")} - {"__init__"}
    face = FACES.get(package, [])
    unknown = [e for e in face if e not in modules and e not in defined]
    assert not unknown, f"convergerd/{package}/__init__.py __all__ names nothing real: {unknown}"
    used = {imp.module.split(".")[2] if imp.module.count(".") > 1 else imp.name
            for imp in CROSSINGS if imp.module.split(".")[1] == package}
    unused = [e for e in face if e in modules and e not in used]
    assert not unused, (
        f"convergerd/{package}/__init__.py __all__: nothing outside {package}/ imports "
        f"{unused}; drop them from the face")


def test_imports_across_subpackages_go_through_the_public_face() -> None:
    assert len(CROSSINGS) > 100  # the walk sees the package's imports
    violations = [v for v in map(_violation, CROSSINGS) if v is not None]
    assert not violations, "\n".join(violations)
