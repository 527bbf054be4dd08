"""The request lifecycle table (harness/protocol/lifecycle.py) and the fuzz model that uses it."""

from __future__ import annotations

import itertools

import pytest

from harness.frontends.api import StreamHandle
from harness.protocol.lifecycle import (
    ABORT_OWED,
    LIVE,
    TERMINAL,
    TRANSITIONS,
    Event,
    LifecycleError,
    Phase,
    next_phase,
)
from harness.stateful.model import RequestModel


def test_every_phase_and_event_is_a_transition_or_a_typed_error() -> None:
    for phase, event in itertools.product(Phase, Event):
        if (phase, event) in TRANSITIONS:
            assert next_phase(phase, event) is TRANSITIONS[(phase, event)]
            continue
        with pytest.raises(LifecycleError) as info:
            next_phase(phase, event, "r-7")
        assert (info.value.phase, info.value.event) == (phase, event)
        assert phase.value in str(info.value) and event.value in str(info.value)
        assert "r-7" in str(info.value)


FRONTEND_PHASES = {phase for phase, _ in TRANSITIONS}
FRONTEND_EVENTS = {event for _, event in TRANSITIONS}


def test_an_ended_request_is_never_aborted_again() -> None:
    """The double abort the suites hunt is not a transition, from any terminal phase."""
    for phase in TERMINAL:
        for event in (Event.ABORT, Event.DRAIN):
            assert (phase, event) not in TRANSITIONS
        for event in FRONTEND_EVENTS - {Event.ABORT, Event.DRAIN}:
            assert next_phase(phase, event) is phase  # late outputs, drops, death: nothing
    assert (Phase.OPEN, Event.DRAIN) not in TRANSITIONS  # nothing queued: nothing drained


def test_phase_groups_partition_the_phases() -> None:
    assert LIVE | {Phase.STOP_PENDING} | TERMINAL == FRONTEND_PHASES
    assert not LIVE & TERMINAL and {Phase.DROPPED, Phase.STOP_PENDING} == ABORT_OWED
    assert [p.value for p in Phase][:7] == ["open", "dropped", "stop_pending", "finished",
                                            "aborted", "drained", "dead"]  # replay files
    assert {Event.DROP, Event.ABORT, Event.DRAIN, Event.OUTPUT, Event.STOP_MATCHED,
            Event.FINAL_OUTPUT, Event.ENGINE_DEAD} == FRONTEND_EVENTS
    with pytest.raises(TypeError):
        TRANSITIONS[(Phase.OPEN, Event.DRAIN)] = Phase.DRAINED  # type: ignore[index]


def test_every_phase_with_an_abort_owed_can_pay_it() -> None:
    for phase in ABORT_OWED:
        assert next_phase(phase, Event.DRAIN) is Phase.DRAINED
        assert next_phase(phase, Event.ABORT) is Phase.ABORTED
        assert next_phase(phase, Event.FINAL_OUTPUT) is Phase.FINISHED  # the engine did


def test_the_model_request_moves_only_along_the_table() -> None:
    rec = RequestModel(0, "r1", 0, None, StreamHandle([11, 20, 20]))
    rec.advance(Event.DROP)
    rec.advance(Event.DRAIN)
    assert (rec.phase, rec.state) == (Phase.DRAINED, "drained")
    with pytest.raises(LifecycleError, match="request r1 in phase 'drained' cannot take "
                                             "event 'abort'"):
        rec.advance(Event.ABORT)
    assert rec.phase is Phase.DRAINED
