"""The history mutants (`history=True` in conformance/<area>/mutants.py, docs/mutation-history.md).

Each one is a bug class from vLLM's own history; they are runnable as `mutant:NAME` but kept
out of the kill matrix until a case catches them. Checked here without sockets, on real
frames: every mutant's broken branch is reachable through the calls a client makes and
does what its docstring says (and calls the `fired` hook, which the BEFORE measurement
counts), against the reference doing the right thing; plus their registration, their
citations and the BEFORE record (fixtures/history-mutants.json).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance.abort.mutants import AbortBeforeTrackedLost, AbortByExternalId, IdFreedBeforeAbort
from conformance.dp.mutants import (
    FirstEngineUntilStats,
    FixedTieBreak,
    RankCheckedAgainstCount,
    StaleStartWaveRewinds,
)
from conformance.failure.mutants import ConnectionLossNotDeath
from conformance.streaming.mutants import (
    EmptyPromptSent,
    KvParamsNotForwarded,
    MinTokensOverMaxSent,
    PromptOverContextSent,
    PromptTextLeaked,
    SessionAbortIsBoundary,
    StopAtTokenEndOnly,
    StopFirstListed,
    StopNoHoldback,
    StopWithinMinTokens,
)
from conformance.utility.mutants import (
    CallsPendingAfterReceiverStop,
    LateReplyAfterCancelFatal,
    UtilityEngineZeroAnswer,
)
from harness.frontends.api import FrontendError, Sampling
from harness.frontends.reference.coordinator import CoordinatorCore, Publish, Signal
from harness.frontends.reference.core import (
    DuplicateRequestId,
    EngineDeadError,
    InconsistentResults,
    InvalidRequest,
    ReferenceFrontendCore,
)
from harness.frontends.reference.frontend import ReferenceFrontend
from harness.frontends.run_config import RunConfig
from harness.frontends.table import check_spec, make_driver
from harness.mutation import registry
from harness.mutation.killmatrix import KillMatrix
from harness.mutation.registry import history_mutants, mutants, runnable_mutants
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.vocab import detokenize
from harness.protocol.wire import DEFAULT_CODEC, AbortRequests, AddRequest
from harness.protocol.wire import messages as m
from mock_engines.engine import MockEngineCore
from mock_engines.script import EngineScript, default_ready

MUTANTS = mutants()
HISTORY_MUTANTS = history_mutants()
RUNNABLE_MUTANTS = runnable_mutants()

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "fixtures" / "history-mutants.json"
F = m.FinishReason


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names the history mutants report firing with, in order."""
    seen: list[str] = []
    monkeypatch.setattr(registry, "fired", seen.append)
    yield seen


def _ready(cls: type[ReferenceFrontendCore] = ReferenceFrontendCore,
           ranks: Sequence[int] = (0, 1)) -> ReferenceFrontendCore:
    core = cls(list(ranks), codec=DEFAULT_CODEC)
    for rank in ranks:
        engine = MockEngineCore(rank, EngineScript(ready=default_ready(rank, len(ranks))),
                                dp_size=len(ranks), codec=DEFAULT_CODEC)
        core.on_ready(engine_identity(rank), engine.ready_payload())
    return core


def _output(core: ReferenceFrontendCore, rid: str, tokens: list[int],
            finish: m.FinishReason | None = None) -> None:
    state = core.request(rid)
    assert state is not None
    core.on_output(DEFAULT_CODEC.encode_outputs(m.EngineCoreOutputs(
        state.rank, [m.EngineCoreOutput(rid, tokens, finish_reason=finish)])))


def _aborts(sends: list[tuple[bytes, list[bytes]]]) -> list[tuple[bytes, list[str]]]:
    out = []
    for identity, frames in sends:
        message = DEFAULT_CODEC.decode_engine_input(frames)
        assert isinstance(message, AbortRequests)
        out.append((identity, list(message.request_ids)))
    return out


def _add_of(frames: list[bytes]) -> m.EngineCoreRequest:
    message = DEFAULT_CODEC.decode_engine_input(frames)
    assert isinstance(message, AddRequest)
    return message.request


# ----------------------------------------------------------------- registration, citations


def test_history_mutants_are_runnable_and_outside_the_kill_matrix() -> None:
    assert len(HISTORY_MUTANTS) >= 15
    assert not set(HISTORY_MUTANTS) & set(MUTANTS)
    assert set(RUNNABLE_MUTANTS) == set(MUTANTS) | set(HISTORY_MUTANTS)
    record = KillMatrix.load(ROOT / "fixtures" / "kill-matrix.json")
    assert not set(HISTORY_MUTANTS) & set(record.kills), "history mutants in the kill matrix"
    for name in HISTORY_MUTANTS:
        check_spec(f"mutant:{name}")
        assert make_driver(RunConfig(f"mutant:{name}")).name == f"mutant:{name}"


