"""The layout holds: layers import only downwards, no import cycle (a function-level import
may defer a heavy import, never hide a cycle), no oversized module, and a conformance case
lives in its area's folder with its mutants beside it (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness.cases.index import case_specs
from harness.mutation.registry import runnable_mutants
from harness.results.records import AREAS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "mock_engines", "conformance")
MAX_LINES = 510  # "about 500" (docs/architecture.md)

# Who may import whom: a layer's allowed targets, by module prefix. Anything not named here
# (the middle layers) is bound by the cycle check and by "nothing imports upwards from below".
FLOOR = ("harness.hygiene", "harness.locations")
ALLOWED = {
    "harness.hygiene": FLOOR,
    "harness.locations": FLOOR,
    "harness.protocol": (*FLOOR, "harness.protocol"),
    "mock_engines": (*FLOOR, "harness.protocol", "mock_engines"),
    "harness.results": (*FLOOR, "harness.protocol", "mock_engines", "harness.artefacts",
                        "harness.frontends", "harness.results"),
}
RUN_GLUE = "harness.run"  # the top: plugin, CLI, selection, shard, state; nothing imports it


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> list[tuple[str, int]]:
    """Our modules `path` imports (module level or inside functions; not TYPE_CHECKING)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.append((full if full in MODULES else child.module, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text()))
    return [(r, line) for name, line in found if (r := _resolve(name)) is not None]


GRAPH = {m: [(t, line) for t, line in _imports(p) if t != m] for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in MODULES:
        if module not in index:
            connect(module)
    return components


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_import_cycle_even_through_function_level_imports() -> None:
    assert _cycles() == []


def test_a_cycle_would_be_found() -> None:
    """The check itself can fail: two modules importing each other are one component."""
    GRAPH["harness.protocol.timing"].append(("harness.protocol.lifecycle", 0))
    GRAPH["harness.protocol.lifecycle"].append(("harness.protocol.timing", 0))
    try:
        assert ["harness.protocol.lifecycle", "harness.protocol.timing"] in _cycles()
    finally:
        GRAPH["harness.protocol.timing"].pop()
        GRAPH["harness.protocol.lifecycle"].pop()


def test_layers_import_only_downwards() -> None:
    problems = []
    for module, targets in sorted(GRAPH.items()):
        layer = next((p for p in ALLOWED if _under(module, p)), None)
        for target, line in targets:
            if layer is not None and not any(_under(target, p) for p in ALLOWED[layer]):
                problems.append(f"{module}:{line} ({layer}) imports {target}")
            if _under(target, RUN_GLUE) and not _under(module, RUN_GLUE):
                problems.append(f"{module}:{line} imports the run glue {target}")
            if _under(target, "conformance") and not _under(module, "conformance"):
                problems.append(f"{module}:{line} imports the cases {target}")
    assert problems == []


def test_no_oversized_module() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for m, p in MODULES.items() if not m.startswith("conformance")}
    big = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert big == {}


def test_every_case_lives_in_its_areas_folder() -> None:
    misplaced = {cid: where for cid, (spec, where) in case_specs().items()
                 if Path(where).parts[:2] != ("conformance", spec.area)}
    assert misplaced == {}
    folders = {p.name for p in (ROOT / "conformance").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(AREAS)


def test_case_files_are_topics_declared_without_factories() -> None:
    """`conformance/<area>/test_<topic>.py`: no appendix files, no cases minted through
    globals() (a case family is `@case(..., params=...)`), no stand-in for ctx.fail."""
    problems = []
    for path in sorted((ROOT / "conformance").rglob("*.py")):
        name, text = path.name, path.read_text()
        if "edges" in name or re.match(r"test_(abort|dp|failure|handshake|streaming|utility)",
                                       name):
            problems.append(f"{path.relative_to(ROOT)}: name it by topic")
        if "globals()[" in text or "ctx.require(False" in text:
            problems.append(f"{path.relative_to(ROOT)}: globals() factory / require(False")
    assert problems == []


@pytest.mark.parametrize("name", sorted(runnable_mutants()))
def test_every_mutant_lives_in_an_areas_mutants_module(name: str) -> None:
    mutant = runnable_mutants()[name]
    home = mutant.frontend_class if mutant.frontend_class.__module__.startswith(
        "conformance") else mutant.core
    module = getattr(home, "__module__", "")
    if name in ("utility_unbounded", "utility_timeout_too_short",
                "dead_leaves_calls_pending", "first_output_deadline"):
        return  # the reference core with other settings: registered, no class of its own
    assert re.fullmatch(r"conformance\.[a-z_]+\.mutants", module), module
