"""Sharded runs: `--shard i/n` splits a selection into a partition, and `corewire merge`
of the shards' report dirs equals the unsharded run (ids, frontends, verdicts, messages,
exit code); inputs that are not the shards of one run are refused with exit 4."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml

from harness.cases.index import wire_specs
from harness.run.shard import ShardSpecError, parse_shard, shard_of

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = "mutant:sleeping_first_engine"  # fails the three dp.is_sleeping disagreement cases
SELECTION = ["-k", "dp.is_sleeping", "--frontend", "reference", "--frontend", SLEEPY]
FRONTENDS = ["reference", "reference-subprocess", "vllm-rs", "vllm-py", SLEEPY]


def _case_ids() -> list[str]:
    return sorted(wire_specs())


def test_split_is_a_balanced_stable_partition() -> None:
    items = [(case, frontend) for case in _case_ids() for frontend in FRONTENDS]
    assert len(items) > 500
    for n in range(1, 5):
        shards = [[it for it in items if shard_of(*it, n) == i] for i in range(1, n + 1)]
        assert sorted(it for shard in shards for it in shard) == sorted(items)
        assert all(1 <= shard_of(*it, n) <= n for it in items)
        mean = len(items) / n
        assert all(abs(len(shard) - mean) < 0.15 * mean for shard in shards), \
            [len(s) for s in shards]
    # Pinned (sha256 of "case[frontend]"): the same item lands in the same shard on
    # every machine and Python, so shards run on different CI hosts always agree.
    assert [shard_of("abort.drop.single", "reference", n) for n in (1, 2, 3, 4)] == [1] * 4
    assert [shard_of("dp.is_sleeping.all_true", "vllm-rs", n) for n in (1, 2, 3, 4)] == \
        [1, 1, 3, 3]


@pytest.mark.parametrize("text,expected", [("1/1", (1, 1)), ("2/3", (2, 3)),
                                           (" 4/4 ", (4, 4))])
def test_parse_shard(text: str, expected: tuple[int, int]) -> None:
    shard = parse_shard(text)
    assert (shard.index, shard.count) == expected


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "1/0", "a/b", "-1/2", "1/2/3", ""])
def test_parse_shard_refuses(text: str) -> None:
    with pytest.raises(ShardSpecError, match="expected i/n"):
        parse_shard(text)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.run.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("entry", ["cli", "pytest"])
def test_bad_shard_is_a_usage_error(tmp_path: Path, entry: str) -> None:
    if entry == "cli":
        proc = _cli("run", "-n", "0", "--shard", "4/3", "-k", "abort.drop.single",
                    "--report-dir", str(tmp_path))
    else:
        proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", "-p",
                               "no:cacheprovider", "-n", "0", "--shard", "0/2",
                               "--report-dir", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-2000:]
    assert "expected i/n" in out and "Traceback" not in out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One unsharded run and its three shards (a small, fast selection, -n 0)."""
    base = tmp_path_factory.mktemp("shards")
    codes = {}
    for name, extra in [("full", []), *[(f"s{i}", ["--shard", f"{i}/3"]) for i in (1, 2, 3)]]:
        proc = _cli("run", "-n", "0", *SELECTION, *extra, "--report-dir", str(base / name))
        codes[name] = proc.returncode
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {"base": base, "codes": codes}


def _rows(path: Path) -> list[tuple[Any, ...]]:
    doc = json.loads((path / "results.json").read_text())
    return [(r["id"], r["frontend"], r["verdict"], r["message"], r["level"], r["baseline"],
             r["evidence"]["expected"], r["evidence"]["observed"]) for r in doc["results"]]


def test_shards_partition_the_run_and_record_it(runs: dict[str, Any]) -> None:
    base: Path = runs["base"]
    full = _rows(base / "full")
    shards = [_rows(base / f"s{i}") for i in (1, 2, 3)]
    assert sorted(row for shard in shards for row in shard) == sorted(full)
    assert len(full) == 12 and all(shards), [len(s) for s in shards]
    for i in (1, 2, 3):
        meta = json.loads((base / f"s{i}" / "results.json").read_text())["meta"]
        assert meta["shard"] == [i, 3]
        assert meta["selection"]["keyword"] == "dp.is_sleeping"
        assert meta["selection"]["frontends"] == sorted(["reference", SLEEPY])
        assert meta["selection"]["selected_items"] == 12
        assert meta["selection"]["shard_items"] == len(shards[i - 1])


def test_merge_equals_the_unsharded_run(runs: dict[str, Any]) -> None:
    base: Path = runs["base"]
    out = base / "merged"
    proc = _cli("merge", *(str(base / f"s{i}") for i in (3, 1, 2)), "--report-dir", str(out))
    assert proc.returncode == runs["codes"]["full"] == 1, proc.stdout + proc.stderr
    assert _rows(out) == _rows(base / "full")
    full_meta = json.loads((base / "full" / "results.json").read_text())["meta"]
    merged_meta = json.loads((out / "results.json").read_text())["meta"]
    assert merged_meta["failing"] == full_meta["failing"] and len(full_meta["failing"]) == 3
    assert merged_meta["partial"] is False
    assert "FAIL        dp.is_sleeping.disagree[" in proc.stdout
    assert "FAIL=3" in proc.stdout and "NON-STRICT=0" in proc.stdout
    # Transcripts travel into the merged dir and the rows point at them.
    merged_doc = json.loads((out / "results.json").read_text())
    files = [r["evidence"]["transcript_file"] for r in merged_doc["results"]
             if r["evidence"]["transcript_file"]]
    assert files and all(Path(f).parent == out / "transcripts" and Path(f).exists()
                         for f in files)
    assert sorted(p.name for p in (out / "transcripts").iterdir()) == \
        sorted(p.name for p in (base / "full" / "transcripts").iterdir())
    # One JUnit file with the same test cases and outcomes as the unsharded run's.
    def outcomes(path: Path) -> dict[str, str]:
        xml = JUnitXml.fromfile(str(path / "junit.xml"))
        return {case.name: ",".join(sorted(type(r).__name__ for r in case.result))
                for suite in xml for case in suite}
    assert outcomes(out) == outcomes(base / "full")
    assert "PASS" in (out / "report.html").read_text()


