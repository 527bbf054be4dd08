"""Robustness of the codec and of mock engines against hostile frames.

A conformance harness faces peers under test that may send anything, so the contract is: every
decoder either returns a message or raises `ProtocolError` (never another exception), and a
mock engine records bad input as a ProtocolError and keeps serving. The property tests feed
thousands of random and mutated frames (mutations of valid messages, including the golden
vectors vLLM produced); the unit tests pin down the typed error for each class of mistake.
"""

from __future__ import annotations

import json
import pickle
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.protocol.transport.endpoints import PrivateIpcDir
from harness.protocol.transport.sockets import make_socket
from harness.protocol.wire import DEFAULT_CODEC, AddRequest, ProtocolError
from harness.protocol.wire import messages as m
from mock_engines import EngineGroup, EngineScript, MockEngineCore, default_ready, stream

C = DEFAULT_CODEC
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "wire"
Frames = list[bytes]

# --------------------------------------------------------------------------- seed corpus


def _request(rid: str = "req-0", **kw: Any) -> m.EngineCoreRequest:
    params = m.SamplingParams(temperature=0.0, max_tokens=3, _eos_token_id=2,
                              _all_stop_token_ids={2})
    fields: dict[str, Any] = dict(request_id=rid, prompt_token_ids=[1, 2, 3], mm_features=None,
                                  sampling_params=params, pooling_params=None, arrival_time=1.5,
                                  lora_request=None, cache_salt=None, data_parallel_rank=None)
    fields.update(kw)
    return m.EngineCoreRequest(**fields)


def _engine_input_seeds() -> list[Frames]:
    big = m.WireArray("float32", (4, 32), bytes(512))
    return [
        C.encode_add(_request()),
        C.encode_add(_request("emb", prompt_embeds=big, lora_request=m.LoRARequest("a", 1))),
        C.encode_abort(["req-0", "req-1"]),
        C.encode_utility(0, 0x9F3C2B1A00112233, "is_sleeping", []),
        C.encode_utility(0, 7, "reset_prefix_cache", [False, False]),
        C.encode_start_dp_wave(5, 1),
    ]


def _other_seeds() -> list[Frames]:
    arr = m.WireArray("<f4", (64, 2), bytes(range(256)) * 2)
    outs = [
        m.EngineCoreOutputs(0, [m.EngineCoreOutput("a", [7])], None, 2.0,
                            weight_version="default"),
        m.EngineCoreOutputs(1, [m.EngineCoreOutput(
            "b", [2], finish_reason=m.FinishReason.ERROR, routed_experts=arr,
            error=m.RequestError("x", "y", True))], None, 3.0, finished_requests=["b"]),
        m.EngineCoreOutputs(0, [], None, 3.0, utility_output=m.UtilityOutput(
            42, None, m.UtilityResult(None, ["generate"]))),
    ]
    init = m.EngineHandshakeMetadata(m.EngineZmqAddresses(["ipc:///a"], ["ipc:///b"]), {})
    return [
        *(C.encode_outputs(o) for o in outs),
        C.encode_engine_dead(),
        [C.encode_ready(default_ready(0))],
        [C.encode_hello(True, False)],
        [C.encode_handshake_ready(False, True, parallel_config_hash="abc")],
        [C.encode_init(init)],
        [C.encode_dp_stats(m.DPStatsUpdate([(0, 1, 0.5), (2, 3, 0.0)], 4, True))],
    ]


def _fixture_seeds() -> tuple[list[Frames], list[Frames]]:
    """Frames real vLLM produced (fixtures/wire), split into engine inputs and the rest."""
    inputs: list[Frames] = []
    others: list[Frames] = []
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        frames = [bytes.fromhex(h) for h in doc["frames_hex"]]
        (inputs if doc["kind"] == "engine_input" else others).append(frames)
    return inputs, others


_FIX_INPUTS, _FIX_OTHERS = _fixture_seeds()
INPUT_SEEDS: list[Frames] = _engine_input_seeds() + _FIX_INPUTS
ALL_SEEDS: list[Frames] = INPUT_SEEDS + _other_seeds() + _FIX_OTHERS

# --------------------------------------------------------------------------- mutations

