"""The one interface every frontend under test is driven through, and what it may use of
the engines (`EngineSide`).

Conformance cases are written against `FrontendDriver` only, so the same case runs against
our reference frontend, the real Rust and Python frontends of vLLM, and any port speaking
the subprocess driver protocol. A driver declares `capabilities`; a case that needs one the
driver lacks is graded UNSUPPORTED instead of passing silently.
"""

from __future__ import annotations

import abc
import array
import asyncio
import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from harness.protocol.timing import DEFAULT as DEFAULT_TIMESCALE
from harness.protocol.timing import Timescale

# What a frontend driver may use of the engines it is started against. Three kinds of
# engine groups stand behind a frontend (the scriptable mock engines, vLLM's real engine
# core behind a recording proxy, and test-only compositions of both), and every driver
# starts against any of them: drivers type against these protocols, never a concrete group,
# so a new engine kind is one class that fits them.


class EngineEndpoint(Protocol):
    """One engine as a driver sees it: its DP rank (its identity on the wire)."""

    @property
    def rank(self) -> int: ...


class EngineSide(Protocol):
    """An engine group: which start-up the case asked for, and how to start the engines.

    `handshake`: the frontend must own HELLO / INIT / READY (then `start_handshake`), else
    the frontend binds and the engines connect (`start_bootstrapped`). `coordinated`: the
    frontend must also own a wave-coordinating DP coordinator and name it in INIT. A driver
    that cannot do what these ask refuses to start; it never falls back.
    """

    handshake: bool
    coordinated: bool

    @property
    def engines(self) -> Sequence[EngineEndpoint]: ...

    @property
    def stats_address(self) -> str | None:
        """The DP-stats XPUB a frontend subscribes to (None: no coordinator)."""
        ...

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Connect every engine to the addresses the frontend bound (one pair per client)."""
        ...

    def start_handshake(self, address: str, *, local: bool = True, headless: bool = False,
                        timeout: float = 30.0) -> None:
        """Each engine does HELLO / INIT / READY against the frontend's handshake ROUTER."""
        ...


class Capability(str, enum.Enum):
    """What a driver can do or observe through its frontend's surface."""

    GENERATE = "generate"  # start requests and read their token streams
    DROP = "drop"  # the client goes away mid-stream (auto-abort path)
    ABORT = "abort"  # explicit abort of request ids
    IS_SLEEPING = "is_sleeping"
    RESET_PREFIX_CACHE = "reset_prefix_cache"
    DP_RANK = "dp_rank"  # honour an explicit data_parallel_rank per request
    STOP_STRINGS = "stop_strings"  # frontend-side stop-string detection
    MAX_MODEL_LEN = "max_model_len"  # observed_config().max_model_len is reported
    BLOCK_SIZE = "block_size"
    NUM_GPU_BLOCKS = "num_gpu_blocks"
    REQUEST_ERRORS = "request_errors"  # per-request ERROR surfaces as a stream error
    ENGINE_DEATH = "engine_death"  # ENGINE_CORE_DEAD surfaces as errors
    # call_utility(method, args): engine utilities as the frontend exposes them to its
    # users. A method that is not on the driver's surface raises UnsupportedOperation.
    CALL_UTILITY = "call_utility"
    # Cancelling the task awaiting call_utility reaches the frontend's own cancel path
    # (in-process cancellation, a `cancel` command, a closed HTTP connection).
    CANCEL_UTILITY = "cancel_utility"
    CLIENT_REQUEST_ID = "client_request_id"  # generate(request_id=...) is honoured
    PASS_THROUGH = "pass_through"  # generate(params=...) fields reach the frontend
    # open_session / continue_session / close_session: a streaming-input session (vLLM's
    # resumable EngineCoreRequest; AsyncLLM.generate() with an async generator of inputs).
    STREAMING_INPUT = "streaming_input"
    # generate(params={"prompt_embeds": rows}) puts a float32 tensor on the ADD (a large
    # one travels as an aux frame).
    INPUT_TENSORS = "input_tensors"
    # The ADD carries the client's sampling (generate(sampling=...), GREEDY by default) and
    # the model's EOS id. In-process drivers know both; a driver program learns them from
    # protocol version 2 (`generate.sampling`, `init.model`), so version 1 lacks this.
    SAMPLING = "sampling"


ALL_CAPABILITIES = frozenset(Capability)


class FrontendError(Exception):
    """A call on the frontend under test failed (the frontend's answer, not a harness bug)."""


class StartupError(FrontendError):
    """The frontend did not come up against the engine group (bounded)."""


class StartupHang(FrontendError):
    """The frontend neither served nor refused within its startup bound: it was still
    waiting (a wait with no bound of its own), so the driver aborted the attempt. Not a
    StartupError: a case expecting a bounded startup failure grades it by its level."""


class UnsupportedOperation(FrontendError):
    """The driver cannot perform this operation; cases turn it into UNSUPPORTED."""


class DriverFault(Exception):
    """The driver itself failed (a crashed program, a broken protocol), not the frontend
    behind it: graded ERROR whatever the case was checking."""


