"""Stateful fuzzing of the frontend role: random interleavings, invariants after every step.

`FrontendMachine` is a hypothesis state machine that drives a frontend core (the reference,
or a mutant through `core_factory`) against 1-3 mock engines with random interleavings of
generate (optionally with an explicit data_parallel_rank), drop, explicit abort, engine-side
finish (scripted, or triggered on a held request), utility calls with scripted per-engine
answers, and engine death. A suite that no random interleaving can break proves little;
this is where the conformance cases' hand-picked orderings get company.

Two transports, one model:

* ``sansio`` (default, fast): `ReferenceFrontendCore` and `MockEngineCore`s wired directly.
  Every frame still goes through the real codec and both real state machines; the harness
  plays the sockets, so *delivery itself* is a rule -- which engine's frames arrive next,
  when the abort drain pass runs, when virtual time advances -- and hypothesis explores races
  (a drop racing the engine's final output, an abort racing a death) deterministically.
* ``sockets``: `ReferenceFrontend` + `EngineGroup` on real ZMQ sockets, one asyncio loop per
  example; interleavings come from real timing and every wait is bounded.

The model never asks the core what it did. A probe wraps the core's boundary methods
(`add_request`, `abort`, `queue_drop`, `drain_drops`, `start_utility`, `on_output`) and
decodes, with the real codec, exactly the frames the core hands out and takes in: the
frontend's wire boundary minus the socket, so the model is exact in both transports.

On failure the shrunk step sequence is written as a JSON replay file (`write_replay`, into
``reports/stateful/`` or ``$COREWIRE_STATEFUL_DIR``); `replay()` re-runs it deterministically
and `promote()` copies it into ``fixtures/regressions/`` (replayed by
tests/test_regressions.py). Command line: ``python -m harness.stateful run|replay|promote``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import importlib
import json
import math
import os
import random
import re
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import hypothesis
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.frontends.driver import FrontendError, StartupError, StreamHandle
from harness.frontends.reference.core import PendingUtility, ReferenceFrontendCore, Send
from harness.frontends.reference.frontend import CoreFactory, ReferenceFrontend
from harness.timing import scaled
from harness.transport.endpoints import PrivateIpcDir
from harness.transport.sockets import engine_identity
from harness.vocab import detokenize, token_text
from harness.wire import DEFAULT_CODEC, AbortRequests, AddRequest, EngineDead, ProtocolError
from harness.wire import messages as m
from mock_engines.engine import ALL_CLIENTS, MockEngineCore
from mock_engines.group import EngineGroup
from mock_engines.script import (
    Die,
    Emit,
    EngineScript,
    Finish,
    Step,
    UtilityReply,
    default_ready,
    default_steps,
)
from mock_engines.transcript import Record

T = TypeVar("T")
TRANSPORTS: tuple[str, ...] = ("sansio", "sockets")

REPLAY_FORMAT = "corewire-stateful-replay/1"
STATEFUL_DIR_ENV = "COREWIRE_STATEFUL_DIR"
EXAMPLES_ENV = "COREWIRE_STATEFUL_EXAMPLES"
SEED_ENV = "COREWIRE_STATEFUL_SEED"
STOP_STRINGS_ENV = "COREWIRE_STATEFUL_STOP_STRINGS"  # "0": requests never carry stop strings
DEFAULT_REPLAY_DIR = Path("reports") / "stateful"
REGRESSIONS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "regressions"

DEFAULT_EXAMPLES = 200
DEFAULT_STEPS = 50
NIGHTLY = "nightly"
# Selected with HYPOTHESIS_PROFILE=nightly or pytest --hypothesis-profile=nightly (the latter
# needs this module imported before hypothesis configures: harness.replay_plugin does that).
hypothesis.settings.register_profile(
    NIGHTLY, max_examples=5000, stateful_step_count=100, deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck))

SETTLE_ROUNDS = 2000  # sans-IO: delivery rounds before "does not quiesce" is a hang
PUMP_ROUNDS = 200  # sans-IO: rounds a utility call may take before the transport's timeout

# Every invariant the machine checks, by the name replay files and failures carry.
INVARIANTS: dict[str, str] = {
    "no_empty_abort": "an ABORT frame always carries at least one request id",
    "abort_exactly_once": "each dropped or aborted live request is aborted exactly once",
    "abort_at_owner": "an ABORT goes to the engine that received the request's ADD",
    "no_abort_after_finish": "no ABORT for an id whose final output the frontend had seen",
    "no_abort_for_unknown_ids": "no ABORT for ids the frontend never sent",
    "no_unrequested_abort": "no ABORT for a live request nobody dropped or aborted",
    "abort_coalesced": "one abort pass sends at most one ABORT frame per engine",
    "routing": "ADDs go to a known engine; an explicit data_parallel_rank is honoured, "
               "an invalid one rejected",
    "stream_state": "a live stream stays open; a finished one ends with the right reason",
    "stream_tokens": "a stream carries exactly the tokens its engine sent while it was live",
    "stream_text": "a stream's text is its tokens detokenized, cut before a matched stop string",
    "config_aggregation": "max_model_len is the engines' minimum, num_gpu_blocks their sum, "
                          "block_size theirs",
    "stream_ends_once": "a stream ends exactly once and gets no output after its end",
    "utility_aggregation": "is_sleeping is the engines' consensus, reset_prefix_cache their "
                           "AND; a failing engine fails the call",
    "fail_fast_after_death": "after ENGINE_CORE_DEAD no new work is sent and calls fail",
    "no_spurious_errors": "a call on a healthy frontend with valid arguments succeeds",
    "no_call_hangs": "every call returns, and the system quiesces, within a bound",
    "valid_frames": "every frame the frontend sends decodes under the protocol profile",
    "startup": "the frontend registers every engine",
    "unexpected_exception": "the frontend raised something other than FrontendError",
}


class InvariantViolation(AssertionError):
    """A protocol invariant broke; `invariant` is its stable name (see INVARIANTS)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant {invariant!r} violated: {detail}")
        self.invariant = invariant
        self.detail = detail
        self.failed_step: int | str | None = None  # step index, or "teardown"


# --------------------------------------------------------------------------- the model

LIVE = ("open", "dropped")
STOPPED = "stop_pending"  # ended at a frontend-side stop string; the engine is owed an ABORT


@dataclass(eq=False)
class RequestModel:
    """What the frontend has been told about one request, from the wire alone."""

    index: int
    rid: str
    owner: int | None  # rank whose identity the ADD was sent to
    dp_rank: int | None
    handle: StreamHandle
    stop: str | None = None  # frontend-side stop string
    # open | dropped (queued for the drain pass) | stop_pending | finished | aborted |
    # drained | dead
    state: str = "open"
    reason: str | None = None  # the finish_reason the stream must end with once terminal
    tokens: list[int] = field(default_factory=list)  # handed to the frontend while live
    aborts_sent: int = 0
    events: list[str] = field(default_factory=list)  # the handle's observer events

    def expected_text(self) -> str:
        """Detokenized text, cut before the stop string once it matched (vLLM's default)."""
        text = detokenize(self.tokens)
        if self.stop is not None and self.reason == "stop":
            pos = text.find(self.stop)
            if pos >= 0:
                return text[:pos]
        return text

    def summary(self) -> dict[str, Any]:
        return {"rid": self.rid, "owner": self.owner, "dp_rank": self.dp_rank, "stop": self.stop,
                "state": self.state, "expected_reason": self.reason,
                "handle_reason": self.handle.finish_reason, "handle_ended": self.handle.ended,
                "tokens": self.tokens, "handle_tokens": list(self.handle.tokens),
                "aborts_sent": self.aborts_sent}


