"""Generate docs/coverage.md: vLLM 0.33.0's own client tests -> the corewire cases covering them.

The map is data (fixtures/coverage/vllm-0.33.0.json, one entry per upstream test, beside
checked-in lists of the upstream test names); the case side is read from the code: every
conformance module is imported and each declared case
(harness.cases.declaration.module_cases) gives the id and level. So a case that is
renamed or removed shows up here (and fails
tests/test_coverage_map.py) instead of leaving a stale claim in the docs.

    .venv/bin/python scripts/gen_coverage.py            # rewrite docs/coverage.md
    .venv/bin/python scripts/gen_coverage.py --check    # exit 1 if docs/coverage.md is stale

Needs no vLLM and no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.results.dimensions import load_cells, render_grids  # noqa: E402
from harness.results.fields import load_fields, render_fields  # noqa: E402

MAP_PATH = ROOT / "fixtures" / "coverage" / "vllm-0.33.0.json"
FIELDS_PATH = ROOT / "fixtures" / "coverage" / "fields-0.33.0.toml"
GRIDS_PATH = ROOT / "fixtures" / "coverage" / "dimensions.toml"
GRIDS_DOC = ROOT / "docs" / "dimensions.md"
DOC_PATH = ROOT / "docs" / "coverage.md"
LEVELS = ("MUST", "SHOULD", "INFO")


class CoverageMapError(Exception):
    """The coverage map file is malformed (what is wrong and where is in the message)."""


@dataclass(frozen=True)
class Wanted:
    """A case the suite should have for an observable upstream test (the lead decides)."""

    case_id: str
    level: str
    requirement: str


@dataclass(frozen=True)
class UpstreamTest:
    """One upstream test and what covers it."""

    file: str
    name: str
    checks: str
    observable: bool
    cases: tuple[str, ...]
    reason: str
    wanted: tuple[Wanted, ...]

    @property
    def status(self) -> str:
        """covered / partly / open / not observable, from the data alone."""
        if not self.observable:
            return "not observable"
        if not self.cases:
            return "open"
        return "partly" if self.wanted else "covered"


@dataclass(frozen=True)
class UpstreamFile:
    """An upstream test file and its checked-in list of test names."""

    key: str
    path: str
    title: str
    names_file: str
    scope: str

    def names(self, base: Path) -> list[str]:
        text = (base / self.names_file).read_text(encoding="utf-8")
        return [line.strip() for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class CoverageMap:
    vllm_version: str
    files: tuple[UpstreamFile, ...]
    tests: tuple[UpstreamTest, ...]
    base: Path  # directory of the map file; names files are relative to it

    def tests_of(self, key: str) -> list[UpstreamTest]:
        return [t for t in self.tests if t.file == key]


def _field(entry: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in entry:
        raise CoverageMapError(f"{where}: missing field {key!r}")
    value = entry[key]
    if not isinstance(value, kind):
        raise CoverageMapError(f"{where}: field {key!r} must be {kind.__name__}, "
                               f"got {type(value).__name__}")
    return value


def _wanted(raw: Any, where: str) -> tuple[Wanted, ...]:
    if not isinstance(raw, list):
        raise CoverageMapError(f"{where}: 'wanted' must be a list")
    out = []
    for i, item in enumerate(raw):
        at = f"{where} wanted[{i}]"
        if not isinstance(item, dict):
            raise CoverageMapError(f"{at}: must be an object")
        level = _field(item, "level", str, at)
        if level not in LEVELS:
            raise CoverageMapError(f"{at}: level {level!r} not in {LEVELS}")
        out.append(Wanted(_field(item, "id", str, at), level,
                          _field(item, "requirement", str, at)))
    return tuple(out)


def load_map(path: Path = MAP_PATH) -> CoverageMap:
    """Parse and shape-check the map (content rules live in tests/test_coverage_map.py)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    files = tuple(UpstreamFile(*(_field(f, key, str, "upstream")
                                 for key in ("key", "path", "title", "names", "scope")))
                  for f in _field(data, "upstream", list, str(path)))
    keys = {f.key for f in files}
    tests = []
    for i, raw in enumerate(_field(data, "tests", list, str(path))):
        where = f"tests[{i}] ({raw.get('name', '?')})"
        file_key = _field(raw, "file", str, where)
        if file_key not in keys:
            raise CoverageMapError(f"{where}: file {file_key!r} is not one of {sorted(keys)}")
        cases = _field(raw, "cases", list, where)
        if not all(isinstance(c, str) for c in cases):
            raise CoverageMapError(f"{where}: 'cases' must be a list of case ids")
        tests.append(UpstreamTest(file_key, _field(raw, "name", str, where),
                                  _field(raw, "checks", str, where),
                                  _field(raw, "observable", bool, where), tuple(cases),
                                  str(raw.get("reason", "")),
                                  _wanted(raw.get("wanted", []), where)))
    return CoverageMap(_field(data, "vllm_version", str, str(path)), files, tuple(tests),
                       path.parent)


