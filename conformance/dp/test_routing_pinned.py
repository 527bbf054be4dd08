"""DP routing of pinned requests: an explicit data_parallel_rank at every engine count 1..4,
for every rank, invalid ranks, what a refusal says, and what a pin names when the frontend's
engines start above rank 0.

Both 0.33.0 frontends validate an explicit rank (Python: `input_processor.py:396-400`
"data_parallel_rank ... is out of range"; Rust: `Error::InvalidDataParallelRank`,
client/state.rs:202-206) and send nothing for a refused request. A negative rank differs:
vllm-rs's HTTP server treats a rank header that is not a u32 as absent.

A refused data_parallel_rank should say which rank it refused. Python names the rejected
value (`input_processor.py:397-400`: "data_parallel_rank {rank} is out of range [0, {n})").
vLLM-rs's client error names it too (`Error::InvalidDataParallelRank`, error.rs:70: "data
parallel rank {rank} is not connected to this frontend; connected ranks: ..."), but the llm
facade wraps it as "engine-core error" (llm/src/error.rs:13) and the HTTP server answers 400
with that text only; a negative rank header does not parse as u32 and is treated as absent
(server/src/utils.rs:154-158), so -1 is not refused at all. The rule is SHOULD. A port that
refuses with a bare "invalid request" leaves the caller guessing which rank was wrong.

What a pin names when the frontend's engines start above rank 0 differs, SHOULD (vllm-rs:
the global rank; Python: an index into the engines it manages). That a pin never reaches an
engine the frontend lacks holds in both (MUST). An ADD pinned to a rank carries that rank
(both frontends stamp it, though no 0.33.0 engine or coordinator reads the field, so SHOULD).
"""

from __future__ import annotations

import re

from conformance.dp.helpers import CC, IP, PINNED, RS, engine_of
from harness.cases.authoring import (
    CaseContext,
    EngineGroup,
    EngineScript,
    FrontendError,
    Level,
    both,
    case,
    differ,
    prompt,
    py,
    requests_for,
    rs,
)

# A pinned request goes to exactly that engine.
EXPLICIT = both(
    py(f"{CC}:1763", "if (eng_index := request.data_parallel_rank) is None and ("),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
    rs(f"{RS}:202", "if let Some(rank) = data_parallel_rank {"),
    rs(f"{RS}:203", "u16::try_from(rank).ok().map(EngineId::from_engine_index)"),
    rs(f"{RS}:1176", "fn register_with_data_parallel_rank_routes_to_specified_engine() {"),
)
# A rank outside [0, engines) is refused before anything is sent.
RANGE = both(
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py(f"{IP}:397", "raise VLLMValidationError("),
    rs(f"{RS}:173", "let engine_id = self.choose_engine_for_request(data_parallel_rank)?;"),
    rs(f"{RS}:206", ".ok_or_else(|| Error::InvalidDataParallelRank {"),
    rs(f"{RS}:1233", "crate::error::Error::InvalidDataParallelRank {"),
)
NEGATIVE = differ(
    py("vllm/entrypoints/generate/base/serving.py:226", "return int(rank_str)"),
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    rs("rust/src/server/src/utils.rs:154",
       "`None` when the header is absent or cannot be parsed as a `u32`."),
    rs("rust/src/server/src/utils.rs:158", ".and_then(|s| s.trim().parse().ok());"),
    rs("rust/src/server/src/grpc/inference.rs:209",
       "x-data-parallel-rank metadata must be an unsigned 32-bit integer"),
    note="python's HTTP layer parses the rank with int(), so -1 reaches the range check and "
         "is refused (serving.py:226, input_processor.py:396); vllm-rs's HTTP server "
         "deliberately treats a rank header that does not parse as u32 as absent and "
         "load-balances the request (utils.rs:154-158; its gRPC path refuses it, "
         "inference.rs:209)")


# ----------------------------------------------------------------- pins are honoured

@case("dp.routing.explicit_rank", Level.MUST,
      "A request with data_parallel_rank r is sent to engine r only.",
      grounds=EXPLICIT, needs=PINNED)
async def explicit_rank(ctx: CaseContext) -> None:
    group = await ctx.start(3)
    for rank in (2, 0, 1, 2):
        p = prompt(10 + len(group.transcript.adds()))
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        owner = requests_for(group, [p])
        ctx.require(owner is not None and list(owner.values()) == [rank],
                    expected=f"the ADD for data_parallel_rank={rank} at engine {rank}",
                    observed=owner)


@case("dp.routing.explicit_every_rank_{n}_engines", Level.MUST,
      "With {n} engine(s), a request pinned to data_parallel_rank r goes to engine r "
      "only, for every r, in any order.", grounds=EXPLICIT, needs=PINNED,
      params=[{"n": n} for n in (1, 2, 3, 4)])