class WireModel:
    """Expected state of every stream and every ABORT, fed by the core probe's events."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.identities = {engine_identity(r): r for r in self.ranks}
        self.requests: dict[str, RequestModel] = {}
        self.order: list[RequestModel] = []
        self.fe_dead = False  # ENGINE_CORE_DEAD has been handed to the frontend core
        self.drop_queue: list[str] = []
        self.violations: list[InvariantViolation] = []
        self.sent_frames = 0  # frames the core handed out for a known engine identity
        self.delivered = 0  # engine messages handed to the core

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(InvariantViolation(invariant, detail))

    # ------------------------------------------------------------ probe events

    def on_add(self, handle: StreamHandle, send: Send, dp_rank: int | None,
               stop: Sequence[str] | None = None) -> None:
        identity, frames = send
        owner = self.identities.get(bytes(identity))
        if self.fe_dead:
            self.fail("fail_fast_after_death", "generate was accepted after ENGINE_CORE_DEAD "
                      "reached the frontend")
        try:
            message = DEFAULT_CODEC.decode_engine_input(frames)
        except ProtocolError as exc:
            self.fail("valid_frames", f"ADD does not decode: {exc}")
            return
        if not isinstance(message, AddRequest):
            self.fail("valid_frames", f"generate sent {type(message).__name__}, not an ADD")
            return
        rid = message.request.request_id
        if owner is None:
            self.fail("routing", f"ADD {rid} sent to unknown identity {bytes(identity).hex()}")
        else:
            self.sent_frames += 1
        if dp_rank is not None and owner != dp_rank:
            self.fail("routing", f"ADD {rid} with data_parallel_rank={dp_rank} went to "
                      f"engine {owner}")
        if dp_rank is not None and dp_rank not in self.ranks:
            self.fail("routing", f"ADD {rid} accepted with data_parallel_rank={dp_rank}, "
                      f"not one of the engines {self.ranks}")
        if rid in self.requests:
            self.fail("routing", f"request id {rid} reused for a second ADD")
        rec = RequestModel(len(self.order), rid, owner, dp_rank, handle,
                           stop[0] if stop else None)
        self.requests[rid] = rec
        self.order.append(rec)
        previous = handle.observer

        def observe(event: str, fields: dict[str, Any]) -> None:
            rec.events.append(event)
            if previous is not None:
                previous(event, fields)

        handle.observer = observe

    def begin_abort(self, request_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """(ids an explicit abort must carry: the live ones; ids it may carry: streams that
        ended at a stop string, whose ABORT is owed either here or by the drain pass)."""
        if self.fe_dead:
            return [], []
        asked = [self.requests[rid] for rid in dict.fromkeys(request_ids) if rid in self.requests]
        return ([rec.rid for rec in asked if rec.state in LIVE],
                [rec.rid for rec in asked if rec.state == STOPPED])

    def end_abort(self, due: Sequence[str], optional: Sequence[str],
                  sends: Sequence[Send]) -> None:
        carried = self.check_sends("abort", sends, due, optional)
        for rid in due:
            rec = self.requests[rid]
            rec.state, rec.reason = "aborted", "abort"
        for rid in optional:
            if carried[rid]:
                self.requests[rid].state = "aborted"  # the stream keeps its "stop"

    def on_drop(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            rec = self.requests.get(rid)
            if rec is not None and rec.state == "open":
                rec.state = "dropped"
            self.drop_queue.append(rid)

    def begin_drain(self) -> list[str]:
        """Ids a drain pass must carry: dropped and still live, or stopped at a stop string
        (the queue never nears the 1024-id pass limit)."""
        return [rid for rid in dict.fromkeys(self.drop_queue)
                if rid in self.requests and self.requests[rid].state in ("dropped", STOPPED)]

    def end_drain(self, due: Sequence[str], sends: Sequence[Send]) -> None:
        self.check_sends("drain", sends, due)
        for rid in due:
            rec = self.requests[rid]
            rec.state, rec.reason = "drained", ("stop" if rec.state == STOPPED else "abort")
        self.drop_queue.clear()

    def on_deliver(self, frames: Sequence[bytes]) -> None:
        """One engine message reaches the frontend core (before the core processes it)."""
        self.delivered += 1
        if self.fe_dead:
            return
        message = DEFAULT_CODEC.decode_outputs(frames)  # our engines only send valid frames
        if isinstance(message, EngineDead):
            self.fe_dead = True
            for rec in self.order:
                if rec.state in LIVE:
                    rec.state, rec.reason = "dead", "error"
                elif rec.state == STOPPED:
                    rec.state = "dead"  # the stream already ended with "stop"
            self.drop_queue.clear()
            return
        for output in message.outputs:
            target = self.requests.get(output.request_id)
            if target is None:
                continue
            if target.state == STOPPED:
                if output.finish_reason is not None:  # the engine finished it: no ABORT owed
                    target.state = "finished"
                continue
            if target.state not in LIVE:
                continue
            if _extend_until_stop(target, output.new_token_ids):
                # vLLM: a stop string ends the stream with "stop"; the engine is aborted
                # unless this very output was the request's final one there.
                target.reason = "stop"
                if output.finish_reason is not None:
                    target.state = "finished"
                else:
                    target.state = STOPPED
                    self.drop_queue.append(target.rid)
            elif output.finish_reason is not None:
                target.state, target.reason = "finished", str(output.finish_reason)

    def check_sends(self, context: str, sends: Sequence[Send], due: Sequence[str] | None,
                    optional: Sequence[str] = ()) -> collections.Counter[str]:
        """Check every frame a core call handed out; returns how often each id was aborted.

        `due`: ids this abort pass must carry (None: not an abort pass); `optional`: ids it
        may carry once.
        """
        due_set = set(due or ()) | set(optional)
        frames_per_rank: collections.Counter[int | None] = collections.Counter()
        carried: collections.Counter[str] = collections.Counter()
        for identity, frames in sends:
            rank = self.identities.get(bytes(identity))
            if rank is not None:
                self.sent_frames += 1
            if self.fe_dead:
                self.fail("fail_fast_after_death", f"{context} sent a frame to engine {rank} "
                          "after ENGINE_CORE_DEAD reached the frontend")
            try:
                message = DEFAULT_CODEC.decode_engine_input(frames)
            except ProtocolError as exc:
                self.fail("valid_frames", f"{context} sent an undecodable frame: {exc}")
                continue
            if not isinstance(message, AbortRequests):
                continue
            frames_per_rank[rank] += 1
            if not message.request_ids:
                self.fail("no_empty_abort", f"{context} sent an empty ABORT frame to "
                          f"engine {rank}")
            for rid in message.request_ids:
                carried[rid] += 1
                self._check_aborted_id(context, rid, rank, rid in due_set, carried[rid])
        if due is None:
            return carried
        for rank, count in frames_per_rank.items():
            if count > 1:
                self.fail("abort_coalesced", f"one {context} pass sent {count} ABORT frames "
                          f"to engine {rank}")
        for rid in due:
            if carried[rid] == 0:
                self.fail("abort_exactly_once", f"{context}: live request {rid} "
                          f"(engine {self.requests[rid].owner}) was not aborted")
        return carried

    def _check_aborted_id(self, context: str, rid: str, rank: int | None, due: bool,
                          count: int) -> None:
        rec = self.requests.get(rid)
        if rec is None:
            self.fail("no_abort_for_unknown_ids", f"{context} aborted {rid!r} at engine "
                      f"{rank}, an id the frontend never sent")
            return
        rec.aborts_sent += 1
        if due:
            if rank != rec.owner:
                self.fail("abort_at_owner", f"{context} aborted {rid} at engine {rank}; "
                          f"its ADD went to engine {rec.owner}")
            if count > 1:
                self.fail("abort_exactly_once", f"{context} carried {rid} {count} times")
        elif rec.state == "finished":
            self.fail("no_abort_after_finish", f"{context} aborted {rid} at engine {rank} "
                      f"after its final output ({rec.reason}) reached the frontend")
        elif rec.state in ("aborted", "drained"):
            self.fail("abort_exactly_once", f"{context} aborted {rid} again (already "
                      f"{rec.state})")
        elif rec.state == "dead":
            self.fail("fail_fast_after_death", f"{context} aborted {rid} after death")
        else:
            self.fail("no_unrequested_abort", f"{context} aborted {rid} ({rec.state}) "
                      "although it was not part of this call")

    # ------------------------------------------------------------ checks

    def check_streams(self) -> None:
        for rec in self.order:
            h = rec.handle
            if rec.state == "open":
                if h.ended:
                    self.fail("stream_state", f"{rec.rid} ended ({h.finish_reason}: {h.error}) "
                              "while it was live at the frontend")
            elif rec.state == "dropped":
                if h.ended and h.finish_reason != "abort":
                    self.fail("stream_state", f"dropped {rec.rid} ended with "
                              f"{h.finish_reason!r} before any final output")
            elif not h.ended:
                self.fail("stream_state", f"{rec.rid} is {rec.state} but its stream never "
                          f"ended (expected {rec.reason!r})")
            elif h.finish_reason != rec.reason:
                self.fail("stream_state", f"{rec.rid} is {rec.state}: stream ended with "
                          f"{h.finish_reason!r}, expected {rec.reason!r}")
            if list(h.tokens) != rec.tokens:
                self.fail("stream_tokens", f"{rec.rid}: stream has {list(h.tokens)}, the "
                          f"engine sent {rec.tokens} while it was live")
            elif not _text_agrees(h.text, rec.expected_text(), rec.stop, h.ended):
                self.fail("stream_text", f"{rec.rid}: stream text {h.text!r}, expected "
                          f"{rec.expected_text()!r} (stop={rec.stop!r})")
            finished = rec.events.count("finished")
            if finished > 1 or (finished and rec.events[-1] != "finished"):
                self.fail("stream_ends_once", f"{rec.rid}: stream events {rec.events}")

    def check_settled(self, received: Sequence[tuple[int, list[str]]],
                      protocol_errors: Sequence[tuple[int, str]]) -> None:
        """After quiescence: what the engines received, against what was owed."""
        counts: collections.Counter[tuple[int, str]] = collections.Counter()
        for rank, ids in received:
            if not ids:
                self.fail("no_empty_abort", f"engine {rank} received an empty ABORT frame")
            for rid in ids:
                counts[(rank, rid)] += 1
                if rid not in self.requests:
                    self.fail("no_abort_for_unknown_ids", f"engine {rank} received an ABORT "
                              f"for {rid!r}, never sent by the frontend")
        for rank, error in protocol_errors:
            self.fail("valid_frames", f"engine {rank} could not decode a frame: {error}")
        for rec in self.order:
            at_owner = counts[(rec.owner, rec.rid)] if rec.owner is not None else 0
            elsewhere = sum(counts[(r, rec.rid)] for r in self.ranks if r != rec.owner)
            want = 1 if rec.state in ("aborted", "drained") else 0
            if elsewhere:
                self.fail("abort_at_owner", f"{rec.rid} (owner {rec.owner}) was aborted at "
                          f"another engine {elsewhere} time(s)")
            if rec.state in ("dropped", STOPPED):
                self.fail("abort_exactly_once", f"{rec.rid} ({rec.state}) was never aborted "
                          "after the drain loop ran")
            elif at_owner != want:
                invariant = ("no_abort_after_finish" if rec.state == "finished"
                             else "abort_exactly_once")
                self.fail(invariant, f"{rec.rid} ({rec.state}) reached its engine "
                          f"{rec.owner} in {at_owner} ABORT(s), expected {want}")


def probe_core(core: ReferenceFrontendCore, model: WireModel) -> ReferenceFrontendCore:
    """Shadow the core's boundary methods so the model sees every frame crossing them.

    Only arguments and return values are observed; the core's behaviour is untouched (its
    own internal calls go to the class methods). Probes never raise into the frontend: a
    violation is recorded and raised by the machine after the step.
    """
    add_request, abort, drain = core.add_request, core.abort, core.drain_drops
    queue_drop, start_utility, on_output = core.queue_drop, core.start_utility, core.on_output

    def probed_add(prompt: Sequence[int], max_tokens: int, *,
                   data_parallel_rank: int | None = None,
                   stop: Sequence[str] | None = None) -> tuple[StreamHandle, Send]:
        handle, send = add_request(prompt, max_tokens, data_parallel_rank=data_parallel_rank,
                                   stop=stop)
        model.on_add(handle, send, data_parallel_rank, stop)
        return handle, send

    def probed_abort(request_ids: Sequence[str]) -> list[Send]:
        ids = list(request_ids)
        due, optional = model.begin_abort(ids)
        sends = abort(ids)
        model.end_abort(due, optional, sends)
        return sends

    def probed_drop(request_ids: Sequence[str]) -> None:
        ids = list(request_ids)
        model.on_drop(ids)
        queue_drop(ids)

    def probed_drain() -> list[Send]:
        due = model.begin_drain()
        sends = drain()
        model.end_drain(due, sends)
        return sends

    def probed_utility(method: str, args: Sequence[Any]) -> tuple[PendingUtility, list[Send]]:
        call, sends = start_utility(method, args)
        if model.fe_dead:
            model.fail("fail_fast_after_death", f"utility {method} was started after "
                       "ENGINE_CORE_DEAD reached the frontend")
        model.check_sends("utility", sends, None)
        return call, sends

    def probed_output(frames: Sequence[bytes]) -> list[PendingUtility]:
        model.on_deliver(frames)
        return on_output(frames)

    for name, fn in [("add_request", probed_add), ("abort", probed_abort),
                     ("queue_drop", probed_drop), ("drain_drops", probed_drain),
                     ("start_utility", probed_utility), ("on_output", probed_output)]:
        setattr(core, name, fn)
    return core


# --------------------------------------------------------------------------- the worlds


class World(Protocol):
    """The transport the machine drives: in-memory (sans-IO) or real sockets."""

    sans_io: bool
    core: ReferenceFrontendCore

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle: ...
    def drop(self, request_ids: list[str]) -> None: ...
    def abort(self, request_ids: list[str]) -> None: ...
    def utility(self, method: str) -> bool: ...
    def script(self, rank: int) -> EngineScript: ...
    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None: ...
    def settle(self) -> bool: ...
    def received_aborts(self) -> list[tuple[int, list[str]]]: ...
    def protocol_errors(self) -> list[tuple[int, str]]: ...
    def records(self) -> list[Record]: ...
    def close(self) -> None: ...


def _merged(cores: Sequence[MockEngineCore]) -> list[Record]:
    records = [r for core in cores for r in core.transcript.snapshot()]
    records.sort(key=lambda r: r.t)
    return records


def _aborts_of(cores: Sequence[MockEngineCore]) -> list[tuple[int, list[str]]]:
    return [(core.rank, list(r.message.request_ids))
            for core in cores for r in core.transcript.abort_frames()]


def _errors_of(cores: Sequence[MockEngineCore]) -> list[tuple[int, str]]:
    return [(core.rank, str(r.error))
            for core in cores for r in core.transcript.protocol_errors()]


class SansIOWorld:
    """Frontend core and engine cores wired in memory; the machine decides every delivery.

    Per-engine FIFO order is kept in both directions (one ZMQ connection each way), the
    order across engines is the machine's choice. The utility and drain logic mirrors
    `ReferenceFrontend` (harness/frontends/reference/frontend.py) line for line.
    """

    sans_io = True

    def __init__(self, ranks: Sequence[int], core_factory: CoreFactory, model: WireModel,
                 scripts: Sequence[EngineScript]) -> None:
        self.now = 0.0
        self.ranks = list(ranks)
        self.engines = {r: MockEngineCore(r, s, dp_size=len(self.ranks))
                        for r, s in zip(self.ranks, scripts, strict=True)}
        self.core = probe_core(core_factory(self.ranks), model)
        self._by_identity = {engine_identity(r): r for r in self.ranks}
        self.to_engine: dict[int, collections.deque[list[bytes]]] = {
            r: collections.deque() for r in self.ranks}
        self.to_frontend: dict[int, collections.deque[list[bytes]]] = {
            r: collections.deque() for r in self.ranks}
        self.drop_signal = False
        self._waiters: dict[int, str] = {}  # id(call) -> pending | done | failed
        for rank, engine in self.engines.items():
            payload = engine.ready_payload()
            engine.record_ready(self.now, payload)
            self.core.on_ready(engine_identity(rank), payload)
        if not self.core.registered:
            raise StartupError("frontend core did not register every engine")

    # ------------------------------------------------------------ plumbing

    def _send(self, sends: Sequence[Send]) -> None:
        for identity, frames in sends:
            rank = self._by_identity.get(bytes(identity))
            if rank is not None:  # a ROUTER drops frames for unknown identities
                self.to_engine[rank].append(list(frames))

    def _to_core(self, frames: list[bytes]) -> None:
        for call in self.core.on_output(frames):
            if self._waiters.get(id(call)) == "pending":
                self._waiters[id(call)] = "done"
        if self.core.pending_drops:
            self.drop_signal = True
        if self.core.dead is not None:
            for key, state in self._waiters.items():
                if state == "pending":
                    self._waiters[key] = "failed"

    def _poll(self, rank: int) -> bool:
        outs = self.engines[rank].poll(self.now)
        for out in outs:
            if out.client_index in (0, ALL_CLIENTS):
                self.to_frontend[rank].append(out.frames)
        return bool(outs)

    def deliver_inputs(self, rank: int, count: int) -> None:
        queue = self.to_engine[rank]
        for _ in range(min(count, len(queue))):
            self.engines[rank].receive(queue.popleft(), self.now)

    def deliver_outputs(self, rank: int, count: int) -> None:
        queue = self.to_frontend[rank]
        for _ in range(min(count, len(queue))):
            self._to_core(queue.popleft())

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for rank in self.ranks:
            self._poll(rank)

    def drain(self) -> None:
        """One pass of the frontend's abort drain loop, if it has been signalled."""
        if not self.drop_signal:
            return
        self.drop_signal = False
        self._send(self.core.drain_drops())
        if self.core.pending_drops:
            self.drop_signal = True

    def _round(self) -> bool:
        moved = self.drop_signal
        self.drain()
        for rank in self.ranks:
            moved = moved or bool(self.to_engine[rank])
            self.deliver_inputs(rank, len(self.to_engine[rank]))
        for rank in self.ranks:
            moved = self._poll(rank) or moved
        for rank in self.ranks:
            moved = moved or bool(self.to_frontend[rank])
            self.deliver_outputs(rank, len(self.to_frontend[rank]))
        return moved

    # ------------------------------------------------------------ World

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle:
        handle, send = self.core.add_request(prompt, 8, data_parallel_rank=dp_rank, stop=stop)
        self._send([send])
        return handle

    def drop(self, request_ids: list[str]) -> None:
        self.core.queue_drop(request_ids)
        self.drop_signal = True

    def abort(self, request_ids: list[str]) -> None:
        self._send(self.core.abort(request_ids))

    def utility(self, method: str) -> bool:
        args: list[Any] = [False, False] if method == "reset_prefix_cache" else []
        values = self._call_all(method, args)
        if method == "is_sleeping":
            return self.core.aggregate_is_sleeping(values)
        return self.core.aggregate_reset_prefix_cache(values)

    def _call_all(self, method: str, args: list[Any]) -> list[Any]:
        call, sends = self.core.start_utility(method, args)
        key = id(call)
        self._waiters[key] = "pending"
        try:
            self._send(sends)
            for _ in range(PUMP_ROUNDS):
                state = self._waiters[key]
                if state == "failed" and self.core.dead is not None:
                    raise self.core.dead
                if state == "done" or not self._round():
                    break
            if self._waiters[key] == "failed" and self.core.dead is not None:
                raise self.core.dead
            if self._waiters[key] != "done":
                raise FrontendError(f"utility {method}: no reply from engines "
                                    f"{call.missing_ranks()} (the transport's timeout)")
        finally:
            self._waiters.pop(key, None)
            self.core.forget_utility(call)
        return self.core.utility_values(call)

    def script(self, rank: int) -> EngineScript:
        return self.engines[rank].script

    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None:
        action(self.engines[rank], self.now)

    def settle(self) -> bool:
        """Deliver, drain and advance virtual time until nothing is left to happen."""
        for _ in range(SETTLE_ROUNDS):
            if self._round():
                continue
            deadlines = [d for e in self.engines.values()
                         if (d := e.next_deadline()) is not None and d != math.inf]
            if not deadlines:
                return True
            self.now = max(self.now, min(deadlines))
        return False

    def received_aborts(self) -> list[tuple[int, list[str]]]:
        return _aborts_of(list(self.engines.values()))

    def protocol_errors(self) -> list[tuple[int, str]]:
        return _errors_of(list(self.engines.values()))

    def records(self) -> list[Record]:
        return _merged(list(self.engines.values()))

    def close(self) -> None:
        pass


