"""Mutant reference cores for what the ADD carries for the engine's sampler and scheduler
(conformance/test_streaming_sampling.py) and for the text of an engine STOP
(conformance/test_streaming.py, streaming.text.stop_finish_last_token_silent_*): one
realistic port bug each, none of them caught by a case that asks for greedy decoding only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import msgspec

from harness.frontends.api import GREEDY, Sampling, StreamHandle
from harness.frontends.mutants_edges_d import AddRewritten
from harness.frontends.reference.core import (
    InvalidRequest,
    ReferenceFrontendCore,
    RequestState,
    Send,
)
from harness.protocol.vocab import EOS_TOKEN_ID, detokenize
from harness.protocol.wire import WireCodec
from harness.protocol.wire import messages as m


class SamplingValuesDropped(ReferenceFrontendCore):
    """A port grown from greedy requests copies only what those needed (temperature, the
    EOS rule, max_tokens): top_p, top_k, min_p and seed stay at the struct's defaults."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        kept = replace(GREEDY, temperature=sampling.temperature,
                       ignore_eos=sampling.ignore_eos, min_tokens=sampling.min_tokens,
                       stop_token_ids=sampling.stop_token_ids)
        return super().sampling_params(max_tokens, kept, extra_args)


class SeedZeroDropped(ReferenceFrontendCore):
    """`seed = asked.seed or None`: a seed of 0 is taken for "no seed" and the engine
    samples unseeded (a truthiness test on an optional int)."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        return super().sampling_params(max_tokens, replace(sampling, seed=sampling.seed or None),
                                       extra_args)


class SamplingOfFirstRequest(ReferenceFrontendCore):
    """The SamplingParams of the first non-greedy request is built once and shared: every
    later non-greedy request goes out with the first one's values."""

    first: Sampling | None = None

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        if sampling != GREEDY:
            self.first = self.first or sampling
            sampling = self.first
        return super().sampling_params(max_tokens, sampling, extra_args)


class IgnoreEosStillStops(ReferenceFrontendCore):
    """ignore_eos is copied, but the model's EOS id is set as _eos_token_id all the same:
    the engine still stops at end of sequence."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        built = super().sampling_params(max_tokens, sampling, extra_args)
        return msgspec.structs.replace(built, _eos_token_id=EOS_TOKEN_ID)


class StopIdsNotAmongAllStop(ReferenceFrontendCore):
    """The client's stop token ids go into stop_token_ids only, not _all_stop_token_ids:
    the engine's min_tokens rule then lets them through before min_tokens."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        built = super().sampling_params(max_tokens, sampling, extra_args)
        return msgspec.structs.replace(built, _all_stop_token_ids={EOS_TOKEN_ID})


class MinTokensDropped(ReferenceFrontendCore):
    """min_tokens never reaches the ADD (0): the engine may stop before it."""

    def sampling_params(self, max_tokens: int, sampling: Sampling,
                        extra_args: dict[str, Any] | None = None) -> m.SamplingParams:
        return super().sampling_params(max_tokens, replace(sampling, min_tokens=0), extra_args)


class ContinuationGreedy(ReferenceFrontendCore):
    """A session's continuations are built greedy (with the EOS rule right), whatever the
    client asked when it opened the session."""

    def session_sampling(self, max_tokens: int, sampling: Sampling) -> m.SamplingParams:
        return self.sampling_params(max_tokens, GREEDY)


class PlainAddsResumable(AddRewritten):
    """Every ADD is marked resumable (a port that always sets the flag its streaming-input
    path needs): a real engine keeps each finished request waiting for more input."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, resumable=True)


class ArrivalTimeMilliseconds(AddRewritten):
    """arrival_time in milliseconds (a JavaScript-style clock): the scheduler's
    (priority, arrival_time) order puts this frontend's requests behind every other's."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, arrival_time=request.arrival_time * 1000)


