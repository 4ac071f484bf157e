"""Per-task delay accounting: how long a task waited, and for what, from the kernel's taskstats.

A task that runs slowly either had too little CPU, or waited: for a CPU while runnable, for
synchronous block I/O, for swap-in, for memory reclaim, for a thrashing page, for memory
compaction. The kernel counts each of these per thread (Documentation/accounting/
delay-accounting.rst) and sums them per thread group on request, over the generic netlink
family TASKSTATS (TASKSTATS_CMD_GET). This module asks it:

    from xhagent.metrics.taskstats import TaskStats, TaskGone, enable_delayacct

    enable_delayacct()                # kernel.task_delayacct=1 when this process may
    with TaskStats() as ts:           # one netlink socket; thread-safe, no event loop
        d = ts.delays(pid)            # the thread group's sums; TaskGone once it is reaped
        d.cpu.total, d.cpu.count      # seconds waiting for a CPU, and how many waits
        d.blkio, d.swapin, d.reclaim  # Delay(count, total) each
        d.thrashing, d.compact        # Delay, or None where the kernel predates them
        d.run                         # seconds on a CPU, as the scheduler summed them
        ts.delays(tid, thread=True)   # one thread instead of its group
        ts.delays_of(pids)            # {pid: Delays} for those still there

What the figures mean, and when they are zero:

- `cpu` comes from the scheduler's own run-queue statistics (sched_info), which a kernel with
  CONFIG_SCHED_INFO keeps for every task: it is counted whether or not delay accounting is on.
- `blkio`, `swapin`, `reclaim`, `thrashing` and `compact` are recorded only while
  `kernel.task_delayacct` is 1, and only for tasks that were *started* while it was 1: the
  kernel gives a task its delay record at fork when accounting is on, and a task forked while
  it was off has none, so these stay 0 for its whole life even after it is switched on (a
  host test shows both). So the agent must enable it before it starts workloads; the doctor
  item `taskstats.delayacct` says whether it is on, can be switched on, or is absent.
- A total of 0 with a non-zero count means the kernel's nanosecond sum overflowed.
- Block-I/O counts are a lower bound on a busy CPU: a reader woken while the scheduler still
  holds it queued (a delayed dequeue) has that wait uncounted; beside four CPU spinners on
  this project's host, 64 KiB direct reads were counted 41-128 times in 128. The same runs
  once gave a total of 34,153 s for 8 reads, the machine's uptime then: one wait measured
  from a start the kernel never stamped. A total longer than the task has lived is that.
- `run` is cpu_run_virtual_total, the scheduler's exact sum_exec_runtime (the first field of
  /proc/PID/schedstat). The kernel's cpu_run_real_total (`run_real`) is utime+stime, sampled
  at timer ticks: on this project's 2-vCPU host, with two spinners sharing a CPU, it said
  0.21 s for a process that had run 0.5 s.

Errors are `TaskStatsError` (a `KernelError`, errno kept): `TaskGone` (ESRCH, also a
`ProcessLookupError`) for a pid with no live task (reaped, or never there);
`TaskStatsPermissionError` (EPERM) when this process lacks CAP_NET_ADMIN, which the kernel
demands of every TASKSTATS_CMD_GET; `TaskStatsUnavailable` (ENOENT) on a kernel without
CONFIG_TASKSTATS.

Why a plain socket packed with `struct`, not a netlink library: the per-pid request is 28
bytes and the reply a fixed struct, and a scrape asks for hundreds of pids. On this
project's host a request/reply through pyroute2 0.9's synchronous socket took ~210 us (it
runs an asyncio loop per call, and refuses to run inside a running loop, as the daemon's
is); through its message classes ~53 us; packed with `struct`, the round trip ~2 us, and a
whole `delays()` call, decoding included, 25-35 us (500 pids: ~15 ms). The family id
(CTRL_CMD_GETFAMILY, once per `TaskStats`) is asked the same way: importing pyroute2 for it
cost the agent 8.6 MB of resident memory.

The reply's `struct taskstats` grows by appending fields, so a field is read when the reply
is long enough to hold it, at its offset in the kernel's struct (TASKSTATS_VERSION up to 14,
and 16 on). Version 15, short-lived in 2025, inserted max/min fields after each delay sum and
moved every later field; version 16 put them at the end again ("taskstats: fix struct
taskstats breaks backward compatibility since version 15"). A version 15 reply is read with
its own offsets.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelError, errno_reason

__all__ = [
    "DELAYACCT",
    "Delay",
    "DelayAcct",
    "Delays",
    "TaskGone",
    "TaskStats",
    "TaskStatsError",
    "TaskStatsPermissionError",
    "TaskStatsUnavailable",
    "delayacct",
    "enable_delayacct",
    "parse_reply",
    "parse_stats",
    "request",
    "set_delayacct",
]

DELAYACCT = Path("/proc/sys/kernel/task_delayacct")

# linux/netlink.h, linux/genetlink.h, linux/taskstats.h
NETLINK_GENERIC = 16
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
TASKSTATS_GENL_NAME = "TASKSTATS"
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_ATTR_PID = 1
TASKSTATS_CMD_ATTR_TGID = 2
TASKSTATS_TYPE_PID = 1
TASKSTATS_TYPE_TGID = 2
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_PID = 4
TASKSTATS_TYPE_AGGR_TGID = 5

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_GENLHDR = struct.Struct("=BBH")  # cmd, version, reserved
_NLA = struct.Struct("=HH")  # len, type
# A whole TASKSTATS_CMD_GET: nlmsghdr, genlmsghdr, one u32 attribute.
_REQUEST = struct.Struct("=IHHII BBH HHI")
NS = 1e-9

# Byte offsets of the __u64 fields read, in `struct taskstats` of TASKSTATS_VERSION 16 (as
# in this host's BTF, checked by tests/host/test_taskstats_host.py) and of versions up to 14.
OFFSETS = {
    "version": 0,
    "cpu_count": 16,
    "cpu_delay_total": 24,
    "blkio_count": 32,
    "blkio_delay_total": 40,
    "swapin_count": 48,
    "swapin_delay_total": 56,
    "cpu_run_real_total": 64,
    "cpu_run_virtual_total": 72,
    "freepages_count": 312,
    "freepages_delay_total": 320,
    "thrashing_count": 328,
    "thrashing_delay_total": 336,
    "compact_count": 352,
    "compact_delay_total": 360,
}
# Version 15 put `*_delay_max, *_delay_min` after cpu, blkio and swapin's sums (48 bytes
# before cpu_run_real_total) and after freepages and thrashing's (16 more each).
OFFSETS_V15 = {
    **OFFSETS,
    "blkio_count": 48,
    "blkio_delay_total": 56,
    "swapin_count": 80,
    "swapin_delay_total": 88,
    "cpu_run_real_total": 112,
    "cpu_run_virtual_total": 120,
    "freepages_count": 360,
    "freepages_delay_total": 368,
    "thrashing_count": 392,
    "thrashing_delay_total": 400,
    "compact_count": 432,
    "compact_delay_total": 440,
}


class TaskStatsError(KernelError):
    """A taskstats request the kernel refused: `errno` is its errno."""


class TaskGone(TaskStatsError, ProcessLookupError):
    """No live task has this pid (it exited and was reaped, or never existed): ESRCH."""


class TaskStatsPermissionError(TaskStatsError, PermissionError):
    """The kernel wants CAP_NET_ADMIN for TASKSTATS_CMD_GET, and this process lacks it."""


class TaskStatsUnavailable(TaskStatsError):
    """No TASKSTATS generic netlink family: a kernel without CONFIG_TASKSTATS."""


@dataclass(frozen=True)
class Delay:
    """One kind of wait: how many there were and how long they took together."""

    count: int
    total: float  # seconds


@dataclass(frozen=True)
class Delays:
    """A task's (or thread group's) waits since it started, as the kernel summed them."""

    pid: int  # the thread group id, or the thread id with thread=True
    version: int  # TASKSTATS_VERSION of the kernel that answered
    cpu: Delay  # runnable, waiting for a CPU
    blkio: Delay  # synchronous block I/O
    swapin: Delay  # page faults reading from swap
    reclaim: Delay  # memory reclaim (freepages_*)
    thrashing: Delay | None  # refaulting a page evicted while in use (version 9+)
    compact: Delay | None  # memory compaction (version 11+)
    run: float  # seconds on a CPU, exact (cpu_run_virtual_total: sum_exec_runtime)
    run_real: float  # utime+stime, tick-sampled (cpu_run_real_total)


def request(family: int, seq: int, pid: int, *, thread: bool = False) -> bytes:
    """The TASKSTATS_CMD_GET message for a thread group (or one thread)."""
    attr = TASKSTATS_CMD_ATTR_PID if thread else TASKSTATS_CMD_ATTR_TGID
    return _REQUEST.pack(
        _REQUEST.size, family, NLM_F_REQUEST, seq, 0, TASKSTATS_CMD_GET, 1, 0, 8, attr, pid
    )


def _attrs(data: bytes | memoryview, start: int, end: int):
    """(type, payload) of each netlink attribute in data[start:end]."""
    pos = start
    while pos + _NLA.size <= end:
        length, kind = _NLA.unpack_from(data, pos)
        if length < _NLA.size or pos + length > end:
            raise ValueError(f"netlink attribute of length {length} at {pos} overruns {end}")
        yield kind & NLA_TYPE_MASK, data[pos + _NLA.size : pos + length]
        pos += (length + 3) & ~3


def parse_stats(raw: bytes | memoryview, pid: int = 0) -> Delays:
    """A `struct taskstats` as the kernel sent it. A field the reply is too short for is
    None (thrashing, compact) or no delay (reclaim, before version 6); a reply without the
    version 1 fields is refused."""
    if len(raw) < 80:
        raise ValueError(f"struct taskstats of {len(raw)} bytes: shorter than version 1's 80")
    (version,) = struct.unpack_from("=H", raw, 0)
    offsets = OFFSETS_V15 if version == 15 else OFFSETS

    def u64(name: str) -> int | None:
        off = offsets[name]
        return struct.unpack_from("=Q", raw, off)[0] if off + 8 <= len(raw) else None

    def delay(kind: str) -> Delay | None:
        count, total = u64(f"{kind}_count"), u64(f"{kind}_delay_total")
        return None if count is None or total is None else Delay(count, total * NS)

    return Delays(
        pid=pid,
        version=version,
        cpu=delay("cpu"),
        blkio=delay("blkio"),
        swapin=delay("swapin"),
        reclaim=delay("freepages") or Delay(0, 0.0),  # before version 6 the kernel had none
        thrashing=delay("thrashing"),
        compact=delay("compact"),
        run=u64("cpu_run_virtual_total") * NS,
        run_real=u64("cpu_run_real_total") * NS,
    )


def parse_reply(data: bytes | memoryview, seq: int | None = None) -> Delays | int | None:
    """One netlink message of a reply: Delays, a negative errno (NLMSG_ERROR), or None for a
    message that answers another request (seq differs) and is to be skipped."""
    if len(data) < _NLMSGHDR.size:
        raise ValueError(f"netlink message of {len(data)} bytes")
    length, kind, _, msg_seq, _ = _NLMSGHDR.unpack_from(data, 0)
    if length > len(data):
        raise ValueError(f"netlink message says {length} bytes, {len(data)} came")
    if seq is not None and msg_seq != seq:
        return None
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, _NLMSGHDR.size)
        return err
    start = _NLMSGHDR.size + _GENLHDR.size
    for atype, payload in _attrs(data, start, length):
        if atype not in (TASKSTATS_TYPE_AGGR_TGID, TASKSTATS_TYPE_AGGR_PID):
            continue
        pid, stats = 0, None
        for inner, value in _attrs(payload, 0, len(payload)):
            if inner in (TASKSTATS_TYPE_PID, TASKSTATS_TYPE_TGID):
                (pid,) = struct.unpack_from("=I", value)
            elif inner == TASKSTATS_TYPE_STATS:
                stats = value
        if stats is not None:
            return parse_stats(stats, pid)
    raise ValueError("taskstats reply without TASKSTATS_TYPE_STATS")


GENL_ID_CTRL = 0x10  # the generic netlink controller's own family (NLMSG_MIN_TYPE)
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2


def family_request(name: str, seq: int = 1) -> bytes:
    """CTRL_CMD_GETFAMILY for the family `name` (a NUL-terminated string attribute)."""
    value = name.encode() + b"\0"
    attr = _NLA.pack(_NLA.size + len(value), CTRL_ATTR_FAMILY_NAME) + value
    attr += b"\0" * (-len(attr) % 4)
    size = _NLMSGHDR.size + _GENLHDR.size + len(attr)
    return (
        _NLMSGHDR.pack(size, GENL_ID_CTRL, NLM_F_REQUEST, seq, 0)
        + _GENLHDR.pack(CTRL_CMD_GETFAMILY, 1, 0)
        + attr
    )


def parse_family_reply(data: bytes | memoryview) -> int:
    """The family id of a CTRL_CMD_GETFAMILY reply; a negative errno for an NLMSG_ERROR."""
    length, kind, *_ = _NLMSGHDR.unpack_from(data, 0)
    if kind == NLMSG_ERROR:
        return struct.unpack_from("=i", data, _NLMSGHDR.size)[0]
    for atype, payload in _attrs(data, _NLMSGHDR.size + _GENLHDR.size, min(length, len(data))):
        if atype == CTRL_ATTR_FAMILY_ID:
            return struct.unpack_from("=H", payload)[0]
    raise ValueError("CTRL_CMD_GETFAMILY reply without CTRL_ATTR_FAMILY_ID")


def _family_id(sock: socket.socket) -> int:
    """The TASKSTATS family's id, asked of the generic netlink controller on `sock`."""
    sock.send(family_request(TASKSTATS_GENL_NAME))
    found = parse_family_reply(sock.recv(65536))
    if found >= 0:
        return found
    if -found == errno.ENOENT:
        raise TaskStatsUnavailable(
            errno.ENOENT,
            "no TASKSTATS generic netlink family: this kernel is built without "
            "CONFIG_TASKSTATS, so per-task delays cannot be read",
        )
    raise TaskStatsError.from_errno(found, "generic netlink CTRL_CMD_GETFAMILY TASKSTATS")