class SocketWorld:
    """`ReferenceFrontend` + `EngineGroup` on real ZMQ sockets, one asyncio loop per example.

    The loop runs only inside each bounded call, so between steps the model and the handles
    are read from a quiet frontend while the engine threads keep going.
    """

    sans_io = False

    def __init__(self, ranks: Sequence[int], core_factory: CoreFactory, model: WireModel,
                 scripts: Sequence[EngineScript]) -> None:
        self.ranks = list(ranks)
        self.model = model
        self.call_timeout = scaled(5.0)
        self.loop = asyncio.new_event_loop()
        try:
            self.frontend = ReferenceFrontend(
                self.ranks, core_factory=lambda rs: probe_core(core_factory(rs), model),
                utility_timeout=scaled(2.0))
        except BaseException:
            self.loop.close()
            raise
        self.core = self.frontend.core
        self.group = EngineGroup(list(scripts))
        self.ipc = PrivateIpcDir()
        inputs, outputs = self.ipc.address("in"), self.ipc.address("out")
        try:
            self.frontend.bind(inputs, outputs)
            self.group.start_bootstrapped([inputs], [outputs])
            self._run(self.frontend.wait_ready(scaled(10.0)), scaled(12.0), "startup")
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Awaitable[T], timeout: float, what: str) -> T:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))
        except asyncio.TimeoutError:
            raise InvariantViolation("no_call_hangs", f"{what} did not return within "
                                     f"{timeout:.1f}s") from None

    def _spin(self) -> None:
        """Let the frontend's tasks (reader, drain loop) run briefly."""
        self._run(asyncio.sleep(0.002), self.call_timeout, "spin")

    def generate(self, prompt: list[int], dp_rank: int | None,
                 stop: list[str] | None) -> StreamHandle:
        handle = self._run(self.frontend.generate(prompt, 8, data_parallel_rank=dp_rank,
                                                  stop=stop),
                           self.call_timeout, "generate")
        self._spin()
        return handle

    def drop(self, request_ids: list[str]) -> None:
        self.frontend.drop(request_ids)
        self._spin()

    def abort(self, request_ids: list[str]) -> None:
        self._run(self.frontend.abort(request_ids), self.call_timeout, "abort")
        self._spin()

    def utility(self, method: str) -> bool:
        call = (self.frontend.is_sleeping() if method == "is_sleeping"
                else self.frontend.reset_prefix_cache())
        return self._run(call, self.call_timeout, method)

    def script(self, rank: int) -> EngineScript:
        return self.group.engines[self.ranks.index(rank)].script

    def on_engine(self, rank: int, action: Callable[[MockEngineCore, float], None]) -> None:
        """Run `action` on the engine's own thread and wait (bounded) until it ran."""
        engine = self.group.engines[self.ranks.index(rank)]
        runner = engine.runner
        assert runner is not None
        done = threading.Event()

        def command() -> None:
            try:
                action(engine.core, time.monotonic())
            finally:
                done.set()

        runner.call(command)
        if not done.wait(self.call_timeout):
            raise InvariantViolation("no_call_hangs", f"engine {rank} did not run a command "
                                     f"within {self.call_timeout:.1f}s")

    def _counts(self) -> tuple[int, int]:
        inputs = outputs = 0
        for engine in self.group.engines:
            for r in engine.transcript.snapshot():
                if r.channel == "input":
                    inputs += 1
                elif r.channel == "output" and r.direction == "out":
                    outputs += 1
        return inputs, outputs

    async def _quiesce(self, bound: float) -> bool:
        deadline = time.monotonic() + bound
        last: tuple[int, ...] | None = None
        stable = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            inputs, outputs = self._counts()
            snapshot = (inputs, outputs, self.model.sent_frames, self.model.delivered)
            quiet = (inputs == self.model.sent_frames and outputs == self.model.delivered
                     and not self.core.pending_drops)
            stable = stable + 1 if quiet and snapshot == last else 0
            if stable >= 3:
                return True
            last = snapshot
        return False

    def settle(self) -> bool:
        bound = scaled(5.0)
        return self._run(self._quiesce(bound), bound + 1.0, "settle")

    def _cores(self) -> list[MockEngineCore]:
        return [e.core for e in self.group.engines]

    def received_aborts(self) -> list[tuple[int, list[str]]]:
        return _aborts_of(self._cores())

    def protocol_errors(self) -> list[tuple[int, str]]:
        return _errors_of(self._cores())

    def records(self) -> list[Record]:
        return _merged(self._cores())

    def close(self) -> None:
        """Frontend first (so engine exits are not deaths), then engines, ipc, loop."""
        try:
            if not self.loop.is_closed():
                with contextlib.suppress(asyncio.TimeoutError):
                    self.loop.run_until_complete(
                        asyncio.wait_for(self.frontend.close(), scaled(5.0)))
        finally:
            try:
                self.group.stop(scaled(5.0))
            finally:
                self.ipc.cleanup()
                if not self.loop.is_closed():
                    self.loop.close()


