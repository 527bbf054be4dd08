"""`FrontendDriver` for vLLM 0.33.0's Python frontend: `AsyncLLM`, in-process.

`AsyncLLM` is what `vllm serve` puts behind its HTTP routes, so this driver calls exactly the
public API those routes call and lets vLLM's own client code speak the wire protocol:

* Startup: `AsyncLLM(vllm_config, executor_class=None, log_stats=False,
  client_addresses={"input_address", "output_address", "input_listener", "output_listener"
  [, "stats_update_address"]})`: the ROUTER/PULL pair adopts AF_UNIX listeners we bound first
  (what `vllm serve --api-server-count N` hands its API servers), so the engines connect at once;
  no handshake socket is involved. The constructor blocks until every engine identity has sent
  its ready frame, applying each to the config (max_model_len = min, num_gpu_blocks = sum,
  block_size = last). DP=1 gives `AsyncMPClient`, DP>1 `DPLBAsyncMPClient` (which subscribes to
  the mock coordinator's XPUB). Cases that need the frontend to own HELLO / INIT / READY
  (`group.handshake`) build it without client_addresses instead (vllm_py_handshake.py).
  The constructor runs on the event loop, as in `vllm serve`, so
  the output tasks start eagerly; its blocking ready wait is bounded by the startup timeout
  through vLLM's own knob (VLLM_ENGINE_READY_TIMEOUT_S, read once at import by `core_client`,
  hence set on that module for the duration of the constructor). Then, like `vllm serve`,
  `reset_mm_cache()` and `get_supported_tasks()` are called once.
* `generate()`: `AsyncLLM.generate(TokensPrompt rendered by llm.renderer, SamplingParams(the
  client's sampling, DELTA),
  request_id, data_parallel_rank=...)` consumed by a task that fills the `StreamHandle`.
  AsyncLLM appends `-<8 hex>` to the id on the wire; `handle.request_id` is the id we passed.
* `drop()`: cancels consumer tasks, i.e. the client-disconnect path of `vllm serve`
  (`generate()` catches CancelledError and calls `abort(internal=True)`).
* `abort()`: cases pass engine-side ids, so `AsyncLLM.abort(ids, internal=True)`; unknown ids
  are skipped by vLLM's output processor and an empty list is never sent.
* `is_sleeping()` / `reset_prefix_cache()` / `call_utility()`: the AsyncLLM methods, called
  as `vllm serve`'s routes call them: directly, errored or not (the serving layer refuses only
  generation once `AsyncLLM.errored`; `/is_sleeping` and the other utility routes call the
  engine client as it is, vllm/entrypoints/serve/dev/sleep/api_router.py:58-61). Their failure is
  vLLM's exception text, nothing added. The driver's own bound (UTILITY_TIMEOUT) is longer
  than any case bound, so a frontend that hangs shows up as the case's TIMEOUT, never as a
  driver-made error.

vLLM's own ipc endpoints (the DP coordinator's) are made in the driver's private ipc dir,
removed at teardown (vllm_py_env.py: VLLM_RPC_BASE_PATH, set for the driver's lifetime).

Teardown: `AsyncLLM.shutdown()`, then consumer tasks are cancelled (after shutdown, so no
teardown ABORTs reach the wire), vLLM's background tasks are awaited, and the ZMQ context that
vLLM leaves to the garbage collector is terminated (bounded), so nothing outlives a case.

vLLM is imported lazily (about 10 s, once per process) and one VllmConfig is built per DP size
and deep-copied per case (about 1 ms), because AsyncLLM mutates the config it is given
(loader.py); how vLLM's exceptions and log records are reported is reporting.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import itertools
import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.frontends.api import (
    ALL_CAPABILITIES,
    GREEDY,
    PASS_THROUGH_FIELDS,
    TENSOR_FIELDS,
    Capability,
    FrontendDriver,
    FrontendError,
    ObservedConfig,
    Sampling,
    StartupError,
    StreamHandle,
    UnsupportedOperation,
    check_generate_options,
)
from harness.frontends.vllm_py import handshake
from harness.frontends.vllm_py.env import hold_rpc_base, release_rpc_base
from harness.frontends.vllm_py.forkserver import coordinator_context
from harness.frontends.vllm_py.inputs import SessionFeed, consume_session, embeds_request
from harness.frontends.vllm_py.loader import (
    _base_config,
    _listen,
    _load_vllm,
    _Vllm,
    client_sampling,
)
from harness.frontends.vllm_py.reporting import _describe, _LogTail
from harness.frontends.vllm_py.utilities import async_llm_call, normalise
from harness.protocol.transport.endpoints import PrivateIpcDir

if TYPE_CHECKING:
    from harness.frontends.api import EngineSide

UTILITY_TIMEOUT = 60.0  # per call, before scaling: longer than any case bound (see docstring)
ABORT_TIMEOUT = 10.0  # an abort only sends frames; it never waits for an engine
DROP_TIMEOUT = 10.0  # for cancelled consumers to unwind (each sends its ABORT)
TEARDOWN_TIMEOUT = 5.0  # for vLLM's tasks and the ZMQ context after shutdown
DIAGNOSTIC_LINES = 25


class VllmPyDriver(FrontendDriver):
    """Drives vLLM 0.33.0's AsyncLLM in-process against the mock engine group."""

    name = "vllm-py"
    # Everything is observable in-process: the config AsyncLLM derived, per-request ranks,
    # stop strings (detokenized with the tiny fixture tokenizer), errors and engine death.
    capabilities: frozenset[Capability] = ALL_CAPABILITIES

    def __init__(self, *, preload: bool = True) -> None:
        self._llm: Any = None
        self._ipc: PrivateIpcDir | None = None
        self._listeners: list[socket.socket] = []
        self._handshake: handshake.HandshakeStartup | None = None
        self._blocked_at = ""  # where that startup was when the driver shut it down
        self._streams: dict[int, tuple[StreamHandle, asyncio.Task[None]]] = {}
        self._feeds: dict[int, SessionFeed] = {}  # streaming-input sessions by handle
        self._session_sampling: dict[int, Sampling] = {}  # the client's, by session handle
        self._ids = itertools.count()
        self._log = _LogTail()
        self._log_attached = False
        self._state: str = ""
        self._closed = False
        if preload:
            # Import vLLM, warm the DP=1 config and start the DP coordinator's fork server
            # here, outside any case's time bound (the plugin builds the driver before it
            # starts the case clock).
            with contextlib.suppress(Exception):  # start() reports import errors, graded
                _base_config(_load_vllm(), 1)
                coordinator_context()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, group: EngineSide, timeout: float) -> None:
        if self._llm is not None or self._closed:
            raise RuntimeError("a VllmPyDriver starts once")
        deadline = time.monotonic() + timeout
        if group.engines[0].rank != 0:
            # AsyncLLM's identities are engine_ranks_managed = 0..dp_size-1 of its own config
            # (core_client.py:752-755); a frontend owning ranks from a nonzero start index is
            # an external/hybrid-LB API server per rank, a config this driver does not build.
            raise UnsupportedOperation(
                f"engines start at rank {group.engines[0].rank}: this driver builds AsyncLLM "
                f"for ranks 0..N-1 only (external/hybrid-LB configs are not built)")
        vllm = _load_vllm()
        # Every ipc socket of this frontend, vLLM's own included, in a private dir removed at
        # shutdown (vllm_py_env: VLLM_RPC_BASE_PATH).
        self._ipc = ipc = PrivateIpcDir()
        hold_rpc_base(ipc.path)
        if group.handshake:  # AsyncLLM owns HELLO / INIT / READY (vllm_py_handshake.py)
            self._attach_log()
            self._handshake = await handshake.start_owner(vllm, group, timeout,
                                                         self.timescale)
            self._llm = await self._handshake.result(timeout)
            handshake.start_output_tasks(self._llm)
            await self._serve_steps(deadline, timeout)
            return
        dp_size = len(group.engines)
        try:
            config = copy.deepcopy(_base_config(vllm, dp_size))
        except Exception as exc:
            raise StartupError(f"could not build vLLM's config for {dp_size} engine(s): "
                               f"{_describe(exc)}") from exc
        if dp_size > 1 and group.stats_address is None:
            raise StartupError("DP>1 needs a DP coordinator stats address; the engine group "
                               "has none")
        inputs, outputs = ipc.address("in"), ipc.address("out")
        # Pre-bound listeners, as `vllm serve --api-server-count N` hands its API servers:
        # engines connect at once instead of retrying until AsyncLLM binds (ZMQ's 100 ms
        # reconnect interval, most of a case's startup otherwise).
        try:
            self._listeners = [_listen(inputs), _listen(outputs)]
        except OSError as exc:
            raise StartupError(f"could not bind the engine listeners: {exc}") from exc
        addresses: dict[str, Any] = {
            "input_address": inputs, "output_address": outputs,
            "input_listener": self._listeners[0], "output_listener": self._listeners[1]}
        if dp_size > 1:
            addresses["stats_update_address"] = group.stats_address
        self._attach_log()
        group.start_bootstrapped([inputs], [outputs])
        self._llm = self._construct(vllm, config, addresses, deadline)
        await self._serve_steps(deadline, timeout)

    async def _serve_steps(self, deadline: float, timeout: float) -> None:
        """What `vllm serve` does before it serves: reset_mm_cache(), get_supported_tasks()."""
        for step in ("reset_mm_cache", "get_supported_tasks"):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(getattr(self._llm, step)(), remaining)
            except (asyncio.TimeoutError, TimeoutError) as exc:
                raise StartupError(f"AsyncLLM.{step}() got no answer within {timeout:.1f}s of "
                                   f"startup") from exc
            except Exception as exc:
                raise StartupError(f"AsyncLLM.{step}() failed at startup: {_describe(exc)}"
                                   ) from exc

    def _construct(self, vllm: _Vllm, config: Any, addresses: dict[str, Any],
                   deadline: float) -> Any:
        """Build AsyncLLM on the loop (as `vllm serve` does); its ready wait is bounded."""
        knob = vllm.core_client
        saved = knob.VLLM_ENGINE_READY_TIMEOUT_S
        knob.VLLM_ENGINE_READY_TIMEOUT_S = max(0.05, deadline - time.monotonic())
        failure: str | None = None
        try:
            return vllm.async_llm(config, executor_class=None, log_stats=False,
                                  log_requests=False, client_addresses=addresses)
        except Exception as exc:
            failure = f"AsyncLLM did not start: {_describe(exc)}"
        finally:
            knob.VLLM_ENGINE_READY_TIMEOUT_S = saved
        # The half-built client closed its sockets; collecting it now terminates its ZMQ
        # context (and io threads) instead of leaving that to a later GC pass.
        gc.collect(1)  # young generations suffice (~1 ms; a full pass costs ~0.3 s)
        raise StartupError(failure)

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []
        if self._handshake is not None:  # a handshake-mode startup the case left running
            self._blocked_at = self._handshake.blocked_at()  # evidence, before it is aborted
            problem = await self._handshake.close()
            if problem:
                problems.append(problem)
            if self._llm is None:
                self._llm = self._handshake.orphan()
        llm, self._llm = self._llm, None
        vllm_tasks: list[asyncio.Task[Any]] = []
        if llm is not None:
            self._state = self._describe_state(llm)
            resources = getattr(llm.engine_core, "resources", None)
            for task in (getattr(llm, "output_handler", None),
                         getattr(resources, "output_queue_task", None),
                         getattr(resources, "stats_update_task", None)):
                if isinstance(task, asyncio.Task):
                    vllm_tasks.append(task)
            try:
                llm.shutdown()  # no engine processes here: closes sockets, cancels tasks
            except Exception as exc:
                problems.append(f"AsyncLLM.shutdown(): {_describe(exc)}")
        consumers = [task for _h, task in self._streams.values() if not task.done()]
        for task in consumers:
            task.cancel()  # after shutdown: the engine is marked dead, so no ABORT is sent
        pending = [t for t in (*consumers, *vllm_tasks) if not t.done()]
        if pending:
            _done, stuck = await asyncio.wait(pending, timeout=self.scaled(TEARDOWN_TIMEOUT))
            if stuck:
                problems.append(f"{len(stuck)} task(s) still running after shutdown: "
                                f"{sorted(t.get_name() for t in stuck)}")
        if llm is not None:
            problem = await self._terminate_context(llm)
            if problem:
                problems.append(problem)
        self._detach_log()
        for listener in self._listeners:
            listener.close()  # a no-op once AsyncLLM adopted (detached) it
        self._listeners = []
        if self._ipc is not None:
            release_rpc_base(self._ipc.path)
            self._ipc.cleanup()
            self._ipc = None
        if problems:
            raise FrontendError("; ".join(problems))

    async def _terminate_context(self, llm: Any) -> str | None:
        """Terminate the ZMQ context vLLM's client leaves to the GC (bounded)."""
        client = llm.engine_core
        resources = getattr(client, "resources", None)
        sync_ctx = getattr(resources, "ctx", None)
        async_ctx = getattr(client, "ctx", None)
        if sync_ctx is None or getattr(sync_ctx, "closed", True):
            return None
        leftovers = [s for s in list(getattr(async_ctx, "_sockets", None) or ())
                     if not s.closed]
        for sock in leftovers:  # vLLM closes all of them; anything left would block term()
            sock.close(linger=0)
        finished = threading.Event()

        def term() -> None:
            with contextlib.suppress(Exception):
                sync_ctx.term()  # the owner: terminating the shadow would double-free
            finished.set()

        # A plain daemon thread: a stuck term() must not block the loop's executor shutdown.
        thread = threading.Thread(target=term, name="vllm-py-zmq-term", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.scaled(TEARDOWN_TIMEOUT)
        while not finished.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if not finished.is_set():
            return "vLLM's ZMQ context did not terminate (a socket is still open)"
        thread.join(1.0)  # it has finished its work; reap it so no thread outlives shutdown
        if leftovers:
            return f"closed {len(leftovers)} socket(s) vLLM left open"
        return None

    # ------------------------------------------------------------------ requests

    def _require(self) -> Any:
        if self._llm is None:
            raise FrontendError("the vllm-py frontend is not running")
        return self._llm

    async def generate(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                       stream: bool = True, data_parallel_rank: int | None = None,
                       stop: Sequence[str] | None = None, request_id: str | None = None,
                       params: Mapping[str, Any] | None = None,
                       sampling: Sampling | None = None) -> StreamHandle:
        llm = self._require()
        vllm = _load_vllm()
        check_generate_options(self.name, request_id, params, request_ids=True,
                               pass_through=PASS_THROUGH_FIELDS + TENSOR_FIELDS)
        handle = StreamHandle(list(prompt_token_ids))
        handle.request_id = f"cw-{next(self._ids)}" if request_id is None else request_id
        kind = vllm.output_kind.DELTA if stream else vllm.output_kind.FINAL_ONLY
        extra = {k: v for k, v in (params or {}).items()
                 if k not in ("cache_salt", *TENSOR_FIELDS)}
        prompt_fields: dict[str, Any] = {"prompt_token_ids": list(prompt_token_ids)}
        if params and "cache_salt" in params:
            prompt_fields["cache_salt"] = params["cache_salt"]
        try:
            params_of = client_sampling(vllm, sampling or GREEDY, max_tokens=max_tokens,
                                        stop=list(stop) if stop else None,
                                        output_kind=kind, extra_args=extra or None)
            # The token-in path of vLLM's servers: render a TokensPrompt, pass the EngineInput.
            (engine_input,) = llm.renderer.render_cmpl([vllm.tokens_prompt(**prompt_fields)])
            if params and "prompt_embeds" in params:
                engine_input = await embeds_request(llm, engine_input, params_of,
                                                    handle.request_id, params["prompt_embeds"],
                                                    data_parallel_rank)
        except Exception as exc:
            raise FrontendError(f"request rejected before submission: {_describe(exc)}"
                                ) from exc
        task = asyncio.create_task(
            self._consume(llm, handle, engine_input, params_of, data_parallel_rank),
            name=f"vllm-py-{handle.request_id}")
        self._streams[id(handle)] = (handle, task)
        await asyncio.sleep(0)  # let the task submit the ADD before we return
        return handle

    async def _consume(self, llm: Any, handle: StreamHandle, engine_input: Any, params: Any,
                       data_parallel_rank: int | None) -> None:
        """Iterate AsyncLLM.generate() like an HTTP handler does, filling the handle."""
        try:
            async for out in llm.generate(engine_input, params, handle.request_id,
                                          data_parallel_rank=data_parallel_rank):
                completion = out.outputs[0] if out.outputs else None
                if completion is not None and (completion.token_ids or completion.text):
                    handle.add_tokens(list(completion.token_ids), completion.text)
                if out.finished:
                    reason = completion.finish_reason if completion is not None else None
                    handle.finish(str(reason) if reason is not None else None)
        except asyncio.CancelledError:
            handle.finish("abort")  # dropped: vLLM's generate() has sent the ABORT
            raise
        except Exception as exc:
            handle.finish("error", _describe(exc))
        else:
            handle.finish("error", "AsyncLLM.generate() ended without a finished output")

    async def open_session(self, prompt_token_ids: Sequence[int], max_tokens: int, *,
                           data_parallel_rank: int | None = None,
                           sampling: Sampling | None = None) -> StreamHandle:
        llm = self._require()
        vllm = _load_vllm()
        handle = StreamHandle(list(prompt_token_ids), request_id=f"cw-{next(self._ids)}")
        feed = SessionFeed()
        feed.push(prompt_token_ids)
        try:
            params_of = client_sampling(vllm, sampling or GREEDY, max_tokens=max_tokens,
                                        output_kind=vllm.output_kind.DELTA)
        except Exception as exc:
            raise FrontendError(f"session rejected before submission: {_describe(exc)}"
                                ) from exc
        task = asyncio.create_task(consume_session(llm, handle, feed, params_of,
                                                   data_parallel_rank),
                                   name=f"vllm-py-session-{handle.request_id}")
        self._streams[id(handle)] = (handle, task)
        self._feeds[id(handle)] = feed
        self._session_sampling[id(handle)] = sampling or GREEDY
        await asyncio.sleep(0)
        return handle

    def _feed(self, handle: StreamHandle) -> SessionFeed:
        feed = self._feeds.get(id(handle))
        if feed is None:
            raise FrontendError("not a session opened by this driver")
        return feed

    async def continue_session(self, handle: StreamHandle, prompt_token_ids: Sequence[int],
                               max_tokens: int) -> None:
        # The segment's own SamplingParams: the session's sampling with this max_tokens
        # (AsyncLLM takes a chunk's sampling_params over the call's, async_llm.py:650-654).
        vllm = _load_vllm()
        params = client_sampling(vllm, self._session_sampling.get(id(handle), GREEDY),
                                 max_tokens=max_tokens, output_kind=vllm.output_kind.DELTA)
        self._feed(handle).push(prompt_token_ids, params)
        await asyncio.sleep(0)

    async def close_session(self, handle: StreamHandle) -> None:
        self._feed(handle).close()
        await asyncio.sleep(0)

    async def drop(self, handles: Sequence[StreamHandle]) -> None:
        cancelled: list[asyncio.Task[None]] = []
        for handle in handles:
            entry = self._streams.get(id(handle))
            if entry is None or entry[0] is not handle or entry[1].done():
                continue
            if not handle.ended:
                handle.dropped = True
            entry[1].cancel()
            cancelled.append(entry[1])
        if cancelled:
            _done, stuck = await asyncio.wait(cancelled, timeout=self.scaled(DROP_TIMEOUT))
            if stuck:
                raise FrontendError(f"{len(stuck)} dropped stream(s) did not unwind within "
                                    f"{self.scaled(DROP_TIMEOUT):.0f}s")

    async def abort(self, request_ids: Sequence[str]) -> None:
        llm = self._require()
        ids = [str(rid) for rid in request_ids]
        if not ids:
            return
        try:
            # Engine-side ids: internal=True looks them up as AsyncLLM's own (suffixed) ids.
            await asyncio.wait_for(llm.abort(ids, internal=True), self.scaled(ABORT_TIMEOUT))
        except (asyncio.TimeoutError, TimeoutError):
            raise
        except Exception as exc:
            raise FrontendError(f"AsyncLLM.abort(): {_describe(exc)}") from exc

    # ------------------------------------------------------------------ utilities

    async def _utility(self, what: str, call: Any) -> Any:
        self._require()
        try:
            return await asyncio.wait_for(call, self.scaled(UTILITY_TIMEOUT))
        except (asyncio.TimeoutError, TimeoutError) as exc:
            # Not a FrontendError: a hang must not pass for a bounded failure.
            raise TimeoutError(f"{what}: AsyncLLM gave no answer within "
                               f"{self.scaled(UTILITY_TIMEOUT):.0f}s") from exc
        except Exception as exc:
            # vLLM's exception as the caller gets it: no method name or text of ours added.
            raise FrontendError(_describe(exc)) from exc

    async def is_sleeping(self) -> bool:
        llm = self._require()
        return bool(await self._utility("AsyncLLM.is_sleeping()", llm.is_sleeping()))

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        llm = self._require()
        return bool(await self._utility(
            "AsyncLLM.reset_prefix_cache()",
            llm.reset_prefix_cache(reset_running_requests, reset_connector)))

    async def call_utility(self, method: str, args: Sequence[Any]) -> Any:
        """The AsyncLLM method a user calls for `method` (vllm_py_utilities)."""
        what, call = async_llm_call(self._require(), method, args)
        return normalise(await self._utility(what, call))

    async def observed_config(self) -> ObservedConfig:
        config = self._require().vllm_config
        return ObservedConfig(config.model_config.max_model_len, config.cache_config.block_size,
                              config.cache_config.num_gpu_blocks)

    # ------------------------------------------------------------------ diagnostics

    def _attach_log(self) -> None:
        if not self._log_attached:
            logging.getLogger("vllm").addHandler(self._log)
            self._log_attached = True

    def _detach_log(self) -> None:
        if self._log_attached:
            logging.getLogger("vllm").removeHandler(self._log)
            self._log_attached = False

    @staticmethod
    def _describe_state(llm: Any) -> str:
        """AsyncLLM's health at teardown (why a case hung is usually visible here)."""
        client = llm.engine_core
        resources = getattr(client, "resources", None)
        pending = getattr(client, "utility_results", None) or {}
        reader = getattr(resources, "output_queue_task", None)
        reader_state = "not started" if reader is None else (
            "running" if not reader.done() else "ended")
        return (f"AsyncLLM state at teardown: client={type(client).__name__} "
                f"errored={llm.errored} engine_dead={getattr(resources, 'engine_dead', '?')} "
                f"output_reader={reader_state} pending_utility_calls={len(pending)} "
                f"unfinished_requests={llm.get_num_unfinished_requests()}")

    def diagnostics(self) -> str:
        lines = [self._state] if self._state else []
        lines.extend(list(self._log.lines)[-DIAGNOSTIC_LINES:])
        where = self._handshake.blocked_at() if self._handshake is not None else ""
        where = where or self._blocked_at
        if where:  # a handshake-mode construction that neither served nor failed
            lines.append(f"AsyncLLM's constructor was still running, at:\n{where}")
        return "\n".join(lines)
