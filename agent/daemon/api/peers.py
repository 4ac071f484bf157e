"""Who is calling: the kernel's word for every connection to the agent's socket, carried
across grpc, which does not expose it.

grpc serves a private abstract socket. Clients connect to the public socket, where this
relay accepts, reads `SO_PEERCRED` (the uid, gid and pid the kernel recorded at connect),
and opens a connection of its own to grpc from an address the kernel chooses for it
(autobind: unique in the network namespace while the socket lives). A call's
`context.peer()` names that address, and `PeerRelay.caller(peer)` answers whose
connection it carries. Bytes are copied both ways as they come, with backpressure: a side
that cannot keep up pauses the other side's reading, so a connection holds at most one
transport buffer each way.

Invariants:
- an address is known only while the relay's socket holding it is open: it is forgotten
  before that socket is closed, so nobody can bind a freed address and be taken for the
  caller who had it;
- a peer that is not a live relay address (a direct connection to the private socket:
  its name is visible in /proc/net/unix) has no caller, and the servicer refuses it;
- connections are bounded in all and per uid, from what the process may open; past a
  bound a connection is closed at once and counted (`refused`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import secrets
import socket
import struct
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger("xhagent")

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
FDS_PER_CONNECTION = 3  # the accepted socket, the relay's own, and grpc's end of it
RESERVED_FDS = 512  # the store, cgroup files, pidfds, log files of the agent itself
PER_UID_SHARE = 4  # one uid may hold at most a quarter of the connections


@dataclass(frozen=True)
class Caller:
    """A client process as the kernel saw it when it connected."""

    uid: int
    gid: int
    pid: int

    def __str__(self) -> str:
        return f"uid {self.uid} (pid {self.pid})"


def private_address() -> str:
    """A fresh abstract socket name for grpc: random, so two agents never meet."""
    return f"xhagent-grpc-{os.getpid()}-{secrets.token_hex(8)}"


def connection_limit() -> int:
    """How many relayed connections fit in the descriptors this process may open; the
    soft limit is raised to the hard one first, as daemons that hold many sockets do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > 1 << 20:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return max(16, (soft - RESERVED_FDS) // FDS_PER_CONNECTION)


class _Side(asyncio.Protocol):
    """One socket of a relayed connection; what it reads is written to its twin's."""

    def __init__(self, link: _Link | None):
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.twin: _Side | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.twin.transport.write(data)

    def eof_received(self) -> bool:
        # HTTP/2 has no use for a half-closed connection (grpc never half-closes): the end
        # of either side ends the link, its buffered writes flushed first by close()
        self.link.close()
        return False

    def pause_writing(self) -> None:
        self.twin.transport.pause_reading()

    def resume_writing(self) -> None:
        self.twin.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        if self.link is not None:
            self.link.close()


class _ClientSide(_Side):
    """The accepted socket: admitted or refused by its credentials as it connects. What it
    sends before grpc's end is connected is held (one read at most: reading pauses) and
    passed on once it is, so nothing is lost. Pausing in connection_made is not enough:
    the asyncio of Debian 12's Python (3.11.2) starts reading right after connection_made
    even so, and a client's first bytes can come before grpc's end exists."""

    def __init__(self, relay: PeerRelay):
        super().__init__(None)
        self.relay = relay
        self.held: list[bytes] = []
        self.held_eof = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.relay._admit(self) is None:
            transport.abort()
            return
        transport.pause_reading()
        asyncio.get_running_loop().create_task(self.relay._connect(self.link))

    def _upstream_ready(self) -> bool:
        return self.twin is not None and self.twin.transport is not None

    def data_received(self, data: bytes) -> None:
        if self._upstream_ready():
            self.twin.transport.write(data)
            return
        self.held.append(data)
        self.transport.pause_reading()

    def eof_received(self) -> bool:
        if self._upstream_ready():
            return super().eof_received()
        self.held_eof = True  # ended before grpc's end was made: what it sent goes first
        return True

    def pause_writing(self) -> None:
        if self._upstream_ready():
            super().pause_writing()

    def resume_writing(self) -> None:
        if self._upstream_ready():
            super().resume_writing()

    def upstream_connected(self) -> None:
        """grpc's end is connected: what was held goes first, then reading resumes."""
        for data in self.held:
            self.twin.transport.write(data)
        self.held = []
        if self.held_eof:
            self.link.close()
        else:
            self.transport.resume_reading()


class _Link:
    """A client's connection and the relay's own to grpc, closed together."""

    def __init__(self, relay: PeerRelay, caller: Caller, client: _ClientSide):
        self.relay, self.caller = relay, caller
        self.client, self.upstream = client, _Side(self)
        client.link = self
        self.client.twin, self.upstream.twin = self.upstream, self.client
        self.address: str | None = None
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.relay._forget(self)  # before the address can be freed: see the invariants
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()


class PeerRelay:
    """The public socket's listener; runs on the grpc server's event loop."""

    def __init__(self, listener: socket.socket, upstream: str, limit: int | None = None):
        self._listener = listener
        self.upstream = upstream  # grpc's abstract socket name (no leading NUL)
        self.limit = limit or connection_limit()
        self.per_uid = max(8, self.limit // PER_UID_SHARE)
        self._by_address: dict[str, _Link] = {}
        self._links: set[_Link] = set()
        self._per_uid: Counter[int] = Counter()
        self.refused = 0  # connections closed at once: over a bound, or no credentials
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accepted, sock=self._listener)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()

    def caller(self, peer: str) -> Caller | None:
        """Whose connection grpc's `context.peer()` is, None when it is no relay's."""
        link = self._by_address.get(peer)
        return None if link is None else link.caller

    @property
    def connections(self) -> int:
        return len(self._links)

    def _accepted(self) -> _ClientSide:
        return _ClientSide(self)

    def _admit(self, side: _ClientSide) -> _Link | None:
        sock = side.transport.get_extra_info("socket")
        try:
            pid, uid, gid = _CREDS.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
            )
        except OSError:
            pid = None
        if pid is None or len(self._links) >= self.limit or self._per_uid[uid] >= self.per_uid:
            self.refused += 1
            return None
        link = _Link(self, Caller(uid, gid, pid), side)
        self._links.add(link)
        self._per_uid[uid] += 1
        return link

    async def _connect(self, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.bind("")  # autobind: an abstract address the kernel picks, unique
            address = sock.getsockname()
            await loop.sock_connect(sock, "\0" + self.upstream)
        except OSError as exc:
            sock.close()
            log.warning("api: cannot reach the agent's grpc server: %s", exc.strerror)
            link.close()
            return
        if link.closed:  # the client left while this connected
            sock.close()
            return
        link.address = _peer_name(address)
        self._by_address[link.address] = link
        await loop.create_unix_connection(lambda: link.upstream, sock=sock)
        if link.closed:  # the client left while grpc's end was being made
            link.upstream.transport.close()
        else:
            link.client.upstream_connected()

    def _forget(self, link: _Link) -> None:
        if link in self._links:
            self._links.discard(link)
            self._per_uid[link.caller.uid] -= 1
            if not self._per_uid[link.caller.uid]:
                del self._per_uid[link.caller.uid]
        if link.address is not None:
            self._by_address.pop(link.address, None)


def _peer_name(address) -> str:
    """An address as grpc's `context.peer()` spells it."""
    if isinstance(address, bytes):  # abstract: a leading NUL, then the name
        return "unix-abstract:" + address[1:].decode("latin-1")
    return f"unix:{address}"


__all__ = ["Caller", "PeerRelay", "connection_limit", "private_address"]