class TaskStats:
    """A generic netlink socket for TASKSTATS_CMD_GET. One request at a time (a lock), so
    threads may share it; close() or a `with` block gives the socket back."""

    def __init__(self) -> None:
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC
        )
        try:
            self._sock.bind((0, 0))
            # The kernel answers inside send(): a reply that has not come in a second never will.
            self._sock.settimeout(1.0)
            self.family = _family_id(self._sock)
        except BaseException:
            self._sock.close()
            raise
        self._lock = threading.Lock()
        self._seq = 1
        self._buf = bytearray(8192)  # a reply is ~600 bytes (struct taskstats v16: 560)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> TaskStats:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def delays(self, pid: int, *, thread: bool = False) -> Delays:
        """The delays of thread group `pid` (summed over its threads, the exited ones
        included), or of the one thread `pid` with thread=True."""
        with self._lock:
            self._seq = self._seq % 0xFFFFFFFF + 1
            seq = self._seq
            self._sock.send(request(self.family, seq, pid, thread=thread))
            while True:
                n = self._sock.recv_into(self._buf)
                got = parse_reply(memoryview(self._buf)[:n], seq)
                if got is not None:
                    break  # else a late answer to an earlier, abandoned request
        if isinstance(got, Delays):
            return got
        what = f"taskstats of {'thread' if thread else 'process'} {pid}"
        if -got == errno.ESRCH:
            raise TaskGone(errno.ESRCH, errno_reason(got, f"{what}: no such task"))
        if -got == errno.EPERM:
            raise TaskStatsPermissionError(
                errno.EPERM,
                errno_reason(got, f"{what}: TASKSTATS_CMD_GET needs CAP_NET_ADMIN"),
            )
        raise TaskStatsError.from_errno(got, what)

    def delays_of(self, pids: Iterable[int]) -> dict[int, Delays]:
        """Delays of each thread group still there; the ones gone meanwhile are left out."""
        out = {}
        for pid in pids:
            try:
                out[pid] = self.delays(pid)
            except TaskGone:
                pass
        return out


@dataclass(frozen=True)
class DelayAcct:
    """kernel.task_delayacct as found (or left) by this process."""

    state: str  # "on", "off", or "absent" (a kernel without CONFIG_TASK_DELAY_ACCT)
    changed: bool = False  # this call switched it on
    reason: str = ""  # why it is off or absent: the refused write's errno, the missing CONFIG


ABSENT = (
    "{path} is absent: this kernel is built without CONFIG_TASK_DELAY_ACCT, so only the CPU"
    " delay (from the scheduler's statistics) is counted"
)


def delayacct(path: Path = DELAYACCT) -> DelayAcct:
    """Whether the kernel records block I/O, swap-in and memory delays now."""
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        return DelayAcct("absent", reason=ABSENT.format(path=path))
    return DelayAcct("on" if value == "1" else "off")


def set_delayacct(on: bool, path: Path = DELAYACCT) -> None:
    """Write the sysctl; a refusal raises TaskStatsError with the kernel's errno (EPERM
    without CAP_SYS_ADMIN, EACCES for non-root, EROFS in a read-only /proc/sys, ENOENT when
    absent)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1\n" if on else b"0\n")
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise TaskStatsError(errno.ENOENT, ABSENT.format(path=path)) from None
        raise TaskStatsError(exc.errno, errno_reason(exc, f"write {int(on)} to {path}")) from None


def enable_delayacct(path: Path = DELAYACCT) -> DelayAcct:
    """Switch delay accounting on when it is off and this process may; never raises for a
    kernel without it or a refused write: the result says what is so, and why."""
    now = delayacct(path)
    if now.state != "off":
        return now
    try:
        set_delayacct(True, path)
    except TaskStatsError as exc:
        return DelayAcct("off", reason=str(exc))
    return DelayAcct("on", changed=True)