class CommandTimeout(TimeoutError):
    """A driver program left one command unanswered past its bound (graded TIMEOUT); the
    message names the command and its id."""


def check_generate_options(driver: str, request_id: str | None,
                           params: Mapping[str, Any] | None, *, request_ids: bool,
                           pass_through: Sequence[str]) -> None:
    """Refuse (UnsupportedOperation) what a driver cannot honour instead of dropping it."""
    if request_id is not None and not request_ids:
        raise UnsupportedOperation(f"{driver}: client-chosen request ids are not supported")
    unknown = sorted(set(params or {}) - set(pass_through))
    if unknown:
        raise UnsupportedOperation(f"{driver}: cannot pass through {unknown}")


# Request fields a frontend must forward to the engine unchanged, by generate(params=...)
# key. kv_transfer_params / ec_transfer_params travel in SamplingParams.extra_args
# (vllm/v1/request.py:118-125); cache_salt is EngineCoreRequest field 7.
PASS_THROUGH_FIELDS = ("kv_transfer_params", "ec_transfer_params", "cache_salt")
# generate(params=...) keys that carry tensors (Capability.INPUT_TENSORS): "prompt_embeds" is
# a list of rows of floats, sent as EngineCoreRequest.prompt_embeds (field 9, float32).
TENSOR_FIELDS = ("prompt_embeds",)


def prompt_embeds_bytes(rows: Sequence[Sequence[float]]) -> tuple[tuple[int, int], bytes]:
    """(shape, native-endian float32 bytes) of a prompt_embeds value; ValueError if ragged."""
    width = len(rows[0]) if rows else 0
    if any(len(row) != width for row in rows):
        raise ValueError("prompt_embeds rows must all have the same length")
    flat = [float(v) for row in rows for v in row]
    return (len(rows), width), array.array("f", flat).tobytes()


