"""One request's lifecycle on each side of the wire, with its transitions as data.

A request used to be written three times in corewire (the mock engine's live/finished/
aborted sets, the reference core's requests + pending_drops + stop_aborts, the fuzz
model), each copy spelling the rules in its own vocabulary. This module is the one
vocabulary, h11-style: one `Phase` per state a request can be in, one `Event` per thing
that can happen to it, and one transition table ``(phase, event) -> phase`` per `Role`
(h11 has one per client and server; here FRONTEND and ENGINE see the same request from
the two ends of one connection). What a role's table does not list is not a no-op but a
`LifecycleError` that names the role, the phase and the event, so a model or core that
feeds an impossible event fails loudly instead of drifting.

* FRONTEND (`TRANSITIONS`): the request as the frontend owes it to its engine: open,
  dropped, stopped at a stop string, then finished / aborted / drained / dead. Two users
  move requests only through it: the fuzz model (harness/stateful/model.py), from the wire
  alone, and the reference frontend core (harness/frontends/reference/core.py): each
  `RequestState` carries its `Phase`, and `ReferenceFrontendCore._advance` is the one place
  a phase changes. `requests` (LIVE), `stopped` (STOP_PENDING) and `ended` (terminal, the
  newest MAX_ENDED kept) are indexes it keeps in step, so "abort of a finished id" is a
  lookup of that id's phase. The engine's events (OUTPUT, STOP_MATCHED, FINAL_OUTPUT,
  ENGINE_DEAD) are legal in every phase, so nothing an engine sends can be an illegal
  transition; ABORT and DRAIN come from the core itself, and one the table refuses is a bug
  of ours, raised as `LifecycleError`. Each transition sits in one small method a mutant
  overrides (`_finish`, `end_at_stop`, `drain_ranks`, `explicit_abort_ranks`,
  `on_ended_output`, `on_finished_requests`, `mark_dead`).
* ENGINE (`ENGINE_TRANSITIONS`): the request as one engine core sees it: an ADD (from
  NEW, the phase of an id it never saw), ABORT, its own outputs and final output, a
  silent retire, a resumable session's segments, its own death. The mock engine
  (mock_engines/engine.py) keeps one phase per request id and moves it only through this
  table. An ADD or ABORT the table refuses is the frontend's doing (a duplicate ADD of a
  live id, an ABORT of an ended or unknown id): the engine keeps the `LifecycleError` as
  evidence (the transcript holds the frame) and otherwise ignores it, never crashes.

Role-agnostic on purpose: no sockets, no codec, no frontend or engine types.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping


class Role(enum.Enum):
    """Which end of the wire a transition table describes (h11: client / server)."""

    FRONTEND = "frontend"  # the process that sends ADDs and ABORTs and reads outputs
    ENGINE = "engine"  # one engine core (one DP rank) that serves them


class Phase(enum.Enum):
    """Where a request stands between the frontend that sent its ADD and its engine.

    The values are the strings replay files have always carried.
    """

    OPEN = "open"  # live at the frontend, its stream open
    DROPPED = "dropped"  # the client went away; queued for the abort drain pass
    STOP_PENDING = "stop_pending"  # ended at a frontend-side stop string; ABORT owed
    FINISHED = "finished"  # the engine's final output reached the frontend
    ABORTED = "aborted"  # an explicit abort carried it to its engine
    DRAINED = "drained"  # the drain pass carried its ABORT to its engine
    DEAD = "dead"  # ENGINE_CORE_DEAD reached the frontend while it was owed something
    # ENGINE role only (the frontend role reuses none of them):
    NEW = "new"  # the engine holds no ADD for this id (never saw one, or not yet)
    SEGMENT = "segment"  # a resumable (streaming-input) session's segment runs; an ADD
    #                      arriving meanwhile waits for it as the session's next input
    AWAITING_INPUT = "awaiting_input"  # a session between segments; its next ADD runs
    #                                    (vLLM RequestStatus.WAITING_FOR_STREAMING_REQ)

    @property
    def live(self) -> bool:
        """The engine still works on it and the client still wants it."""
        return self in LIVE

    @property
    def abort_owed(self) -> bool:
        """The frontend owes the engine exactly one ABORT for it (drain pass or abort)."""
        return self in ABORT_OWED

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class Event(enum.Enum):
    """What can happen to a request, from either side of the wire.

    Shared members mean the same act seen from the role's end: for the ENGINE role ABORT
    is "an ABORT naming the id arrived", OUTPUT / FINAL_OUTPUT "the engine sent one"
    (FINAL_OUTPUT: with any finish reason that ends the request: stop, length, abort,
    error), ENGINE_DEAD "the engine itself died".
    """

    DROP = "drop"  # the client dropped the stream (queued for the drain pass)
    ABORT = "abort"  # an explicit abort pass carried its id to the owning engine
    DRAIN = "drain"  # the drain pass carried its id to the owning engine
    OUTPUT = "output"  # a non-final output reached the frontend
    STOP_MATCHED = "stop_matched"  # a non-final output completed a stop string
    FINAL_OUTPUT = "final_output"  # the engine's final output reached the frontend
    ENGINE_DEAD = "engine_dead"  # ENGINE_CORE_DEAD reached the frontend
    # ENGINE role only:
    ADD = "add"  # an ADD for the id arrived, not resumable (a plain request, or the
    #              closing input of a streaming-input session)
    ADD_RESUMABLE = "add_resumable"  # an ADD with resumable=True (a session's segment)
    SEGMENT_END = "segment_end"  # a resumable request's final output ended with stop or
    #                              length: the segment is over, not the session
    RETIRE = "retire"  # the engine dropped it without a final output, listing it in
    #                    finished_requests only (script step FinishedOnly)


# ========================================================================= FRONTEND role

LIVE = frozenset({Phase.OPEN, Phase.DROPPED})
ABORT_OWED = frozenset({Phase.DROPPED, Phase.STOP_PENDING})
TERMINAL = frozenset({Phase.FINISHED, Phase.ABORTED, Phase.DRAINED, Phase.DEAD})
FRONTEND_PHASES = LIVE | {Phase.STOP_PENDING} | TERMINAL  # the frontend role's phases

_P, _E = Phase, Event
_TABLE: dict[tuple[Phase, Event], Phase] = {
    (_P.OPEN, _E.DROP): _P.DROPPED,
    (_P.OPEN, _E.ABORT): _P.ABORTED,
    (_P.OPEN, _E.OUTPUT): _P.OPEN,
    (_P.OPEN, _E.STOP_MATCHED): _P.STOP_PENDING,
    (_P.OPEN, _E.FINAL_OUTPUT): _P.FINISHED,
    (_P.OPEN, _E.ENGINE_DEAD): _P.DEAD,

    (_P.DROPPED, _E.DROP): _P.DROPPED,  # dropping twice queues nothing new
    (_P.DROPPED, _E.ABORT): _P.ABORTED,  # an explicit abort beats the drain pass
    (_P.DROPPED, _E.DRAIN): _P.DRAINED,
    (_P.DROPPED, _E.OUTPUT): _P.DROPPED,  # still live at the engine until the ABORT
    (_P.DROPPED, _E.STOP_MATCHED): _P.STOP_PENDING,
    (_P.DROPPED, _E.FINAL_OUTPUT): _P.FINISHED,  # the engine ended it first: no ABORT
    (_P.DROPPED, _E.ENGINE_DEAD): _P.DEAD,

    (_P.STOP_PENDING, _E.DROP): _P.STOP_PENDING,
    (_P.STOP_PENDING, _E.ABORT): _P.ABORTED,  # the stream keeps its "stop"
    (_P.STOP_PENDING, _E.DRAIN): _P.DRAINED,
    (_P.STOP_PENDING, _E.OUTPUT): _P.STOP_PENDING,  # the stream ended; output ignored
    (_P.STOP_PENDING, _E.STOP_MATCHED): _P.STOP_PENDING,
    (_P.STOP_PENDING, _E.FINAL_OUTPUT): _P.FINISHED,  # retired by the engine: no ABORT
    (_P.STOP_PENDING, _E.ENGINE_DEAD): _P.DEAD,
}
# Once a request is over, the client may still drop its stream and the engines may still
# send (late outputs are ignored) or die: nothing changes. An ABORT or a drain of an ended
# request is never legal: it is the double abort the suites hunt.
for _phase in TERMINAL:
    for _event in (Event.DROP, Event.OUTPUT, Event.STOP_MATCHED, Event.FINAL_OUTPUT,
                   Event.ENGINE_DEAD):
        _TABLE[(_phase, _event)] = _phase
del _phase, _event
TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = types.MappingProxyType(_TABLE)


class LifecycleError(Exception):
    """An event a role's lifecycle table has no transition for, in the phase it arrived in."""

    def __init__(self, phase: Phase, event: Event, request_id: str | None = None, *,
                 role: Role = Role.FRONTEND) -> None:
        subject = f"request {request_id}" if request_id is not None else "a request"
        super().__init__(f"{subject} in phase {phase.value!r} cannot take event "
                         f"{event.value!r} (no such {role.value} transition)")
        self.phase = phase
        self.event = event
        self.request_id = request_id
        self.role = role


