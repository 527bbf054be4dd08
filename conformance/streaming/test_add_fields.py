"""What the ADD carries for the engine's scheduler and sampler: the client's values, exactly,
and the user's name for the request.

The engine samples with exactly what the ADD says (gpu_input_batch.py reads temperature,
top_p, top_k; the model runner seeds its generator from seed; the min_tokens rule reads
_all_stop_token_ids; the scheduler stops at _eos_token_id). Port authors build the
EngineCoreRequest by hand and get the quiet values wrong: a greedy request sent with the
struct's default temperature 1.0, no EOS id (the engine never stops at end of sequence), a
seed of 0 dropped as "unset", top_p or min_p in the wrong unit, one request's values reused
for the next, ignore_eos forgotten (the EOS id still sent, so the engine stops anyway) or
the client's stop token ids missing from _all_stop_token_ids (min_tokens then lets them
through). Every value a case asks for is exact in binary (0.75, 0.875, 0.0625...): the Rust
frontend holds them as f32, so a value like 0.7 would differ in its last bits on the wire
without either frontend being wrong.

Beside sampling, the request's scheduling keys: a plain request is not resumable (a
resumable one is kept waiting for more input after it finishes, forever), and the
scheduler orders by (priority, arrival_time), arrival_time in Unix seconds. And its name:
without external_req_id the engine's logs and the frontend's abort-by-user-id lose the
user's id. (A session's continuations: test_session_adds.py; pinned ranks on the ADD:
conformance/dp/test_routing_pinned.py.)
"""

from __future__ import annotations

import time
from dataclasses import replace

from conformance.streaming.helpers import (
    ASKED,
    GEN,
    RS_NEVER_RESUMABLE,
    asked_values,
    sampling_values,
)
from harness.cases.authoring import (
    EOS_TOKEN_ID,
    Capability,
    CaseContext,
    EngineGroup,
    EngineScript,
    Level,
    Sampling,
    UnsupportedOperation,
    both,
    case,
    engine,
    messages,
    prompt,
    py,
    rs,
)

NEEDS = [Capability.GENERATE, Capability.SAMPLING]
# The ADD carries the client's temperature, the model's EOS id (also among the stop ids) and
# max_tokens: the engine stops at EOS from _eos_token_id.
ADD_SAMPLING = both(
    py("vllm/sampling_params.py:525", "temperature=1.0 if temperature is None else temperature,"),
    py("vllm/v1/engine/input_processor.py:489",
       "sampling_params.update_from_generation_config("),
    py("vllm/sampling_params.py:782", "self._eos_token_id = eos_token_id"),
    py("vllm/sampling_params.py:787", "self._all_stop_token_ids.add(eos_token_id)"),
    rs("rust/src/text/src/lower.rs:172",
       "let temperature = temperature.or(default_temperature).unwrap_or(1.0);"),
    rs("rust/src/text/src/lower.rs:197", "all_stop_token_ids.insert(primary_eos_token_id);"),
    rs("rust/src/text/src/lower.rs:234",
       "eos_token_id: (!ignore_eos).then_some(primary_eos_token_id).flatten(),"),
    engine("vllm/v1/core/sched/utils.py:105",
           "if last_token_id == sampling_params.eos_token_id:"))
# A non-greedy client's values reach the ADD unchanged (both frontends copy them; the engine
# samples with them).
SAMPLING_VALUES = both(
    py("vllm/sampling_params.py:527", "top_p=1.0 if top_p is None else top_p,"),
    py("vllm/sampling_params.py:528", "top_k=top_k,"),
    py("vllm/sampling_params.py:529", "min_p=min_p,"),
    py("vllm/sampling_params.py:530", "seed=seed,"),
    rs("rust/src/text/src/lower.rs:173", "let top_p = top_p.or(default_top_p).unwrap_or(1.0);"),
    rs("rust/src/text/src/lower.rs:174", "let top_k = top_k.or(default_top_k).unwrap_or(0);"),
    rs("rust/src/text/src/lower.rs:175", "let min_p = min_p.or(default_min_p).unwrap_or(0.0);"),
    rs("rust/src/text/src/lower.rs:215", "seed,"),
    engine("vllm/v1/worker/gpu_input_batch.py:401",
           "self.temperature_cpu[req_index] = sampling_params.temperature"),
    engine("vllm/v1/worker/gpu_input_batch.py:404",
           "self.top_p_cpu[req_index] = sampling_params.top_p"),
    engine("vllm/v1/worker/gpu_input_batch.py:407", "top_k = sampling_params.top_k"),
    engine("vllm/v1/worker/gpu/sample/states.py:45", "min_p = sampling_params.min_p"),
    engine("vllm/v1/worker/gpu_model_runner.py:1266",
           "generator.manual_seed(sampling_params.seed)"))
