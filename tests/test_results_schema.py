"""The results schema, the one crossing of a result from a case to the reports, the run
state held by its pytest config, and the time scale handed down as a value."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from harness.results.compliance import render_compliance
from harness.results.html import render_html
from harness.results.records import CaseResult, Evidence, Verdict
from harness.results.schema import (
    ResultsFileError,
    decode_result,
    document_json,
    encode_result,
    parse_document,
    read_results,
)
from harness.run.state import run_state_of

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
# Results files written by corewire runs (several generations of meta), checked in.
FIXTURES = sorted([*ROOT.glob("tests/data/results/*.json"),
                   *ROOT.glob("fixtures/**/results*.json")])


def test_fixtures_exist() -> None:
    assert len(FIXTURES) >= 5, FIXTURES


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_results_file_round_trips_byte_for_byte(path: Path) -> None:
    """Decoding a results.json into the schema and writing it back gives the same bytes:
    the schema holds every key each generation of the file has (and no more)."""
    text = path.read_text()
    doc = parse_document(text, str(path))
    assert document_json(doc) == text
    rows = json.loads(text)["results"]
    assert [(r.case_id, r.frontend, r.verdict.value) for r in read_results(str(path))] == \
        [(r["id"], r["frontend"], r["verdict"]) for r in rows]
    for result in doc.results:  # the case -> report hop loses nothing either
        assert decode_result(encode_result(result)) == result
    if doc.meta.generated:  # the renderers read the typed document
        assert "corewire conformance report" in render_html(doc)
        assert render_compliance(doc, None).startswith("# Compliance matrix")


def test_a_result_crosses_as_one_encode_and_one_decode() -> None:
    result = CaseResult("abort.x.y", "reference", "MUST", "src:1", "req", Verdict.FAIL,
                        "observed ünïcode", 1.234567,
                        evidence=Evidence("e", "o", ["n"], "/tmp/t.json",
                                          [{"t": 0.5, "decoded": {"k": [1, 2]}}]))
    assert result.duration == 1.2346  # rounded once, as results.json always held it
    data = encode_result(result)
    assert isinstance(data, bytes)
    assert json.loads(data)["id"] == "abort.x.y"
    assert json.loads(data)["evidence"]["transcript_excerpt"] == [{"t": 0.5,
                                                                   "decoded": {"k": [1, 2]}}]
    assert decode_result(data) == result


@pytest.mark.parametrize(("text", "says"), [
    ("not json", "malformed"),
    ("[]", "Expected `object`"),
    ('{"results": []}', "missing required field `meta`"),
    ('{"meta": {}, "results": [{"id": 1}]}', "$.results[0].id"),
    ('{"meta": {"shard": "x"}, "results": []}', "$.meta.shard"),
    ('{"meta": {}, "results": [{"id": "a", "frontend": "f", "level": "MUST", "source": "s", '
     '"requirement": "r", "verdict": "MAYBE"}]}', "$.results[0].verdict"),
])
def test_a_malformed_document_is_one_typed_error(text: str, says: str) -> None:
    with pytest.raises(ResultsFileError) as info:
        parse_document(text, "bad.json")
    assert says in str(info.value) and str(info.value).startswith("bad.json")


def test_a_renderer_names_a_missing_label() -> None:
    doc = parse_document('{"meta": {}, "results": []}')
    with pytest.raises(ResultsFileError, match="meta.protocol_profile is missing"):
        render_html(doc)


# ------------------------------------------------------------------ sessions in one process

CASES = textwrap.dedent("""
    from harness.results.records import Level
    from harness.cases.declaration import case

    @case("abort.schema_probe.first", Level.INFO, "records the factors", source="test")
    async def first(ctx):
        ctx.note(f"t={ctx.t(1.0)} driver={ctx.driver.timescale.factor}")

    @case("abort.schema_probe.second", Level.INFO, "records the factors", source="test")
    async def second(ctx):
        ctx.note(f"t={ctx.t(1.0)} driver={ctx.driver.timescale.factor}")

    @case("abort.schema_probe.program", Level.MUST, "starts a driver program", source="test")
    async def program(ctx):
        await ctx.start(1, startup_timeout=2.0)
