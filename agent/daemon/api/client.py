"""The client side of the agent's gRPC surface: where the socket is (`resolve_socket`) and
the client the CLI uses (`connect`), importing only grpc and the generated modules, so that
a command such as `xhagent ps` pays for no more than it calls (the server side,
transport.py, loads the store, the peers relay and asyncio).

    with connect(resolve_socket(socket_option)) as agent:      # a CLI command
        print(agent.Health(HealthRequest()).status)            # ApiError: print, exit_code
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc

from ...errors import errno_reason
from .v1 import agent_pb2_grpc

__all__ = [
    "DEFAULT_SOCKET",
    "MAX_REQUEST_BYTES",
    "MAX_RESPONSE_BYTES",
    "SOCKET_ENV",
    "AgentClient",
    "AgentUnavailable",
    "ApiError",
    "connect",
    "resolve_socket",
]

DEFAULT_SOCKET = "/run/xhagent/xhagent.sock"
SOCKET_ENV = "XHAGENT_SOCKET"
# A request carries YAML of at most 4 MiB (the project's input bound) plus a few fields: the
# transport's limit sits just above the bound, so that a document at the bound still fits
# with the rest of its request; the bound itself is the input readers' and the servicer's.
MAX_REQUEST_BYTES = 4 * 2**20 + 64 * 2**10
# Responses are the agent's own (task lists, inventory JSON) and may be larger.
MAX_RESPONSE_BYTES = 64 * 2**20


class ApiError(Exception):
    """A failed RPC: `code` is the status code's name (`INVALID_ARGUMENT`), str() the
    server's details as a user reads them."""

    def __init__(self, code: str, details: str):
        super().__init__(details or code)
        self.code = code
        self.details = details

    @property
    def exit_code(self) -> int:
        # docs/cli.md: 2 for bad input, 1 for what the node refused or could not do.
        return 2 if self.code == "INVALID_ARGUMENT" else 1


class AgentUnavailable(ApiError):
    """No agent answers at the socket, or this user may not reach it."""

    def __init__(self, message: str):
        super().__init__("UNAVAILABLE", message)


def resolve_socket(cli_value: str | None) -> Path:
    """`--socket PATH`, else $XHAGENT_SOCKET, else /run/xhagent/xhagent.sock."""
    return Path(cli_value or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


def connect(path: Path, *, timeout: float | None = 30.0) -> AgentClient:
    """A client of the agent at `path`; AgentUnavailable at once when none answers there or
    this user may not reach it. `timeout` bounds each unary call (streams are unbounded)."""
    path = Path(path)
    if (err := _unreachable(path)) is not None:
        raise err
    return AgentClient(path, timeout=timeout)


def _unreachable(path: Path) -> AgentUnavailable | None:
    """Why no agent answers at `path`, by the errno of a plain connect; None when one does.
    grpc's own UNAVAILABLE text names no errno a user can act on."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(os.fsencode(path))
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError):
            return AgentUnavailable(f"no agent at {path}: start it with `xhagent run`")
        except PermissionError:
            return AgentUnavailable(
                f"{path}: permission denied: run as root or as a member of group xhagent"
            )
        except TimeoutError:
            return AgentUnavailable(f"the agent at {path} does not answer")
        except OSError as exc:
            return AgentUnavailable(errno_reason(exc, str(path)))
    return None


class AgentClient:
    """The `Agent` service's RPCs under their proto names, `client.Health(HealthRequest())`.

    A failure raises ApiError (AgentUnavailable when the agent is gone); a server stream is
    an iterator, and dropping it (or close()) cancels the call.
    """

    def __init__(self, path: Path, *, timeout: float | None = 30.0):
        self.path = Path(path)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            f"unix:{self.path}",
            options=[
                ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
            ],
        )
        self._stub = agent_pb2_grpc.AgentStub(self._channel)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._stub, name)
        if isinstance(method, grpc.UnaryStreamMultiCallable):
            return lambda request, **kw: self._stream(method, request, **kw)
        return lambda request, **kw: self._unary(method, request, **kw)

    def _unary(self, method, request, **kw):
        kw.setdefault("timeout", self.timeout)
        try:
            return method(request, **kw)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _stream(self, method, request, **kw) -> Iterator:
        call = method(request, **kw)  # started now, not at the first next()

        def items():
            try:
                yield from call
            except grpc.RpcError as exc:
                raise self._error(exc) from None
            finally:
                call.cancel()  # a stream the caller stopped reading ends on the server too

        return items()

    def _error(self, exc: grpc.RpcError) -> ApiError:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and (gone := _unreachable(self.path)):
            return gone
        return ApiError(code.name, details)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
