"""The reference frontend core on the lifecycle table
(harness/protocol/lifecycle.py, frontend role).

Each request's `Phase` is the truth; `requests` and `ended` are indexes of it. Checked on a
real `ReferenceFrontendCore` with real frames (no sockets): what each client call and each
engine message does to the phase, what the drain pass and an explicit abort send for ids in
every phase, the bound on remembered ids, and that an illegal transition of the core's own
making is a `LifecycleError`, never a silent no-op.
"""

from __future__ import annotations

import pytest

from harness.frontends.api import StreamHandle
from harness.frontends.reference import core as core_module
from harness.frontends.reference.core import ReferenceFrontendCore
from harness.protocol.lifecycle import FRONTEND_PHASES, TRANSITIONS, Event, LifecycleError, Phase
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.vocab import token_text
from harness.protocol.wire import DEFAULT_CODEC, AbortRequests
from harness.protocol.wire import messages as m
from tests.reference_cores import ready_core

RANKS = (0, 1)
STOP_TOKEN = 7  # its text is the stop string of the stop-string requests


def _core() -> ReferenceFrontendCore:
    return ready_core(RANKS)


def _add(core: ReferenceFrontendCore, rank: int = 0, stop: bool = False
         ) -> tuple[str, StreamHandle]:
    handle, _send = core.add_request([1, 2, 3], 8, data_parallel_rank=rank,
                                     stop=[token_text(STOP_TOKEN)] if stop else None)
    assert handle.request_id is not None
    return handle.request_id, handle


def _output(core: ReferenceFrontendCore, rid: str, tokens: list[int],
            finish: m.FinishReason | None = None, finished_requests: list[str] | None = None
            ) -> None:
    rank = core.request(rid).rank  # type: ignore[union-attr]
    core.on_output(DEFAULT_CODEC.encode_outputs(m.EngineCoreOutputs(
        rank, [m.EngineCoreOutput(rid, tokens, finish_reason=finish)],
        finished_requests=finished_requests)))


def _aborted(sends: list[tuple[bytes, list[bytes]]]) -> dict[int, list[str]]:
    by_identity = {engine_identity(r): r for r in RANKS}
    out: dict[int, list[str]] = {}
    for identity, frames in sends:
        message = DEFAULT_CODEC.decode_engine_input(frames)
        assert isinstance(message, AbortRequests)
        out.setdefault(by_identity[identity], []).extend(message.request_ids)
    return out


def _phase(core: ReferenceFrontendCore, rid: str) -> Phase:
    state = core.request(rid)
    assert state is not None, rid
    return state.phase


def test_a_request_is_born_open_and_the_indexes_follow_its_phase() -> None:
    core = _core()
    rid, handle = _add(core)
    assert _phase(core, rid) is Phase.OPEN and rid in core.requests
    _output(core, rid, [5])
    assert _phase(core, rid) is Phase.OPEN
    _output(core, rid, [6], m.FinishReason.LENGTH)
    assert _phase(core, rid) is Phase.FINISHED
    assert rid not in core.requests and rid in core.ended
    assert handle.finish_reason == "length"


def test_drop_then_drain_is_one_abort_at_the_owner_and_ends_drained() -> None:
    core = _core()
    rid, handle = _add(core, rank=1)
    core.queue_drop([rid, rid])  # dropping twice queues nothing new
    assert _phase(core, rid) is Phase.DROPPED and handle.dropped
    assert _aborted(core.drain_drops()) == {1: [rid]}
    assert _phase(core, rid) is Phase.DRAINED and handle.finish_reason == "abort"
    core.queue_drop([rid])  # the client drops an ended stream again: nothing owed
    assert core.drain_drops() == [] and _phase(core, rid) is Phase.DRAINED


