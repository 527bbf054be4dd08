"""Mock-engine steps the streaming cases need: retire without a final output, stats-only
messages mid-stream, ndarray outputs (inline and aux frames), hand-built messages."""

from __future__ import annotations

import time

from harness.protocol.wire import DEFAULT_CODEC
from harness.protocol.wire import messages as m
from mock_engines import (
    Emit,
    EmitArrays,
    EngineScript,
    Finish,
    FinishedOnly,
    MockEngineCore,
    StatsOnly,
    any_request,
)
from mock_engines.engine import Outgoing

C = DEFAULT_CODEC
T0 = 1000.0


def _core(*steps: object) -> MockEngineCore:
    core = MockEngineCore(0, EngineScript(rules=[any_request(list(steps))]), codec=DEFAULT_CODEC)  # type: ignore[arg-type]
    params = m.SamplingParams(temperature=0.0, max_tokens=4)
    core.receive(C.encode_add(m.EngineCoreRequest("r1", [1, 2], None, params, None, 1.0,
                                                  None, None, None)), T0)
    return core


def _messages(items: list[Outgoing]) -> list[tuple[int, m.EngineCoreOutputs]]:
    out = []
    for item in items:
        msg = C.decode_outputs(item.frames)
        assert isinstance(msg, m.EngineCoreOutputs)
        out.append((len(item.frames), msg))
    return out


def test_finished_only_names_the_request_without_an_output() -> None:
    core = _core(Emit([100]), FinishedOnly())
    first = _messages(core.poll(T0))
    assert [o.new_token_ids for _n, msg in first for o in msg.outputs] == [[100]]
    (_n, retired), = _messages(core.poll(T0))
    assert retired.outputs == [] and retired.finished_requests == ["r1"]
    assert "r1" not in core.running and core.next_deadline() is None


def test_stats_only_step_sends_stats_without_outputs_then_goes_on() -> None:
    core = _core(Emit([100]), StatsOnly(), Finish(m.FinishReason.LENGTH, [101]))
    _messages(core.poll(T0))
    (_n, stats), = _messages(core.poll(T0))
    assert stats.outputs == [] and stats.scheduler_stats is not None
    (_n, final), = _messages(core.poll(T0))
    assert final.outputs[0].finish_reason is m.FinishReason.LENGTH


def test_emit_arrays_inline_then_as_aux_frame() -> None:
    core = _core(EmitArrays([100], 32), EmitArrays([101, 102, 103], 32))
    (frames_small, small), = _messages(core.poll(T0))
    (frames_big, big), = _messages(core.poll(T0))
    assert frames_small == 1 and frames_big == 2  # 128 bytes inline, 384 bytes as aux
    experts = big.outputs[0].routed_experts
    assert experts is not None and experts.shape == (3, 32) and len(experts.data) == 384
    assert small.outputs[0].routed_experts is not None


def test_inject_outputs_is_sent_and_recorded_as_output() -> None:
    core = MockEngineCore(0, EngineScript(), codec=DEFAULT_CODEC)
    msg = m.EngineCoreOutputs(0, [m.EngineCoreOutput("x", [5])], None, time.monotonic())
    core.inject_outputs(T0, msg)
    (_n, sent), = _messages(core.poll(T0))
    assert sent.outputs[0].request_id == "x"
    assert core.transcript.select(direction="out", channel="output")
