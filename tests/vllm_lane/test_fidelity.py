"""Differential fidelity: the same scenario against mock engines and vLLM's real engine core.

One scenario (stream a request, four utilities -- one unknown --, abort a live request,
serve another), run through our reference frontend against (a) an unscripted mock engine and
(b) the vLLM-core engine (vLLM 0.33.0's EngineCoreProc, cpu-stub) with stats logging on
(`vllm serve`'s default) and off (`--disable-log-stats`). Each transcript is reduced to
*facets* -- small, named, JSON-rendered observations: ready-response keys and value types,
utility reply shapes and values, per-output fields, scheduler-stats presence,
weight_version, engine_index, finished_requests, abort handling -- and the facets are
compared one by one.

Every difference must be listed in docs/fidelity.md (between the fidelity-differences
markers) with both values and the reason; the test asserts that the observed differences
equal that list exactly, so new drift -- in vLLM or in the mocks -- fails here, and so does
a fixed difference that is still documented.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness.cases.helpers import trickle
from harness.frontends.api import FrontendError
from harness.frontends.reference import ReferenceDriver
from harness.protocol.wire import DEFAULT_CODEC, AbortRequests
from harness.protocol.wire import messages as m
from harness.vllm_engine import (
    RecordingProxy,
    VllmCoreError,
    VllmCoreGroup,
    shutdown_servers,
)
from harness.vllm_engine.engine_server import SERVER_START_TIMEOUT, engine_server
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, by_prompt
from mock_engines.transcript import Record
from tests.timescale import TIMESCALE, scaled

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(SERVER_START_TIMEOUT + 60)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
STEP = 0.01  # the real engine's fake forward pass; the mock's trickle interval
START_TIMEOUT = scaled(30.0)
ABORT_GRACE = 0.1  # outputs already on the wire when an ABORT lands: at most a few steps
QUIET = 0.3  # how long "nothing more arrives" is watched
PROMPT_A = [5, 6, 7]  # streamed to completion
PROMPT_B = [5, 6, 7, 8]  # aborted mid-stream
PROMPT_C = [9, 10, 11]  # after the abort: the engine keeps serving
UTILITIES = ("is_sleeping", "reset_prefix_cache", "get_supported_tasks")
UNKNOWN_UTILITY = "no_such_method"  # how an engine fails a utility call
# Ready-response values that are protocol or shared-config facts (compared by value); the
# rest (num_gpu_blocks, max_num_seqs, kv_cache_*, instance_id) depend on the deployment and
# are compared by type and by their invariants only.
READY_VALUES = ("max_model_len", "block_size", "dtype", "vllm_version", "world_size",
                "data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size",
                "decode_context_parallel_size", "data_parallel_rank", "dp_stats_address",
                "max_num_batched_tokens", "supports_lora", "max_loras", "mamba_block_size",
                "kv_events_config", "weight_transfer_backend", "enable_sleep_mode",
                "supports_draft_weight_updates", "effective_attention_block_size",
                "coord_store_port", "coordinator_input_address", "coordinator_output_address")
# EngineCoreOutput fields that every output carries, so "which fields are set" skips them.
ALWAYS_SET = ("request_id", "new_token_ids", "num_nans_in_logits")
VARIANTS = ("stats-on", "stats-off")


@pytest.fixture(scope="module", autouse=True)
def cpu_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """Import vLLM once, in the engine server (shared with other modules of the session)."""
    request.session.addfinalizer(shutdown_servers)  # before the session's leak check
    try:
        engine_server("cpu-stub").wait_ready(SERVER_START_TIMEOUT)
    except VllmCoreError as exc:
        if "ImportError" in str(exc) or "ModuleNotFoundError" in str(exc):
            pytest.skip(f"vllm is installed but not importable in the engine server: {exc}")
        raise
    yield


# ------------------------------------------------------------------------ scenario


@dataclass
class Run:
    """What one scenario run left behind: the transcript and the client's view."""

    records: list[Record] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)
    tokens_after_abort: int = 0
    after_abort_tokens: list[int] = field(default_factory=list)


async def scenario(driver: ReferenceDriver, group: Any) -> Run:
    """Stream A, three utilities, abort B mid-stream, then serve C; all bounded."""
    run = Run()
    a = await driver.generate(PROMPT_A, 4)
    await a.wait(10)
    assert a.tokens, "request A produced nothing"
    await driver.is_sleeping()
    await driver.reset_prefix_cache()
    assert driver.frontend is not None
    await driver.frontend.call_all("get_supported_tasks", [])
    with contextlib.suppress(FrontendError):
        await driver.frontend.call_all(UNKNOWN_UTILITY, [])
    b = await driver.generate(PROMPT_B, 10_000)
    await b.wait_first(5)
    deadline = time.monotonic() + 5
    while len(b.tokens) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert b.request_id is not None and a.request_id is not None
    await driver.abort([b.request_id])
    at_abort = len(b.tokens)
    await asyncio.sleep(QUIET)
    run.tokens_after_abort = len(b.tokens) - at_abort
    c = await driver.generate(PROMPT_C, 2)
    await c.wait(10)
    run.after_abort_tokens = list(c.tokens)
    await asyncio.sleep(QUIET)  # whatever an engine sends once idle
    assert c.request_id is not None
    run.ids = {"A": a.request_id, "B": b.request_id, "C": c.request_id}
    run.records = group.transcript.snapshot()
    return run


