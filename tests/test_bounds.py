"""Evidence is bounded by size, not by record count, whatever the frontend sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.bounds import (
    EXCERPT_TEXT_LIMIT,
    LIST_LIMIT,
    ROW_LIMIT,
    TEXT_LIMIT,
    bound_result,
    clip_text,
    clip_value,
)
from harness.results.records import CaseResult, Evidence, Verdict
from harness.results.schema import encode_result


def test_small_values_are_untouched() -> None:
    assert clip_text("abc") == "abc"
    record = {"a": [1, 2, 3], "b": {"c": "d"}, "n": None}
    assert clip_value(record, 100) == record


def test_a_long_text_keeps_head_tail_length_and_digest() -> None:
    text = "H" * 10 + "x" * 10**6 + "T" * 10
    clipped = clip_text(text)
    assert len(clipped) <= TEXT_LIMIT + 200
    assert clipped.startswith("HHHHHHHHHH") and clipped.endswith("TTTTTTTTTT")
    assert "of 1000020 characters elided, sha256 " in clipped
    assert clip_text(text[:-1] + "U") != clipped  # the digest tells them apart


def test_lists_and_nesting_are_clipped() -> None:
    value = clip_value({"prompt_token_ids": list(range(2_000_000))}, 100)
    ids = value["prompt_token_ids"]
    assert len(ids) == LIST_LIMIT + 1 and ids[0] == 0 and ids[-1] == 1_999_999
    deep: list[object] = []
    node = deep
    for _ in range(100_000):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    assert isinstance(clip_value(deep, 100), list)  # no RecursionError


def test_a_hostile_row_stays_under_the_row_limit() -> None:
    """An 8 MiB prompt and a 1 MiB request id in every field a frontend can reach."""
    rid = "r" * (1 << 20)
    prompt = list(range(2 << 20))
    result = CaseResult(
        "streaming.finish.length", "subprocess:" + "x" * 10**6, "MUST", "src", "req",
        Verdict.FAIL, f"request {rid} failed", 1.0, baseline=None,
        evidence=Evidence(expected=rid, observed=str(prompt)[:8 << 20],
                          notes=[rid] * 1000,
                          transcript=[{"message": {"request_id": rid,
                                                   "prompt_token_ids": prompt},
                                       "hex": "00" * (4 << 20)}] * 40))
    encoded = encode_result(bound_result(result))
    assert len(encoded) <= ROW_LIMIT
    record = result.evidence.transcript[0]
    assert len(record["hex"]) <= EXCERPT_TEXT_LIMIT + 200


def test_reports_are_written_atomically(tmp_path: Path) -> None:
    """A write that fails midway (a full disk) leaves the previous file, not half a file."""
    from harness.results import writer

    target = tmp_path / "results.json"
    target.write_text("previous")

    original = open

    def failing_open(path: str, mode: str = "r", *args: object, **kw: object) -> object:
        if "w" in mode:
            raise OSError(28, "No space left on device")
        return original(path, mode, *args, **kw)  # type: ignore[call-overload]

    writer.open = failing_open  # type: ignore[attr-defined]
    try:
        with pytest.raises(OSError, match="No space"):
            writer.write_atomically(str(target), "new")
    finally:
        del writer.open  # type: ignore[attr-defined]
    assert target.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    writer.write_atomically(str(target), "new")
    assert target.read_text() == "new"


def test_a_baseline_nested_too_deep_is_a_baseline_error(tmp_path: Path) -> None:
    from harness.results.baseline import Baseline, BaselineError

    path = tmp_path / "baseline.json"
    path.write_text('{"entries": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(BaselineError, match="RecursionError"):
        Baseline.load(str(path))