@pytest.mark.parametrize("name", sorted(HISTORY_MUTANTS))
def test_each_history_mutant_cites_its_vllm_source(name: str) -> None:
    mutant = HISTORY_MUTANTS[name]
    assert name.startswith("hist_")
    assert re.fullmatch(r"https://github\.com/vllm-project/vllm/(pull|issues)/\d+",
                        mutant.source), mutant.source
    broken: object = (mutant.core if mutant.frontend_class is ReferenceFrontend
                      else mutant.frontend_class)
    number = mutant.source.rsplit("/", 1)[1]
    assert f"#{number}" in (getattr(broken, "__doc__", None) or ""), (
        f"{broken!r}'s docstring does not cite #{number}")


def test_the_before_record_covers_every_history_mutant() -> None:
    record = json.loads(RECORD.read_text())
    assert sorted(record["mutants"]) == sorted(HISTORY_MUTANTS), (
        "run scripts/history_matrix.py for new or removed history mutants")
    for name, entry in record["mutants"].items():
        assert entry["class"] in ("MUST", "SHOULD only", "not caught", "not fired"), name
        assert entry["cases_run"] > 400, f"{name}: not a whole-suite run"


# ----------------------------------------------------------------- DP load balancing


def test_first_engine_until_stats(fired: list[str]) -> None:
    core = _ready(FirstEngineUntilStats)
    first = [core.request(core.add_request([5 + i], 4)[0].request_id or "") for i in range(3)]
    assert [s.rank for s in first if s] == [0, 0, 0] and fired
    core.on_load_report(1, 0, 0)  # the first stats update
    later = core.request(core.add_request([9], 4)[0].request_id or "")
    assert later is not None and later.rank == 1
    reference = _ready()
    spread = [reference.request(reference.add_request([5 + i], 4)[0].request_id or "")
              for i in range(2)]
    assert [s.rank for s in spread if s] == [0, 1]


def test_fixed_tie_break(fired: list[str]) -> None:
    for cls, second_rank in ((ReferenceFrontendCore, 1), (FixedTieBreak, 0)):
        core = _ready(cls)
        handle, _ = core.add_request([5], 1)
        assert handle.request_id is not None
        _output(core, handle.request_id, [100], F.LENGTH)  # done: the engines tie again
        nxt = core.request(core.add_request([6], 1)[0].request_id or "")
        assert nxt is not None and nxt.rank == second_rank, cls.__name__
    assert fired == ["hist_lb_fixed_tie_break"]


# ----------------------------------------------------------------- stop strings


def _stopped_text(cls: type[ReferenceFrontendCore], stop: list[str],
                  chunks: list[list[int]]) -> tuple[str, str | None]:
    core = _ready(cls)
    handle, _ = core.add_request([5], 10, stop=stop)
    assert handle.request_id is not None
    for tokens in chunks:
        _output(core, handle.request_id, tokens)
    return handle.text, handle.finish_reason


def test_stop_first_listed(fired: list[str]) -> None:
    # " t12": "t1" starts at 1 and completes first, "2" (listed first) completes last.
    assert _stopped_text(ReferenceFrontendCore, ["2", "t1"], [[12]]) == (" ", "stop")
    assert _stopped_text(StopFirstListed, ["2", "t1"], [[12]]) == (" t1", "stop")
    assert fired == ["hist_stop_first_listed"]


def test_stop_at_token_end_only(fired: list[str]) -> None:
    assert _stopped_text(ReferenceFrontendCore, ["t1"], [[12]]) == (" ", "stop")
    text, reason = _stopped_text(StopAtTokenEndOnly, ["t1"], [[12], [13]])
    assert reason is None and text.startswith(" t12")  # never matched: generation runs on
    assert fired and set(fired) == {"hist_stop_at_token_end_only"}


def test_stop_no_holdback(fired: list[str]) -> None:
    # The stop string "12 t13" spans from the end of token 12 into token 13.
    assert _stopped_text(ReferenceFrontendCore, ["12 t13"], [[12]]) == ("", None)
    assert _stopped_text(ReferenceFrontendCore, ["12 t13"], [[12], [13]]) == (" t", "stop")
    assert _stopped_text(StopNoHoldback, ["12 t13"], [[12]]) == (" t12", None)
    text, reason = _stopped_text(StopNoHoldback, ["12 t13"], [[12], [13]])
    assert (text, reason) == (" t12", "stop")  # the first part of the stop string leaked
    assert "hist_stop_no_holdback" in fired


