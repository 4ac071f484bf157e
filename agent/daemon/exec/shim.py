"""The agent's side of the workload shim (`xhagent-shim`, native/shim.c): start one, read the
records it leaves in the task's directory, and tell a live process from a reused pid.

The shim is the workload's parent, so the workload's status survives the agent: a restarted
agent reads `TASKDIR/started` and `TASKDIR/exit` instead of waiting on a child it no longer has.
"""

from __future__ import annotations

import errno
import json
import os
import select
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ...cgroups import Cgroup, Spawned
from .shim_server import ServedShim, ShimServer, Unserved

SHIM = Path(__file__).resolve().parent / "xhagent-shim"
DEFAULT_LOG_CAP = 16 << 20
STARTED, EXIT = "started", "exit"
RECORD_SIZE = 8192  # bytes the shim reserves for each record (shim.c), the most one holds
# Bytes of the state disk that task output never takes (the shim's --keep-free): room for
# the agent's store to record outcomes, and for starts' records, while output fills the rest.
AGENT_RESERVE = 256 << 10


class ShimError(OSError):
    """The shim or its workload could not start; the message is the shim's own when it gave one."""

    def __str__(self) -> str:
        return self.strerror or ""


@dataclass(frozen=True)
class ShimStarted:
    shim_pid: int
    shim_start_time: int
    pid: int  # the workload
    start_time: int  # its /proc/PID/stat field 22: with the pid, the pid-reuse guard
    spawn_method: str
    started_ns: int
    # not in the record: the shim as the caller's child (or the shim server's), from
    # start_shim only
    process: Spawned | ServedShim | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ShimExit:
    """The workload's end (`exit_code` or `signal`), or why it never ran or is no longer
    supervised (`error`, `errno`, `message`)."""

    exit_code: int | None = None
    signal: int | None = None
    core_dumped: bool = False
    ended_ns: int | None = None
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    output_errno: int = 0  # the write that failed first, after which a stream's output is dropped
    error: str | None = None
    errno: int | None = None
    message: str | None = None


def dropped_message(ex: ShimExit, cap: int) -> str:
    """What of a workload's output the shim dropped, and why, in one line."""
    why = f"each stream is capped at {cap >> 20} MiB" if cap % (1 << 20) == 0 else f"cap {cap}"
    if ex.output_errno == errno.ENOSPC:
        why += ", and the disk had no room for more (ENOSPC)"
    elif ex.output_errno:
        code = errno.errorcode.get(ex.output_errno, str(ex.output_errno))
        why += f"; a write failed: {os.strerror(ex.output_errno).lower()} ({code})"
    return (
        f"{ex.stdout_dropped + ex.stderr_dropped} bytes of output dropped (stdout "
        f"{ex.stdout_dropped}, stderr {ex.stderr_dropped}): {why}"
    )


@dataclass(frozen=True)
class ShimStatus:
    started: ShimStarted | None
    exit: ShimExit | None


def shim_path() -> Path:
    if not os.access(SHIM, os.X_OK):
        raise FileNotFoundError(
            errno.ENOENT, f"{SHIM}: the workload shim is missing; rebuild with make setup"
        )
    return SHIM


def _record(task_dir: Path, name: str, kind: type) -> object | None:
    path = task_dir / name
    try:
        return _parse(path.read_bytes(), kind, path)
    except (FileNotFoundError, NotADirectoryError):  # (a directory not made: none in it)
        return None


# What a record's reserved space holds before the record is written over it (shim.c: spaces,
# or the zeros of blocks a power loss kept from the disk): a record not written.
FILLER = b" \0"


