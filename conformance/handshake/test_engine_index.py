"""Engine identities: a nonzero engine start index, and registrations from an identity the
frontend does not expect or from one identity twice.

An engine's identity is its index as 2 little-endian bytes (`core.py:1191`); a frontend
owning engines `start .. start+count` expects exactly those (python `engine_ranks_managed`,
`core_client.py:746-753`; rust `engine_start_index + offset`, transport.rs:374). Any other
registration is refused: python's `identities.remove(identity)` raises a bare KeyError of
the identity bytes (`:774`), rust "received input registration for unexpected engine id"
(transport.rs:533). The refusal must name the identity: with many engines the operator
needs to know which one is misconfigured.
"""

from __future__ import annotations

import re

from conformance.handshake.helpers import (
    CC,
    CORE,
    TESTS,
    TR,
    fails_within_bound,
    refused_promptly,
    startup_refused,
)
from harness.cases.authoring import (
    Capability,
    CaseContext,
    EngineScript,
    Level,
    any_request,
    both,
    case,
    engine,
    hold,
    names_engine,
    prompt,
    py,
    request_for,
    rs,
)

START_INDEX = both(
    py(f"{CC}:746", "[dp_rank] if offline_mode else list(range(dp_rank, dp_rank + num_ranks))"),
    py(f"{CC}:753", 'rank.to_bytes(2, "little") for rank in self.engine_ranks_managed'),
    rs(f"{TR}:374", "EngineId::from_engine_index(engine_start_index + offset)"),
    rs(f"{TESTS}:3182", "async fn bootstrapped_connects_with_nonzero_engine_start_index() {"),
    engine(f"{CORE}:1191", 'identity = self.engine_index.to_bytes(length=2, byteorder="little")'),
)
UNEXPECTED_ID = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    rs(f"{TESTS}:3219", "async fn bootstrapped_rejects_unexpected_engine_id_for_start_index() {"),
)
UNEXPECTED_ID_FOR_START = both(
    py(f"{CC}:746", "[dp_rank] if offline_mode else list(range(dp_rank, dp_rank + num_ranks))"),
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:374", "EngineId::from_engine_index(engine_start_index + offset)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TESTS}:3219", "async fn bootstrapped_rejects_unexpected_engine_id_for_start_index() {"),
)
UNEXPECTED_ID_NAMED = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    note="python's refusal is the KeyError of the identity bytes (b'\\x05\\x00'); rust "
         "prints EngineId(0500)",
)
DUPLICATE_ID = both(
    py(f"{CC}:761", "if not sync_input_socket.poll("),
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:516", "let registration = timeout(ready_timeout, input_socket.recv())"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    note="engine 1 never registers under its own identity: a second frame from identity 0 "
         "fails the set removal, and otherwise the per-receive bound expires",
)
DUPLICATE_REGISTRATION_NAMED = both(
    py(f"{CC}:774", "identities.remove(identity)"),
    rs(f"{TR}:531", "if !pending.remove(&actual_id) {"),
    rs(f"{TR}:533", "received input registration for unexpected engine id {actual_id:?}"),
    note="both name the identity, each in its own form: python's refusal is a KeyError of "
         "the identity bytes (core_client.py:774, e.g. b'\\x01\\x00'), rust's 'unexpected "
         "engine id EngineId(0100)' (transport.rs:531-533)",
)


@case("handshake.engine_index.start_{offset}_count_{count}", Level.MUST,
      "A frontend owning engines {ranks} (engine start index {offset}) accepts their "
      "registrations and serves on every one of them.", grounds=START_INDEX,
      needs=[Capability.GENERATE],
      params=[{"offset": offset, "count": count, "ranks": list(range(offset, offset + count))}
              for offset, count in ((3, 1), (2, 2))])
async def nonzero_start(ctx: CaseContext, offset: int, count: int, ranks: list[int]) -> None:
    group = await ctx.start([EngineScript(rules=[any_request(hold())]) for _ in ranks],
                            rank_offset=offset)
    prompts = [prompt(80 + i) for i in range(count)]
    handles = [await ctx.driver.generate(p, 50) for p in prompts]
    for h in handles:
        await h.wait_first(ctx.t(3))
    owners = sorted(f[0] for f in (request_for(group, p) for p in prompts) if f)
    ctx.require(owners == ranks, expected=f"one request at each engine {ranks}",
                observed=f"requests at engines {owners}")


# ------------------------------------------------------------------ an unexpected identity

@case("handshake.engine_index.unexpected_id_refused", Level.MUST,
      "With engines 0 and 1 expected, a ready frame from identity 5 (engine 1 misconfigured) "
      "makes startup fail promptly instead of serving or hanging.",
      grounds=UNEXPECTED_ID)
async def unexpected_id(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [EngineScript(), EngineScript(register_as=5)], within=4)


@case("handshake.engine_index.unexpected_id_for_start_index", Level.MUST,
      "A frontend owning engine 3 (start index 3) refuses a registration from identity 0.",
      grounds=UNEXPECTED_ID_FOR_START, needs=[])
async def unexpected_id_for_start(ctx: CaseContext) -> None:
    await refused_promptly(ctx, [EngineScript(register_as=0)], within=4, offset=3)


@case("handshake.engine_index.unexpected_id_named", Level.MUST,
      "The startup error for an unexpected engine identity names the identity (5 or its "
      "bytes 0500).", grounds=UNEXPECTED_ID_NAMED)
async def unexpected_id_named(ctx: CaseContext) -> None:
    text = await refused_promptly(ctx, [EngineScript(), EngineScript(register_as=5)],
                                  within=4)
    ctx.require(bool(re.search(r"\b5\b|0500|\\x05\\x00", text)),
                expected="an error naming identity 5", observed=text)


# ------------------------------------------------------------------ one identity twice

@case("handshake.engine_index.duplicate_id_refused", Level.MUST,
      "Two engines registering with the same identity (0) never make a serving frontend: "
      "startup fails within its bound, since engine 1 never registered.", grounds=DUPLICATE_ID,
      timeout=20)
async def duplicate_id(ctx: CaseContext) -> None:
    await fails_within_bound(ctx, [EngineScript(), EngineScript(register_as=0, ready_delay=0.1)],
                             expected="startup error (engine 1 registered as engine 0)")


@case("handshake.more_edges.duplicate_registration_named_{dup}_of_{n}", Level.MUST,
      "With {n} engines, when engine {dup} sends its ready frame twice (before every engine "
      "registered), the refusal to start names engine {dup}, the identity that registered "
      "twice (Rust: 'received input registration for unexpected engine id').",
      grounds=DUPLICATE_REGISTRATION_NAMED, timeout=20,
      params=[{"n": n, "dup": dup} for n, dup in ((2, 0), (3, 1), (3, 2))])
async def duplicate_registration(ctx: CaseContext, n: int, dup: int) -> None:
    # The others register a second later, so the repeat is read while they are still
    # missing (a ROUTER fair-queues peers: read late, the repeat would come last).
    scripts = [EngineScript(ready_delay=ctx.t(1.0)) for _ in range(n)]
    scripts[dup] = EngineScript(ready_repeats=2)
    text = await startup_refused(ctx, scripts)
    ctx.require(names_engine(text, dup), expected=f"a refusal naming engine {dup}",
                observed=text)
