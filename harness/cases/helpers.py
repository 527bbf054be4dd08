"""Small helpers conformance cases share: distinct prompts, hold-open scripts, lookups.

Frontends name requests differently (vllm-rs and AsyncLLM add their own ids), so cases
give every stream a distinct prompt and find the engine-side request through the
transcript by prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.frontends.api import FrontendError
from mock_engines.group import EngineGroup

if TYPE_CHECKING:
    from harness.cases.context import CaseContext
from mock_engines.script import Emit, Step, StepFactory, endless

# How long a case waits for a utility call before grading it unbounded: twice the
# reference frontend's own 3 s utility timeout (harness/frontends/reference/frontend.py:58),
# so a frontend that bounds its calls answers well inside it (scaled by the timescale).
UTILITY_GIVE_UP_S = 6.0


def prompt(i: int) -> list[int]:
    """A distinct 3-token prompt per index (ids stay inside the tiny vocabulary)."""
    return [11, 20 + i // 900, 20 + i % 900]


def hold(first_tokens: Sequence[int] = (100,), delay: float = 0.0) -> list[Step]:
    """Send the first tokens, then keep the request open (no Finish) until aborted."""
    return [Emit(list(first_tokens), delay)]


def trickle(interval: float, count: int = 2000, first: int = 100) -> StepFactory:
    """A long-running stream: one token every `interval` seconds, `count` at most
    (the engine script's `endless`, with a bound cases can wait out)."""
    return endless(interval, first, count)


def request_for(group: EngineGroup, prompt_ids: Sequence[int]) -> tuple[int, str] | None:
    """(owning rank, engine-side request id) of the ADD carrying this prompt, if any; the
    lowest-listed engine's first one when several got it. Cases poll this every few ms
    while hundreds of streams run, so it reads the transcript's prompt index, never a copy
    of the transcript."""
    hits = group.transcript.adds_with_prompt(prompt_ids)
    for engine in group.engines:
        for rank, request_id in hits:
            if rank == engine.rank:
                return rank, request_id
    return None


def requests_for(group: EngineGroup, prompts: Sequence[Sequence[int]]
                 ) -> dict[str, int] | None:
    """{engine-side id: owning rank} for every prompt, or None while some are missing."""
    out: dict[str, int] = {}
    for p in prompts:
        found = request_for(group, p)
        if found is None:
            return None
        out[found[1]] = found[0]
    return out


async def routed_engine(ctx: CaseContext, group: EngineGroup, seed: int) -> int | None:
    """Send one unpinned request, wait (bounded) for it to end, return the engine that got
    it (None: it reached no engine)."""
    p = prompt(seed)
    handle = await ctx.driver.generate(p, 2)
    await handle.wait(ctx.t(3))
    found = request_for(group, p)
    return found[0] if found else None


async def require_refused_later(ctx: CaseContext, seed: int,
                                rank: int | None = None) -> None:
    """After a fatal failure, a later request is refused (raised, or a stream ending in
    error): the client stays failed."""
    try:
        later = await ctx.driver.generate(prompt(seed), 2, data_parallel_rank=rank)
        await later.wait(ctx.t(3))
    except FrontendError as exc:
        ctx.note(f"later request refused: {exc}")
        return
    ctx.require(later.finish_reason == "error",
                expected="a later request is refused (the client stays failed)",
                observed=f"{later.finish_reason} error={later.error}")


def same_value(seen: Any, expected: Any) -> bool:
    """Equal and of the same JSON-like type all the way down (True is not 1, 1.0 is not 1;
    a tuple counts as a list: a Python client may hand one out)."""
    if isinstance(expected, list):
        return (isinstance(seen, (list, tuple)) and len(seen) == len(expected)
                and all(same_value(s, e) for s, e in zip(seen, expected, strict=True)))
    if isinstance(expected, dict):
        return (isinstance(seen, dict) and seen.keys() == expected.keys()
                and all(same_value(seen[k], v) for k, v in expected.items()))
    return type(seen) is type(expected) and bool(seen == expected)


def names_engine(text: str, rank: int) -> bool:
    """An error text names the engine: by rank ("engine 1", "rank 1"), or by its identity
    bytes as either frontend prints them (Rust `EngineId(0100)`, Python's bytes repr
    `b'\\x01\\x00'`, e.g. a KeyError of the identity, core_client.py:774)."""
    identity = rank.to_bytes(2, "little")
    return bool(re.search(rf"(engine|rank|dp|index)\D{{0,20}}\b{rank}\b", text, re.I)) \
        or identity.hex() in text or repr(identity)[2:-1] in text