def next_phase(phase: Phase, event: Event, request_id: str | None = None, *,
               role: Role = Role.FRONTEND) -> Phase:
    """The phase `event` moves a request in `phase` to in `role`'s table; LifecycleError
    if that table has none."""
    try:
        return TABLES[role][(phase, event)]
    except KeyError:
        raise LifecycleError(phase, event, request_id, role=role) from None


# =========================================================================== ENGINE role
# What one engine core sees of a request id. Phases: NEW (no ADD held), OPEN (a plain
# request runs), SEGMENT / AWAITING_INPUT (a streaming-input session runs a segment /
# waits for its next input), then FINISHED (its final output went out, or it retired
# silently), ABORTED (an ABORT removed it) or DEAD (the engine died holding it).

# No ADD held: an ADD starts the id afresh (vLLM's scheduler forgets ended requests), an
# ABORT is refused.
ENGINE_NOT_HELD = frozenset({Phase.NEW, Phase.FINISHED, Phase.ABORTED})
ENGINE_HOLDING = frozenset({Phase.OPEN, Phase.SEGMENT, Phase.AWAITING_INPUT})
ENGINE_PHASES = ENGINE_NOT_HELD | ENGINE_HOLDING | {Phase.DEAD}

_ENGINE: dict[tuple[Phase, Event], Phase] = {
    (_P.OPEN, _E.OUTPUT): _P.OPEN,
    (_P.OPEN, _E.FINAL_OUTPUT): _P.FINISHED,
    (_P.OPEN, _E.RETIRE): _P.FINISHED,
    (_P.OPEN, _E.ABORT): _P.ABORTED,
    (_P.OPEN, _E.ENGINE_DEAD): _P.DEAD,
    # (OPEN, ADD | ADD_RESUMABLE) is absent: a duplicate ADD of a live id is refused (vLLM
    # 0.33.0 asserts "duplicate request id", v1/core/sched/scheduler.py:2936).

    (_P.SEGMENT, _E.ADD): _P.SEGMENT,  # queued: it closes the session once the segment ends
    (_P.SEGMENT, _E.ADD_RESUMABLE): _P.SEGMENT,  # queued: the next segment
    (_P.SEGMENT, _E.OUTPUT): _P.SEGMENT,
    (_P.SEGMENT, _E.SEGMENT_END): _P.AWAITING_INPUT,
    (_P.SEGMENT, _E.FINAL_OUTPUT): _P.FINISHED,  # abort / error end the whole session
    (_P.SEGMENT, _E.RETIRE): _P.FINISHED,
    (_P.SEGMENT, _E.ABORT): _P.ABORTED,
    (_P.SEGMENT, _E.ENGINE_DEAD): _P.DEAD,

    (_P.AWAITING_INPUT, _E.ADD_RESUMABLE): _P.SEGMENT,  # the next segment runs
    (_P.AWAITING_INPUT, _E.ADD): _P.FINISHED,  # the input closed: the session is over
    (_P.AWAITING_INPUT, _E.ABORT): _P.ABORTED,
    (_P.AWAITING_INPUT, _E.ENGINE_DEAD): _P.DEAD,
}
# An id the engine holds no ADD for starts afresh on an ADD (a reused id is a new request:
# vLLM's scheduler drops ended requests from `self.requests`, scheduler.py:2932-2949); an
# ABORT of it is refused (too late, or never sent: ignored).
# DEAD takes nothing: a dead engine reads no more input and sends nothing.
for _phase in ENGINE_NOT_HELD:
    _ENGINE[(_phase, Event.ADD)] = Phase.OPEN
    _ENGINE[(_phase, Event.ADD_RESUMABLE)] = Phase.SEGMENT
del _phase
ENGINE_TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = types.MappingProxyType(_ENGINE)

TABLES: Mapping[Role, Mapping[tuple[Phase, Event], Phase]] = types.MappingProxyType({
    Role.FRONTEND: TRANSITIONS, Role.ENGINE: ENGINE_TRANSITIONS})
