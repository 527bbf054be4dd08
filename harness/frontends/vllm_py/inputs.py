"""vllm-py driver surfaces for inputs beyond a token prompt: streaming-input sessions and
tensors on the ADD.

* A session is AsyncLLM.generate() fed an async generator of `StreamingInput` (vLLM 0.33.0
  async_llm.py:438-456, :589-696): each item becomes a resumable ADD with the session's id,
  the generator's end becomes the final non-resumable ADD. `SessionFeed` is that generator,
  fed by the driver's continue/close calls.
* A tensor reaches the ADD through EngineCoreRequest.prompt_embeds: AsyncLLM.generate()
  accepts a prebuilt EngineCoreRequest (deprecated but supported in 0.33.0,
  async_llm.py:459-478), which its msgpack encoder sends with the tensor as an aux frame
  when it is large.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from harness.frontends.api import FrontendError, StreamHandle

_END = object()


class SessionFeed:
    """The async generator of StreamingInput one session's generate() call consumes."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    def push(self, prompt_token_ids: Sequence[int], sampling_params: Any = None) -> None:
        """One input segment; `sampling_params` (vLLM's SamplingParams) replaces the
        session's for this segment (None: the session's apply, as for the first)."""
        if self.closed:
            raise FrontendError("the session's input is closed")
        protocol = importlib.import_module("vllm.engine.protocol")
        inputs = importlib.import_module("vllm.inputs")
        prompt = inputs.TokensPrompt(prompt_token_ids=list(prompt_token_ids))
        self._queue.put_nowait(protocol.StreamingInput(prompt=prompt,
                                                       sampling_params=sampling_params))

    def close(self) -> None:
        if self.closed:
            raise FrontendError("the session's input is already closed")
        self.closed = True
        self._queue.put_nowait(_END)

    async def inputs(self) -> AsyncIterator[Any]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            yield item


async def consume_session(llm: Any, handle: StreamHandle, feed: SessionFeed, params: Any,
                          data_parallel_rank: int | None) -> None:
    """Iterate a session's generate(): segment boundaries come as unfinished outputs; the
    stream ends when generate() ends (input closed) or fails."""
    last_reason: str | None = None
    try:
        async for out in llm.generate(feed.inputs(), params, handle.request_id,
                                      data_parallel_rank=data_parallel_rank):
            completion = out.outputs[0] if out.outputs else None
            if completion is not None and (completion.token_ids or completion.text):
                handle.add_tokens(list(completion.token_ids), completion.text)
            if completion is not None and completion.finish_reason is not None:
                last_reason = str(completion.finish_reason)
            if out.finished:
                handle.finish(last_reason)
    except asyncio.CancelledError:
        handle.finish("abort")  # dropped: vLLM's generate() has sent the ABORT
        raise
    except Exception as exc:
        handle.finish("error", f"{type(exc).__name__}: {exc}")
    else:
        handle.finish(last_reason)


async def embeds_request(llm: Any, engine_input: Any, params: Any, request_id: str,
                         rows: Sequence[Sequence[float]], data_parallel_rank: int | None
                         ) -> Any:
    """The EngineCoreRequest of a rendered token prompt, with `rows` as prompt_embeds."""
    torch = importlib.import_module("torch")
    request = llm.input_processor.process_inputs(
        request_id, engine_input, params, supported_tasks=await llm.get_supported_tasks(),
        data_parallel_rank=data_parallel_rank)
    request.prompt_embeds = torch.tensor([list(r) for r in rows], dtype=torch.float32)
    return request
