"""The agent's side of `xhagent-shim --serve` (native/shim_serve.c): one long-lived shim
process that makes each workload's supervisor by a fork of itself, so that a start costs
the agent a message instead of a process spawn and an exec on its own thread.

    server = ShimServer(shim_group, shim_path)
    server.start()                                   # or at the first request
    shim = server.request(shim_args, env, ready_w)   # ready_w: the supervisor's stdout
    shim.poll() / shim.wait(timeout) / shim.kill() / shim.pidfd

A supervisor is exactly a one-shot shim (the same records, in its own session, outliving
the agent), only not the agent's child: `ServedShim` tells its end by its pidfd, not by a
status. A server that ended is started again at the next request (which is sent once
more, to the new one); a request it cannot take (a command line over
REQUEST_MAX, a server that cannot start) raises `Unserved`, and the caller spawns a
one-shot shim instead. Requests come from the scheduler loop, but any thread may send one.

With `at`, the server is not the agent's child but `xhagent-shim --serve-at AT`, the main
process of its own unit (the packaged xhagent-workloads.service): the agent connects to it
instead of starting one, and moves it into the shims' group, where its forks belong. Its
workloads are then none of the agent's descendants, so the agent's own sandbox binds none
of them. A server that cannot be reached raises `Unserved` as one that cannot start does.
"""

from __future__ import annotations

import array
import errno
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...cgroups import Cgroup, Spawned, signal_process

REQUEST_MAX = 60 << 10  # shim_serve.c's: a larger request goes to a one-shot shim
REPLY = struct.Struct("=ii")  # struct shim_reply: the supervisor's pid (or -1), errno
PEER = struct.Struct("=iII")  # struct ucred: pid, uid, gid
# Empty arguments after `--serve`: room in the server's command line that each supervisor
# fills with its own, so that ps shows which task it serves, as it shows a one-shot shim's.
TITLE_ROOM = 4096
REPLY_TIMEOUT_S = 5.0  # a server that forks nothing in this long is taken for stuck


class Unserved(OSError):
    """The server cannot take this request: start a one-shot shim instead."""


