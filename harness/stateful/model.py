"""The fuzz model: what the frontend owes every stream and every engine, from the wire alone.

`WireModel` never asks the core what it did. The probe (probe.py) feeds it exactly the
frames the core hands out and takes in, decoded with the real codec; each request's
phase moves only through the shared lifecycle table (harness/protocol/lifecycle.py), and every
check compares what crossed the wire with what the phase says was owed.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.frontends.api import StreamHandle
from harness.frontends.reference.core import ToEngine
from harness.protocol.lifecycle import Event, Phase, next_phase
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.vocab import detokenize
from harness.protocol.wire import AbortRequests, AddRequest, EngineDead, ProtocolError, WireCodec
from harness.protocol.wire import messages as m
from harness.stateful.invariants import InvariantViolation


@dataclass(eq=False)
class RequestModel:
    """What the frontend has been told about one request, from the wire alone."""

    index: int
    rid: str
    owner: int | None  # rank whose identity the ADD was sent to
    dp_rank: int | None
    handle: StreamHandle
    stop: str | None = None  # frontend-side stop string
    phase: Phase = Phase.OPEN
    reason: str | None = None  # the finish_reason the stream must end with once terminal
    tokens: list[int] = field(default_factory=list)  # handed to the frontend while live
    aborts_sent: int = 0
    events: list[str] = field(default_factory=list)  # the handle's observer events
    # Indexes into `tokens` whose text is left out: the last token of an output the engine
    # finished with STOP (vLLM keeps it among the tokens, not in the text).
    silent: set[int] = field(default_factory=set)

    @property
    def state(self) -> str:
        """The phase as replay files and messages spell it."""
        return self.phase.value

    def advance(self, event: Event) -> None:
        """Move along the lifecycle table; LifecycleError if `event` is impossible here."""
        self.phase = next_phase(self.phase, event, self.rid)

    def text(self) -> str:
        """The tokens' text, the silent ones left out."""
        return "".join(detokenize([t]) for i, t in enumerate(self.tokens)
                       if i not in self.silent)

    def expected_text(self) -> str:
        """Detokenized text, cut before the stop string once it matched (vLLM's default)."""
        text = self.text()
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


def text_agrees(text: str, expected: str, stop: str | None, ended: bool) -> bool:
    """A live stream with a stop string may withhold up to len(stop) - 1 trailing
    characters (they could start a match, vLLM's stop buffer); otherwise text is exact."""
    if ended or stop is None:
        return text == expected
    return expected.startswith(text) and len(expected) - len(text) <= len(stop) - 1


def extend_until_stop(target: RequestModel, tokens: Sequence[int],
                      silent_last: bool = False) -> bool:
    """Hand `tokens` to the model request one by one; True once its stop string matched
    (vLLM drops the rest of that chunk: output_processor.py _trim_surplus_tokens).
    `silent_last`: the chunk is an engine STOP's final output, whose last token adds no
    text (so it cannot complete a stop string either)."""
    for i, token in enumerate(tokens):
        target.tokens.append(token)
        if silent_last and i == len(tokens) - 1:
            target.silent.add(len(target.tokens) - 1)
        if target.stop is not None and target.stop in target.text():
            return True
    return False