_JUNK: list[Any] = [None, -1, 0, 2**64 - 1, -(2**63), 1.5, float("nan"), "", "x" * 40, b"\x00",
                    True, [], {}, [1, "a"], {"k": 1}, {1: 2}, msgspec.msgpack.Ext(1, b"\x80"),
                    msgspec.msgpack.Ext(2, b""), msgspec.msgpack.Ext(3, b"abcd"),
                    msgspec.msgpack.Ext(9, b"zz")]


def _generic(frame: bytes) -> Any:
    return msgspec.msgpack.decode(frame, ext_hook=lambda code, data: msgspec.msgpack.Ext(
        code, bytes(data)))


def _pick(rnd: random.Random, frames: Frames) -> int:
    return rnd.randrange(len(frames))


def _bit_flip(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    i = _pick(rnd, frames)
    frame = bytearray(frames[i])
    if frame:
        pos = rnd.randrange(len(frame))
        frame[pos] ^= 1 << rnd.randrange(8)
    frames[i] = bytes(frame)
    return frames


def _truncate(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    i = _pick(rnd, frames)
    frames[i] = frames[i][: rnd.randrange(len(frames[i]) + 1)]
    return frames


def _extend(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    i = _pick(rnd, frames)
    frames[i] = frames[i] + rnd.randbytes(rnd.randint(1, 16))
    return frames


def _overwrite(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    i = _pick(rnd, frames)
    frame = bytearray(frames[i])
    if frame:
        pos = rnd.randrange(len(frame))
        frame[pos:pos + 4] = rnd.randbytes(rnd.randint(1, 4))
    frames[i] = bytes(frame)
    return frames


def _swap_type_byte(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    frames[0] = rnd.choice([b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x05",
                            bytes([rnd.randrange(256)]), b"", b"\x00\x00"])
    return frames


def _splice(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    other = rnd.choice(corpus)
    i, j = _pick(rnd, frames), _pick(rnd, other)
    a, b = frames[i], other[j]
    frames[i] = a[: rnd.randrange(len(a) + 1)] + b[rnd.randrange(len(b) + 1):]
    return frames


def _frame_count(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    op = rnd.randrange(4)
    if op == 0 and len(frames) > 1:
        del frames[_pick(rnd, frames)]
    elif op == 1:
        frames.insert(_pick(rnd, frames), frames[_pick(rnd, frames)])
    elif op == 2:
        frames.append(rnd.randbytes(rnd.randint(0, 600)))
    else:
        frames.insert(0, rnd.randbytes(rnd.randint(0, 3)))
    return frames


def _structural(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    """Wrong arity or wrong field type: edit the decoded structure and re-encode it."""
    candidates = []
    for i, frame in enumerate(frames):
        try:
            value = _generic(frame)
        except Exception:  # msgspec raises UnicodeDecodeError for bad str bytes, too
            continue
        if isinstance(value, list | dict) and value:
            candidates.append((i, value))
    if not candidates:
        return _bit_flip(rnd, frames, corpus)
    i, value = rnd.choice(candidates)
    target = value
    # Descend a few levels so nested structs (SamplingParams, EngineCoreOutput) get hit too.
    for _ in range(rnd.randrange(3)):
        inner = [v for v in (target.values() if isinstance(target, dict) else target)
                 if isinstance(v, list | dict) and v]
        if not inner:
            break
        target = rnd.choice(inner)
    op = rnd.randrange(4)
    if isinstance(target, list):
        if op == 0:
            del target[rnd.randrange(len(target)):]  # too short
        elif op == 1:
            target.extend(rnd.choice(_JUNK) for _ in range(rnd.randint(1, 3)))  # too long
        elif op == 2:
            target[rnd.randrange(len(target))] = rnd.choice(_JUNK)  # wrong type
        else:
            del target[rnd.randrange(len(target))]  # shifted fields
    else:
        key = rnd.choice(list(target))
        if op < 2:
            del target[key]
        else:
            target[key] = rnd.choice(_JUNK)
    frames[i] = msgspec.msgpack.encode(value)
    return frames


MUTATIONS: list[Callable[[random.Random, Frames, Sequence[Frames]], Frames]] = [
    _bit_flip, _truncate, _extend, _overwrite, _swap_type_byte, _splice, _frame_count,
    _structural,
]


def mutate(rnd: random.Random, frames: Frames, corpus: Sequence[Frames]) -> Frames:
    out = list(frames)
    for _ in range(rnd.randint(1, 3)):
        out = rnd.choice(MUTATIONS)(rnd, out, corpus)
    return out


# --------------------------------------------------------------------------- decoders


def _single(decode: Callable[[bytes], Any]) -> Callable[[Frames], Any]:
    return lambda frames: decode(frames[0] if frames else b"")


DECODERS: dict[str, Callable[[Frames], Any]] = {
    "engine_input": C.decode_engine_input,
    "outputs": C.decode_outputs,
    "ready": _single(C.decode_ready),
    "handshake_status": _single(C.decode_handshake_status),
    "init": _single(C.decode_init),
    "dp_stats": _single(C.decode_dp_stats),
}


def feed_all(frames: Frames) -> int:
    """Feed `frames` to every decoder; only ProtocolError may escape. Returns #rejections."""
    rejected = 0
    for name, decode in DECODERS.items():
        try:
            message = decode(frames)
        except ProtocolError as exc:
            assert exc.kind and isinstance(exc.frames, tuple), name
            rejected += 1
            continue
        for out in C.encode_message(message):
            assert isinstance(out, bytes)
    return rejected


FUZZ = settings(max_examples=2000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --------------------------------------------------------------------------- properties


@FUZZ
@given(st.lists(st.binary(max_size=80), min_size=0, max_size=4))
def test_random_frames_only_protocol_error(frames: Frames) -> None:
    feed_all(frames)


@FUZZ
@given(st.sampled_from(ALL_SEEDS), st.randoms(use_true_random=False))
def test_mutated_frames_only_protocol_error(seed: Frames, rnd: random.Random) -> None:
    feed_all(mutate(rnd, seed, ALL_SEEDS))


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(INPUT_SEEDS), st.integers(0, 255))
def test_any_type_byte_only_protocol_error(seed: Frames, type_byte: int) -> None:
    frames = [bytes([type_byte]), *seed[1:]]
    try:
        C.decode_engine_input(frames)
    except ProtocolError:
        pass
    else:
        assert type_byte in (0, 1, 2, 3)


# --------------------------------------------------------------------------- mock engines

N_MUTATED = 2000


def _mutated_inputs(n: int, seed: int) -> list[Frames]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        frames = mutate(rnd, rnd.choice(INPUT_SEEDS), INPUT_SEEDS)
        out.append(frames or [b""])  # a ZMQ message has at least one frame
    return out


def _expected_rejections(inputs: list[Frames]) -> int:
    count = 0
    for frames in inputs:
        try:
            C.decode_engine_input(frames)
        except ProtocolError:
            count += 1
    return count


def _short_script() -> EngineScript:
    # Whatever a mutated-but-valid ADD asks for, answer with two tokens (no giant streams).
    return EngineScript(default=lambda _r: stream([5, 6]))


def test_mock_engine_core_survives_mutated_frames() -> None:
    core = MockEngineCore(0, _short_script(), codec=DEFAULT_CODEC)
    inputs = _mutated_inputs(N_MUTATED, seed=20240611)
    expected = _expected_rejections(inputs)
    assert expected > N_MUTATED // 4, "the mutations should mostly produce invalid frames"
    now = 100.0
    for frames in inputs:
        core.receive(frames, now)
        core.poll(now)
    errors = core.transcript.protocol_errors()
    assert len(errors) == expected
    assert all(isinstance(r.error, ProtocolError) and r.direction == "in" for r in errors)
    assert not core.dead
    for _ in range(10):  # let whatever valid requests slipped through finish
        core.poll(now)

    core.receive(C.encode_add(_request("after-fuzz")), now + 1)
    core.receive(C.encode_utility(0, 4242, "is_sleeping", []), now + 1)
    sent = [C.decode_outputs(o.frames) for _ in range(3) for o in core.poll(now + 1)]
    outs = [o for o in sent if isinstance(o, m.EngineCoreOutputs)]
    tokens = [t for o in outs for out in o.outputs if out.request_id == "after-fuzz"
              for t in out.new_token_ids]
    assert tokens == [5, 6]
    replies = [o.utility_output for o in outs
               if o.utility_output is not None and o.utility_output.call_id == 4242]
    assert replies == [m.UtilityOutput(4242, None, m.UtilityResult(None, False))]


def _recv(sock: zmq.Socket[bytes], deadline: float) -> Frames | None:
    remaining_ms = (deadline - time.monotonic()) * 1000
    if remaining_ms <= 0 or not sock.poll(int(remaining_ms)):
        return None
    return sock.recv_multipart()


def test_engine_group_survives_mutated_frames_over_ipc() -> None:
    inputs = _mutated_inputs(N_MUTATED, seed=777)
    expected = _expected_rejections(inputs)
    with PrivateIpcDir() as ipc, EngineGroup([_short_script()], codec=DEFAULT_CODEC) as group:
        ctx = group.ctx
        router = make_socket(ctx, zmq.ROUTER)
        pull = make_socket(ctx, zmq.PULL)
        try:
            in_addr, out_addr = ipc.address("in"), ipc.address("out")
            router.bind(in_addr)
            pull.bind(out_addr)
            group.start_bootstrapped([in_addr], [out_addr])
            deadline = time.monotonic() + 10
            ready = _recv(router, deadline)
            assert ready is not None, "no ready frame from the mock engine"
            identity = ready[0]
            assert C.decode_ready(ready[1]) is not None

            for frames in inputs:
                router.send_multipart([identity, *frames])
            router.send_multipart([identity, *C.encode_add(_request("after-fuzz"))])
            router.send_multipart([identity, *C.encode_utility(0, 4242, "is_sleeping", [])])

            tokens: list[int] = []
            reply: m.UtilityOutput | None = None
            finished = False
            deadline = time.monotonic() + 15
            while not (finished and reply is not None):
                got_frames = _recv(pull, deadline)
                assert got_frames is not None, f"timed out: tokens={tokens} reply={reply}"
                msg = C.decode_outputs(got_frames)
                assert isinstance(msg, m.EngineCoreOutputs)
                if msg.utility_output is not None and msg.utility_output.call_id == 4242:
                    reply = msg.utility_output
                for out in msg.outputs:
                    if out.request_id == "after-fuzz":
                        tokens.extend(out.new_token_ids)
                        finished = finished or out.finished
            assert tokens == [5, 6]
            assert reply == m.UtilityOutput(4242, None, m.UtilityResult(None, False))

            transcript = group[0].transcript
            got = len(transcript.select(direction="in", channel="input"))
            assert got == N_MUTATED + 2
            errors = transcript.protocol_errors()
            assert len(errors) == expected
            assert all(isinstance(r.error, ProtocolError) for r in errors)
            assert group.failures() == []
        finally:
            router.close(0)
            pull.close(0)


# --------------------------------------------------------------------------- typed errors


def _kind(call: Callable[[], Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value


def _add_array(**overrides: Any) -> list[Any]:
    """The ADD payload as a generic msgpack array, for hand-made malformed variants."""
    value: list[Any] = _generic(C.encode_add(_request(**overrides))[1])
    return value


@pytest.mark.parametrize("type_byte", [b"\x04", b"\x05", b"\x06", b"\xff", b"", b"\x00\x00"])
def test_wrong_type_byte(type_byte: bytes) -> None:
    frames = [type_byte, C.encode_abort(["a"])[1]]
    err = _kind(lambda: C.decode_engine_input(frames))
    assert err.kind == "request_type"
    assert err.frames == tuple(frames)


def test_missing_frames() -> None:
    assert _kind(lambda: C.decode_engine_input([b"\x00"])).kind == "frame_count"
    assert _kind(lambda: C.decode_engine_input([])).kind == "frame_count"
    assert _kind(lambda: C.decode_outputs([])).kind == "frame_count"


@pytest.mark.parametrize("cut", [1, 5, 20, -1])
def test_truncated_msgpack(cut: int) -> None:
    add = C.encode_add(_request())
    err = _kind(lambda: C.decode_engine_input([add[0], add[1][:cut]]))
    assert err.kind == "add_payload"
    assert err.frames == (add[0], add[1][:cut])
    out = C.encode_outputs(m.EngineCoreOutputs(0, [m.EngineCoreOutput("a", [1])], None, 1.0))
    assert _kind(lambda: C.decode_outputs([out[0][:cut]])).kind == "outputs_payload"
    ready = C.encode_ready(default_ready(0))
    assert _kind(lambda: C.decode_ready(ready[:cut])).kind == "ready_payload"
    assert _kind(lambda: C.decode_init(b"\x82\xa9addresses")).kind == "init_payload"


def test_trailing_bytes_rejected() -> None:
    add = C.encode_add(_request())
    assert _kind(lambda: C.decode_engine_input([add[0], add[1] + b"\xc0"])).kind == "add_payload"


def test_wrong_arity() -> None:
    short_add = msgspec.msgpack.encode(_add_array()[:8])  # 9 required fields
    assert _kind(lambda: C.decode_engine_input([b"\x00", short_add])).kind == "add_payload"
    util = msgspec.msgpack.encode([0, 1, "is_sleeping"])
    assert _kind(lambda: C.decode_engine_input([b"\x03", util])).kind == "utility_payload"
    wave = msgspec.msgpack.encode([5])
    assert _kind(lambda: C.decode_engine_input([b"\x02", wave])).kind == "start_dp_wave_payload"
    assert _kind(lambda: C.decode_dp_stats(msgspec.msgpack.encode([None, 1]))).kind == \
        "dp_stats_payload"
    # An EngineCoreOutput with only its request_id (new_token_ids is required).
    outs = msgspec.msgpack.encode([0, [["a"]], None, 1.0])
    assert _kind(lambda: C.decode_outputs([outs])).kind == "outputs_payload"


def test_longer_arrays_accepted_like_vllm() -> None:
    """vLLM's structs do not forbid unknown fields: extra trailing elements are ignored."""
    longer = msgspec.msgpack.encode([*_add_array(), "future-field"])
    msg = C.decode_engine_input([b"\x00", longer])
    assert isinstance(msg, AddRequest) and msg.request.request_id == "req-0"


@pytest.mark.parametrize(("index", "value"), [
    (0, 17),  # request_id must be str
    (1, ["a", "b"]),  # prompt_token_ids must be ints
    (3, [1, 2]),  # sampling_params must be a map
    (5, "soon"),  # arrival_time must be a number
    (11, True),  # client_index: bool is not an int
    (15, 1),  # resumable: int is not a bool
])
def test_wrong_field_types_in_add(index: int, value: Any) -> None:
    payload = _add_array()
    payload[index] = value
    frames = [b"\x00", msgspec.msgpack.encode(payload)]
    assert _kind(lambda: C.decode_engine_input(frames)).kind == "add_payload"


def test_wrong_field_types_elsewhere() -> None:
    bad_reason = msgspec.msgpack.encode([0, [["a", [1], None, None, None, 9]], None, 1.0])
    assert _kind(lambda: C.decode_outputs([bad_reason])).kind == "outputs_payload"
    assert _kind(lambda: C.decode_engine_input(
        [b"\x01", msgspec.msgpack.encode(["a", 3])])).kind == "abort_payload"
    assert _kind(lambda: C.decode_handshake_status(msgspec.msgpack.encode(
        {"status": "HELLO", "local": 1, "headless": False}))).kind == "handshake_payload"
    assert _kind(lambda: C.decode_handshake_status(msgspec.msgpack.encode(
        {"status": "HI", "local": True, "headless": False}))).kind == "handshake_payload"


def test_add_without_params() -> None:
    frames = [b"\x00", msgspec.msgpack.encode(_add_array()[:3] + [None] + _add_array()[4:])]
    err = _kind(lambda: C.decode_engine_input(frames))
    assert err.kind == "add_payload" and "neither" in err.detail


@pytest.mark.parametrize("key", C.profile.required_ready_keys)
def test_missing_required_ready_key(key: str) -> None:
    ready = msgspec.to_builtins(default_ready(0))
    del ready[key]
    err = _kind(lambda: C.decode_ready(msgspec.msgpack.encode(ready)))
    assert err.kind == "ready_payload"
    assert key in err.detail


def test_required_ready_keys_are_the_seventeen() -> None:
    assert len(C.profile.required_ready_keys) == 17
    assert C.profile.required_ready_keys[0] == "max_model_len"
    assert C.profile.required_ready_keys[-1] == "max_loras"


def test_empty_ready_payload_means_no_response() -> None:
    assert C.decode_ready(b"") is None


@pytest.mark.parametrize("index", [0, 2, 5, -1])
def test_aux_index_out_of_range(index: int) -> None:
    output = ["a", [1], None, None, None, None, None, None, None, None, None, None,
              ["<f4", [64, 2], index]]
    main = msgspec.msgpack.encode([0, [output], None, 1.0])
    err = _kind(lambda: C.decode_outputs([main, bytes(512)]))
    assert err.kind == "outputs_payload"
    assert err.frames == (main, bytes(512))


def test_aux_index_in_range_resolves() -> None:
    output = ["a", [1], None, None, None, None, None, None, None, None, None, None,
              ["<f4", [64, 2], 1]]
    main = msgspec.msgpack.encode([0, [output], None, 1.0])
    msg = C.decode_outputs([main, bytes(512)])
    assert isinstance(msg, m.EngineCoreOutputs)
    assert msg.outputs[0].routed_experts == m.WireArray("<f4", (64, 2), bytes(512))


_UNPICKLED: list[str] = []


def _trip() -> str:
    _UNPICKLED.append("tripped")
    return "tripped"


class _Trap:
    """Unpickling this calls `_trip`, which records that the payload was executed."""

    def __reduce__(self) -> tuple[Callable[[], str], tuple[()]]:
        return _trip, ()


@pytest.mark.parametrize("code", [1, 2, 7])
def test_pickle_ext_types_refused_never_unpickled(code: int) -> None:
    trap = msgspec.msgpack.Ext(code, pickle.dumps(_Trap(), protocol=pickle.HIGHEST_PROTOCOL))
    _UNPICKLED.clear()
    cases: list[Callable[[], Any]] = [
        lambda: C.decode_engine_input([b"\x03", msgspec.msgpack.encode(
            [0, 1, "collective_rpc", [trap]])]),
        lambda: C.decode_engine_input([b"\x01", msgspec.msgpack.encode([trap])]),
        lambda: C.decode_engine_input([b"\x00", msgspec.msgpack.encode(
            [trap, *_add_array()[1:]])]),
        lambda: C.decode_outputs([msgspec.msgpack.encode([0, [], None, 1.0, [
            1, None, [None, trap]]])]),
        lambda: C.decode_outputs([msgspec.msgpack.encode([0, [[
            "a", [1], None, None, None, None, None, None, {"k": trap}]], None, 1.0])]),
        lambda: C.decode_ready(msgspec.msgpack.encode(
            {**msgspec.to_builtins(default_ready(0)), "kv_events_config": {"x": trap}})),
    ]
    refused_by_hook = 0
    for case in cases:
        err = _kind(case)
        # Typed positions reject any ext before decoding it; untyped ones reach the ext hook.
        assert "ext" in err.detail
        refused_by_hook += f"ext type {code} refused" in err.detail
    assert refused_by_hook >= 3  # utility args, kv_transfer_params, kv_events_config, ...
    assert _UNPICKLED == []


def test_utility_reply_without_wrapper() -> None:
    bare = msgspec.msgpack.encode([0, [], None, 1.0, [7, None, None]])
    err = _kind(lambda: C.decode_outputs([bare]))
    assert err.kind == "utility_reply" and "wrapper" in err.detail
    typed = msgspec.msgpack.encode([0, [], None, 1.0, [7, None, [["builtins", "int"], 1]]])
    assert _kind(lambda: C.decode_outputs([typed])).kind == "utility_reply"
    not_array = msgspec.msgpack.encode([0, [], None, 1.0, [7, None, True]])
    assert _kind(lambda: C.decode_outputs([not_array])).kind == "outputs_payload"
    failure = msgspec.msgpack.encode([0, [], None, 1.0, [7, "boom", None]])
    msg = C.decode_outputs([failure])
    assert isinstance(msg, m.EngineCoreOutputs) and msg.utility_output is not None
    assert msg.utility_output.failure_message == "boom"


def test_protocol_error_hex_view() -> None:
    err = _kind(lambda: C.decode_engine_input([b"\x09", b"\xc1" * 300]))
    assert err.frames_hex(limit=4) == ["09", "c1c1c1c1..."]
