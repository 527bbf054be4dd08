"""What the failure area's case files share: grading a utility call left waiting when the
client fails (by ENGINE_CORE_DEAD, or by an undecodable output message).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from harness.cases.authoring import CaseContext, FrontendError


async def require_pending_call_fails(ctx: CaseContext, call: asyncio.Future[Any], cause: str,
                                     show: Callable[[Any], str] = repr) -> None:
    """`call`, a utility call still waiting for its reply, fails within 1 s of `cause`
    (sent just before): it neither returns (`show` renders what it returned) nor hangs."""
    began = time.monotonic()
    try:
        value = await asyncio.wait_for(call, ctx.t(3))
    except asyncio.TimeoutError:
        ctx.fail(expected="the pending call fails within 1 s",
                 observed=f"still pending 3 s after {cause}")
    except FrontendError as exc:
        elapsed = time.monotonic() - began
        ctx.require(elapsed <= ctx.t(1.0), expected="the pending call fails within 1 s",
                    observed=f"failed after {elapsed:.2f}s: {exc}")
        return
    ctx.fail(expected="the pending call fails", observed=f"returned {show(value)}")
