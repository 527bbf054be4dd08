"""The probe: the frontend core's wire boundary, observed without changing what it does.

The model must never ask the core what it did (a buggy core would answer for itself), so
the probe shadows the core's boundary methods and hands the model exactly the frames the
core takes in and hands out: the frontend's wire boundary minus the socket, which is why
the model is exact in both worlds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.frontends.api import StreamHandle
from harness.frontends.reference.core import PendingUtility, ReferenceFrontendCore, ToEngine
from harness.stateful.model import WireModel


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
                   stop: Sequence[str] | None = None) -> tuple[StreamHandle, ToEngine]:
        handle, send = add_request(prompt, max_tokens, data_parallel_rank=data_parallel_rank,
                                   stop=stop)
        model.on_add(handle, send, data_parallel_rank, stop)
        return handle, send

    def probed_abort(request_ids: Sequence[str]) -> list[ToEngine]:
        ids = list(request_ids)
        due, optional = model.begin_abort(ids)
        sends = abort(ids)
        model.end_abort(due, optional, sends)
        return sends

    def probed_drop(request_ids: Sequence[str]) -> None:
        ids = list(request_ids)
        model.on_drop(ids)
        queue_drop(ids)

    def probed_drain() -> list[ToEngine]:
        due = model.begin_drain()
        sends = drain()
        model.end_drain(due, sends)
        return sends

    def probed_utility(method: str, args: Sequence[Any]) -> tuple[PendingUtility, list[ToEngine]]:
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