def _parse(raw: bytes, kind: type, where: object) -> object | None:
    if not raw.strip(FILLER):
        return None
    text = raw.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        known = {f.name for f in fields(kind)} - {"process"}
        if not isinstance(data, dict) or not data or set(data) - known:
            raise ValueError("not a record of the shim")
        return kind(**data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: malformed shim record ({exc}): {text[:200]!r}") from None


def no_space(path: str | os.PathLike) -> ShimError:
    """A start refused for lack of space where its records and output go."""
    return ShimError(errno.ENOSPC, f"no space left on device (ENOSPC): {os.fspath(path)}")


def _start_error(ex: ShimExit, task_dir: Path) -> ShimError:
    if ex.errno == errno.ENOSPC:
        return no_space(task_dir)
    return ShimError(ex.errno or errno.EIO, ex.message or "shim failed")


def read_status(task_dir: str | os.PathLike) -> ShimStatus:
    """The records in `task_dir`; None for one not written (yet), or that holds only the
    filler of its reserved space (`started`, which the shim does not flush, after a power
    loss). The shim writes each whole, so a malformed one is corruption and raises
    ValueError."""
    task_dir = Path(task_dir)
    return ShimStatus(_record(task_dir, STARTED, ShimStarted), _record(task_dir, EXIT, ShimExit))


def start_shim(
    task_dir: str | os.PathLike,
    task_group: Cgroup,
    shim_group: Cgroup,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike | None = None,
    uid: int | None = None,
    gid: int | None = None,
    log_cap: int = DEFAULT_LOG_CAP,
    keep_free: int = 0,
    timeout: float = 5.0,
    method: str | None = None,
    server: ShimServer | None = None,
    oom_score_adj: int | None = None,
    spare: Path | None = None,
) -> ShimStarted:
    """Start `argv` (no shell; PATH looked up in `env`) in `task_group` under a new shim in
    `shim_group`, and wait up to `timeout` for the shim's `started` record.

    `task_dir` must hold no records yet; the shim makes it, and its parent, when missing.
    The workload gets `env`, stdin /dev/null, stdout and stderr into `task_dir` (each capped
    at `log_cap` bytes, and none of it into the last `keep_free` bytes of the filesystem). A
    workload that could not start raises ShimError with the shim's message (`exec /bin/nope:
    No such file or directory`; for lack of space `no space left on device (ENOSPC):
    TASKDIR`), the shim reaped; so does a shim that says nothing within `timeout` (it is
    killed; a workload it may have started stays in `task_group` for the caller to kill).

    `launch_shim` followed by its `wait`: see there for starting many at once.

    Reaping: the shim is the caller's child. Keep the returned `process` (a Spawned, with its
    pidfd) and call its `wait()` or `poll()` once `exit` is written (the pidfd turns readable
    when it ends). An agent that restarts has no such child: the shim was reparented and is
    reaped by its new parent; the records and `process_alive` are all that is needed then.
    """
    return launch_shim(
        task_dir, task_group, shim_group, argv, env, cwd, uid, gid, log_cap, keep_free, method,
        server, oom_score_adj, spare,
    ).wait(timeout)  # fmt: skip


@dataclass
class Launched:
    """A shim spawned whose `started` record is not awaited yet: `wait` awaits it (as
    `start_shim` does), so that a caller starting many spawns them all first and their
    starts overlap."""

    process: Spawned | ServedShim
    task_dir: Path
    ready: int  # the read end of the shim's stdout pipe; closed by `wait`
    shim_name: str

    def wait(self, timeout: float = 5.0) -> ShimStarted:
        try:
            return _await_started(self.process, self.task_dir, self.ready, self.shim_name, timeout)
        finally:
            os.close(self.ready)


def launch_shim(
    task_dir: str | os.PathLike,
    task_group: Cgroup,
    shim_group: Cgroup,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike | None = None,
    uid: int | None = None,
    gid: int | None = None,
    log_cap: int = DEFAULT_LOG_CAP,
    keep_free: int = 0,
    method: str | None = None,
    server: ShimServer | None = None,
    oom_score_adj: int | None = None,
    spare: Path | None = None,
) -> Launched:
    """Spawn the shim of `start_shim` without waiting for its `started` record; the caller
    must call the result's `wait` (which closes its pipe and raises what start_shim does).
    With `server`, the shim is the server's fork (shim_server.py), not the caller's child,
    unless the server cannot take it: then it is spawned as without. `oom_score_adj`: the
    workload's (None: the shim's, which is the caller's). `spare`: a spare run directory
    (spares.py) the shim renames to `task_dir`'s parent instead of making both, where that
    parent is missing and `task_dir` is its first attempt's."""
    task_dir = Path(task_dir)
    for name in (STARTED, EXIT):
        if os.path.lexists(task_dir / name):  # (False too where task_dir is no directory)
            raise ShimError(errno.EEXIST, f"{task_dir / name} exists: a task directory serves once")
    cmd = [str(shim_path()), "--dir", str(task_dir), "--cgroup", str(task_group.path)]
    cmd += ["--log-cap", str(int(log_cap)), "--keep-free", str(int(keep_free))]
    if cwd is not None:
        cmd += ["--cwd", os.fspath(cwd)]
    if (uid is None) != (gid is None):
        raise ValueError("uid and gid go together")
    if uid is not None:
        cmd += ["--uid", str(int(uid)), "--gid", str(int(gid))]
    if method is not None:
        cmd += ["--method", method]
    if oom_score_adj is not None:
        cmd += ["--oom-score-adj", str(int(oom_score_adj))]
    if spare is not None:
        cmd += ["--spare", str(spare)]
    # The shim's stdout is a pipe it closes once its `started` record is written (or when it
    # exits): the wait below wakes on that instead of polling the directory. A shim that
    # could not write its records there (no space) writes its error record on the pipe.
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    try:
        shim = None
        if server is not None:
            try:
                shim = server.request([*cmd[1:], "--", *argv], env, ready_w)
            except Unserved:
                pass  # (counted by the server) spawned below, as without one
        if shim is None:
            shim = _spawn_shim(shim_group, [*cmd, "--", *argv], env, ready_w)
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)
    return Launched(shim, task_dir, ready_r, cmd[0])


