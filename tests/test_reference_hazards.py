"""Hazards of the reference frontend's transport that a conformance verdict would hide.

Each test shows one defect that was found by reading the code (issue "One lifecycle"):
it failed before the fix and passes after.
"""

from __future__ import annotations

import asyncio

from harness.case_context import CaseContext, run_case
from harness.casekit import prompt, request_for
from harness.frontends.reference import ReferenceDriver
from harness.verdicts import CaseSpec, Level, Verdict
from mock_engines.script import Emit, EngineScript, any_request

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
    result = asyncio.run(run_case(SPEC, deadline_aborts_at_engine, driver))
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)
