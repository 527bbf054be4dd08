"""A client reuses the id of a stream it dropped: the ABORT still names only the old request.

A dropped stream's ABORT names the dropped request's own engine-side id, which a later
request reusing the client id never gets, and dropping a stream that already finished sends
nothing even when a live request now uses its client id. An ABORT naming the new request's
id would end it at the engine and leave its stream waiting (PR #24382 / issue #23697: an id
freed before its ABORT was sent, so a reuse got aborted).
"""

from __future__ import annotations

from conformance.abort.helpers import (
    AL,
    DROP,
    ENGINE_ABORT,
    IMP,
    OP,
    STREAM,
    wait_aborted,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    FrontendError,
    Level,
    StreamHandle,
    UnsupportedOperation,
    both,
    by_prompt,
    case,
    hold,
    prompt,
    py,
    request_for,
    rs,
    stream,
)
from harness.protocol.wire import AbortRequests, AddRequest
from mock_engines.transcript import Record

# A dropped stream's ABORT names the dropped request's own engine-side id, which a later request
# reusing the client id never gets: both frontends append a random suffix to every client id,
# Python aborts the cancelled request by its internal id (q.request_id), the Rust stream's Drop
# queues its own engine-side id for run_abort_loop; each takes the request out of its table
# with that ABORT, so it is sent once. An ABORT naming the new request's id would
# end it at the engine (the engine aborts whatever id it holds) and leave its stream waiting:
# PR #24382 / issue #23697 (an id freed before its ABORT was sent, so a reuse got aborted).
REUSE_AFTER_DROP = both(
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    py(f"{OP}:633", "req_state = self.request_states.pop(request_id, None)"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
    rs(f"{STREAM}:233", "request_id: self.request_id.clone(),"),
    rs(f"{IMP}:389", "let Some(engine_id) = inner.take_auto_abort_target(&request_id) else {"),
    rs(f"{IMP}:335", "let (_, engine_id) = registry.remove(request_id)?;"),
    *ENGINE_ABORT,
)

# Dropping a stream that already finished sends nothing, even when a live request now uses
# its client id: the finished request left the frontend's table when it ended (python's
# generate() returned, its state popped, output_processor.py:919; rust's terminated stream
# skips its auto-abort, stream.rs:224), and an ABORT by the client id would end the reuse.
DROP_FINISHED_SPARES_REUSE = both(
    py(f"{OP}:919", "self.request_states.pop(req_id)"),
    py(f"{AL}:809", "await self.abort(q.request_id, internal=True)"),
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs(f"{STREAM}:224", "if self.is_terminated() {"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'),
    *ENGINE_ABORT,
)

REUSED_ID = "cw-reuse-1"


def _add_at(records: list[Record], prompt_ids: list[int]) -> tuple[int, str] | None:
    """(index, engine-side id) of the ADD carrying `prompt_ids` among one engine's inputs."""
    for i, record in enumerate(records):
        message = record.message
        if (isinstance(message, AddRequest)
                and list(message.request.prompt_token_ids or []) == prompt_ids):
            return i, message.request.request_id
    return None


def _aborts_naming(records: list[Record], rid: str, start: int, end: int) -> int:
    return sum(1 for r in records[start + 1:end]
               if isinstance(r.message, AbortRequests) and rid in r.message.request_ids)


def _reuse_aborts(group: EngineGroup, rank: int, dropped_prompt: list[int],
                  reuse_prompt: list[int]) -> tuple[int, tuple[int, str, int] | None]:
    """ABORTs naming the dropped request's id at its engine after its ADD (and before a
    reuse's ADD under that same id there), and (rank, engine-side id, ABORTs naming it
    after its ADD at that engine) of the reuse, None if no ADD carried it."""
    inputs = {e.rank: group.transcript.select(rank=e.rank, direction="in", channel="input")
              for e in group.engines}
    first = _add_at(inputs[rank], dropped_prompt)
    if first is None:
        return 0, None
    reuse = None
    for r, records in inputs.items():
        found = _add_at(records, reuse_prompt)
        if found is not None:
            reuse = (r, found[0], found[1])
            break
    end = len(inputs[rank])
    if reuse is not None and reuse[0] == rank and reuse[2] == first[1]:
        end = reuse[1]  # one id, two requests: the ABORTs after the reuse's ADD name it
    dropped = _aborts_naming(inputs[rank], first[1], first[0], end)
    if reuse is None:
        return dropped, None
    r, index, rid = reuse
    return dropped, (r, rid, _aborts_naming(inputs[r], rid, index, len(inputs[r])))


def _reuse_params(n: int, settled: bool) -> dict[str, object]:
    """One `abort.reuse.dropped_id_*` case: `pin` puts both requests on one engine, not
    rank 0 (None with one engine)."""
    pin = None if n == 1 else n - 1
    return {"n": n, "settled": settled, "pin": pin,
            "when": "settled" if settled else "zero_delay",
            "how": ("once the dropped stream's ABORT reached its engine" if settled
                    else "at once, with no wait after the drop"),
            "where": "" if pin is None else f", both pinned to engine {pin}",
            "needs": [*DROP, Capability.CLIENT_REQUEST_ID,
                      *([Capability.DP_RANK] if pin is not None else [])]}


@case("abort.reuse.dropped_id_{when}_{n}_engines", Level.MUST,
      "With {n} engine(s){where}: a stream with client request id X is dropped and a new "
      "request with id X is sent {how}. The dropped request is aborted once at its "
      "engine; the new one is either refused or runs to completion (its tokens, 'length', no "
      "error), and no ABORT naming its engine-side id reaches its engine after its ADD.",
      grounds=REUSE_AFTER_DROP,
      params=[_reuse_params(n, settled) for n in (1, 2) for settled in (False, True)])
async def reuse_dropped_id(ctx: CaseContext, n: int, settled: bool, pin: int | None) -> None:
    first_prompt, second_prompt = prompt(0), prompt(1)
    rules = [by_prompt(first_prompt, hold()),
             by_prompt(second_prompt, stream([300, 301, 302], 0.05))]
    group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(n)])
    first = await ctx.driver.generate(first_prompt, 50, request_id=REUSED_ID,
                                      data_parallel_rank=pin)
    await first.wait_first(ctx.t(5))
    dropped = request_for(group, first_prompt)
    ctx.require(dropped is not None, expected="the first request's ADD", observed="none")
    assert dropped is not None
    rank, rid = dropped
    await ctx.driver.drop([first])
    if settled:
        await wait_aborted(ctx, group, {rid})
        await ctx.quiet(0.1)
    reuse: StreamHandle | None = None
    try:
        reuse = await ctx.driver.generate(second_prompt, 3, request_id=REUSED_ID,
                                          data_parallel_rank=pin)
    except UnsupportedOperation:
        raise
    except FrontendError as exc:
        ctx.note(f"the reuse was refused: {exc}")
    if reuse is not None:
        handle = reuse
        await ctx.wait_until(lambda: handle.ended, 3)
    await ctx.wait_until(lambda: rid in group.transcript.aborted_ids(rank), 3)
    await ctx.quiet(0.2)  # an ABORT owed to nobody would come now
    dropped_aborts, found = _reuse_aborts(group, rank, first_prompt, second_prompt)
    if reuse is not None and found is None and reuse.ended \
            and reuse.finish_reason == "error" and not reuse.tokens:
        ctx.note(f"the reuse was refused: {reuse.error}")  # as a stream error, no ADD
        reuse = None
    if reuse is None:
        ctx.require(found is None, expected="a refused reuse sends no ADD",
                    observed=f"ADD {found}")
    else:
        ctx.require(reuse.ended and reuse.error is None
                    and reuse.tokens == [300, 301, 302] and reuse.finish_reason == "length",
                    expected="the new request: tokens [300, 301, 302], finish 'length', "
                             "no error",
                    observed=f"ended {reuse.ended}, finish {reuse.finish_reason!r}, "
                             f"tokens {reuse.tokens}, error {reuse.error!r}")
        ctx.require(found is not None, expected="the new request's ADD", observed="none")
        assert found is not None
        new_rank, new_rid, late = found
        ctx.note(f"dropped {rid} at engine {rank}; the reuse is {new_rid} at engine "
                 f"{new_rank}")
        ctx.require(late == 0, expected=f"no ABORT naming {new_rid} at engine {new_rank} "
                                        "after its ADD",
                    observed=f"{late} ABORT(s) naming it after its ADD")
    ctx.require(dropped_aborts == 1,
                expected=f"the dropped request {rid} aborted once at engine {rank}",
                observed=f"{dropped_aborts} ABORT(s) naming it there after its ADD "
                         f"(ABORTed ids at engine {rank}: "
                         f"{group.transcript.aborted_ids(rank)})")


