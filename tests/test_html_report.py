"""The HTML report, opened in real headless Chromium (Debian's chromium package).

The report is generated from a real run with a failing frontend; Chromium renders it,
takes a screenshot, and dumps the DOM after scripts ran, so the test checks what a person
would see: the verdict matrix, and a failing case's decoded transcript.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make test installs it)")
def test_report_shows_matrix_and_failing_transcript(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "conformance"), "-q",
                           "-p", "no:cacheprovider", "-k", "dp.is_sleeping",
                           "--frontend", "reference", "--frontend",
                           "mutant:sleeping_first_engine", "--report-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:]
    report = tmp_path / "report.html"
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    failing = next(r for r in results if r["verdict"] == "FAIL")
    detail = "d-" + "".join(c if c.isalnum() else "-"
                            for c in f"{failing['id']}-{failing['frontend']}")
    url = f"file://{report}#{detail}"
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1600", url)
    assert shot.exists() and shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = chromium(tmp_path, "--dump-dom", url).stdout
    assert "id=\"matrix\"" in dom
    assert dom.count("data-verdict=\"FAIL\"") == 3
    assert dom.count("data-verdict=\"PASS\"") >= 6
    opened = dom.split(f'id="{detail}"')[0].rsplit("<div", 1)[1]
    assert "open" in opened, "the failing case's detail is expanded"
    section = dom.split(f'id="{detail}"')[1].split("class=\"detail")[0]
    assert "Transcript" in section and "UtilityRequest" in section and "is_sleeping" in section
    shutil.copy(shot, ROOT / "reports" / "report-screenshot.png")
