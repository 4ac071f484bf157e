"""Start a process already inside a cgroup v2 group: it runs no instruction of its command
anywhere else.

Two ways, chosen at run time (`spawn_method()`):

- `clone3`: clone3(CLONE_INTO_CGROUP | CLONE_PIDFD) with the group's directory fd (Linux
  5.7+): the kernel creates the child in the group, and hands back a pidfd.
- `fork`: where the kernel lacks it (or a seccomp filter hides clone3), the child is forked
  in the caller's group and its first step writes itself into the group's cgroup.procs;
  the pidfd comes from pidfd_open (Linux 5.3+) or is None.

Either way the child then sets up stdio, closes every other fd but `pass_fds`, changes
directory, starts a session if asked, puts caught signals back to their defaults and sets
its mask (empty unless `sigmask` is given), and execs (PATH searched in `env`'s PATH; no
shell). A step that fails comes back as a `SpawnError` naming the step, the path and the
errno, after the child is reaped: no 127 exit to guess from, no zombie, nothing left in
the group.

In a frozen group (or under a frozen ancestor) the child is created frozen, before it execs
(clone3: it never reaches user space; fork: it freezes on returning from its cgroup.procs
write). `spawn()` does not wait for that exec: it returns a `Spawned` whose `started` is False,
and the child execs when the group is thawed; `wait()` raises the exec's error then, if any.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import struct
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import errno_reason
from . import registry
from .group import CgroupError

if TYPE_CHECKING:
    from .group import Cgroup

CLONE3 = "clone3"
FORK = "fork"
METHODS = (CLONE3, FORK)

_ERR = struct.Struct("=ii")  # struct xh_spawn_err
_method: str | None = None
_why_not: str | None = None


class SpawnError(CgroupError):
    """The command could not be started in the group: the message names the step and the path."""


def _native():
    from .. import _spawn

    return _spawn


def spawn_method() -> str:
    """`clone3` where this kernel creates a child directly inside a group, else `fork`
    (probed once, without creating a process)."""
    global _method, _why_not
    if _method is None:
        err = _native().lib.xh_clone3_cgroup_probe()
        _method = CLONE3 if err == 0 else FORK
        _why_not = None if err == 0 else f"clone3(CLONE_INTO_CGROUP): {errno_reason(err)}"
    return _method


def spawn_method_reason() -> str | None:
    """Why the fallback is used (the probe's errno), or None with clone3."""
    spawn_method()
    return _why_not


def _cstrings(ffi, items: Sequence[bytes]):
    """A NULL-terminated char*[] and the buffers it points into (keep both alive)."""
    bufs = [ffi.new("char[]", b) for b in items]
    return ffi.new("char *[]", bufs + [ffi.NULL]), bufs


def _bytes(value, what: str) -> bytes:
    b = os.fsencode(value)
    if b"\0" in b:
        raise ValueError(f"{what} contains a NUL byte: {value!r}")
    return b


def _candidates(program: bytes, env: Mapping | None) -> list[bytes]:
    if b"/" in program:
        return [program]
    dirs = os.get_exec_path(env) if env is not None else os.get_exec_path()
    return [os.path.join(os.fsencode(d), program) for d in dirs]


class Spawned:
    """A child started by `spawn()`. `returncode` follows subprocess: the exit status, or -N
    when signal N killed it; None while it runs."""

    def __init__(
        self,
        pid: int,
        pidfd: int | None,
        method: str,
        argv: list[str],
        group: str,
        pipe: int | None,
        cwd: str | None = None,
    ):
        self.pid = pid
        self.pidfd = pidfd
        self.method = method
        self.argv = argv
        self.group = group
        self.returncode: int | None = None
        self._pipe = pipe  # read end of the error pipe while the exec is not confirmed
        self._error: SpawnError | None = None
        self._cwd = cwd

    def __repr__(self) -> str:
        return (
            f"Spawned(pid={self.pid}, method={self.method!r}, group={self.group!r}, "
            f"returncode={self.returncode})"
        )

    @property
    def started(self) -> bool:
        """True once the child has exec'd its command (False while it sits frozen before it)."""
        if self._pipe is not None:
            self._check_pipe(block=False)
        return self._pipe is None and self._error is None

    def _check_pipe(self, block: bool) -> None:
        if self._pipe is None:
            return
        if not block and not select.select([self._pipe], [], [], 0)[0]:
            return
        data = _read_all(self._pipe)
        os.close(self._pipe)
        self._pipe = None
        if data:
            self._error = _error_from(data, self.argv, self.group, self._cwd)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child; its returncode. Raises subprocess.TimeoutExpired when `timeout`
        passes first, and the SpawnError of an exec that failed after a thaw."""
        if self.returncode is None:
            if timeout is not None:
                self._wait_readable(timeout)
            while True:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    break
                except (
                    InterruptedError
                ):  # pragma: no cover - PEP 475 retries; a handler raising stops
                    continue
            self._reaped(status)
        if self._error is not None:
            raise self._error
        return self.returncode

    def _wait_readable(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self.pidfd is not None:
            if not select.select([self.pidfd], [], [], max(timeout, 0))[0]:
                raise subprocess.TimeoutExpired(self.argv, timeout)
            return
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.argv, timeout)
            time.sleep(0.01)

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)  # -N when signal N killed it
        self._check_pipe(block=True)  # the child is gone: its end of the pipe is closed
        self._close_pidfd()

    def send_signal(self, sig: int) -> None:
        """Signal the child, unless it has been reaped (see `signal_process`)."""
        if self.returncode is None:
            signal_process(self.pid, self.pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Let go of the child's fds without waiting for it."""
        self._close_pidfd()
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def signal_process(pid: int, pidfd: int | None, sig: int) -> None:
    """`sig` to process `pid`, through its `pidfd` where there is one (never a recycled
    pid); one that exited meanwhile (not reaped yet) is no error."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    return b"".join(chunks)


# The kernel's default: a process nobody adjusted. A workload the agent starts has it, while
# the agent and the supervisors that record the workloads' ends may be spared by the OOM
# killer (the packaged unit's OOMScoreAdjust=).
WORKLOAD_OOM_SCORE_ADJ = 0

_STAGES = {
    1: "join",
    2: "stdio and fds",
    3: "cwd",
    4: "setsid",
    5: "signals",
    6: "exec",
    7: "ids",
    8: "oom_score_adj",
}


def _error_from(data: bytes, argv: list[str], group: str, cwd: str | None = None) -> SpawnError:
    stage, err = _ERR.unpack(data[: _ERR.size]) if len(data) >= _ERR.size else (0, errno.EIO)
    reason = os.strerror(err)
    if stage == 1:
        what = f"write into {group}/{registry.PROCS.name}: {errno_reason(err)}"
        if err in (errno.ENOENT, errno.ENODEV):
            what += " (the group was removed)"
    elif stage == 6:
        what = f"{argv[0]}: {reason}"
    elif stage == 3:
        what = f"{argv[0]}: cwd {cwd}: {reason}"
    else:
        what = f"{argv[0]}: {_STAGES.get(stage, 'start')}: {reason}"
    return SpawnError(err, what)


def spawn(
    group: Cgroup,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    pass_fds: Iterable[int] = (),
    start_new_session: bool = False,
    sigmask: Iterable[int] | None = None,
    method: str | None = None,
    share_vm: bool = False,
    oom_score_adj: int | None = None,
) -> Spawned:
    """See `Cgroup.spawn`."""
    argv = [os.fsdecode(a) for a in argv]
    if not argv or not argv[0]:
        raise ValueError("empty command")
    if oom_score_adj is not None and not -1000 <= oom_score_adj <= 1000:
        raise ValueError(f"oom_score_adj {oom_score_adj}: not from -1000 to 1000")
    bargv = [_bytes(a, "an argument") for a in argv]
    environ = os.environ if env is None else env
    benv = []
    for k, v in environ.items():
        bk = _bytes(k, "an environment name")
        if not bk or b"=" in bk:
            raise ValueError(f"bad environment name {k!r}")
        benv.append(bk + b"=" + _bytes(v, f"environment value of {k}"))
    paths = _candidates(bargv[0], env)
    bcwd = _bytes(cwd, "cwd") if cwd is not None else None
    stdio = [-1 if f is None else int(f) for f in (stdin, stdout, stderr)]
    keep = sorted({int(f) for f in pass_fds if int(f) >= 3})
    mask = sorted(set(sigmask or ()))  # None: nothing blocked, whatever the caller holds right now
    how = method or spawn_method()
    if how not in METHODS:
        raise ValueError(f"spawn method {how!r} is not one of {', '.join(METHODS)}")
    if how == CLONE3 and spawn_method() != CLONE3:
        raise SpawnError(
            errno.EOPNOTSUPP,
            f"{spawn_method_reason()}: this kernel cannot start a process "
            f"inside {group.path}; use {FORK!r}",
        )
    target = group.path / (registry.PROCS.name if how == FORK else "")
    try:  # opened before the child exists: a removed group is an error here, with its path
        gfd = os.open(
            target, (os.O_WRONLY if how == FORK else os.O_RDONLY | os.O_DIRECTORY) | os.O_CLOEXEC
        )
    except OSError as exc:
        gone = " (no such group)" if exc.errno in (errno.ENOENT, errno.ENODEV) else ""
        raise CgroupError(exc.errno, f"open {target}: {errno_reason(exc)}{gone}") from None
    ffi, lib = _native().ffi, _native().lib
    rd, wr = os.pipe2(os.O_CLOEXEC)
    pid = -errno.EIO
    try:  # (the buffers behind the char* arrays stay referenced until the call returns)
        cargv, _argv_bufs = _cstrings(ffi, bargv)
        cenv, _env_bufs = _cstrings(ffi, benv)
        cpaths, _path_bufs = _cstrings(ffi, paths)
        ccwd = ffi.new("char[]", bcwd) if bcwd is not None else ffi.NULL
        ckeep = ffi.new("int32_t[]", keep or [0])
        cmask = ffi.new("int32_t[]", [int(s) for s in mask] or [0])
        req = ffi.new(
            "struct xh_spawn_req *",
            {
                "use_clone3": int(how == CLONE3),
                "cgroup_fd": gfd if how == CLONE3 else -1,
                "procs_fd": gfd if how == FORK else -1,
                "err_fd": wr,
                "paths": cpaths,
                "argv": cargv,
                "envp": cenv,
                "cwd": ccwd,
                "stdio": stdio,
                "keep": ckeep,
                "nkeep": len(keep),
                "new_session": int(start_new_session),
                "mask": cmask,
                "nmask": len(mask),
                "share_vm": int(share_vm),
                "set_oom_score_adj": int(oom_score_adj is not None),
                "oom_score_adj": oom_score_adj or 0,
            },
        )
        cpidfd = ffi.new("int32_t *")
        pid = lib.xh_spawn(req, cpidfd)
    finally:
        os.close(wr)
        os.close(gfd)
        if pid < 0:
            os.close(rd)
    if pid < 0:
        err = -pid
        gone = " (the group was removed)" if err in (errno.ENOENT, errno.ENODEV) else ""
        raise CgroupError(err, f"{how} into {group.path}: {errno_reason(err)}{gone}")
    pidfd = cpidfd[0] if cpidfd[0] >= 0 else None
    if pidfd is None:
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pidfd = None  # before Linux 5.3
    child = Spawned(
        pid, pidfd, how, argv, str(group.path), rd, os.fsdecode(bcwd) if bcwd is not None else None
    )
    try:
        _await_exec(child, group)
    except SpawnError:
        raise
    except BaseException:  # a signal's exception while waiting for the exec: no child left behind
        child.kill()
        os.waitpid(child.pid, 0)
        child.returncode = -signal.SIGKILL
        child.close()
        raise
    return child


def _await_exec(child: Spawned, group: Cgroup) -> None:
    """Wait for the exec (the error pipe closes) or its failure; return early, with the child
    unconfirmed, when the group is frozen: a frozen child never gets to its exec."""
    try:
        events = os.open(group.path / registry.EVENTS.name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        events = None
    try:
        poller = select.poll()
        poller.register(child._pipe, select.POLLIN | select.POLLHUP)
        if events is not None:
            poller.register(events, select.POLLPRI | select.POLLERR)
        while True:
            ready = {fd for fd, _ in poller.poll(0 if events is not None else None)}
            if child._pipe in ready:
                break
            if events is not None and _frozen(events) and _member(group, child.pid):
                return  # (the fork way: once it has joined, and only then, it is frozen too)
            poller.poll(100)  # the pipe, or a change in cgroup.events; and look again
    finally:
        if events is not None:
            os.close(events)
    data = _read_all(child._pipe)
    os.close(child._pipe)
    child._pipe = None
    if data:
        _, status = os.waitpid(child.pid, 0)  # it exits right after writing: no zombie stays
        child.returncode = os.waitstatus_to_exitcode(status)
        child._close_pidfd()
        raise _error_from(data, child.argv, child.group, child._cwd)


def _member(group: Cgroup, pid: int) -> bool:
    try:
        return pid in group.procs()
    except CgroupError:
        return False


def _frozen(fd: int) -> bool:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return "frozen 1" in os.read(fd, 4096).decode().splitlines()
    except OSError:
        return False