# ignore_eos: no _eos_token_id (the engine would stop at EOS), EOS still among the stop ids;
# min_tokens and the client's stop token ids as asked (the min_tokens rule masks them all).
IGNORE_EOS = both(
    py("vllm/sampling_params.py:781", "if not self.ignore_eos:"),
    py("vllm/sampling_params.py:787", "self._all_stop_token_ids.add(eos_token_id)"),
    py("vllm/sampling_params.py:623", "self._all_stop_token_ids.update(self.stop_token_ids)"),
    py("vllm/sampling_params.py:538", "min_tokens=min_tokens,"),
    rs("rust/src/text/src/lower.rs:234",
       "eos_token_id: (!ignore_eos).then_some(primary_eos_token_id).flatten(),"),
    rs("rust/src/text/src/lower.rs:195",
       "let mut all_stop_token_ids = BTreeSet::from_iter(stop_token_ids.iter().copied());"),
    rs("rust/src/text/src/lower.rs:217", "min_tokens,"),
    engine("vllm/v1/core/sched/utils.py:105",
           "if last_token_id == sampling_params.eos_token_id:"),
    engine("vllm/v1/sample/logits_processor/builtin.py:204", "params.all_stop_token_ids,"))
# A plain request is not resumable: the engine keeps a finished resumable request waiting
# for its next input (scheduler.py:2719, 2946).
NOT_RESUMABLE = both(
    py("vllm/v1/engine/input_processor.py:385", "resumable: bool = False,"),
    RS_NEVER_RESUMABLE,
    engine("vllm/v1/core/sched/scheduler.py:2719", "if not request.resumable:"),
    engine("vllm/v1/core/sched/scheduler.py:2946", "if request.resumable:"))
# The scheduler's order key: arrival_time is Unix seconds at the frontend's entry.
SCHEDULING_KEYS = both(
    py("vllm/v1/engine/input_processor.py:404",
       'arrival_time = prompt.get("arrival_time", time.time())'),
    py("vllm/v1/engine/input_processor.py:383", "priority: int = 0,"),
    rs("rust/src/llm/src/request.rs:111",
       "arrival_time: arrival_time.unwrap_or_else(current_unix_timestamp_secs),"),
    rs("rust/src/llm/src/request.rs:36",
       "/// Unix timestamp, in seconds, when this request arrived at the frontend."),
    engine("vllm/v1/core/sched/scheduler.py:935",
           "key=lambda r: (r.priority, r.arrival_time),"))
# external_req_id names the user's id; the engine-side request_id gets a random suffix.
_EXTERNAL_ID = (
    py("vllm/v1/engine/input_processor.py:363", "request.external_req_id = request.request_id"),
    py("vllm/v1/engine/input_processor.py:371",
       'request.request_id = f"{request.external_req_id}-{random_uuid():.8}"'),
    rs("rust/src/llm/src/request.rs:124", "external_req_id: Some(external_request_id),"),
    rs("rust/src/llm/src/request.rs:100",
       'format!("{external_request_id}-{}", &random_suffix[..8])'))
EXTERNAL_ID = both(
    *_EXTERNAL_ID,
    py("vllm/v1/engine/output_processor.py:322", "assert request.external_req_id is not None"))
EXTERNAL_ID_CHOSEN = both(
    *_EXTERNAL_ID,
    py("vllm/entrypoints/openai/completion/serving.py:147",
       'request_id = f"cmpl-{self._base_request_id(raw_request, request.request_id)}"'),
    rs("rust/src/server/src/routes/openai/completions/convert.rs:73",
       'let request_id = format!("cmpl-{}", ctx.request_id);'),
    rs("rust/src/server/src/utils.rs:188",
       "request_id_header.or(request_id).map(ToOwned::to_owned)"))

ARRIVAL_SLACK = 2.0  # seconds either side of the generate() call (clock reads, a busy host)

def _sampling_of(group: EngineGroup, prompt_ids: list[int]) -> messages.SamplingParams | None:
    req = next((r for r in group.transcript.adds() if r.prompt_token_ids == prompt_ids), None)
    return req.sampling_params if req is not None else None


# ----------------------------------------------------------------- greedy and EOS


@case("streaming.add_fields.greedy_eos_{engines}_engines", Level.MUST,
      "With {engines} engine(s), every ADD of a greedy request (the client asks for "
      "temperature 0) carries temperature 0.0, the model's EOS token id as "
      "_eos_token_id, that id in _all_stop_token_ids, and the client's max_tokens.",
      grounds=ADD_SAMPLING, needs=NEEDS,
      params=[{"engines": n} for n in (1, 2)])
