"""The dimension grids: per area, every dimension a port author gets wrong x its values ->
the cases that exercise the area's rules there, or why none does.

The data is fixtures/coverage/dimensions.toml (one `[[cell]]` per area x dimension x value,
written by reading the cases); which dimensions and values exist is `DIMENSIONS` below, so a
grid cannot quietly lose a row. `grid_problems` is what tests/test_coverage_map.py asserts;
`render_grids` writes docs/dimensions.md (scripts/gen_coverage.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

AREAS = ("handshake", "dp", "abort", "failure", "streaming", "utility")
# Every dimension and its values; an area where a dimension does not apply has one "n/a"
# cell with the reason instead of a cell per value.
DIMENSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine count", ("1", "2", "3", "4")),
    ("uneven split", ("2:1", "3:1", "1:1:2", "tie")),
    ("multiplicity", ("once", "repeated within one call", "repeated across calls")),
    ("id relation", ("distinct", "equal (duplicate live id)", "prefix / suffix of another id",
                     "renamed by the frontend (engine-side id differs)",
                     "reused after finish")),
    ("timing", ("settled", "zero delay (right after generate returns)",
                "before the ADD could be sent", "reply racing a timeout",
                "late reply while another call is pending")),
    ("phase", ("before first output", "mid-stream", "after final output",
               "after engine death")),
    ("parameters", ("same for every request", "differ between requests",
                    "differ between session segments", "invalid (refused before any send)")),
    ("finish kind", ("stop-eos", "stop-token", "stop-string", "length", "abort (engine)",
                     "error", "repetition")),
)
NOT_APPLICABLE = "n/a"


class GridError(Exception):
    """The grid file is malformed (what is wrong and where is in the message)."""


@dataclass(frozen=True)
class Cell:
    """One area x dimension x value and what covers it."""

    area: str
    dimension: str
    value: str
    cases: tuple[str, ...]
    reason: str
    wanted: str  # "case.id: what it would check", or ""

    @property
    def wanted_id(self) -> str:
        return self.wanted.split(":", 1)[0].strip()


def load_cells(path: Path) -> list[Cell]:
    """The cells of a grid file, in file order (tomllib: Python 3.11+, docs tooling only)."""
    import tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GridError(f"{path}: {exc}") from exc
    cells = []
    for n, entry in enumerate(raw.get("cell", []), 1):
        keys = ("area", "dimension", "value")
        if not all(isinstance(entry.get(k), str) for k in keys) or \
                not isinstance(entry.get("cases", []), list):
            raise GridError(f"{path.name} cell #{n}: needs area, dimension and value "
                            "strings and a cases list")
        cells.append(Cell(entry["area"], entry["dimension"], entry["value"],
                          tuple(entry.get("cases", [])), str(entry.get("reason", "")),
                          str(entry.get("wanted", ""))))
    return cells


def grid_problems(cells: Sequence[Cell], levels: Mapping[str, str]) -> list[str]:
    """What is wrong with the grids (empty: nothing): every area x dimension is either one
    n/a cell with a reason or a cell per value, each value once; every case real; an
    empty cell explained; a wanted case that exists now moved into the cell."""
    problems = []
    values = dict(DIMENSIONS)
    for area in AREAS:
        for dimension, wanted_values in DIMENSIONS:
            got = [c.value for c in cells if c.area == area and c.dimension == dimension]
            if got == [NOT_APPLICABLE]:
                continue
            for value in wanted_values:
                if got.count(value) != 1:
                    problems.append(f"{area} x {dimension} = {value}: {got.count(value)} "
                                    "cells (want exactly 1, or one n/a cell)")
    for c in cells:
        where = f"{c.area} x {c.dimension} = {c.value}"
        if c.area not in AREAS or c.dimension not in values or (
                c.value != NOT_APPLICABLE and c.value not in values[c.dimension]):
            problems.append(f"{where}: not a cell of the grids")
        problems += [f"{where}: no case {case}" for case in c.cases if case not in levels]
        if not c.cases and not c.reason.strip():
            problems.append(f"{where}: no case and no reason why")
        if c.wanted and c.wanted_id in levels:
            problems.append(f"{where}: the wanted case {c.wanted_id} exists now: move it "
                            "into cases")
    return problems


def _cell_text(cell: Cell, levels: Mapping[str, str]) -> str:
    cases = ", ".join(f"`{c}` ({levels.get(c, 'MISSING')})" for c in cell.cases)
    notes = cell.reason.replace("|", "\\|").replace("\n", " ").strip()
    if cell.wanted:
        notes = (notes + " " if notes else "") + "**wanted**: " + cell.wanted.replace(
            "|", "\\|")
    return " — ".join(part for part in (cases, notes) if part) or "-"


def render_grids(cells: Sequence[Cell], levels: Mapping[str, str], source: str) -> str:
    """docs/dimensions.md as a string (deterministic)."""
    covered = sum(1 for c in cells if c.cases)
    explained = sum(1 for c in cells if not c.cases)
    wanted = sum(1 for c in cells if c.wanted)
    out = ["# Dimension grids: where each area's rules are exercised", "",
           f"<!-- Generated by scripts/gen_coverage.py from {source} and the case specs. "
           "Do not edit: run `make coverage`. -->", "",
           "For each area, the dimensions a port author gets wrong (engine counts and "
           "uneven splits, repeats inside one call and across calls, id relations, zero-delay "
           "timing, phases, parameter changes, finish kinds) and each value: the cases that "
           "exercise the area's rules there, or why no case does (`n/a`: the dimension does "
           "not apply to the area). tests/test_coverage_map.py checks every cell is present, "
           "every case real and every empty cell explained.", "",
           f"**{len(cells)} cells: {covered} with cases, {explained} without (each with the "
           f"reason), {wanted} naming a case still wanted.**"]
    for area in AREAS:
        out += ["", f"## {area}", "", "| dimension | value | cases / why none |",
                "|---|---|---|"]
        for dimension, _values in DIMENSIONS:
            for cell in (c for c in cells if c.area == area and c.dimension == dimension):
                out.append(f"| {dimension} | {cell.value} | {_cell_text(cell, levels)} |")
    return "\n".join(out) + "\n"
