"""The map stays true to the territory: the layer contracts in `pyproject.toml`, the package tree,
docs/design.md ("Architecture", the simulator's module table) and the README's module table say
the same thing. A module added, moved or re-layered without its map fails here, naming what to
write where."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "convergerd"
DESIGN = (ROOT / "docs" / "design.md").read_text()
README = (ROOT / "README.md").read_text()
CONTRACTS: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())[
    "tool"]["importlinter"]["contracts"]

# What the simulator may import of convergerd besides itself: the event loop every process runs
# on, and the admission evaluator its clusters' admission runs (the product's, so `policy eval`,
# the operator's audit and a simulated cluster judge alike; its contract keeps `core` forbidden,
# so the simulator reaches only the parts of it that import no core).
SIM_MAY_IMPORT = {"convergerd.eventloop", "convergerd.admission"}
SIM_CONTRACT = ("the simulator imports nothing of the daemon (only the event loop every process "
                "runs on, and the admission evaluator)")


def _subpackages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def _root_modules() -> list[str]:
    """The modules directly under convergerd/ (`__init__` included)."""
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def _modules_of(subpackage: str) -> list[str]:
    return sorted(p.stem for p in (PACKAGE / subpackage).glob("*.py") if p.stem != "__init__")


def _top_level() -> set[str]:
    """Every module and subpackage directly under convergerd/, as import-linter names them."""
    return {f"convergerd.{name}" for name in [*_root_modules(), *_subpackages()]
            if name != "__init__"}


def _section(text: str, start: str, end: str) -> str:
    assert start in text, f"the section starting {start!r} is gone"
    body = text.split(start, 1)[1].lstrip("\n")
    return body.split(end, 1)[0] if end in body else body


def _table_rows(text: str) -> list[list[str]]:
    """The cells of the body rows of the first Markdown table in `text` (an escaped `\\|`
    stays in its cell)."""
    rows = []
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if set(line) <= set("|-: "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append(cells)
    return rows[1:]  # the header


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _layers(layers: list[str]) -> list[str]:
    return [" ".join(layer.split()) for layer in layers]


ARCHITECTURE = _section(DESIGN, "\n## Architecture\n", "\n## ")


# --- the contracts and docs/design.md ------------------------------------------------------------


def test_the_design_draws_the_package_layers_in_order() -> None:
    """The drawing's lines are the package contract's layers, top to bottom (a subpackage with
    a `/`): a layer added, moved or renamed in `pyproject.toml` shows in the drawing."""
    (package,) = [c for c in CONTRACTS if c.get("containers") == ["convergerd"]]
    drawing = _section(ARCHITECTURE, "```\n", "```")
    subpackages = set(_subpackages())
    position = 0
    for layer in _layers(package["layers"]):
        drawn = re.sub(r"[A-Za-z_]+", lambda m: m[0] + "/" if m[0] in subpackages else m[0],
                       layer)
        found = re.search(rf"(?<![\w/]){re.escape(drawn)}(?![\w/])", drawing[position:])
        assert found, (f"docs/design.md's drawing of the layers lacks `{drawn}` below the "
                       f"layers above it (pyproject.toml: {package['layers']})")
        position += found.end()


def test_the_design_table_holds_every_subpackage_contract() -> None:
    """Each subpackage's layers contract is one row of the design's table, the same layers in
    the same order; a row without a contract, or a contract without a row, fails."""
    table = _section(ARCHITECTURE, "Inside each subpackage, a contract of its own:", "\n### ")
    drawn = {}
    for cell_package, cell_layers in (row[:2] for row in _table_rows(table)):
        without_notes = re.sub(r"\([^`]*\)", "", cell_layers)
        drawn[cell_package.strip("`").rstrip("/")] = _layers(_ticked(without_notes))
    contracted = {c["containers"][0].removeprefix("convergerd."): _layers(c["layers"])
                  for c in CONTRACTS if c["type"] == "layers"
                  and c["containers"] != ["convergerd"]}
    for package, layers in contracted.items():
        shown = " > ".join(f"`{layer}`" for layer in layers).replace("|", "\\|")
        assert drawn.get(package) == layers, (
            f"docs/design.md's contract table: the row of `{package}/` should read {shown}")
    assert set(drawn) == set(contracted), (
        f"docs/design.md's contract table has rows with no contract: "
        f"{sorted(set(drawn) - set(contracted))}")


def _named(module: str, text: str) -> bool:
    short = module.removeprefix("convergerd.")
    return module in text or re.search(rf"(?<![\w.]){re.escape(short)}(?![\w])", text) is not None


@pytest.mark.parametrize("contract", [c for c in CONTRACTS if c["type"] != "layers"],
                         ids=lambda c: c["name"])
def test_the_design_names_every_module_of_the_other_contracts(contract: dict[str, Any]) -> None:
    """Each forbidden or protected contract is a bullet of the design, under its own name,
    naming every module the contract names."""
    bullets = _section(ARCHITECTURE, "The other contracts", "\n### ")
    start = f"- **{contract['name']}**"
    assert start in bullets, f"docs/design.md, \"The other contracts\": no bullet {start}"
    bullet = _section(bullets, start, "\n- ")
    names = [*contract.get("source_modules", []), *contract.get("forbidden_modules", []),
             *contract.get("protected_modules", []), *contract.get("allowed_importers", [])]
    missing = [name for name in names if not _named(name, bullet)]
    assert not missing, (
        f"docs/design.md's bullet **{contract['name']}** does not name {missing}")


def test_the_simulator_is_forbidden_every_module_but_its_own() -> None:
    """A new module or subpackage directly under convergerd/ is one the simulator may not
    import: its contract must name it (import-linter cannot say "everything but")."""
    (contract,) = [c for c in CONTRACTS if c["name"] == SIM_CONTRACT]
    assert contract["source_modules"] == ["convergerd.sim"]
    expected = _top_level() - {"convergerd.sim"} - SIM_MAY_IMPORT
    forbidden = set(contract["forbidden_modules"])
    assert not expected - forbidden, (
        f"pyproject.toml, contract {SIM_CONTRACT!r}: add {sorted(expected - forbidden)} to "
        "forbidden_modules (or, if the simulator may import it, to SIM_MAY_IMPORT here)")
    assert not forbidden - expected, (
        f"pyproject.toml, contract {SIM_CONTRACT!r}: {sorted(forbidden - expected)} no longer "
        "exist(s) directly under convergerd/: remove from forbidden_modules")


# --- the module tables ------------------------------------------------------------------------


def test_the_design_module_table_has_a_row_per_module() -> None:
    """"Modules": a row per root module (`runtime`), per module of a subpackage
    (`delivery/apply.py`), and per subpackage whose `__init__` holds code (`demo/`); the
    simulator's modules are in its own section's table."""
    rows = {name for row in _table_rows(_section(ARCHITECTURE, "### Modules\n", "\n### "))
            for name in _ticked(row[0])}
    required = set(_root_modules())
    for package in _subpackages():
        init = (PACKAGE / package / "__init__.py").read_text()
        if package == "sim" or re.search(r"^(async def|def|class) ", init, re.M):
            required.add(f"{package}/")
        if package != "sim":
            required |= {f"{package}/{module}.py" for module in _modules_of(package)}
    allowed = required | {f"{package}/" for package in _subpackages()}
    assert not required - rows, (
        f"docs/design.md, \"Modules\": add a row for each of {sorted(required - rows)}")
    assert not rows - allowed, (
        f"docs/design.md, \"Modules\": rows for what does not exist: {sorted(rows - allowed)}")


def test_the_simulator_module_table_has_a_row_per_module() -> None:
    section = _section(DESIGN, "\n## The fleet simulator\n", "\n## ")
    rows = {name for row in _table_rows(_section(section, "Its modules:\n", "\n### "))
            for name in _ticked(row[0])}
    modules = set(_modules_of("sim"))
    assert rows == modules, (
        f"docs/design.md, \"The fleet simulator\", its modules: add {sorted(modules - rows)}, "
        f"remove {sorted(rows - modules)}")


def test_the_readme_module_table_names_every_module() -> None:
    """A row per subpackage (`core/`) and per root module (`runtime`, several to a row); a
    subpackage's row names each of its modules in backticks (the simulator's: docs/design.md)."""
    table = _section(README, "the package is laid out as:", "\n## ")
    rows = {name: row[1] for row in _table_rows(table)
            for name in _ticked(row[0])}
    expected = {*(m for m in _root_modules() if m not in ("__init__", "__main__")),
                *(f"{p}/" for p in _subpackages())}
    assert set(rows) == expected, (
        f"README.md's module table: add rows for {sorted(expected - set(rows))}, remove "
        f"{sorted(set(rows) - expected)}")
    for package in _subpackages():
        if package == "sim":
            continue
        named = set(_ticked(rows[f"{package}/"]))
        missing = [m for m in _modules_of(package) if m not in named]
        assert not missing, (
            f"README.md's module table: the row of `{package}/` does not name {missing}")
