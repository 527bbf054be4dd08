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

import importlib.util
import queue
from collections.abc import Iterator

import pytest

import conformance.components.test_kv_failure_queues as suite
from harness.components import FakeTransport, RecvHooks
from harness.components.kv_mutants import MUTANTS
from harness.results.records import Verdict
from tests.component_selftest import ComponentSuite, Matrix, problems
from tests.timescale import TIMESCALE

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
SUITE = ComponentSuite(suite, "kv", DESIGNED_FOR)
CASES = SUITE.cases


@pytest.fixture(scope="module")
def matrix() -> Iterator[Matrix]:
    """Every case against the reference and every mutant (computed once)."""
    yield SUITE.matrix(MUTANTS)


def test_suite_shape() -> None:
    assert len(CASES) >= 8
    for spec, _fn in CASES:
        assert spec.area == "components" and spec.case_id.startswith("components.kv_failure.")
        assert spec.source.startswith("PR #40364")
    assert set(DESIGNED_FOR) == set(MUTANTS)
    assert {f"components.kv_failure.{c}" for c in DESIGNED_FOR.values()} <= \
        {spec.case_id for spec, _ in CASES}


def test_reference_passes_every_case(matrix: Matrix) -> None:
    results = matrix["reference"]
    assert all(r.verdict is Verdict.PASS for r in results.values()), problems(results)


def test_concurrent_case_runtime_is_bounded(matrix: Matrix) -> None:
    result = matrix["reference"]["components.kv_failure.concurrent_failure_mix"]
    # Bounded (the random mixes stop after 1.5 s), not fast: generous for loaded CI machines.
    assert result.duration < TIMESCALE.scaled(10.0), result.evidence.notes


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str, matrix: Matrix) -> None:
    SUITE.check_mutant_caught(mutant, matrix)


def test_print_catch_matrix(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """Which case catches which mutant; every case catches one."""
    text, idle = SUITE.catch_matrix("KV worker catch matrix", matrix)
    with capsys.disabled():
        print(text)
    assert not idle, f"cases that no mutant fails: {idle}"


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
    results = SUITE.run("vllm-nixl")
    assert all(r.verdict is Verdict.PASS for r in results.values()), problems(results)


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
    wanted = "components.kv_failure.handshake_failure_reported_once"
    result = SUITE.run("vllm-nixl", SUITE.only(wanted))[wanted]
    assert result.verdict is Verdict.FAIL, (result.verdict, result.message)
