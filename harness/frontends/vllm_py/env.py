"""Where vllm-py's in-process vLLM makes its ipc sockets: the driver's private dir, per case.

vLLM names its own ipc endpoints `ipc://{envs.VLLM_RPC_BASE_PATH}/{uuid4()}`
(vllm/utils/network_utils.py:175-177, `get_open_zmq_ipc_path`), the base defaulting to
`tempfile.gettempdir()` (vllm/envs.py:732-734). In the configs vllm-py builds, that is the DP
coordinator's front publish address (v1/engine/coordinator.py:89-95: `local_only` for a
frontend that is not in external/hybrid LB mode, so an ipc path even when the engines are
remote); the coordinator is a process AsyncLLM.shutdown() terminates (v1/utils.py:605-640,
SIGTERM), so libzmq never unlinks the file, and every DP > 1 handshake-mode case used to
leave one socket file in /tmp. No constructor argument or config field names that base:
`vllm.envs` reads the variable from os.environ at each access (unless
`enable_envs_cache()` ran in this process, which only an EngineCore process does,
v1/engine/core.py:248). So the driver sets `VLLM_RPC_BASE_PATH` to its private 0700 ipc
dir for its lifetime (start to shutdown), and the dir and every socket in it go at teardown.

This is the one vLLM variable the harness changes in-process per case; the others are
process-wide settings made once before vLLM is imported (VLLM_HOST_IP, VLLM_TARGET_DEVICE:
vllm_py._load_vllm) and the multiprocessing method for the span of a handshake-mode
constructor (vllm_py_handshake._patched). Drivers may overlap (a test holding two), so the
variable is the newest live driver's dir and the value from before the first comes back
once the last releases it.
"""

from __future__ import annotations

import os
import threading

RPC_BASE_VAR = "VLLM_RPC_BASE_PATH"

_LOCK = threading.Lock()
_HOLDERS: list[str] = []  # the dirs of the drivers holding the variable, oldest first
_ORIGINAL: list[str | None] = []  # the value before the first holder (one item while held)


def hold_rpc_base(path: str) -> None:
    """Point vLLM's ipc base at `path` until `release_rpc_base(path)`."""
    with _LOCK:
        if not _HOLDERS:
            _ORIGINAL[:] = [os.environ.get(RPC_BASE_VAR)]
        _HOLDERS.append(path)
        os.environ[RPC_BASE_VAR] = path


def release_rpc_base(path: str) -> None:
    """Give the variable back: to the newest remaining holder, else its original value."""
    with _LOCK:
        if path not in _HOLDERS:
            return
        _HOLDERS.remove(path)
        if _HOLDERS:
            os.environ[RPC_BASE_VAR] = _HOLDERS[-1]
            return
        original = _ORIGINAL.pop() if _ORIGINAL else None
        if original is None:
            os.environ.pop(RPC_BASE_VAR, None)
        else:
            os.environ[RPC_BASE_VAR] = original
