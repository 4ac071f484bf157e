"""The server side of the agent's gRPC surface on a unix socket: serving the `Agent`
service there (`bind`); the client the CLI uses (`connect`) is client.py's.

The contract is `v1/agent.proto` (package `xhagent.v1`). This module is plumbing only:
what each RPC does is the daemon's servicer, whose methods (`@unary`) raise
`InvalidArgument`, `FailedPrecondition`, `NotFound` and `DataLoss` so that every client sees
the same status codes. Every method is served through one guard (`_guarded`): a request
that does not decode (a string field of bad UTF-8) is INVALID_ARGUMENT naming the field,
the servicer's `check(request)` runs before the method, and whatever else a method raises
becomes the servicer's `failure_of(method, exc)`, by default INTERNAL with one line, never
grpc's UNKNOWN "Unexpected <class ...>".

    server = bind(servicer, resolve_socket(socket_option))    # the daemon
    server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import grp
import inspect
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from .client import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from .peers import PeerRelay, private_address
from .standard import AgentHealth, add_standard_services
from .v1 import agent_pb2, agent_pb2_grpc

__all__ = [
    "BindError",
    "DataLoss",
    "Server",
    "FailedPrecondition",
    "Internal",
    "Failure",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "bind",
    "internal_error",
    "unary",
]

# Details travel in a header that grpc refuses past 16 KiB, percent-encoding non-ASCII bytes
# (x3): 4 KiB of UTF-8 always fits, and holds the first 20 error lines of a file as a rule.
MAX_DETAILS_BYTES = 4096
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with the terminating NUL
SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
STREAMS_END_S = 0.5  # at a stop, of its grace, for streams to end cleanly (bind: ends)


class BindError(Exception):
    """The socket cannot be served: another agent has it, or the path is unsafe."""


def bind(
    servicer: agent_pb2_grpc.AgentServicer,
    path: Path,
    *,
    group: str = "xhagent",
    health: AgentHealth | None = None,
    ends: Callable[[float], Awaitable[None]] | None = None,
    calls: Calls | None = None,
) -> Server:
    """Serve `servicer` at unix socket `path`; the started server (stop() removes the file).

    Access is the file system's first: when `group` exists the socket is root:group 0660
    and a directory bind creates is root:group 0750, so members of the group are clients;
    otherwise the socket is 0600 and only root connects. An existing directory keeps its
    owner and mode (the operator's or systemd's RuntimeDirectory=): it must let the group
    search it, and is refused when others may write in it (they could swap the socket).
    Then each call's caller is known (peers.py): `servicer.identify(context.peer())` is
    the `Caller` of a call's connection, None for a connection that did not come through
    `path`.

    A socket another process answers on is refused (BindError with its pid); one nothing
    listens on is a leftover of a killed agent and is replaced; any other kind of file is
    refused and left alone. Two agents starting at once are kept apart by the daemon's
    state lock, taken before this. The servicer's methods are coroutines (`@unary`, or
    asyncio generators for streams) and what blocks runs on the servicer's `executor`.
    With `health`, the standard health and reflection services are served beside it
    (standard.py). `ends(timeout)`, given, is awaited at a stop before any connection is
    cut: the servicer's streams may end cleanly then. `calls`, given, counts every call of
    the agent's service.
    """
    path = Path(path)
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise BindError(f"{path}: a socket path has at most {_SUN_PATH_MAX} bytes")
    gid = _group_id(group)
    _prepare_dir(path.parent, gid)
    _clear_stale(path)
    listener = _listen(path, gid)
    server = None
    try:
        server = Server(servicer, listener, health, ends, calls)
        servicer.identify = server.relay.caller
        server.start()
    except BaseException:
        if server is not None:
            server.stop(None)
        else:
            listener.close()
            os.unlink(path)
        raise
    return server


def _listen(path: Path, gid: int | None) -> socket.socket:
    """The public socket, born private: the umask is the process's, but it only tightens
    what another thread creates in this instant."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    umask = os.umask(0o177)
    try:
        listener.bind(os.fsencode(path))
    except OSError as exc:
        listener.close()
        raise BindError(f"{path}: cannot bind: {exc.strerror}") from None
    finally:
        os.umask(umask)
    try:
        if gid is not None:
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
        listener.listen(1024)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        os.unlink(path)
        raise
    return listener


