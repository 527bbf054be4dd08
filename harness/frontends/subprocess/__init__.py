"""The subprocess side of corewire's driver protocol (docs/driver-protocol.md).

A frontend written in any language joins the suites through a driver program that speaks
JSON lines on stdin/stdout. This package holds that protocol (`protocol`), the harness's end
of it (`driver`: `SubprocessDriver` runs a program and drives it), and our own driver
program (`program`, `python -m harness.frontends.subprocess.program --frontend SPEC`): it
serves ANY in-process `FrontendDriver` behind the protocol (the reference frontend by
default, a mutant, ...), so `reference-subprocess` exercises the very code the in-process
`reference` runs. A port author's template is the standalone example port,
fixtures/example_port/driver.py (pyzmq and msgspec only). `faults` injects the
misbehaviour the harness's own fault tests need; `remote_engines` is the `EngineSide` the
program hands its driver (the harness, not the program, starts the engines); `feed` reads
the commands.
"""
