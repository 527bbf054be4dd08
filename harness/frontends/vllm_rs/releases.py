"""What differs between the vllm-rs binaries of vLLM 0.22.0 ... 0.33.0, as the driver sees it.

`vllm-rs@X` on the command line names a release; `RsRelease` says which command line that
release's `frontend` subcommand takes and what its HTTP surface lets a driver observe. Every
boundary below was checked on the released binaries themselves (`frontend --help`, the route
strings in the binary) or measured against the mock engines; /work/shared/docs/vllm-releases.md
section 2-3 has the PyPI and source side.

| from  | what appears                                                              |
|-------|---------------------------------------------------------------------------|
| 0.22.0| first vllm-rs: `--input-address/--output-address` (it binds them itself)    |
| 0.23.0| /v1/load_lora_adapter, /v1/unload_lora_adapter                            |
| 0.24.0| `--engine-start-index`; /abort_requests; /pause, /resume, /is_paused;      |
|       | `max_model_len` in /v1/models                                             |
| 0.26.0| /reset_prefix_cache answers `{"success": bool}` (a bare 200 before)       |
| 0.28.0| `--data-parallel-size`                                                    |
| 0.31.0| /release_kv_cache_memory; /wake_up takes `tags` (any tags query: 400 before) |
| 0.32.0| inherited listeners (`--input-listener-fd/--output-listener-fd`),          |
|       | `--grpc-listen-fd` (the Control service: block_size, num_gpu_blocks)      |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.frontends.api import ALL_CAPABILITIES, Capability
from harness.protocol.wire.profiles import profile_names

PREFIX = "vllm-rs@"
FIRST = (0, 22, 0)  # the first release whose wheel ships vllm/vllm-rs
INSTALLED = "0.33.0"  # what plain `vllm-rs` drives (harness.artefacts.vllm_dist.VLLM_VERSION)
# Every release with a Rust frontend up to the installed one (PyPI, x86_64 wheels).
RELEASES = ("0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0",
            "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")

# The driver's full surface on 0.33.0 (VllmRsDriver.capabilities); older releases lose some.
RS_CAPABILITIES = frozenset({
    Capability.GENERATE, Capability.DROP, Capability.ABORT, Capability.IS_SLEEPING,
    Capability.RESET_PREFIX_CACHE, Capability.DP_RANK, Capability.STOP_STRINGS,
    Capability.MAX_MODEL_LEN, Capability.BLOCK_SIZE, Capability.NUM_GPU_BLOCKS,
    Capability.REQUEST_ERRORS, Capability.ENGINE_DEATH, Capability.CALL_UTILITY,
    Capability.CANCEL_UTILITY, Capability.CLIENT_REQUEST_ID, Capability.PASS_THROUGH,
    Capability.SAMPLING,
})
assert RS_CAPABILITIES <= ALL_CAPABILITIES


class ReleaseSpecError(ValueError):
    """A `vllm-rs@X` spec that names no usable release (one line, before any case runs)."""


def parse_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.match(text)
    if not match:
        raise ReleaseSpecError(f"{text!r} is not a vLLM release number like 0.22.1")
    return int(match[1]), int(match[2]), int(match[3])


@dataclass(frozen=True)
class RsRelease:
    """One vllm-rs release: its command-line form and its observable surface."""

    version: str

    @property
    def key(self) -> tuple[int, int, int]:
        return parse_version(self.version)

    def since(self, version: str) -> bool:
        return self.key >= parse_version(version)

    # ------------------------------------------------------------------ command line
    @property
    def listener_fds(self) -> bool:
        """Inherited AF_UNIX listeners; before 0.32 the binary binds ipc addresses itself."""
        return self.since("0.32.0")

    @property
    def engine_start_index_flag(self) -> bool:
        return self.since("0.24.0")

    @property
    def data_parallel_size_flag(self) -> bool:
        return self.since("0.28.0")

    @property
    def grpc_control(self) -> bool:
        """`--grpc-listen-fd`: the Control service that reports block_size / num_gpu_blocks."""
        return self.since("0.32.0")

    # ------------------------------------------------------------------ HTTP surface
    @property
    def abort_route(self) -> bool:
        return self.since("0.24.0")

    @property
    def reset_result(self) -> bool:
        """Whether /reset_prefix_cache reports the aggregated bool (a bare 200 before 0.26)."""
        return self.since("0.26.0")

    @property
    def models_max_model_len(self) -> bool:
        return self.since("0.24.0")

    @property
    def pause_routes(self) -> bool:
        """/pause, /resume, /is_paused."""
        return self.since("0.24.0")

    @property
    def lora_routes(self) -> bool:
        return self.since("0.23.0")

    @property
    def release_kv_cache_route(self) -> bool:
        """/release_kv_cache_memory."""
        return self.since("0.31.0")

    @property
    def capabilities(self) -> frozenset[Capability]:
        lost = set()
        if not self.abort_route:
            lost.add(Capability.ABORT)
        if not self.reset_result:
            lost.add(Capability.RESET_PREFIX_CACHE)
        if not self.models_max_model_len:
            lost.add(Capability.MAX_MODEL_LEN)
        if not self.grpc_control:
            lost |= {Capability.BLOCK_SIZE, Capability.NUM_GPU_BLOCKS}
        return RS_CAPABILITIES - lost

    def missing_route(self, method: str) -> str | None:
        """Why this release serves no route for utility `method` (None: it does)."""
        if method in ("is_scheduler_paused", "pause_generation", "resume_scheduler") \
                and not self.pause_routes:
            return f"vllm-rs {self.version} has no /pause, /resume or /is_paused (from 0.24.0)"
        if method in ("add_lora", "remove_lora") and not self.lora_routes:
            return f"vllm-rs {self.version} has no LoRA adapter routes (from 0.23.0)"
        if method == "reset_prefix_cache" and not self.reset_result:
            return (f"vllm-rs {self.version} answers /reset_prefix_cache with a bare 200: "
                    f"the aggregated result is not observable (from 0.26.0)")
        if method == "release_kv_cache_memory" and not self.release_kv_cache_route:
            return (f"vllm-rs {self.version} has no /release_kv_cache_memory "
                    f"(from 0.31.0)")
        if method in ("get_weight_version", "set_weight_version") and not self.grpc_control:
            return f"vllm-rs {self.version} has no gRPC Control service (from 0.32.0)"
        return None


def release_of(spec: str) -> RsRelease | None:
    """The release a `vllm-rs@X` spec names (None for any other spec); ReleaseSpecError if
    X is malformed, older than the first release with a Rust frontend, or has no protocol
    profile (fixtures/profiles: `make profiles` adds a new release)."""
    if not spec.startswith(PREFIX):
        return None
    version = spec[len(PREFIX):].strip()
    if parse_version(version) < FIRST:
        raise ReleaseSpecError(f"vllm {version} ships no Rust frontend; vllm-rs exists from "
                               f"0.22.0 (releases: {', '.join(RELEASES)})")
    if f"vllm-{version}" not in profile_names():
        raise ReleaseSpecError(f"no protocol profile for vllm {version} (known: "
                               f"{', '.join(RELEASES)}); generate one with `make profiles`")
    return RsRelease(version)


__all__ = ["INSTALLED", "PREFIX", "RELEASES", "RS_CAPABILITIES", "ReleaseSpecError",
           "RsRelease", "parse_version", "release_of"]
