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

import asyncio
import importlib.util
import os
from collections.abc import Iterator, Sequence

import pytest

import conformance.components.test_ec_deferral as suite
from harness.case_context import run_case
from harness.components import ENV_EC_SCHEDULER
from harness.components.ec_mutants import MUTANTS
from harness.frontends.no_frontend import NoFrontend
from harness.verdicts import CaseFn, CaseResult, CaseSpec, Verdict

CASES: list[tuple[CaseSpec, CaseFn]] = sorted(
    ((fn.__corewire_case__, fn) for fn in vars(suite).values()
     if hasattr(fn, "__corewire_case__")),
    key=lambda item: item[0].case_id)

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
CAUGHT = (Verdict.FAIL, Verdict.TIMEOUT)


def run_suite(scheduler: str, cases: Sequence[tuple[CaseSpec, CaseFn]] = CASES
              ) -> dict[str, CaseResult]:
    """{case id: result} of running `cases` against the scheduler named `scheduler`."""
    previous = os.environ.get(ENV_EC_SCHEDULER)
    os.environ[ENV_EC_SCHEDULER] = scheduler
    try:
        return {spec.case_id: asyncio.run(run_case(spec, fn, NoFrontend("none")))
                for spec, fn in cases}
    finally:
        if previous is None:
            os.environ.pop(ENV_EC_SCHEDULER, None)
        else:
            os.environ[ENV_EC_SCHEDULER] = previous


def _short(case_id: str) -> str:
    return case_id.rsplit(".", 1)[1]


def _problems(results: dict[str, CaseResult]) -> str:
    return "\n".join(f"{r.verdict.value} {r.case_id}: {r.message} {r.evidence.notes[-3:]}"
                     for r in results.values() if r.verdict is not Verdict.PASS)


@pytest.fixture(scope="module")
def matrix() -> Iterator[dict[str, dict[str, CaseResult]]]:
    """Every case against the reference and every mutant (computed once)."""
    yield {name: run_suite(name if name == "reference" else f"mutant:{name}")
           for name in ["reference", *MUTANTS]}


def test_suite_shape() -> None:
    assert len(CASES) >= 8
    for spec, _fn in CASES:
        assert spec.area == "components" and spec.case_id.startswith("components.ec_deferral.")
        assert spec.source.startswith("PR #41627")
    assert set(DESIGNED_FOR) == set(MUTANTS)
    assert {f"components.ec_deferral.{c}" for c in DESIGNED_FOR.values()} <= \
        {spec.case_id for spec, _ in CASES}


def test_reference_passes_every_case(matrix: dict[str, dict[str, CaseResult]]) -> None:
    results = matrix["reference"]
    assert all(r.verdict is Verdict.PASS for r in results.values()), _problems(results)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str, matrix: dict[str, dict[str, CaseResult]]) -> None:
    results = matrix[mutant]
    errors = [r for r in results.values() if r.verdict is Verdict.ERROR]
    assert not errors, f"harness errors, not verdicts:\n{_problems(results)}"
    caught = {_short(cid) for cid, r in results.items() if r.verdict in CAUGHT}
    assert caught, f"mutant {mutant} passes every case"
    assert DESIGNED_FOR[mutant] in caught, f"{mutant} not caught by {DESIGNED_FOR[mutant]}; " \
                                           f"caught by {sorted(caught)}"


def test_print_catch_matrix(matrix: dict[str, dict[str, CaseResult]],
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Which case catches which mutant (x: FAIL, T: TIMEOUT, .: PASS); every case catches one."""
    mark = {Verdict.FAIL: "x", Verdict.TIMEOUT: "T", Verdict.PASS: "."}
    names = list(matrix)
    width = max(len(_short(spec.case_id)) for spec, _ in CASES)
    lines = ["", "EC scheduler catch matrix (columns: " +
             ", ".join(f"{i}={n}" for i, n in enumerate(names)) + ")",
             " " * width + "  " + " ".join(str(i) for i in range(len(names)))]
    for spec, _ in CASES:
        cells = [mark.get(matrix[n][spec.case_id].verdict, "?") for n in names]
        lines.append(f"{_short(spec.case_id):<{width}}  " + " ".join(cells))
    with capsys.disabled():
        print("\n".join(lines))
    idle = [spec.case_id for spec, _ in CASES
            if not any(matrix[n][spec.case_id].verdict in CAUGHT for n in MUTANTS)]
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
    results = run_suite("vllm")
    assert all(r.verdict is Verdict.PASS for r in results.values()), _problems(results)


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
    result = run_suite("vllm", [(s, f) for s, f in CASES if s.case_id == wanted])[wanted]
    assert result.verdict is Verdict.FAIL, (result.verdict, result.message)