class ArrivalTimeMonotonic(AddRewritten):
    """arrival_time from the monotonic clock (seconds since boot), not Unix time."""

    def rewrite(self, request: m.EngineCoreRequest) -> m.EngineCoreRequest:
        return msgspec.structs.replace(request, arrival_time=time.monotonic())


class StopTokenTextShown(ReferenceFrontendCore):
    """Every token's text is shown, the stop token of an engine STOP too (the text is
    the tokens' texts joined, with no exception for the terminal stop token)."""

    def token_text(self, output: m.EngineCoreOutput, index: int) -> str:
        return detokenize([output.new_token_ids[index]])


class ContinuationFirstMaxTokens(ReferenceFrontendCore):
    """Every continuation carries the max_tokens the session was opened with, not its own
    (a port that builds a session's SamplingParams once)."""

    def __init__(self, ranks: Sequence[int], *, codec: WireCodec, client_index: int = 0
                 ) -> None:
        super().__init__(ranks, codec=codec, client_index=client_index)
        self.first_max_tokens: dict[str, int] = {}

    def open_session(self, prompt: Sequence[int], max_tokens: int, *,
                     data_parallel_rank: int | None = None,
                     sampling: Sampling = GREEDY) -> tuple[StreamHandle, Send]:
        handle, send = super().open_session(prompt, max_tokens,
                                            data_parallel_rank=data_parallel_rank,
                                            sampling=sampling)
        if handle.request_id is not None:
            self.first_max_tokens[handle.request_id] = max_tokens
        return handle, send

    def session_add(self, rid: str, prompt: Sequence[int], max_tokens: int, *,
                    resumable: bool) -> Send:
        first = self.first_max_tokens.get(rid, max_tokens) if resumable else max_tokens
        return super().session_add(rid, prompt, first, resumable=resumable)


class StopMinTokensByMatchStart(ReferenceFrontendCore):
    """min_tokens read as "a stop string must START after the first min_tokens tokens":
    a match that begins inside them and completes later is missed (vLLM checks where the
    match ENDS, detokenizer.py:136-139)."""

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        return text.find(stop, floor)


class StopMinTokensOffByOne(ReferenceFrontendCore):
    """Stop strings checked from token min_tokens on instead of min_tokens + 1 (`>=` for
    `>`): the last token of the client's minimum can end the request."""

    def stop_checked(self, state: RequestState) -> bool:
        count = len(state.handle.tokens) + 1
        if count + 1 == state.min_tokens:
            state.stop_floor = len(state.handle.text) + len(state.held_text)
        return count >= state.min_tokens


class PromptLimitOfLargestEngine(ReferenceFrontendCore):
    """A prompt's length checked against the largest max_model_len an engine reported,
    not the agreed minimum: a prompt only the larger engines could hold is sent."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        largest = max((e.ready.max_model_len for e in self.engines.values()
                       if e.ready is not None), default=None)
        agreed, self.config.max_model_len = self.config.max_model_len, largest
        try:
            super().check_request(prompt, max_tokens, sampling)
        finally:
            self.config.max_model_len = agreed


class PromptFillingContextSent(ReferenceFrontendCore):
    """A prompt exactly max_model_len long sent (`>` for `>=`): it leaves no room for the
    one token a generate request must produce (corewire's own reference had this bug)."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        limit = self.config.max_model_len
        if limit is not None and len(prompt) == limit:
            prompt = prompt[:-1]  # checked as if one token shorter
        super().check_request(prompt, max_tokens, sampling)


class MinTokensEqualMaxRefused(ReferenceFrontendCore):
    """min_tokens equal to max_tokens refused as if it were above it (`>=` for `>`)."""

    def check_request(self, prompt: Sequence[int], max_tokens: int,
                      sampling: Sampling) -> None:
        if sampling.min_tokens and sampling.min_tokens >= max_tokens:
            raise InvalidRequest(f"min_tokens {sampling.min_tokens} not below max_tokens "
                                 f"{max_tokens}")
        super().check_request(prompt, max_tokens, sampling)