def _spawn_shim(shim_group: Cgroup, cmd: list[str], env: Mapping[str, str], ready_w: int):
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:  # the agent's memory shared until the exec: the shims' group is never frozen
        return shim_group.spawn(
            cmd, env=env, stdin=null, stdout=ready_w, stderr=null, start_new_session=True,
            share_vm=True,
        )  # fmt: skip
    finally:
        os.close(null)


def _await_started(shim, task_dir: Path, ready: int, shim_name: str, timeout: float):
    deadline = time.monotonic() + timeout
    told = False  # the pipe closed: the records are final, poll them no more than a little
    said = b""  # what came on the pipe: a shim that could not write its records says it there
    while True:
        gone = shim.poll() is not None  # before the read: what it wrote before exiting is seen
        status = read_status(task_dir)
        if status.exit is not None and status.exit.error is not None:
            shim.wait(timeout)
            raise _start_error(status.exit, task_dir)
        if status.started is not None:
            return replace(status.started, process=shim)
        if gone:
            said += _drain(ready)
            if said.strip(FILLER):
                raise _start_error(_parse(said, ShimExit, f"{shim_name}'s stdout"), task_dir)
            how = f" with {shim.returncode}" if isinstance(shim, Spawned) else ""
            why = f"{shim_name} exited{how} and left no record in {task_dir}"
            raise ShimError(errno.EIO, why)
        left = deadline - time.monotonic()
        if left <= 0:
            shim.kill()
            shim.wait()
            why = f"{shim_name} left no record in {task_dir} within {timeout:g}s (killed)"
            raise ShimError(errno.ETIMEDOUT, why)
        if told:
            time.sleep(0.005)
        elif select.select([ready], [], [], left)[0]:
            chunk = os.read(ready, RECORD_SIZE)
            told = chunk == b""
            said = (said + chunk)[: 2 * RECORD_SIZE]  # a record is one line of RECORD_SIZE


def _drain(fd: int) -> bytes:
    """What is left in the pipe of a shim that exited, without waiting for more."""
    got = b""
    while len(got) < 2 * RECORD_SIZE and select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, RECORD_SIZE)
        if not chunk:
            break
        got += chunk
    return got


def process_alive(pid: int, start_time: int) -> bool:
    """True only while `pid` is the process that started at `start_time` (field 22 of
    /proc/PID/stat) and has not exited: a reused pid or a zombie is not it."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    rest = stat[stat.rindex(b")") + 2 :].split()  # the command may hold spaces and parentheses
    return rest[0] not in (b"Z", b"X") and int(rest[19]) == start_time