class WireModel:
    """Expected state of every stream and every ABORT, fed by the core probe's events.

    `codec`: its world's (the frontend core and the engines speak it; the model decodes
    what crossed the wire with it).
    """

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec) -> None:
        self.ranks = list(ranks)
        self.codec = codec
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

    def on_add(self, handle: StreamHandle, send: ToEngine, dp_rank: int | None,
               stop: Sequence[str] | None = None) -> None:
        identity, frames = send
        owner, message = self._take_sent("generate", identity, frames)
        if message is None:
            return
        if not isinstance(message, AddRequest):
            self.fail("valid_frames", f"generate sent {type(message).__name__}, not an ADD")
            return
        rid = message.request.request_id
        if owner is None:
            self.fail("routing", f"ADD {rid} sent to unknown identity {bytes(identity).hex()}")
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
        return ([rec.rid for rec in asked if rec.phase.live],
                [rec.rid for rec in asked if rec.phase is Phase.STOP_PENDING])

    def end_abort(self, due: Sequence[str], optional: Sequence[str],
                  sends: Sequence[ToEngine]) -> None:
        carried = self.check_sends("abort", sends, due, optional)
        for rid in due:
            rec = self.requests[rid]
            rec.reason = "abort"
            rec.advance(Event.ABORT)
        for rid in optional:
            if carried[rid]:
                self.requests[rid].advance(Event.ABORT)  # the stream keeps its "stop"

    def on_drop(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            rec = self.requests.get(rid)
            if rec is not None:
                rec.advance(Event.DROP)
            self.drop_queue.append(rid)

    def begin_drain(self) -> list[str]:
        """Ids a drain pass must carry: dropped and still live, or stopped at a stop string
        (the queue never nears the 1024-id pass limit)."""
        return [rid for rid in dict.fromkeys(self.drop_queue)
                if rid in self.requests and self.requests[rid].phase.abort_owed]

    def end_drain(self, due: Sequence[str], sends: Sequence[ToEngine]) -> None:
        self.check_sends("drain", sends, due)
        for rid in due:
            rec = self.requests[rid]
            rec.reason = "stop" if rec.phase is Phase.STOP_PENDING else "abort"
            rec.advance(Event.DRAIN)
        self.drop_queue.clear()

    def on_deliver(self, frames: Sequence[bytes]) -> None:
        """One engine message reaches the frontend core (before the core processes it)."""
        self.delivered += 1
        if self.fe_dead:
            return
        message = self.codec.decode_outputs(frames)  # our engines only send valid frames
        if isinstance(message, EngineDead):
            self.fe_dead = True
            for rec in self.order:
                if rec.phase.live:
                    rec.reason = "error"  # a stream already ended at "stop" keeps it
                rec.advance(Event.ENGINE_DEAD)
            self.drop_queue.clear()
            return
        for output in message.outputs:
            target = self.requests.get(output.request_id)
            if target is None:
                continue
            final = output.finish_reason is not None
            silent = output.finish_reason is m.FinishReason.STOP
            if target.phase.live and extend_until_stop(target, output.new_token_ids, silent):
                # vLLM: a stop string ends the stream with "stop"; the engine is aborted
                # unless this very output was the request's final one there.
                target.reason = "stop"
                target.advance(Event.FINAL_OUTPUT if final else Event.STOP_MATCHED)
                if not final:
                    self.drop_queue.append(target.rid)
            elif final:
                if target.phase.live:
                    target.reason = str(output.finish_reason)
                target.advance(Event.FINAL_OUTPUT)  # after a stop string: no ABORT owed
            else:
                target.advance(Event.OUTPUT)

    def _take_sent(self, context: str, identity: bytes, frames: Sequence[bytes]
                   ) -> tuple[int | None, object | None]:
        """One frame the core handed out: counted (known engine), flagged after death,
        decoded. Returns (its engine's rank, the message; None if it does not decode)."""
        rank = self.identities.get(bytes(identity))
        if rank is not None:
            self.sent_frames += 1
        if self.fe_dead:
            self.fail("fail_fast_after_death", f"{context} sent a frame to engine {rank} "
                      "after ENGINE_CORE_DEAD reached the frontend")
        try:
            return rank, self.codec.decode_engine_input(frames)
        except ProtocolError as exc:
            self.fail("valid_frames", f"{context} sent an undecodable frame: {exc}")
            return rank, None

    def check_sends(self, context: str, sends: Sequence[ToEngine], due: Sequence[str] | None,
                    optional: Sequence[str] = ()) -> collections.Counter[str]:
        """Check every frame a core call handed out; returns how often each id was aborted.

        `due`: ids this abort pass must carry (None: not an abort pass); `optional`: ids it
        may carry once.
        """
        due_set = set(due or ()) | set(optional)
        frames_per_rank: collections.Counter[int | None] = collections.Counter()
        carried: collections.Counter[str] = collections.Counter()
        for identity, frames in sends:
            rank, message = self._take_sent(context, identity, frames)
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
        elif rec.phase is Phase.FINISHED:
            self.fail("no_abort_after_finish", f"{context} aborted {rid} at engine {rank} "
                      f"after its final output ({rec.reason}) reached the frontend")
        elif rec.phase in (Phase.ABORTED, Phase.DRAINED):
            self.fail("abort_exactly_once", f"{context} aborted {rid} again (already "
                      f"{rec.state})")
        elif rec.phase is Phase.DEAD:
            self.fail("fail_fast_after_death", f"{context} aborted {rid} after death")
        else:
            self.fail("no_unrequested_abort", f"{context} aborted {rid} ({rec.state}) "
                      "although it was not part of this call")

    # ------------------------------------------------------------ checks

    def check_streams(self) -> None:
        for rec in self.order:
            h = rec.handle
            if rec.phase is Phase.OPEN:
                if h.ended:
                    self.fail("stream_state", f"{rec.rid} ended ({h.finish_reason}: {h.error}) "
                              "while it was live at the frontend")
            elif rec.phase is Phase.DROPPED:
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
            elif not text_agrees(h.text, rec.expected_text(), rec.stop, h.ended):
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
            want = 1 if rec.phase in (Phase.ABORTED, Phase.DRAINED) else 0
            if elsewhere:
                self.fail("abort_at_owner", f"{rec.rid} (owner {rec.owner}) was aborted at "
                          f"another engine {elsewhere} time(s)")
            if rec.phase.abort_owed:
                self.fail("abort_exactly_once", f"{rec.rid} ({rec.state}) was never aborted "
                          "after the drain loop ran")
            elif at_owner != want:
                invariant = ("no_abort_after_finish" if rec.phase is Phase.FINISHED
                             else "abort_exactly_once")
                self.fail(invariant, f"{rec.rid} ({rec.state}) reached its engine "
                          f"{rec.owner} in {at_owner} ABORT(s), expected {want}")
