"""Engine utilities as vLLM 0.33.0's AsyncLLM exposes them to its users.

`call_utility(method, args)` takes the wire method and wire args; this module maps them to
the AsyncLLM method a user would call (vllm/v1/engine/async_llm.py:1181-1445), so the
frontend's own fan-out and aggregation (core_client.py) is what the case grades. A method
with no AsyncLLM entry point is not on the surface: UnsupportedOperation, naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from harness.frontends.api import UnsupportedOperation

Call = Coroutine[Any, Any, Any]


def _lora(arg: Any) -> Any:
    """A wire LoRARequest array [lora_name, lora_int_id, lora_path, ...] as vLLM's struct."""
    lora_request = importlib.import_module("vllm.lora.request").LoRARequest
    if isinstance(arg, (list, tuple)) and len(arg) >= 2:
        return lora_request(*arg)
    raise UnsupportedOperation(f"add_lora needs a wire LoRARequest array, got {arg!r}")


def _arg(args: Sequence[Any], i: int, default: Any = None) -> Any:
    return args[i] if len(args) > i else default


# wire method -> (AsyncLLM method name, wire args -> (positional, keyword))
_SURFACE: dict[str, tuple[str, Callable[[Sequence[Any]], tuple[list[Any], dict[str, Any]]]]] = {
    "is_sleeping": ("is_sleeping", lambda a: ([], {})),
    "is_scheduler_paused": ("is_paused", lambda a: ([], {})),
    "get_weight_version": ("get_weight_version", lambda a: ([], {})),
    "set_weight_version": ("update_weight_version", lambda a: ([_arg(a, 0)], {})),
    "reset_prefix_cache": ("reset_prefix_cache",
                           lambda a: ([bool(_arg(a, 0, False)), bool(_arg(a, 1, False))], {})),
    "reset_mm_cache": ("reset_mm_cache", lambda a: ([], {})),
    "reset_encoder_cache": ("reset_encoder_cache", lambda a: ([], {})),
    "sleep": ("sleep", lambda a: ([_arg(a, 0, 1), _arg(a, 1, "abort")], {})),
    "wake_up": ("wake_up", lambda a: ([_arg(a, 0)], {})),
    "release_kv_cache_memory": ("release_kv_cache_memory", lambda a: ([], {})),
    "add_lora": ("add_lora", lambda a: ([_lora(_arg(a, 0))], {})),
    "remove_lora": ("remove_lora", lambda a: ([_arg(a, 0)], {})),
    "pin_lora": ("pin_lora", lambda a: ([_arg(a, 0)], {})),
    "list_loras": ("list_loras", lambda a: ([], {})),
    "collective_rpc": ("collective_rpc",
                       lambda a: ([_arg(a, 0), _arg(a, 1), tuple(_arg(a, 2) or ()),
                                   _arg(a, 3)], {})),
    "compute_weight_checksums": ("compute_weight_checksums", lambda a: ([], {})),
    "pause_generation": ("pause_generation",
                         lambda a: ([], {"mode": _arg(a, 0, "abort"),
                                         "clear_cache": _arg(a, 1, True)})),
    "resume_scheduler": ("resume_generation", lambda a: ([], {})),
    "get_supported_tasks": ("get_supported_tasks", lambda a: ([], {})),
}


def async_llm_call(llm: Any, method: str, args: Sequence[Any]) -> tuple[str, Call]:
    """(description, coroutine) of the AsyncLLM call that makes utility `method` happen."""
    entry = _SURFACE.get(method)
    if entry is None:
        raise UnsupportedOperation(f"vllm-py: AsyncLLM exposes no call for utility "
                                   f"{method!r}")
    name, convert = entry
    positional, keyword = convert(list(args))
    return f"AsyncLLM.{name}()", getattr(llm, name)(*positional, **keyword)


def normalise(value: Any) -> Any:
    """AsyncLLM answers in Python types (set, tuple); cases compare JSON-like values."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value
