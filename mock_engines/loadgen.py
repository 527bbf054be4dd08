"""Load-generator mode of a mock engine: one message per engine step, pre-encoded.

A real engine emits one `EngineCoreOutputs` per step carrying one output for every running
request. In load mode a mock engine does the same for every request it is given: each request
gets `max_tokens` one-token outputs, one per step, the last one final (LENGTH). The hot path
never builds a per-output Python object: each request's output is cut, once, from the codec's
own encoding into a head (array header + request id) and a tail (the default fields), and a
step's message is

    prefix + array header(n) + (token + tail).join(heads) + token + tail + stats/timestamp + rest

so one step costs a few C-level joins whatever the number of running requests. Every step
carries the same token id (`token_base + step % token_cycle`): a client can map a received
token back to the step, and so to the engine's send time (per-token latency).

The template is checked once against the codec's decoder (`LoadStepper.fast`); a protocol
profile whose layout it does not fit (an older release's) encodes each step through the codec
instead -- slower, same bytes a scripted engine would send.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m

_TOKEN_MARK = 0xBEEF  # encodes as cd be ef: easy to find in a template, never a real token
_TIME_MARK = 1234.5  # a float64 whose 9 encoded bytes mark the timestamp's place
_PACK_F64 = struct.Struct(">d").pack


@dataclass(frozen=True)
class LoadMode:
    """How a mock engine generates load.

    step_interval: seconds between steps (0: step as fast as the engine thread can, each
      request then paced only by how fast its client re-adds: the request-level back-pressure).
    send_hwm: SNDHWM of the engine's PUSH sockets (0: unlimited, as vLLM sets it; a frontend
      whose PULL has an unlimited RCVHWM absorbs everything anyway).
    step_cost: seconds of busy work added to every step: a deliberately slow engine (the
      benchmark's refusal rule must fire on it).
    record_steps: keep every step's send time (for per-token latency) and each request's
      ADD and first-output times (TTFT).
    """

    step_interval: float = 0.0
    token_base: int = 100
    token_cycle: int = 800
    send_hwm: int = 0
    step_cost: float = 0.0
    record_steps: bool = False


class LoadOutgoing(NamedTuple):
    client_index: int
    frame: bytes


@dataclass
class LoadStats:
    """What a load-mode engine did (read from other threads: plain counters)."""

    steps: int = 0
    messages: int = 0
    tokens: int = 0
    requests_added: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    step_times: list[float] = field(default_factory=list)  # record_steps only
    added_at: dict[str, float] = field(default_factory=dict)  # record_steps only
    first_sent_at: dict[str, float] = field(default_factory=dict)  # record_steps only


class _Client:
    """The running requests of one client (one output socket)."""

    __slots__ = ("dirty", "finish_at", "heads", "heads_list", "new", "pre")

    def __init__(self) -> None:
        self.heads: dict[str, bytes] = {}  # rid -> encoded head, insertion (= ADD) order
        self.heads_list: list[bytes] = []
        self.pre = b""  # message prefix + outputs array header, for heads_list alone
        self.finish_at: dict[int, list[str]] = {}  # step number -> ids finishing there
        self.new: list[str] = []
        self.dirty = False


class LoadStepper:
    """The load-mode half of one `MockEngineCore` (the engine thread only touches it)."""

    def __init__(self, rank: int, codec: WireCodec, mode: LoadMode,
                 weight_version: str | None) -> None:
        self.rank = rank
        self.codec = codec
        self.mode = mode
        self.weight_version = weight_version
        self.stats = LoadStats()
        self.clients: dict[int, _Client] = {}
        self.client_of: dict[str, int] = {}
        self.next_due = 0.0
        self._encoder = msgspec.msgpack.Encoder()
        cycle = max(1, mode.token_cycle)
        self._tokens = [self._encoder.encode([mode.token_base + i]) for i in range(cycle)]
        self._joints: list[bytes] = []  # token + non-final tail, per token index
        self._simple: _Client | None = None  # the one client of the common case, see step()
        self._simple_index = 0
        self.fast = False
        self._prefix = self._rest = b""
        self._tail = self._final_tail = b""
        self._build_template()

    # ----------------------------------------------------------------- template

    def _build_template(self) -> None:
        """Cut the message and output templates from the codec's own bytes; keep the fast
        path only if a message built from them decodes to what the codec would send."""
        if not self.codec.profile.is_canonical:
            return
        empty = self.codec.encode_outputs(m.EngineCoreOutputs(
            self.rank, [], None, _TIME_MARK, weight_version=self.weight_version))
        if len(empty) != 1:
            return
        marker = b"\x90\xc0\xcb" + _PACK_F64(_TIME_MARK)
        at = empty[0].find(marker)
        if at < 0:
            return
        self._prefix, self._rest = empty[0][:at], empty[0][at + len(marker):]
        cut = self._cut_output(m.EngineCoreOutput("x", [_TOKEN_MARK]))
        final = self._cut_output(m.EngineCoreOutput("x", [_TOKEN_MARK],
                                                    finish_reason=m.FinishReason.LENGTH))
        if cut is None or final is None:
            return
        self._tail, self._final_tail = cut[1], final[1]
        self._joints = [token + self._tail for token in self._tokens]
        self.fast = True
        probe = m.EngineCoreOutputs(self.rank, [
            m.EngineCoreOutput("probe-a", [self.mode.token_base]),
            m.EngineCoreOutput("probe-b", [self.mode.token_base],
                               finish_reason=m.FinishReason.LENGTH)], None, 2.5,
            weight_version=self.weight_version)
        built = self._message([self._head("probe-a")], [self._head("probe-b")],
                              self._tokens[0], 2.5)
        if built != self.codec.encode_outputs(probe)[0]:
            self.fast = False

    def _cut_output(self, output: m.EngineCoreOutput) -> tuple[bytes, bytes] | None:
        """(head, tail) around the token list of one encoded output."""
        raw = self._encoder.encode(output)
        mark = self._encoder.encode([_TOKEN_MARK])
        at = raw.find(mark)
        if at < 0 or raw.find(mark, at + 1) >= 0:
            return None
        return raw[:at], raw[at + len(mark):]

    def _head(self, rid: str) -> bytes:
        cut = self._cut_output(m.EngineCoreOutput(rid, [_TOKEN_MARK]))
        if cut is None:
            raise ValueError(f"request id {rid!r} cannot be templated")
        return cut[0]

    def _message(self, heads: list[bytes], finals: list[bytes], token: bytes,
                 now: float) -> bytes:
        joint = token + self._tail
        final_joint = token + self._final_tail
        parts = [self._prefix, _array_header(len(heads) + len(finals))]
        if heads:
            parts += [joint.join(heads), joint]
        if finals:
            parts += [final_joint.join(finals), final_joint]
        parts += [b"\xc0\xcb", _PACK_F64(now), self._rest]
        return b"".join(parts)

    # ----------------------------------------------------------------- requests

    @property
    def running(self) -> int:
        return len(self.client_of)

    def add(self, request: m.EngineCoreRequest, now: float) -> None:
        rid = request.request_id
        if rid in self.client_of:
            return  # a duplicate ADD for a running id: ignored, as in scripted mode
        params = request.sampling_params
        tokens = params.max_tokens if params is not None and params.max_tokens else 16
        client = self.clients.get(request.client_index)
        if client is None:
            client = self.clients[request.client_index] = _Client()
            self._simple = None  # a second client: the general step (see _refresh)
        head = self._head(rid) if self.fast else rid.encode()
        client.heads[rid] = head
        client.dirty = True
        # The first step after the ADD is step `steps`; the final output comes tokens-1 later.
        client.finish_at.setdefault(self.stats.steps + max(1, tokens) - 1, []).append(rid)
        self.client_of[rid] = request.client_index
        self.stats.requests_added += 1
        if self.mode.record_steps:
            self.stats.added_at[rid] = now
            client.new.append(rid)
        if self.running == 1:
            self.next_due = max(self.next_due, now)

    def abort(self, rid: str) -> bool:
        """Stop a running request; False if it is not running here."""
        index = self.client_of.pop(rid, None)
        if index is None:
            return False
        client = self.clients[index]
        del client.heads[rid]
        client.dirty = True
        self.stats.requests_aborted += 1
        return True

    def due(self) -> float | None:
        return self.next_due if self.client_of else None

    # ----------------------------------------------------------------- the step

    def _refresh(self, client: _Client) -> None:
        client.heads_list = list(client.heads.values())
        client.pre = self._prefix + _array_header(len(client.heads_list))
        client.dirty = False
        mode = self.mode
        simple = (self.fast and len(self.clients) == 1 and not mode.record_steps
                  and mode.step_cost <= 0 and mode.step_interval <= 0)
        self._simple = client if simple else None
        if simple:
            self._simple_index = next(iter(self.clients))

    def step(self, now: float) -> list[LoadOutgoing]:
        """One engine step: one message per client with running requests."""
        stats = self.stats
        client = self._simple
        if client is not None and not client.dirty and client.heads_list:
            # The common case, kept lean: one client, nothing joins or finishes this step.
            step_no = stats.steps
            if step_no not in client.finish_at:
                stats.steps = step_no + 1
                joint = self._joints[step_no % len(self._joints)]
                stats.messages += 1
                stats.tokens += len(client.heads_list)
                self.next_due = now
                return [LoadOutgoing(self._simple_index, b"".join(
                    (client.pre, joint.join(client.heads_list), joint, b"\xc0\xcb",
                     _PACK_F64(now), self._rest)))]
        return self._step(now)

    def _step(self, now: float) -> list[LoadOutgoing]:
        stats = self.stats
        step_no = stats.steps
        stats.steps += 1
        if self.mode.step_cost > 0:
            _spin(self.mode.step_cost)
        token_index = step_no % len(self._tokens)
        out: list[LoadOutgoing] = []
        for index, client in self.clients.items():
            if not client.heads:
                client.finish_at.pop(step_no, None)
                continue
            if self.mode.record_steps and client.new:
                for rid in client.new:
                    stats.first_sent_at.setdefault(rid, now)
                client.new.clear()
            finals: list[str] = [rid for rid in client.finish_at.pop(step_no, ())
                                 if rid in client.heads]
            if finals:
                final_heads = [client.heads.pop(rid) for rid in finals]
                for rid in finals:
                    del self.client_of[rid]
                client.dirty = True
            else:
                final_heads = []
            if client.dirty:
                self._refresh(client)
            n = len(client.heads_list) + len(final_heads)
            if self.fast:
                frame = self._message(client.heads_list, final_heads,
                                      self._tokens[token_index], now)
            else:
                frame = self._slow_message(client.heads_list, final_heads, token_index, now)
            out.append(LoadOutgoing(index, frame))
            stats.messages += 1
            stats.tokens += n
            stats.requests_finished += len(final_heads)
        if self.mode.record_steps:
            stats.step_times.append(now)
        self.next_due = (now if self.mode.step_interval <= 0
                         else max(self.next_due + self.mode.step_interval, now - 1.0))
        return out

    def _slow_message(self, heads: list[bytes], finals: list[bytes], token_index: int,
                      now: float) -> bytes:
        token = self.mode.token_base + token_index
        outputs = [m.EngineCoreOutput(h.decode(), [token]) for h in heads]
        outputs += [m.EngineCoreOutput(h.decode(), [token], finish_reason=m.FinishReason.LENGTH)
                    for h in finals]
        frames = self.codec.encode_outputs(m.EngineCoreOutputs(
            self.rank, outputs, None, now, weight_version=self.weight_version))
        return frames[0]


def _array_header(n: int) -> bytes:
    """msgpack array header for n elements."""
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big") if n < 0x10000 else b"\xdd" + n.to_bytes(4, "big")


def _spin(seconds: float) -> None:
    """Busy work (not a sleep): a throttled engine's thread stays busy."""
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
