"""`vllm-rs@X`: one spec parser, each release's command-line form and observable surface
(boundaries checked on the released binaries' --help and route strings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.frontends.api import Capability, UnsupportedOperation
from harness.frontends.run_config import RunConfig
from harness.frontends.table import check_spec, make_driver
from harness.frontends.vllm_rs import driver as vllm_rs
from harness.frontends.vllm_rs import process as vllm_rs_process
from harness.frontends.vllm_rs.releases import (
    RELEASES,
    RS_CAPABILITIES,
    ReleaseSpecError,
    RsRelease,
    release_of,
)


@dataclass
class _Engine:
    rank: int


@dataclass
class _Group:
    """What VllmRsDriver.command reads of an EngineGroup."""

    engines: list[_Engine]
    stats_address: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(autouse=True)
def _no_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_rs_process, "_binary",
                        lambda version=None: Path(f"/x/{version}/vllm-rs"))


def command(spec: str, ranks: list[int], in_arg: int | str = 7, out_arg: int | str = 8,
            grpc: int | None = None) -> list[str]:
    driver = make_driver(RunConfig(spec))
    assert isinstance(driver, vllm_rs.VllmRsDriver)
    group: Any = _Group([_Engine(r) for r in ranks])
    return driver.command(in_arg, out_arg, 9, group, 5, grpc)[:-2]  # without --args-json


def test_spec_parser() -> None:
    for version in RELEASES:
        check_spec(f"vllm-rs@{version}")
    assert release_of("vllm-rs") is None and release_of("vllm-py") is None
    assert release_of("vllm-rs@0.22.1") == RsRelease("0.22.1")
    with pytest.raises(ReleaseSpecError, match="0.21.0 ships no Rust frontend"):
        check_spec("vllm-rs@0.21.0")
    with pytest.raises(ReleaseSpecError, match="no protocol profile for vllm 0.99.0"):
        check_spec("vllm-rs@0.99.0")
    with pytest.raises(ValueError, match="not a vLLM release number"):
        check_spec("vllm-rs@latest")
    driver = make_driver(RunConfig("vllm-rs@0.22.1"))
    assert driver.name == "vllm-rs@0.22.1" and make_driver(RunConfig("vllm-rs")).name == "vllm-rs"


def test_command_line_per_release() -> None:
    assert command("vllm-rs@0.22.1", [0, 1], "ipc://in", "ipc://out") == [
        "/x/0.22.1/vllm-rs", "frontend", "--listen-fd", "9", "--input-address", "ipc://in",
        "--output-address", "ipc://out", "--engine-count", "2"]
    assert command("vllm-rs@0.24.0", [2, 3], "ipc://in", "ipc://out")[-4:] == [
        "--engine-start-index", "2", "--engine-count", "2"]
    assert command("vllm-rs@0.28.0", [2, 3], "ipc://in", "ipc://out")[-2:] == [
        "--data-parallel-size", "4"]
    assert command("vllm-rs@0.32.0", [0], grpc=11) == [
        "/x/0.32.0/vllm-rs", "frontend", "--listen-fd", "9", "--input-listener-fd", "7",
        "--output-listener-fd", "8", "--engine-start-index", "0", "--engine-count", "1",
        "--data-parallel-size", "1", "--grpc-listen-fd", "11"]
    assert command("vllm-rs", [0], grpc=11)[0] == "/x/None/vllm-rs"  # the installed binary
    with pytest.raises(UnsupportedOperation, match="no --engine-start-index"):
        command("vllm-rs@0.23.0", [1, 2], "ipc://in", "ipc://out")


def test_capabilities_per_release() -> None:
    lost = {v: RS_CAPABILITIES - RsRelease(v).capabilities for v in RELEASES}
    assert lost["0.22.1"] == {Capability.ABORT, Capability.RESET_PREFIX_CACHE,
                              Capability.MAX_MODEL_LEN, Capability.BLOCK_SIZE,
                              Capability.NUM_GPU_BLOCKS}
    assert lost["0.24.0"] == {Capability.RESET_PREFIX_CACHE, Capability.BLOCK_SIZE,
                              Capability.NUM_GPU_BLOCKS}
    assert lost["0.26.0"] == {Capability.BLOCK_SIZE, Capability.NUM_GPU_BLOCKS}
    assert lost["0.32.0"] == lost["0.33.0"] == set()
    assert make_driver(RunConfig("vllm-rs@0.22.1")).capabilities == RsRelease("0.22.1").capabilities
    assert RsRelease("0.22.1").missing_route("add_lora") is not None
    assert RsRelease("0.23.0").missing_route("add_lora") is None
    assert RsRelease("0.23.0").missing_route("pause_generation") is not None
    assert RsRelease("0.24.0").missing_route("pause_generation") is None
