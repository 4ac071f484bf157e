"""`agent_pool()`: a client of the worker pool another process's agent hosts (`xhagent run
--pool`), found through that agent's Health reply."""

from __future__ import annotations

import json
from pathlib import Path

from ...runtime.clients import PoolClient
from .client import connect, resolve_socket
from .v1 import agent_pb2 as pb


def agent_pool(socket: str | Path | None = None, timeout: float = 10.0):
    """A PoolClient of the pool of the agent on `socket` (default: the agent's own); a
    RuntimeError when that agent hosts none."""
    path = resolve_socket(str(socket) if socket is not None else None)
    with connect(path, timeout=timeout) as client:
        health = client.Health(pb.HealthRequest())
    if not health.pool_json:
        raise RuntimeError(f"the agent on {path} hosts no pool (xhagent run --pool)")
    return PoolClient(tuple(json.loads(health.pool_json)["address"]))
