"""docs/ARCHITECTURE.md's layers and import table, held against the imports in the code.

Every import of `src/bob` and of the repository's `dev/` (module-level, in a function or
under TYPE_CHECKING alike; relative ones resolved) is read with `ast`. The package-to-package
arrows must be exactly the table's, none may run up the layer diagram's rows, and no
modules may import each other in a circle.

    PYTHONPATH=src .venv/bin/python -m pytest -q tests/test_architecture.py
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
DOC_NAME = "docs/ARCHITECTURE.md"
# Where modules are read: (directory on the path, the top package under it).
SOURCES = ((ROOT / "src", "bob"), (ROOT, "dev"))
LAYERS_HEADING = "## Layers"
TABLE_HEADER = "| package | imports |"


@dataclass(frozen=True)
class Import:
    """One import statement: the module it is in, the module it names, and where."""

    importer: str
    imported: str
    path: str
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.importer} imports {self.imported})"


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module of bob and dev: dotted name -> file."""
    found = {}
    for base, top in SOURCES:
        for path in sorted((base / top).rglob("*.py")):
            found[_module_name(path, base)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours `name` names (the longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of one of our modules by another, wherever it stands in the file."""
    found = []
    for importer, path in modules.items():
        is_package = path.name == "__init__.py"
        here = importer.split(".") if is_package else importer.split(".")[:-1]
        shown = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), shown)):
            named: list[str] = []
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                # `from package import module` names the module; `from module import x`
                # the module.
                named = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                         else source for alias in node.names]
            for name in named:
                imported = _resolve(name, modules)
                if imported is not None and imported != importer:
                    found.append(Import(importer, imported, shown, node.lineno))
    return found


def package_of(module: str) -> str | None:
    """The package a module belongs to in the doc's terms: bob.X... is X (config, files,
    errors and __main__ are modules of their own floor), dev... is dev; the root package
    `bob`, whose __init__ imports its public API only when it is named, is none."""
    parts = module.split(".")
    if parts[0] == "dev":
        return "dev"
    return parts[1] if len(parts) > 1 else None


# -- what the doc says ---------------------------------------------------------------------
def _section(text: str, heading: str) -> str:
    if heading not in text:
        pytest.fail(f"{DOC_NAME} has no {heading!r} section: the layer diagram goes under it")
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def doc_layers(text: str) -> list[list[str]]:
    """The layer diagram's rows, top first: each row's packages (`a | b` shares a row).

    The diagram is the first fenced block of the Layers section; a row is its packages,
    then two spaces or more, then what they hold; a line of dashes marks the ground floor.
    """
    section = _section(text, LAYERS_HEADING)
    match = re.search(r"```\n(.*?)```", section, re.S)
    if match is None:
        pytest.fail(f"{DOC_NAME}'s {LAYERS_HEADING} section has no fenced layer diagram")
    rows = []
    for line in match.group(1).splitlines():
        if not line.strip() or line.lstrip().startswith("- -"):
            continue
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        rows.append([name.strip() for name in names.split("|")])
    return rows


def _outside_parentheses(cell: str) -> str:
    """`cell` without what stands in parentheses (the reasons beside an arrow)."""
    kept, depth = [], 0
    for char in cell:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(char)
    return "".join(kept)


def doc_arrows(text: str) -> dict[str, set[str]]:
    """The import table: package -> the packages its row says it imports.

    A row's first cell names one package or several (`config`, `files`); the second
    names the imported packages in backticks, a reason in parentheses beside one.
    """
    if TABLE_HEADER not in text:
        pytest.fail(f"{DOC_NAME} has no table headed {TABLE_HEADER!r}")
    table = text.split(TABLE_HEADER, 1)[1].split("\n\n", 1)[0]
    arrows: dict[str, set[str]] = {}
    for line in table.strip().splitlines()[1:]:  # past the |---| line
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            pytest.fail(f"{DOC_NAME}: the import table's row {line!r} is not two cells")
        imported = set(re.findall(r"`([^`]+)`", _outside_parentheses(cells[1])))
        for package in re.findall(r"`([^`]+)`", cells[0]):
            arrows[package] = imported
    return arrows


# -- the checks ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def code() -> tuple[dict[str, Path], list[Import]]:
    modules = _modules()
    return modules, _imports(modules)


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text(encoding="utf-8")


def code_arrows(imports: list[Import]) -> dict[tuple[str, str], list[Import]]:
    """(importing package, imported package) -> the imports that make the arrow."""
    arrows: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for each in imports:
        source, target = package_of(each.importer), package_of(each.imported)
        if source and target and source != target:
            arrows[source, target].append(each)
    return arrows


# What the root's __init__ may name: the public API, and only when it is first asked for.
ROOT_FACE = "bob.host.model"


def test_the_root_package_imports_only_its_face_and_only_lazily(code):
    """`import bob` is no arrow because the root's __init__ imports nothing when it runs:
    its one import (of the public API) stands inside a function."""
    modules, imports = code
    made = [each for each in imports if each.importer == "bob"]
    other = [each.where() for each in made if each.imported != ROOT_FACE]
    assert not other, ("src/bob/__init__.py imports " + "; ".join(other) + f": it names "
                       f"only {ROOT_FACE} (tests/test_architecture.py counts `import bob` as "
                       "no arrow)")
    tree = ast.parse(modules["bob"].read_text(encoding="utf-8"))
    eager = [node.lineno for node in tree.body
             if isinstance(node, ast.Import | ast.ImportFrom)
             and getattr(node, "module", None) != "__future__"]
    assert not eager, (f"src/bob/__init__.py imports at module level (lines {eager}): "
                       "`import bob` must load nothing; import inside __getattr__")


def test_every_package_is_on_the_layer_diagram_once(code, text):
    modules, _ = code
    rows = doc_layers(text)
    placed = [name for row in rows for name in row]
    packages = {package_of(name) for name in modules} - {None}
    twice = sorted({name for name in placed if placed.count(name) > 1})
    missing = sorted(packages - set(placed))
    stray = sorted(set(placed) - packages)
    problems = ([f"add a row (or a place in a row) for `{name}` to {DOC_NAME}'s layer "
                 "diagram, above every package it imports" for name in missing]
                + [f"`{name}` stands on the layer diagram but is no package of src/bob or "
                   f"dev/: remove it from the diagram" for name in stray]
                + [f"`{name}` stands on more than one row of the diagram: keep one"
                   for name in twice])
    assert not problems, "\n".join(problems)


def test_the_import_table_names_every_arrow_and_no_other(code, text):
    modules, imports = code
    made = code_arrows(imports)
    claimed = doc_arrows(text)
    packages = {package_of(name) for name in modules} - {None}
    problems = []
    for package in sorted(packages - set(claimed)):
        if any(source == package for source, _ in made):
            problems.append(f"{DOC_NAME}'s import table has no row for `{package}`: add "
                            f"one naming what it imports")
    for source, targets in sorted(claimed.items()):
        for name in sorted(({source} | targets) - packages):
            problems.append(f"{DOC_NAME}'s import table names `{name}` (the `{source}` "
                            f"row), which is no package of src/bob or dev/: remove it")
        if source in packages:
            claimed[source] = targets & packages
        else:
            del claimed[source]
    for (source, target), where in sorted(made.items()):
        if source in claimed and target not in claimed[source]:
            problems.append(f"add `{target}` to the `{source}` row of {DOC_NAME}'s import "
                            f"table: {where[0].where()}"
                            + (f" and {len(where) - 1} more" if len(where) > 1 else ""))
    for source, targets in sorted(claimed.items()):
        for target in sorted(targets):
            if (source, target) not in made:
                problems.append(f"remove `{target}` from the `{source}` row of {DOC_NAME}'s "
                                f"import table: no module of {source} imports {target}")
    assert not problems, "\n".join(problems)


def test_no_import_runs_up_the_layers(code, text):
    _, imports = code
    rows = doc_layers(text)
    rank = {name: index for index, row in enumerate(rows) for name in row}  # 0: the top
    problems = []
    for (source, target), where in sorted(code_arrows(imports).items()):
        if source not in rank or target not in rank:
            continue  # test_every_package_is_on_the_layer_diagram_once names them
        if rank[target] <= rank[source]:
            side = "beside" if rank[target] == rank[source] else "above"
            problems.append(
                f"{source} imports {target}, which stands {side} it on {DOC_NAME}'s layer "
                f"diagram: {where[0].where()}"
                + (f" and {len(where) - 1} more" if len(where) > 1 else "")
                + f"; move the code so that {source} need not import {target}, or, if "
                  f"{target} belongs below {source}, redraw the diagram")
    assert not problems, "\n".join(problems)


def circles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for each in imports:
        graph[each.importer].add(each.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle(code):
    _, imports = code
    problems = []
    for component in circles(imports):
        inside = set(component)
        ties = [each.where() for each in imports
                if each.importer in inside and each.imported in inside]
        problems.append("these modules import each other in a circle: "
                        + ", ".join(component) + "\n  " + "\n  ".join(ties)
                        + "\n  move what both need into a module below them")
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_they_should():
    """The reader itself: a relative import resolved, a circle found, a parenthesis kept
    out of the table's arrows."""
    modules = {"bob.a": ROOT, "bob.a.b": ROOT, "bob.c": ROOT}
    assert _resolve("bob.a.b.thing", modules) == "bob.a.b"
    assert _resolve("numpy", modules) is None
    loop = [Import("bob.a", "bob.c", "x", 1), Import("bob.c", "bob.a.b", "x", 2),
            Import("bob.a.b", "bob.a", "x", 3)]
    assert circles(loop) == [["bob.a", "bob.a.b", "bob.c"]]
    assert circles(loop[:2]) == []
    assert (set(re.findall(r"`([^`]+)`", _outside_parentheses(
        "`plan`, `kernels` (`arith.exp2` (sampling)), `config`")))
        == {"plan", "kernels", "config"})
    assert package_of("bob.backends.cuda.driver") == "backends"
    assert package_of("bob.config") == "config"
    assert package_of("dev.bench.cli") == "dev"
    assert package_of("bob") is None
