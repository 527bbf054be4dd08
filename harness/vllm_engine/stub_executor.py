"""`StubExecutor`: a vLLM 0.33.0 `Executor` whose model is arithmetic.

With it, vLLM's real engine core (scheduler, KV cache manager, prefix cache, chunked prefill,
socket threads, busy loop, utilities, abort handling) runs on a CPU-only machine without
weights. Only the executor is ours: it answers the worker RPCs the engine makes at startup
(KV cache spec, "available memory", layouts, warm-up) and, per step, samples one
deterministic token per request whose prefill is complete.

Token rule: the n-th output token (0-based) of every request is `100 + n % 800` -- the same
tokens an unscripted mock engine streams, so mock and real transcripts line up, and never
the tiny model's special tokens (0-2), so EOS never ends a stream early.

Knobs travel in `vllm_config.additional_config["corewire_stub"]` (so they reach the engine
process however it is started): `step_delay_s` (fake forward-pass time, for observable
streaming and aborts), `available_memory` (bytes of fake KV memory), `die_with_parent`
(the engine process gets SIGKILL when its launcher dies; a harness engine never outlives
its harness).

This module imports vLLM and torch: import it only where vLLM is meant to be loaded.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes

CONFIG_KEY = "corewire_stub"
FIRST_TOKEN = 100
TOKEN_SPAN = 800
DEFAULT_AVAILABLE_MEMORY = 64 * 1024 * 1024  # 64 MiB of pretend device memory for the KV cache
_PR_SET_PDEATHSIG = 1

_log = logging.getLogger(__name__)


def fake_token(output_index: int) -> int:
    """The token a stub engine emits as a request's `output_index`-th output."""
    return FIRST_TOKEN + output_index % TOKEN_SPAN


@dataclass(frozen=True)
class StubSettings:
    """The stub's knobs, read from `additional_config` (absent keys: defaults)."""

    step_delay_s: float = 0.0
    available_memory: int = DEFAULT_AVAILABLE_MEMORY
    die_with_parent: bool = False

    @classmethod
    def from_config(cls, vllm_config: Any) -> StubSettings:
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
        return cls(step_delay_s=float(raw.get("step_delay_s", 0.0)),
                   available_memory=int(raw.get("available_memory", DEFAULT_AVAILABLE_MEMORY)),
                   die_with_parent=bool(raw.get("die_with_parent", False)))


def stub_additional_config(step_delay_s: float = 0.0, *, die_with_parent: bool = False,
                           available_memory: int = DEFAULT_AVAILABLE_MEMORY) -> dict[str, Any]:
    """The `additional_config` entry that configures the stub (merge it into the config)."""
    return {CONFIG_KEY: {"step_delay_s": step_delay_s, "die_with_parent": die_with_parent,
                         "available_memory": available_memory}}


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError) as exc:  # best effort: the launcher also reaps
        _log.warning("stub executor: could not set PR_SET_PDEATHSIG: %s", exc)


@dataclass
class _Progress:
    """What the fake model runner knows about one request."""

    prompt_len: int
    outputs: int = 0  # tokens sampled so far

    @property
    def known(self) -> int:
        return self.prompt_len + self.outputs


