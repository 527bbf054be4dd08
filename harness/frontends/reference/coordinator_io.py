"""Thin asyncio + pyzmq transport around `CoordinatorCore` (the reference frontend's own
DP coordinator in handshake mode).

Binds what vLLM's coordinator binds for its engines (coordinator.py:206-219): an XPUB the
engines' XSUBs connect to (`coordinator_input` in INIT; verbose, so every engine's
subscription is seen) and a PULL the engines PUSH to (`coordinator_output`). Effects other
than publications go to the frontend through `on_effect`; a fatal coordinator error goes
to `on_error` and ends the task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import cast

import zmq
import zmq.asyncio

from harness.frontends.reference.coordinator import (
    CoordinatorCore,
    CoordinatorError,
    Effect,
    Publish,
)
from harness.protocol.transport.sockets import make_socket


class CoordinatorTransport:
    """The coordinator's two engine-facing sockets and the task that serves them."""

    def __init__(self, core: CoordinatorCore, ctx: zmq.asyncio.Context,
                 on_effect: Callable[[Effect], None],
                 on_error: Callable[[CoordinatorError], None]) -> None:
        self.core = core
        self._ctx = ctx
        self._on_effect = on_effect
        self._on_error = on_error
        self._xpub: zmq.asyncio.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def bind(self, input_address: str, output_address: str) -> None:
        ctx = cast("zmq.Context[zmq.Socket[bytes]]", self._ctx)
        self._xpub = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.XPUB))
        self._pull = cast(zmq.asyncio.Socket, make_socket(ctx, zmq.PULL))
        self._xpub.bind(input_address)
        self._pull.bind(output_address)

    def start(self) -> None:
        """Serve subscriptions and engine messages until closed (started before INIT goes
        out, so the startup gate can open while the handshake runs)."""
        if self._task is None:
            self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        assert self._xpub is not None and self._pull is not None
        poller = zmq.asyncio.Poller()
        poller.register(self._xpub, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        try:
            while True:
                events = dict(await poller.poll())
                if self._xpub in events:
                    await self._apply(self.core.on_subscription(await self._xpub.recv()))
                if self._pull in events:
                    frames = await self._pull.recv_multipart()
                    await self._apply(self.core.on_engine_output(frames))
        except CoordinatorError as exc:
            self._on_error(exc)

    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Publish):
                await self.publish(effect)
            else:
                self._on_effect(effect)

    async def publish(self, effect: Publish) -> None:
        assert self._xpub is not None
        await self._xpub.send_multipart(list(effect.frames))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for sock in (self._xpub, self._pull):
            if sock is not None:
                sock.close(0)
