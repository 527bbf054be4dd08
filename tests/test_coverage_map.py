"""The vLLM-test coverage map stays complete, truthful and in sync with docs/coverage.md.

Fast and offline: the upstream test names are checked-in lists (fixtures/coverage/
upstream-0.33.0/), the cases are read from the conformance modules. `wanted` entries are
proposals and are not required to exist (the lead decides which become cases).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.cases.declaration import CASE_ID
from harness.results.records import AREAS

ROOT = Path(__file__).resolve().parent.parent


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_coverage",
                                                  ROOT / "scripts" / "gen_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


@pytest.fixture(scope="module")
def cmap() -> Any:
    return gen.load_map()


@pytest.fixture(scope="module")
def levels() -> dict[str, str]:
    return dict(gen.collect_case_levels())


def test_every_upstream_name_is_mapped_exactly_once(cmap: Any) -> None:
    for upstream in cmap.files:
        names = upstream.names(cmap.base)
        assert len(names) == len(set(names)), f"{upstream.names_file} lists a name twice"
        mapped = Counter(t.name for t in cmap.tests_of(upstream.key))
        twice = sorted(n for n, k in mapped.items() if k > 1)
        assert not twice, f"{upstream.path}: mapped more than once: {twice}"
        missing = sorted(set(names) - set(mapped))
        assert not missing, f"{upstream.path}: upstream tests missing from the map: {missing}"
        extra = sorted(set(mapped) - set(names))
        assert not extra, f"{upstream.path}: mapped tests not in {upstream.names_file}: {extra}"


def test_rust_list_is_the_whole_0_33_0_file(cmap: Any) -> None:
    rust = next(f for f in cmap.files if f.key == "rust")
    names = rust.names(cmap.base)
    assert len(names) == 36
    assert names[-1].endswith("_sends_no_wakeup")
    assert "wake_up_requires_every_engine_to_be_fully_awake" in names


def test_every_named_case_exists(cmap: Any, levels: dict[str, str]) -> None:
    unknown = sorted({(t.name, c) for t in cmap.tests
                      for c in t.cases if c not in levels})
    assert not unknown, f"the map names cases that are not collected: {unknown}"


def test_every_entry_has_cases_or_a_reason(cmap: Any) -> None:
    for t in cmap.tests:
        assert t.checks.strip(), f"{t.name}: say what it checks"
        if not t.observable:
            assert not t.cases, f"{t.name}: not observable but claims cases {t.cases}"
            assert t.reason.strip(), f"{t.name}: not observable needs a reason"
        elif not t.cases:
            assert t.reason.strip(), f"{t.name}: observable, no case: say why (reason)"
        if t.wanted:
            assert t.observable, f"{t.name}: 'wanted' only makes sense for observable tests"


def test_wanted_ids_are_well_formed(cmap: Any) -> None:
    for t in cmap.tests:
        for w in t.wanted:
            assert CASE_ID.match(w.case_id) and w.case_id.split(".")[0] in AREAS, \
                f"{t.name}: wanted id {w.case_id!r} is not <area>.<topic>.<case>"
            assert w.requirement.strip(), f"{t.name}: wanted {w.case_id} needs a requirement"


def test_same_wanted_id_means_the_same_case(cmap: Any) -> None:
    seen: dict[str, tuple[str, str]] = {}
    for t in cmap.tests:
        for w in t.wanted:
            first = seen.setdefault(w.case_id, (w.level, w.requirement))
            assert first == (w.level, w.requirement), \
                f"wanted {w.case_id} is described two ways: {first} vs {(w.level, w.requirement)}"


def test_summary_counts_add_up(cmap: Any, levels: dict[str, str]) -> None:
    text = gen.render(cmap, levels)
    for upstream in cmap.files:
        line = next(x for x in text.splitlines() if x.startswith(f"- {upstream.title}:"))
        covered, total, hidden, open_ = _counts(line)
        assert total == len(cmap.tests_of(upstream.key)), line
        assert covered + hidden + open_ == total, line


def _counts(line: str) -> tuple[int, int, int, int]:
    """(covered, total, not observable, open) from a summary line."""
    match = re.search(r"\*\*(\d+) of (\d+)\*\*.*\*\*(\d+)\*\* not observable.*"
                      r"\*\*(\d+)\*\* open", line)
    assert match is not None, f"summary line has an unexpected shape: {line}"
    covered, total, hidden, open_ = (int(g) for g in match.groups())
    return covered, total, hidden, open_


def test_docs_coverage_md_is_up_to_date(cmap: Any, levels: dict[str, str]) -> None:
    current = (ROOT / "docs" / "coverage.md").read_text(encoding="utf-8")
    assert current == gen.render_document(cmap, levels), \
        "docs/coverage.md is stale: run `make coverage` (scripts/gen_coverage.py)"


# ------------------------------------------------------------------ the field table


def _field_inputs() -> tuple[list[Any], list[tuple[str, str]], dict[str, list[str]]]:
    from harness.results.fields import expected_fields, load_fields

    rows = load_fields(gen.FIELDS_PATH)
    profile = json.loads((ROOT / "fixtures" / "profiles" / "vllm-0.33.0.json").read_text())
    record = json.loads((ROOT / "fixtures" / "kill-matrix.json").read_text())
    caught_by = {m: list(entry["caught_by"]) for m, entry in record["mutants"].items()}
    return rows, expected_fields(profile), caught_by


def test_the_field_table_covers_every_field_and_proves_its_mutants() -> None:
    """Every field of the 0.33.0 profile's structs and of the other messages has one row;
    every case named exists; a row without a case says why; every mutant a row names is
    caught by one of that row's cases in the kill matrix (a claimed check is a proven one)."""
    from harness.results.fields import field_problems

    rows, expected, caught_by = _field_inputs()
    assert len(expected) == len(set(expected)) > 100
    assert field_problems(rows, expected, gen.collect_case_levels(), caught_by) == []