# ----------------------------------------------------------------- aborts and request ids


def test_id_freed_before_abort(fired: list[str]) -> None:
    reference = _ready()
    reference.add_request([5], 8, request_id="x")
    reference.queue_drop(["x"])
    with pytest.raises(DuplicateRequestId):
        reference.add_request([6], 8, request_id="x")
    core = _ready(IdFreedBeforeAbort)
    first, _ = core.add_request([5], 8, request_id="x", data_parallel_rank=0)
    core.queue_drop(["x"])
    assert first.finish_reason == "abort"  # freed at once
    second, _ = core.add_request([6], 8, request_id="x", data_parallel_rank=0)
    assert _aborts(core.drain_drops()) == [(engine_identity(0), ["x"])]  # hits the new one
    assert not second.ended and fired == ["hist_id_freed_before_abort"]


def test_abort_by_external_id(fired: list[str]) -> None:
    core = _ready(AbortByExternalId)
    handle, (_identity, frames) = core.add_request([5], 8, request_id="x")
    add = _add_of(frames)
    assert re.fullmatch(r"x-[0-9a-f]{8}", add.request_id) and add.external_req_id == "x"
    assert handle.request_id == add.request_id
    with pytest.raises(DuplicateRequestId):
        core.add_request([6], 8, request_id="x")
    assert [ids for _, ids in _aborts(core.abort([add.request_id]))] == [["x"]]
    assert fired == ["hist_abort_by_external_id"]


def test_abort_before_tracked_lost(fired: list[str]) -> None:
    core = _ready(AbortBeforeTrackedLost)
    handle, _ = core.add_request([5], 8)
    assert handle.request_id is not None
    assert core.abort([handle.request_id]) == [] and not handle.ended
    _output(core, handle.request_id, [100])
    assert len(core.abort([handle.request_id])) == 1 and handle.finish_reason == "abort"
    assert fired == ["hist_abort_before_tracked_lost"]


# ----------------------------------------------------------------- DP ranks and waves


def test_rank_checked_against_count(fired: list[str]) -> None:
    reference = _ready(ranks=(2, 3))
    assert reference.add_request([5], 8, data_parallel_rank=2)[1][0] == engine_identity(2)
    with pytest.raises(FrontendError):
        reference.add_request([5], 8, data_parallel_rank=0)
    core = _ready(RankCheckedAgainstCount, ranks=(2, 3))
    with pytest.raises(FrontendError, match="out of range for 2 engine"):
        core.add_request([5], 8, data_parallel_rank=2)
    _handle, (identity, frames) = core.add_request([6], 8, data_parallel_rank=0)
    assert identity == engine_identity(0) and _add_of(frames).data_parallel_rank == 0
    assert fired == ["hist_rank_checked_against_count"] * 2


def test_stale_start_wave_rewinds(fired: list[str]) -> None:
    ref_coord = CoordinatorCore(2, codec=DEFAULT_CODEC)
    coord = StaleStartWaveRewinds.coordinator_class(2, codec=DEFAULT_CODEC)
    for c in (ref_coord, coord):
        c.apply(Signal.WAVE_COMPLETE, 3, 0)  # wave 3 done: current wave 4, paused
    assert ref_coord.apply(Signal.START_WAVE, 3, 1) == []  # stale: ignored
    effects = coord.apply(Signal.START_WAVE, 3, 1)
    assert coord.state.current_wave == 3 and coord.state.engines_running
    assert any(isinstance(e, Publish) for e in effects)
    assert fired == ["hist_stale_start_wave_rewinds"]


# ----------------------------------------------------------------- utilities, death


def test_utility_engine_zero_answer(fired: list[str]) -> None:
    with pytest.raises(InconsistentResults):
        _ready().aggregate_is_sleeping([True, False])
    core = _ready(UtilityEngineZeroAnswer)
    assert core.aggregate_is_sleeping([True, False]) is True
    assert core.aggregate_reset_prefix_cache([True, False]) is True
    assert core.aggregate("collective_rpc", [[1], [2]]) == [1]
    assert core.aggregate("is_scheduler_paused", [False, False]) is False  # agreed: silent
    assert fired == ["hist_utility_engine_zero_answer"] * 3


def test_late_reply_after_cancel_fatal(fired: list[str]) -> None:
    def late_reply(core: ReferenceFrontendCore) -> None:
        call, _sends = core.start_utility("is_sleeping", [])
        core.forget_utility(call)  # the caller timed out or was cancelled
        for call_id, rank in call.call_ids.items():
            core.on_output(DEFAULT_CODEC.encode_outputs(m.EngineCoreOutputs(
                rank, [], utility_output=m.UtilityOutput(
                    call_id, None, m.UtilityResult(None, False)))))

    reference, core = _ready(), _ready(LateReplyAfterCancelFatal)
    late_reply(reference)
    late_reply(core)
    assert reference.dead is None
    assert core.dead is not None and "KeyError" in str(core.dead)
    assert fired == ["hist_late_reply_after_cancel_fatal"]


