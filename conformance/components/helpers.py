"""What the component suites share: grading a list of contract violations."""

from __future__ import annotations

from harness.cases.authoring import CaseContext


def require_none(ctx: CaseContext, violations: list[str], expected: str) -> None:
    """No violation (the first six are shown when there are)."""
    ctx.require(not violations, expected=expected, observed="; ".join(violations[:6]))