class Server:
    """grpc's asyncio server on an event loop thread of its own.

    Why asyncio: grpc's threaded server wakes a thread five times a second to poll its
    queue, and on a VM every wake-up from idle costs CPU time. The asyncio server sleeps in
    the loop's selector until a request comes, so an idle agent costs only grpc core's own
    timers. The servicer's methods are coroutines that hand what blocks to its executor
    (`unary`), so a slow call never stalls the loop.
    """

    def __init__(
        self,
        servicer: agent_pb2_grpc.AgentServicer,
        listener: socket.socket,
        health: AgentHealth | None = None,
        ends: Callable[[float], Awaitable[None]] | None = None,
        calls: Calls | None = None,
    ):
        self._loop = asyncio.new_event_loop()
        self._health, self._ends = health, ends
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="xhagent-grpc", daemon=True
        )
        self._thread.start()
        self._path = os.fsdecode(listener.getsockname())
        self._inode = os.lstat(self._path).st_ino  # removed at stop only if still ours
        upstream = private_address()
        self.relay = PeerRelay(listener, upstream)
        self._server = self._call(self._create(servicer, health, calls))
        if health is not None:
            health.bind(self._loop)
        try:
            self.add_port(f"unix-abstract:{upstream}")
        except RuntimeError as exc:
            self.stop(None)
            raise BindError(f"{self._path}: cannot serve: {exc}") from None

    @staticmethod
    async def _create(servicer, health: AgentHealth | None, calls: Calls | None) -> grpc.aio.Server:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
            ],
        )
        server.add_generic_rpc_handlers((_handlers(servicer, calls),))
        if health is not None:
            add_standard_services(server, health)
        return server

    def _call(self, coro, timeout: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def add_port(self, address: str) -> None:
        async def add():
            self._server.add_insecure_port(address)

        self._call(add())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> None:
        self._call(self._server.start())
        self._call(self.relay.start())

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, give running ones `grace` seconds, then end the loop thread."""
        if self._loop.is_closed():
            return

        async def shutdown():
            if self._health is not None:
                await self._health.stopping()  # probes see it go before the socket does
            if self._ends is not None:
                await self._ends(min(grace or 0.0, STREAMS_END_S))
            await self.relay.stop()
            await self._server.stop(grace)
            # calls grpc let go of but whose coroutines still wait (on an executor): ended
            # here, not destroyed pending with the loop
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self._call(shutdown(), None)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            try:
                if os.lstat(self._path).st_ino == self._inode:
                    os.unlink(self._path)
            except FileNotFoundError:
                pass


def _group_id(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _prepare_dir(folder: Path, gid: int | None) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)  # opened to the group only once it is the right group
    except FileExistsError:
        pass
    else:
        if gid is not None:
            os.chown(folder, -1, gid)
        os.chmod(folder, 0o750)
        return
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise BindError(f"{folder}: not a directory")
    if st.st_mode & stat.S_IWOTH:
        raise BindError(
            f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
            "anyone could replace the socket; use a directory only root writes in"
        )
    if st.st_uid not in (0, os.geteuid()):
        raise BindError(f"{folder} belongs to uid {st.st_uid}, who could replace the socket")


def _clear_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise BindError(f"{path} exists and is not a socket: remove it or choose another --socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(os.fsencode(path))
        except ConnectionRefusedError:
            os.unlink(path)  # nothing listens: what a SIGKILLed agent leaves behind
            return
        except TimeoutError:
            raise BindError(f"another agent serves at {path} (busy)") from None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", creds)[0]
    raise BindError(f"another agent serves at {path}" + (f" (pid {pid})" if pid else ""))


def _fit(message: str) -> str:
    """Whole lines of `message` up to MAX_DETAILS_BYTES, then how many were left out."""
    if len(message.encode()) <= MAX_DETAILS_BYTES:
        return message
    lines, kept, size = message.splitlines(), [], 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > MAX_DETAILS_BYTES - 64:
            break
        kept.append(line)
    if not kept:  # one line too long on its own
        return message.encode()[: MAX_DETAILS_BYTES - 4].decode(errors="ignore") + " ..."
    return "\n".join([*kept, f"... {len(lines) - len(kept)} more lines"])


class Failure(Exception):
    """What a servicer method raises to end its call with `code` and the message as details
    (cut to fit a header: `_fit`)."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(Failure):
    """Bad input: `FILE:LINE:COL: message` lines, in file order (the CLI exits 2)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(Failure):
    """The node will not or cannot do it (the CLI exits 1)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(Failure):
    """No task or policy by that id or name (the CLI exits 1)."""

    code = grpc.StatusCode.NOT_FOUND


class PermissionDenied(Failure):
    """The caller may not do it; the message names the caller (the CLI exits 1)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(Failure):
    """A call whose connection did not come through the agent's socket."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(Failure):
    """The caller holds as much as it may (streams); the CLI exits 1."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DataLoss(Failure):
    """What the agent keeps of it cannot be read back (a corrupt row; the CLI exits 1)."""

    code = grpc.StatusCode.DATA_LOSS


class Internal(Failure):
    """The agent's own fault, in one line (the CLI exits 1)."""

    code = grpc.StatusCode.INTERNAL


def unary(impl):
    """A servicer method from a plain function `impl(self, request, peer) -> reply`, run on
    the servicer's `executor` (it may block: the store, the agent's lock); `peer` is the
    call's `context.peer()`, whose caller `servicer.identify` names."""

    async def method(self, request, context):
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, impl, self, request, context.peer()
        )

    method.__name__ = method.__qualname__ = impl.__name__
    method.__doc__ = impl.__doc__
    return method


