"""Smoke tests of the vllm-rs driver: the real Rust frontend behind 1 and 2 mock engines.

They check the driver's plumbing, not conformance (that is the conformance suite's job): the
engines register, a request streams to completion, utilities aggregate, a dropped stream is
aborted at its owner, and shutdown leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]
import pytest

from harness.artefacts.vllm_dist import VllmArtifactError, tiny_lora_dir, vllm_rs_binary
from harness.cases.helpers import hold, prompt, request_for, requests_for
from harness.frontends.api import FrontendError, StartupError, UnsupportedOperation
from harness.frontends.vllm_rs.control import ControlError
from harness.frontends.vllm_rs.driver import VllmRsDriver
from harness.protocol.wire import DEFAULT_CODEC
from mock_engines.group import EngineGroup
from mock_engines.script import EngineScript, UtilityReply, any_request, default_ready
from tests.timescale import TIMESCALE, scaled
from tests.vllm_lane.driving import run_driver, scripts, wait_for

pytestmark = pytest.mark.vllm
os.environ["VLLM_HOST_IP"] = "127.0.0.1"

START_TIMEOUT = 15.0
Body = Callable[[VllmRsDriver, EngineGroup], Awaitable[None]]


@pytest.fixture(scope="module", autouse=True)
def binary() -> Path:
    """Skip (not fail) where the binary cannot be had, e.g. a vllm other than 0.33.0."""
    try:
        return vllm_rs_binary()
    except VllmArtifactError as exc:
        pytest.skip(f"vllm-rs binary unavailable: {exc}")


def run(scripts: Sequence[EngineScript], body: Body) -> None:
    run_driver(VllmRsDriver, scripts, body, START_TIMEOUT)


@pytest.mark.parametrize("n", [1, 2])
def test_registers_and_streams(n: int) -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        for rank in range(n):
            p = prompt(rank)
            handle = await driver.generate(p, 3, data_parallel_rank=rank if n > 1 else None)
            await handle.wait(10)
            assert handle.tokens == [100, 101, 102]
            assert handle.finish_reason == "length" and handle.error is None
            assert handle.text.split() == ["t100", "t101", "t102"]
            found = request_for(group, p)
            assert found is not None and found[0] == rank
        cfg = await driver.observed_config()
        assert cfg.max_model_len == 1024  # default_ready's values: 1024, block_size 16,
        assert cfg.block_size == 16  # 1000 blocks per engine
        assert cfg.num_gpu_blocks == 1000 * n

    run(scripts(n), body)


def test_control_server_info_follows_ready_responses() -> None:
    """GetServerInfo: min max_model_len, engine block_size, summed blocks; HTTP agrees."""
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        assert driver.control is not None
        info = await driver.control.server_info()
        assert info.version == "0.33.0"
        assert (info.max_model_len, info.kv_block_size, info.total_kv_blocks) == (900, 32, 350)
        cfg = await driver.observed_config()  # max_model_len from /v1/models, the rest gRPC
        assert (cfg.max_model_len, cfg.block_size, cfg.num_gpu_blocks) == (900, 32, 350)

    run([EngineScript(ready=default_ready(0, 2, max_model_len=1000, block_size=32,
                                          num_gpu_blocks=100)),
         EngineScript(ready=default_ready(1, 2, max_model_len=900, block_size=32,
                                          num_gpu_blocks=250))], body)


@pytest.mark.parametrize(("sleeping", "versions"), [
    ((True, True), ("v7", "v7")), ((False,), ("v1",)), ((True, False), ("a", "b")),
])
def test_control_utilities_aggregate_like_http(sleeping: tuple[bool, ...],
                                               versions: tuple[str, ...]) -> None:
    """IsSleeping / GetWeightVersion fan out to every engine; disagreement is INTERNAL."""
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        assert driver.control is not None
        if len(set(sleeping)) > 1:
            with pytest.raises(ControlError, match="(?i)inconsistent") as err:
                await driver.control.is_sleeping()
            assert err.value.code == "INTERNAL"
            with pytest.raises(FrontendError, match="(?i)inconsistent"):
                await driver.is_sleeping()  # HTTP refuses the same way
            with pytest.raises(ControlError, match="(?i)inconsistent"):
                await driver.control.weight_version()
        else:
            assert await driver.control.is_sleeping() is sleeping[0]
            assert await driver.is_sleeping() is sleeping[0]
            assert await driver.control.weight_version() == versions[0]
        calls = group.transcript.utility_calls
        assert sorted(c.rank for c in calls("get_weight_version")) == list(range(len(versions)))

    run([EngineScript(utilities={"is_sleeping": UtilityReply(s),
                                 "get_weight_version": UtilityReply(v)})
         for s, v in zip(sleeping, versions, strict=True)], body)


def test_control_calls_fail_typed_after_the_frontend_dies() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        assert driver.proc is not None and driver.control is not None
        driver.proc.kill()
        await asyncio.to_thread(driver.proc.wait, 5)
        with pytest.raises(ControlError, match="UNAVAILABLE"):
            await asyncio.wait_for(driver.control.server_info(), 10)

    run(scripts(1), body)


def test_stop_string_ends_stream() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        handle = await driver.generate(prompt(0), 10, stop=["t102"])
        await handle.wait(10)
        assert handle.finish_reason == "stop"
        assert "t102" not in handle.text and handle.text.split() == ["t100", "t101"]

    run(scripts(1), body)


@pytest.mark.parametrize(("values", "want"), [
    ((True,), True), ((False,), False), ((True, True), True), ((False, False), False),
    ((True, False), None), ((False, True), None),
])
def test_is_sleeping(values: tuple[bool, ...], want: bool | None) -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        if want is None:
            with pytest.raises(FrontendError, match="(?i)inconsistent"):
                await driver.is_sleeping()
        else:
            assert await driver.is_sleeping() is want
        assert len(group.transcript.utility_calls("is_sleeping")) == len(values)

    run([EngineScript(utilities={"is_sleeping": UtilityReply(v)}) for v in values], body)


@pytest.mark.parametrize(("values", "want"), [
    ((True,), True), ((False,), False), ((True, True), True), ((True, False), False),
    ((False, True), False),
])
def test_reset_prefix_cache_is_and(values: tuple[bool, ...], want: bool) -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        assert await driver.reset_prefix_cache() is want
        calls = group.transcript.utility_calls("reset_prefix_cache")
        assert [c.message.args for c in calls] == [[False, False]] * len(values)
        assert await driver.reset_prefix_cache(True, True) is want
        calls = group.transcript.utility_calls("reset_prefix_cache")
        assert [c.message.args for c in calls][len(values):] == [[True, True]] * len(values)

    run([EngineScript(utilities={"reset_prefix_cache": UtilityReply(v)}) for v in values],
        body)


def test_utility_failure_is_frontend_error() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        with pytest.raises(FrontendError, match="boom"):
            await driver.is_sleeping()

    run([EngineScript(), EngineScript(utilities={"is_sleeping": UtilityReply(failure="boom")})],
        body)




@pytest.mark.parametrize("n", [1, 2])
def test_drop_aborts_at_owner(n: int) -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        prompts = [prompt(i) for i in range(2 * n)]
        handles = [await driver.generate(p, 100) for p in prompts]
        for h in handles:
            await h.wait_first(10)
        owners = requests_for(group, prompts)
        assert owners is not None and len(owners) == len(prompts)
        assert n == 1 or sorted(set(owners.values())) == [0, 1]  # spread over both
        await driver.drop(handles)
        assert all(h.dropped and h.ended for h in handles)
        assert await wait_for(lambda: set(owners) <= set(group.transcript.aborted_ids()), 5)
        for frame in group.transcript.abort_frames():
            assert frame.message.request_ids
            assert all(owners[rid] == frame.rank for rid in frame.message.request_ids)
        assert sorted(group.transcript.aborted_ids()) == sorted(owners)

    run([EngineScript(rules=[any_request(hold())]) for _ in range(n)], body)


def test_explicit_abort_maps_engine_ids() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        handle = await driver.generate(prompt(0), 100)
        await handle.wait_first(10)
        found = request_for(group, prompt(0))
        assert found is not None
        await driver.abort([found[1], "no-such-request"])
        assert await wait_for(lambda: group.transcript.aborted_ids() == [found[1]], 5)
        await handle.wait(5)
        assert handle.finish_reason == "abort"
        await driver.abort([])  # never sent: an empty list would abort everything

    run([EngineScript(rules=[any_request(hold())])], body)


def test_request_error_ends_stream() -> None:
    from harness.protocol.wire import messages as m
    from mock_engines.script import Finish, by_prompt

    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        bad = await driver.generate(prompt(1), 4)
        good = await driver.generate(prompt(0), 2)
        await bad.wait(10)
        await good.wait(10)
        assert bad.finish_reason == "error" and bad.error
        assert good.finish_reason == "length" and good.tokens == [100, 101]

    run([EngineScript(rules=[by_prompt(prompt(1), [Finish(m.FinishReason.ERROR)])])], body)


def test_malformed_ready_is_startup_error() -> None:
    async def main() -> None:
        group = EngineGroup([EngineScript(ready_payload=b"\xc1garbage")], codec=DEFAULT_CODEC)
        driver = VllmRsDriver().with_timescale(TIMESCALE)
        began = time.monotonic()
        try:
            with pytest.raises(StartupError, match="vllm-rs exited"):
                await driver.start(group, START_TIMEOUT)
            assert time.monotonic() - began < scaled(10.0)  # prompt, not a hang
            assert "process failed" in driver.diagnostics()
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)

    asyncio.run(main())


def _rs_children() -> list[psutil.Process]:
    out: list[psutil.Process] = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "vllm-rs" in " ".join(child.cmdline()):
                out.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return out


def test_shutdown_leaves_no_process() -> None:
    pids: list[int] = []

    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        assert driver.proc is not None
        pids.append(driver.proc.pid)
        handle = await driver.generate(prompt(0), 100)  # left open across shutdown
        await handle.wait_first(10)
        assert [p.pid for p in _rs_children()] == pids

    run([EngineScript(rules=[any_request(hold())])], body)
    assert pids and not psutil.pid_exists(pids[0])  # exited and reaped (no zombie)
    assert _rs_children() == []


def test_shutdown_is_idempotent_and_safe_before_start() -> None:
    async def main() -> None:
        driver = VllmRsDriver().with_timescale(TIMESCALE)
        await driver.shutdown()  # never started
        group = EngineGroup(1, codec=DEFAULT_CODEC)
        try:
            await driver.start(group, START_TIMEOUT)
            pid = driver.proc.pid if driver.proc else -1
            await driver.shutdown()
            await driver.shutdown()
            assert not psutil.pid_exists(pid)
            assert driver.proc is None and driver.port is None
            assert "OpenAI server is ready" in driver.diagnostics()
        finally:
            await driver.shutdown()
            await asyncio.to_thread(group.stop)

    asyncio.run(main())


def test_frontend_crash_ends_streams_and_later_calls_fail() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        handle = await driver.generate(prompt(0), 100)
        await handle.wait_first(10)
        assert driver.proc is not None
        driver.proc.kill()
        await handle.wait(5)
        assert handle.finish_reason == "error" and handle.error
        later = await driver.generate(prompt(1), 2)
        await later.wait(5)
        assert later.finish_reason == "error"  # refused, not parked in a dead backlog
        with pytest.raises(FrontendError):
            await asyncio.wait_for(driver.is_sleeping(), 5)

    run([EngineScript(rules=[any_request(hold())])], body)


def _lora_engines(*add_answers: bool) -> list[EngineScript]:
    return [EngineScript(ready=default_ready(r, len(add_answers), supports_lora=True,
                                             max_loras=4),
                         utilities={"add_lora": UtilityReply(v), "remove_lora": UtilityReply(v)})
            for r, v in enumerate(add_answers)]


def test_lora_ids_follow_what_vllm_rs_assigns() -> None:
    """add_lora / remove_lora reach the engines with the ids vllm-rs picks; a call asking for
    another id or path is UnsupportedOperation and sends nothing; a rejection is false."""
    adapter = str(tiny_lora_dir())

    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        def lora_calls() -> list[tuple[int, str, list[object]]]:
            return [(c.rank, c.message.method, c.message.args)
                    for c in group.transcript.utility_calls() if "lora" in c.message.method]

        assert await driver.call_utility("add_lora", [["a", 1, adapter]]) is True
        assert sorted(lora_calls()) == [(r, "add_lora", [["a", 1, adapter, None, False, False]])
                                        for r in range(2)]
        for wrong in (["b", 1, adapter], ["b", 2, "/tmp"], ["b", 2, adapter + "/../tiny-lora"]):
            with pytest.raises(UnsupportedOperation):
                await driver.call_utility("add_lora", [wrong])
        with pytest.raises(UnsupportedOperation, match="names no adapter"):
            await driver.call_utility("remove_lora", [2])
        assert len(lora_calls()) == 2  # none of the refused calls reached an engine
        group.engines[1].script.utilities["add_lora"] = UtilityReply(False)
        assert await driver.call_utility("add_lora", [["b", 2, adapter]]) is False
        group.engines[1].script.utilities["add_lora"] = UtilityReply(True)
        assert await driver.call_utility("add_lora", [["c", 3, adapter]]) is True
        group.engines[0].script.utilities["remove_lora"] = UtilityReply(False)
        assert await driver.call_utility("remove_lora", [3]) is False
        group.engines[0].script.utilities["remove_lora"] = UtilityReply(True)
        assert await driver.call_utility("remove_lora", [3]) is True
        assert [c[2] for c in lora_calls() if c[1] == "remove_lora"] == [[3]] * 4

    run(_lora_engines(True, True), body)


def test_lora_without_engine_support_is_unsupported() -> None:
    async def body(driver: VllmRsDriver, group: EngineGroup) -> None:
        with pytest.raises(UnsupportedOperation, match="supports_lora"):
            await driver.call_utility("add_lora", [["a", 1, str(tiny_lora_dir())]])
        assert not group.transcript.utility_calls("add_lora")

    run(scripts(1), body)
