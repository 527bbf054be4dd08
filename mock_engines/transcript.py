"""Wire transcripts: every frame in and out of a mock engine, decoded, timed and queryable.

A conformance verdict is only as convincing as its evidence, so the transcript keeps raw
bytes next to the decoded message and any ProtocolError, and serialises to JSON (decoded +
hex) for reports. Appends happen on engine threads; readers take snapshots.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.protocol.timing import poll_until
from harness.protocol.wire import (
    AbortRequests,
    AddRequest,
    ProtocolError,
    WireCodec,
    to_jsonable,
)
from harness.protocol.wire import messages as m

Direction = Literal["in", "out"]
Channel = Literal["input", "output", "ready", "handshake", "coordinator", "fault"]


@dataclass(frozen=True, slots=True)
class Record:
    """One message crossing the link (or a fault the harness injected)."""

    t: float  # time.monotonic()
    rank: int
    direction: Direction
    channel: Channel
    frames: tuple[bytes, ...]
    message: Any = None
    error: ProtocolError | None = None
    note: str = ""

    def to_json(self, t0: float = 0.0, hex_limit: int = 512) -> dict[str, Any]:
        out: dict[str, Any] = {
            "t": round(self.t - t0, 6),
            "rank": self.rank,
            "direction": self.direction,
            "channel": self.channel,
            "frames_hex": [f[:hex_limit].hex() + ("..." if len(f) > hex_limit else "")
                           for f in self.frames],
        }
        if self.message is not None:
            out["decoded"] = to_jsonable(self.message)
        if self.error is not None:
            out["error"] = {"kind": self.error.kind, "detail": self.error.detail}
        if self.note:
            out["note"] = self.note
        return out


# An engine output kept raw on the hot path: (t, rank, frames). Decoded on first read, so
# streaming never pays for building and retaining records (and their GC-tracked lists).
_RawOutput = tuple[float, int, tuple[bytes, ...]]


@dataclass
class TranscriptCounters:
    """What a transcript kept in counters mode (benchmarks): totals, no records."""

    records: int = 0
    outputs: int = 0
    adds: int = 0
    abort_frames: int = 0
    aborted_ids: int = 0
    utility_calls: int = 0
    protocol_errors: int = 0
    last_abort_t: float = 0.0


@dataclass
class Transcript:
    """Append-only record list with the queries conformance cases need.

    `retain=False` (benchmarks only) keeps `counters` instead of records: the queries then
    see an empty transcript, and a load of millions of messages costs no memory.
    """

    records: list[Record | _RawOutput] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Decodes the raw outputs on first read: the codec of the run's protocol profile.
    codec: WireCodec = field(kw_only=True, repr=False)
    retain: bool = True
    counters: TranscriptCounters = field(default_factory=TranscriptCounters)
    # prompt -> (rank, request id) of each ADD carrying it, in arrival order: cases look
    # requests up by prompt while streams run, and a lookup must not copy the transcript.
    _adds_by_prompt: dict[tuple[int, ...], list[tuple[int, str]]] = field(
        default_factory=dict, repr=False)

    def append(self, record: Record) -> None:
        if not self.retain:
            self._count(record)
            return
        with self._lock:
            self.records.append(record)
            if record.direction == "in" and isinstance(record.message, AddRequest):
                request = record.message.request
                if request.prompt_token_ids is not None:
                    self._adds_by_prompt.setdefault(tuple(request.prompt_token_ids), []
                                                    ).append((record.rank, request.request_id))

    def append_output(self, t: float, rank: int, frames: tuple[bytes, ...]) -> None:
        """Record an engine output message from its frames alone (the streaming hot path)."""
        if not self.retain:
            self.counters.outputs += 1
            return
        self.records.append((t, rank, frames))  # list.append is atomic under the GIL

    def _count(self, record: Record) -> None:
        c = self.counters
        c.records += 1
        message = record.message
        if record.error is not None:
            c.protocol_errors += 1
        elif isinstance(message, AddRequest):
            c.adds += 1
        elif isinstance(message, AbortRequests):
            c.abort_frames += 1
            c.aborted_ids += len(message.request_ids)
            c.last_abort_t = record.t
        elif isinstance(message, m.UtilityRequest):
            c.utility_calls += 1

    def snapshot(self) -> list[Record]:
        with self._lock:
            records = self.records
            for i, entry in enumerate(records):
                if type(entry) is tuple:
                    records[i] = _decoded_output(self.codec, *entry)
            return list(records)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        return len(self.records)

    # ------------------------------------------------------------------ queries

    def select(self, *, rank: int | None = None, direction: Direction | None = None,
               channel: Channel | None = None, kind: type | tuple[type, ...] | None = None,
               since: float | None = None) -> list[Record]:
        """Records matching every given filter, in time order."""
        return [r for r in self.snapshot()
                if (rank is None or r.rank == rank)
                and (direction is None or r.direction == direction)
                and (channel is None or r.channel == channel)
                and (kind is None or isinstance(r.message, kind))
                and (since is None or r.t >= since)]

    def adds(self, rank: int | None = None) -> list[m.EngineCoreRequest]:
        return [r.message.request for r in self.select(rank=rank, direction="in",
                                                          kind=AddRequest)]

    def adds_with_prompt(self, prompt: Sequence[int]) -> list[tuple[int, str]]:
        """(rank, request id) of every ADD whose prompt is exactly `prompt`, in arrival
        order: an index lookup, no snapshot (cases poll this while streams run)."""
        with self._lock:
            return list(self._adds_by_prompt.get(tuple(prompt), ()))

    def abort_frames(self, rank: int | None = None, since: float | None = None
                     ) -> list[Record]:
        return self.select(rank=rank, direction="in", kind=AbortRequests, since=since)

    def aborted_ids(self, rank: int | None = None, since: float | None = None) -> list[str]:
        """Every id in every ABORT frame, duplicates kept (exactly-once checks need them)."""
        return [rid for r in self.abort_frames(rank, since) for rid in r.message.request_ids]

    def utility_calls(self, method: str | None = None, rank: int | None = None
                      ) -> list[Record]:
        return [r for r in self.select(rank=rank, direction="in", kind=m.UtilityRequest)
                if method is None or r.message.method == method]

    def protocol_errors(self, rank: int | None = None) -> list[Record]:
        return [r for r in self.select(rank=rank) if r.error is not None]

    def start_dp_waves(self, rank: int | None = None, since: float | None = None
                       ) -> list[m.StartDPWave]:
        """START_DP_WAVE publications the engines received from a frontend-owned
        coordinator (handshake mode), in arrival order."""
        return [r.message for r in self.select(rank=rank, direction="in",
                                               channel="coordinator", since=since)
                if isinstance(r.message, m.StartDPWave)]

    def owner_of(self, request_id: str) -> int | None:
        """The rank that received the ADD for `request_id` (first one), if any."""
        for r in self.select(direction="in", kind=AddRequest):
            if r.message.request.request_id == request_id:
                return r.rank
        return None

    # ------------------------------------------------------------------ waiting

    async def wait_for(self, predicate: Callable[[Transcript], bool], timeout: float,
                       interval: float = 0.005) -> bool:
        """Poll `predicate` until true or `timeout` seconds pass; returns the last result."""
        return await poll_until(lambda: predicate(self), timeout, interval)

    def to_json(self, records: Iterable[Record] | None = None) -> list[dict[str, Any]]:
        recs = self.snapshot() if records is None else list(records)
        t0 = recs[0].t if recs else 0.0
        return [r.to_json(t0) for r in recs]


def _decoded_output(codec: WireCodec, t: float, rank: int, frames: tuple[bytes, ...]
                    ) -> Record:
    try:
        return Record(t, rank, "out", "output", frames, codec.decode_outputs(frames))
    except ProtocolError as exc:
        return Record(t, rank, "out", "output", frames, None, exc)


class MergedTranscript(Transcript):
    """A read-only view over several engines' transcripts, merged by time."""

    def __init__(self, parts: list[Transcript]) -> None:
        super().__init__(codec=parts[0].codec)
        self._parts = parts

    def append(self, record: Record) -> None:
        raise TypeError("a merged transcript is read-only")

    def snapshot(self) -> list[Record]:
        merged = [r for part in self._parts for r in part.snapshot()]
        merged.sort(key=lambda r: r.t)
        return merged

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def adds_with_prompt(self, prompt: Sequence[int]) -> list[tuple[int, str]]:
        return [hit for part in self._parts for hit in part.adds_with_prompt(prompt)]