class Calls(Protocol):
    """Who counts the calls (the agent's metrics): each call's start, and its end with its
    status code's name and how long it took."""

    def call_started(self, service: str, method: str, kind: str) -> None: ...

    def call_ended(
        self, service: str, method: str, kind: str, code: str, seconds: float
    ) -> None: ...


class _Counted:
    """`with _Counted(...)`: one call's start and its end told to `calls`, with the code it
    ended with (what it raised says which); nothing when `calls` is None."""

    def __init__(self, calls: Calls | None, method: str, kind: str, context):
        self.calls, self.method, self.kind, self.context = calls, method, kind, context

    def __enter__(self) -> _Counted:
        self.began = time.monotonic()
        if self.calls is not None:
            self.calls.call_started(SERVICE, self.method, self.kind)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self.calls is None:
            return
        if exc is None:
            code = "OK"
        elif isinstance(exc, asyncio.CancelledError | GeneratorExit):
            code = "CANCELLED"  # the client went, or the server stops
        else:
            code = getattr(self.context.code(), "name", None) or "UNKNOWN"
        seconds = time.monotonic() - self.began
        self.calls.call_ended(SERVICE, self.method, self.kind, code, seconds)


def _handlers(servicer, calls: Calls | None = None) -> grpc.GenericRpcHandler:
    """The `Agent` service's methods, each behind `_guarded`; requests arrive as bytes so that
    one that does not decode is the guard's to answer, not grpc's."""
    service = agent_pb2.DESCRIPTOR.services_by_name["Agent"]
    handlers = {}
    for m in service.methods:
        request_type = getattr(agent_pb2, m.input_type.name)
        reply_type = getattr(agent_pb2, m.output_type.name)
        handler = (
            grpc.unary_stream_rpc_method_handler
            if m.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        impl = _guarded_stream if m.server_streaming else _guarded
        handlers[m.name] = handler(
            impl(servicer, m.name, request_type, calls),
            response_serializer=reply_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _guarded(servicer, name: str, request_type, calls: Calls | None = None):
    method = getattr(servicer, name)

    async def call(data: bytes, context):
        with _Counted(calls, name, "unary", context):
            request = await _admitted(servicer, name, request_type, data, context)
            try:
                reply = method(request, context)
                return await reply if inspect.isawaitable(reply) else reply
            except Exception as exc:  # noqa: BLE001 - every failure ends as a status, in one line
                await _abort(servicer, name, exc, context)

    return call


def _guarded_stream(servicer, name: str, request_type, calls: Calls | None = None):
    method = getattr(servicer, name)

    async def call(data: bytes, context):
        items = None
        with _Counted(calls, name, "server_stream", context):
            request = await _admitted(servicer, name, request_type, data, context)
            try:
                items = method(request, context)
                if inspect.isasyncgen(items):
                    async for item in items:
                        yield item
                else:
                    for item in items:
                        yield item
            except Exception as exc:  # noqa: BLE001 - every failure ends as a status, in one line
                await _abort(servicer, name, exc, context)
            finally:
                if inspect.isasyncgen(items):  # its own cleanup now, not when it is collected
                    await items.aclose()

    return call


async def _admitted(servicer, name: str, request_type, data: bytes, context):
    """The request decoded and checked; the call aborted when it is not one."""
    try:
        request = request_type.FromString(data)
    except DecodeError:
        field = _bad_utf8_field(request_type, data)
        why = f"{field}: not valid UTF-8" if field else "the request does not decode"
        await context.abort(InvalidArgument.code, why)
    check = getattr(servicer, "check", None)
    try:
        if check is not None:
            check(request)
    except Exception as exc:  # noqa: BLE001
        await _abort(servicer, name, exc, context)
    return request


async def _abort(servicer, name: str, exc: Exception, context):
    if isinstance(exc, grpc.aio.AbortError | NotImplementedError):
        # the method ended the call itself (an unimplemented one set UNIMPLEMENTED first)
        raise exc
    failure = exc if isinstance(exc, Failure) else None
    if failure is None:
        failure_of = getattr(servicer, "failure_of", None)
        failure = failure_of(name, exc) if failure_of else _internal(name, exc)
    await context.abort(failure.code, _fit(str(failure)))


def _internal(name: str, exc: Exception) -> Internal:
    logging.getLogger("xhagent").error("internal error in %s", name, exc_info=exc)
    return internal_error(name, exc)


def internal_error(name: str, exc: BaseException) -> Internal:
    """What a client reads of an unexpected exception in method `name`: one line."""
    what = " ".join(str(exc).split())[:300] or "an unexpected error"
    return Internal(f"internal error in {name}: {what} (the agent's log has the details)")


def _bad_utf8_field(request_type, data: bytes) -> str | None:
    """The name of the first string field of `data` that is not UTF-8 (the requests are flat
    messages: their fields are scalars, strings and repeated strings)."""
    fields = request_type.DESCRIPTOR.fields_by_number
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            elif wire == 2:
                size, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + size], pos + size
                field = fields.get(number)
                if field is not None and field.type == field.TYPE_STRING:
                    chunk.decode()
            else:
                return None
    except UnicodeDecodeError:
        return field.name
    except IndexError:
        return None
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