def test_the_field_checker_fails_what_it_should() -> None:
    """The checker is not one that cannot fail: a missing row, an unknown case, an empty
    row without a reason and a mutant none of its cases catch are each reported."""
    from dataclasses import replace

    from harness.results.fields import field_problems

    rows, expected, caught_by = _field_inputs()
    levels = gen.collect_case_levels()
    broken = list(rows[1:])  # the first field lost
    first_checked = next(i for i, r in enumerate(broken) if r.cases and r.mutants)
    row = broken[first_checked]
    broken[first_checked] = replace(row, cases=("streaming.no.such_case",))
    empty = next(i for i, r in enumerate(broken) if not r.cases)
    broken[empty] = replace(broken[empty], reason=" ")
    problems = "\n".join(field_problems(broken, expected, levels, caught_by))
    assert f"{rows[0].message}.{rows[0].field}: 0 rows" in problems
    assert "no case streaming.no.such_case" in problems
    assert f"mutant {row.mutants[0]} is caught by none of the row's cases" in problems
    assert "no case and no reason why" in problems


# ------------------------------------------------------------------ the dimension grids


def test_the_dimension_grids_are_complete_and_explained() -> None:
    """Every area x dimension has a cell per value (or one n/a cell), every case named
    exists, every empty cell says why, and docs/dimensions.md is what the data renders."""
    from harness.results.dimensions import grid_problems, load_cells

    levels = gen.collect_case_levels()
    cells = load_cells(gen.GRIDS_PATH)
    assert grid_problems(cells, levels) == []
    assert gen.GRIDS_DOC.read_text(encoding="utf-8") == gen.render_grid_document(levels), \
        "docs/dimensions.md is stale: run `make coverage` (scripts/gen_coverage.py)"


def test_the_grid_checker_fails_what_it_should() -> None:
    from dataclasses import replace

    from harness.results.dimensions import grid_problems, load_cells

    levels = gen.collect_case_levels()
    cells = load_cells(gen.GRIDS_PATH)
    lost = next(c for c in cells if c.value != "n/a")
    broken = [c for c in cells if c is not lost]
    empty = next(i for i, c in enumerate(broken) if not c.cases)
    broken[empty] = replace(broken[empty], reason="")
    full = next(i for i, c in enumerate(broken) if c.cases)
    broken[full] = replace(broken[full], cases=("abort.no.such_case",))
    problems = "\n".join(grid_problems(broken, levels))
    assert f"{lost.area} x {lost.dimension} = {lost.value}: 0 cells" in problems
    assert "no case and no reason why" in problems
    assert "no case abort.no.such_case" in problems
