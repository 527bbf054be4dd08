"""Small helpers conformance cases share: distinct prompts, hold-open scripts, lookups.

Frontends name requests differently (vllm-rs and AsyncLLM add their own ids), so cases
give every stream a distinct prompt and find the engine-side request through the
transcript by prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.wire import messages as m
from mock_engines.group import EngineGroup
from mock_engines.script import Emit, Step, StepFactory


def prompt(i: int) -> list[int]:
    """A distinct 3-token prompt per index (ids stay inside the tiny vocabulary)."""
    return [11, 20 + i // 900, 20 + i % 900]


def hold(first_tokens: Sequence[int] = (100,), delay: float = 0.0) -> list[Step]:
    """Send the first tokens, then keep the request open (no Finish) until aborted."""
    return [Emit(list(first_tokens), delay)]


def trickle(interval: float, count: int = 2000, first: int = 100) -> StepFactory:
    """A long-running stream: one token every `interval` seconds, `count` at most."""

    def make(_request: m.EngineCoreRequest) -> list[Step]:
        return [Emit([first + i % 800], interval) for i in range(count)]

    return make


def request_for(group: EngineGroup, prompt_ids: Sequence[int]) -> tuple[int, str] | None:
    """(owning rank, engine-side request id) of the ADD carrying this prompt, if any."""
    want = list(prompt_ids)
    for rank in range(len(group.engines)):
        for req in group.transcript.adds(group.engines[rank].rank):
            if req.prompt_token_ids == want:
                return group.engines[rank].rank, req.request_id
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