class StubWorker:
    """The worker RPC surface the engine core uses, with nothing behind it.

    Unknown RPCs raise AttributeError (surfacing as a utility failure or a startup error),
    so nothing is silently faked.
    """

    def __init__(self, vllm_config: Any, settings: StubSettings) -> None:
        self.vllm_config = vllm_config
        self.settings = settings
        model = vllm_config.model_config
        self.num_layers = model.get_num_layers(vllm_config.parallel_config)
        self.num_kv_heads = model.get_total_num_kv_heads()
        self.head_size = model.get_head_size()
        self.requests: dict[str, _Progress] = {}
        self.pending: Any = None  # the SchedulerOutput of the step in flight
        self.sleeping = False

    # ------------------------------------------------------------------ startup

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        block_size = self.vllm_config.cache_config.block_size
        return {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
                    block_size=block_size, num_kv_heads=self.num_kv_heads,
                    head_size=self.head_size, dtype=torch.float16)
                for i in range(self.num_layers)}

    def determine_available_memory(self) -> int:
        return self.settings.available_memory

    def get_simple_cpu_offload_num_cpu_blocks(self) -> int | None:
        return None

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC", "LBHNC"]

    def set_kv_cache_layout(self, layout_name: str, cp_kv_cache_interleave_size: int) -> None:
        pass

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        pass

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_kv_connector_handshake_metadata(self) -> None:
        return None

    def update_max_model_len(self, max_model_len: int) -> None:
        pass

    def supports_draft_weight_updates(self) -> bool:
        return False

    # ------------------------------------------------------------- utilities

    def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False

    def synchronize_device(self) -> None:
        pass

    def reset_mm_cache(self) -> None:
        pass

    def reset_encoder_cache(self) -> None:
        pass

    def list_loras(self) -> set[int]:
        return set()

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        self.requests.clear()

    # ------------------------------------------------------------- the "model"

    def execute_model(self, scheduler_output: Any) -> None:
        """Remember the step; like a real runner, tokens come from `sample_tokens`."""
        if self.settings.step_delay_s and scheduler_output.total_num_scheduled_tokens:
            time.sleep(self.settings.step_delay_s)
        self.pending = scheduler_output
        return None

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        """One token per request whose scheduled tokens complete its known sequence."""
        so, self.pending = self.pending, None
        if so is None or not so.num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = _Progress(len(new.prompt_token_ids or []))
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            if rid not in self.requests:  # resumed after we dropped it: rebuild from tokens
                tokens = cached.all_token_ids.get(rid, [])
                outputs = cached.num_output_tokens[i]
                self.requests[rid] = _Progress(len(tokens) - outputs, outputs)
        req_ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            progress = self.requests[rid]
            if computed.get(rid, 0) + so.num_scheduled_tokens[rid] >= progress.known:
                sampled.append([fake_token(progress.outputs)])
                progress.outputs += 1
            else:
                sampled.append([])  # a partial prefill chunk samples nothing
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def take_draft_token_ids(self) -> None:
        return None


class StubExecutor(Executor):
    """One in-process `StubWorker`; every RPC is a direct call."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        settings = StubSettings.from_config(self.vllm_config)
        if settings.die_with_parent:
            _die_with_parent()
        self.worker = StubWorker(self.vllm_config, settings)

    def collective_rpc(
        self, method: str | Callable[..., Any], timeout: float | None = None,
        args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> Any:
        """The one worker's result as a list (a completed Future of it with `non_block`)."""
        if not non_block:
            return [self._call(method, args, kwargs or {})]
        future: Future[Any] = Future()
        try:
            future.set_result([self._call(method, args, kwargs or {})])
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _call(self, method: str | Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        if isinstance(method, str):
            return getattr(self.worker, method)(*args, **kwargs)
        return method(self.worker, *args, **kwargs)

    def execute_model(
        self, scheduler_output: Any, non_block: bool = False
    ) -> Any:
        return self._single(self.worker.execute_model, scheduler_output, non_block)

    def sample_tokens(
        self, grammar_output: Any, non_block: bool = False
    ) -> Any:
        return self._single(self.worker.sample_tokens, grammar_output, non_block)

    @staticmethod
    def _single(fn: Callable[[Any], Any], arg: Any, non_block: bool) -> Any:
        if not non_block:
            return fn(arg)
        future: Future[Any] = Future()
        try:
            future.set_result(fn(arg))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def take_draft_token_ids(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        self.worker.shutdown()


__all__ = ["CONFIG_KEY", "StubExecutor", "StubSettings", "StubWorker", "fake_token",
           "stub_additional_config"]
