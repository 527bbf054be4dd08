"""Engine utilities as vLLM 0.33.0's Rust frontend serves them over HTTP (dev mode).

Routes found in the 0.33.0 `vllm-rs` binary (strings) and checked against mock engines:
each fans the utility out to every engine and answers JSON. Methods with no route (or a
route the tiny-model configuration does not serve) raise UnsupportedOperation naming why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from harness.frontends.driver import FrontendError, UnsupportedOperation

# generate(params=...) keys vllm-rs takes as completion-body fields of the same name.
RS_PASS_THROUGH = ("kv_transfer_params", "ec_transfer_params", "cache_salt")


@dataclass(frozen=True)
class Route:
    """One HTTP route: how the wire args become the request, how the answer becomes a value."""

    method: str
    path: Callable[[Sequence[Any]], str]
    body: Callable[[Sequence[Any]], Any] | None = None
    answer_key: str | None = None  # None: a unit route (its answer carries no value)


def _arg(args: Sequence[Any], i: int, default: Any = None) -> Any:
    return args[i] if len(args) > i else default


def _query(path: str, pairs: Sequence[tuple[str, Any]]) -> str:
    kept = [(k, str(v).lower() if isinstance(v, bool) else v) for k, v in pairs
            if v is not None]
    return path + (f"?{urlencode(kept)}" if kept else "")


def _tags(args: Sequence[Any]) -> str:
    return _query("/wake_up", [("tags", t) for t in (_arg(args, 0) or [])])


def _reset(args: Sequence[Any]) -> str:
    flags = [("reset_running_requests", bool(_arg(args, 0))),
             ("reset_external", bool(_arg(args, 1)))]
    return _query("/reset_prefix_cache", [(k, True) for k, v in flags if v])


ROUTES: dict[str, Route] = {
    "is_sleeping": Route("GET", lambda a: "/is_sleeping", answer_key="is_sleeping"),
    "is_scheduler_paused": Route("GET", lambda a: "/is_paused", answer_key="is_paused"),
    "reset_prefix_cache": Route("POST", _reset, answer_key="success"),
    "sleep": Route("POST", lambda a: _query("/sleep", [("level", _arg(a, 0, 1)),
                                                         ("mode", _arg(a, 1))])),
    # /wake_up answers {"status": "awake", "tags": ...}: no aggregated value (unit).
    "wake_up": Route("POST", _tags),
    "pause_generation": Route("POST", lambda a: _query("/pause", [("mode", _arg(a, 0)),
                                                                  ("clear_cache", _arg(a, 1))])),
    "resume_scheduler": Route("POST", lambda a: "/resume"),
    "collective_rpc": Route("POST", lambda a: "/collective_rpc",
                            lambda a: {"method": _arg(a, 0), "timeout": _arg(a, 1),
                                       "args": list(_arg(a, 2) or []),
                                       "kwargs": _arg(a, 3) or {}},
                            answer_key="results"),
    "reset_mm_cache": Route("POST", lambda a: "/reset_mm_cache"),
    "reset_encoder_cache": Route("POST", lambda a: "/reset_encoder_cache"),
}

UNREACHABLE: dict[str, str] = {
    "add_lora": "/v1/load_lora_adapter answers 404 with the tiny-model configuration "
                "(no LoRA enabled), so add_lora never reaches the engines",
    "remove_lora": "/v1/unload_lora_adapter answers 404 with the tiny-model configuration",
    "list_loras": "vllm-rs serves no route that calls list_loras",
    "pin_lora": "vllm-rs serves no route that calls pin_lora",
    "get_weight_version": "reached through the gRPC Control service (GetWeightVersion, see "
                          "VllmRsDriver.call_utility), never over HTTP",
    "profile": "/start_profile and /stop_profile answer 404 without a profiler config",
}


def route_for(method: str) -> Route:
    route = ROUTES.get(method)
    if route is None:
        reason = UNREACHABLE.get(method, "vllm-rs serves no HTTP route for it")
        raise UnsupportedOperation(f"vllm-rs: utility {method!r}: {reason}")
    return route


def answer_value(route: Route, path: str, answer: Any) -> Any:
    """The route's value (None for a unit route); a malformed answer is a FrontendError."""
    if route.answer_key is None:
        return None
    if not isinstance(answer, dict) or route.answer_key not in answer:
        raise FrontendError(f"{path}: unexpected answer {answer!r:.300}")
    return answer[route.answer_key]