async def add_greedy_eos(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript() for _ in range(engines)])
    asks = [(prompt(i), 2 + i) for i in range(2 * engines)]
    handles = [await ctx.driver.generate(p, n) for p, n in asks]
    for h in handles:
        await h.wait(ctx.t(3))
    wrong = []
    for p, n in asks:
        sp = _sampling_of(group, p)
        if sp is None:
            wrong.append(f"{p}: no ADD or no sampling_params")
            continue
        seen = (sp.temperature, sp._eos_token_id, EOS_TOKEN_ID in sp._all_stop_token_ids,
                sp.max_tokens)
        if seen != (0.0, EOS_TOKEN_ID, True, n):
            wrong.append(f"{p}: (temperature, _eos_token_id, EOS in "
                         f"_all_stop_token_ids, max_tokens) = {seen}")
    ctx.require(not wrong, expected=f"every ADD: temperature 0.0, _eos_token_id "
                                    f"{EOS_TOKEN_ID}, EOS in _all_stop_token_ids, the "
                                    "asked max_tokens",
                observed="; ".join(wrong[:3]))


# ----------------------------------------------------------------- values as asked


@case("streaming.add_fields.sampling_values_as_asked_{engines}_engines", Level.MUST,
      "With {engines} engine(s), three requests sent back to back, each with its own "
      "sampling (temperature, top_p, top_k, min_p, seed; one seed 0, one request "
      "asking for the defaults): every ADD carries exactly its own client's values, "
      "none taken from another request, none dropped for being 0.",
      grounds=SAMPLING_VALUES, needs=NEEDS,
      params=[{"engines": n} for n in (1, 2)])
async def sampling_values_as_asked(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript() for _ in range(engines)])
    asks = [(prompt(i), sampling) for i, sampling in enumerate(ASKED)]
    handles = [await ctx.driver.generate(p, 2, sampling=s) for p, s in asks]
    for h in handles:
        await h.wait(ctx.t(3))
    wrong = []
    for p, asked in asks:
        sp = _sampling_of(group, p)
        want = asked_values(asked)
        seen = sampling_values(sp) if sp is not None else None
        if seen != want:
            wrong.append(f"asked {want}, ADD carries {seen}")
    ctx.require(not wrong, expected="every ADD with its own client's sampling values",
                observed="; ".join(wrong))


@case("streaming.add_fields.ignore_eos_min_tokens_stop_ids", Level.MUST,
      "A request asking for ignore_eos with min_tokens 3 and stop token ids [200, 201] "
      "goes out with no _eos_token_id, min_tokens 3, stop_token_ids [200, 201] and "
      "_all_stop_token_ids holding 200, 201 and the model's EOS; the next request, without "
      "ignore_eos, carries the EOS id again.",
      grounds=IGNORE_EOS, needs=NEEDS)
async def ignore_eos_min_tokens(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript()])
    asked = Sampling(ignore_eos=True, min_tokens=3, stop_token_ids=(200, 201))
    first = await ctx.driver.generate(prompt(0), 6, sampling=asked)
    second = await ctx.driver.generate(prompt(1), 6, sampling=replace(asked, ignore_eos=False))
    for h in (first, second):
        await h.wait(ctx.t(3))
    sp, sp_next = _sampling_of(group, prompt(0)), _sampling_of(group, prompt(1))
    ctx.require(sp is not None and sp_next is not None, expected="both ADDs with sampling",
                observed=f"{len(group.transcript.adds())} ADDs")
    if sp is None or sp_next is None:
        return
    seen = {"_eos_token_id": sp._eos_token_id, "min_tokens": sp.min_tokens,
            "stop_token_ids": list(sp.stop_token_ids or ()),
            "_all_stop_token_ids ⊇ {EOS, 200, 201}":
                {EOS_TOKEN_ID, 200, 201} <= set(sp._all_stop_token_ids),
            "max_tokens": sp.max_tokens}
    want = {"_eos_token_id": None, "min_tokens": 3, "stop_token_ids": [200, 201],
            "_all_stop_token_ids ⊇ {EOS, 200, 201}": True, "max_tokens": 6}
    ctx.require(seen == want, expected=f"the ignore_eos request's ADD: {want}",
                observed=f"{seen}")
    ctx.require(sp_next._eos_token_id == EOS_TOKEN_ID,
                expected=f"the next request (no ignore_eos) carries _eos_token_id "
                         f"{EOS_TOKEN_ID}",
                observed=f"_eos_token_id {sp_next._eos_token_id!r}")