def run_scenario(group: Any) -> Run:
    async def main() -> Run:
        driver = ReferenceDriver().with_timescale(TIMESCALE)
        try:
            await driver.start(group, START_TIMEOUT)
            return await asyncio.wait_for(scenario(driver, group), 40)
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)

    result = asyncio.run(main())
    assert group.failures() == []
    return result


# ------------------------------------------------------------------------ facets


def render(value: Any) -> str:
    """The canonical text of a facet value (what docs/fidelity.md quotes)."""
    return json.dumps(value, sort_keys=True)


def skeleton(value: Any) -> Any:
    """A raw msgpack value with every scalar replaced by its type name (shape only)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [skeleton(v) for v in value]
    if isinstance(value, dict):
        return {str(k): skeleton(v) for k, v in value.items()}
    return type(value).__name__


def distinct(values: Iterable[Any]) -> list[Any]:
    """Distinct values (lists and None included), in their rendered order."""
    unique = {render(v): v for v in values}
    return [unique[k] for k in sorted(unique)]


def set_fields(output: m.EngineCoreOutput) -> list[str]:
    """Fields of one output that differ from their defaults (besides the always-set ones)."""
    return sorted(f for f in output.__struct_fields__ if f not in ALWAYS_SET
                  and getattr(output, f) != _DEFAULT_OUTPUT_FIELDS[f])


_DEFAULT_OUTPUT_FIELDS = {f: getattr(m.EngineCoreOutput("", []), f)
                          for f in m.EngineCoreOutput.__struct_fields__}


def facets(run: Run) -> dict[str, str]:
    """Reduce one run to named observations (sans-IO: transcript records in, text out)."""
    out: dict[str, Any] = {}
    records = run.records
    ready = [r for r in records if r.channel == "ready"]
    outputs = [r for r in records if r.direction == "out" and r.channel == "output"
               and isinstance(r.message, m.EngineCoreOutputs)]

    # --- ready response
    assert len(ready) == 1 and ready[0].error is None
    raw_ready = msgspec.msgpack.decode(ready[0].frames[0])
    out["ready.keys"] = sorted(raw_ready)
    out["ready.types"] = {k: type(v).__name__ for k, v in raw_ready.items()}
    out["ready.values"] = {k: raw_ready.get(k) for k in READY_VALUES}
    out["ready.kv_cache_size_tokens == num_gpu_blocks * block_size"] = (
        raw_ready["kv_cache_size_tokens"] == raw_ready["num_gpu_blocks"]
        * raw_ready["block_size"])
    out["ready.kv_cache_max_concurrency == kv_cache_size_tokens / max_model_len"] = (
        math.isclose(raw_ready["kv_cache_max_concurrency"],
                     raw_ready["kv_cache_size_tokens"] / raw_ready["max_model_len"],
                     rel_tol=0.01))

    # --- utilities: what was asked, the raw reply's shape, the value
    calls = {r.message.call_id: r.message.method for r in records
             if r.direction == "in" and isinstance(r.message, m.UtilityRequest)}
    replies = [r for r in outputs if r.message.utility_output is not None]
    assert sorted(calls.values()) == sorted((*UTILITIES, UNKNOWN_UTILITY))
    for record in replies:
        reply = record.message.utility_output
        method = calls[reply.call_id]
        out[f"utility.{method}.raw_shape"] = skeleton(msgspec.msgpack.decode(record.frames[0]))
        if method == UNKNOWN_UTILITY:  # the detail after the prefix is free text
            failure = reply.failure_message or ""
            out[f"utility.{method}.failure_prefix"] = failure.split(":", 1)[0]
        else:
            out[f"utility.{method}.value"] = None if reply.result is None else reply.result.value

    # --- request A: streamed to completion
    a_outputs = [(r, o) for r in outputs for o in r.message.outputs
                 if o.request_id == run.ids["A"]]
    first = a_outputs[0][1]
    out["stream.tokens_per_message"] = [o.new_token_ids for _, o in a_outputs]
    final = a_outputs[-1][1]
    out["stream.finish"] = [None if final.finish_reason is None else final.finish_reason.name,
                            final.stop_reason]
    out["stream.first_output.fields"] = set_fields(first)
    out["stream.first_output.events"] = [int(e.type) for e in first.events or []]
    out["stream.first_output.prefill_stats"] = first.prefill_stats
    out["stream.later_outputs.fields"] = sorted({f for _, o in a_outputs[1:]
                                                 for f in set_fields(o)})
    raw_first = msgspec.msgpack.decode(a_outputs[0][0].frames[0])
    out["stream.raw_lengths"] = [len(raw_first), len(raw_first[1][0])]

    # --- message-level fields
    step = [r for r in outputs if r.message.outputs]
    utility = [r for r in outputs if r.message.utility_output is not None]
    stats_only = [r for r in outputs if not r.message.outputs
                  and r.message.utility_output is None and not r.message.finished_requests]
    out["messages.engine_index"] = sorted({r.message.engine_index for r in outputs})
    out["messages.finished_requests"] = distinct(r.message.finished_requests for r in outputs)
    out["messages.scheduler_stats.on_step_outputs"] = any(
        r.message.scheduler_stats is not None for r in step)
    out["messages.scheduler_stats.on_utility_replies"] = any(
        r.message.scheduler_stats is not None for r in utility)
    stats = [r.message.scheduler_stats for r in outputs if r.message.scheduler_stats]
    out["messages.scheduler_stats.keys"] = skeleton(stats[0]) if stats else None
    out["messages.stats_only"] = bool(stats_only)
    out["messages.weight_version.step_outputs"] = distinct(r.message.weight_version
                                                           for r in step)
    out["messages.weight_version.utility_replies"] = distinct(r.message.weight_version
                                                              for r in utility)
    out["messages.weight_version.stats_only"] = distinct(r.message.weight_version
                                                         for r in stats_only)
    out["messages.one_output_per_request_per_message"] = all(
        len({o.request_id for o in r.message.outputs}) == len(r.message.outputs)
        for r in step)

    # --- request B: aborted by the client mid-stream
    (abort,) = [r for r in records if r.direction == "in"
                and isinstance(r.message, AbortRequests)]
    b_outputs = [(r, o) for r in outputs for o in r.message.outputs
                 if o.request_id == run.ids["B"]]
    out["abort.ids_sent"] = abort.message.request_ids == [run.ids["B"]]
    out["abort.outputs_after_grace"] = sum(1 for r, _ in b_outputs
                                           if r.t > abort.t + ABORT_GRACE)
    out["abort.final_output_sent"] = any(o.finish_reason is not None for _, o in b_outputs)
    out["abort.client_tokens_after_abort"] = run.tokens_after_abort
    out["abort.engine_serves_next_request"] = run.after_abort_tokens
    return {name: render(value) for name, value in out.items()}


def differences(mock: dict[str, str], real: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Facets whose rendered values differ (a facet one side lacks counts as a difference)."""
    return {name: (mock.get(name, "<absent>"), real.get(name, "<absent>"))
            for name in sorted(set(mock) | set(real)) if mock.get(name) != real.get(name)}