async def explicit_every_rank(ctx: CaseContext, n: int) -> None:
    """Each rank, in reversed then forward order, gets exactly the requests pinned to it."""
    group = await ctx.start(n)
    order = [*reversed(range(n)), *range(n)]
    for i, rank in enumerate(order):
        p = prompt(40 + i)
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        at = engine_of(group, p)
        ctx.require(at == rank,
                    expected=f"the ADD for data_parallel_rank={rank} at engine {rank}",
                    observed=f"at engine {at}")
        ctx.require(handle.finish_reason == "length",
                    expected="the pinned request completes",
                    observed=f"{handle.finish_reason} error={handle.error}")


@case("dp.routing.pinned_rank_on_add_{engines}_engines", Level.SHOULD,
      "With {engines} engines, an ADD pinned with data_parallel_rank r should carry r in "
      "its data_parallel_rank field; an unpinned ADD carries none.",
      grounds=both(
          py(f"{IP}:550", "data_parallel_rank=data_parallel_rank,"),
          py("vllm/v1/engine/__init__.py:127", "data_parallel_rank: int | None"),
          rs("rust/src/text/src/lower.rs:73",
             "data_parallel_rank: request.data_parallel_rank,"),
          rs("rust/src/engine-core-client/src/protocol/request.rs:91",
             "pub data_parallel_rank: Option<u32>,"),
          note="both frontends stamp the pin on the ADD, but no 0.33.0 engine or "
               "coordinator reads EngineCoreRequest.data_parallel_rank (only the python "
               "client's own routing does, core_client.py:1763, before sending), so a "
               "port that omits it breaks nothing: SHOULD"),
      needs=PINNED, params=[{"engines": n} for n in (2, 3)])
async def pinned_rank_on_add(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript() for _ in range(engines)])
    pinned = {tuple(prompt(r)): r for r in reversed(range(engines))}
    free = prompt(99)
    handles = [await ctx.driver.generate(list(p), 2, data_parallel_rank=r)
               for p, r in pinned.items()]
    handles.append(await ctx.driver.generate(free, 2))
    for h in handles:
        await h.wait(ctx.t(3))
    by_prompt_ = {tuple(r.prompt_token_ids or []): r.data_parallel_rank
                  for r in group.transcript.adds()}
    got = {p: by_prompt_.get(p, "no ADD") for p in pinned}
    ctx.require(got == pinned, expected=f"data_parallel_rank on the pinned ADDs {pinned}",
                observed=got)
    ctx.require(by_prompt_.get(tuple(free), "no ADD") is None,
                expected="no data_parallel_rank on the unpinned ADD",
                observed=by_prompt_.get(tuple(free), "no ADD"))


# ----------------------------------------------------------------- invalid ranks

async def _rank_refused(ctx: CaseContext, engines: int, rank: int) -> None:
    """Refused: an error to the caller, no ADD anywhere, and the frontend keeps serving."""
    group = await ctx.start(engines)
    bad = prompt(700)
    outcome = ""
    try:
        handle = await ctx.driver.generate(bad, 2, data_parallel_rank=rank)
    except FrontendError as exc:
        outcome = f"refused: {exc}"
    else:
        try:
            await handle.wait(ctx.t(3))
        except TimeoutError:
            outcome = "the stream neither completed nor failed within 3 s"
        else:
            outcome = (f"refused: {handle.error}" if handle.finish_reason == "error"
                       else f"served ({handle.finish_reason}, {len(handle.tokens)} tokens)")
    await ctx.quiet(0.2)
    at = engine_of(group, bad)
    ctx.require(at is None, expected=f"no ADD for data_parallel_rank={rank} "
                                     f"({engines} engine(s))",
                observed=f"an ADD reached engine {at}; {outcome}")
    ctx.require(outcome.startswith("refused"),
                expected=f"the request with data_parallel_rank={rank} is refused with an "
                         f"error", observed=outcome)
    good = await ctx.driver.generate(prompt(701), 2, data_parallel_rank=engines - 1)
    await good.wait(ctx.t(3))
    ctx.require(good.finish_reason == "length",
                expected="a valid request still completes after the refusal",
                observed=f"{good.finish_reason} error={good.error}")


@case("dp.routing.rank_out_of_range_{n}_engines", Level.MUST,
      "With {n} engine(s), data_parallel_rank={n} (one past the last) is refused with "
      "an error and no ADD is sent; the frontend keeps serving.", grounds=RANGE,
      needs=PINNED, params=[{"n": n} for n in (1, 2, 3, 4)])
async def rank_out_of_range(ctx: CaseContext, n: int) -> None:
    await _rank_refused(ctx, n, n)


@case("dp.routing.rank_negative", Level.SHOULD,
      "data_parallel_rank=-1 should be refused with an error and no ADD sent (not taken as "
      "'the last engine').", grounds=NEGATIVE, needs=PINNED)
