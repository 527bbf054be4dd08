"""One request's lifecycle on the frontend side of the wire, with its transitions as data.

A request is written three times in corewire (the mock engine's live/finished/aborted
sets, the reference core's requests + pending_drops + stop_aborts, the fuzz model), and
each copy used to spell the rules in its own vocabulary. This module is the one
vocabulary: a `Phase` per state of a request as the frontend owes it to the engine, an
`Event` per thing that can happen to it, and `TRANSITIONS`, an h11-style table
``(phase, event) -> phase``. What the table does not list is not a no-op but a
`LifecycleError` that names the phase and the event, so a model or core that feeds an
impossible event fails loudly instead of drifting.

Role-agnostic on purpose: no sockets, no codec, no frontend or engine types. Two users
move requests only through this table:

* the fuzz model (harness/stateful/model.py), from the wire alone;
* the reference frontend core (harness/frontends/reference/core.py): each `RequestState`
  carries its `Phase`, and `ReferenceFrontendCore._advance` is the one place a phase
  changes. `requests` (LIVE), `stopped` (STOP_PENDING) and `ended` (terminal, the newest
  MAX_ENDED kept) are indexes it keeps in step, so "abort of a finished id" is a lookup of
  that id's phase. The engine's events (OUTPUT, STOP_MATCHED,
  FINAL_OUTPUT, ENGINE_DEAD) are legal in every phase, so nothing an engine sends can be an
  illegal transition; ABORT and DRAIN come from the core itself, and one the table refuses
  is a bug of ours, raised as `LifecycleError`. Each transition sits in one small method
  a mutant overrides (`_finish`, `end_at_stop`, `drain_ranks`, `explicit_abort_ranks`,
  `on_ended_output`, `on_finished_requests`, `mark_dead`).

Still to adopt it: the mock engine (mock_engines/engine.py) would replace its live /
finished / aborted sets with one phase per id; it sees ADD, ABORT, its own final output
and death, not DROP or DRAIN. It needs an event for the ADD (a phase before OPEN) and must
treat a `LifecycleError` raised by what the frontend sent (a late ABORT, a duplicate ADD)
as the frontend's fault: recorded as evidence and otherwise ignored, as today, never a
crash. Resumable sessions would need phases of their own.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping


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
    """What can happen to a request, from either side of the wire."""

    DROP = "drop"  # the client dropped the stream (queued for the drain pass)
    ABORT = "abort"  # an explicit abort pass carried its id to the owning engine
    DRAIN = "drain"  # the drain pass carried its id to the owning engine
    OUTPUT = "output"  # a non-final output reached the frontend
    STOP_MATCHED = "stop_matched"  # a non-final output completed a stop string
    FINAL_OUTPUT = "final_output"  # the engine's final output reached the frontend
    ENGINE_DEAD = "engine_dead"  # ENGINE_CORE_DEAD reached the frontend


LIVE = frozenset({Phase.OPEN, Phase.DROPPED})
ABORT_OWED = frozenset({Phase.DROPPED, Phase.STOP_PENDING})
TERMINAL = frozenset({Phase.FINISHED, Phase.ABORTED, Phase.DRAINED, Phase.DEAD})

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
    """An event the lifecycle table has no transition for, in the phase it arrived in."""

    def __init__(self, phase: Phase, event: Event, request_id: str | None = None) -> None:
        subject = f"request {request_id}" if request_id is not None else "a request"
        super().__init__(f"{subject} in phase {phase.value!r} cannot take event "
                         f"{event.value!r} (no such transition)")
        self.phase = phase
        self.event = event
        self.request_id = request_id


def next_phase(phase: Phase, event: Event, request_id: str | None = None) -> Phase:
    """The phase `event` moves a request in `phase` to; LifecycleError if none."""
    try:
        return TRANSITIONS[(phase, event)]
    except KeyError:
        raise LifecycleError(phase, event, request_id) from None
