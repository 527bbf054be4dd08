"""`FrontendDriver` for vLLM 0.33.0's Rust frontend (`vllm-rs frontend`), driven over HTTP.

The process side (listeners handed to the binary, the release's command line, `vllm-rs serve`
for handshake cases, teardown) is vllm_rs_process.py; this module is what a client does.
Everything the harness observes goes through the frontend's own HTTP surface, exactly as a
client sees it (the client: vllm_rs_http.py, on aiohttp):

* `POST /v1/completions` (token-id prompt, `stream: true`, `return_token_ids: true`): SSE chunks
  carry `choices[0].token_ids`, `text` and a final `finish_reason`; an engine-side request error
  arrives as a `data: {"error": {...}}` event (read by vllm_rs_stream.py).
* header `X-data-parallel-rank: r` pins a request to engine r (a body field is ignored).
* header `X-Request-Id: X` names the request `cmpl-X` (the "external" id); the engine-facing id
  is `cmpl-X-<8 hex>`, so explicit aborts map engine ids back to external ids.
* `POST /abort_requests {"request_ids": [external ids]}` aborts; an EMPTY list aborts every
  request the frontend tracks, so the driver never sends one.
* `GET /is_sleeping`, `POST /reset_prefix_cache?reset_running_requests=..&reset_external=..`
  (dev routes, VLLM_SERVER_DEV_MODE=1).
* `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` for add_lora / remove_lora, from
  the adapter fixture only (vllm_rs_utilities.LoraAdapters: vllm-rs picks the int ids).
* `GET /v1/models` reports `max_model_len`; block_size and num_gpu_blocks are exposed nowhere
  over HTTP (not in /metrics, /server_info or /v1/models). They are read from the gRPC Control
  service instead (`--grpc-listen-fd`, `GetServerInfo`; see control.py).

`vllm-rs@X` runs the binary of vLLM release X instead (fetched once, fetch.py), with that
release's command line and capabilities (releases.py); its mock engines speak that release's
protocol profile (RunConfig.engine_profile, from the driver table's release_profile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from harness.artefacts.vllm_dist import tiny_lora_dir
from harness.frontends.api import (
    GREEDY,
    Capability,
    FrontendDriver,
    FrontendError,
    ObservedConfig,
    Sampling,
    StreamHandle,
    UnsupportedOperation,
    check_generate_options,
)
from harness.frontends.vllm_rs import handshake as hs
from harness.frontends.vllm_rs.control import ControlClient
from harness.frontends.vllm_rs.http import CONNECTION_ERRORS, HttpError, RsHttpClient, describe
from harness.frontends.vllm_rs.process import RsProcess, model_dir
from harness.frontends.vllm_rs.releases import INSTALLED, RS_CAPABILITIES, RsRelease
from harness.frontends.vllm_rs.stream import CompletionStream
from harness.frontends.vllm_rs.utilities import (
    RS_PASS_THROUGH,
    LoraAdapters,
    answer_value,
    lora_environment,
    route_for,
)

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

HTTP_TIMEOUT = 60.0  # per call (a stream: until its response head), before scaling: longer
# than any case bound, so a frontend that hangs shows up as the case's TIMEOUT rather than as
# a driver-made error
SHUTDOWN_READERS_TIMEOUT = 1.0  # for cancelled stream readers to unwind at shutdown
_ENGINE_ID = re.compile(r"^(?P<external>.+)-[0-9a-f]{8}$")


def completion_sampling(sampling: Sampling | None) -> dict[str, Any]:
    """The client's sampling as OpenAI completions body fields: temperature always (the
    OpenAI default is 1.0), the rest only where the client left the default (a greedy
    request's body stays what every vllm-rs release accepts). vllm-rs serves vLLM's
    extensions top_k, min_p, ignore_eos, min_tokens and stop_token_ids
    (rust/src/server/src/routes/openai/completions/types.rs:75-147)."""
    asked = sampling or GREEDY
    body: dict[str, Any] = {"temperature": asked.temperature}
    for name, default in dataclasses.asdict(GREEDY).items():
        value = getattr(asked, name)
        if name != "temperature" and value != default:
            body[name] = list(value) if isinstance(value, tuple) else value
    return body

class VllmRsDriver(FrontendDriver):
    """Runs `vllm-rs frontend` against the engine group and drives it over HTTP."""

    name = "vllm-rs"
    # DROP: closing the HTTP stream; ABORT: POST /abort_requests (external ids, see abort());
    # DP_RANK: X-data-parallel-rank; MAX_MODEL_LEN: /v1/models; BLOCK_SIZE, NUM_GPU_BLOCKS:
    # gRPC Control GetServerInfo; REQUEST_ERRORS: the SSE error event; CALL_UTILITY: dev-mode
    # routes (vllm_rs_utilities.ROUTES); CANCEL_UTILITY: closing the connection;
    # CLIENT_REQUEST_ID: X-Request-Id; PASS_THROUGH: completion-body fields. Older releases
    # lose some (vllm_rs_releases.RsRelease.capabilities).
    capabilities: frozenset[Capability] = RS_CAPABILITIES

    def __init__(self, extra_args: dict[str, Any] | None = None,
                 release: RsRelease | None = None) -> None:
        """`release` None: plain `vllm-rs`, the installed 0.33.0 binary."""
        self.extra_args = dict(extra_args or {})
        self.version = None if release is None else release.version
        self.release = release or RsRelease(INSTALLED)
        if release is not None:
            self.name = f"vllm-rs@{release.version}"
            self.capabilities = release.capabilities
        self.process = RsProcess(self.release, self.version, self.extra_args)
        self._http: RsHttpClient | None = None  # one session per started process
        self._streams: dict[int, CompletionStream] = {}  # id(handle) -> stream
        self._external: set[str] = set()  # external ids this driver issued
        self._tag = uuid.uuid4().hex[:8]
        self._seq = itertools.count()
        self._lora = LoraAdapters(str(tiny_lora_dir()))  # add_lora / remove_lora

    # ------------------------------------------------------------------ process

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    @property
    def port(self) -> int | None:
        return self.process.port

    @property
    def control(self) -> ControlClient | None:
        """The gRPC Control service client, once started (releases from 0.32)."""
        return self.process.control

    def command(self, in_fd: int | str, out_fd: int | str, http_fd: int, group: EngineSide,
                ready_timeout: int, grpc_fd: int | None = None) -> list[str]:
        """The release's `vllm-rs frontend` command line (RsProcess.command)."""
        return self.process.command(in_fd, out_fd, http_fd, group, ready_timeout, grpc_fd)

    async def start(self, group: EngineSide, timeout: float) -> None:
        if group.coordinated:
            raise UnsupportedOperation(hs.NO_COORDINATOR)
        deadline = time.monotonic() + timeout
        self._lora = LoraAdapters(self._lora.allowed_dir)  # ids restart with the process
        if group.handshake:
            self.process.launch_handshake_owner(group, timeout, self._environment())
        else:
            self.process.launch_frontend(group, timeout, self._environment(), self.timescale)
        self._http = RsHttpClient(self._port())
        await self.process.wait_serving(deadline, self._http.call)

    def _environment(self) -> dict[str, str]:
        """Dev-mode routes on; runtime LoRA loading allowed from the adapter fixture only.
        The process adds its private dir as VLLM_RPC_BASE_PATH and TMPDIR (RsProcess)."""
        return {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_SERVER_DEV_MODE": "1",
                "NO_COLOR": "1", **lora_environment([self._lora.allowed_dir])}

    def diagnostics(self) -> str:
        return self.process.diagnostics()

    # ------------------------------------------------------------------ HTTP calls

    def _port(self) -> int:
        if self.process.port is None:
            raise RuntimeError("vllm-rs driver is not started")
        return self.process.port

    def _client(self) -> RsHttpClient:
        if self._http is None or self.process.port is None:
            raise RuntimeError("vllm-rs driver is not started")
        return self._http

    async def _text(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        """One bounded non-streaming call: (status, body text); no answer is a FrontendError."""
        try:
            status, raw = await asyncio.wait_for(self._client().call(method, path, body),
                                                 self.scaled(HTTP_TIMEOUT))
        except CONNECTION_ERRORS as exc:
            raise FrontendError(f"{method} {path}: connection failed: {describe(exc)}") \
                from exc
        return status, raw.decode("utf-8", "replace")

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        """A call whose 200 answer is JSON; anything else is the frontend refusing."""
        status, text = await self._text(method, path, body)
        if status != 200:
            raise HttpError(status, text)
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            raise FrontendError(f"{method} {path}: not JSON: {text[:200]!r}") from exc

    # ------------------------------------------------------------------ requests

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        check_generate_options(self.name, request_id, params, request_ids=True,
                               pass_through=RS_PASS_THROUGH)
        handle = StreamHandle(list(prompt_token_ids))
        request_tag = f"cw{self._tag}-{next(self._seq)}" if request_id is None else request_id
        external = f"cmpl-{request_tag}"
        self._external.add(external)
        body: dict[str, Any] = {"model": model_dir(), "prompt": list(prompt_token_ids),
                                "max_tokens": max_tokens, "stream": stream,
                                "return_token_ids": True, **completion_sampling(sampling)}
        if stop:
            body["stop"] = list(stop)
        body.update(params or {})  # OpenAI-body fields of the same name (vllm-rs serves them)
        headers = {"X-Request-Id": request_tag}
        if data_parallel_rank is not None:
            headers["X-data-parallel-rank"] = str(data_parallel_rank)
        entry = CompletionStream(handle, external, self._external)
        self._streams[id(handle)] = entry
        bound = self.scaled(HTTP_TIMEOUT)
        try:
            # Sent before returning, so requests reach the frontend in call order.
            entry.response = await asyncio.wait_for(
                self._client().open("POST", "/v1/completions", body, headers), bound)
        except asyncio.TimeoutError:  # first: from 3.11 it is an OSError too
            handle.finish("error", f"connection to vllm-rs failed: no response head within "
                                   f"{bound:.0f} s")
            return handle
        except CONNECTION_ERRORS as exc:
            handle.finish("error", f"connection to vllm-rs failed: {describe(exc)}")
            return handle
        entry.task = asyncio.ensure_future(entry.read(stream))
        return handle

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        """Cut every connection first (no awaits in between), then tidy up."""
        entries = [e for h in handles if (e := self._streams.get(id(h))) is not None]
        for entry in entries:
            if not entry.closed:
                entry.cut()
        for entry in entries:
            entry.close()
        for entry in entries:
            if not entry.handle.ended:
                entry.handle.dropped = True
                entry.handle.finish("abort")
            if entry.task is not None:
                entry.task.cancel()
        await asyncio.sleep(0)

    def _external_id(self, request_id: str) -> str:
        """Engine-facing `cmpl-X-<8 hex>` -> the external `cmpl-X` that /abort_requests takes.

        Ids that are not ours pass through unchanged, so the frontend's own handling of
        unknown ids is what gets graded.
        """
        if request_id in self._external:
            return request_id
        match = _ENGINE_ID.match(request_id)
        if match and match.group("external") in self._external:
            return match.group("external")
        return request_id

    async def abort(self, request_ids: Sequence[str]) -> None:
        if not self.release.abort_route:
            raise UnsupportedOperation(f"vllm-rs {self.release.version} has no /abort_requests "
                                       f"(from 0.24.0)")
        ids = list(dict.fromkeys(self._external_id(r) for r in request_ids))
        if not ids:
            return  # an empty list would abort EVERY request the frontend tracks
        await self._json("POST", "/abort_requests", {"request_ids": ids})

    # ------------------------------------------------------------------ utilities

    async def is_sleeping(self) -> bool:
        answer = await self._json("GET", "/is_sleeping")
        value = answer.get("is_sleeping") if isinstance(answer, dict) else None
        if not isinstance(value, bool):
            raise FrontendError(f"/is_sleeping: unexpected answer {answer!r}")
        return value

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        """`reset_connector` is the route's `reset_external` query parameter."""
        if (reason := self.release.missing_route("reset_prefix_cache")) is not None:
            raise UnsupportedOperation(reason)
        query = {k: "true" for k, v in (("reset_running_requests", reset_running_requests),
                                         ("reset_external", reset_connector)) if v}
        path = "/reset_prefix_cache" + (f"?{urlencode(query)}" if query else "")
        answer = await self._json("POST", path)
        value = answer.get("success") if isinstance(answer, dict) else None
        if not isinstance(value, bool):
            raise FrontendError(f"/reset_prefix_cache: unexpected answer {answer!r}")
        return value

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        """The dev-mode route that makes the frontend call `method` (vllm_rs_utilities);
        get/set_weight_version are reachable only through the gRPC Control service, add_lora /
        remove_lora through the LoRA adapter routes."""
        if (reason := self.release.missing_route(method)) is not None:
            raise UnsupportedOperation(reason)
        if method == "get_weight_version" and self.control is not None and not args:
            return await self.control.weight_version()
        if method == "set_weight_version" and self.control is not None:
            if len(args) != 1 or not isinstance(args[0], str):
                raise UnsupportedOperation(f"vllm-rs: UpdateWeightVersion carries one string, "
                                           f"not set_weight_version{tuple(args)!r}")
            await self.control.update_weight_version(args[0])
            return None
        if method == "add_lora":
            return await self._lora.add(args, self._text)
        if method == "remove_lora":
            return await self._lora.remove(args, self._text)
        route = route_for(method)
        path = route.path(args)
        body = route.body(args) if route.body is not None else None
        return answer_value(route, path, await self._json(route.method, path, body))

    async def observed_config(self) -> ObservedConfig:
        answer = await self._json("GET", "/v1/models")
        models = answer.get("data") if isinstance(answer, dict) else None
        lens = [m.get("max_model_len") for m in models or [] if isinstance(m, dict)]
        max_len = next((v for v in lens if isinstance(v, int)), None)
        if not self.release.grpc_control:  # block_size, num_gpu_blocks: not observable
            return ObservedConfig(max_model_len=max_len, block_size=None, num_gpu_blocks=None)
        if self.control is None:
            raise RuntimeError("vllm-rs driver is not started")
        info = await self.control.server_info()
        return ObservedConfig(max_model_len=max_len, block_size=info.kv_block_size,
                              num_gpu_blocks=info.total_kv_blocks)

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Close client connections, SIGTERM, bounded wait, SIGKILL, release everything."""
        entries = list(self._streams.values())
        self._streams.clear()
        for entry in entries:
            if not entry.closed:
                entry.cut()
        for entry in entries:
            entry.close()
            if entry.task is not None:
                entry.task.cancel()
        tasks = [e.task for e in entries if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_READERS_TIMEOUT)
        for entry in entries:
            entry.handle.finish("error", "driver shut down")
        http, self._http = self._http, None
        if http is not None:
            await http.close()
        await self.process.stop()


__all__ = ["VllmRsDriver"]
