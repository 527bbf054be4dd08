"""`corewire run -n auto` (the default): workers by the CPUs this process may use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import cli


@pytest.mark.parametrize("cpus, workers", [(1, "4"), (2, "8"), (3, "12"), (4, "16"),
                                           (64, "16")])
def test_auto_is_four_workers_per_cpu_at_most_sixteen(monkeypatch: pytest.MonkeyPatch,
                                                       cpus: int, workers: str) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert cli.default_workers() == workers


def test_run_passes_auto_workers_with_work_stealing(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def fake_child(argv: list[str], timescale: object) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cli, "_run_child", fake_child)
    cli.main(["run", "-k", "abort", "--report-dir", str(tmp_path)])
    cli.main(["run", "-n", "0", "-k", "abort", "--report-dir", str(tmp_path)])
    auto, none = seen
    assert auto[auto.index("-n") + 1] == "8"
    assert auto[auto.index("--dist") + 1] == "worksteal"
    assert "-n" not in none and "--dist" not in none
