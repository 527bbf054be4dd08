"""Text patterns cases grade by: each accepts what it names and rejects look-alikes.

A pattern that matches a bound ("within 1.5s") or an operator ("DP>1") passes a frontend
whose error names nothing (seen once on vllm-py under load: never_registers_named PASS).
"""

from __future__ import annotations

import pytest

from conformance.handshake.test_register import NAMES_ENGINE_1


@pytest.mark.parametrize("text", [
    "engines [1] did not register within 1.5s", "engine 1 never registered",
    "DP rank 1 is missing", "EngineCore_DP1 failed", "rank=1", "waiting for engine 1."])
def test_names_engine_1_accepts_names(text: str) -> None:
    assert NAMES_ENGINE_1.search(text)


@pytest.mark.parametrize("text", [
    "DP>1 needs a DP coordinator stats address; the engine group has none",
    "could not build vLLM's config for 2 engine(s): 1.5",
    "Timed out waiting for engine core processes to start. Waited 1.48s",
    "no engine within 1.5s", "engines 10 and 11", "engine 1.5s"])
def test_names_engine_1_rejects_numbers(text: str) -> None:
    assert not NAMES_ENGINE_1.search(text)
