"""INIT for a frontend-owned DP coordinator (handshake mode, `coordinated`).

When the frontend launches the deployment it owns the DP coordinator: INIT names its
engine-facing addresses (`coordinator_input` XPUB, `coordinator_output` PULL; Python
utils.py:1265-1279, Rust transport.rs:484-485 with the in-process coordinator under
coordinator/), every engine subscribes and waits for its READY (coordinator.py:245-254,
core.py:1984), and the frontend then serves every engine. vLLM runs wave coordination for
MoE models (utils.py:1268 `enable_wave_coordination=is_moe`; vllm-rs `serve` starts its
coordinator for MoE with >1 engine, server/src/config.rs:384-401). A driver that cannot run
such a frontend refuses the start: UNSUPPORTED with its reason. What the coordinator does
once running is the dp area's (conformance/dp/test_coordinator*.py).
"""

from __future__ import annotations

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
    request_for,
    rs,
)

INIT = both(
    py("vllm/v1/engine/utils.py:1272",
       "addresses.coordinator_input, addresses.coordinator_output = ("),
    py("vllm/v1/engine/coordinator.py:247", 'if publish_back.recv() != b"\\x01":'),
    py("vllm/v1/engine/coordinator.py:254", 'publish_back.send(b"READY")'),
    py("vllm/v1/engine/core_client.py:1763",
       "if (eng_index := request.data_parallel_rank) is None and ("),
    rs("rust/src/engine-core-client/src/protocol/handshake.rs:121",
       "pub coordinator_input: Option<String>,"),
    rs("rust/src/engine-core-client/src/transport.rs:484",
       "coordinator_input: coordinator.map(|c| c.input_address.clone()),"),
    rs("rust/src/engine-core-client/src/transport.rs:485",
       "coordinator_output: coordinator.map(|c| c.output_address.clone()),"),
    rs("rust/src/engine-core-client/src/coordinator/bootstrap.rs:46",
       "send_ready_to_engines(&mut self.input_socket).await?;"),
    rs("rust/src/engine-core-client/src/tests/client.rs:598",
       "assert!(init.addresses.coordinator_input.is_some());"),
    engine("vllm/v1/engine/core.py:1210",
           "self.has_coordinator = addresses.coordinator_output is not None"),
    engine("vllm/v1/engine/core.py:1984", 'assert coord_socket.recv() == b"READY"'),
)


@case("handshake.init.coordinator_addresses_{n}_engines", Level.MUST,
      "With {n} engines and a frontend-owned DP coordinator, every INIT names the "
      "same coordinator input and output addresses; each engine's subscription is "
      "answered with READY and the frontend then serves every engine.",
      grounds=INIT, needs=[Capability.GENERATE, Capability.DP_RANK],
      params=[{"n": 2}, {"n": 3}])
async def coordinator_addresses(ctx: CaseContext, n: int) -> None:
    group = await ctx.start(n, coordinated=True)
    inits = [r.message for r in group.transcript.select(direction="in", channel="handshake")
             if isinstance(r.message, messages.EngineHandshakeMetadata)]
    named = {(i.addresses.coordinator_input, i.addresses.coordinator_output) for i in inits}
    ctx.require(len(inits) == n and len(named) == 1 and all(a and b for a, b in named),
                expected=f"{n} INITs, all naming the same coordinator input and output",
                observed=sorted(str(x) for x in named) or "no INIT")
    ready = {e.rank for e in group.engines if any(
        r.note == "READY" for r in group.transcript.select(
            rank=e.rank, direction="in", channel="coordinator"))}
    ctx.require(ready == {e.rank for e in group.engines},
                expected="the coordinator's READY reaches every engine",
                observed=f"READY at engines {sorted(ready)}")
    for rank in reversed(range(n)):
        handle = await ctx.driver.generate(prompt(rank), 2, data_parallel_rank=rank)
        await handle.wait(ctx.t(3))
        found = request_for(group, prompt(rank))
        ctx.require(found is not None and found[0] == rank
                    and handle.finish_reason == "length",
                    expected=f"engine {rank} serves its pinned request",
                    observed=f"{found}, {handle.finish_reason} error={handle.error}")
