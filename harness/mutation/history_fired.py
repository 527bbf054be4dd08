"""pytest plugin for the history mutants' firing check (docs/mutation-history.md).

A history mutant (`history=True` in conformance/<area>/mutants.py) calls `fired(name)` at the moment
its broken branch changes what the reference would have done. With `--fired-log FILE` this
plugin replaces that no-op hook so every firing appends one line, `name<TAB>test node id`,
to FILE (each xdist worker appends to the same file). scripts/history_matrix.py reads it:
a mutant that never fired in a run proves nothing, whatever the verdicts were.
"""

from __future__ import annotations

import pytest

_current: list[str] = [""]  # the node id of the item running in this process


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fired-log", default=None, metavar="FILE",
                     help="append one line per history-mutant firing (name, test id)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--fired-log")
    if not path:
        return
    from harness.mutation import registry

    def record(name: str) -> None:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{name}\t{_current[0]}\n")

    registry.fired = record


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid
