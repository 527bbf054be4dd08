"""Per-request failures end only their own stream (seed PR #40364 outcomes,
protocol-python.md §10).

A per-request ERROR (e.g. a KV-load failure under policy "fail", or a RequestError payload
such as "engine_paused") ends only that stream with an error, also after some tokens; its
neighbours and later requests are unaffected. The "recompute" outcome (no output for a
while, then the complete output) reaches the user unchanged.
"""

from __future__ import annotations

from harness.cases.authoring import (
    Capability,
    CaseContext,
    Emit,
    EngineScript,
    Finish,
    Level,
    both,
    by_prompt,
    case,
    engine,
    messages,
    prompt,
    py,
    rs,
    stream,
)

ERROR_FINISH = both(
    py("vllm/entrypoints/generate/base/serving.py:202", 'if finish_reason == "error":'),
    py("vllm/v1/request.py:409", "RequestStatus.FINISHED_ERROR: FinishReason.ERROR,"),
    rs("rust/src/llm/src/output.rs:156",
       "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
    rs("rust/src/server/src/routes/openai/completions.rs:499",
       "FinishReason::Error(error) => Err(engine_error(error.as_deref())),"),
    engine("vllm/v1/core/sched/scheduler.py:2557",
           "if failed_kv_load_req_ids and not self.recompute_kv_load_failures:"),
    engine("vllm/v1/core/sched/scheduler.py:2566", "error_req_ids, RequestStatus.FINISHED_ERROR"),
)
ERROR_PAYLOAD = both(
    py("vllm/v1/engine/output_processor.py:765",
       "if error is not None and req_state.queue is not None:"),
    py("vllm/v1/engine/output_processor.py:767", "req_state.queue.put(error.to_exception())"),
    rs("rust/src/llm/src/output.rs:156",
       "EngineCoreFinishReason::Error => FinishReason::Error(error),"),
    rs("rust/src/server/src/routes/openai/chat_completions.rs:837",
       "FinishReason::Error(error) => Err(engine_error(error.as_deref())),"),
    engine("vllm/v1/engine/core.py:1805", 'code="engine_paused",'),
    engine("vllm/v1/engine/core.py:1810",
           "[request.request_id], request.client_index, FinishReason.ERROR, error"),
)
RECOMPUTE = both(
    py("vllm/v1/engine/async_llm.py:880", "outputs = await engine_core.get_output_async()"),
    py("vllm/v1/engine/output_processor.py:779",
       "new_token_ids = engine_core_output.new_token_ids"),
    rs("rust/src/engine-core-client/src/client/imp.rs:464",
       "for output in inner.send_outputs(outputs) {"),
    engine("vllm/v1/core/sched/scheduler.py:187",
           'self.recompute_kv_load_failures = kv_load_failure_policy == "recompute"'),
    engine("vllm/v1/core/sched/scheduler.py:3699", "request.num_computed_tokens = 0"),
)
ERR = [Capability.GENERATE, Capability.REQUEST_ERRORS]
F = messages.FinishReason


async def _run_three(ctx: CaseContext, failing: Finish) -> None:
    """Three requests; the middle one ends with `failing`; neighbours and a later one work."""
    p_fail = prompt(1)
    script = EngineScript(rules=[by_prompt(p_fail, [failing])])
    await ctx.start([script])
    handles = [await ctx.driver.generate(p, 4) for p in (prompt(0), p_fail, prompt(2))]
    for h in handles:
        await h.wait(ctx.t(3))
    bad = handles[1]
    ctx.require(bad.finish_reason == "error" or bad.error is not None,
                expected="the failed request ends with an error",
                observed=f"finish={bad.finish_reason} error={bad.error} tokens={bad.tokens}")
    for h in (handles[0], handles[2]):
        ctx.require(h.finish_reason == "length" and len(h.tokens) == 4,
                    expected="neighbours complete with 4 tokens",
                    observed=f"finish={h.finish_reason} tokens={h.tokens} error={h.error}")
    later = await ctx.driver.generate(prompt(3), 2)
    await later.wait(ctx.t(3))
    ctx.require(later.finish_reason == "length", expected="a later request still works",
                observed=f"finish={later.finish_reason} error={later.error}")


@case("failure.kv_load.fail_policy", Level.MUST,
      "A request finished with ERROR and no tokens (KV-load failure, policy 'fail') ends "
      "that stream with an error; its neighbours and later requests are unaffected.",
      grounds=ERROR_FINISH, needs=ERR)
async def kv_fail_policy(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR))


@case("failure.request_error.with_payload", Level.MUST,
      "A request finished with ERROR and a RequestError payload ends only that stream.",
      grounds=ERROR_PAYLOAD, needs=ERR)
async def request_error_payload(ctx: CaseContext) -> None:
    await _run_three(ctx, Finish(F.ERROR, error=messages.RequestError(
        "engine_paused", "Generation is paused. Please retry after it resumes.", True)))


@case("failure.request_error.after_tokens", Level.MUST,
      "A request that fails after streaming some tokens ends with an error, not success.",
      grounds=ERROR_FINISH, needs=ERR)
async def error_after_tokens(ctx: CaseContext) -> None:
    p = prompt(0)
    await ctx.start([EngineScript(rules=[by_prompt(p, [*stream([100, 101])[:1],
                                                      Finish(F.ERROR, delay=0.05)])])])
    handle = await ctx.driver.generate(p, 10)
    await handle.wait(ctx.t(3))
    ctx.require(handle.finish_reason == "error" or handle.error is not None,
                expected="an error ending", observed=f"{handle.finish_reason} {handle.tokens}")


@case("failure.kv_load.recompute_policy", Level.MUST,
      "A request delayed by recompute (no output for a while, then complete output) "
      "reaches the user unchanged.", grounds=RECOMPUTE, needs=[Capability.GENERATE])
async def recompute(ctx: CaseContext) -> None:
    p = prompt(0)
    late = [*stream([300, 301, 302])]
    first = late[0]
    assert isinstance(first, Emit)
    late[0] = Emit(first.tokens, 0.8)  # the first token only after 0.8 s
    await ctx.start([EngineScript(rules=[by_prompt(p, late)])])
    handle = await ctx.driver.generate(p, 3)
    other = await ctx.driver.generate(prompt(1), 3)
    await other.wait(ctx.t(3))
    await handle.wait(ctx.t(5))
    ctx.require(handle.tokens == [300, 301, 302] and handle.finish_reason == "length",
                expected="tokens [300, 301, 302], finish length",
                observed=f"{handle.tokens} {handle.finish_reason} error={handle.error}")
