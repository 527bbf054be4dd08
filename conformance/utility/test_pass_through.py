"""Pass-through request fields reach the engine unchanged.

The client does not interpret kv_transfer_params, ec_transfer_params or cache_salt: the
OpenAI surfaces put the transfer params into the sampling params' extra_args, the salt
travels on the request, and the engine reads them there (vllm/v1/request.py).
"""

from __future__ import annotations

from typing import Any

from conformance.utility.helpers import ROUTES
from harness.cases.authoring import (
    Capability,
    CaseContext,
    Level,
    both,
    case,
    engine,
    messages,
    prompt,
    py,
    rs,
)

# Pass-through fields: the OpenAI surfaces put kv/ec_transfer_params into extra_args.
PASS_KV = both(
    py("vllm/entrypoints/openai/completion/protocol.py:403",
       'extra_args["kv_transfer_params"] = self.kv_transfer_params'),
    rs("rust/src/server/src/utils.rs:70", '"kv_transfer_params".to_string(),'),
    engine("vllm/v1/request.py:120", "self.kv_transfer_params = sampling_params.extra_args.get("),
)
PASS_EC = both(
    py("vllm/entrypoints/openai/completion/protocol.py:406",
       'extra_args["ec_transfer_params"] = self.ec_transfer_params'),
    rs("rust/src/server/src/utils.rs:88", '"ec_transfer_params".to_string(),'),
    engine("vllm/v1/request.py:123", "self.ec_transfer_params = sampling_params.extra_args.get("),
)
PASS_SALT = both(
    py("vllm/v1/engine/input_processor.py:548", 'cache_salt=decoder_input.get("cache_salt"),'),
    rs(f"{ROUTES}/openai/completions/convert.rs:166", "cache_salt: request.cache_salt,"),
    engine("vllm/v1/request.py:260", "cache_salt=request.cache_salt,"),
)


def _on_add(req: messages.EngineCoreRequest, key: str) -> Any:
    """The field as the ADD carries it: cache_salt on the request, the transfer params in
    the sampling params' extra_args."""
    if key == "cache_salt":
        return req.cache_salt
    extra = req.sampling_params.extra_args if req.sampling_params else None
    return (extra or {}).get(key)


@case("utility.pass_through.{key}", Level.MUST,
      "The client's {key} reaches the engine unchanged.", grounds=PASS_KV,
      needs=[Capability.PASS_THROUGH],
      params=[{"key": "kv_transfer_params", "value": {"do_remote_prefill": False,
                                                      "remote_engine_id": "cw-e1",
                                                      "remote_block_ids": [3, 5]},
               "grounds": PASS_KV},
              {"key": "ec_transfer_params", "value": {"producer": "cw-ec", "hashes": ["h1"]},
               "grounds": PASS_EC},
              {"key": "cache_salt", "value": "cw-salt-1", "grounds": PASS_SALT}])
async def pass_through(ctx: CaseContext, key: str, value: Any) -> None:
    group = await ctx.start(1)
    handle = await ctx.driver.generate(prompt(0), 2, params={key: value})
    await handle.wait(ctx.t(5.0))
    adds = group.transcript.adds()
    seen = _on_add(adds[0], key) if adds else "no ADD"
    ctx.require(seen == value, expected=f"{key} = {value!r} on the ADD", observed=seen)
