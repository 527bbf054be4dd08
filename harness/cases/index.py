"""Every case the suite declares, found by importing the conformance modules.

One walk for the tools that read case specs without running them: the grounds check, the
spec generator (docs/spec.md), the coverage map."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from harness.cases.declaration import CaseSpec, module_cases
from harness.cases.grounds import ALLOWED_LEVELS, Impl
from harness.cases.vllm_sources import SourceTree
from harness.locations import IMPORT_ROOT

ROOT = IMPORT_ROOT


def case_specs(root: Path = ROOT, package: str = "conformance",
               files: list[Path] | None = None) -> dict[str, tuple[CaseSpec, str]]:
    """case id -> (spec, defining file relative to root), components included; only the
    cases of `files` (paths under root) when given."""
    root = root.resolve()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    found: dict[str, tuple[CaseSpec, str]] = {}
    paths = files if files is not None else sorted((root / package).rglob("test_*.py"))
    for path in (p.resolve() for p in paths):
        dotted = ".".join(path.relative_to(root).with_suffix("").parts)
        module = importlib.import_module(dotted)
        for declared in module_cases(vars(module)):
            found[declared.spec.case_id] = (declared.spec, path.relative_to(root).as_posix())
    return found


def wire_specs(root: Path = ROOT, files: list[Path] | None = None
               ) -> dict[str, tuple[CaseSpec, str]]:
    """The wire cases: every case but the component contracts (kv:/ec:)."""
    return {k: v for k, v in case_specs(root, files=files).items()
            if v[0].area != "components"}


def level_problems(spec: CaseSpec) -> list[str]:
    """What breaks the level rule (harness.cases.grounds) in one case's declaration."""
    if spec.grounds is None:
        return [f"{spec.case_id}: no grounds"]
    basis = spec.grounds.basis
    if spec.level.value not in ALLOWED_LEVELS[basis]:
        return [f"{spec.case_id}: level {spec.level.value} is not allowed on basis "
                f"{basis.value} (allowed: {sorted(ALLOWED_LEVELS[basis])})"]
    if spec.level.value == "MUST" and not spec.grounds.of(Impl.PYTHON) + spec.grounds.of(
            Impl.RUST):
        return [f"{spec.case_id}: a MUST cites neither frontend"]
    return []


def grounds_problems(specs: dict[str, tuple[CaseSpec, str]], tree: SourceTree) -> list[str]:
    """Every citation that does not say what it claims, and every level-rule breach."""
    problems: list[str] = []
    for case_id, (spec, where) in sorted(specs.items()):
        problems += [f"{p} ({where})" for p in level_problems(spec)]
        for cite in spec.grounds.cites if spec.grounds else ():
            problem = tree.check(cite)
            if problem:
                problems.append(f"{case_id} ({where}): {problem}")
    return problems
