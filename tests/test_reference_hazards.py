"""Hazards of the reference frontend's transport that a conformance verdict would hide.

Each test shows one defect that was found by reading the code (issue "One lifecycle"):
it failed before the fix and passes after.
"""

from __future__ import annotations

import asyncio

from harness.cases.context import CaseContext, run_case
from harness.cases.declaration import CaseSpec
from harness.cases.helpers import prompt, request_for
from harness.frontends.reference import ReferenceDriver
from harness.frontends.reference.core import PendingUtility, ReferenceFrontendCore
from harness.results.records import Level, Verdict
from mock_engines.script import Emit, EngineScript, any_request
from tests.timescale import RUN_CONFIG

SPEC = CaseSpec("failure.hazard.first_output_deadline", Level.MUST, "hazard", "tests")


async def deadline_aborts_at_engine(ctx: CaseContext) -> None:
    """The first-output deadline ends the stream AND sends the ABORT it computed."""
    group = await ctx.start([EngineScript(rules=[any_request([Emit([100], 30.0)])])])
    handle = await ctx.driver.generate(prompt(0), 5)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "error", expected="the stream ends with an error",
                observed=handle.finish_reason)
    found = request_for(group, prompt(0))
    assert found is not None
    ok = await ctx.wait_until(lambda: found[1] in group.transcript.aborted_ids(), 3)
    ctx.require(ok, expected=f"ABORT {found[1]} at engine {found[0]}",
                observed=group.transcript.aborted_ids())


def test_first_output_deadline_sends_its_abort() -> None:
    driver = ReferenceDriver(frontend_kwargs={"first_output_deadline": 0.3})
    result = asyncio.run(run_case(SPEC, deadline_aborts_at_engine, driver, config=RUN_CONFIG))
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)


class _ReaderBugCore(ReferenceFrontendCore):
    """The first engine output crashes the reader task (a bug in our own frontend)."""

    def on_output(self, frames: list[bytes]) -> list[PendingUtility]:
        raise RuntimeError("reader bug")


async def stream_once(ctx: CaseContext) -> None:
    await ctx.start([EngineScript(rules=[any_request([Emit([100])])])])
    handle = await ctx.driver.generate(prompt(0), 1)
    await handle.wait(ctx.t(1))


def test_a_dead_reader_task_is_an_error_not_a_timeout() -> None:
    """Hazard: _read_outputs died silently and close() swallowed its exception, so the case
    ran into its bound (TIMEOUT). Now the driver reports the dead task: ERROR, named."""
    spec = CaseSpec("failure.hazard.reader_crash", Level.MUST, "hazard", "tests")
    driver = ReferenceDriver(core_factory=_ReaderBugCore)
    result = asyncio.run(run_case(spec, stream_once, driver, config=RUN_CONFIG))
    assert result.verdict is Verdict.ERROR, (result.verdict, result.message)
    assert "_read_outputs died: RuntimeError: reader bug" in result.message, result.message
