"""One run, one consistent report set.

A run clears the files corewire owns in its report dir when it starts (results.json,
report.html, junit.xml, transcripts/*.json), so a filtered run (`-k`) never leaves the
reports of an earlier run beside its own. Anything else in the directory is left alone,
and directories are never removed (a concurrent writer keeps its target directory).
"""

from __future__ import annotations

import contextlib
import os

OWNED_FILES = ("results.json", "report.html", "junit.xml")
TRANSCRIPTS = "transcripts"


def clear_report_set(report_dir: str) -> list[str]:
    """Remove the previous run's report files; returns what was removed."""
    removed: list[str] = []
    candidates = [os.path.join(report_dir, name) for name in OWNED_FILES]
    transcripts = os.path.join(report_dir, TRANSCRIPTS)
    with contextlib.suppress(OSError):
        candidates += [os.path.join(transcripts, name) for name in os.listdir(transcripts)
                       if name.endswith(".json")]
    for path in candidates:
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            continue
    return removed
