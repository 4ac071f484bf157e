"""The standard gRPC services beside the agent's own, for the tools that speak only them:
`grpc.health.v1.Health` (Kubernetes gRPC probes, grpc_health_probe, load balancers) and
server reflection (grpcurl, grpcui), both from the grpcio packages made for them.

Health follows the agent's own: SERVING for the whole server ("") and for `xhagent.v1.Agent`
while nothing fails (the loop, the state disk: what the Health RPC's `status` says), else
NOT_SERVING; NOT_SERVING for all once the agent stops. Any caller the socket admits may ask:
neither service tells more than the socket's own existence and the public proto. Their
streams (Health.Watch, ServerReflectionInfo) hold no thread, and at most MAX_STREAMS of them
are open at once; past that a new one is RESOURCE_EXHAUSTED.

    health = AgentHealth(status)     # status(): None when nothing fails, else one line
    add_standard_services(server, health)
    health.changed()                 # from any thread, after anything that may move it
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from .v1 import agent_pb2

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
MAX_STREAMS = 64  # Watch and reflection streams open at once, all callers together
STOP_TELL_S = 0.1  # at a stop, for open watchers to be sent NOT_SERVING

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Streams:
    """Counts the standard services' open streams against MAX_STREAMS (on the server's loop,
    so without a lock)."""

    def __init__(self) -> None:
        self.open = 0

    async def admit(self, context, what: str) -> None:
        if self.open >= MAX_STREAMS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{what}: {MAX_STREAMS} such streams are open already; try again later",
            )
        self.open += 1


class AgentHealth(health.aio.HealthServicer):
    def __init__(self, status: Callable[[], str | None]):
        super().__init__()
        self._status = status
        self._shown: int | None = None  # what was last set (any thread reads it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.streams = _Streams()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server's event loop: where the servicer's state changes."""
        self._loop = loop
        loop.call_soon_threadsafe(lambda: loop.create_task(self._follow()))

    def changed(self) -> None:
        """The agent's health may have moved (any thread): the services follow, and only a
        change wakes the server's loop."""
        if self._loop is not None and not self._stopping and self._now() != self._shown:
            try:
                self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._follow()))
            except RuntimeError:
                pass  # the loop is closed: the server stopped

    async def stopping(self) -> None:
        """NOT_SERVING for every service, for good (on the server's loop)."""
        self._stopping = True
        self._shown = NOT_SERVING
        await self.enter_graceful_shutdown()
        if self.streams.open:  # the watchers' tasks write it before their streams are cut
            await asyncio.sleep(STOP_TELL_S)

    def _now(self) -> int:
        return SERVING if self._status() is None else NOT_SERVING

    async def _follow(self) -> None:
        if self._stopping:
            return
        now = self._now()
        if now != self._shown:
            self._shown = now
            for name in ("", AGENT_SERVICE):
                await self.set(name, now)

    async def Check(self, request, context):  # noqa: N802 (the proto's name)
        await self._follow()  # exact between the loop's steps too
        return await super().Check(request, context)

    async def Watch(self, request, context):  # noqa: N802 (the proto's name)
        await self.streams.admit(context, "grpc.health.v1.Health/Watch")
        try:
            await self._follow()
            return await super().Watch(request, context)
        finally:
            self.streams.open -= 1


class _Reflection(reflection.aio.ReflectionServicer):
    def __init__(self, names: tuple[str, ...], streams: _Streams):
        super().__init__(names)
        self._streams = streams

    async def ServerReflectionInfo(self, request_iterator, context):  # noqa: N802
        await self._streams.admit(context, "ServerReflectionInfo")
        try:
            async for reply in super().ServerReflectionInfo(request_iterator, context):
                yield reply
        finally:
            self._streams.open -= 1


def add_standard_services(server: grpc.aio.Server, agent_health: AgentHealth) -> None:
    """Health and reflection on `server` (before it starts); reflection names every service
    the server has, itself included."""
    names = (AGENT_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
    health_pb2_grpc.add_HealthServicer_to_server(agent_health, server)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        _Reflection(names, agent_health.streams), server
    )


__all__ = ["AGENT_SERVICE", "MAX_STREAMS", "AgentHealth", "add_standard_services"]
