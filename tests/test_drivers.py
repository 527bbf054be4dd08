"""Driver-level tests: the smoke scenario through the in-process and subprocess drivers,
and every way a foreign driver program can misbehave."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.cases.context import CaseContext, run_case
from harness.cases.declaration import CaseSpec
from harness.cases.helpers import hold, prompt, request_for
from harness.frontends.api import Capability, FrontendDriver
from harness.frontends.reference import ReferenceDriver
from harness.frontends.run_config import RunConfig
from harness.frontends.subprocess.driver import SubprocessDriver
from harness.frontends.table import REFERENCE_SUBPROCESS, make_driver
from harness.hygiene.leaks import leaks_since, snapshot
from harness.results.records import Level, Verdict
from mock_engines.script import EngineScript, UtilityReply, by_prompt
from tests.timescale import RUN_CONFIG

SPEC = CaseSpec("streaming.smoke.scenario", Level.MUST, "smoke", "tests")


async def smoke(ctx: CaseContext) -> None:
    """Register, stream to completion, is_sleeping, reset_prefix_cache, drop -> ABORT."""
    held = prompt(7)
    scripts = [EngineScript(rules=[by_prompt(held, hold())],
                            utilities={"reset_prefix_cache": UtilityReply(v)})
               for v in (True, False)]
    group = await ctx.start(scripts)
    handle = await ctx.driver.generate(prompt(1), 4)
    await handle.wait(ctx.t(5))
    ctx.require(handle.tokens == [100, 101, 102, 103] and handle.finish_reason == "length",
                expected="4 tokens then length", observed=(handle.tokens, handle.finish_reason))
    ctx.require(await ctx.driver.is_sleeping() is False, expected="false", observed="true")
    ctx.require(await ctx.driver.reset_prefix_cache() is False, expected="AND = false",
                observed="true")
    live = await ctx.driver.generate(held, 50)
    await live.wait_first(ctx.t(5))
    await ctx.driver.drop([live])
    found = request_for(group, held)
    assert found is not None
    ok = await ctx.wait_until(lambda: group.transcript.aborted_ids(found[0]) == [found[1]], 3)
    ctx.require(ok, expected=f"ABORT [{found[1]}] at engine {found[0]}",
                observed=group.transcript.aborted_ids())


@pytest.mark.parametrize("spec", ["reference", "reference-subprocess"])
def test_smoke_scenario(spec: str) -> None:
    result = asyncio.run(run_case(SPEC, smoke, make_driver(RunConfig(spec)), config=RUN_CONFIG))
    assert result.verdict is Verdict.PASS, (result.message, result.evidence.notes)


def _faulty(fault: str, timeout: float = 10.0) -> FrontendDriver:
    return SubprocessDriver(REFERENCE_SUBPROCESS, name=f"faulty:{fault}",
                            command_timeout=timeout, env={"COREWIRE_DRIVER_FAULT": fault})


@pytest.mark.parametrize(("fault", "verdict", "cause", "log"), [
    ("exit_at_start", Verdict.ERROR, "driver exited (code 4)", "injected exit at start"),
    ("crash_on:generate", Verdict.ERROR, "driver exited (code 3) with no reply to `generate` "
     "(id 3)", "injected crash on generate"),
    ("crash_on:is_sleeping", Verdict.ERROR, "driver exited (code 3) with no reply to "
     "`is_sleeping` (id 4)", "injected crash on is_sleeping"),
    ("hang_on:is_sleeping", Verdict.TIMEOUT, "driver: no reply to `is_sleeping` (id 4) within "
     "1.5 s", "injected hang on is_sleeping"),
    ("garbage_on:reset_prefix_cache", Verdict.ERROR,
     "driver broke the protocol: not JSON: b'\\x00\\xffnot json at all\\n'", ""),
    ("stray_text_on:generate", Verdict.ERROR,
     "driver broke the protocol: not JSON: b'some library printed this to stdout\\n'", ""),
    ("huge_line_on:generate", Verdict.ERROR, "a stdout line over 1 MiB", ""),
    # Mid-stream, the case sees its stream end in error: still the driver's fault (ERROR),
    # never graded as the frontend's behaviour (it used to be FAIL).
    ("stray_mid_stream", Verdict.ERROR,
     "driver broke the protocol: not JSON: b'INFO loaded 3 adapters\\n'",
     "injected stray stdout line mid-stream"),
    ("wrong_id_on:is_sleeping", Verdict.ERROR, "reply to unknown command id 1004", ""),
    # A bug inside a handler is the program's fault (ERROR), not a missing command: it used
    # to be caught with the AttributeError of an unknown command and graded UNSUPPORTED.
    ("bug_on:is_sleeping", Verdict.ERROR, "driver exited (code 70) with no reply to "
     "`is_sleeping` (id 4)", "internal error in `is_sleeping`"),
])
def test_misbehaving_driver_is_graded_and_reaped(fault: str, verdict: Verdict, cause: str,
                                                 log: str) -> None:
    before = snapshot()
    result = asyncio.run(run_case(SPEC, smoke, _faulty(fault, timeout=1.5), config=RUN_CONFIG))
    assert result.verdict is verdict, result.message
    assert cause in result.message, result.message
    assert log in "\n".join(result.evidence.notes), result.evidence.notes
    assert leaks_since(before) == []


def test_session_continues_after_a_driver_fault() -> None:
    bad = asyncio.run(run_case(SPEC, smoke, _faulty("crash_on:generate"), config=RUN_CONFIG))
    good = asyncio.run(run_case(SPEC, smoke, ReferenceDriver(), config=RUN_CONFIG))
    assert (bad.verdict, good.verdict) == (Verdict.ERROR, Verdict.PASS)


def test_driver_main_speaks_the_documented_protocol() -> None:
    """A raw exchange with the driver program, exactly as docs/driver-protocol.md shows."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            REFERENCE_SUBPROCESS, cwd=None, capture_output=True, text=True, timeout=30,
            input="\n".join(json.dumps(m) for m in [
                {"id": 1, "cmd": "init", "protocol": "corewire-driver/1", "workdir": tmp,
                 "engines": [{"rank": 0}], "dp_size": 1, "stats_address": None,
                 "timescale": 1.0},
                {"id": 2, "cmd": "frobnicate"},
                {"id": 3, "cmd": "shutdown"}]) + "\n")
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert replies[1]["ok"] and replies[1]["inputs"] and replies[1]["capabilities"]
    assert replies[2] == {"id": 2, "ok": False, "unsupported": True,
                          "error": "unknown command 'frobnicate'"}
    assert replies[3] == {"id": 3, "ok": True}
    assert proc.returncode == 0


