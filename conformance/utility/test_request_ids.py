"""Client request ids: what reaches the engines when a client id is reused.

Both 0.33.0 frontends append a random suffix to every client id for the engine-side id
(Python's input processor, vllm-rs's request builder), so a duplicate of a live request's
id never collides on the wire; Rust's engine-core client would also refuse it
(DuplicateRequestId). A duplicate must not disturb the live request it copies, and an id
is free again once its request finished.
"""

from __future__ import annotations

import time

from conformance.utility.helpers import STATE, TESTS
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    FrontendError,
    Level,
    UnsupportedOperation,
    any_request,
    both,
    by_prompt,
    case,
    hold,
    messages,
    prompt,
    py,
    recommendation,
    request_for,
    rs,
    stream,
)

# Client request ids: both frontends append a random suffix for the engine-side id.
_SUFFIXED = (
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
)
_RS_DUPLICATE = rs(f"{STATE}:170", "return Err(Error::DuplicateRequestId { request_id });")
IDS_DISTINCT = both(
    *_SUFFIXED, _RS_DUPLICATE,
    rs(f"{TESTS}:1082",
       "async fn duplicate_request_ids_are_rejected_without_sending_a_second_add()"),
)
IDS_REFUSED = recommendation(
    *_SUFFIXED, _RS_DUPLICATE,
    py("vllm/v1/engine/output_processor.py:692",
       "self.external_req_ids[req_state.external_req_id].append(request_id)"),
    note="neither 0.33.0 frontend refuses at its surface: both suffix every client id "
         "(input_processor.py:371, llm/src/request.rs:100), so the Rust engine-core client's "
         "DuplicateRequestId (state.rs:170) is not reached through vllm-rs. corewire advises "
         "refusing: a client id then names one request, and an abort by client id (Python "
         "maps it to every engine-side id, output_processor.py:692) cannot hit the other one",
)
IDS_REUSE = both(
    *_SUFFIXED,
    rs(f"{STATE}:252", "if output.finished() {"),
    rs(f"{STATE}:253", "match self.remove(output.request_id.as_str()) {"),
)
RID = [Capability.CLIENT_REQUEST_ID]


async def _duplicate(ctx: CaseContext) -> tuple[list[str], str | None]:
    """Two generates with one client id while the first is live: (ADD ids, refusal)."""
    group = await ctx.start([EngineScript(rules=[any_request(hold())])])
    first = await ctx.driver.generate(prompt(0), 50, request_id="cw-dup-1")
    await first.wait_first(ctx.t(5.0))
    refusal: str | None = None
    try:
        second = await ctx.driver.generate(prompt(1), 50, request_id="cw-dup-1")
        await ctx.wait_until(lambda: second.ended or len(group.transcript.adds()) > 1, 1.0)
        refusal = second.error if second.ended and second.finish_reason == "error" else None
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        refusal = str(exc)
    await ctx.quiet(0.2)
    return [r.request_id for r in group.transcript.adds()], refusal


@case("utility.request_id.duplicate_live_no_collision", Level.MUST,
      "A second request with the client id of a live one never reaches an engine under the "
      "same engine-side id (both suffix every id; Rust's client also refuses it).",
      grounds=IDS_DISTINCT,
      needs=RID)
async def duplicate_no_collision(ctx: CaseContext) -> None:
    ids, _refusal = await _duplicate(ctx)
    ctx.require(len(ids) == len(set(ids)), expected="distinct engine-side ids",
                observed=ids)


@case("utility.request_id.duplicate_live_refused", Level.SHOULD,
      "A request reusing the id of a live request is refused and no second ADD is sent "
      "(Rust's engine-core client has DuplicateRequestId, but both frontends rename every "
      "id with a random suffix).", grounds=IDS_REFUSED, needs=RID)
async def duplicate_refused(ctx: CaseContext) -> None:
    ids, refusal = await _duplicate(ctx)
    ctx.require(refusal is not None and len(ids) == 1,
                expected="the duplicate refused, one ADD", observed=f"refusal {refusal!r}, "
                f"ADD ids {ids}")


@case("utility.request_id.duplicate_live_first_unchanged", Level.MUST,
      "After a second request reusing a live request's client id is refused (Rust) or "
      "renamed (Python), the first request's stream still completes with its own tokens "
      "and finish reason, and draws no ABORT (the duplicate's clean-up must not touch it).",
      grounds=IDS_DISTINCT, needs=RID)
async def duplicate_first_unchanged(ctx: CaseContext) -> None:
    first_prompt, second_prompt = prompt(0), prompt(1)
    group = await ctx.start([EngineScript(rules=[
        by_prompt(first_prompt, hold()),  # token 100, then held until the case finishes it
        by_prompt(second_prompt, stream([300, 301], 0.02))])])
    first = await ctx.driver.generate(first_prompt, 3, request_id="cw-dup-2")
    await first.wait_first(ctx.t(5.0))
    owner = request_for(group, first_prompt)
    ctx.require(owner is not None, expected="the first request's ADD", observed="none")
    assert owner is not None
    second_note = "refused"
    try:
        second = await ctx.driver.generate(second_prompt, 2, request_id="cw-dup-2")
        await second.wait(ctx.t(5.0))
        second_note = (f"ended {second.finish_reason!r} with {second.tokens}"
                       + (f", error {second.error!r}" if second.error else ""))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        second_note = f"refused: {exc}"
    ctx.note(f"the duplicate: {second_note}")
    await ctx.quiet(0.2)  # whatever the duplicate's clean-up does to the first, it did
    rank, rid = owner
    engine = next(e for e in group.engines if e.rank == rank)
    for tokens, reason in (([101], None), ([102], messages.FinishReason.LENGTH)):
        engine.send_outputs(messages.EngineCoreOutputs(rank, [messages.EngineCoreOutput(
            rid, tokens, finish_reason=reason)], None, time.monotonic()))
        await ctx.quiet(0.2)  # an ABORT the clean-up queued goes out with an output
    await first.wait(ctx.t(5.0))
    aborted = group.transcript.aborted_ids()
    ctx.require(first.ended and first.error is None and first.tokens == [100, 101, 102]
                and first.finish_reason == "length",
                expected="the first stream: [100, 101, 102], finish 'length', no error",
                observed=f"ended {first.ended}, finish {first.finish_reason!r}, tokens "
                         f"{first.tokens}, error {first.error!r}")
    ctx.require(rid not in aborted, expected=f"no ABORT for the first request {rid}",
                observed=f"ABORTed ids {aborted}")


@case("utility.request_id.reuse_after_finish", Level.MUST,
      "Once a request finished, its client id can be used again and the new request runs.",
      grounds=IDS_REUSE, needs=RID)
async def reuse_after_finish(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    first = await (await ctx.driver.generate(prompt(0), 2, request_id="cw-again")
                   ).wait(ctx.t(5.0))
    await ctx.quiet(0.1)
    try:
        second = await (await ctx.driver.generate(prompt(1), 3, request_id="cw-again")
                        ).wait(ctx.t(5.0))
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.fail(expected="the reused id accepted", observed=str(exc))
    ctx.require(first.error is None and second.error is None and len(second.tokens) == 3
                and len(group.transcript.adds()) == 2,
                expected="both requests complete (2 ADDs, 3 tokens for the second)",
                observed=f"errors {first.error!r}/{second.error!r}, second tokens "
                         f"{second.tokens}, {len(group.transcript.adds())} ADDs")
