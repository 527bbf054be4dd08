"""harness/frontends/reference/waiters.py: the waiter and drain logic both transports share.

Checked on a real `ReferenceFrontendCore` with real frames (no sockets: the module has none).
"""

from __future__ import annotations

import pytest

from harness.frontends.reference.core import MAX_ABORT_BATCH, EngineDeadError, ReferenceFrontendCore
from harness.frontends.reference.waiters import (
    SyncWaiter,
    UtilityWaiters,
    drain_pass,
    no_reply,
    take_output,
)
from harness.protocol.transport.sockets import engine_identity
from harness.protocol.wire import DEFAULT_CODEC
from harness.protocol.wire import messages as m
from tests.reference_cores import ready_core

RANKS = (0, 1)


def _core() -> ReferenceFrontendCore:
    return ready_core(RANKS)


def _reply(call_id: int, rank: int, value: object) -> list[bytes]:
    return DEFAULT_CODEC.encode_outputs(m.EngineCoreOutputs(
        rank, [], None, 0.0, utility_output=m.UtilityOutput(call_id, None,
                                                            m.UtilityResult(None, value))))


def test_a_call_completes_once_every_engine_answered() -> None:
    core, waiters, waiter = _core(), UtilityWaiters[SyncWaiter](), SyncWaiter()
    with waiters.call(core, "is_sleeping", [], waiter) as (call, sends):
        assert [identity for identity, _ in sends] == [engine_identity(r) for r in RANKS]
        (first, rank0), (second, rank1) = sorted(call.call_ids.items())
        assert not take_output(core, _reply(second, rank1, True), waiters)
        assert not waiter.done()
        take_output(core, _reply(first, rank0, False), waiters)
        assert waiter.result is call and waiter.exception is None
    assert core.utility_values(call) == [False, True]
    assert len(waiters) == 0 and core.utilities == {}


def test_leaving_the_call_unregisters_it_so_a_late_reply_is_dropped() -> None:
    core, waiters, waiter = _core(), UtilityWaiters[SyncWaiter](), SyncWaiter()
    with pytest.raises(RuntimeError), waiters.call(core, "is_sleeping", [], waiter) as (call, _):
        raise RuntimeError("the caller gave up")  # a timeout or a cancellation
    assert len(waiters) == 0 and core.utilities == {}
    for call_id, rank in call.call_ids.items():
        take_output(core, _reply(call_id, rank, True), waiters)
    assert not waiter.done()
    assert "[0, 1] within 2s" in str(no_reply(call, "within 2s"))


def test_death_fails_only_the_pending_calls() -> None:
    core, waiters = _core(), UtilityWaiters[SyncWaiter]()
    answered, pending = SyncWaiter(), SyncWaiter()
    with waiters.call(core, "is_sleeping", [], answered) as (call, _), \
            waiters.call(core, "is_sleeping", [], pending):
        for call_id, rank in call.call_ids.items():
            take_output(core, _reply(call_id, rank, True), waiters)
        take_output(core, DEFAULT_CODEC.encode_engine_dead(), waiters)
        assert core.dead is not None
        waiters.fail_all(core.dead)
    assert answered.result is call and answered.exception is None
    assert isinstance(pending.exception, EngineDeadError)


def test_a_drain_pass_says_whether_ids_are_left() -> None:
    core = _core()
    handles = [core.add_request([11, 20, i], 4)[0] for i in range(MAX_ABORT_BATCH + 6)]
    core.queue_drop([h.request_id for h in handles if h.request_id is not None])
    sends, more = drain_pass(core)
    carried = [DEFAULT_CODEC.decode_engine_input(frames) for _, frames in sends]
    assert more and sum(len(a.request_ids) for a in carried) == MAX_ABORT_BATCH
    sends, more = drain_pass(core)
    assert not more and len(sends) >= 1
    assert drain_pass(core) == ([], False)