class ServedShim:
    """A supervisor the server forked: alive until its pidfd turns readable. Its pid and
    pidfd come with the server's reply, read when first needed (so that many requests are
    sent before any reply is awaited). Its exit status is the server's to reap:
    `returncode` is 0 once it ended (its records say how), and its pidfd is closed then, as
    a reaped child's is."""

    def __init__(self, server: ShimServer):
        self._server: ShimServer | None = server  # until its reply is read
        self._pid = -1
        self._pidfd: int | None = None
        self.returncode: int | None = None
        self.error: ShimServerError | None = None  # the server started no shim for it

    def answered(self, pid: int, pidfd: int | None) -> None:
        self._server, self._pid, self._pidfd = None, pid, pidfd

    @property
    def pid(self) -> int:
        self._answer()
        return self._pid

    @property
    def pidfd(self) -> int | None:
        self._answer()
        return self._pidfd

    def _answer(self) -> None:
        if self._server is not None:
            self._server.answer(self)
        if self.error is not None:
            raise self.error

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._gone()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired(["xhagent-shim", str(self.pid)], timeout or 0)
            self._gone()
        return 0

    def send_signal(self, sig: int) -> None:
        """Signal it, unless it ended (see `signal_process`)."""
        if self.returncode is None and self.pid > 0:  # (never a kill(-1))
            signal_process(self.pid, self.pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _gone(self) -> None:
        self.returncode = 0
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _ended(self, timeout: float | None) -> bool:
        if self.pidfd is None:  # (no pidfd_open: the pid alone, as after an agent restart)
            deadline = None if timeout is None else time.monotonic() + timeout
            while _alive(self._pid):
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
            return True
        return bool(select.select([self._pidfd], [], [], timeout)[0])


class ShimServerError(OSError):
    """A request sent that the server did not start a shim for (it ended, or failed to fork)."""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")


def encode(args: Sequence[str], env: Mapping[str, str]) -> bytes:
    """A request: the one-shot shim's arguments (after its name) and the environment."""
    parts = [os.fsencode(a) for a in args] + [
        os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()
    ]
    if any(b"\0" in p for p in parts):
        raise ValueError("an argument or environment entry holds a NUL byte")
    return struct.pack("=I", len(args)) + b"".join(p + b"\0" for p in parts)


class ShimServer:
    def __init__(self, group: Cgroup, program: Path | str, at: Path | None = None):
        self.group, self.program, self.at = group, str(program), at
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: Spawned | None = None
        self._awaited: deque[ServedShim] = deque()  # requests sent, their replies not read
        self.started = 0  # servers started (or connected to, with `at`), the first included
        # With `at`: told (reached, why) each time the server turns reachable or not, once
        # per change, so that a node whose workloads lost their unit's sandbox hears of it.
        self.on_reach: Callable[[bool, str], None] = lambda reached, why: None
        self._reached: bool | None = None
        self.unserved = 0  # requests it could not take (each spawned a one-shot shim)

    def request(self, args: Sequence[str], env: Mapping[str, str], ready_w: int) -> ServedShim:
        """A supervisor for the one-shot command line `args` with `env`, its stdout
        `ready_w` (the caller keeps and closes its own copy). Sent, not awaited: the reply
        is read when the result's pid or pidfd is first asked for."""
        try:
            return self._request(encode(args, env), ready_w)
        except Unserved:
            self.unserved += 1
            raise

    def _request(self, message: bytes, ready_w: int) -> ServedShim:
        if len(message) > REQUEST_MAX:
            raise Unserved(errno.EMSGSIZE, f"the command line is over {REQUEST_MAX} bytes")
        with self._lock:
            for attempt in (0, 1):  # a server that ended: once more, to a new one
                sock = self._connected()
                try:
                    fds = array.array("i", [ready_w])
                    sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                except (BrokenPipeError, ConnectionResetError):
                    self._failed("the shim server ended")
                    if attempt:
                        raise Unserved(errno.EPIPE, "the shim server ended twice") from None
                    continue
                shim = ServedShim(self)
                self._awaited.append(shim)
                return shim
            raise AssertionError("unreachable")

    def answer(self, shim: ServedShim) -> None:
        """Read replies, in the order of the requests, until `shim`'s is in."""
        with self._lock:
            while shim._server is not None:
                if not self._awaited or self._sock is None:
                    raise ShimServerError(errno.EPIPE, "the shim server ended before it answered")
                self._read_reply(self._sock)

    def _read_reply(self, sock: socket.socket) -> None:
        if not select.select([sock], [], [], REPLY_TIMEOUT_S)[0]:
            self._failed(f"the shim server did not answer in {REPLY_TIMEOUT_S:g}s")
        elif not self._take_reply(sock):
            self._failed("the shim server ended before it answered")

    def _take_reply(self, sock: socket.socket) -> bool:
        """The next reply (one is there), given to the oldest request; False when the
        server's end is closed instead."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, REPLY.size, 1)
        except ConnectionResetError:
            data, fds = b"", []
        if len(data) != REPLY.size:
            for fd in fds:
                os.close(fd)
            return False
        pid, err = REPLY.unpack(data)
        shim = self._awaited.popleft()
        if pid < 0:
            for fd in fds:
                os.close(fd)
            shim.answered(-1, None)
            shim.returncode = 0
            shim.error = ShimServerError(
                err or errno.EIO, f"the shim server could not start a shim: {os.strerror(err)}"
            )
        else:
            shim.answered(pid, fds[0] if fds else None)
        return True

    def _failed(self, why: str) -> None:
        """The server is let go of: the replies it sent are taken first, then every request
        it did not answer fails with `why` (never another server's reply for it)."""
        sock = self._sock
        while self._awaited and sock is not None and select.select([sock], [], [], 0)[0]:
            if not self._take_reply(sock):
                break
        awaited, self._awaited = self._awaited, deque()
        self._drop()
        for shim in awaited:
            shim.answered(-1, None)
            shim.returncode = 0
            shim.error = ShimServerError(errno.EPIPE, why)

    def start(self) -> None:
        """Start the server now, not at the first request (which would wait for its exec);
        Unserved when it cannot be (requests then go to one-shot shims)."""
        with self._lock:
            self._connected()

    def _connected(self) -> socket.socket:
        if self._sock is not None and (
            self.at is not None or (self._process is not None and self._process.poll() is None)
        ):  # (one at `at` that ended shows as a send that fails)
            return self._sock
        self._failed("the shim server ended before it answered")  # (its replies taken)
        if self.at is not None:
            return self._connect(self.at)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:  # its own session, in the shims' group, which is never frozen
                self._process = self.group.spawn(
                    [self.program, "--serve", *[""] * TITLE_ROOM], env={},
                    stdin=theirs.fileno(), stdout=null, stderr=null, start_new_session=True,
                )  # fmt: skip
            finally:
                os.close(null)
        except OSError as exc:
            ours.close()
            raise Unserved(
                exc.errno or errno.EIO, f"the shim server did not start: {exc}"
            ) from None
        finally:
            theirs.close()
        self._sock = ours
        self.started += 1
        return ours

    def _connect(self, at: Path) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(os.fspath(at))
            pid, uid, _gid = PEER.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size)
            )
            if uid != os.geteuid():  # (its directory's owner let another user bind there)
                raise PermissionError(errno.EPERM, f"served by uid {uid}, not the agent's")
            if pid not in self.group.procs():
                self.group.add_proc(pid)
        except OSError as exc:
            sock.close()
            why = f"the shim server at {at}: {exc.strerror or exc}"
            self._reach(False, why)
            raise Unserved(exc.errno or errno.EIO, why) from None
        self._sock = sock
        self.started += 1
        self._reach(True, f"workloads start from the shim server at {at} (pid {pid})")
        return sock

    def _reach(self, reached: bool, why: str) -> None:
        if self._reached is not reached:
            self._reached = reached
            self.on_reach(reached, why)

    def _drop(self) -> None:
        """Let go of the server: its socket closed, it ends (and is reaped) on its own."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        process, self._process = self._process, None
        if process is not None:
            _reap_later(process)

    def close(self) -> None:
        """The server ends (its supervisors go on); waits a moment for it. One at `at` is
        only disconnected from: it serves the next agent."""
        with self._lock:
            process = self._process
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._process = None
        if process is not None:
            try:
                process.wait(timeout=2.0)
            except Exception:  # (a server that does not end on EOF: it is killed)
                process.kill()
                process.wait()


def _reap_later(process: Spawned) -> None:
    """A server let go of is waited for by a thread of its own: the caller must not wait."""
    if process.poll() is not None:
        return

    def reap() -> None:
        try:
            process.wait(timeout=10.0)
        except Exception:
            process.kill()
            process.wait()

    threading.Thread(target=reap, name="xhagent-shim-server-reap", daemon=True).start()


__all__ = ["REQUEST_MAX", "ServedShim", "ShimServer", "Unserved", "encode"]
