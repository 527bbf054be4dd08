"""The vllm-rs driver's LoRA mapping (LoraAdapters) without the binary: how vllm-rs's HTTP
answers become add_lora / remove_lora results, and how the ids it assigns are tracked.
The answers are the ones the 0.33.0 binary gives (tests/vllm_lane/test_vllm_rs_smoke.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from harness.frontends.api import FrontendError, UnsupportedOperation
from harness.frontends.vllm_rs.utilities import LoraAdapters, WireLora, lora_environment

ADAPTER = "/fixtures/tiny-lora"


def _error(status: int, message: str) -> tuple[int, str]:
    return status, json.dumps({"error": {"message": message, "code": status}})


class FakeRs:
    """Answers each request with the next scripted (status, text); records the requests."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, Any]] = []

    async def __call__(self, method: str, path: str, body: Any) -> tuple[int, str]:
        self.sent.append((path, body))
        return self.answers.pop(0)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_environment_and_parse() -> None:
    assert lora_environment(["/a", "/b"]) == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_RUNTIME_LORA_ALLOWED_PATH_PREFIXES": "/a:/b"}
    assert WireLora.parse(["n", 3, "/p", None, True]) == WireLora("n", 3, "/p", None, True)
    for bad in ("n", ["n", "3", "/p"], ["n", 3]):
        with pytest.raises(UnsupportedOperation):
            WireLora.parse(bad)


def test_ids_advance_per_load_that_reached_the_engines() -> None:
    loras = LoraAdapters(ADAPTER)
    rs = FakeRs((200, "Success"),
                _error(500, "one or more engine ranks rejected LoRA adapter `b`"),
                _error(500, "failed to load LoRA adapter `c`: utility call `add_lora` failed"),
                _error(400, "LoRA adapter `a` is already loaded."),
                (200, "Success"))
    assert _run(loras.add([["a", 1, ADAPTER]], rs)) is True
    assert _run(loras.add([["b", 2, ADAPTER]], rs)) is False
    with pytest.raises(FrontendError, match="utility call"):
        _run(loras.add([["c", 3, ADAPTER]], rs))
    with pytest.raises(FrontendError, match="already loaded"):  # refused before an id
        _run(loras.add([["a", 4, ADAPTER]], rs))
    assert _run(loras.add([["d", 4, ADAPTER + "/x"]], rs)) is True
    assert loras.loaded == {"a": 1, "d": 4}
    assert rs.sent[0] == ("/v1/load_lora_adapter", {
        "lora_name": "a", "lora_path": ADAPTER, "load_inplace": False,
        "is_3d_lora_weight": False})


@pytest.mark.parametrize("lora", [["a", 2, ADAPTER], ["a", 1, "/elsewhere"],
                                  ["a", 1, ADAPTER + "/../tiny-lora"],
                                  ["a", 1, ADAPTER, "base-model"]])
def test_unreproducible_loads_send_nothing(lora: list[Any]) -> None:
    rs = FakeRs()
    with pytest.raises(UnsupportedOperation):
        _run(LoraAdapters(ADAPTER).add([lora], rs))
    assert rs.sent == []


def test_unexplained_failure_leaves_the_next_id_unknown() -> None:
    loras = LoraAdapters(ADAPTER)
    with pytest.raises(FrontendError):
        _run(loras.add([["a", 1, ADAPTER]], FakeRs(_error(502, "bad gateway"))))
    with pytest.raises(UnsupportedOperation, match="unknown"):
        _run(loras.add([["a", 1, ADAPTER]], FakeRs()))


def test_in_place_reload_keeps_its_id() -> None:
    loras = LoraAdapters(ADAPTER)
    rs = FakeRs((200, "Success"), (200, "Success"), (200, "Success"))
    _run(loras.add([["a", 1, ADAPTER]], rs))
    assert _run(loras.add([["a", 1, ADAPTER, None, True]], rs)) is True
    assert _run(loras.add([["b", 2, ADAPTER]], rs)) is True


def test_remove_maps_id_to_name_and_rejection_to_false() -> None:
    loras = LoraAdapters(ADAPTER)
    _run(loras.add([["a", 1, ADAPTER]], FakeRs((200, "Success"))))
    rs = FakeRs(_error(500, "engine rejected removal of LoRA adapter `a` with id 1"),
                _error(500, "failed to unload LoRA adapter `a`: utility call failed"),
                (200, "Success"))
    assert _run(loras.remove([1], rs)) is False
    with pytest.raises(FrontendError):
        _run(loras.remove([1], rs))
    assert _run(loras.remove([1], rs)) is True
    assert rs.sent[0] == ("/v1/unload_lora_adapter", {"lora_name": "a", "lora_int_id": 1})
    with pytest.raises(UnsupportedOperation, match="names no adapter"):
        _run(loras.remove([1], FakeRs()))


def test_lora_disabled_is_unsupported() -> None:
    rs = FakeRs(_error(400, "engine was not started with LoRA enabled"))
    with pytest.raises(UnsupportedOperation, match="supports_lora"):
        _run(LoraAdapters(ADAPTER).add([["a", 1, ADAPTER]], rs))