def test_connection_loss_not_death(fired: list[str]) -> None:
    core = _ready(ConnectionLossNotDeath)
    core.mark_dead("engine connection lost ('ipc://x' disconnected)")
    assert core.dead is None and fired == ["hist_connection_loss_not_death"]
    core.mark_dead("ENGINE_CORE_DEAD received")
    assert core.dead is not None


def test_calls_pending_after_receiver_stop(fired: list[str]) -> None:
    async def run() -> tuple[bool, bool]:
        frontend = CallsPendingAfterReceiverStop(
            [0, 1], codec=DEFAULT_CODEC, core_factory=lambda ranks, codec: _ready())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            with frontend._waiters.call(frontend.core, "is_sleeping", [], future):
                frontend._fail_waiters(EngineDeadError("protocol error on the output socket"))
                after_garbage = future.done()
                frontend._fail_waiters(EngineDeadError("ENGINE_CORE_DEAD received"))
                after_dead = future.done()
            future.exception()
        finally:
            await frontend.close()
        return after_garbage, after_dead

    assert asyncio.run(run()) == (False, True)
    assert fired == ["hist_calls_pending_after_receiver_stop"]


# ----------------------------------------------------------------- inputs, outputs, sessions


def test_kv_params_not_forwarded(fired: list[str]) -> None:
    params = {"kv_transfer_params": {"do_remote_decode": True}, "cache_salt": "s"}
    assert _ready().pass_through(params) == ({"kv_transfer_params": {
        "do_remote_decode": True}}, "s")
    assert _ready(KvParamsNotForwarded).pass_through(params) == (None, "s")
    assert fired == ["hist_kv_params_not_forwarded"]


def test_prompt_text_leaked(fired: list[str]) -> None:
    for cls, text in ((ReferenceFrontendCore, " t7 t8"),
                      (PromptTextLeaked, detokenize([5, 6]) + " t7 t8")):
        core = _ready(cls)
        handle, _ = core.add_request([5, 6], 8)
        assert handle.request_id is not None
        _output(core, handle.request_id, [7])
        _output(core, handle.request_id, [8], F.LENGTH)
        assert handle.text == text and handle.tokens == [7, 8], cls.__name__
    assert fired == ["hist_prompt_text_leaked"]


def test_session_abort_is_boundary(fired: list[str]) -> None:
    for cls, ended in ((ReferenceFrontendCore, True), (SessionAbortIsBoundary, False)):
        core = _ready(cls)
        handle, _ = core.open_session([5], 4)
        assert handle.request_id is not None
        _output(core, handle.request_id, [100], F.ABORT)
        assert handle.ended is ended, cls.__name__
    assert fired == ["hist_session_abort_is_boundary"]


# ----------------------------------------------------------------- round 3: request limits


def test_stop_within_min_tokens(fired: list[str]) -> None:
    for cls, text in ((ReferenceFrontendCore, " t21 t22 "), (StopWithinMinTokens, " ")):
        core = _ready(cls)
        handle, _ = core.add_request([5], 10, stop=["t2"], sampling=Sampling(min_tokens=2))
        assert handle.request_id is not None
        for token in (21, 22, 23):
            _output(core, handle.request_id, [token])
        assert (handle.text, handle.finish_reason) == (text, "stop"), cls.__name__
    assert fired and set(fired) == {"hist_stop_within_min_tokens"}


@pytest.mark.parametrize(("cls", "name", "prompt", "max_tokens", "sampling"), [
    (EmptyPromptSent, "hist_empty_prompt_sent", [], 3, Sampling()),
    (PromptOverContextSent, "hist_prompt_over_context_sent", [5] * 1025, 3, Sampling()),
    (MinTokensOverMaxSent, "hist_min_tokens_over_max_sent", [5], 3,
     Sampling(min_tokens=4)),
])
def test_invalid_requests_sent(fired: list[str], cls: type[ReferenceFrontendCore],
                               name: str, prompt: list[int], max_tokens: int,
                               sampling: Sampling) -> None:
    with pytest.raises(InvalidRequest):
        _ready().add_request(prompt, max_tokens, sampling=sampling)
    _handle, (_identity, frames) = _ready(cls).add_request(prompt, max_tokens,
                                                            sampling=sampling)
    assert _add_of(frames).request_id
    assert fired == [name]
