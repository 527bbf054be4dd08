"""The ENGINE role of the lifecycle table, and the mock engine that moves only through it.

The table tests walk every (phase, event) pair; the engine tests feed a `MockEngineCore`
what a faulty or racing frontend sends (a duplicate ADD, a late or repeated ABORT, input
after death, streaming-input sessions) and check that the phase, the outputs and the
evidence are what the table says, and that nothing crashes.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Sequence

import pytest

from harness.protocol.lifecycle import (
    ENGINE_HOLDING,
    ENGINE_NOT_HELD,
    ENGINE_PHASES,
    ENGINE_TRANSITIONS,
    TABLES,
    TRANSITIONS,
    Event,
    LifecycleError,
    Phase,
    Role,
    next_phase,
)
from harness.protocol.wire import DEFAULT_CODEC
from harness.protocol.wire import messages as m
from mock_engines import (
    Die,
    Emit,
    EngineScript,
    Finish,
    FinishedOnly,
    MockEngineCore,
    any_request,
    by_id,
)
from mock_engines.engine import REFUSED_KEPT, Outgoing

C = DEFAULT_CODEC
T0 = 1000.0
E, P = Event, Phase

# --------------------------------------------------------------------------- the table


def test_every_engine_phase_and_event_is_a_transition_or_a_typed_error() -> None:
    for phase, event in itertools.product(Phase, Event):
        if (phase, event) in ENGINE_TRANSITIONS:
            assert next_phase(phase, event, role=Role.ENGINE) is ENGINE_TRANSITIONS[
                (phase, event)]
            continue
        with pytest.raises(LifecycleError) as info:
            next_phase(phase, event, "r-9", role=Role.ENGINE)
        err = info.value
        assert (err.phase, err.event, err.request_id, err.role) == (
            phase, event, "r-9", Role.ENGINE)
        for word in (phase.value, event.value, "r-9", "engine"):
            assert word in str(err)


def test_the_engine_table_stays_inside_the_engine_phases() -> None:
    assert TABLES[Role.ENGINE] is ENGINE_TRANSITIONS and TABLES[Role.FRONTEND] is TRANSITIONS
    for (phase, _event), after in ENGINE_TRANSITIONS.items():
        assert phase in ENGINE_PHASES and after in ENGINE_PHASES
    assert ENGINE_HOLDING.isdisjoint(ENGINE_NOT_HELD) and P.DEAD not in ENGINE_HOLDING
    assert not {key for key in ENGINE_TRANSITIONS if key[0] is P.DEAD}  # dead takes nothing
    with pytest.raises(TypeError):
        ENGINE_TRANSITIONS[(P.NEW, E.ABORT)] = P.ABORTED  # type: ignore[index]


def test_the_roles_do_not_share_rules() -> None:
    """The frontend never sees NEW or an ADD event; the engine never sees a drop."""
    with pytest.raises(LifecycleError, match="no such frontend transition"):
        next_phase(P.NEW, E.ADD)
    for event in (E.DROP, E.DRAIN, E.STOP_MATCHED):
        assert not {key for key in ENGINE_TRANSITIONS if key[1] is event}


def walk(events: Sequence[Event], start: Phase = P.NEW) -> list[Phase]:
    phases = [start]
    for event in events:
        phases.append(next_phase(phases[-1], event, role=Role.ENGINE))
    return phases[1:]


def test_legal_engine_paths() -> None:
    assert walk([E.ADD, E.OUTPUT, E.FINAL_OUTPUT, E.ADD]) == [
        P.OPEN, P.OPEN, P.FINISHED, P.OPEN]  # a reused id starts afresh
    assert walk([E.ADD, E.ABORT, E.ADD_RESUMABLE]) == [P.OPEN, P.ABORTED, P.SEGMENT]
    assert walk([E.ADD, E.RETIRE]) == [P.OPEN, P.FINISHED]
    assert walk([E.ADD_RESUMABLE, E.ADD_RESUMABLE, E.OUTPUT, E.SEGMENT_END,
                 E.ADD_RESUMABLE, E.SEGMENT_END, E.ADD]) == [
        P.SEGMENT, P.SEGMENT, P.SEGMENT, P.AWAITING_INPUT, P.SEGMENT, P.AWAITING_INPUT,
        P.FINISHED]
    assert walk([E.ADD_RESUMABLE, E.FINAL_OUTPUT]) == [P.SEGMENT, P.FINISHED]  # error/abort
    assert walk([E.ADD_RESUMABLE, E.SEGMENT_END, E.ABORT]) == [
        P.SEGMENT, P.AWAITING_INPUT, P.ABORTED]
    for phase in ENGINE_HOLDING:
        assert next_phase(phase, E.ENGINE_DEAD, role=Role.ENGINE) is P.DEAD


@pytest.mark.parametrize(("phase", "event"), [
    (P.OPEN, E.ADD), (P.OPEN, E.ADD_RESUMABLE),  # a duplicate ADD of a live id
    (P.NEW, E.ABORT), (P.FINISHED, E.ABORT), (P.ABORTED, E.ABORT),  # unknown / late / twice
    (P.OPEN, E.SEGMENT_END), (P.AWAITING_INPUT, E.OUTPUT),  # the engine's own bugs
    (P.DEAD, E.ADD), (P.DEAD, E.ABORT), (P.FINISHED, E.ENGINE_DEAD),
])
def test_refused_engine_transitions(phase: Phase, event: Event) -> None:
    with pytest.raises(LifecycleError):
        next_phase(phase, event, "x", role=Role.ENGINE)


def test_the_architecture_doc_shows_the_engine_table_as_it_is() -> None:
    """docs/architecture.md's ENGINE table, cell by cell ("refused" and "error" both mean
    no transition; "(queued)" annotates the phase)."""
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    section = doc.split("### ENGINE role", 1)[1]
    rows = [line.strip("|").split("|") for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    events = [Event[cell.strip()] for cell in rows[0][1:]]
    shown: dict[tuple[Phase, Event], Phase] = {}
    for row in rows[1:]:
        for name in row[0].split(","):
            for event, cell in zip(events, row[1:], strict=True):
                word = cell.split("(")[0].strip()
                if word not in ("refused", "error"):
                    shown[(Phase[name.strip()], event)] = Phase[word]
    assert shown == dict(ENGINE_TRANSITIONS)


# --------------------------------------------------------------------------- the engine


def request(rid: str, *, resumable: bool = False, client_index: int = 0,
            abort_immediately: bool = False) -> m.EngineCoreRequest:
    params = m.SamplingParams(temperature=0.0, max_tokens=3)
    return m.EngineCoreRequest(rid, [1, 2], None, params, None, 1.0, None, None, None,
                               client_index=client_index, resumable=resumable,
                               abort_immediately=abort_immediately)


def add(core: MockEngineCore, req: m.EngineCoreRequest, now: float = T0) -> None:
    core.receive(C.encode_add(req), now)


def abort(core: MockEngineCore, *rids: str, now: float = T0) -> None:
    core.receive(C.encode_abort(list(rids)), now)


def outputs(items: list[Outgoing]) -> list[m.EngineCoreOutputs]:
    msgs = [C.decode_outputs(item.frames) for item in items]
    return [msg for msg in msgs if isinstance(msg, m.EngineCoreOutputs)]


def deltas(items: list[Outgoing]) -> list[tuple[str, list[int], m.FinishReason | None]]:
    return [(o.request_id, o.new_token_ids, o.finish_reason)
            for msg in outputs(items) for o in msg.outputs]


def finished_lists(items: list[Outgoing]) -> list[str]:
    return [rid for msg in outputs(items) for rid in msg.finished_requests or []]


def refused(core: MockEngineCore) -> list[tuple[Phase, Event, str | None]]:
    return [(e.phase, e.event, e.request_id) for e in core.refused]


def test_duplicate_add_of_a_live_id_is_recorded_and_ignored() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request(
        [Emit([100]), Finish(m.FinishReason.LENGTH, [101])])]), codec=DEFAULT_CODEC)
    add(core, request("r"))
    add(core, request("r"))
    assert [r.request_id for r in core.transcript.adds()] == ["r", "r"]  # the evidence
    assert refused(core) == [(P.OPEN, E.ADD, "r")] and core.counts() == (0, 1)
    assert deltas(core.poll(T0)) + deltas(core.poll(T0)) == [
        ("r", [100], None), ("r", [101], m.FinishReason.LENGTH)]  # one stream, not two
    assert core.poll(T0) == [] and core.phase_of("r") is P.FINISHED


def test_late_and_repeated_aborts_are_recorded_and_ignored() -> None:
    core = MockEngineCore(0, EngineScript(report_finished=True, rules=[
        by_id("done", [Finish(m.FinishReason.STOP, [7])]), any_request([Emit([100])])]),
                codec=DEFAULT_CODEC)
    add(core, request("done"))
    add(core, request("held"))
    first = core.poll(T0)
    assert finished_lists(first) == ["done"]
    abort(core, "done", "held", "never-sent")
    abort(core, "held")
    assert finished_lists(core.poll(T0)) == ["held"]  # listed once, for the live abort only
    assert refused(core) == [(P.FINISHED, E.ABORT, "done"), (P.NEW, E.ABORT, "never-sent"),
                             (P.ABORTED, E.ABORT, "held")]
    assert core.transcript.aborted_ids() == ["done", "held", "never-sent", "held"]
    assert (core.phase_of("done"), core.phase_of("held"), core.phase_of("never-sent")) == (
        P.FINISHED, P.ABORTED, P.NEW)
    assert core.poll(T0 + 5) == [] and core.counts() == (0, 0)


def test_an_ended_id_added_again_runs_afresh() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request([Finish(m.FinishReason.LENGTH,
                                                                     [5])])]), codec=DEFAULT_CODEC)
    add(core, request("r"))
    assert deltas(core.poll(T0)) == [("r", [5], m.FinishReason.LENGTH)]
    add(core, request("r"))
    assert deltas(core.poll(T0)) == [("r", [5], m.FinishReason.LENGTH)]
    assert core.phase_of("r") is P.FINISHED and not core.refused


def test_abort_immediately_and_silent_requests_are_held_then_aborted() -> None:
    core = MockEngineCore(0, EngineScript(rules=[by_id("silent", [])]), codec=DEFAULT_CODEC)
    add(core, request("gone", abort_immediately=True))
    add(core, request("silent"))
    assert core.phase_of("gone") is P.ABORTED and core.phase_of("silent") is P.OPEN
    assert core.counts() == (0, 0) and core.poll(T0) == []  # nothing scheduled
    add(core, request("silent"))
    abort(core, "silent")
    assert refused(core) == [(P.OPEN, E.ADD, "silent")]
    assert core.phase_of("silent") is P.ABORTED and not core.held


def test_retire_and_death_move_held_requests_only() -> None:
    core = MockEngineCore(0, EngineScript(rules=[
        by_id("quiet", [FinishedOnly()]), by_id("done", [Finish(m.FinishReason.STOP, [1])]),
        any_request([Emit([1]), Die(delay=1.0)])]), codec=DEFAULT_CODEC)
    for rid in ("quiet", "done", "victim"):
        add(core, request(rid))
    core.poll(T0)
    assert core.ids_in(P.FINISHED) == {"quiet", "done"}
    core.poll(T0 + 1)
    assert core.dead and core.phase_of("victim") is P.DEAD
    assert core.ids_in(P.FINISHED) == {"quiet", "done"}  # ended before: untouched
    add(core, request("victim"))
    abort(core, "victim")  # a dead engine reads nothing more: no table, no evidence
    assert core.phase_of("victim") is P.DEAD and not core.refused
    assert len(core.transcript.adds()) == 4


def test_a_session_moves_through_segments_and_closes() -> None:
    seg = [Emit([10]), Finish(m.FinishReason.STOP, [11])]
    core = MockEngineCore(0, EngineScript(report_finished=True, rules=[any_request(seg)]),
            codec=DEFAULT_CODEC)
    add(core, request("s", resumable=True))
    assert core.phase_of("s") is P.SEGMENT
    add(core, request("s", resumable=True))  # arrives while the segment runs: queued
    assert core.phase_of("s") is P.SEGMENT and len(core.running["s"].queued) == 1
    assert deltas(core.poll(T0)) == [("s", [10], None)]
    assert deltas(core.poll(T0)) == [("s", [11], m.FinishReason.STOP)]
    assert core.phase_of("s") is P.SEGMENT  # the queued input is the next segment
    core.poll(T0)
    end = core.poll(T0)
    assert deltas(end) == [("s", [11], m.FinishReason.STOP)] and finished_lists(end) == []
    assert core.phase_of("s") is P.AWAITING_INPUT and core.counts() == (0, 0)
    add(core, request("s"))  # the closing input
    assert core.phase_of("s") is P.FINISHED and finished_lists(core.poll(T0)) == ["s"]
    assert not core.refused and not core.held


def test_a_session_between_segments_is_aborted_once() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request(
        [Finish(m.FinishReason.LENGTH, [3])])]), codec=DEFAULT_CODEC)
    add(core, request("s", resumable=True))
    core.poll(T0)
    assert core.phase_of("s") is P.AWAITING_INPUT
    abort(core, "s")
    abort(core, "s")
    assert core.phase_of("s") is P.ABORTED and refused(core) == [(P.ABORTED, E.ABORT, "s")]


def test_an_error_ends_the_whole_session() -> None:
    core = MockEngineCore(0, EngineScript(rules=[any_request(
        [Finish(m.FinishReason.ERROR, error=m.RequestError("internal_error", "x"))])]),
                codec=DEFAULT_CODEC)
    add(core, request("s", resumable=True))
    core.poll(T0)
    assert core.phase_of("s") is P.FINISHED


def test_refused_evidence_is_bounded() -> None:
    core = MockEngineCore(0, codec=DEFAULT_CODEC)
    abort(core, *(f"ghost-{i}" for i in range(REFUSED_KEPT + 50)))
    assert len(core.refused) == REFUSED_KEPT
    assert core.refused[-1].request_id == f"ghost-{REFUSED_KEPT + 49}"
    assert core.refused[-1].__traceback__ is None
    assert not core.phases  # an ABORT of an unknown id leaves no phase behind