def collect_case_levels(root: Path = ROOT) -> dict[str, str]:
    """Every conformance case id -> its level, read from the decorated functions."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from harness.cases.index import case_specs

    return {case_id: spec.level.value for case_id, (spec, _) in case_specs(root).items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _case_list(ids: tuple[str, ...], levels: dict[str, str]) -> str:
    return "<br>".join(f"`{c}` ({levels.get(c, 'MISSING')})" for c in ids)


def _wanted_list(wanted: tuple[Wanted, ...]) -> str:
    return "<br>".join(f"`{w.case_id}` ({w.level}): {_cell(w.requirement)}" for w in wanted)


def _summary(tests: list[UpstreamTest]) -> str:
    total = len(tests)
    covered = sum(1 for t in tests if t.status in ("covered", "partly"))
    partly = sum(1 for t in tests if t.status == "partly")
    hidden = sum(1 for t in tests if t.status == "not observable")
    open_ = sum(1 for t in tests if t.status == "open")
    return (f"**{covered} of {total}** covered by a case ({covered - partly} fully, {partly} "
            f"partly), **{hidden}** not observable on the wire (with the reason), "
            f"**{open_}** open (observable, no case yet).")


def render(cmap: CoverageMap, levels: dict[str, str], field_lines: Sequence[str] = ()) -> str:
    """docs/coverage.md as a string (deterministic: map order, no timestamps); the field
    table (harness.results.fields) goes last."""
    out = [
        f"# Coverage of vLLM {cmap.vllm_version}'s own client tests",
        "",
        "<!-- Generated by scripts/gen_coverage.py from fixtures/coverage/"
        f"vllm-{cmap.vllm_version}.json and the case specs in conformance/. "
        "Do not edit: run `make coverage`. -->",
        "",
        "Every test of vLLM's engine-core client test files, mapped to the corewire cases "
        "that check the same behaviour against any frontend, or the reason it cannot be "
        "checked on the wire. A test is *observable* when a conformance case can drive a "
        "frontend through its client surface against mock engines and see the behaviour on "
        "the wire or in client-visible results; internal state counts when it has such a "
        "consequence (the reason names it). *Partly*: cases cover some of what the test "
        "checks; the rest is listed as wanted. *Wanted* ids are proposals for cases not "
        "written yet (`tests/test_coverage_map.py` does not require them to exist).",
        "",
        "## Summary",
        "",
    ]
    for f in cmap.files:
        out.append(f"- {f.title}: {_summary(cmap.tests_of(f.key))}")
    if field_lines:
        out.append("- Every field of every wire message, with the cases that check its value: "
                   "[Fields](#fields-every-field-of-every-message-x-the-cases-that-check-its-"
                   "value) below.")
    for f in cmap.files:
        tests = cmap.tests_of(f.key)
        out += ["", f"## {f.title}", "",
                f"`{f.path}` in the vLLM {cmap.vllm_version} sdist; {len(tests)} tests "
                f"({f.scope}). {_summary(tests)}", "",
                "| # | upstream test | what it checks | status | corewire cases | "
                "reason / wanted |",
                "|---|---|---|---|---|---|"]
        for n, t in enumerate(tests, 1):
            notes = _cell(t.reason)
            if t.wanted:
                notes = (notes + "<br>" if notes else "") + "wanted: " + _wanted_list(t.wanted)
            out.append(f"| {n} | `{t.name}` | {_cell(t.checks)} | {t.status} | "
                       f"{_case_list(t.cases, levels) or '-'} | {notes or '-'} |")
    wanted: dict[str, Wanted] = {}
    users: dict[str, list[str]] = {}
    for t in cmap.tests:
        for w in t.wanted:
            wanted.setdefault(w.case_id, w)
            users.setdefault(w.case_id, []).append(t.name)
    out += ["", "## Wanted cases", "",
            "Every proposed case once, with the upstream tests that want it. An id that "
            "exists now is marked: move it into those tests' `cases`.", "",
            "| wanted case | level | requirement | for | exists |",
            "|---|---|---|---|---|"]
    for case_id in sorted(wanted):
        w = wanted[case_id]
        exists = "yes" if case_id in levels else "no"
        out.append(f"| `{case_id}` | {w.level} | {_cell(w.requirement)} | "
                   f"{', '.join(f'`{u}`' for u in users[case_id])} | {exists} |")
    return "\n".join([*out, *field_lines]) + "\n"


def render_document(cmap: CoverageMap, levels: dict[str, str]) -> str:
    """docs/coverage.md whole: the upstream-test map and the field table."""
    return render(cmap, levels, render_fields(load_fields(FIELDS_PATH), levels,
                                              str(FIELDS_PATH.relative_to(ROOT))))


def render_grid_document(levels: dict[str, str]) -> str:
    """docs/dimensions.md whole: the per-area dimension grids."""
    return render_grids(load_cells(GRIDS_PATH), levels, str(GRIDS_PATH.relative_to(ROOT)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the output file differs from what would be generated")
    parser.add_argument("--map", type=Path, default=MAP_PATH)
    parser.add_argument("--out", type=Path, default=DOC_PATH)
    args = parser.parse_args(argv)
    cmap = load_map(args.map)
    levels = collect_case_levels()
    text = render_document(cmap, levels)
    missing = sorted({c for t in cmap.tests for c in t.cases} - set(levels))
    if missing:
        print(f"error: the map names cases that do not exist: {', '.join(missing)}",
              file=sys.stderr)
        return 1
    grids = render_grid_document(levels)
    if args.check:
        stale = [str(path) for path, want in ((args.out, text), (GRIDS_DOC, grids))
                 if (path.read_text(encoding="utf-8") if path.exists() else "") != want]
        for path in stale:
            print(f"{path} is stale: run `make coverage`", file=sys.stderr)
        return 1 if stale else 0
    args.out.write_text(text, encoding="utf-8")
    GRIDS_DOC.write_text(grids, encoding="utf-8")
    existing = sorted({w.case_id for t in cmap.tests for w in t.wanted} & set(levels))
    if existing:
        print("note: wanted ids that exist now (move them into 'cases'): "
              + ", ".join(existing), file=sys.stderr)
    print(f"wrote {args.out} and {GRIDS_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
