"""Utility results reach the caller unchanged: shapes, scalar types and every engine's part.

An engine answers a utility call with `UtilityOutput.result = [type_info, value]`; without
insecure serialization type_info is nil and value is plain msgpack (serial_utils.py
UtilityResult, 0.33.0), which the client hands to its caller as it is
(core_client.py:933-952 `_process_utility_output`). What a port gets wrong here: nulls
dropped from lists, empty containers collapsed, booleans turned into integers (or 1.0 into
1), 64-bit integers squeezed through a double, nested maps flattened, a worker list
re-ordered or cut to one engine's part. vLLM's own tests (test_engine_core_client.py
util_method_custom_return / custom_dict_return / nested_structures / future_utility_async,
test_dplb_weight_checksums_gather_every_engine) check the same through Python classes; the
portable part is the plain-value shape, checked here through collective_rpc (every
frontend exposes it) and compute_weight_checksums (Python's surface).
"""

from __future__ import annotations

from typing import Any

from conformance.utility.helpers import CALL, CC, ECC, ENGINE_ZERO, RS_FLATTEN
from harness.cases.authoring import (
    CaseContext,
    EngineScript,
    Level,
    UtilityReply,
    both,
    case,
    differ,
    engine,
    py,
    rs,
    same_value,
)

# Without insecure serialization the result travels as [nil, value] and is handed over as is.
RESULT = both(
    py("vllm/v1/serial_utils.py:368", "if result_type is not None:"),
    py(f"{CC}:944", "future.set_result(output.result.result)"),
    py(f"{CC}:1442", '"collective_rpc", method, timeout, args, kwargs'),
    py("tests/v1/engine/test_engine_core_client.py:1102",
       "async def test_engine_core_client_util_method_nested_structures("),
    rs(f"{ECC}/protocol/utility.rs:252",
       "let result = self.result.map(|e| e.result).unwrap_or(Value::Nil);"),
    RS_FLATTEN,
    rs("rust/src/server/src/routes/collective_rpc.rs:53",
       "Ok(Json(CollectiveRpcResponse { results }))"),
    engine("vllm/v1/serial_utils.py:214", "return None, result"),
)
RPC_FLATTEN = differ(
    ENGINE_ZERO,
    RS_FLATTEN,
    rs(f"{ECC}/tests/client.rs:2418",
       "async fn collective_rpc_flattens_results_from_all_engines()"),
    note="rust flattens every engine's worker list in engine order (client.rs:810); python's "
         "DPLB client returns engine 0's list only (core_client.py:1816)",
)
CHECKSUMS = both(
    py(f"{CC}:1446",
       'per_engine = await self.call_utility_all_async("compute_weight_checksums")'),
    py(f"{CC}:1447", "return [worker for workers in per_engine for worker in workers]"),
    py("tests/v1/engine/test_engine_core_client.py:229",
       "def test_dplb_weight_checksums_gather_every_engine():"),
    rs("rust/src/server/src/routes/weight_checker.rs:79",
       '.collective_rpc("compute_weight_checksums", None, args, kwargs)'),
    RS_FLATTEN,
    engine("vllm/v1/engine/core.py:1085",
           "def compute_weight_checksums(self) -> list[dict[str, str]]:"),
    note="rust gathers every engine's workers too, through collective_rpc('compute_weight_"
         "checksums') flattened (client.rs:810) and merged into one map "
         "(weight_checker.rs:79); only python sends the compute_weight_checksums utility "
         "this case observes",
)
RPC_ARGS: list[Any] = ["echo", None, [1], {}]  # collective_rpc(method, timeout, args, kwargs)

# One engine's collective_rpc answer: a list with one result per worker. Nested shapes a
# worker's method could return (None alone, empty containers, deep lists and maps).
NESTED: list[Any] = [
    None,
    [],
    {},
    [None, [1, [2, [3, []]]]],
    {"k": None, "l": [1, {"m": [None, "x"]}], "n": {"o": {}}},
    [{"a": 1}, {"b": [2, None]}],
]
# Scalars whose type or value a lossy conversion changes (bool -> int, 1.0 -> 1, an integer
# past 2**53 through a double, the 64-bit ends, non-ASCII and NUL in strings).
SCALARS: list[Any] = [True, False, 0, 1, -1, 1.0, -0.5, 1e300, 2**53 + 1, 2**63 - 1,
                      -(2**63), 2**64 - 1, "", "ü€𝄞", "a\u0000b"]