# --------------------------------------------------------------------------- the machine

# Weighted by repetition: death ends the useful part of a run, so it is rare.
KIND_TABLE: tuple[str, ...] = ("finish",) * 12 + ("hold",) * 12 + ("error",) * 5 + ("die",)
FINISH_REASONS = {"length": m.FinishReason.LENGTH, "stop": m.FinishReason.STOP,
                  "error": m.FinishReason.ERROR, "abort": m.FinishReason.ABORT}
ANSWERS = ("true", "false", "fail")
UTILITIES = ("is_sleeping", "reset_prefix_cache")
RULES = ("init", "generate", "drop", "abort", "engine_finish", "kill_engine", "utility",
         "settle", "drain", "tick", "deliver")
KILL_GATE = 7  # kill_engine acts when gate == KILL_GATE: one draw in eight
# Engines with log_stats=True are drawn too (the busy-deadline bug this machine found in
# MockEngineCore is fixed and pinned by tests/test_stateful.py).
DRAW_LOG_STATS = True


# A request's script and routing, packed into one integer per request: hypothesis spends
# most of a run in its own per-choice bookkeeping, so one draw instead of five per request
# keeps examples and shrinking fast. Rules decode before recording: replay files stay
# readable. Digits, least significant first (0 is the simplest value of each):
_SPEC_DIGITS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("kind", KIND_TABLE),
    ("tokens", (0, 1, 2, 3)),
    ("reason", ("length", "stop")),
    ("interval_ms", (0, 5, 10)),
    ("dp_rank", (None, 0, 1, 2, 3)),  # 3 is never an engine: it must be rejected
    ("chunk", (1, 2)),  # tokens per output
    ("stop_at", (None, 0, 1, 2)),  # a stop string matching the Nth token (if enabled)
)
SPEC_SPACE = math.prod(len(values) for _, values in _SPEC_DIGITS)


