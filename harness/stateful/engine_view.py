"""What both worlds read off their mock engine cores: the merged transcript, the ABORT
frames and the protocol errors, each tagged with the engine's rank."""

from __future__ import annotations

from collections.abc import Sequence

from mock_engines.engine import MockEngineCore
from mock_engines.transcript import Record


def merged_records(cores: Sequence[MockEngineCore]) -> list[Record]:
    records = [r for core in cores for r in core.transcript.snapshot()]
    records.sort(key=lambda r: r.t)
    return records


def aborts_of(cores: Sequence[MockEngineCore]) -> list[tuple[int, list[str]]]:
    return [(core.rank, list(r.message.request_ids))
            for core in cores for r in core.transcript.abort_frames()]


def errors_of(cores: Sequence[MockEngineCore]) -> list[tuple[int, str]]:
    return [(core.rank, str(r.error))
            for core in cores for r in core.transcript.protocol_errors()]
