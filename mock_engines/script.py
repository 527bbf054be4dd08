"""The scripting API of mock engines: what an engine answers, when, and how it fails.

Scripts are plain data that tests build before (or while) an engine runs:

* `EngineScript.ready`      -- the ready response (every field settable, or raw bytes).
* `EngineScript.rules`      -- per-request output scripts, matched by prompt, id or order.
* `EngineScript.utilities`  -- per-method utility replies (value, failure, delay, never).
* steps such as `Die()` / `Garbage()` inside an output script fault the engine mid-stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.protocol.wire import messages as m
from mock_engines.loadgen import LoadMode

# ----------------------------------------------------------------- output steps


@dataclass(frozen=True)
class Emit:
    """After `delay` seconds, send `tokens` as one output delta."""

    tokens: Sequence[int]
    delay: float = 0.0


@dataclass(frozen=True)
class Finish:
    """After `delay` seconds, send the final output (optionally with last tokens)."""

    reason: m.FinishReason = m.FinishReason.LENGTH
    tokens: Sequence[int] = ()
    delay: float = 0.0
    stop_reason: int | str | None = None
    error: m.RequestError | None = None
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class Die:
    """After `delay` seconds, send ENGINE_CORE_DEAD on every output socket and go silent."""

    delay: float = 0.0


@dataclass(frozen=True)
class Garbage:
    """After `delay` seconds, send `frames` (not a valid message) on the request's socket."""

    frames: Sequence[bytes] = (b"\xc1not-msgpack",)
    delay: float = 0.0


@dataclass(frozen=True)
class EmitArrays:
    """After `delay`, send `tokens` with a `routed_experts` ndarray of `experts` int32 ids
    per token: at least the zero-copy threshold travels as an aux frame (multipart output),
    smaller ones inline as ext(3). A frontend must decode both, whatever it does with them."""

    tokens: Sequence[int]
    experts: int = 128
    delay: float = 0.0


@dataclass(frozen=True)
class FinishedOnly:
    """After `delay`, retire the request and name it in `finished_requests` with NO final
    output (what a frontend sees when an engine drops a request it never finished)."""

    delay: float = 0.0


@dataclass(frozen=True)
class StatsOnly:
    """After `delay`, send a stats-only message (scheduler_stats, no outputs) from this
    engine, then go on with the request's next step."""

    delay: float = 0.0


Step = Emit | Finish | Die | Garbage | EmitArrays | FinishedOnly | StatsOnly
StepFactory = Callable[[m.EngineCoreRequest], Sequence[Step]]


def stream(tokens: Sequence[int], interval: float = 0.0,
           reason: m.FinishReason = m.FinishReason.LENGTH,
           stop_reason: int | str | None = None) -> list[Step]:
    """One token per step, `interval` apart, the last one carried by the final output."""
    if not tokens:
        return [Finish(reason, delay=interval, stop_reason=stop_reason)]
    steps: list[Step] = [Emit([t], interval) for t in tokens[:-1]]
    steps.append(Finish(reason, [tokens[-1]], interval, stop_reason))
    return steps


def endless(interval: float, first_token: int = 100, count: int = 100_000) -> StepFactory:
    """A stream that never finishes on its own (for drops and aborts): one token every
    `interval` seconds, `count` at most, ids cycling within the tiny vocabulary."""

    def make(_request: m.EngineCoreRequest) -> list[Step]:
        return [Emit([first_token + i % 800], interval) for i in range(count)]

    return make


DEFAULT_MAX_MODEL_LEN = 1024  # default_ready's max_model_len


def default_steps(request: m.EngineCoreRequest,
                  max_model_len: int = DEFAULT_MAX_MODEL_LEN) -> list[Step]:
    """What an unscripted request gets: `max_tokens` tokens 100, 101, ... then LENGTH, at
    most up to the engine's max_model_len, as vLLM's scheduler caps a request whose prompt
    and output reach it (FINISHED_LENGTH_CAPPED, vllm/v1/core/sched/utils.py:115 in check_stop).
    So one ADD can never make the engine build more steps than its model length: a frontend
    asking for max_tokens=10**9 gets a bounded stream, not an exhausted harness."""
    params = request.sampling_params
    n = params.max_tokens if params is not None and params.max_tokens is not None else 16
    room = max_model_len - len(request.prompt_token_ids or ())
    return stream([100 + i % 800 for i in range(max(min(n, room), 1))])


# ----------------------------------------------------------------- request rules


@dataclass(frozen=True)
class Rule:
    """Which requests get which steps: the first matching rule wins."""

    match: Callable[[m.EngineCoreRequest, int], bool]
    steps: Sequence[Step] | StepFactory
    description: str = ""

    def steps_for(self, request: m.EngineCoreRequest) -> list[Step]:
        return list(self.steps(request) if callable(self.steps) else self.steps)


def by_prompt(prompt: Sequence[int], steps: Sequence[Step] | StepFactory) -> Rule:
    want = list(prompt)
    return Rule(lambda r, _i: r.prompt_token_ids == want, steps, f"prompt={want}")


def by_id(request_id: str, steps: Sequence[Step] | StepFactory) -> Rule:
    return Rule(lambda r, _i: r.request_id == request_id, steps, f"id={request_id}")


def by_index(index: int, steps: Sequence[Step] | StepFactory) -> Rule:
    """The `index`-th ADD this engine receives (0-based)."""
    return Rule(lambda _r, i: i == index, steps, f"index={index}")


def any_request(steps: Sequence[Step] | StepFactory) -> Rule:
    return Rule(lambda _r, _i: True, steps, "any")


