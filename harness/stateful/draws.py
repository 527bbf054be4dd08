"""What the machine draws, packed small, and the engine-side scripts it stands for.

Hypothesis spends most of a run in its own per-choice bookkeeping, so a request's script
and routing, an engine configuration and the engines' utility answers are each one
integer draw. Rules decode before recording, so replay files stay readable. This module
is the decoding and the scripting; the rules that draw live in machine.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.protocol.wire import messages as m
from mock_engines.engine import MockEngineCore
from mock_engines.script import Die, Emit, Finish, Step

# Weighted by repetition: death ends the useful part of a run, so it is rare.
KIND_TABLE: tuple[str, ...] = ("finish",) * 12 + ("hold",) * 12 + ("error",) * 5 + ("die",)
FINISH_REASONS = {"length": m.FinishReason.LENGTH, "stop": m.FinishReason.STOP,
                  "error": m.FinishReason.ERROR, "abort": m.FinishReason.ABORT}
ANSWERS = ("true", "false", "fail")
UTILITIES = ("is_sleeping", "reset_prefix_cache")
KILL_GATE = 7  # kill_engine acts when gate == KILL_GATE: one draw in eight

# A request's spec digits, least significant first (0 is the simplest value of each):
_SPEC_DIGITS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("kind", KIND_TABLE),
    ("tokens", (0, 1, 2, 3)),
    ("reason", ("length", "stop")),
    ("interval_ms", (0, 5, 10)),
    ("dp_rank", (None, 0, 1, 2, 3)),  # 3 is never an engine: it must be rejected
    ("chunk", (1, 2)),  # tokens per output
    ("stop_at", (None, 0, 1, 2)),  # a stop string matching the Nth token (if enabled)
)
SPEC_SPACE = math.prod(len(values) for _, values in _SPEC_DIGITS)


def decode_spec(code: int) -> dict[str, Any]:
    """One packed request spec -> the `generate` arguments it stands for."""
    spec: dict[str, Any] = {}
    for name, values in _SPEC_DIGITS:
        code, digit = divmod(code, len(values))
        spec[name] = values[digit]
    return spec


RECENT = 8  # drop/abort/engine_finish pick among the newest requests


def decode_picks(code: int) -> list[int]:
    """Bits 0-7 pick among the newest requests (0 = newest); bit 8 repeats the first pick."""
    picks = [i for i in range(RECENT) if code >> i & 1]
    if code >> RECENT & 1 and picks:
        picks.append(picks[0])
    return picks


READY_CHOICES = ((1024, 1000), (2048, 500), (512, 1000), (1024, 300), (4096, 2000),
                 (768, 1000))  # (max_model_len, num_gpu_blocks) per engine
BLOCK_SIZES = (16, 32)
CONFIG_SPACE = len(BLOCK_SIZES) * len(READY_CHOICES) ** 3


def decode_config(code: int, ranks: int) -> tuple[list[list[int]], int]:
    """One packed integer -> per-engine [max_model_len, num_gpu_blocks] and the block size."""
    code, digit = divmod(code, len(BLOCK_SIZES))
    ready = []
    for _ in range(ranks):
        code, choice = divmod(code, len(READY_CHOICES))
        ready.append(list(READY_CHOICES[choice]))
    return ready, BLOCK_SIZES[digit]


def decode_answers(code: int, width: int = 3) -> list[str]:
    """One packed integer -> per-engine utility answers (base 3 over ANSWERS)."""
    answers = []
    for _ in range(width):
        code, digit = divmod(code, len(ANSWERS))
        answers.append(ANSWERS[digit])
    return answers


def plan_steps(kind: str, tokens: int, reason: str, interval: float, first: int,
               chunk: int = 1) -> list[Step]:
    """The engine-side script of one request: `tokens` tokens in outputs of `chunk`."""
    toks = [first + j for j in range(tokens)]
    chunks = [toks[i:i + chunk] for i in range(0, len(toks), chunk)]
    if kind == "finish":
        last = chunks.pop() if chunks else []
        return [*(Emit(c, interval) for c in chunks),
                Finish(FINISH_REASONS[reason], last, interval)]
    emits: list[Step] = [Emit(c, interval) for c in chunks]
    if kind == "hold":  # held open until aborted or finished by `engine_finish`
        return emits or [Emit([], interval)]
    if kind == "error":
        return [*emits, Finish(m.FinishReason.ERROR, delay=interval,
                               error=m.RequestError("internal_error", "scripted failure"))]
    return [*emits, Die(interval)]


def finish_live(core: MockEngineCore, rid: str, reason: m.FinishReason, now: float) -> None:
    """Make an engine finish a request it holds at its next step (no-op if not live there).

    Reaches into the engine core's live-request record: the engine has no public "finish
    this now" command, and the step list is a per-request copy, so this changes nothing else.
    """
    live = core.running.get(rid)
    if live is None:
        return
    error = (m.RequestError("internal_error", "triggered failure")
             if reason is m.FinishReason.ERROR else None)
    live.steps.append(Finish(reason, error=error))
    live.position = len(live.steps) - 1
    live.due = now


def expected_utility(method: str, answers: Sequence[str]) -> tuple[bool, bool]:
    """(an error is expected, the value otherwise): consensus for is_sleeping, AND for reset."""
    if "fail" in answers:
        return True, False
    values = [a == "true" for a in answers]
    if method == "is_sleeping":
        return len(set(values)) != 1, values[0]
    return False, all(values)
