"""Driver protocol version 2: `init` negotiates the version and hands the model's facts,
`generate` carries the client's sampling (docs/driver-protocol.md, Compatibility).

A version-1 program keeps working and gets UNSUPPORTED, never ERROR, where a case needs
what only version 2 tells it; a version-2 program's fields reach the engines' ADD.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from harness.artefacts.vllm_dist import tiny_model_dir
from harness.cases.context import CaseContext, run_case
from harness.cases.declaration import CaseSpec, module_cases
from harness.cases.helpers import prompt
from harness.frontends.api import GREEDY, Capability, Sampling
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.frontends.subprocess.protocol import (
    PROTOCOL,
    VERSION,
    DriverProtocolError,
    answered_version,
    model_facts,
)
from harness.frontends.table import REFERENCE_SUBPROCESS
from harness.protocol.vocab import EOS_TOKEN_ID, SPECIAL, detokenize
from harness.protocol.wire import messages as m
from harness.results.records import Level, Verdict
from tests.test_drivers import SPEC, smoke
from tests.timescale import RUN_CONFIG

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PORT = [sys.executable, str(ROOT / "fixtures" / "example_port" / "driver.py")]
GREEDY_SPEC = CaseSpec("streaming.add_fields.greedy_eos_1_engines", Level.MUST, "greedy",
                       "tests", needs=[Capability.GENERATE, Capability.SAMPLING])
GENERATE_SPEC = CaseSpec("streaming.compat.sampling", Level.MUST, "sampling", "tests",
                         needs=[Capability.GENERATE])


def the_case(case_id: str) -> Any:
    """A conformance case's function, by id (the suite's own, unchanged)."""
    from harness.cases.index import case_specs

    spec, path = case_specs()[case_id]
    module = __import__(path[:-3].replace("/", "."), fromlist=["_"])
    return next(d.run for d in module_cases(vars(module)) if d.spec is spec), spec


def run(spec: CaseSpec, fn: Any, driver: SubprocessDriver) -> Any:
    return asyncio.run(run_case(spec, fn, driver, config=RUN_CONFIG))


def v1_program() -> SubprocessDriver:
    """The reference program as a strict first-release program: no `version` in its init
    reply, and a version-2 field sent to it anyway fails the command."""
    return SubprocessDriver(REFERENCE_SUBPROCESS, name="program-v1",
                            env={"COREWIRE_DRIVER_FAULT": "protocol_v1"})


# ------------------------------------------------------------------ the facts


def test_model_facts_are_the_tiny_models() -> None:
    facts = model_facts()
    config = json.loads((tiny_model_dir() / "config.json").read_text())
    assert facts["path"] == str(tiny_model_dir())
    assert facts["eos_token_id"] == EOS_TOKEN_ID == config["eos_token_id"]
    assert facts["bos_token_id"] == config["bos_token_id"]
    assert facts["vocab_size"] == config["vocab_size"]
    assert facts["max_model_len"] == config["max_position_embeddings"]
    assert facts["special_token_ids"] == sorted(SPECIAL)
    tokens = [0, 1, 2, 3, 100, 999]
    by_rule = "".join(facts["token_text"].replace("{id}", str(t)) for t in tokens
                      if t not in facts["special_token_ids"])
    assert by_rule == detokenize(tokens) == " t3 t100 t999"
    facts["eos_token_id"] = 99  # each call is a fresh copy
    assert model_facts()["eos_token_id"] == EOS_TOKEN_ID


def test_sampling_round_trips_and_refuses_what_it_cannot_carry() -> None:
    asked = Sampling(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=3, ignore_eos=True,
                     min_tokens=2, stop_token_ids=(9, 11))
    assert Sampling.from_json(json.loads(json.dumps(asked.to_json()))) == asked
    assert Sampling.from_json({}) == GREEDY
    assert Sampling.from_json({"temperature": 0}) == GREEDY  # an integral JSON number
    for bad in ({"temperature": True}, {"top_k": 1.5}, {"seed": "1"}, {"ignore_eos": 1},
                {"stop_token_ids": [1, "2"]}, {"beam_width": 4}):
        with pytest.raises(ValueError):
            Sampling.from_json(bad)


def test_the_schema_names_what_the_harness_sends() -> None:
    defs = json.loads((ROOT / "docs" / "driver-protocol.schema.json").read_text())["$defs"]
    assert set(defs["sampling"]["required"]) == set(GREEDY.to_json())
    assert set(defs["model"]["properties"]) == set(model_facts())
    declared = set(defs["reply"]["properties"]["capabilities"]["items"]["enum"])
    assert declared == {c.value for c in Capability} - {"sampling"}  # version 2's, implied


@pytest.mark.parametrize(("reply", "version"), [({}, 1), ({"version": 1}, 1),
                                                ({"version": 2}, 2)])
def test_the_answered_version(reply: dict[str, Any], version: int) -> None:
    assert answered_version(reply) == version


@pytest.mark.parametrize("bad", [3, 0, "2", True, 2.0, None])
def test_an_answered_version_out_of_range_breaks_the_protocol(bad: Any) -> None:
    with pytest.raises(DriverProtocolError, match="version"):
        answered_version({"version": bad})


def test_the_reference_program_negotiates_the_version() -> None:
    """Raw exchange: offered 2, it answers 2; offered nothing (a first-release harness), it
    answers 1."""
    def init_reply(**offer: Any) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            lines = [{"id": 1, "cmd": "init", "protocol": PROTOCOL, "workdir": tmp,
                      "engines": [{"rank": 0}], "dp_size": 1, "stats_address": None,
                      "timescale": 1.0, **offer}, {"id": 2, "cmd": "shutdown"}]
            proc = subprocess.run(REFERENCE_SUBPROCESS, capture_output=True, text=True,
                                  timeout=60, input="".join(json.dumps(m) + "\n"
                                                            for m in lines))
        reply: dict[str, Any] = json.loads(proc.stdout.splitlines()[0])
        return reply

    assert init_reply(version=VERSION, model=model_facts())["version"] == 2
    assert init_reply()["version"] == 1


# ------------------------------------------------------------------ version 1


def test_a_version_1_program_keeps_working() -> None:
    """Smoke passes (no v2 field reaches it: the strict program would fail the command)."""
    result = run(SPEC, smoke, v1_program())
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)


def test_a_version_1_program_is_unsupported_where_a_case_needs_version_2() -> None:
    fn, spec = the_case("streaming.add_fields.greedy_eos_1_engines")
    result = run(spec, fn, v1_program())
    assert result.verdict is Verdict.UNSUPPORTED, result.message
    assert "lacks sampling" in result.message


def test_a_version_1_program_refuses_sampling_instead_of_dropping_it() -> None:
    async def hot(ctx: CaseContext) -> None:
        await ctx.start(1)
        assert isinstance(ctx.driver, SubprocessDriver) and ctx.driver.version == 1
        assert Capability.SAMPLING not in ctx.driver.capabilities
        greedy = await ctx.driver.generate(prompt(1), 2, sampling=GREEDY)  # what it does
        await greedy.wait(ctx.t(5))
        await ctx.driver.generate(prompt(2), 2, sampling=Sampling(temperature=0.8))

    result = run(GENERATE_SPEC, hot, v1_program())
    assert result.verdict is Verdict.UNSUPPORTED, result.message
    assert "version-1 driver program" in result.message


@pytest.mark.parametrize("answer", ["3", '"2"', "true"])
def test_a_version_the_harness_never_offered_is_an_error(answer: str) -> None:
    driver = SubprocessDriver(REFERENCE_SUBPROCESS, name=f"version-{answer}",
                              env={"COREWIRE_DRIVER_FAULT": f"version:{answer}"})
    result = run(SPEC, smoke, driver)
    assert result.verdict is Verdict.ERROR, result.message
    assert "`version` must be an integer from 1 to 2" in result.message


# ------------------------------------------------------------------ version 2


def test_the_reference_program_speaks_version_2() -> None:
    fn, spec = the_case("streaming.add_fields.greedy_eos_2_engines")
    result = run(spec, fn, SubprocessDriver(REFERENCE_SUBPROCESS))
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)


def test_the_reference_program_carries_non_greedy_sampling() -> None:
    """The reference frontend builds SamplingParams from the client's sampling (as vLLM's
    frontends do): a non-greedy `sampling` reaches the program and its ADD, value for value."""
    seen: list[m.SamplingParams | None] = []

    async def hot(ctx: CaseContext) -> None:
        group = await ctx.start(1)
        assert isinstance(ctx.driver, SubprocessDriver) and ctx.driver.version == 2
        handle = await ctx.driver.generate(prompt(1), 2, sampling=Sampling(temperature=0.5,
                                                                           top_k=3))
        await handle.wait(ctx.t(5))
        seen.extend(a.sampling_params for a in group.transcript.adds())

    result = run(GENERATE_SPEC, hot, SubprocessDriver(REFERENCE_SUBPROCESS))
    assert result.verdict is Verdict.PASS, result.message
    assert [(sp.temperature, sp.top_k) if sp else None for sp in seen] == [(0.5, 3)]


def test_the_reference_program_refuses_a_model_it_does_not_serve() -> None:
    driver = SubprocessDriver(REFERENCE_SUBPROCESS, model={**model_facts(), "eos_token_id": 7})
    result = run(SPEC, smoke, driver)
    assert result.verdict is not Verdict.PASS
    assert "eos_token_id=7" in result.message, result.message


def test_version_2_fields_reach_the_add() -> None:
    """The example port builds its ADD from what version 2 tells it: the model's EOS id
    (here not the tiny model's 2, so nothing is hard-coded) and the client's sampling."""
    asked = Sampling(temperature=0.5, top_p=0.9, top_k=5, min_p=0.05, seed=42, min_tokens=1,
                     stop_token_ids=(9,))
    seen: dict[str, Any] = {}

    async def add_fields(ctx: CaseContext) -> None:
        group = await ctx.start(1)
        handles = [await ctx.driver.generate(prompt(1), 3, sampling=asked),
                   await ctx.driver.generate(prompt(2), 4),
                   await ctx.driver.generate(prompt(3), 2, sampling=Sampling(ignore_eos=True))]
        for handle in handles:
            await handle.wait(ctx.t(5))
        adds = {tuple(a.prompt_token_ids or ()): a.sampling_params
                for a in group.transcript.adds()}
        seen.update({name: adds.get(tuple(prompt(i))) for i, name in
                     ((1, "asked"), (2, "default"), (3, "ignore_eos"))})

    driver = SubprocessDriver(EXAMPLE_PORT, name="example-port",
                              model={**model_facts(), "eos_token_id": 7})
    result = run(GENERATE_SPEC, add_fields, driver)
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)
    sp = seen["asked"]
    assert sp is not None
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed, sp.min_tokens,
            sp.max_tokens) == (0.5, 0.9, 5, 0.05, 42, 1, 3)
    assert (sp.stop_token_ids, sp._eos_token_id, sp._all_stop_token_ids) == ([9], 7, {7, 9})
    sp = seen["default"]  # generate() without sampling: GREEDY, every field explicit
    assert sp is not None
    assert (sp.temperature, sp.top_k, sp.ignore_eos, sp._eos_token_id, sp.max_tokens) == \
        (0.0, 0, False, 7, 4)
    sp = seen["ignore_eos"]
    assert sp is not None and sp.ignore_eos and sp._eos_token_id is None


