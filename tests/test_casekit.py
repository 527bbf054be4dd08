"""casekit lookups: `request_for` answers from the transcript's prompt index.

Cases poll `request_for` every few ms while streams run (1,100 at once in the burst
cases); it used to snapshot and sort the whole merged transcript once per engine per
call, so polling cost grew with the square of the streams. The checks here count
snapshots (a complexity check, never a timing) and compare the indexed answer with a
full scan of the transcript.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.cases.helpers import prompt, request_for, requests_for, same_value
from harness.protocol.wire import DEFAULT_CODEC, AddRequest
from harness.protocol.wire import messages as m
from mock_engines.transcript import MergedTranscript, Record, Transcript

STREAMS = 400
ENGINES = 3


@dataclass
class _Engine:
    rank: int
    transcript: Transcript


@dataclass
class _Group:
    """The two attributes request_for reads of an EngineGroup."""

    engines: list[_Engine]
    transcript: MergedTranscript


def _add(transcript: Transcript, rank: int, rid: str, prompt_ids: list[int],
         t: float) -> None:
    params = m.SamplingParams(temperature=0.0, max_tokens=1)
    request = m.EngineCoreRequest(rid, prompt_ids, None, params, None, 1.0, None, None, None)
    frames = tuple(DEFAULT_CODEC.encode_add(request))
    transcript.append(Record(t, rank, "in", "input", frames, AddRequest(request)))


def _group() -> _Group:
    """Engines listed 2, 0, 1; stream i went to engine i % ENGINES; prompt 0 also reached
    engine 0 a second time, and the last engine listed once more, later."""
    engines = [_Engine(rank, Transcript(codec=DEFAULT_CODEC)) for rank in (2, 0, 1)]
    by_rank = {e.rank: e for e in engines}
    for i in range(STREAMS):
        _add(by_rank[i % ENGINES].transcript, i % ENGINES, f"r{i}", prompt(i), float(i))
    _add(by_rank[0].transcript, 0, "again-0", prompt(0), float(STREAMS))
    _add(by_rank[1].transcript, 1, "late-1", prompt(0), float(STREAMS + 1))
    return _Group(engines, MergedTranscript([e.transcript for e in engines]))


def _scan(group: _Group, prompt_ids: list[int]) -> tuple[int, str] | None:
    """The old definition, by a full scan: engines in listed order, ADDs in time order."""
    for engine in group.engines:
        for req in group.transcript.adds(engine.rank):
            if req.prompt_token_ids == prompt_ids:
                return engine.rank, req.request_id
    return None


def test_request_for_agrees_with_a_full_scan() -> None:
    group = _group()
    for i in [*range(STREAMS), STREAMS + 5]:
        assert request_for(group, prompt(i)) == _scan(group, prompt(i))  # type: ignore[arg-type]
    # Engine 2 is listed first, but prompt 0 reached engines 0 and 1 only.
    assert request_for(group, prompt(0)) == (0, "r0")  # type: ignore[arg-type]
    assert request_for(group, [11]) is None  # type: ignore[arg-type]


def test_polling_request_for_never_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling every stream's lookup costs no transcript copy at all, however long the
    transcript: the count of snapshot calls stays 0 (the full scan took a merged snapshot,
    and one of every part under it, for each engine listed)."""
    group = _group()
    snapshots = 0
    plain, merged = Transcript.snapshot, MergedTranscript.snapshot

    def counted_plain(self: Transcript) -> list[Record]:
        nonlocal snapshots
        snapshots += 1
        return plain(self)

    def counted_merged(self: MergedTranscript) -> list[Record]:
        nonlocal snapshots
        snapshots += 1
        return merged(self)

    monkeypatch.setattr(Transcript, "snapshot", counted_plain)
    monkeypatch.setattr(MergedTranscript, "snapshot", counted_merged)
    for _ in range(5):  # five polling rounds over every stream
        found = requests_for(group, [prompt(i) for i in range(STREAMS)])  # type: ignore[arg-type]
        assert found is not None and len(found) == STREAMS
    assert snapshots == 0
    _scan(group, prompt(1))
    assert snapshots > 0  # the counter does see a scan


def test_prompt_index_skips_non_adds_and_missing_prompts() -> None:
    transcript = Transcript(codec=DEFAULT_CODEC)
    params = m.SamplingParams(temperature=0.0, max_tokens=1)
    embeds_only = m.EngineCoreRequest("e", None, None, params, None, 1.0, None, None, None)
    transcript.append(Record(0.0, 0, "in", "input", (), AddRequest(embeds_only)))
    transcript.append(Record(1.0, 0, "out", "input", (), AddRequest(embeds_only)))
    _add(transcript, 0, "x", [1, 2], 2.0)
    assert transcript.adds_with_prompt([1, 2]) == [(0, "x")]
    assert transcript.adds_with_prompt([]) == []


# ----------------------------------------------------------------- same_value

@pytest.mark.parametrize(("seen", "expected"), [
    (1, True), (True, 1), (1.0, 1), (1, 1.0), (0, False), ("1", 1), (None, []),
    ([1, 2], [1, 2, 3]), ([1, [2, 3]], [1, [2, 3.0]]), ({"a": 1}, {"a": 1, "b": None}),
    ({"a": [None]}, {"a": []}), ([{"k": 1}], [{"k": True}]),
])
def test_same_value_tells_types_and_shapes_apart(seen: object, expected: object) -> None:
    assert not same_value(seen, expected)


@pytest.mark.parametrize(("seen", "expected"), [
    (None, None), (True, True), (2**64 - 1, 2**64 - 1), (1.5, 1.5), ("ü", "ü"),
    ([], []), ((1, "a"), [1, "a"]), ({"a": [None, {"b": (1,)}]}, {"a": [None, {"b": [1]}]}),
])
def test_same_value_accepts_equal_values_tuples_as_lists(seen: object,
                                                         expected: object) -> None:
    assert same_value(seen, expected)