UTILITY_SPEC = CaseSpec("utility.compat.collective_rpc", Level.MUST, "compat", "tests",
                        needs=[Capability.CALL_UTILITY])
ID_SPEC = CaseSpec("utility.compat.request_id", Level.MUST, "compat", "tests",
                   needs=[Capability.GENERATE])


async def call_rpc(ctx: CaseContext) -> None:
    await ctx.start([EngineScript(utilities={"collective_rpc": UtilityReply([r])})
                     for r in ("a", "b")])
    value = await ctx.driver.call_utility("collective_rpc", ["echo", None, [], {}])
    ctx.require(value == ["a", "b"], expected="['a', 'b']", observed=value)


async def chosen_id(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    await (await ctx.driver.generate(prompt(1), 2, request_id="cw-mine")).wait(ctx.t(5))
    ids = [r.request_id for r in group.transcript.adds()]
    ctx.require(ids == ["cw-mine"], expected="['cw-mine']", observed=ids)


@pytest.mark.parametrize(("fault", "fn", "spec", "verdict"), [
    ("", call_rpc, UTILITY_SPEC, Verdict.PASS),
    ("", chosen_id, ID_SPEC, Verdict.PASS),
    # A first-release program declares none of the later capabilities: UNSUPPORTED.
    ("old_protocol", call_rpc, UTILITY_SPEC, Verdict.UNSUPPORTED),
    # ... and request_id is refused, never sent to a program that would ignore it.
    ("old_protocol", chosen_id, ID_SPEC, Verdict.UNSUPPORTED),
    # A program that declares call_utility but answers "unknown command": UNSUPPORTED.
    ("plain_unknown:utility", call_rpc, UTILITY_SPEC, Verdict.UNSUPPORTED),
])
def test_new_operations_and_older_driver_programs(fault: str, fn: Any, spec: CaseSpec,
                                                  verdict: Verdict) -> None:
    driver = SubprocessDriver(REFERENCE_SUBPROCESS, name=f"compat:{fault or 'current'}",
                              env={"COREWIRE_DRIVER_FAULT": fault})
    result = asyncio.run(run_case(spec, fn, driver, config=RUN_CONFIG))
    assert result.verdict is verdict, (result.message, result.evidence.notes)


def test_children_left_by_a_driver_program_are_reaped() -> None:
    """A program that leaves a child in its process group: teardown ends the whole group and
    says so on the case (they used to leak, silently)."""
    import subprocess
    import uuid

    tag = f"corewire-grandchild-{uuid.uuid4().hex[:8]}"
    result = asyncio.run(run_case(SPEC, smoke, _faulty(f"grandchild:{tag}"), config=RUN_CONFIG))
    assert result.verdict is Verdict.PASS, result.message
    assert any("driver left 1 process(es) behind" in n for n in result.evidence.notes)
    alive = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert alive.strip() == "", f"grandchild still running: {alive}"


def test_a_grandchild_that_called_setsid_is_found_and_reaped() -> None:
    """A daemon that double-forked into its own session is outside the program's process
    group and, orphaned, outside its parent chain: teardown still finds it (by the
    program's environment token), ends it and says so."""
    import subprocess
    import uuid

    tag = f"corewire-daemon-{uuid.uuid4().hex[:8]}"
    before = snapshot()
    result = asyncio.run(run_case(SPEC, smoke, _faulty(f"setsid_grandchild:{tag}"),
                                  config=RUN_CONFIG))
    assert result.verdict is Verdict.PASS, result.message
    assert any("had left its session" in n for n in result.evidence.notes), \
        result.evidence.notes
    alive = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert alive.strip() == "", f"daemon still running: {alive}"
    assert leaks_since(before) == []


def test_the_leak_check_sees_descendants_that_left_the_session() -> None:
    """The session-end leak check covers every descendant, not only direct children: a
    grandchild that called setsid() and was orphaned is reported."""
    import subprocess
    import sys
    import time
    import uuid

    from harness.hygiene import process_tree

    tag = f"corewire-orphan-{uuid.uuid4().hex[:8]}"
    before = snapshot()
    subprocess.run([sys.executable, "-c", "import os, sys, time\nos.setsid()\n"
                    "if os.fork() == 0:\n    sys.stdout.close(); time.sleep(60)  # " + tag +
                    "\nos._exit(0)"], check=True, timeout=30)
    try:
        deadline = time.monotonic() + 5
        while not leaks_since(before) and time.monotonic() < deadline:
            time.sleep(0.05)
        leaks = leaks_since(before)
        assert any("child processes still running" in p for p in leaks), leaks
    finally:
        table = process_tree.process_table()
        orphans = process_tree.marked(process_tree.OWNER_VAR, process_tree.owner_token(),
                                      table) - before.children
        asyncio.run(process_tree.end_all([table[p] for p in orphans], 2.0))
    assert leaks_since(before) == []


def test_a_stderr_flood_is_capped_to_head_and_tail() -> None:
    """40 MB of stderr: the harness keeps the first and last 64 KiB (nothing on disk), and
    the verdict shows the head, how much was elided, and the tail with the crash."""
    driver = _faulty("flood_stderr:40,crash_on:generate")
    result = asyncio.run(run_case(SPEC, smoke, driver, config=RUN_CONFIG))
    assert isinstance(driver, SubprocessDriver)
    assert result.verdict is Verdict.ERROR, result.message
    log = next(n for n in result.evidence.notes if n.startswith("frontend log tail:"))
    assert "bytes elided (stderr was 4" in log and "injected crash on generate" in log, log
    assert driver._stderr.total > 39 << 20 and driver._stderr.kept <= 128 << 10


def test_stderr_capture_keeps_the_head_and_the_tail() -> None:
    from harness.frontends.subprocess.stderr_capture import StderrCapture

    capture = StderrCapture(head_bytes=100, tail_bytes=100)
    for i in range(1000):
        capture.feed(f"line {i:04}\n".encode())
    text = capture.text()
    assert capture.kept == 200 and capture.elided == capture.total - 200
    assert text.startswith("line 0000\n") and text.endswith("line 0999")
    assert f"[... {capture.total - 200} bytes elided" in text
    small = StderrCapture()
    small.feed(b"only line\n")
    assert small.text() == "only line"


def test_stuck_drivers_add_up_to_one_run_level_warning() -> None:
    from harness.frontends.subprocess.program_process import stuck_driver_warning

    notes = {"a[x]": ["teardown: driver ignored `shutdown` and SIGTERM; killed (SIGKILL) "
                      "after 7.0 s"],
             "b[x]": ["teardown: driver did not exit on `shutdown`; ended by SIGTERM after "
                      "5.5 s", "unrelated"],
             "c[x]": ["teardown: driver left 1 process(es) behind (pids [9]): 1 ended by "
                      "SIGTERM, 0 by SIGKILL in 0.1 s"]}
    warning = stuck_driver_warning(notes)
    assert warning is not None and "2 case(s)" in warning and "12.5 s lost" in warning
    assert stuck_driver_warning({"c[x]": notes["c[x]"]}) is None


def test_leftovers_that_respawn_on_sigterm_are_ended_too() -> None:
    """Teardown scans again after ending what it found: a child that answers SIGTERM by
    starting a new daemon (own session) does not leave that daemon running."""
    import subprocess
    import uuid

    tag = f"corewire-respawn-{uuid.uuid4().hex[:8]}"
    result = asyncio.run(run_case(SPEC, smoke, _faulty(f"respawning_grandchild:{tag}"),
                                  config=RUN_CONFIG))
    assert result.verdict is Verdict.PASS, result.message
    note = next((n for n in result.evidence.notes if "driver left" in n), "")
    assert "driver left 2 process(es) behind" in note and "had left its session" in note, \
        result.evidence.notes
    alive = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert alive.strip() == "", f"respawned daemon still running: {alive}"