# ----------------------------------------------------------------- utilities


@dataclass(frozen=True)
class UtilityReply:
    """How an engine answers one utility method."""

    value: Any = None
    failure: str | None = None
    delay: float = 0.0
    never: bool = False  # swallow the call: no reply at all


DEFAULT_UTILITIES: dict[str, UtilityReply] = {
    "is_sleeping": UtilityReply(False),
    "reset_prefix_cache": UtilityReply(True),
    "get_supported_tasks": UtilityReply(["generate"]),
    "reset_mm_cache": UtilityReply(None),
    "is_scheduler_paused": UtilityReply(False),
    "get_weight_version": UtilityReply("default"),
    "wake_up": UtilityReply(True),
    "sleep": UtilityReply(None),
}


# ----------------------------------------------------------------- ready response


def default_ready(rank: int, dp_size: int = 1, **overrides: Any) -> m.EngineCoreReadyResponse:
    """A plausible ready response for a tiny CPU model; any field can be overridden."""
    fields: dict[str, Any] = dict(
        max_model_len=DEFAULT_MAX_MODEL_LEN, num_gpu_blocks=1000, block_size=16,
        dp_stats_address=None,
        dtype="bfloat16", vllm_version="0.33.0", world_size=1, data_parallel_size=dp_size,
        tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_rank=rank, max_num_seqs=256, max_num_batched_tokens=2048,
        instance_id=f"mock-{rank}", supports_lora=False, max_loras=0,
        kv_cache_size_tokens=16000, kv_cache_max_concurrency=15.6,
        effective_attention_block_size=16,
    )
    fields.update(overrides)
    return m.EngineCoreReadyResponse(**fields)


# ----------------------------------------------------------------- the script


@dataclass
class EngineScript:
    """Everything scriptable about one mock engine (one DP rank)."""

    ready: m.EngineCoreReadyResponse | None = None
    # Raw bytes sent instead of the encoded ready response (malformed-ready cases).
    ready_payload: bytes | None = None
    register: bool = True  # False: never send the ready frame
    # Seconds to wait after connecting before registering (orders the ready frames).
    ready_delay: float = 0.0
    # Register under another rank's identity (unexpected or duplicate engine ids).
    register_as: int | None = None
    # Send the ready frame this many times back to back (a registration repeated on one
    # connection; a second connection with the same identity is dropped by the ROUTER).
    ready_repeats: int = 1
    # Handshake mode: False never sends the handshake READY (after HELLO, INIT, registration).
    handshake_ready: bool = True
    # Handshake mode: the READY sent this many times back to back (a duplicate READY).
    handshake_ready_repeats: int = 1
    # Handshake mode: False never connects to the handshake socket at all (no HELLO, not
    # even a connection; compare hello_repeats=0: connected, silent).
    hello: bool = True
    # Handshake missteps: raw bytes sent instead of HELLO (undecodable / invalid), HELLO sent
    # this many times back to back (duplicate HELLO), a READY sent before the HELLO.
    hello_payload: bytes | None = None
    hello_repeats: int = 1
    ready_before_hello: bool = False
    # Handshake mode with a frontend-owned coordinator: seconds between connecting to the
    # coordinator and sending the subscription (a slow engine; the READY gate must wait).
    coordinator_subscribe_delay: float = 0.0
    # Handshake READY's `parallel_config_hash` (a real engine's is its config's hash; a MoE
    # frontend checks it, utils.py:1565-1580): set by drivers that know the frontend's config.
    parallel_config_hash: str | None = None
    rules: list[Rule] = field(default_factory=list)
    default: StepFactory = default_steps
    utilities: dict[str, UtilityReply] = field(default_factory=dict)
    # Report finished/aborted ids in `finished_requests` (real engines do in internal-LB DP).
    report_finished: bool = False
    weight_version: str | None = "default"
    # Attach PrefillStats to each request's first output, as vLLM's scheduler always does.
    prefill_stats: bool = True
    # Emulate `vllm serve`'s default log_stats=True: request events on the first output,
    # SchedulerStats on step messages, and a stats-only message after the engine goes idle.
    log_stats: bool = False
    # Load from elsewhere (other clients' requests) as (waiting, running): added to what the
    # coordinator publishes for this engine and to its scheduler_stats (log_stats).
    reported_load: tuple[int, int] = (0, 0)
    # True: reported_load appears only in scheduler_stats, never in the coordinator's counts.
    load_in_stats_only: bool = False
    # Load-generator mode (benchmarks, mock_engines/loadgen.py): every request streams
    # max_tokens one-token outputs, all running requests batched in one message per step;
    # `rules` and `default` are not consulted.
    load: LoadMode | None = None
    # False (benchmarks): the transcript keeps counters, not records (conformance: True).
    retain_transcript: bool = True

    def steps_for(self, request: m.EngineCoreRequest, index: int) -> list[Step]:
        for rule in self.rules:
            if rule.match(request, index):
                return rule.steps_for(request)
        if self.default is default_steps:  # capped at this engine's advertised length
            return default_steps(request, self.ready.max_model_len if self.ready is not None
                                 else DEFAULT_MAX_MODEL_LEN)
        return list(self.default(request))

    def utility_reply(self, method: str) -> UtilityReply:
        if method in self.utilities:
            return self.utilities[method]
        if method in DEFAULT_UTILITIES:
            return DEFAULT_UTILITIES[method]
        return UtilityReply(failure=f"Call to {method} method failed: "
                                    f"not scripted on this mock engine")