""")

# A driver program that records what it was started with, then exits (the case is ERROR).
PROGRAM = textwrap.dedent("""
    import json, os, sys
    init = json.loads(sys.stdin.readline())
    with open(sys.argv[1], "w") as fh:
        json.dump({"env": os.environ.get("COREWIRE_TIMESCALE"),
                   "init": init.get("timescale")}, fh)
""")


class _Configs:
    """Remembers each in-process session's config."""

    def __init__(self) -> None:
        self.seen: list[pytest.Config] = []

    def pytest_configure(self, config: pytest.Config) -> None:
        self.seen.append(config)


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.Config, dict[str, object]]:
    configs = _Configs()
    reports = pytester.path / f"reports-{len(list(pytester.path.glob('reports-*')))}"
    # The path is named: `pytest --report-dir X` with none would run corewire's own cases.
    pytester.inline_run(str(pytester.path), "-p", "no:cacheprovider", "--report-dir",
                        str(reports), *args, plugins=[configs])
    doc = json.loads((reports / "results.json").read_text())
    return configs.seen[-1], doc


def _environ() -> dict[str, str]:
    """os.environ, less the variable pytest itself sets and pops around each test."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def _messages(doc: dict[str, object]) -> dict[str, str]:
    rows = doc["results"]
    assert isinstance(rows, list)
    return {row["id"]: row["message"] for row in rows}


def test_a_second_session_does_not_inherit_the_first_ones_results(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Results live on each session's config: a second in-process session (pytester) does
    not see, clear or extend the first one's (they were module globals)."""
    monkeypatch.setenv("COREWIRE_TIMESCALE", "1.5")
    pytester.makepyfile(test_abort_schema_probe=CASES)
    first, doc_a = _run(pytester, "-k", "schema_probe.first")
    second, doc_b = _run(pytester, "-k", "schema_probe.second")
    assert [r.case_id for r in run_state_of(first).results] == ["abort.schema_probe.first"]
    assert [r.case_id for r in run_state_of(second).results] == ["abort.schema_probe.second"]
    assert run_state_of(first) is not run_state_of(second)
    # $COREWIRE_TIMESCALE (no --timescale) reaches the case and its driver.
    assert _messages(doc_a) == {"abort.schema_probe.first": "t=1.5 driver=1.5"}
    assert _messages(doc_b) == {"abort.schema_probe.second": "t=1.5 driver=1.5"}


def test_the_timescale_reaches_cases_and_drivers_and_leaves_os_environ_alone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--timescale wins over $COREWIRE_TIMESCALE, reaches ctx.t(), the in-process driver,
    and a driver program's environment and init, and os.environ is never written."""
    monkeypatch.setenv("COREWIRE_TIMESCALE", "1.5")
    pytester.makepyfile(test_abort_schema_probe=CASES)
    program = pytester.path / "program.py"
    program.write_text(PROGRAM)
    seen = pytester.path / "seen.json"
    before = _environ()
    _config, doc = _run(pytester, "-k", "schema_probe.first", "--timescale", "2.5")
    assert _messages(doc) == {"abort.schema_probe.first": "t=2.5 driver=2.5"}
    assert _environ() == before
    spec = f"subprocess:{sys.executable} {program} {seen}"
    _config, doc = _run(pytester, "-k", "schema_probe.program", "--timescale", "2.5",
                        "--frontend", spec)
    assert _environ() == before
    assert json.loads(seen.read_text()) == {"env": "2.5", "init": 2.5}
    rows = doc["results"]
    assert isinstance(rows, list) and rows[0]["verdict"] == "ERROR"  # the program exited
