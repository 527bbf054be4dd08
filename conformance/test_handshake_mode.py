"""HELLO / INIT / READY: the frontend owns the startup handshake (engines started headless).

vLLM 0.33.0: `wait_for_engine_startup` (`v1/engine/utils.py:1403-1580`): each engine's HELLO
(`:1517`) is answered with INIT carrying the input/output addresses, READY (`:1552`) ends its
startup, every receive bounded; engines send HELLO/READY from `core.py:1401-1425`. Rust
HandshakeOwner (rust-client.md §2.2): the same stages, "Duplicate HELLO id -> error", a
per-stage `HandshakeTimeout{stage}`. vllm-rs runs it as `vllm-rs serve` (vllm_rs_handshake.py);
vllm-py builds AsyncLLM without client_addresses, owning the handshake of remote headless
engines (vllm_py_handshake.py); a frontend still waiting past the bound is a StartupHang,
graded by the case's level. Drivers that cannot run this mode report UNSUPPORTED.
"""

from __future__ import annotations

import re
import time

from harness.case_context import CaseContext
from harness.casekit import prompt, request_for
from harness.frontends.driver import Capability, StartupError, StartupHang
from harness.verdicts import Level, case
from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript

HS = "vllm/v1/engine/utils.py:1403-1580 wait_for_engine_startup (0.33.0); rust-client.md §2.2"


def _inits(group: EngineGroup, rank: int) -> list[m.EngineHandshakeMetadata]:
    return [r.message for r in group.transcript.select(rank=rank, direction="in",
                                                       channel="handshake")
            if isinstance(r.message, m.EngineHandshakeMetadata)]


for _n in (1, 2, 3):
    def _make_init(n: int = _n) -> None:
        @case(f"handshake.mode.hello_init_ready_{n}_engines", Level.MUST,
              f"With {n} engine(s) doing HELLO / INIT / READY, each gets exactly one INIT "
              "whose input and output addresses are the same for all and reach the "
              "frontend: every engine then serves the requests pinned to it.", source=HS,
              needs=[Capability.GENERATE, Capability.DP_RANK])
        async def hello_init_ready(ctx: CaseContext) -> None:
            group = await ctx.start(n, handshake=True)
            inits = {r: _inits(group, r) for r in range(n)}
            ctx.require(all(len(v) == 1 for v in inits.values()),
                        expected="one INIT per engine",
                        observed={r: len(v) for r, v in inits.items()})
            addresses = {(tuple(v[0].addresses.inputs), tuple(v[0].addresses.outputs))
                         for v in inits.values()}
            ctx.require(len(addresses) == 1 and all(a and b for a, b in addresses),
                        expected="the same non-empty input/output addresses in every INIT",
                        observed=sorted(addresses))
            for rank in reversed(range(n)):
                p = prompt(rank)
                handle = await ctx.driver.generate(p, 2, data_parallel_rank=rank)
                await handle.wait(ctx.t(3))
                found = request_for(group, p)
                ctx.require(found is not None and found[0] == rank and
                            handle.finish_reason == "length",
                            expected=f"engine {rank} serves its pinned request",
                            observed=f"engine {found[0] if found else None}, "
                                     f"{handle.finish_reason} error={handle.error}")

        globals()[f"hello_init_ready_{n}"] = hello_init_ready
    _make_init()


async def _startup_refused(ctx: CaseContext, scripts: list[EngineScript],
                           timeout: float) -> str:
    began = time.monotonic()
    try:
        await ctx.start(scripts, handshake=True, startup_timeout=timeout)
    except StartupError as exc:
        ctx.note(f"startup error after {time.monotonic() - began:.2f}s: {exc}")
        return str(exc)
    except StartupHang as exc:  # still waiting past the bound: the driver aborted it
        ctx.require(False, expected=f"startup fails within the {ctx.t(timeout):.1f}s bound",
                    observed=str(exc))
    ctx.require(False, expected="startup fails", observed="the frontend started and serves")
    return ""


@case("handshake.mode.missing_ready_fails", Level.MUST,
      "An engine that sends HELLO and registers but never sends READY makes startup fail "
      "within the bound; the frontend does not serve without it.", source=HS, timeout=20)
async def missing_ready(ctx: CaseContext) -> None:
    await _startup_refused(ctx, [EngineScript(), EngineScript(handshake_ready=False)], 1.5)


@case("handshake.mode.missing_ready_named", Level.SHOULD,
      "The startup error for a missing READY should name the engine (1) and the stage.",
      source=HS + " (HandshakeTimeout{stage})", timeout=20)
async def missing_ready_named(ctx: CaseContext) -> None:
    text = await _startup_refused(ctx, [EngineScript(), EngineScript(handshake_ready=False)],
                                  1.5)
    named = re.search(r"(engine|rank|dp)\D{0,20}\b1\b", text, re.I) or "0100" in text
    ctx.require(bool(named) and "READY" in text.upper(),
                expected="an error naming engine 1 and the READY stage", observed=text)


@case("handshake.mode.never_hello_fails", Level.MUST,
      "An engine that never connects (no HELLO) makes startup fail within the bound.",
      source=HS, timeout=20)
async def never_hello(ctx: CaseContext) -> None:
    await _startup_refused(ctx, [EngineScript(), EngineScript(hello=False)], 1.5)


@case("handshake.mode.unexpected_identity_refused", Level.MUST,
      "A HELLO from an identity the frontend does not expect (5, with engines 0 and 1) is "
      "refused: startup fails instead of serving.", source=HS + "; core_client.py:772",
      timeout=20)
async def unexpected_identity(ctx: CaseContext) -> None:
    await _startup_refused(ctx, [EngineScript(), EngineScript(register_as=5)], 4)