async def rank_negative(ctx: CaseContext) -> None:
    await _rank_refused(ctx, 3, -1)


@case("dp.routing.rank_far_out_of_range", Level.MUST,
      "data_parallel_rank=1000 with 2 engines is refused (not wrapped modulo the count).",
      grounds=RANGE, needs=PINNED)
async def rank_far_out_of_range(ctx: CaseContext) -> None:
    await _rank_refused(ctx, 2, 1000)


# ----------------------------------------------------------------- a refusal names the rank

_PY_NAMES = (
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py(f"{IP}:398", 'f"data_parallel_rank {data_parallel_rank} "'),
)
NAMED = differ(
    *_PY_NAMES,
    rs("rust/src/engine-core-client/src/error.rs:70",
       '"data parallel rank {rank} is not connected to this frontend; connected ranks:'),
    rs("rust/src/llm/src/error.rs:13", '#[error("engine-core error")]'),
    rs("rust/src/server/src/error.rs:102",
       'return invalid_request!(param = error.param(), "{error}");'),
    note="python's refusal text names the rank (input_processor.py:398); vllm-rs's client "
         "error names it, but the llm facade's Display is the bare 'engine-core error' "
         "(llm/src/error.rs:13), which is all the HTTP 400 carries (server error.rs:102)")
NAMED_NEGATIVE = differ(
    py("vllm/entrypoints/generate/base/serving.py:226", "return int(rank_str)"),
    *_PY_NAMES,
    rs("rust/src/server/src/utils.rs:154",
       "`None` when the header is absent or cannot be parsed as a `u32`."),
    rs("rust/src/server/src/utils.rs:158", ".and_then(|s| s.trim().parse().ok());"),
    note="python parses the header with int() and refuses -1 naming it (serving.py:226, "
         "input_processor.py:396-398); vllm-rs's HTTP server treats a rank that does not "
         "parse as u32 as absent (utils.rs:154-158) and load-balances the request")


async def _refusal_text(ctx: CaseContext, rank: int) -> str | None:
    """The refusal's text (raised at once or as the stream's error); None if served."""
    try:
        handle = await ctx.driver.generate(prompt(710), 2, data_parallel_rank=rank)
    except FrontendError as exc:
        return str(exc)
    try:
        await handle.wait(ctx.t(3))
    except TimeoutError:
        return None
    return handle.error if handle.finish_reason == "error" else None


@case("dp.routing.refusal_names_rank_{label}_{n}_engines", Level.SHOULD,
      "With {n} engine(s), refusing data_parallel_rank={rank} should say which rank "
      "was refused: the error text contains {rank} (Python's does; vllm-rs's "
      "client error names it but its HTTP server answers 'engine-core error').",
      grounds=NAMED, needs=PINNED,
      params=[{"n": 1, "rank": 4, "label": "4"}, {"n": 3, "rank": 7, "label": "7"},
              {"n": 2, "rank": 1000, "label": "1000"},
              {"n": 3, "rank": -1, "label": "minus_1", "grounds": NAMED_NEGATIVE}])
async def refusal_names_rank(ctx: CaseContext, n: int, rank: int) -> None:
    await ctx.start(n)
    text = await _refusal_text(ctx, rank)
    ctx.require(text is not None, expected=f"data_parallel_rank={rank} is refused",
                observed="it was served (or neither served nor refused in 3 s)")
    named = re.search(rf"(?<![\w.-]){re.escape(str(rank))}(?![\w.])", text or "")
    ctx.require(named is not None,
                expected=f"the refusal names the rank {rank}",
                observed=f"error {text!r}")


# ----------------------------------------------------------------- pins from a start index

