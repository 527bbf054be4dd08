"""Engine utilities as vLLM 0.33.0's Rust frontend serves them over HTTP (dev mode).

Routes found in the 0.33.0 `vllm-rs` binary (strings) and checked against mock engines:
each fans the utility out to every engine and answers JSON. Methods with no route (or a
route the tiny-model configuration does not serve) raise UnsupportedOperation naming why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from harness.frontends.api import FrontendError, UnsupportedOperation

# generate(params=...) keys vllm-rs takes as completion-body fields of the same name.
RS_PASS_THROUGH = ("kv_transfer_params", "ec_transfer_params", "cache_salt")


@dataclass(frozen=True)
class Route:
    """One HTTP route: how the wire args become the request, how the answer becomes a value."""

    method: str
    path: Callable[[Sequence[Any]], str]
    body: Callable[[Sequence[Any]], Any] | None = None
    answer_key: str | None = None  # None: a unit route (its answer carries no value)
    # How the answer's field becomes the utility's value, where the route reports it in a
    # form of its own (a ValueError names what it could not read).
    decode: Callable[[Any], Any] | None = None


def _fully_awake(status: Any) -> bool:
    """POST /wake_up reports the client's AND over engines as `status`: "awake" when every
    engine is fully awake, else "sleeping" (vLLM 0.33.0 rust/src/server/src/routes/sleep.rs
    :119, `status: if fully_awake { "awake" } else { "sleeping" }`)."""
    if status not in ("awake", "sleeping"):
        raise ValueError(f"status {status!r} is neither 'awake' nor 'sleeping'")
    return bool(status == "awake")


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
    # /wake_up answers {"status": "awake" | "sleeping", "tags": ...}: the AND over engines.
    "wake_up": Route("POST", _tags, answer_key="status", decode=_fully_awake),
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
    "release_kv_cache_memory": Route("POST", lambda a: "/release_kv_cache_memory"),
}

# add_lora / remove_lora go through /v1/(un)load_lora_adapter: see LoraAdapters below.
UNREACHABLE: dict[str, str] = {
    "list_loras": "vllm-rs serves no route that calls list_loras",
    "pin_lora": "vllm-rs serves no route that calls pin_lora",
    "get_weight_version": "reached through the gRPC Control service (GetWeightVersion, see "
                          "VllmRsDriver.call_utility), never over HTTP",
    "set_weight_version": "reached through the gRPC Control service (UpdateWeightVersion, "
                          "see VllmRsDriver.call_utility), never over HTTP",
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
    if route.decode is None:
        return answer[route.answer_key]
    try:
        return route.decode(answer[route.answer_key])
    except ValueError as exc:
        raise FrontendError(f"{path}: unexpected answer {answer!r:.300}: {exc}") from exc


# ---------------------------------------------------------------------- LoRA adapters
#
# Observed on the 0.33.0 binary against mock engines (reporting supports_lora=true):
# * the routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; a load path must be
#   absolute, exist, and lie under one of VLLM_RUNTIME_LORA_ALLOWED_PATH_PREFIXES
#   (':'-separated); the engines get the canonical path;
# * vllm-rs picks lora_int_id itself: 1, 2, ... per process, one per load that reaches the
#   engines (answered true, false or failed alike), never reused; a load_inplace of a loaded
#   name keeps its id; the request has no id field;
# * it fans add_lora / remove_lora out to every engine and ANDs: a false answer is HTTP 500
#   "one or more engine ranks rejected LoRA adapter `n`" / "engine rejected removal of LoRA
#   adapter `n` with id i" (the adapter is then not loaded / stays loaded); an engine's
#   failure is HTTP 500 "failed to (un)load LoRA adapter `n`: utility call ... failed";
# * unload takes the name (and checks an optional lora_int_id against the loaded one);
# * with engines reporting supports_lora=false both routes answer 400 "engine was not started
#   with LoRA enabled" and nothing reaches the engines.

LORA_ENV_ALLOW = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
LORA_ENV_PREFIXES = "VLLM_RUNTIME_LORA_ALLOWED_PATH_PREFIXES"
LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
_LOAD_REJECTED = "one or more engine ranks rejected LoRA adapter"
_LOAD_FAILED = "failed to load LoRA adapter"
_UNLOAD_REJECTED = "engine rejected removal of LoRA adapter"
_LORA_DISABLED = "engine was not started with LoRA enabled"

# (method, path, JSON body) -> (HTTP status, body text)
Requester = Callable[[str, str, Any], Awaitable[tuple[int, str]]]


def lora_environment(allowed: Sequence[str]) -> dict[str, str]:
    """What the vllm-rs process needs in its environment to serve the LoRA routes."""
    return {LORA_ENV_ALLOW: "True", LORA_ENV_PREFIXES: ":".join(allowed)}


@dataclass(frozen=True)
class WireLora:
    """A wire LoRARequest array [lora_name, lora_int_id, lora_path, base_model_name,
    load_inplace, is_3d_lora_weight] (trailing fields optional)."""

    name: str
    int_id: int
    path: str
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False

    @classmethod
    def parse(cls, arg: Any) -> WireLora:
        if not isinstance(arg, (list, tuple)) or not 3 <= len(arg) <= 6:
            raise UnsupportedOperation(f"add_lora needs a wire LoRARequest array, got {arg!r}")
        name, int_id, path, *rest = arg
        if not (isinstance(name, str) and isinstance(int_id, int) and isinstance(path, str)):
            raise UnsupportedOperation(f"add_lora: malformed LoRARequest {arg!r}")
        base, inplace, is_3d = [*rest, None, False, False][:3]
        return cls(name, int_id, path, base, bool(inplace), bool(is_3d))


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else text


class LoraAdapters:
    """add_lora / remove_lora through vllm-rs's LoRA routes, keeping track of the ids vllm-rs
    hands out, so that a call passes only when the engines will see exactly the wire args it
    asked for (else UnsupportedOperation saying why)."""

    def __init__(self, allowed_dir: str) -> None:
        self.allowed_dir = allowed_dir
        self.loaded: dict[str, int] = {}  # lora_name -> the id vllm-rs gave it
        self.next_id: int | None = 1  # None: unknown after an answer we cannot account for

    def _load_body(self, lora: WireLora) -> dict[str, Any]:
        if lora.base_model_name is not None:
            raise UnsupportedOperation("vllm-rs: /v1/load_lora_adapter takes no "
                                       "base_model_name, so the engines never see one")
        if os.path.realpath(lora.path) != lora.path or not (
                lora.path == self.allowed_dir
                or lora.path.startswith(self.allowed_dir.rstrip("/") + "/")):
            raise UnsupportedOperation(
                f"vllm-rs loads adapters only from absolute paths under {LORA_ENV_PREFIXES} "
                f"and sends the engines the canonical path; the driver allows "
                f"{self.allowed_dir!r} only, the call asked for {lora.path!r}")
        expected = self._id_for(lora)
        if lora.int_id != expected:
            raise UnsupportedOperation(
                f"vllm-rs assigns lora_int_id itself (1, 2, ... per process, one per load "
                f"that reaches the engines): this load would get {expected}, the call asked "
                f"for {lora.int_id}")
        return {"lora_name": lora.name, "lora_path": lora.path,
                "load_inplace": lora.load_inplace,
                "is_3d_lora_weight": lora.is_3d_lora_weight}

    def _id_for(self, lora: WireLora) -> int | str:
        if lora.load_inplace and lora.name in self.loaded:
            return self.loaded[lora.name]
        return "unknown (an earlier answer left it open)" if self.next_id is None \
            else self.next_id

    def _consume(self, lora: WireLora) -> int | None:
        """The id this load used; advances the counter unless an in-place reload kept it."""
        if lora.load_inplace and lora.name in self.loaded:
            return self.loaded[lora.name]
        used = self.next_id
        if used is not None:
            self.next_id = used + 1
        return used

    async def add(self, args: Sequence[Any], request: Requester) -> bool:
        lora = WireLora.parse(_arg(args, 0))
        status, text = await request("POST", LOAD_PATH, self._load_body(lora))
        message = _error_message(text)
        if status == 200:
            used = self._consume(lora)
            if used is not None:
                self.loaded[lora.name] = used
            return True
        _refuse_if_disabled(message)
        if status == 500 and message.startswith(_LOAD_REJECTED):
            self._consume(lora)  # reached every engine; one answered false (the AND)
            return False
        if status == 500 and message.startswith(_LOAD_FAILED):
            self._consume(lora)
        elif status >= 500:
            self.next_id = None  # cannot tell whether it reached the engines
        raise FrontendError(f"{LOAD_PATH}: HTTP {status}: {message[:500]}")

    async def remove(self, args: Sequence[Any], request: Requester) -> bool:
        int_id = _arg(args, 0)
        name = next((n for n, i in self.loaded.items() if i == int_id), None)
        if name is None:
            raise UnsupportedOperation(
                f"vllm-rs unloads adapters by lora_name: lora_int_id {int_id!r} names no "
                f"adapter this driver loaded (loaded: {self.loaded})")
        status, text = await request("POST", UNLOAD_PATH,
                                     {"lora_name": name, "lora_int_id": int_id})
        message = _error_message(text)
        if status == 200:
            del self.loaded[name]
            return True
        _refuse_if_disabled(message)
        if status == 500 and message.startswith(_UNLOAD_REJECTED):
            return False  # the AND over engines; the adapter stays loaded
        raise FrontendError(f"{UNLOAD_PATH}: HTTP {status}: {message[:500]}")


def _refuse_if_disabled(message: str) -> None:
    if message.startswith(_LORA_DISABLED):
        raise UnsupportedOperation(
            "vllm-rs refuses LoRA loads unless the engines' ready responses report "
            f"supports_lora=true (it answered {message!r}); nothing reached the engines")
