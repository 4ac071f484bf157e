"""`cases.burst.call_floor`: what one unary call costs on this machine, in the same run as the
burst's Submits, from the same client threads: the ceiling of any Submit rate.

- `grpc_alone`: a grpcio asyncio server (what the agent serves with) in a process of its
  own, one method that does nothing (bytes in, no bytes out, no messages to decode), on a
  unix socket: the pace of the RPC framework itself here;
- `agent_health`: the agent's Health over its socket (the caller's credentials relayed,
  the call handed to an API thread, a reply that reads nothing from the store): the
  agent's cost of a call before any work.

Each is `calls` calls from `clients` threads at once, each thread on its own channel, closed
loop (submits.calls_from_clients, as the burst's Submits are made): calls/s, p50/p99.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from .submits import Calls, calls_from_clients, spread_us

METHOD = "/xhagent.bench.Noop/Call"
# grpc's own default serializers would be protobuf's: identity here, so nothing but the
# framework's call is measured
NOOP_SERVER = """
import asyncio, sys, grpc
async def main():
    async def call(request, context):
        return b""
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(call)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("xhagent.bench.Noop", {"Call": handler}),)
    )
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    print("up", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def figures(sent: Calls, clients: int) -> dict:
    n = len(sent.latencies_us)
    return {
        "calls": n,
        "clients": clients,
        "per_s": round(n / sent.wall_s, 1),
        **{k.removeprefix("call_"): v for k, v in spread_us("call", sent.latencies_us).items()},
    }


def grpc_alone(base: Path, calls: int, clients: int) -> dict:
    import grpc

    path = base / "noop.sock"
    proc = subprocess.Popen(
        [sys.executable, "-c", NOOP_SERVER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        if proc.stdout.readline().strip() != "up":
            raise RuntimeError(f"the no-op grpc server did not start (exit {proc.wait()})")

        @contextmanager
        def session():
            with grpc.insecure_channel(f"unix:{path}") as channel:
                noop = channel.unary_unary(METHOD)
                yield lambda i: noop(b"", timeout=30)

        return figures(calls_from_clients(session, calls, clients), clients)
    finally:
        proc.kill()
        proc.wait()
        path.unlink(missing_ok=True)


def agent_health(agent, calls: int, clients: int) -> dict:
    from ..daemon.api.v1 import agent_pb2 as pb

    @contextmanager
    def session():
        with agent.client() as c:
            yield lambda i: c.Health(pb.HealthRequest())

    return figures(calls_from_clients(session, calls, clients), clients)


def call_floor(agent, calls: int, clients: int) -> dict:
    return {
        "grpc_alone": grpc_alone(agent.base, calls, clients),
        "agent_health": agent_health(agent, calls, clients),
    }