_RS_PIN = (
    rs(f"{RS}:203", "u16::try_from(rank).ok().map(EngineId::from_engine_index)"),
    rs(f"{RS}:205", ".filter(|engine_id| self.routing_per_engine.contains_key(engine_id))"),
    rs(f"{RS}:206", ".ok_or_else(|| Error::InvalidDataParallelRank {"),
    rs(f"{RS}:1241", "fn register_with_rank_uses_global_engine_identity() {"),
)
_PY_PIN = (
    py(f"{IP}:395", "num_ranks = dp_local_size if parallel_config.local_engines_only else dp_size"),
    py(f"{IP}:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py(f"{CC}:754", 'rank.to_bytes(2, "little") for rank in self.engine_ranks_managed'),
    py(f"{CC}:1808", "chosen_engine = self.core_engines[eng_index]"),
)
# Whatever a pin means, it reaches an engine of this frontend or is refused: never lost.
PIN_NOT_LOST = both(
    *_PY_PIN, *_RS_PIN,
    note="python checks the pin against the number of engines it manages (the local count "
         "in hybrid / external LB, input_processor.py:395-396) and indexes its list of their "
         "identities with it (core_client.py:754, 1808); vllm-rs sends a pin only to a "
         "connected engine (state.rs:203-206). What a pin names differs (see "
         "dp.routing.pin_names_global_rank_*); that an accepted pin reaches an engine of the "
         "frontend, and any other is refused, holds in both")
PIN_GLOBAL = differ(
    *_PY_PIN, *_RS_PIN,
    note="vllm-rs takes the pin as the global engine rank, served only by a connected engine "
         "(state.rs:203-206; its test register_with_rank_uses_global_engine_identity serves "
         "rank 3 on engine 3 and refuses 0, state.rs:1241); python, whose frontend owns "
         "engines from a nonzero start only in hybrid / external LB, checks the pin against "
         "its local engine count and indexes its managed engines with it "
         "(input_processor.py:395-396, core_client.py:754, 1808): a pin is a local index "
         "there (with engines [2, 3], pin 0 goes to engine 2 and pin 3 is refused; its "
         "docs speak of ranks in [0, data_parallel_size), token_in_token_out.md:47, which "
         "agree with a local index only from start 0). vllm-rs chose the global reading in "
         "PR #51178 (its error names the connected ranks). Neither reading loses a request "
         "(dp.routing.pin_never_lost_*), so the difference is SHOULD")
# The frontend's engines [start, start + count): the ranks, the highest, one past it.
PIN_GROUPS = [{"start": start, "count": count, "ranks": list(range(start, start + count)),
               "highest": start + count - 1, "past": start + count}
              for start, count in ((2, 2), (1, 3))]


async def _pin_outcome(ctx: CaseContext, group: EngineGroup, rank: int, seed: int
                       ) -> tuple[str, int | None]:
    """('refused' | 'served' | 'lost' | 'ended ...', the engine its ADD reached)."""
    p = prompt(seed)
    try:
        handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
    except FrontendError as exc:
        result = f"refused: {exc}"
    else:
        try:
            await handle.wait(ctx.t(3))
        except TimeoutError:
            result = "lost: neither completed nor failed within 3 s"
        else:
            result = ("served" if handle.finish_reason == "length" else
                      f"refused: {handle.error}" if handle.finish_reason == "error" else
                      f"ended {handle.finish_reason}")
    return result, engine_of(group, p)


@case("dp.routing.pin_never_lost_start_{start}_count_{count}", Level.MUST,
      "With engines {ranks} (engine start index {start}), a request pinned to any "
      "data_parallel_rank from 0 to {past} is either refused with an error "
      "and sent nowhere, or served to completion by one of the frontend's engines: "
      "never sent to an engine the frontend does not have (where it would hang).",
      grounds=PIN_NOT_LOST, needs=PINNED, params=PIN_GROUPS)
async def pin_never_lost(ctx: CaseContext, start: int, count: int, ranks: list[int],
                         past: int) -> None:
    group = await ctx.start(count, rank_offset=start)
    for i, rank in enumerate(range(past + 1)):  # from 0 to one past the highest rank
        result, at = await _pin_outcome(ctx, group, rank, 1100 + i)
        ok = ((result.startswith("refused") and at is None)
              or (result == "served" and at in ranks))
        ctx.require(ok, expected=f"data_parallel_rank={rank} refused (no ADD) or served "
                                 f"by one of engines {ranks}",
                    observed=f"{result}; ADD at engine {at}")


@case("dp.routing.pin_names_global_rank_start_{start}_count_{count}", Level.SHOULD,
      "With engines {ranks} (engine start index {start}), data_parallel_rank should "
      "name the engine's global rank: a request pinned to {highest} (the highest) is "
      "served by engine {highest}, one pinned to {start} by engine {start}, and pins "
      "to 0 and {past} (ranks outside the group) are refused, not taken as an "
      "index into the frontend's engines.", grounds=PIN_GLOBAL, needs=PINNED,
      params=PIN_GROUPS)
async def pin_names_global_rank(ctx: CaseContext, start: int, count: int, ranks: list[int],
                                highest: int, past: int) -> None:
    group = await ctx.start(count, rank_offset=start)
    for i, rank in enumerate((highest, start)):
        result, at = await _pin_outcome(ctx, group, rank, 1200 + i)
        ctx.require(result == "served" and at == rank,
                    expected=f"data_parallel_rank={rank} served by engine {rank}",
                    observed=f"{result}; ADD at engine {at}")
    for i, rank in enumerate((0, past)):
        result, at = await _pin_outcome(ctx, group, rank, 1210 + i)
        ctx.require(result.startswith("refused") and at is None,
                    expected=f"data_parallel_rank={rank} (not a rank of engines "
                             f"{ranks}) refused, no ADD",
                    observed=f"{result}; ADD at engine {at}")
