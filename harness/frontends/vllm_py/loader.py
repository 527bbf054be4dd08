"""vLLM 0.33.0 loaded once per process, and the pieces the vllm-py driver builds AsyncLLM from.

Importing vLLM costs about 10 s and must happen after the environment is set, so it is
done once per process, under a lock, and its failure is remembered (every later start
reports the same StartupError). One VllmConfig is built per DP size and deep-copied per
case, because AsyncLLM mutates the config it is given. Also here: the client's sampling
as vLLM's SamplingParams, and the pre-bound AF_UNIX listeners AsyncLLM adopts. The driver
(driver.py) and the handshake-mode startup (handshake.py) use them.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from harness.artefacts.vllm_dist import tiny_model_dir
from harness.frontends.api import Sampling, StartupError


@dataclass(frozen=True)
class _Vllm:
    """The few vLLM objects the driver uses (typed Any: mypy stays out of vLLM's sources)."""

    async_llm: Any  # class AsyncLLM
    core_client: Any  # module vllm.v1.engine.core_client (ready-timeout knob)
    engine_args: Any  # class EngineArgs
    coordinator: Any  # module vllm.v1.engine.coordinator (its process start, handshake mode)
    sampling_params: Any  # class SamplingParams
    output_kind: Any  # enum RequestOutputKind
    tokens_prompt: Any  # TypedDict TokensPrompt


_VLLM: _Vllm | None = None
_VLLM_ERROR: str | None = None
_CONFIGS: dict[int, Any] = {}  # data_parallel_size -> pristine VllmConfig (never handed out)
_LOCK = threading.Lock()


def client_sampling(vllm: _Vllm, sampling: Sampling, **fixed: Any) -> Any:
    """vLLM's SamplingParams for the client's sampling, every field as asked (AsyncLLM
    then adds the model's EOS, input_processor.py:489)."""
    return vllm.sampling_params(
        temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        min_p=sampling.min_p, seed=sampling.seed, ignore_eos=sampling.ignore_eos,
        min_tokens=sampling.min_tokens, stop_token_ids=list(sampling.stop_token_ids) or None,
        **fixed)


def _load_vllm() -> _Vllm:
    """Import vLLM once per process; the environment must be set before the first import."""
    global _VLLM, _VLLM_ERROR
    with _LOCK:
        if _VLLM is not None:
            return _VLLM
        if _VLLM_ERROR is not None:
            raise StartupError(_VLLM_ERROR)
        os.environ["VLLM_HOST_IP"] = "127.0.0.1"  # loopback only; never probe a public address
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        # No collector passes while the import builds ~600k objects (10 % of its CPU; they
        # are almost all alive when it ends; the full pass below frees what it left).
        collecting = gc.isenabled()
        gc.disable()
        try:
            _VLLM = _Vllm(
                async_llm=importlib.import_module("vllm.v1.engine.async_llm").AsyncLLM,
                core_client=importlib.import_module("vllm.v1.engine.core_client"),
                coordinator=importlib.import_module("vllm.v1.engine.coordinator"),
                engine_args=importlib.import_module("vllm.engine.arg_utils").EngineArgs,
                sampling_params=importlib.import_module("vllm.sampling_params").SamplingParams,
                output_kind=importlib.import_module("vllm.sampling_params").RequestOutputKind,
                tokens_prompt=importlib.import_module("vllm.inputs").TokensPrompt,
            )
        except Exception as exc:  # ImportError, or a broken install raising anything else
            _VLLM_ERROR = f"vllm is not importable here: {type(exc).__name__}: {exc}"
            raise StartupError(_VLLM_ERROR) from exc
        finally:
            if collecting:
                gc.enable()
        if not hasattr(_VLLM.core_client, "VLLM_ENGINE_READY_TIMEOUT_S"):
            _VLLM_ERROR = ("vllm.v1.engine.core_client has no VLLM_ENGINE_READY_TIMEOUT_S: not "
                           "the 0.33.0 client this driver was written against")
            _VLLM = None
            raise StartupError(_VLLM_ERROR)
        # As `vllm serve` does once it has started (freeze_gc_heap(),
        # vllm/entrypoints/launchers/utils/server_utils.py:94): the import's ~600k objects
        # leave the collector's view, so its full passes stop re-scanning them (measured: 1-5
        # CPU-s a worker over a lane, and 0.3-0.5 s per explicit full collect). Unfrozen at
        # exit: the interpreter's last pass then frees them, and nanobind-based extensions
        # imported by vLLM do not report them as leaked on stderr.
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)
        return _VLLM


def _base_config(vllm: _Vllm, dp_size: int) -> Any:
    """The VllmConfig for `dp_size` engines, built once per process (first build ~0.15 s)."""
    with _LOCK:
        config = _CONFIGS.get(dp_size)
        if config is None:
            # No max_model_len: the model's own limit (2048) stays above what engines report,
            # so the engines' ready responses decide it.
            args = vllm.engine_args(model=str(tiny_model_dir()), skip_tokenizer_init=False,
                                    data_parallel_size=dp_size)
            config = _CONFIGS[dp_size] = args.create_engine_config()
        return config


def _listen(address: str) -> socket.socket:
    """A listening AF_UNIX socket at an ipc:// address, for AsyncLLM to adopt (ZMQ_USE_FD)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address.removeprefix("ipc://"))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock
