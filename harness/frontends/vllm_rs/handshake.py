"""vllm-rs as the owner of the HELLO / INIT / READY handshake (`vllm-rs serve`).

`vllm-rs frontend` only adopts pre-bound listeners, but `vllm-rs serve MODEL` runs the Rust
client's HandshakeOwner transport: it binds the handshake ROUTER at
`tcp://<--data-parallel-address>:<--data-parallel-rpc-port>`, its input/output sockets, and
launches a "managed Python headless engine" with `--python`. We hand it a stand-in
interpreter that starts nothing and lives exactly as long as its parent, so the mock engines
answer the handshake in its place (the same HELLO / INIT / READY a headless vLLM engine sends,
`core.py:1401-1425`). Everything stays on loopback.
"""

from __future__ import annotations

import os
import stat

# Why coordinated cases (a frontend-owned DP coordinator) cannot run here yet.
NO_COORDINATOR = (
    "vllm-rs serve starts its in-process DP coordinator only for a MoE model with more than "
    "one engine (rust/src/server/src/config.rs:383-401, lib.rs:116); this driver serves the "
    "dense fixtures/tiny-model, so INIT names no coordinator")

STAND_IN = """#!/bin/sh
# corewire: stands in for the managed Python engine; mock engines do the handshake instead.
while kill -0 "$PPID" 2>/dev/null; do sleep 0.2; done
"""


def write_stand_in(directory: str) -> str:
    """The `--python` stand-in, executable, inside the driver's private directory."""
    path = os.path.join(directory, "managed-engine-stand-in")
    with open(path, "w") as fh:
        fh.write(STAND_IN)
    os.chmod(path, stat.S_IRWXU)
    return path


def serve_command(binary: str, model: str, stand_in: str, handshake_port: int, http_port: int,
                  engines: int, ready_timeout: int) -> list[str]:
    """`vllm-rs serve` owning the handshake for `engines` headless engines."""
    return [binary, "serve", model, "--python", stand_in,
            "--data-parallel-address", "127.0.0.1",
            "--data-parallel-rpc-port", str(handshake_port),
            "--data-parallel-size", str(engines),
            "--host", "127.0.0.1", "--port", str(http_port),
            "--engine-ready-timeout-secs", str(ready_timeout)]
