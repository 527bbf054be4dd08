"""A driver program whose daemon tries to outlive the case: it starts one, then serves the
reference frontend behind the driver protocol (harness.frontends.subprocess.program).

    python tests/escaping_drivers.py MODE TAG

MODE:
- `respawn`: the daemon (setsid, double fork, re-exec: a new session, orphaned, a new
  image) answers SIGTERM by doing the same again before it exits, so every SIGTERM leaves
  a fresh copy with a new pid; it keeps its environment (the driver's token).
- `scrubbed`: the daemon re-execs with an empty environment (no token, no owner marker),
  as a program that sanitizes its children's environment would.

TAG is in every daemon's command line (`pgrep -f TAG` finds them). A daemon lives 120 s at
most, so a harness that fails to end it leaves nothing for ever.
"""

from __future__ import annotations

import sys

DAEMON = """import os, signal, sys, time
mode, tag, ESCAPE, DAEMON = sys.argv[1:5]
exec(ESCAPE)  # defines escape()
if mode == "respawn":
    def again(*_):
        escape(mode, tag)
        os._exit(0)
    signal.signal(signal.SIGTERM, again)
os.write(1, b"ready\\n")
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
time.sleep(120)
"""

ESCAPE = """def escape(mode, tag):
    import os, sys
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(r)
            os.dup2(w, 1)
            env = {} if mode == "scrubbed" else dict(os.environ)
            os.execve(sys.executable, [sys.executable, "-c", DAEMON, mode, tag, ESCAPE, DAEMON],
                      env)
        os._exit(0)
    os.close(w)
    os.waitpid(first, 0)
    os.read(r, 16)  # "ready": the daemon runs, its handler is in place
    os.close(r)
"""


def start_daemon(mode: str, tag: str) -> None:
    """Start the daemon and return once it is ready (orphaned, in its own session)."""
    scope: dict[str, object] = {"DAEMON": DAEMON, "ESCAPE": ESCAPE}
    exec(ESCAPE, scope)
    escape = scope["escape"]
    assert callable(escape)
    escape(mode, tag)


def main() -> int:
    mode, tag = sys.argv[1], sys.argv[2]
    if mode not in ("respawn", "scrubbed"):
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 64
    start_daemon(mode, tag)
    from harness.frontends.subprocess.program import main as serve

    return serve([])


if __name__ == "__main__":
    sys.exit(main())