def decode_spec(code: int) -> dict[str, Any]:
    """One packed request spec -> the `generate` arguments it stands for."""
    spec: dict[str, Any] = {}
    for name, values in _SPEC_DIGITS:
        code, digit = divmod(code, len(values))
        spec[name] = values[digit]
    return spec


RECENT = 8  # drop/abort/engine_finish pick among the newest requests


def decode_picks(code: int) -> list[int]:
    """Bits 0-7 pick among the newest requests (0 = newest); bit 8 repeats the first pick."""
    picks = [i for i in range(RECENT) if code >> i & 1]
    if code >> RECENT & 1 and picks:
        picks.append(picks[0])
    return picks


READY_CHOICES = ((1024, 1000), (2048, 500), (512, 1000), (1024, 300), (4096, 2000),
                 (768, 1000))  # (max_model_len, num_gpu_blocks) per engine
BLOCK_SIZES = (16, 32)
CONFIG_SPACE = len(BLOCK_SIZES) * len(READY_CHOICES) ** 3


def decode_config(code: int, ranks: int) -> tuple[list[list[int]], int]:
    """One packed integer -> per-engine [max_model_len, num_gpu_blocks] and the block size."""
    code, digit = divmod(code, len(BLOCK_SIZES))
    ready = []
    for _ in range(ranks):
        code, choice = divmod(code, len(READY_CHOICES))
        ready.append(list(READY_CHOICES[choice]))
    return ready, BLOCK_SIZES[digit]


def decode_answers(code: int, width: int = 3) -> list[str]:
    """One packed integer -> per-engine utility answers (base 3 over ANSWERS)."""
    answers = []
    for _ in range(width):
        code, digit = divmod(code, len(ANSWERS))
        answers.append(ANSWERS[digit])
    return answers


def _text_agrees(text: str, expected: str, stop: str | None, ended: bool) -> bool:
    """A live stream with a stop string may withhold up to len(stop) - 1 trailing
    characters (they could start a match, vLLM's stop buffer); otherwise text is exact."""
    if ended or stop is None:
        return text == expected
    return expected.startswith(text) and len(expected) - len(text) <= len(stop) - 1


def _extend_until_stop(target: RequestModel, tokens: Sequence[int]) -> bool:
    """Hand `tokens` to the model request one by one; True once its stop string matched
    (vLLM drops the rest of that chunk: output_processor.py _trim_surplus_tokens)."""
    for token in tokens:
        target.tokens.append(token)
        if target.stop is not None and target.stop in detokenize(target.tokens):
            return True
    return False


