"""`@case(..., params=...)`: one case per entry, declared where it is written
(harness/cases/declaration.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.cases.declaration import case, cases_of, module_cases
from harness.cases.grounds import Grounds, both, py, rs
from harness.results.records import Level


def _grounds() -> Grounds:
    """Grounds of the right shape (never checked against the sdist here)."""
    return both(py("vllm/v1/engine/coordinator.py:364", "x"), rs("rust/src/x.rs:1", "y"))


def test_each_entry_is_a_case_with_its_own_id_requirement_and_arguments() -> None:
    seen: list[tuple[int, str]] = []

    @case("dp.rule.spread_{n}_engines", Level.MUST, "With {n} engine(s), {{braces}} stay.",
          grounds=_grounds(), params=[{"n": 1, "label": "one"},
                                      {"n": 2, "label": "two", "level": Level.SHOULD}])
    async def spread(ctx: Any, n: int) -> None:
        seen.append((n, ctx))

    declared = cases_of(spread)
    assert [d.spec.case_id for d in declared] == ["dp.rule.spread_1_engines",
                                                  "dp.rule.spread_2_engines"]
    assert declared[0].spec.requirement == "With 1 engine(s), {braces} stay."
    assert [d.spec.level for d in declared] == [Level.MUST, Level.SHOULD]
    for d in declared:
        asyncio.run(d.run("ctx"))
    assert seen == [(1, "ctx"), (2, "ctx")]  # `label` formats only; `level` sets the spec
    assert module_cases({"spread": spread, "other": 3}) == list(declared)


def test_a_bad_family_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="lacks"):
        @case("dp.rule.x_{n}", Level.MUST, "r", grounds=_grounds(), params=[{"n": 1}])
        async def needs_more(ctx: Any, n: int, m: int) -> None: ...
    with pytest.raises(ValueError, match="one id twice"):
        @case("dp.rule.same", Level.MUST, "r", grounds=_grounds(), params=[{}, {}])
        async def twice(ctx: Any) -> None: ...
    with pytest.raises(ValueError, match="must be <area>"):
        @case("nowhere.rule.x_{n}", Level.MUST, "r", grounds=_grounds(), params=[{"n": 1}])
        async def bad_area(ctx: Any, n: int) -> None: ...