_ROW = re.compile(r"^\|\s*(?P<variant>[\w-]+)\s*\|\s*`(?P<facet>[^`]+)`\s*\|\s*`(?P<mock>[^`]*)`"
                  r"\s*\|\s*`(?P<real>[^`]*)`\s*\|")


def documented(variant: str) -> dict[str, tuple[str, str]]:
    """The differences docs/fidelity.md lists for `variant` (rows for it or for "both")."""
    text = DOC.read_text()
    begin, end = "<!-- fidelity-differences:begin -->", "<!-- fidelity-differences:end -->"
    assert begin in text and end in text, f"{DOC} lacks the fidelity-differences markers"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    out: dict[str, tuple[str, str]] = {}
    for line in table.splitlines():
        match = _ROW.match(line.strip())
        if match and match["variant"] in (variant, "both"):
            assert match["facet"] not in out, f"{match['facet']} documented twice"
            out[match["facet"]] = (match["mock"], match["real"])
    return out


# ------------------------------------------------------------------------ tests


# Mock knobs that emulate a real-engine setting, used as soon as EngineScript has them (see
# docs/fidelity.md: the recommended `log_stats` knob), so that fixing a mock difference
# shows up here as a documented difference that is no longer observed.
_MOCK_KNOBS = {"stats-on": {"log_stats": True}, "stats-off": {"log_stats": False}}
_MOCK_FACETS: dict[str, dict[str, str]] = {}


def mock_facets_for(variant: str) -> dict[str, str]:
    """The mock's facets for `variant` (one run per distinct mock configuration)."""
    knobs = {k: v for k, v in _MOCK_KNOBS[variant].items()
             if k in EngineScript.__dataclass_fields__}
    key = render(knobs)
    if key not in _MOCK_FACETS:
        script = EngineScript(rules=[by_prompt(PROMPT_B, trickle(STEP))], **knobs)
        _MOCK_FACETS[key] = facets(run_scenario(EngineGroup([script], codec=DEFAULT_CODEC)))
    return _MOCK_FACETS[key]


