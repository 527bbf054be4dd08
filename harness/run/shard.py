"""`--shard i/n`: split a run over n machines by a stable hash of (case id, frontend).

The shard of an item depends only on its case id, its frontend and n, never on collection
order, `-n` or the machine, so every item of a selection lands in exactly one of the n
shards and `corewire merge` can check the union (harness/results/merge.py).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import pytest

from harness.locations import IMPORT_ROOT
from harness.run import selection

REPO = IMPORT_ROOT  # args are recorded relative to it (conformance/...), so machines agree


class ShardSpecError(ValueError):
    """A `--shard` value that is not `i/n` with 1 <= i <= n."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`"2/3"` -> Shard(2, 3); anything else is a ShardSpecError naming the value."""
    head, sep, tail = text.strip().partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = 0
    if not sep or count < 1 or not 1 <= index <= count:
        raise ShardSpecError(f"--shard {text!r}: expected i/n with 1 <= i <= n "
                             f"(e.g. 2/3)")
    return Shard(index, count)


def shard_of(case_id: str, frontend: str, count: int) -> int:
    """The 1-based shard of one item: sha256 of `case[frontend]`, modulo `count`."""
    digest = hashlib.sha256(f"{case_id}[{frontend}]".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def item_key(item: pytest.Item) -> tuple[str, str]:
    """(case id, frontend) of a conformance item; (node id, "") for anything else."""
    spec = getattr(item, "corewire_spec", None)
    if spec is None:
        return item.nodeid, ""
    return spec.case_id, str(item.corewire_frontend)  # type: ignore[attr-defined]


def configured_shard(config: pytest.Config) -> Shard | None:
    text = config.getoption("shard", None)
    if not text:
        return None
    try:
        return parse_shard(text)
    except ShardSpecError as exc:
        raise pytest.UsageError(str(exc)) from None


def deselect_other_shards(items: list[pytest.Item], config: pytest.Config) -> None:
    """Keep this shard's items; the others are deselected (not reported). Records the
    size of the whole selection for the results' meta."""
    shard = configured_shard(config)
    selected = len(items)
    if shard is None:
        record_counts(config, selected, selected)
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        case_id, frontend = item_key(item)
        (keep if shard_of(case_id, frontend, shard.count) == shard.index else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    record_counts(config, selected, len(keep))


def record_counts(config: pytest.Config, selected: int, kept: int) -> None:
    """Sizes of the whole selection and of this shard; an xdist worker ships them to the
    controller (workeroutput), which keeps them for the results' meta."""
    config._corewire_counts = (selected, kept)  # type: ignore[attr-defined]
    output = getattr(config, "workeroutput", None)
    if output is not None:
        output["corewire_counts"] = [selected, kept]


def selection_meta(config: pytest.Config) -> dict[str, Any]:
    """What this run selected, so a merge can group the shards of one selection: the
    frontends, -k, -m and paths (relative to the repository, so machines agree)."""
    keyword = getattr(config, "_corewire_keyword", None) or config.getoption("keyword")
    args = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        absolute = os.path.abspath(path)
        if absolute == str(REPO) or absolute.startswith(str(REPO) + os.sep):
            path = os.path.relpath(absolute, REPO)
        args.append(path + sep + rest)
    meta: dict[str, Any] = {"frontends": selection.frontend_names(config),
                            "keyword": str(keyword or ""),
                            "markexpr": str(config.getoption("markexpr") or ""),
                            "args": sorted(args)}
    counts = getattr(config, "_corewire_counts", None)
    if counts is not None:
        meta["selected_items"], meta["shard_items"] = counts
    return meta