@case("abort.reuse.drop_finished_handle_spares_reuse_{n}_engines", Level.MUST,
      "With {n} engine(s): a request with client id X finishes, a new request reuses X "
      "and is live, then the client drops the first (finished) stream: no ABORT is "
      "sent at all, and the live reuse keeps streaming.",
      grounds=DROP_FINISHED_SPARES_REUSE, needs=[*DROP, Capability.CLIENT_REQUEST_ID],
      params=[{"n": n} for n in (1, 2)])
async def drop_finished_spares_reuse(ctx: CaseContext, n: int) -> None:
    first_prompt, second_prompt = prompt(0), prompt(1)
    rules = [by_prompt(first_prompt, stream([100])),
             by_prompt(second_prompt, hold((300,)))]
    group = await ctx.start([EngineScript(rules=list(rules)) for _ in range(n)])
    first = await ctx.driver.generate(first_prompt, 1, request_id=REUSED_ID)
    await first.wait(ctx.t(3))
    ctx.require(first.ended and first.finish_reason == "length",
                expected="the first request ends 'length'",
                observed=f"{first.finish_reason} {first.error}")
    reuse = await ctx.driver.generate(second_prompt, 50, request_id=REUSED_ID)
    await reuse.wait_first(ctx.t(3))
    await ctx.driver.drop([first])
    await ctx.quiet(0.3)  # an ABORT would arrive now
    ids = group.transcript.aborted_ids()
    ctx.require(not ids, expected="no ABORT (the dropped stream had finished)",
                observed=f"ABORTed ids {ids}")
    ctx.require(not reuse.ended, expected="the reuse still streaming",
                observed=f"ended {reuse.finish_reason!r} error {reuse.error!r}")
