"""Load-generator mode of the mock engines: the pre-encoded steps are the codec's bytes.

No timing here (benchmarks/ and `corewire bench` measure speed): these tests pin what a step
carries, that the template path and the codec path agree byte for byte, and that counters
mode keeps counts instead of records.
"""

from __future__ import annotations

from harness.protocol.wire import DEFAULT_CODEC, AbortRequests, AddRequest, codec_for
from harness.protocol.wire import messages as m
from harness.protocol.wire.profiles import all_profiles
from mock_engines import EngineScript, MockEngineCore, Record, Transcript
from mock_engines.loadgen import LoadMode, LoadStepper


def _request(rid: str, tokens: int, client: int = 0) -> m.EngineCoreRequest:
    return m.EngineCoreRequest(rid, [1, 2], None, m.SamplingParams(max_tokens=tokens), None,
                               0.0, None, None, None, client_index=client)


def _decode(frame: bytes) -> m.EngineCoreOutputs:
    outs = DEFAULT_CODEC.decode_outputs([frame])
    assert isinstance(outs, m.EngineCoreOutputs)
    return outs


def test_one_message_per_step_with_every_running_request() -> None:
    stepper = LoadStepper(3, DEFAULT_CODEC, LoadMode(), "default")
    assert stepper.fast
    stepper.add(_request("a", 3), 0.0)
    stepper.add(_request("b", 1), 0.0)
    seen: list[m.EngineCoreOutputs] = []
    for step in range(4):
        for out in stepper.step(10.0 + step):
            assert out.client_index == 0
            seen.append(_decode(out.frame))
    assert [[(o.request_id, o.new_token_ids, o.finish_reason) for o in s.outputs]
            for s in seen] == [
        [("a", [100], None), ("b", [100], m.FinishReason.LENGTH)],
        [("a", [101], None)],
        [("a", [102], m.FinishReason.LENGTH)],
    ]
    assert [s.engine_index for s in seen] == [3, 3, 3]
    assert [s.timestamp for s in seen] == [10.0, 11.0, 12.0]
    assert seen[0].weight_version == "default"
    assert stepper.stats.tokens == 4 and stepper.stats.requests_finished == 2
    assert stepper.running == 0


def test_template_bytes_equal_the_codec_bytes() -> None:
    stepper = LoadStepper(0, DEFAULT_CODEC, LoadMode(token_base=7), "default")
    for i in range(20):  # more than 15: the outputs array takes a 3-byte header
        stepper.add(_request(f"req-é-{i}", 2), 0.0)
    frame = stepper.step(5.0)[0].frame
    expected = DEFAULT_CODEC.encode_outputs(m.EngineCoreOutputs(
        0, [m.EngineCoreOutput(f"req-é-{i}", [7]) for i in range(20)], None, 5.0,
        weight_version="default"))
    assert [frame] == expected


def test_abort_and_second_client() -> None:
    stepper = LoadStepper(0, DEFAULT_CODEC, LoadMode(), None)
    stepper.add(_request("a", 5), 0.0)
    stepper.add(_request("b", 5, client=1), 0.0)
    assert {o.client_index for o in stepper.step(1.0)} == {0, 1}
    assert stepper.abort("a") and not stepper.abort("a")
    outs = stepper.step(2.0)
    assert [o.client_index for o in outs] == [1]
    assert [o.request_id for o in _decode(outs[0].frame).outputs] == ["b"]
    assert stepper.stats.requests_aborted == 1


def test_every_profile_gets_decodable_steps() -> None:
    """An older release's layout falls back to the codec (same bytes a scripted engine
    would send); either way its own decoder reads every step."""
    for profile in all_profiles():
        codec = codec_for(profile)
        stepper = LoadStepper(0, codec, LoadMode(), "default")
        stepper.add(_request("a", 2), 0.0)
        frames = [o.frame for _ in range(2) for o in stepper.step(1.0)]
        decoded = [codec.decode_outputs([f]) for f in frames]
        assert all(isinstance(d, m.EngineCoreOutputs) for d in decoded), profile.name
        last = decoded[-1]
        assert isinstance(last, m.EngineCoreOutputs)
        assert last.outputs[0].finish_reason == m.FinishReason.LENGTH, profile.name


def test_record_steps_keeps_add_and_first_output_times() -> None:
    stepper = LoadStepper(0, DEFAULT_CODEC, LoadMode(record_steps=True), None)
    stepper.add(_request("a", 2), 1.0)
    stepper.step(1.5)
    stepper.step(1.75)
    assert stepper.stats.added_at == {"a": 1.0}
    assert stepper.stats.first_sent_at == {"a": 1.5}
    assert stepper.stats.step_times == [1.5, 1.75]


def test_core_in_load_mode_and_counters_transcript() -> None:
    script = EngineScript(load=LoadMode(), retain_transcript=False)
    core = MockEngineCore(0, script, codec=DEFAULT_CODEC)
    core.receive(DEFAULT_CODEC.encode_add(_request("a", 10)), 1.0)
    core.receive(DEFAULT_CODEC.encode_add(_request("b", 10)), 1.0)
    assert core.counts() == (0, 2)
    assert core.next_deadline() == 1.0
    core.receive(DEFAULT_CODEC.encode_abort(["a", "zzz"]), 1.1)
    assert core.load is not None and core.load.stats.requests_aborted == 1
    assert core.counts() == (0, 1) and not core.phases  # the stepper's own, off the table
    counters = core.transcript.counters
    assert (counters.adds, counters.abort_frames, counters.aborted_ids) == (2, 1, 2)
    assert counters.last_abort_t == 1.1
    assert len(core.transcript) == 0  # nothing retained
    assert not core.has_scripted_work()


def test_full_transcript_is_the_default() -> None:
    transcript = Transcript(codec=DEFAULT_CODEC)
    transcript.append(Record(1.0, 0, "in", "input", (b"\x01",), AbortRequests(["x"])))
    transcript.append(Record(1.0, 0, "in", "input", (b"\x00",), AddRequest(_request("a", 1))))
    assert len(transcript) == 2 and transcript.aborted_ids() == ["x"]
    assert transcript.counters.records == 0