# ----------------------------------------------------------------- scheduling keys


@case("streaming.add_fields.plain_request_not_resumable_{engines}_engines", Level.MUST,
      "With {engines} engine(s), every ADD of a plain generate() (no streaming-input "
      "session) carries resumable false: the engine keeps a finished resumable request "
      "waiting for more input.",
      grounds=NOT_RESUMABLE, needs=GEN,
      params=[{"engines": n} for n in (1, 2)])
async def plain_request_not_resumable(ctx: CaseContext, engines: int) -> None:
    group = await ctx.start([EngineScript() for _ in range(engines)])
    handles = [await ctx.driver.generate(prompt(i), 2) for i in range(2 * engines)]
    for h in handles:
        await h.wait(ctx.t(3))
    flags = [r.resumable for r in group.transcript.adds()]
    ctx.require(len(flags) == 2 * engines and not any(flags),
                expected=f"{2 * engines} ADDs, every one resumable false",
                observed=f"resumable flags {flags}")


@case("streaming.add_fields.scheduling_keys", Level.MUST,
      "Every ADD carries the scheduler's order key as vLLM's frontends set it: priority 0 "
      "(the client asked for none) and arrival_time in Unix seconds, taken while the "
      f"client's generate() call ran (within {ARRIVAL_SLACK:.0f} s), for three requests "
      "sent back to back.",
      grounds=SCHEDULING_KEYS, needs=GEN)
async def scheduling_keys(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript()])
    windows: list[tuple[list[int], float, float]] = []
    handles = []
    for i in range(3):  # back to back: each call's window is its own
        before = time.time()
        handles.append(await ctx.driver.generate(prompt(i), 2))
        windows.append((prompt(i), before, time.time()))
    for handle in handles:
        await handle.wait(ctx.t(3))
    wrong = []
    for p, before, after in windows:
        req = next((r for r in group.transcript.adds() if r.prompt_token_ids == p), None)
        if req is None:
            wrong.append(f"{p}: no ADD")
        elif req.priority != 0 or not (before - ARRIVAL_SLACK <= req.arrival_time
                                       <= after + ARRIVAL_SLACK):
            wrong.append(f"{p}: priority {req.priority}, arrival_time {req.arrival_time!r} "
                         f"(the call ran {before:.3f}..{after:.3f})")
    ctx.require(not wrong, expected="priority 0 and arrival_time = Unix seconds of the call",
                observed="; ".join(wrong))


# ----------------------------------------------------------------- the user's request id


@case("streaming.add_fields.external_req_id_generated", Level.MUST,
      "Every ADD names the user-facing request id in external_req_id (vLLM's frontends set "
      "it; the engine-side request_id may carry a suffix), one distinct id per request.",
      grounds=EXTERNAL_ID, needs=GEN)
async def add_external_generated(ctx: CaseContext) -> None:
    group = await ctx.start([EngineScript() for _ in range(2)])
    handles = [await ctx.driver.generate(prompt(i), 2) for i in range(4)]
    for h in handles:
        await h.wait(ctx.t(3))
    ids = [r.external_req_id for r in group.transcript.adds()]
    ctx.require(len(ids) == 4 and None not in ids and len(set(ids)) == 4,
                expected="4 ADDs, each with its own external_req_id",
                observed=f"external_req_id per ADD: {ids}")


@case("streaming.add_fields.external_req_id_client_chosen", Level.MUST,
      "With a client-chosen request id, the ADD's external_req_id names that id (an HTTP "
      "server may prefix it, as vLLM's OpenAI routes do: cmpl-<id>).",
      grounds=EXTERNAL_ID_CHOSEN, needs=[*GEN, Capability.CLIENT_REQUEST_ID])
async def add_external_client(ctx: CaseContext) -> None:
    group = await ctx.start(1)
    chosen = ["user-req-a", "user-req-b"]
    try:
        handles = [await ctx.driver.generate(prompt(i), 2, request_id=rid)
                   for i, rid in enumerate(chosen)]
    except UnsupportedOperation as exc:  # it declared client_request_id: a driver fault
        ctx.fail(expected="generate(request_id=...) honoured by a driver that "
                          "declares client_request_id", observed=str(exc))
    for h in handles:
        await h.wait(ctx.t(3))
    seen = {tuple(r.prompt_token_ids or []): r.external_req_id
            for r in group.transcript.adds()}
    got = [seen.get(tuple(prompt(i))) for i in range(2)]
    ok = all(g is not None and want in g for g, want in zip(got, chosen, strict=True))
    ctx.require(ok, expected=f"external_req_id naming {chosen}", observed=got)