@dataclass(frozen=True)
class Sampling:
    """The sampling a client asks for with generate().

    Cases ask for GREEDY, the default: temperature 0, the model's EOS ending the sequence.
    vLLM's frontends copy these onto the ADD's SamplingParams with the model's EOS id
    (streaming.add_fields.*); a driver program of protocol version 2 receives them
    explicitly (`generate.sampling`), so a port never has to guess what the client meant.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut (vLLM's SamplingParams default)
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()  # besides the model's EOS id

    def to_json(self) -> dict[str, Any]:
        """Every field, explicitly (the driver protocol's `sampling` object)."""
        fields = dataclasses.asdict(self)
        fields["stop_token_ids"] = list(self.stop_token_ids)
        return fields

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Sampling:
        """The inverse of to_json; a missing key takes its default. ValueError names an
        unknown key or a value of the wrong type (nothing is silently dropped)."""
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown sampling field(s) {unknown}")
        fields = dict(value)
        for name in ("temperature", "top_p", "min_p"):
            if name in fields:
                fields[name] = _json_number(name, fields[name], float)
        for name in ("top_k", "min_tokens"):
            if name in fields:
                fields[name] = _json_number(name, fields[name], int)
        if fields.get("seed") is not None:
            fields["seed"] = _json_number("seed", fields["seed"], int)
        if type(fields.get("ignore_eos", False)) is not bool:
            raise ValueError(f"sampling field 'ignore_eos': {fields['ignore_eos']!r} is not "
                             f"a boolean")
        ids = fields.get("stop_token_ids", [])
        if not isinstance(ids, list) or any(type(t) is not int for t in ids):
            raise ValueError(f"sampling field 'stop_token_ids': {ids!r} is not a list of "
                             f"token ids")
        fields["stop_token_ids"] = tuple(ids)
        return cls(**fields)


GREEDY = Sampling()


def _json_number(name: str, value: Any, kind: type[int] | type[float]) -> Any:
    """`value` as `kind` when JSON gave a number of that kind (an int serves as a float;
    a bool is no number)."""
    if not (type(value) is int or (kind is float and type(value) is float)):
        raise ValueError(f"sampling field {name!r}: {value!r} is not {kind.__name__}")
    return kind(value)


@dataclass
class ObservedConfig:
    """Config the frontend derived from the ready responses (None: not observable)."""

    max_model_len: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None


@dataclass
class StreamHandle:
    """One generate() call as the client sees it; drivers fill it, cases read it."""

    prompt_token_ids: list[int]
    request_id: str | None = None  # engine-facing id, where the driver knows it
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop", "length", "abort", "error", "repetition"
    error: str | None = None
    chunks: int = 0
    dropped: bool = False
    first_output: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Called as observer(event, fields) on "output" and "finished" (driver programs relay it).
    observer: Callable[[str, dict[str, Any]], None] | None = None

    @property
    def ended(self) -> bool:
        return self.done.is_set()

    def add_tokens(self, tokens: Sequence[int], text: str = "") -> None:
        self.tokens.extend(tokens)
        self.text += text
        self.chunks += 1
        self.first_output.set()
        if self.observer is not None:
            self.observer("output", {"tokens": list(tokens), "text": text})

    def finish(self, reason: str | None = None, error: str | None = None) -> None:
        """End the stream; the first ending wins, later ones are ignored."""
        if self.done.is_set():
            return
        self.finish_reason = reason
        self.error = error
        self.first_output.set()
        self.done.set()
        if self.observer is not None:
            self.observer("finished", {"finish_reason": reason, "error": error})

    async def wait(self, timeout: float) -> StreamHandle:
        """Until the stream ends; raises TimeoutError after `timeout` seconds."""
        await asyncio.wait_for(self.done.wait(), timeout)
        return self

    async def wait_first(self, timeout: float) -> StreamHandle:
        await asyncio.wait_for(self.first_output.wait(), timeout)
        return self


class FrontendDriver(abc.ABC):
    """Start a frontend against an engine group and drive it like a client would."""

    name: str = "driver"
    capabilities: frozenset[Capability] = ALL_CAPABILITIES
    # Every bound the driver waits on is scaled by this factor (harness/protocol/timing.py); the
    # registry sets the run's, so a driver never reads it from the environment.
    timescale: Timescale = DEFAULT_TIMESCALE

    def supports(self, *needed: Capability) -> bool:
        return all(c in self.capabilities for c in needed)

    def with_timescale(self, timescale: Timescale) -> Self:
        """This driver, every bound it waits on scaled by `timescale` (the run's)."""
        self.timescale = timescale
        return self

    def scaled(self, seconds: float) -> float:
        """`seconds` times this driver's time-scale factor."""
        return self.timescale.scaled(seconds)

    @abc.abstractmethod
    async def start(self, group: EngineSide, timeout: float) -> None:
        """Bind (or own the handshake), start the group's engines, wait until serving."""

    @abc.abstractmethod
    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        """Start one request; returns at once with a handle that fills as outputs arrive.

        `request_id` is a client-chosen id (None: the driver picks a fresh one); `params`
        holds pass-through fields (PASS_THROUGH_FIELDS); `sampling` the client's sampling
        (None: GREEDY). A driver that cannot honour any of them raises
        UnsupportedOperation rather than silently dropping it.
        """

    @abc.abstractmethod
    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        """The client goes away from these streams, all at once (no explicit abort)."""

    @abc.abstractmethod
    async def abort(self, request_ids: Sequence[str]) -> None:
        """Explicitly abort these ids (engine-facing ids, unknown ones included)."""

    @abc.abstractmethod
    async def is_sleeping(self) -> bool:
        """The frontend's aggregated answer; raises FrontendError if it refuses one."""

    @abc.abstractmethod
    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        """The frontend's aggregated answer; raises FrontendError on failure."""

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        """Call engine utility `method` with wire `args` through the frontend's user surface.

        Returns the frontend's aggregated answer; FrontendError when it fails or refuses
        (an engine failure, engines disagreeing). Drivers without a general utility surface
        raise UnsupportedOperation naming the method. Cancelling the awaiting task is the
        client giving up on the call (Capability.CANCEL_UTILITY).
        """
        raise UnsupportedOperation(f"{self.name}: call_utility({method!r}) is not on this "
                                   f"driver's surface")

    async def open_session(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                           data_parallel_rank: int | None = None,
                           sampling: Sampling | None = None) -> StreamHandle:
        """Start a streaming-input session with its first input segment (`sampling` as for
        generate, kept by every continuation); the handle stays open across segment
        finishes until the session is closed, aborted or fails."""
        raise UnsupportedOperation(f"{self.name}: streaming-input sessions are not on this "
                                   f"driver's surface")

    async def continue_session(self, handle: StreamHandle, prompt_token_ids: Sequence[int],
                               max_tokens: int) -> None:
        """Send the session's next input segment (the same request continues)."""
        raise UnsupportedOperation(f"{self.name}: streaming-input sessions are not on this "
                                   f"driver's surface")

    async def close_session(self, handle: StreamHandle) -> None:
        """End the session's input: no more segments (the stream ends once the engine has
        finished the last one)."""
        raise UnsupportedOperation(f"{self.name}: streaming-input sessions are not on this "
                                   f"driver's surface")

    @abc.abstractmethod
    async def observed_config(self) -> ObservedConfig:
        """What the frontend derived from the ready responses."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the frontend and release everything it holds (bounded, idempotent)."""

    def teardown_notes(self) -> list[str]:
        """What shutdown had to clean up after the frontend (reported on the case)."""
        return []

    def fault(self) -> str | None:
        """A fault of the driver itself seen so far (a crashed program, a stray stdout line):
        it makes the case ERROR whatever the case concluded from what it saw."""
        return None

    def late_fault(self) -> str | None:
        """A fault found after the case was graded that is still the frontend's behaviour (a
        line the program wrote before teardown or before it answered `shutdown`, e.g. a badly
        shaped one right after a stream's last event): it makes the case ERROR too."""
        return None

    def unanswered(self) -> list[str]:
        """Commands the driver was still waiting on when the case gave up (for TIMEOUT)."""
        return []

    def diagnostics(self) -> str:
        """Logs worth attaching to a failing verdict (e.g. a subprocess's stderr tail)."""
        return ""