def prompt_for(n: int) -> list[int]:
    """A distinct prompt per generate: the engines' scripts are looked up by prompt."""
    return [11, 20 + n // 900, 20 + n % 900]


def plan_steps(kind: str, tokens: int, reason: str, interval: float, first: int,
               chunk: int = 1) -> list[Step]:
    """The engine-side script of one request: `tokens` tokens in outputs of `chunk`."""
    toks = [first + j for j in range(tokens)]
    chunks = [toks[i:i + chunk] for i in range(0, len(toks), chunk)]
    if kind == "finish":
        last = chunks.pop() if chunks else []
        return [*(Emit(c, interval) for c in chunks),
                Finish(FINISH_REASONS[reason], last, interval)]
    emits: list[Step] = [Emit(c, interval) for c in chunks]
    if kind == "hold":  # held open until aborted or finished by `engine_finish`
        return emits or [Emit([], interval)]
    if kind == "error":
        return [*emits, Finish(m.FinishReason.ERROR, delay=interval,
                               error=m.RequestError("internal_error", "scripted failure"))]
    return [*emits, Die(interval)]


def finish_live(core: MockEngineCore, rid: str, reason: m.FinishReason, now: float) -> None:
    """Make an engine finish a request it holds at its next step (no-op if not live there).

    Reaches into the engine core's live-request record: the engine has no public "finish
    this now" command, and the step list is a per-request copy, so this changes nothing else.
    """
    live = core.live.get(rid)
    if live is None:
        return
    error = (m.RequestError("internal_error", "triggered failure")
             if reason is m.FinishReason.ERROR else None)
    live.steps.append(Finish(reason, error=error))
    live.position = len(live.steps) - 1
    live.due = now


def expected_utility(method: str, answers: Sequence[str]) -> tuple[bool, bool]:
    """(an error is expected, the value otherwise): consensus for is_sleeping, AND for reset."""
    if "fail" in answers:
        return True, False
    values = [a == "true" for a in answers]
    if method == "is_sleeping":
        return len(set(values)) != 1, values[0]
    return False, all(values)


def _has_world(self: FrontendMachine) -> bool:
    return self.world is not None


def _sans_io(self: FrontendMachine) -> bool:
    return self.world is not None and self.world.sans_io


def _has_requests(self: FrontendMachine) -> bool:
    return self.model is not None and bool(self.model.order)


class FrontendMachine(RuleBasedStateMachine):
    """Random protocol sessions against a frontend core; see the module docstring.

    Every rule records itself (name and JSON arguments) and runs through `execute`, which
    is also what `replay()` calls, so a replay file re-runs exactly what hypothesis ran.
    """

    def __init__(self, core_factory: CoreFactory = ReferenceFrontendCore,
                 transport: str = "sansio", *, stop_strings: bool | None = None) -> None:
        super().__init__()
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; known: {TRANSPORTS}")
        self.core_factory = core_factory
        self.transport = transport
        # Whether generated requests may carry stop strings (recorded per request, so a
        # replay needs no flag). On by default: see STOP_STRINGS_ENV.
        self.stop_strings = stop_strings_enabled() if stop_strings is None else stop_strings
        self.steps: list[dict[str, Any]] = []
        self.world: World | None = None
        self.model: WireModel | None = None
        self.plan: dict[tuple[int, ...], list[Step]] = {}
        self.prompts = 0
        self.failure: InvariantViolation | None = None
        self.failed_step: int | str | None = None
        self.excerpt_records: list[Record] = []  # rendered only when a replay is written
        self.on_failure: Callable[[FrontendMachine], None] | None = None

    # ------------------------------------------------------------ execution

    def execute(self, rule_name: str, args: dict[str, Any]) -> None:
        """Run one recorded step and check every invariant after it."""
        if rule_name not in RULES:
            raise ValueError(f"unknown step {rule_name!r}; known: {RULES}")
        self.steps.append({"rule": rule_name, "args": args})
        self._guarded(len(self.steps) - 1, lambda: self._step(rule_name, args))

    def _step(self, rule_name: str, args: dict[str, Any]) -> None:
        getattr(self, f"_do_{rule_name}")(**args)
        self.check()

    def _guarded(self, where: int | str, action: Callable[[], None]) -> None:
        try:
            action()
        except InvariantViolation as exc:
            self._failed(exc, where)
            raise
        except StartupError as exc:
            violation = InvariantViolation("startup", str(exc))
            self._failed(violation, where)
            raise violation from exc
        except Exception as exc:
            violation = InvariantViolation("unexpected_exception",
                                           f"{type(exc).__name__}: {exc}")
            self._failed(violation, where)
            raise violation from exc

    def _failed(self, exc: InvariantViolation, where: int | str) -> None:
        if self.failure is not None:
            return
        self.failure, self.failed_step = exc, where
        exc.failed_step = where
        if self.world is not None:
            self.excerpt_records = self.world.records()[-60:]
        if self.on_failure is not None:
            self.on_failure(self)

    def check(self) -> None:
        """Raise the first invariant violation the probe or the stream checks found."""
        model = self.model
        if model is None:
            return
        if not model.violations:
            model.check_streams()
        if model.violations:
            raise model.violations[0]

    def _world(self) -> World:
        assert self.world is not None, "init has not run"
        return self.world

    def _model(self) -> WireModel:
        assert self.model is not None, "init has not run"
        return self.model

    def _pick(self, pick: int) -> RequestModel:
        order = self._model().order
        return order[-1 - pick % min(len(order), RECENT)]  # newest first; shrinks to newest

    # ------------------------------------------------------------ step bodies

    def _do_init(self, ranks: int, report_finished: bool,
                 ready: list[list[int]] | None = None, block_size: int = 16,
                 log_stats: bool = False) -> None:
        rank_list = list(range(ranks))
        ready = ready or [[1024, 1000] for _ in rank_list]
        self.model = model = WireModel(rank_list)
        scripts = [EngineScript(ready=default_ready(r, ranks, max_model_len=mml,
                                                    num_gpu_blocks=blocks,
                                                    block_size=block_size,
                                                    effective_attention_block_size=block_size),
                                default=self._steps_for, report_finished=report_finished,
                                log_stats=log_stats)
                   for r, (mml, blocks) in zip(rank_list, ready, strict=True)]
        world_type = SansIOWorld if self.transport == "sansio" else SocketWorld
        self.world = world = world_type(rank_list, self.core_factory, model, scripts)
        config = world.core.config
        want = (min(r[0] for r in ready), sum(r[1] for r in ready), block_size)
        got = (config.max_model_len, config.num_gpu_blocks, config.block_size)
        if got != want:
            model.fail("config_aggregation", f"engines sent [max_model_len, num_gpu_blocks] "
                       f"{ready} with block_size {block_size}: the frontend derived "
                       f"(max_model_len, num_gpu_blocks, block_size) = {got}, expected {want}")

    def _steps_for(self, request: m.EngineCoreRequest) -> list[Step]:
        key = tuple(request.prompt_token_ids or ())
        return list(self.plan[key]) if key in self.plan else default_steps(request)

    def _do_generate(self, requests: list[dict[str, Any]]) -> None:
        for spec in requests:
            self._generate_one(**spec)

    def _generate_one(self, kind: str, tokens: int, reason: str, interval_ms: int,
                      dp_rank: int | None, chunk: int = 1, stop_at: int | None = None) -> None:
        world, model = self._world(), self._model()
        n = self.prompts
        self.prompts += 1
        prompt = prompt_for(n)
        first = 100 + (n * 5) % 700  # three-digit ids: " tNNN" never prefixes another token
        self.plan[tuple(prompt)] = plan_steps(kind, tokens, reason, interval_ms / 1000, first,
                                              chunk)
        stop = None if stop_at is None else [" " + token_text(first + stop_at)]
        invalid = dp_rank is not None and dp_rank not in model.ranks
        try:
            world.generate(prompt, dp_rank, stop)
        except FrontendError as exc:
            if not (invalid or model.fe_dead):
                model.fail("no_spurious_errors", f"generate(dp_rank={dp_rank}) failed on a "
                           f"healthy frontend: {exc}")
            return
        # (accepting an invalid rank or a call after death is flagged by the probe)

    def _do_drop(self, picks: list[int]) -> None:
        if not self._model().order:
            return
        self._world().drop([self._pick(p).rid for p in picks])

    def _do_abort(self, picks: list[int], unknown: bool) -> None:
        model = self._model()
        ids = [self._pick(p).rid for p in picks] if model.order else []
        if unknown:
            ids.append(f"cw-unknown-{len(self.steps)}")
        try:
            self._world().abort(ids)
        except FrontendError as exc:
            if not model.fe_dead:
                model.fail("no_spurious_errors", f"abort({ids}) failed on a healthy "
                           f"frontend: {exc}")

    def _do_engine_finish(self, pick: int, reason: str) -> None:
        if not self._model().order:
            return
        rec = self._pick(pick)
        if rec.owner is None:
            return
        finish = FINISH_REASONS[reason]
        self._world().on_engine(rec.owner, lambda core, now: finish_live(core, rec.rid,
                                                                           finish, now))

    def _do_kill_engine(self, rank: int, gate: int) -> None:
        if gate != KILL_GATE:  # most draws are no-ops: death ends the interesting part
            return
        ranks = self._model().ranks
        self._world().on_engine(ranks[rank % len(ranks)],
                                lambda core, now: core.inject_dead(now))

    def _do_utility(self, method: str, answers: list[str]) -> None:
        world, model = self._world(), self._model()
        used = [answers[i % len(answers)] for i in range(len(model.ranks))]
        for rank, answer in zip(model.ranks, used, strict=True):
            world.script(rank).utilities[method] = (
                UtilityReply(failure=f"scripted {method} failure") if answer == "fail"
                else UtilityReply(answer == "true"))
        want_error, want = expected_utility(method, used)
        try:
            value = world.utility(method)
        except FrontendError as exc:
            if not want_error and not model.fe_dead:
                model.fail("no_spurious_errors", f"{method} failed although the engines "
                           f"answered {used}: {exc}")
            return
        if want_error:
            model.fail("utility_aggregation", f"{method} returned {value!r} although the "
                       f"engines answered {used} (expected an error)")
        elif value is not want:
            model.fail("utility_aggregation", f"{method} returned {value!r}; the engines "
                       f"answered {used}, so the answer is {want!r}")

    def _do_settle(self) -> None:
        world, model = self._world(), self._model()
        if not world.settle():
            model.fail("no_call_hangs", "the system did not quiesce within its bound")
            return
        model.check_settled(world.received_aborts(), world.protocol_errors())

    def _sans(self) -> SansIOWorld:
        world = self._world()
        assert isinstance(world, SansIOWorld), "a sans-IO-only step on a socket world"
        return world

    def _do_drain(self) -> None:
        self._sans().drain()

    def _do_tick(self, ms: int) -> None:
        self._sans().tick(ms / 1000)

    def _do_deliver(self, to: str, rank: int, count: int) -> None:
        """Deliver the next `count` frames queued between the frontend and one engine."""
        world = self._sans()
        target = world.ranks[rank % len(world.ranks)]
        if to == "engine":
            world.deliver_inputs(target, count)
        else:
            world.deliver_outputs(target, count)

    # ------------------------------------------------------------ rules

    @initialize(ranks=st.integers(1, 3), report_finished=st.booleans(),
                log_stats=st.booleans() if DRAW_LOG_STATS else st.just(False),
                config=st.integers(0, CONFIG_SPACE - 1))
    def init(self, ranks: int, report_finished: bool, log_stats: bool, config: int) -> None:
        ready, block_size = decode_config(config, ranks)
        self.execute("init", {"ranks": ranks, "report_finished": report_finished,
                              "log_stats": log_stats, "ready": ready,
                              "block_size": block_size})

    @precondition(_has_world)
    @rule(specs=st.lists(st.integers(0, SPEC_SPACE - 1), min_size=1, max_size=3))
    def generate(self, specs: list[int]) -> None:
        requests = [decode_spec(c) for c in specs]
        if not self.stop_strings:
            for spec in requests:
                spec["stop_at"] = None
        self.execute("generate", {"requests": requests})

    @precondition(_has_requests)
    @rule(picks=st.integers(1, 2 ** (RECENT + 1) - 1))
    def drop(self, picks: int) -> None:
        self.execute("drop", {"picks": decode_picks(picks) or [0]})

    @precondition(_has_world)
    @rule(picks=st.integers(0, 2 ** (RECENT + 2) - 1))
    def abort(self, picks: int) -> None:
        # bit 9: also abort an id the frontend never issued
        self.execute("abort", {"picks": decode_picks(picks), "unknown": bool(picks >> 9 & 1)})

    @precondition(_has_requests)
    @rule(pick=st.integers(0, RECENT - 1), reason=st.sampled_from(tuple(FINISH_REASONS)))
    def engine_finish(self, pick: int, reason: str) -> None:
        self.execute("engine_finish", {"pick": pick, "reason": reason})

    @precondition(_has_world)
    @rule(rank=st.integers(0, 2), gate=st.integers(0, KILL_GATE))
    def kill_engine(self, rank: int, gate: int) -> None:
        self.execute("kill_engine", {"rank": rank, "gate": gate})

    @precondition(_has_world)
    @rule(method=st.sampled_from(UTILITIES), answers=st.integers(0, len(ANSWERS) ** 3 - 1))
    def utility(self, method: str, answers: int) -> None:
        self.execute("utility", {"method": method, "answers": decode_answers(answers)})

    @precondition(_has_world)
    @rule()
    def settle(self) -> None:
        self.execute("settle", {})

    @precondition(_sans_io)
    @rule()
    def drain(self) -> None:
        self.execute("drain", {})

    @precondition(_sans_io)
    @rule(ms=st.sampled_from((0, 5, 10, 50)))
    def tick(self, ms: int) -> None:
        self.execute("tick", {"ms": ms})

    @precondition(_sans_io)
    @rule(to=st.sampled_from(("frontend", "engine")), rank=st.integers(0, 2),
          count=st.integers(1, 4))
    def deliver(self, to: str, rank: int, count: int) -> None:
        self.execute("deliver", {"to": to, "rank": rank, "count": count})

    def teardown(self) -> None:
        """Settle and run the settled checks (unless a step failed already), then close."""
        world = self.world
        if world is None:
            return
        try:
            if self.failure is None:
                self._guarded("teardown", self._final_checks)
        finally:
            self.world = None
            world.close()

    def _final_checks(self) -> None:
        self._do_settle()
        self.check()


# --------------------------------------------------------------------------- running


def stateful_settings(*, max_examples: int | None = None, step_count: int | None = None,
                      **overrides: Any) -> hypothesis.settings:
    """Settings for a stateful run: 200 examples, or the nightly profile, or the env's count.

    Precedence: explicit `max_examples` > $COREWIRE_STATEFUL_EXAMPLES > the "nightly"
    profile (HYPOTHESIS_PROFILE=nightly or --hypothesis-profile=nightly) > 200.
    """
    profile = os.environ.get("HYPOTHESIS_PROFILE") or hypothesis.settings.get_current_profile_name()
    if profile == NIGHTLY:
        base = hypothesis.settings.get_profile(NIGHTLY)
    else:
        base = hypothesis.settings(hypothesis.settings.default, max_examples=DEFAULT_EXAMPLES,
                                   stateful_step_count=DEFAULT_STEPS)
    examples = base.max_examples
    if os.environ.get(EXAMPLES_ENV):
        examples = int(os.environ[EXAMPLES_ENV])
    if max_examples is not None:
        examples = max_examples
    # No explain phase: it re-runs a failure many times to annotate a report the replay file
    # already gives, and it costs several times the search and the shrink together.
    phases = [p for p in base.phases if p is not hypothesis.Phase.explain]
    values: dict[str, Any] = {"phases": phases, "deadline": None,
                              "suppress_health_check": list(hypothesis.HealthCheck)}
    values.update(overrides)
    return hypothesis.settings(base, max_examples=examples,
                               stateful_step_count=step_count or base.stateful_step_count,
                               **values)


def core_name(core_factory: Callable[..., Any]) -> str:
    module = getattr(core_factory, "__module__", None)
    qualname = getattr(core_factory, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(core_factory)


def resolve_core(spec: str) -> CoreFactory:
    """"reference", "mutant:NAME" (harness/frontends/mutants.py) or "package.module:Attr"."""
    if spec in ("", "reference"):
        return ReferenceFrontendCore
    if spec.startswith("mutant:"):
        from harness.frontends.mutants import MUTANTS

        name = spec.split(":", 1)[1]
        if name not in MUTANTS:
            raise ValueError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
        return MUTANTS[name].core
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"core spec {spec!r}: expected reference, mutant:NAME or module:Attr")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def stop_strings_enabled() -> bool:
    return os.environ.get(STOP_STRINGS_ENV, "1") not in ("", "0", "false", "no")


def _new_seed() -> int:
    if os.environ.get(SEED_ENV):
        return int(os.environ[SEED_ENV])
    return random.SystemRandom().getrandbits(32)


def replay_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    return Path(directory or os.environ.get(STATEFUL_DIR_ENV) or DEFAULT_REPLAY_DIR)


def run_stateful(core_factory: CoreFactory = ReferenceFrontendCore, *,
                 transport: str = "sansio", settings: hypothesis.settings | None = None,
                 seed: int | None = None,
                 replay_directory: str | os.PathLike[str] | None = None) -> None:
    """Run the machine under hypothesis; on failure write replay file(s), then re-raise.

    The exception gets a note naming each replay file, and a `replay_files` attribute.
    """
    chosen = settings or stateful_settings()
    run_seed = _new_seed() if seed is None else seed
    failed: list[FrontendMachine] = []

    def factory() -> FrontendMachine:
        machine = FrontendMachine(core_factory, transport)
        machine.on_failure = failed.append
        return machine

    try:
        # Any callable returning a machine will do (hypothesis documents it); the stub says type.
        seeded: Any = hypothesis.seed(run_seed)(factory)
        run_state_machine_as_test(seeded, settings=chosen)
    except BaseException as exc:
        # Hypothesis re-runs each minimal failing example last: those are the newest failures.
        reported = len(getattr(exc, "exceptions", None) or [exc])
        paths = [write_replay(mach, seed=run_seed, settings=chosen, directory=replay_directory)
                 for mach in failed[-reported:]]
        with contextlib.suppress(AttributeError, TypeError):
            exc.replay_files = paths  # type: ignore[attr-defined]
        for path in paths:
            note = (f"corewire replay file: {path}  (re-run: python -m harness.stateful "
                    f"replay {path}; promote: python -m harness.stateful promote {path})")
            if hasattr(exc, "add_note"):
                exc.add_note(note)
        raise


def write_replay(machine: FrontendMachine, *, seed: int | None,
                 settings: hypothesis.settings | None = None,
                 directory: str | os.PathLike[str] | None = None) -> Path:
    """Write one failed machine's steps, failure and transcript excerpt as a replay file."""
    target = replay_dir(directory)
    target.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    failure = machine.failure
    data: dict[str, Any] = {
        "format": REPLAY_FORMAT,
        "created": stamp.isoformat(timespec="seconds"),
        "transport": machine.transport,
        "core": core_name(machine.core_factory),
        "seed": seed,
        "hypothesis": {"version": hypothesis.__version__,
                       "max_examples": settings.max_examples if settings else None,
                       "stateful_step_count":
                           settings.stateful_step_count if settings else None},
        "invariant": failure.invariant if failure else None,
        "invariant_rule": INVARIANTS.get(failure.invariant) if failure else None,
        "message": failure.detail if failure else None,
        "failed_step": machine.failed_step,
        "steps": machine.steps,
        "requests": [rec.summary() for rec in machine.model.order] if machine.model else [],
        "transcript": _excerpt(machine.excerpt_records),
    }
    path = target / f"{stamp.strftime('%Y%m%dT%H%M%S.%fZ')}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def _excerpt(records: Sequence[Record]) -> list[dict[str, Any]]:
    t0 = records[0].t if records else 0.0
    return [r.to_json(t0, hex_limit=64) for r in records]


def load_replay(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a replay file (format, step names)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
        raise ValueError(f"{path}: not a {REPLAY_FORMAT} file")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or steps[0].get("rule") != "init":
        raise ValueError(f"{path}: steps must be a list starting with init")
    for step in steps:
        if step.get("rule") not in RULES or not isinstance(step.get("args"), dict):
            raise ValueError(f"{path}: bad step {step!r}")
    if data.get("transport", "sansio") not in TRANSPORTS:
        raise ValueError(f"{path}: unknown transport {data.get('transport')!r}")
    return data


def replay_steps(steps: Sequence[dict[str, Any]], core_factory: CoreFactory | None = None,
                 *, transport: str = "sansio") -> None:
    """Run recorded steps once; raises InvariantViolation (an AssertionError) on failure."""
    machine = FrontendMachine(core_factory or ReferenceFrontendCore, transport)
    try:
        for step in steps:
            machine.execute(step["rule"], dict(step["args"]))
    finally:
        machine.teardown()


def replay(path: str | os.PathLike[str], core_factory: CoreFactory | None = None, *,
           transport: str | None = None) -> None:
    """Re-run a replay file's steps (against the reference core unless told otherwise).

    Returns None when every invariant holds; raises `InvariantViolation` (an AssertionError
    whose `invariant` names the broken rule) otherwise. Sans-IO replays are deterministic.
    """
    data = load_replay(path)
    replay_steps(data["steps"], core_factory, transport=transport or data.get("transport",
                                                                              "sansio"))


def regression_files(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """The promoted regression cases, sorted (an absent directory holds none)."""
    root = Path(directory) if directory is not None else REGRESSIONS_DIR
    return sorted(root.glob("*.json")) if root.is_dir() else []


def promote(path: str | os.PathLike[str], *, name: str | None = None,
            directory: str | os.PathLike[str] | None = None, check: bool = True) -> Path:
    """Copy a replay file into the regression fixtures (tests/test_regressions.py).

    With `check`, refuse one that fails against the reference core: a regression case
    records a bug the reference does not have, so it must replay clean there.
    """
    data = load_replay(path)
    if check:
        try:
            replay_steps(data["steps"], transport=data.get("transport", "sansio"))
        except InvariantViolation as exc:
            raise ValueError(f"{path} fails against the reference core ({exc}); fix the "
                             "reference first or promote with check=False") from exc
    root = Path(directory) if directory is not None else REGRESSIONS_DIR
    root.mkdir(parents=True, exist_ok=True)
    stem = name or f"{data.get('invariant') or 'replay'}-{Path(path).stem}"
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-") or "replay"
    data["promoted_from"] = str(path)
    target = root / f"{stem}.json"
    target.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return target


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.stateful",
                                     description="corewire stateful fuzzing")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="fuzz a core; failures become replay files")
    run_p.add_argument("--core", default="reference",
                       help="reference, mutant:NAME or module:Attr")
    run_p.add_argument("--transport", choices=TRANSPORTS, default="sansio")
    run_p.add_argument("--examples", type=int, default=None)
    run_p.add_argument("--seed", type=int, default=None)
    run_p.add_argument("--dir", default=None, help=f"replay directory (${STATEFUL_DIR_ENV})")
    replay_p = sub.add_parser("replay", help="re-run a replay file")
    replay_p.add_argument("file")
    replay_p.add_argument("--core", default="reference")
    promote_p = sub.add_parser("promote", help="copy a replay file into the regressions")
    promote_p.add_argument("file")
    promote_p.add_argument("--name", default=None)
    promote_p.add_argument("--no-check", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            run_stateful(resolve_core(args.core), transport=args.transport, seed=args.seed,
                         settings=stateful_settings(max_examples=args.examples),
                         replay_directory=args.dir)
        except Exception as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            for path in getattr(exc, "replay_files", []):
                print(f"replay file: {path}", file=sys.stderr)
            return 1
        print("no invariant violated")
        return 0
    if args.command == "replay":
        try:
            replay(args.file, resolve_core(args.core))
        except InvariantViolation as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        print("replay passed: no invariant violated")
        return 0
    print(promote(args.file, name=args.name, check=not args.no_check))
    return 0


if __name__ == "__main__":
    sys.exit(main())
