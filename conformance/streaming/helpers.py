"""What the streaming area's case files share: capability sets, the citation every
session rule makes for vllm-rs (it has no sessions), the sampling clients ask for and how
an ADD's values are read, and how a stream's ending is judged and described. Not a test
module: pytest does not collect it.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.cases.authoring import Capability, CaseContext, Sampling, StreamHandle, messages, rs

F = messages.FinishReason
GEN = [Capability.GENERATE]
SESSION_NEEDS = [Capability.STREAMING_INPUT]

# vllm-rs 0.33.0 has no streaming-input sessions: every ADD it builds says resumable false
# (right for a plain request), and only the Python frontend holds the session rules.
RS_NEVER_RESUMABLE = rs("rust/src/llm/src/request.rs:121", "resumable: false,")
NO_RS = ("rust lacks streaming-input sessions in 0.33.0 (every ADD resumable=false, "
         "rust/src/llm/src/request.rs:121), python holds it; ")


def ended_as(h: StreamHandle, reason: str) -> bool:
    """The stream ended with `reason`; "error" also counts an error ending that names no
    other reason (an HTTP frontend may end a failed stream without one)."""
    if reason == "error":
        return h.finish_reason == "error" or (h.error is not None and h.finish_reason
                                              not in ("length", "stop", "abort"))
    return h.finish_reason == reason and h.error is None


def describe(h: StreamHandle) -> str:
    """A stream's end state, for an `observed` text."""
    return f"ended={h.ended} finish_reason={h.finish_reason!r} error={h.error!r} " \
           f"tokens={h.tokens}"


def require_streams(ctx: CaseContext, handles: Sequence[StreamHandle],
                    want: Sequence[Sequence[int]]) -> None:
    """Every stream ended 'length' with exactly its tokens in `want`."""
    pairs = enumerate(zip(handles, want, strict=True))
    bad = [(i, h.tokens, h.finish_reason, h.error) for i, (h, w) in pairs
           if h.tokens != list(w) or h.finish_reason != "length"]
    ctx.require(not bad, expected=f"streams end 'length' with {[list(w) for w in want]}",
                observed=f"differ (index, tokens, finish, error): {bad}")


# Three clients' sampling, sent back to back: every value differs between them, one seed is
# 0 (falsy, and a valid seed), the last asks for the defaults (nothing of the others leaks).
ASKED = (
    Sampling(temperature=0.75, top_p=0.875, top_k=40, min_p=0.0625, seed=1234),
    Sampling(temperature=1.5, top_p=0.5, top_k=7, min_p=0.25, seed=0),
    Sampling(temperature=0.25, top_p=1.0, top_k=0, min_p=0.0, seed=None),
)
VALUE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed")


def asked_values(asked: Sampling) -> dict[str, object]:
    """The values a client asked for, by ADD field name."""
    return {name: getattr(asked, name) for name in VALUE_FIELDS}


def sampling_values(sp: messages.SamplingParams) -> dict[str, object]:
    """The ADD's values; top_k -1 read as 0 (both mean no top-k cut to the engine,
    gpu_input_batch.py:408, and older vLLM wrote -1)."""
    seen: dict[str, object] = {name: getattr(sp, name) for name in VALUE_FIELDS}
    if seen["top_k"] == -1:
        seen["top_k"] = 0
    return seen
