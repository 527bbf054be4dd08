"""`corewire run -n auto` (the default): workers by the CPUs this process may use and by
what the run's frontends cost to start in a worker; and only corewire's pytest plugins in
its child."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import cli


@pytest.mark.parametrize("cpus, workers", [(1, "6"), (2, "12"), (3, "16"), (64, "16")])
def test_auto_is_six_workers_per_cpu_at_most_sixteen(monkeypatch: pytest.MonkeyPatch,
                                                      cpus: int, workers: str) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert cli.default_workers(["reference", "kv:reference"]) == workers


@pytest.mark.parametrize("frontends", [["vllm-py"], ["reference", "py=vllm-py"]])
def test_auto_is_three_per_cpu_when_vllm_py_runs(monkeypatch: pytest.MonkeyPatch,
                                                 frontends: list[str]) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert cli.default_workers(frontends) == "6"


def test_a_bad_spec_is_left_to_the_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cli.default_workers(["nonsense:x"]) == "6"


def test_run_passes_auto_workers_with_work_stealing(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def fake_child(argv: list[str], timescale: object, env: object = None) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cli, "_run_child", fake_child)
    cli.main(["run", "-k", "abort", "--report-dir", str(tmp_path)])
    cli.main(["run", "-n", "0", "-k", "abort", "--report-dir", str(tmp_path)])
    auto, none = seen
    assert auto[auto.index("-n") + 1] == "12"
    assert auto[auto.index("--dist") + 1] == "worksteal"
    assert "-n" not in none and "--dist" not in none


def test_plugins_installed_beside_corewire_are_not_loaded(tmp_path: Path) -> None:
    """A pytest plugin the environment happens to have (here one that would end every
    session) is not loaded into corewire run's child or its workers; corewire's are."""
    site = tmp_path / "site"
    dist = site / "foreign_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: foreign-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nforeign = foreign_plugin\n")
    (site / "foreign_plugin.py").write_text(
        "def pytest_configure(config):\n    raise SystemExit('foreign plugin loaded')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    probe = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", str(tmp_path)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert "foreign plugin loaded" in probe.stdout + probe.stderr  # it is installed
    done = subprocess.run([sys.executable, "-m", "harness.run.cli", "run", "-k", "abort.burst",
                           "-n", "1", "--report-dir", str(tmp_path / "r")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "r" / "results.json").is_file()
