"""Evidence bounded by size, whatever the frontend sends.

A frontend controls much of what ends up in a result: request ids, prompts, error texts, a
driver program's lines. Every string and list that a result row, a transcript excerpt or a
stored transcript carries is clipped here to a stated size (the head and the tail, with how
much was elided and a digest of the whole, so two clipped values can still be told apart).
A row of results.json is then never larger than ROW_LIMIT bytes, and a stored transcript
frame never larger than TRANSCRIPT_TEXT_LIMIT per string.
"""

from __future__ import annotations

import hashlib
from typing import Any

from harness.results.records import CaseResult

TEXT_LIMIT = 8 << 10  # a message, expected, observed, a note
NOTES_LIMIT = 24  # notes kept per result (the first and the last)
EXCERPT_TEXT_LIMIT = 2 << 10  # any string inside a transcript excerpt record
TRANSCRIPT_TEXT_LIMIT = 64 << 10  # any string inside a stored transcript file
LIST_LIMIT = 64  # items of a list inside a transcript record (head and tail)
DEPTH_LIMIT = 24  # nesting inside a transcript record
ROW_LIMIT = 1 << 20  # the encoded size of one results.json row, at most (tested)


def clip_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` itself when it fits, else its head and tail around a marker (length, digest)."""
    if len(text) <= limit:
        return text
    keep = max(limit // 2 - 64, 16)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return (f"{text[:keep]}...[{len(text) - 2 * keep} of {len(text)} characters elided, "
            f"sha256 {digest}]...{text[-keep:]}")


def clip_value(value: Any, text_limit: int, list_limit: int = LIST_LIMIT,
               depth: int = 0) -> Any:
    """A JSON-like value with every string, list and nesting level clipped."""
    if isinstance(value, str):
        return clip_text(value, text_limit)
    if depth >= DEPTH_LIMIT and isinstance(value, (list, tuple, dict)):
        return f"[{type(value).__name__} nested deeper than {DEPTH_LIMIT} levels elided]"
    if isinstance(value, (list, tuple)):
        items = list(value)
        if len(items) > list_limit:
            half = list_limit // 2
            items = [*items[:half], f"...[{len(value) - 2 * half} items elided]...",
                     *items[-half:]]
        return [clip_value(v, text_limit, list_limit, depth + 1) for v in items]
    if isinstance(value, dict):
        return {clip_text(str(k), 256): clip_value(v, text_limit, list_limit, depth + 1)
                for k, v in value.items()}
    return value


def bound_result(result: CaseResult) -> CaseResult:
    """Clip every frontend-controlled field of a result row in place (and return it)."""
    result.message = clip_text(result.message)
    result.frontend = clip_text(result.frontend, 1024)
    if result.baseline is not None:
        result.baseline = clip_text(result.baseline)
    evidence = result.evidence
    evidence.expected = clip_text(evidence.expected)
    evidence.observed = clip_text(evidence.observed)
    notes = evidence.notes
    if len(notes) > NOTES_LIMIT:
        half = NOTES_LIMIT // 2
        notes = [*notes[:half], f"[{len(notes) - 2 * half} notes elided]", *notes[-half:]]
    evidence.notes = [clip_text(n) for n in notes]
    evidence.transcript = [clip_value(r, EXCERPT_TEXT_LIMIT) for r in evidence.transcript]
    return result
