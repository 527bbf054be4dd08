"""A report dir that cannot take the reports (disk full, quota, file size limit, read-only
remount): every report file is whole or absent, the run says which and why, and still
prints its verdicts.

Each report file is written beside its path and renamed over it (writer.write_atomically),
so a failed write leaves no empty or half-written file. results.json and report.html are
written by the plugin, which records each failure instead of raising: an exception out of a
pytest_sessionfinish implementation skips every implementation after it (the teardown of
session fixtures among them) and the terminal summary, and ends in a traceback. pytest's
own JUnit writer gets the same treatment (`guard_junit`): it writes junit.xml with a bare
open()/write(), which leaves a 0-byte file when the disk is full and raises.

A run whose report set is incomplete exits REPORTS_NOT_WRITTEN (docs/cli.md).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

REPORTS_NOT_WRITTEN = 6  # exit code: a report file could not be written (docs/cli.md)
TRANSCRIPT_NOT_WRITTEN = "transcript not written: "  # the case note's prefix (case_context)


def describe(path: str, exc: OSError) -> str:
    """`PATH: File too large (EFBIG, errno 27)`: the path, the reason and its errno."""
    name = errno.errorcode.get(exc.errno or 0, "?")
    reason = exc.strerror or str(exc)
    return f"{path}: {reason} ({name}, errno {exc.errno})"


class ReportsNotWritten(Exception):
    """Some files of a report set could not be written; each is named with its errno."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.failures = failures


def guard_junit(config: pytest.Config, failures: list[str]) -> None:
    """Make pytest's JUnit writer atomic and keep its write error from escaping: on an
    OSError the partial file is removed, the failure (path, errno) is appended to
    `failures`, and its "generated xml file" line is not printed. Call once the JUnit
    plugin is registered (pytest_sessionstart); a no-op without --junitxml."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    failed: list[bool] = []

    def atomic(write: Callable[[], None]) -> Callable[[], None]:
        def sessionfinish() -> None:
            final = xml.logfile
            partial = f"{final}.partial-{os.getpid()}"
            xml.logfile = partial
            try:
                write()
                os.replace(partial, final)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.remove(partial)
                failed.append(True)
                failures.append(describe(final, exc))
            finally:
                xml.logfile = final
        return sessionfinish

    def quiet_if_failed(summary: Callable[..., None]) -> Callable[..., None]:
        def terminal_summary(*args: Any, **kwargs: Any) -> None:
            if not failed:
                summary(*args, **kwargs)
        return terminal_summary

    wrappers = {"pytest_sessionfinish": atomic, "pytest_terminal_summary": quiet_if_failed}
    for name, wrap in wrappers.items():
        for impl in getattr(config.hook, name).get_hookimpls():
            if impl.plugin is xml:
                impl.function = wrap(impl.function)
