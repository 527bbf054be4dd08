"""The KV-worker component suite judged against known-good and known-broken workers.

Why: a conformance case is only worth its verdict if the reference worker passes it and some
broken worker fails it. Every case runs through `run_case` (as the plugin runs it, with a
driver that is never started: component cases use no frontend) against the reference
worker, which must PASS everything, and against each mutant of
`harness.components.kv_mutants`, each of which must be caught (FAIL or TIMEOUT) by at least
its designated case. The catch matrix is printed. Where vLLM 0.33.0 is installed, the suite
also runs against vLLM's own NIXL worker (the `vllm-nixl` adapter).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import queue
from collections.abc import Iterator, Sequence

import pytest

import conformance.components.test_kv_failure_queues as suite
from harness.case_context import run_case
from harness.components import ENV_KV_WORKER, FakeTransport, RecvHooks
from harness.components.kv_mutants import MUTANTS
from harness.frontends.no_frontend import NoFrontend
from harness.timing import timescale
from harness.verdicts import CaseFn, CaseResult, CaseSpec, Verdict

CASES: list[tuple[CaseSpec, CaseFn]] = sorted(
    ((fn.__corewire_case__, fn) for fn in vars(suite).values()
     if hasattr(fn, "__corewire_case__")),
    key=lambda item: item[0].case_id)

# The case written to catch each mutant (more may catch it too).
DESIGNED_FOR = {
    "post_processes_failures": "failed_requests_skip_post_processing",
    "err_counts_as_done": "failed_requests_skip_post_processing",
    "reports_failures_twice": "transfer_failed_reported_once",
    "loses_handshake_failures": "handshake_failure_reported_once",
    "late_invalid_blocks": "invalid_blocks_by_report_pass",
    "reports_with_outstanding_handles": "not_reported_while_handle_outstanding",
    "drops_unreleasable_handles": "release_failure_retains_handle",
    "skips_neighbours": "successful_neighbours_post_processed",
}
CAUGHT = (Verdict.FAIL, Verdict.TIMEOUT)


def run_suite(worker: str, cases: Sequence[tuple[CaseSpec, CaseFn]] = CASES
              ) -> dict[str, CaseResult]:
    """{case id: result} of running `cases` against the worker named `worker`."""
    previous = os.environ.get(ENV_KV_WORKER)
    os.environ[ENV_KV_WORKER] = worker
    try:
        return {spec.case_id: asyncio.run(run_case(spec, fn, NoFrontend("none")))
                for spec, fn in cases}
    finally:
        if previous is None:
            os.environ.pop(ENV_KV_WORKER, None)
        else:
            os.environ[ENV_KV_WORKER] = previous


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
        assert spec.area == "components" and spec.case_id.startswith("components.kv_failure.")
        assert spec.source.startswith("PR #40364")
    assert set(DESIGNED_FOR) == set(MUTANTS)
    assert {f"components.kv_failure.{c}" for c in DESIGNED_FOR.values()} <= \
        {spec.case_id for spec, _ in CASES}


def test_reference_passes_every_case(matrix: dict[str, dict[str, CaseResult]]) -> None:
    results = matrix["reference"]
    assert all(r.verdict is Verdict.PASS for r in results.values()), _problems(results)


def test_concurrent_case_runtime_is_bounded(matrix: dict[str, dict[str, CaseResult]]) -> None:
    result = matrix["reference"]["components.kv_failure.concurrent_failure_mix"]
    # Bounded (the random mixes stop after 1.5 s), not fast: generous for loaded CI machines.
    assert result.duration < 10.0 * timescale(), result.evidence.notes


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
    """Which case catches which mutant (x: FAIL, T: TIMEOUT, .: PASS)."""
    mark = {Verdict.FAIL: "x", Verdict.TIMEOUT: "T", Verdict.PASS: "."}
    names = list(matrix)
    width = max(len(_short(spec.case_id)) for spec, _ in CASES)
    lines = ["", "KV worker catch matrix (columns: " +
             ", ".join(f"{i}={n}" for i, n in enumerate(names)) + ")",
             " " * width + "  " + " ".join(str(i) for i in range(len(names)))]
    for spec, _ in CASES:
        cells = [mark.get(matrix[n][spec.case_id].verdict, "?") for n in names]
        lines.append(f"{_short(spec.case_id):<{width}}  " + " ".join(cells))
    with capsys.disabled():
        print("\n".join(lines))
    assert all(any(matrix[n][spec.case_id].verdict in CAUGHT for n in MUTANTS)
               for spec, _ in CASES), "a case that no mutant fails"


# ---------------------------------------------------------------------------------------------
# vLLM 0.33.0's own NIXL worker (the vllm lane; skipped where vLLM is not installed).

@pytest.fixture(scope="module")
def vllm_nixl() -> None:
    try:
        from harness.components.vllm_nixl import preload

        preload()
    except Exception as exc:  # present but not importable (e.g. no torch)
        pytest.skip(f"vLLM's NIXL worker cannot be built here: {exc!r}")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_nixl_worker_passes_the_suite(vllm_nixl: None) -> None:
    results = run_suite("vllm-nixl")
    assert all(r.verdict is Verdict.PASS for r in results.values()), _problems(results)


class _DiscardingQueue(queue.Queue[str]):
    def put(self, item: str, block: bool = True, timeout: float | None = None) -> None:
        return None


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_nixl_with_lost_handoff_is_caught(vllm_nixl: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter has teeth: vLLM's worker with its handshake-failure queue discarding puts
    (the hand-off lost) fails the handshake case."""
    from harness.components import vllm_nixl as adapter

    real = adapter.VllmNixlWorker.__init__

    def lossy(self: adapter.VllmNixlWorker, transport: FakeTransport, hooks: RecvHooks) -> None:
        real(self, transport, hooks)
        self._worker._failed_recv_reqs = _DiscardingQueue()

    monkeypatch.setattr(adapter.VllmNixlWorker, "__init__", lossy)
    case = [(s, f) for s, f in CASES
            if s.case_id == "components.kv_failure.handshake_failure_reported_once"]
    result = run_suite("vllm-nixl", case)["components.kv_failure.handshake_failure_reported_once"]
    assert result.verdict is Verdict.FAIL, (result.verdict, result.message)
