"""Every wire case stands on vLLM 0.33.0 lines that say what the case claims.

Checked against the vLLM 0.33.0 sdist (downloaded once into the cache, sha256 checked; see
harness.cases.vllm_sources): each citation's snippet must sit within a few lines of the cited
line, every level must be one its basis allows (harness.cases.grounds), and every tolerated
divergence in the baseline cites, in the same checked form, the lines that show it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cases.declaration import CaseSpec, case
from harness.cases.grounds import (
    Basis,
    Cite,
    Grounds,
    GroundsError,
    Impl,
    both,
    defect,
    differ,
    engine,
    only,
    py,
    recommendation,
    rs,
)
from harness.cases.index import grounds_problems, level_problems, wire_specs
from harness.cases.vllm_sources import SourceTree, vllm_0_33_sources
from harness.results.baseline import Baseline
from harness.results.records import Level

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "fixtures" / "baselines" / "vllm-0.33.json"
REAL_FRONTENDS = ("vllm-py", "vllm-rs")
# A checked citation inside prose: path:line `snippet` (harness.cases.grounds.Cite.render).
CITATION = re.compile(r"(?P<path>(?:vllm|rust)/[\w./-]+):(?P<line>\d+) `(?P<snippet>[^`]+)`")
# A real line of the sdist, used to show the checker catches a wrong line number.
KNOWN = py("vllm/v1/engine/coordinator.py:364", "assert outputs.utility_output is None")


@pytest.fixture(scope="module")
def sources() -> SourceTree:
    return vllm_0_33_sources()


def test_every_wire_case_has_grounds() -> None:
    specs = wire_specs()
    assert len(specs) > 400
    missing = sorted(case_id for case_id, (spec, _) in specs.items() if spec.grounds is None)
    assert missing == []


def test_every_citation_says_what_it_claims_and_every_level_is_earned(
        sources: SourceTree) -> None:
    assert grounds_problems(wire_specs(), sources) == []


def test_a_wrong_line_is_caught(sources: SourceTree) -> None:
    assert sources.check(KNOWN) is None
    moved = Cite(KNOWN.impl, KNOWN.path, KNOWN.line + 20, KNOWN.snippet)
    problem = sources.check(moved)
    assert problem is not None and "it is at line 364" in problem
    assert sources.check(Cite(Impl.PYTHON, KNOWN.path, 364, "no such text here")) is not None
    assert "no such file" in (sources.check(Cite(Impl.RUST, "rust/nope.rs", 1, "x")) or "")
    assert "lines" in (sources.check(Cite(Impl.PYTHON, KNOWN.path, 10**6, "x")) or "")


def test_a_wrong_case_citation_fails_the_suite_check(sources: SourceTree) -> None:
    wrong = both(py("vllm/v1/engine/coordinator.py:383", KNOWN.snippet),
                 rs("rust/src/engine-core-client/src/coordinator/inproc.rs:1", "use "))
    spec = CaseSpec("dp.coordinator.cited_wrongly", Level.MUST, "r", wrong.render(),
                    grounds=wrong)
    problems = grounds_problems({spec.case_id: (spec, "x.py")}, sources)
    assert any("coordinator.py:383" in p for p in problems)


@pytest.mark.parametrize(("grounds", "level", "allowed"), [
    (both(KNOWN, rs("r.rs:1", "x")), Level.MUST, True),
    (defect(KNOWN, rs("r.rs:1", "x"), note="python deviates: hangs"), Level.MUST, True),
    (only(KNOWN, engine("vllm/v1/core/sched/scheduler.py:1", "x"), note="rust lacks it"),
     Level.MUST, True),
    (differ(KNOWN, rs("r.rs:1", "x"), note="python a, rust b"), Level.MUST, False),
    (differ(KNOWN, rs("r.rs:1", "x"), note="python a, rust b"), Level.SHOULD, True),
    (recommendation(KNOWN, note="neither bounds it"), Level.MUST, False),
    (recommendation(KNOWN, note="neither bounds it"), Level.INFO, True),
])
def test_the_level_rule(grounds: Grounds, level: Level, allowed: bool) -> None:
    spec = CaseSpec("dp.rule.example", level, "r", grounds.render(), grounds=grounds)
    assert (level_problems(spec) == []) is allowed


def test_grounds_that_cannot_be_right() -> None:
    with pytest.raises(GroundsError, match="Python and a Rust"):
        both(KNOWN)
    with pytest.raises(GroundsError, match="note"):
        Grounds(Basis.DEFECT, (KNOWN,))
    with pytest.raises(GroundsError, match="engine citation"):
        only(KNOWN, note="rust lacks it")
    with pytest.raises(GroundsError, match="path:line"):
        py("core_client.py", "x")
    with pytest.raises(ValueError, match="needs grounds"):
        case("dp.rule.example", Level.MUST, "r")


def test_every_baseline_reason_cites_checked_lines(sources: SourceTree) -> None:
    """A tolerated divergence of a real frontend names the vLLM lines that show it."""
    baseline = Baseline.load(str(BASELINE))
    unproven, wrong = [], []
    for entry in baseline.entries.values():
        cites = [Cite(Impl.PYTHON, m["path"], int(m["line"]), m["snippet"])
                 for m in CITATION.finditer(entry.reason)]
        if entry.frontend in REAL_FRONTENDS and not cites:
            unproven.append(f"{entry.case}[{entry.frontend}]")
        wrong += [f"{entry.case}[{entry.frontend}]: {p}" for c in cites
                  if (p := sources.check(c))]
    assert unproven == [] and wrong == []


def test_every_real_frontend_fail_names_a_defect() -> None:
    """A MUST that a real frontend FAILs stands on `defect` (or `only`) grounds: a rule
    both frontends hold cannot fail on one of them without the grounds being wrong."""
    baseline = Baseline.load(str(BASELINE))
    specs = wire_specs()
    loose = []
    for entry in baseline.entries.values():
        spec = specs[entry.case][0] if entry.case in specs else None
        if (spec is not None and spec.grounds is not None and entry.verdict == "FAIL"
                and entry.frontend in REAL_FRONTENDS
                and spec.grounds.basis not in (Basis.DEFECT, Basis.ONLY)):
            loose.append(f"{entry.case}[{entry.frontend}]: {spec.grounds.basis.value}")
    assert loose == []
