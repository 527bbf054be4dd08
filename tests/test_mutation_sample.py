"""A fixed sample of mutmut's mutants of the reference core must stay killed.

The full mutmut run is `make mutation` (docs/mutation.md); `make test` keeps only the
recorded sample in fixtures/mutation/sample.json: each one-line patch applied to a copy
of the `harness` package, its recorded killer case run against the reference frontend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.mutation.sample import (
    CORE_PATH,
    REGENERATE_HINT,
    SampleError,
    SampleMutant,
    apply,
    load_sample,
    run_sample,
)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def sample() -> list[SampleMutant]:
    return load_sample(ROOT)


def test_sample_size(sample: list[SampleMutant]) -> None:
    assert 10 <= len(sample) <= 20, f"{len(sample)} sample mutants; {REGENERATE_HINT}"
    assert len({s.function for s in sample}) == len(sample), "one mutant per function"


def test_every_sample_mutant_applies_as_one_line(sample: list[SampleMutant]) -> None:
    source = (ROOT / CORE_PATH).read_text()
    for mutant in sample:
        patched = apply(source, mutant)  # raises SampleError naming the mutant
        changed = [(a, b) for a, b in zip(source.splitlines(), patched.splitlines(),
                                          strict=True) if a != b]
        assert [(a.strip(), b.strip()) for a, b in changed] == [(mutant.old, mutant.new)]


def test_apply_refuses_a_line_that_moved() -> None:
    source = "class C:\n    def f(self) -> int:\n        return 1\n"
    moved = SampleMutant("x", "C.f", "return 2", "return 3", [])
    with pytest.raises(SampleError, match="C.f has 0 lines"):
        apply(source, moved)
    assert apply(source, SampleMutant("x", "C.f", "return 1", "return 0", [])).endswith(
        "        return 0\n")


def test_every_sample_mutant_is_killed(sample: list[SampleMutant]) -> None:
    verdicts = run_sample(ROOT, sample)
    survivors = [v.detail for v in verdicts.values() if not v.killed]
    assert survivors == [], "sample mutants the suite no longer kills:\n" + "\n".join(
        survivors)
