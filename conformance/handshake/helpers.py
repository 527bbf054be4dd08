"""What the handshake area's case files share: the vLLM 0.33.0 sources their grounds cite, a
ready response built key by key, the check that a pinned request reaches its engine, and the
ways a case waits for a refused startup.

A refused startup is graded three ways: promptly (`refused_promptly`: a frontend that
cannot use a ready frame says so at once, not at its bound), within the bound
(`fails_within_bound`, `startup_refused`: something never arrives, so only the bound ends
the wait), and in handshake mode (`handshake_refused`: "promptly" counts from the engines'
last handshake message).
"""

from __future__ import annotations

import time

import msgspec

from harness.cases.authoring import (
    CaseContext,
    EngineGroup,
    EngineScript,
    StartupError,
    StartupHang,
    default_ready,
    request_for,
)

# The 0.33.0 sources the area's grounds cite.
CC = "vllm/v1/engine/core_client.py"
RDY = "vllm/v1/engine/__init__.py"
CORE = "vllm/v1/engine/core.py"
UT = "vllm/v1/engine/utils.py"
TR = "rust/src/engine-core-client/src/transport.rs"
HS = "rust/src/engine-core-client/src/protocol/handshake.rs"
CL = "rust/src/engine-core-client/src/client.rs"
TESTS = "rust/src/engine-core-client/src/tests/client.rs"

# Ready-frame delays (s) by rank so the frames arrive interleaved: engine 1, 3, 0, 2.
INTERLEAVED = [0.3, 0.0, 0.45, 0.15]


def raw_ready(rank: int, n: int = 1, drop: str | None = None, **extra: object) -> bytes:
    """Engine `rank`'s (of `n`) ready response as a msgpack map of its keys, less `drop`,
    with `extra` added or replaced: a payload the ready struct itself could not encode."""
    fields = msgspec.structs.asdict(default_ready(rank, n))
    if drop is not None:
        del fields[drop]
    fields.update(extra)
    return msgspec.msgpack.encode(fields)


async def require_pinned_served(ctx: CaseContext, group: EngineGroup, rank: int,
                                prompt_ids: list[int], expected: str) -> None:
    """A 2-token request with this prompt, pinned to `rank`, finishes at engine `rank`;
    `expected` says so in the case's words."""
    handle = await ctx.driver.generate(prompt_ids, 2, data_parallel_rank=rank)
    await handle.wait(ctx.t(3))
    found = request_for(group, prompt_ids)
    ctx.require(found is not None and found[0] == rank and handle.finish_reason == "length",
                expected=expected,
                observed=f"engine {found[0] if found else None}, "
                         f"{handle.finish_reason} error={handle.error}")


async def refused_promptly(ctx: CaseContext, scripts: list[EngineScript], within: float,
                           offset: int = 0) -> str:
    """Startup must fail with StartupError within `within` (scaled) seconds; the error text.
    `offset`: the engines' first rank (the frontend's engine start index)."""
    began = time.monotonic()
    try:
        await ctx.start(scripts, startup_timeout=within * 3, rank_offset=offset)
    except StartupError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(within), expected=f"startup error within {within}s",
                    observed=f"startup error after {elapsed:.2f}s: {exc}")
        return str(exc)
    ctx.fail(expected="the frontend refuses to start",
             observed="the frontend started and serves")


async def fails_within_bound(ctx: CaseContext, scripts: list[EngineScript], *,
                             expected: str) -> None:
    """Startup, bounded at 1.5 s, must end in a StartupError (noted, with its time);
    `expected` says which error the case waits for."""
    began = time.monotonic()
    try:
        await ctx.start(scripts, startup_timeout=1.5)
    except StartupError as exc:
        ctx.note(f"startup error after {time.monotonic() - began:.2f}s: {exc}")
        return
    ctx.fail(expected=expected, observed="the frontend started")


async def startup_refused(ctx: CaseContext, scripts: list[EngineScript]) -> str:
    """Startup (bounded at 4 s) must be refused; the refusal's text."""
    try:
        await ctx.start(scripts, startup_timeout=4)
    except StartupError as exc:
        ctx.note(f"startup error: {exc}")
        return str(exc)
    except StartupHang as exc:
        ctx.fail(expected="startup is refused within its bound", observed=str(exc))
    ctx.fail(expected="startup is refused", observed="the frontend started")


async def handshake_refused(ctx: CaseContext, scripts: list[EngineScript], timeout: float,
                            within: float | None = None) -> str:
    """Startup in handshake mode, bounded at `timeout`, must fail (within `within` scaled
    seconds of the engines' last handshake message when given); the error text."""
    began = time.monotonic()
    try:
        await ctx.start(scripts, handshake=True, startup_timeout=timeout)
    except StartupError as exc:
        failed = time.monotonic()
        # "Promptly" counts from the engines' last handshake message (the misstep or what
        # followed it), not from the call: building the frontend (AsyncLLM's config, a
        # binary's start) takes seconds of its own on a loaded machine.
        sent = [r.t for r in (ctx.group.transcript.snapshot() if ctx.group else [])
                if r.channel == "handshake" and r.direction == "out"]
        since = failed - max(sent) if sent else failed - began
        ctx.note(f"startup error after {failed - began:.2f}s, {since:.2f}s after the "
                 f"engines' last handshake message: {exc}")
        if within is not None:
            ctx.require(since <= ctx.t(within),
                        expected=f"startup fails within {within}s (scaled) of the engines' "
                                 "last handshake message",
                        observed=f"failed {since:.2f}s after it: {exc}")
        return str(exc)
    except StartupHang as exc:  # still waiting past the bound: the driver aborted it
        ctx.fail(expected=f"startup fails within the {ctx.t(timeout):.1f}s bound",
                 observed=str(exc))
    ctx.fail(expected="startup fails", observed="the frontend started and serves")