def test_merge_regrades_against_a_baseline(runs: dict[str, Any], tmp_path: Path) -> None:
    from harness.results.baseline import Baseline, BaselineEntry

    entries = [BaselineEntry(case, SLEEPY, "FAIL", "port under development", "https://x/1",
                             "2099-01-01")
               for case in ("dp.is_sleeping.disagree", "dp.is_sleeping.disagree_reversed",
                            "dp.is_sleeping.disagree_names_values")]
    path = tmp_path / "baseline.json"
    Baseline({(e.case, e.frontend): e for e in entries}).save(str(path))
    base: Path = runs["base"]
    proc = _cli("merge", *(str(base / f"s{i}") for i in (1, 2, 3)), "--baseline", str(path),
                "--report-dir", str(tmp_path / "merged"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BASELINED FAIL 3: dp 3" in proc.stdout  # folded: -v lists them
    # An error outside any case in one shard (a leak found at its session end) still
    # fails the merged run, as it failed that shard.
    leaky = _edit(base / "s2", tmp_path / "s2", failed_outside_cases=1)
    proc = _cli("merge", str(base / "s1"), str(leaky), str(base / "s3"), "--baseline",
                str(path), "--report-dir", str(tmp_path / "merged2"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"shard 2/3 ({leaky}): 1 error(s) outside any case" in proc.stdout


def _edit(src: Path, dst: Path, **meta: Any) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / "results.json").read_text())
    for key, value in meta.items():
        if key == "keyword":
            doc["meta"]["selection"]["keyword"] = value
        else:
            doc["meta"][key] = value
    (dst / "results.json").write_text(json.dumps(doc))
    return dst


def test_merge_refusals(runs: dict[str, Any], tmp_path: Path) -> None:
    base: Path = runs["base"]
    s1, s2, s3 = (str(base / f"s{i}") for i in (1, 2, 3))
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    other = _edit(base / "s1", tmp_path / "other", keyword="dp", shard=[1, 1])
    cases = {
        "missing shard 2/3": [s1, s3],
        "shard 1/3 given twice": [s1, s1, s2, s3],
        "mixed shard counts [1, 3]": [s1, s2, s3, str(base / "full")],
        "overlapping shards": [s1, s2, s3, str(other)],
        "unreadable": [s1, s2, s3, str(tmp_path / "empty")],
        "results.json: unreadable": [s1, s2, str(tmp_path / "bad")],
        "is one of the inputs": [s1, s2, s3],
    }
    for says, dirs in cases.items():
        out = s1 if says == "is one of the inputs" else str(tmp_path / "out")
        proc = _cli("merge", *dirs, "--report-dir", out)
        err = proc.stdout + proc.stderr
        assert proc.returncode == 4, f"{says}: {proc.returncode}\n{err}"
        assert says in err and "Traceback" not in err, err
        assert len(proc.stderr.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_partial_shard_makes_the_merge_partial(runs: dict[str, Any], tmp_path: Path) -> None:
    base: Path = runs["base"]
    cut = _edit(base / "s2", tmp_path / "s2", partial=True,
                partial_reason="interrupted by SIGTERM")
    proc = _cli("merge", str(base / "s1"), str(cut), str(base / "s3"),
                "--report-dir", str(tmp_path / "merged"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "PARTIAL: shard 2/3" in proc.stdout and "interrupted by SIGTERM" in proc.stdout
    meta = json.loads((tmp_path / "merged" / "results.json").read_text())["meta"]
    assert meta["partial"] is True


def test_an_empty_shard_passes_and_still_writes_its_report(tmp_path: Path) -> None:
    """A shard that drew no item of the selection is not 'no case ran' (exit 5): the merge
    needs its (empty) report to know the shard ran."""
    index = 3 - shard_of("abort.drop.single", "reference", 2)  # the other shard of two
    proc = _cli("run", "-n", "0", "-k", "abort.drop.single", "--shard", f"{index}/2",
                "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"shard {index}/2 drew none of the selection's 1 items" in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["results"] == [] and doc["meta"]["shard"] == [index, 2]


def test_a_frontend_by_shard_matrix_merges_in_one_call(runs: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """The README's CI matrix: one frontend per job, each split (or not) on its own."""
    dirs = []
    for frontend, shards in (("reference", ["1/2", "2/2"]), (SLEEPY, [None])):
        for shard in shards:
            out = tmp_path / f"{frontend.replace(':', '-')}-{(shard or '1/1').replace('/', '-')}"
            proc = _cli("run", "-n", "0", "-k", "dp.is_sleeping", "--frontend", frontend,
                        *(["--shard", shard] if shard else []), "--report-dir", str(out))
            assert proc.returncode in (0, 1), proc.stdout + proc.stderr
            dirs.append(str(out))
    proc = _cli("merge", *dirs, "--report-dir", str(tmp_path / "merged"))
    assert proc.returncode == runs["codes"]["full"], proc.stdout + proc.stderr
    assert _rows(tmp_path / "merged") == _rows(runs["base"] / "full")
    proc = _cli("merge", *dirs[1:], "--report-dir", str(tmp_path / "merged"))
    assert proc.returncode == 4
    assert "missing shard 1/2 of the selection --frontend reference -k 'dp.is_sleeping'" \
        in proc.stderr
