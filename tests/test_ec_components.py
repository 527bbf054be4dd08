"""The EC-deferral component suite judged against known-good and known-broken schedulers.

Why: a conformance case is only worth its verdict if the reference scheduler passes it and
some broken scheduler fails it. Every case runs through `run_case` (as the plugin runs it,
with a driver that is never started: component cases use no frontend) against the reference
model, which must PASS everything, and against each mutant of
`harness.components.ec_mutants`, each of which must be caught (FAIL) by at least its
designated case; every case must catch at least one mutant. Where vLLM 0.33.0 is installed,
the suite also runs against vLLM's own Scheduler (the `vllm` adapter), which must PASS.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

import conformance.components.test_ec_deferral as suite
from harness.components.ec_mutants import MUTANTS
from harness.results.records import Verdict
from tests.component_selftest import ComponentSuite, Matrix, problems

# The case written to catch each mutant (more may catch it too).
DESIGNED_FOR = {
    "allocates_before_checking": "staging_request_not_allocated_item_at_start",
    "prefills_up_to_staging_item": "staging_request_not_allocated_item_mid_prompt",
    "blocks_queue_behind_staging": "requests_behind_scheduled_one_staging",
    "drops_deferred_request": "scheduled_once_available",
    "never_retries": "scheduled_once_available",
    "requeues_at_tail": "deferred_keeps_queue_position",
    "requeues_reversed": "deferred_keeps_queue_position",
    "checks_computed_items": "only_items_beyond_computed_checked",
    "gates_only_admission": "running_request_gated",
    "gates_text_only": "text_only_never_gated",
}
SUITE = ComponentSuite(suite, "ec", DESIGNED_FOR)
CASES = SUITE.cases


@pytest.fixture(scope="module")
def matrix() -> Iterator[Matrix]:
    """Every case against the reference and every mutant (computed once)."""
    yield SUITE.matrix(MUTANTS)


def test_suite_shape() -> None:
    assert len(CASES) >= 8
    for spec, _fn in CASES:
        assert spec.area == "components" and spec.case_id.startswith("components.ec_deferral.")
        assert spec.source.startswith("PR #41627")
    assert set(DESIGNED_FOR) == set(MUTANTS)
    assert {f"components.ec_deferral.{c}" for c in DESIGNED_FOR.values()} <= \
        {spec.case_id for spec, _ in CASES}


def test_reference_passes_every_case(matrix: Matrix) -> None:
    results = matrix["reference"]
    assert all(r.verdict is Verdict.PASS for r in results.values()), problems(results)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str, matrix: Matrix) -> None:
    SUITE.check_mutant_caught(mutant, matrix)


def test_print_catch_matrix(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """Which case catches which mutant; every case catches one."""
    text, idle = SUITE.catch_matrix("EC scheduler catch matrix", matrix)
    with capsys.disabled():
        print(text)
    assert not idle, f"cases that no mutant fails: {idle}"


# ---------------------------------------------------------------------------------------------
# vLLM 0.33.0's own Scheduler (the vllm lane; skipped where vLLM is not installed).

@pytest.fixture(scope="module")
def vllm_scheduler() -> None:
    try:
        from harness.components.vllm_ec import preload

        preload()
    except Exception as exc:  # present but not importable (e.g. no torch)
        pytest.skip(f"vLLM's Scheduler cannot be built here: {exc!r}")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_scheduler_passes_the_suite(vllm_scheduler: None) -> None:
    results = SUITE.run("vllm")
    assert all(r.verdict is Verdict.PASS for r in results.values()), problems(results)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_scheduler_without_the_gate_is_caught(vllm_scheduler: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter has teeth: vLLM's Scheduler with `_ec_transfer_pending` always False (the
    admission gate removed) fails the not-allocated case."""
    from harness.components import vllm_ec

    scheduler_cls = vllm_ec._vllm().scheduler.Scheduler
    monkeypatch.setattr(scheduler_cls, "_ec_transfer_pending", lambda *_a, **_k: False)
    wanted = "components.ec_deferral.staging_request_not_allocated_item_at_start"
    result = SUITE.run("vllm", SUITE.only(wanted))[wanted]
    assert result.verdict is Verdict.FAIL, (result.verdict, result.message)