@pytest.fixture(scope="module")
def mock_facets() -> dict[str, str]:
    return mock_facets_for("stats-off")


def _explain(diff: dict[str, tuple[str, str]], doc: dict[str, tuple[str, str]]) -> str:
    lines = []
    for name in sorted(set(diff) | set(doc)):
        if diff.get(name) == doc.get(name):
            continue
        if name not in doc:
            lines.append(f"NEW difference  {name}: mock {diff[name][0]}  real {diff[name][1]}")
        elif name not in diff:
            lines.append(f"documented but not observed (fixed?)  {name}: {doc[name]}")
        else:
            lines.append(f"CHANGED  {name}: documented {doc[name]}, observed {diff[name]}")
    return "\n".join(lines)


@pytest.mark.parametrize("variant", VARIANTS)
def test_mock_matches_real_engine_or_difference_is_documented(variant: str) -> None:
    mock = mock_facets_for(variant)
    group = VllmCoreGroup(step_delay_s=STEP, log_stats=variant == "stats-on", codec=DEFAULT_CODEC)
    real = facets(run_scenario(group))
    # The scenario itself must have worked on the real engine, or the comparison is moot.
    assert real["abort.engine_serves_next_request"] == "[100, 101]"
    assert real["stream.tokens_per_message"] == "[[100], [101], [102], [103]]"
    diff = differences(mock, real)
    doc = documented(variant)
    assert diff == doc, ("mock/real differences do not match docs/fidelity.md "
                         f"({variant}):\n{_explain(diff, doc)}")


def test_facets_are_what_a_frontend_can_rely_on(mock_facets: dict[str, str]) -> None:
    """The invariants both sides must show, whatever else differs (sanity of the probe)."""
    for name, want in [("abort.outputs_after_grace", "0"), ("abort.final_output_sent", "false"),
                       ("abort.client_tokens_after_abort", "0"), ("abort.ids_sent", "true"),
                       ("messages.engine_index", "[0]"),
                       ("utility.is_sleeping.value", "false"),
                       ("utility.reset_prefix_cache.value", "true"),
                       ("utility.get_supported_tasks.value", '["generate"]'),
                       (f"utility.{UNKNOWN_UTILITY}.failure_prefix",
                        f'"Call to {UNKNOWN_UTILITY} method failed"')]:
        assert mock_facets[name] == want, name


class ProxiedMockGroup:
    """A mock engine behind the recording proxy: the proxy's own fidelity, checkable."""

    handshake = False  # what drivers read of any engine group: bootstrapped, DP=1
    coordinated = False
    stats_address = None

    def __init__(self, script: EngineScript) -> None:
        self.mock = EngineGroup([script], codec=DEFAULT_CODEC)
        self.proxy = RecordingProxy([0], codec=DEFAULT_CODEC)
        self.engines = self.mock.engines
        self.transcript = self.proxy.transcript

    def start_bootstrapped(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        engine_inputs, engine_outputs = self.proxy.start_bootstrapped(inputs, outputs)
        self.mock.start_bootstrapped(engine_inputs, engine_outputs)

    def failures(self) -> list[tuple[int, BaseException]]:
        proxy = [(0, self.proxy.failure)] if self.proxy.failure is not None else []
        return [*self.mock.failures(), *proxy]

    def stop(self, timeout: float = 5.0) -> None:
        self.mock.stop(timeout)
        self.proxy.stop(timeout)


def test_the_proxy_is_transparent(mock_facets: dict[str, str]) -> None:
    """Differences above are the engine's, not the proxy's: behind the proxy, a mock engine
    produces the same facets, and the proxy records exactly the frames the mock did."""
    group = ProxiedMockGroup(EngineScript(rules=[by_prompt(PROMPT_B, trickle(STEP))]))
    proxied = run_scenario(group)
    assert differences(mock_facets, facets(proxied)) == {}
    own = group.mock.transcript.snapshot()
    for direction, channels in (("in", ("input",)), ("out", ("ready", "output"))):
        seen_by_mock = [r.frames for r in own
                        if r.direction == direction and r.channel in channels]
        seen_by_proxy = [r.frames for r in proxied.records
                         if r.direction == direction and r.channel in channels]
        assert seen_by_proxy == seen_by_mock, direction
    assert [r for r in proxied.records if r.error is not None or r.channel == "fault"] == []


def test_doc_rows_parse() -> None:
    rows: Sequence[dict[str, tuple[str, str]]] = [documented(v) for v in VARIANTS]
    assert all(isinstance(r, dict) for r in rows)
