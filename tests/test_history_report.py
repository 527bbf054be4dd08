"""docs/history.md rendering: the matrix, the changed-in column and its PR links."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.results.history import changes, render_history
from harness.results.skew import SKEW_CASES, Kind, Outcome, classify, first_line, load_skew


def run(release: str, verdicts: dict[str, str]) -> dict[str, Any]:
    return {"meta": {}, "results": [
        {"id": case_id, "frontend": f"vllm-rs@{release}", "level": "MUST", "verdict": v}
        for case_id, v in verdicts.items()]}


def test_changes_skip_releases_without_a_verdict() -> None:
    assert changes(["FAIL", None, "PASS", "PASS"], ["a", "b", "c", "d"]) == [("c", "**F**→P")]
    assert changes([None, "PASS"], ["a", "b"]) == []


def test_matrix_orders_releases_numerically_and_links_known_prs() -> None:
    doc = render_history({
        "0.23.0": run("0.23.0", {"dp.is_sleeping.disagree": "PASS", "abort.drop.single": "PASS"}),
        "0.22.1": run("0.22.1", {"dp.is_sleeping.disagree": "FAIL", "abort.drop.single": "PASS"}),
        "0.9.0": run("0.9.0", {"dp.is_sleeping.disagree": "FAIL"}),
    })
    header = next(line for line in doc.splitlines() if line.startswith("| case |"))
    assert header.index("0.9.0") < header.index("0.22.1") < header.index("0.23.0")
    row = next(line for line in doc.splitlines() if line.startswith("| dp.is_sleeping.disagree"))
    assert "0.23.0 **F**→P [#43429](https://github.com/vllm-project/vllm/pull/43429)" in row
    same = next(line for line in doc.splitlines() if line.startswith("| abort.drop.single"))
    assert same.endswith("|  |")  # no change, no note
    known = next(line for line in doc.splitlines() if "#43429" in line and "| 0.23.0 |" in line)
    assert "dp.is_sleeping.disagree" in known


# --- version skew (harness/results/skew.py) ---

RUST_REFUSAL = (
    "frontend did not start: vllm-rs exited with 1 before serving: (RustFrontend pid=7) ERROR "
    "11-24 00:41:57 [cmd/src/main.rs:110] process failed with error: failed to connect to "
    "engine core\n(RustFrontend pid=7) INFO 11-24 00:41:57 [hf.rs:233] loading tokenizer\n"
    "Error: failed to connect to engine core\n\nCaused by:\n  messagepack decode failed for "
    "vllm_engine_core_client::protocol::handshake::EngineCoreReadyResponse: missing field "
    "`block_size`; value fallback: {\"max_model_len\": 1024}\n\nStack backtrace:\n   0: x")


def rows(frontend: str, verdict: str = "PASS", message: str = "requirement met",
         **overrides: str) -> list[dict[str, Any]]:
    out = []
    for case_id in SKEW_CASES:
        v, m = (overrides[case_id], "differs") if case_id in overrides else (verdict, message)
        out.append({"id": case_id, "frontend": frontend, "level": "MUST", "verdict": v,
                    "message": m})
    return out


def test_first_line_takes_the_rust_cause_and_drops_log_noise() -> None:
    assert first_line(RUST_REFUSAL) == ("messagepack decode failed for "
                                        "EngineCoreReadyResponse: missing field `block_size`")
    assert first_line("frontend did not start: AsyncLLM did not start: ValidationError: "
                      "Object missing required field `block_size`\nmore") == (
        "AsyncLLM did not start: ValidationError: Object missing required field `block_size`")
    assert len(first_line("x" * 500)) == 150


def test_classify_refused_works_and_garbage_against_the_matched_run() -> None:
    matched = rows("vllm-rs@0.22.1", **{"dp.is_sleeping.disagree_reversed": "FAIL"})
    refused = classify(rows("vllm-rs@0.22.1", "FAIL", RUST_REFUSAL), matched)
    assert refused == Outcome(Kind.REFUSED, first_line(RUST_REFUSAL))
    # The matched run's own FAIL is no skew failure: the same verdicts are "works".
    assert classify(matched, matched) == Outcome(Kind.WORKS)
    later = classify(rows("vllm-rs@0.22.1", **{
        "streaming.finish_kinds.length_2_engines": "TIMEOUT",
        "dp.is_sleeping.disagree_reversed": "FAIL"}), matched)
    assert later is not None and later.kind is Kind.GARBAGE
    assert later.detail.startswith("streaming.finish_kinds.length_2_engines TIMEOUT")
    decode = rows("vllm-rs@0.22.1", **{"dp.is_sleeping.disagree_reversed": "FAIL"})
    decode[0] = {**decode[0], "verdict": "FAIL", "message": (
        "expected request on engine 0 completes with 3 tokens; observed error [] error=engine-"
        "core error: messagepack decode failed for vllm_engine_core_client::protocol::"
        "EngineCoreOutputs: array had incorrect length, expected 14; value fallback: [0, []]")}
    assert classify(decode, matched) == Outcome(Kind.GARBAGE, (
        "handshake.register.all_engines FAIL: error [] error=engine-core error: messagepack "
        "decode failed for EngineCoreOutputs: array had incorrect length, expected 14"))
    # A case passing where the matched run failed is a difference too.
    assert classify(rows("vllm-rs@0.22.1"), matched) is not None
    assert classify(rows("vllm-rs@0.22.1"), matched).kind is Kind.GARBAGE  # type: ignore[union-attr]
    # Without a matched run, "works" needs every case to pass; no selection rows: not run.
    assert classify(rows("reference"), None) == Outcome(Kind.WORKS)
    assert classify([{"id": "other.case", "frontend": "x", "verdict": "FAIL",
                      "message": "m"}], None) is None


def test_refused_needs_every_started_case_to_fail_at_startup() -> None:
    mixed = rows("reference", "FAIL", RUST_REFUSAL)
    mixed[0] = {**mixed[0], "verdict": "UNSUPPORTED", "message": "driver lacks x"}
    assert classify(mixed, rows("reference")).kind is Kind.REFUSED  # type: ignore[union-attr]
    mixed[1] = {**mixed[1], "verdict": "FAIL", "message": "stream did not decode"}
    got = classify(mixed, rows("reference"))
    assert got is not None and got.kind is Kind.GARBAGE


def test_skew_section_grid_notes_and_upgrade_directions() -> None:
    skew = {
        ("vllm-rs@0.22.1", "0.22.1"): rows("vllm-rs@0.22.1"),
        ("vllm-rs@0.22.1", "0.33.0"): rows("vllm-rs@0.22.1", **{
            "streaming.finish_kinds.length_2_engines": "TIMEOUT"}),
        ("vllm-rs@0.33.0", "0.22.1"): rows("vllm-rs@0.33.0", "FAIL", RUST_REFUSAL),
        ("vllm-rs@0.33.0", "0.33.0"): rows("vllm-rs@0.33.0"),
        ("reference", "0.33.0"): rows("reference"),
    }
    doc = render_history({}, skew)
    lines = doc.splitlines()
    assert "## Version skew" in lines
    header = next(line for line in lines if line.startswith("| frontend \\ engines"))
    assert header.index("0.22.1") < header.index("0.33.0")
    rs33 = next(line for line in lines if line.startswith("| vllm-rs@0.33.0 |"))
    assert rs33 == "| vllm-rs@0.33.0 | **refused** [2] | **works** *(matched)* |"
    rs22 = next(line for line in lines if line.startswith("| vllm-rs@0.22.1 |"))
    assert rs22 == "| vllm-rs@0.22.1 | **works** *(matched)* | **garbage** [1] |"
    assert next(line for line in lines if line.startswith("| reference |")) == (
        "| reference |  | **works** *(matched)* |")
    assert "2. refused at startup: messagepack decode failed for EngineCoreReadyResponse: " \
           "missing field `block_size`" in lines
    assert any(line.startswith("1. garbage later: streaming.finish_kinds.length_2_engines "
                               "TIMEOUT") for line in lines)
    assert ("- Frontends first (newer frontend, older engines): 0 of 1 combinations work, "
            "1 are refused at startup, 0 break later. Every mismatch is refused before serving: "
            "it fails safe.") in lines
    assert ("- Engines first (older frontend, newer engines): 0 of 1 combinations work, "
            "0 are refused at startup, 1 break later. A mismatch starts serving and then fails "
            "requests: it fails late.") in lines
    assert "- vllm-rs@0.22.1 works with engines of: 0.22.1." in lines
    assert "## Version skew" not in render_history({"0.23.0": run("0.23.0", {"a.b": "PASS"})})


def test_load_skew_reads_the_split_results(tmp_path: Path) -> None:
    for fdir, frontend, release in (("0.22.1", "vllm-rs@0.22.1", "0.33.0"),
                                    ("reference", "reference", "0.22.1"),
                                    ("_runs", "reference", "0.29.0")):
        target = tmp_path / fdir / release
        target.mkdir(parents=True)
        (target / "results.json").write_text(json.dumps({"meta": {}, "results": rows(frontend)}))
    loaded = load_skew(tmp_path)
    assert sorted(loaded) == [("reference", "0.22.1"), ("vllm-rs@0.22.1", "0.33.0")]
    assert len(loaded["reference", "0.22.1"]) == len(SKEW_CASES)