@pytest.mark.parametrize("ending", ["final_output", "finished_requests"])
def test_a_stop_string_owes_an_abort_until_the_engine_ends_the_request(ending: str) -> None:
    core = _core()
    rid, handle = _add(core, rank=1, stop=True)
    _output(core, rid, [5, STOP_TOKEN, 6])
    assert _phase(core, rid) is Phase.STOP_PENDING and handle.finish_reason == "stop"
    assert rid in core.pending_drops and rid not in core.requests and rid in core.stopped
    if ending == "final_output":
        _output(core, rid, [8], m.FinishReason.LENGTH)
    else:
        _output(core, rid, [], finished_requests=[rid])
    assert _phase(core, rid) is Phase.FINISHED
    assert core.drain_drops() == []  # retired by its engine: no ABORT owed any more
    assert handle.finish_reason == "stop"


def test_a_stop_string_abort_is_drained_once_at_its_owner() -> None:
    core = _core()
    rid, _handle = _add(core, rank=1, stop=True)
    _output(core, rid, [STOP_TOKEN])
    assert core.abort([rid]) == []  # explicit abort leaves the owed ABORT to the drain
    assert _aborted(core.drain_drops()) == {1: [rid]}
    assert _phase(core, rid) is Phase.DRAINED
    core.queue_drop([rid])
    assert core.drain_drops() == []


def test_explicit_abort_of_an_ended_id_is_a_lookup_of_its_phase() -> None:
    core = _core()
    live, _ = _add(core, rank=0)
    done, _ = _add(core, rank=1)
    _output(core, done, [5], m.FinishReason.STOP)
    assert _aborted(core.abort([done, "never-sent", live, live])) == {0: [live]}
    assert _phase(core, live) is Phase.ABORTED and _phase(core, done) is Phase.FINISHED
    assert core.abort([live]) == []  # aborted already: never a second ABORT


def test_death_ends_every_phase_that_is_owed_something() -> None:
    core = _core()
    open_rid, handle = _add(core)
    stopped, _ = _add(core, stop=True)
    _output(core, stopped, [STOP_TOKEN])
    core.mark_dead("test")
    assert _phase(core, open_rid) is Phase.DEAD and _phase(core, stopped) is Phase.DEAD
    assert handle.finish_reason == "error" and core.drain_drops() == []


def test_ended_ids_are_bounded_but_an_owed_abort_is_never_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_module, "MAX_ENDED", 3)
    core = _core()
    owed, _ = _add(core, rank=1, stop=True)
    _output(core, owed, [STOP_TOKEN])  # the oldest ended id, still owed an ABORT
    finished = []
    for _ in range(5):
        rid, _h = _add(core)
        _output(core, rid, [5], m.FinishReason.LENGTH)
        finished.append(rid)
    assert len(core.ended) == 3 and finished[0] not in core.ended
    assert core.request(finished[0]) is None  # forgotten: a late drop of it is a no-op
    assert owed in core.stopped  # never forgotten while its ABORT is owed
    assert _aborted(core.drain_drops()) == {1: [owed]}
    assert owed in core.ended and len(core.ended) == 3


def test_an_illegal_transition_of_the_cores_own_making_raises() -> None:
    core = _core()
    rid, _ = _add(core)
    _output(core, rid, [5], m.FinishReason.LENGTH)
    state = core.request(rid)
    assert state is not None
    with pytest.raises(LifecycleError, match="'finished' cannot take event 'abort'"):
        core._advance(state, Event.ABORT)
    assert state.phase is Phase.FINISHED


def test_nothing_an_engine_or_the_client_sends_can_be_illegal() -> None:
    """Only ABORT and DRAIN (the core's own) are refused anywhere in the table, so an
    engine's message or a client's drop never reaches a LifecycleError in the core."""
    for phase in FRONTEND_PHASES:
        for event in (Event.OUTPUT, Event.STOP_MATCHED, Event.FINAL_OUTPUT,
                      Event.ENGINE_DEAD, Event.DROP):
            assert (phase, event) in TRANSITIONS, (phase, event)


def test_the_core_takes_its_codec_from_its_driver() -> None:
    with pytest.raises(TypeError):
        ReferenceFrontendCore(list(RANKS))  # type: ignore[call-arg]
