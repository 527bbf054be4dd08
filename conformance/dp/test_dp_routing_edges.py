"""A refused data_parallel_rank says which rank it refused.

Python names the rejected value (`input_processor.py:397-400`: "data_parallel_rank {rank}
is out of range [0, {n})"). vLLM-rs's client error names it too (`Error::InvalidDataParallelRank`,
error.rs:70: "data parallel rank {rank} is not connected to this frontend; connected ranks:
..."), but the llm facade wraps it as "engine-core error" (llm/src/error.rs:13) and the HTTP
server answers 400 with that text only; a negative rank header does not parse as u32 and is
treated as absent (server/src/utils.rs:154-158), so -1 is not refused at all. The rule is
SHOULD. A port that refuses with a bare "invalid request" leaves the caller guessing which rank
was wrong.
"""

from __future__ import annotations

import re

from harness.cases.context import CaseContext
from harness.cases.declaration import case
from harness.cases.grounds import differ, py, rs
from harness.cases.helpers import prompt
from harness.frontends.api import Capability, FrontendError
from harness.results.records import Level

_PY_NAMES = (
    py("vllm/v1/engine/input_processor.py:396",
       "if data_parallel_rank is not None and not (0 <= data_parallel_rank < num_ranks):"),
    py("vllm/v1/engine/input_processor.py:398", 'f"data_parallel_rank {data_parallel_rank} "'),
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


for _n, _rank in ((1, 4), (3, 7), (2, 1000), (3, -1)):
    def _make_named(n: int = _n, rank: int = _rank) -> None:
        label = f"minus_{-rank}" if rank < 0 else str(rank)

        @case(f"dp.routing.refusal_names_rank_{label}_{n}_engines", Level.SHOULD,
              f"With {n} engine(s), refusing data_parallel_rank={rank} should say which rank "
              f"was refused: the error text contains {rank} (Python's does; vllm-rs's "
              "client error names it but its HTTP server answers 'engine-core error').",
              grounds=NAMED_NEGATIVE if rank < 0 else NAMED,
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