def _first_difference(seen: Any, expected: Any, where: str = "result") -> str:
    """Where the first mismatch lies, for the evidence (the whole value can be long)."""
    if isinstance(expected, list) and isinstance(seen, (list, tuple)):
        if len(seen) != len(expected):
            return f"{where}: {len(seen)} items, expected {len(expected)}"
        for i, (s, e) in enumerate(zip(seen, expected, strict=True)):
            if not same_value(s, e):
                return _first_difference(s, e, f"{where}[{i}]")
    if isinstance(expected, dict) and isinstance(seen, dict):
        if seen.keys() != expected.keys():
            return f"{where}: keys {sorted(seen)}, expected {sorted(expected)}"
        for k, v in expected.items():
            if not same_value(seen[k], v):
                return _first_difference(seen[k], v, f"{where}[{k!r}]")
    return f"{where}: {seen!r} ({type(seen).__name__}), expected {expected!r} " \
           f"({type(expected).__name__})"


async def _rpc_result(ctx: CaseContext, answers: list[list[Any]]) -> Any:
    """collective_rpc over len(answers) engines, engine r answering answers[r]."""
    await ctx.start([EngineScript(utilities={"collective_rpc": UtilityReply(a)})
                     for a in answers])
    return await ctx.driver.call_utility("collective_rpc", RPC_ARGS)


def _require_same(ctx: CaseContext, seen: Any, expected: Any, what: str) -> None:
    ok = same_value(seen, expected)
    ctx.require(ok, expected=f"{what}: {expected!r}",
                observed="unchanged" if ok else _first_difference(seen, expected))


# ---------------------------------------------------------------- one engine's list

@case("utility.result.nested_values", Level.MUST,
      "A collective_rpc answer holding nested values (null alone, empty list "
      "and map, lists in maps in lists, nulls inside them) reaches the caller unchanged "
      "(1 engine).", grounds=RESULT, needs=CALL)
async def nested_values(ctx: CaseContext) -> None:
    _require_same(ctx, await _rpc_result(ctx, [NESTED]), NESTED,
                  "the engine's worker list as it was sent")


@case("utility.result.scalar_types", Level.MUST,
      "A collective_rpc answer's scalars keep their type and value: booleans "
      "stay booleans, 1.0 stays a float, integers up to the 64-bit ends (and 2**53 + 1) stay "
      "exact, non-ASCII and NUL survive in strings (1 engine).", grounds=RESULT, needs=CALL)
async def scalar_types(ctx: CaseContext) -> None:
    _require_same(ctx, await _rpc_result(ctx, [SCALARS]), SCALARS,
                  "the engine's worker list as it was sent")


@case("utility.result.null_workers_kept", Level.MUST,
      "When every worker of the one engine returns null, collective_rpc "
      "answers a list of those nulls ([null, null]), not an empty list and not null.",
      grounds=RESULT, needs=CALL)
async def null_workers_kept(ctx: CaseContext) -> None:
    _require_same(ctx, await _rpc_result(ctx, [[None, None]]), [None, None],
                  "one null per worker")


# ---------------------------------------------------------------- every engine's part

@case("utility.result.nested_per_engine_flattened", Level.SHOULD,
      "collective_rpc over 2 engines whose workers answer nested values returns every "
      "worker's value in engine order, each unchanged (Rust flattens the engines' lists; "
      "Python DPLB returns engine 0's list only).", grounds=RPC_FLATTEN, needs=CALL)
async def nested_per_engine(ctx: CaseContext) -> None:
    answers: list[list[Any]] = [[{"rank": 0, "w": [None]}, [0, {}]],
                               [{"rank": 1, "w": [[]]}, None]]
    _require_same(ctx, await _rpc_result(ctx, answers), answers[0] + answers[1],
                  "engine 0's workers, then engine 1's")


@case("utility.compute_weight_checksums.gathers_every_engine", Level.MUST,
      "compute_weight_checksums over 3 engines (2 workers each, replies arriving in reverse "
      "order) returns all 6 workers' checksum maps, in engine then worker order (a "
      "checksum of engine 0 alone verifies nothing about the others).",
      grounds=CHECKSUMS, needs=CALL)
async def weight_checksums(ctx: CaseContext) -> None:
    answers = [[{"model.w": f"e{rank}w{worker}"} for worker in range(2)]
               for rank in range(3)]
    await ctx.start([EngineScript(utilities={"compute_weight_checksums": UtilityReply(
        answers[rank], delay=0.2 * (2 - rank))}) for rank in range(3)])
    seen = await ctx.driver.call_utility("compute_weight_checksums", [])
    calls = {rank: len(ctx.engines.transcript.utility_calls("compute_weight_checksums",
                                                             rank=rank)) for rank in range(3)}
    ctx.require(calls == {0: 1, 1: 1, 2: 1},
                expected="one compute_weight_checksums call per engine (3)",
                observed=f"calls per engine {calls}")
    _require_same(ctx, seen, [w for per_engine in answers for w in per_engine],
                  "engine 0's two maps, then engine 1's, then engine 2's")
