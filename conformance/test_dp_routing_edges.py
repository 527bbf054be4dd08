"""A refused data_parallel_rank says which rank it refused.

Both 0.33.0 frontends name the rejected value: Python `input_processor.py:396-400`
("data_parallel_rank {rank} is out of range [0, {n})"), Rust `Error::InvalidDataParallelRank`
("data parallel rank {rank} is out of range for {n} engine(s)"; a negative rank fails its
unsigned parse, which quotes the value), but the vllm-rs server answers a refused rank with
HTTP 400 "engine-core error", dropping that text, so the rule is SHOULD. A port that refuses
with a bare "invalid request" leaves the caller guessing which rank was wrong.
"""

from __future__ import annotations

import re

from harness.case_context import CaseContext
from harness.casekit import prompt
from harness.frontends.driver import Capability, FrontendError
from harness.verdicts import Level, case

NAMED = ("vllm/v1/engine/input_processor.py:396-400 (0.33.0); rust error.rs "
         "InvalidDataParallelRank 'data parallel rank {rank} is out of range for "
         "{num_engines} engine(s)'")


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


for _n, _rank in ((1, 4), (3, 7), (2, 1000), (3, -1)):
    def _make_named(n: int = _n, rank: int = _rank) -> None:
        label = f"minus_{-rank}" if rank < 0 else str(rank)

        @case(f"dp.routing.refusal_names_rank_{label}_{n}_engines", Level.SHOULD,
              f"With {n} engine(s), refusing data_parallel_rank={rank} should say which rank "
              f"was refused: the error text contains {rank} (Python's does; vllm-rs's "
              "client error names it but its HTTP server answers 'engine-core error').",
              source=NAMED,
              needs=[Capability.GENERATE, Capability.DP_RANK])
        async def refusal_names_rank(ctx: CaseContext) -> None:
            await ctx.start(n)
            text = await _refusal_text(ctx, rank)
            ctx.require(text is not None, expected=f"data_parallel_rank={rank} is refused",
                        observed="it was served (or neither served nor refused in 3 s)")
            named = re.search(rf"(?<![\w.-]){re.escape(str(rank))}(?![\w.])", text or "")
            ctx.require(named is not None,
                        expected=f"the refusal names the rank {rank}",
                        observed=f"error {text!r}")

        globals()[f"refusal_names_rank_{label}_{n}"] = refusal_names_rank
    _make_named()
