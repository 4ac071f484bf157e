"""What tasks call: the runtime API over the scheduler running in this process.

from xhagent.runtime import api as rt
rt.run(main)                      # main and all it spawns, on a new Scheduler
h = rt.spawn(fn, *args, priority=rt.HIGH, deadline=t)
rt.yield_(); rt.sleep(0.01); h.join(); rt.wait_future(f)
with rt.critical(): ...           # preemption waits for the section's end
await rt.sleep_async(0.01); await h    # in async def tasks
data = rt.read(fd, 4096, offset); n = rt.write(fd, data, offset)   # the ring: runtime.io
n = rt.read_into(fd, buf, offset)                                   # into your buffer
await rt.read_async(fd, 4096, offset); await rt.write_async(fd, data, offset)
"""

from __future__ import annotations

from xhagent import _sched as _c

from . import scheduler as _core
from .scheduler import HIGH, LOW, NORMAL, Scheduler
from .task import Cancelled, TaskHandle, Trap

__all__ = [
    "HIGH",
    "LOW",
    "NORMAL",
    "Cancelled",
    "TaskHandle",
    "critical",
    "current_task",
    "local",
    "read",
    "read_async",
    "read_into",
    "read_into_async",
    "request_preempt",
    "run",
    "sleep",
    "sleep_async",
    "spawn",
    "wait_future",
    "write",
    "write_async",
    "yield_",
    "yield_async",
]


def _sched() -> Scheduler:
    sched = _core._running
    if sched is None:
        raise RuntimeError("no runtime scheduler is running")
    return sched


def run(fn, *args, **options):
    """Run `fn(*args)` on a new Scheduler(**options); its result."""
    return Scheduler(**options).run(fn, *args)


def spawn(fn, *args, priority: int = NORMAL, deadline: float | None = None) -> TaskHandle:
    sched = _core._running
    if sched is None:
        sched = _sched()  # raises
    # A method call, not a bound method fetched first: that allocates, per spawn.
    return sched._spawn(fn, args, priority, deadline)


# The running scheduler's yield_, all in C (native/sched.c): no Python frame per yield.
yield_ = _c.yield_


def sleep(seconds: float) -> None:
    _sched().sleep(seconds)


def wait_future(fut, timeout: float | None = None):
    """Park until `fut` (any concurrent.futures.Future, done by any thread) is done."""
    return _sched().wait_future(fut, timeout)


def current_task() -> TaskHandle | None:
    sched = _core._running
    return None if sched is None else sched.current


def request_preempt() -> bool:
    return _sched().request_preempt()


def local() -> dict:
    """The running task's task-local storage (dropped when the task ends)."""
    return _sched()._in_task()._ctx.local


def sleep_async(seconds: float):
    """`await sleep_async(s)` in an `async def` task (0 or less: a yield)."""
    return _c.yield_async() if seconds <= 0 else Trap(sleep, seconds)


# `await yield_async()`: the back of the task's class. In a task spawned with an `async def`
# function, the next task that holds no context takes this one's over: no switch. In C: an
# awaitable yielding the scheduler's YIELD trap, with no generator made per await.
yield_async = _c.yield_async


class _Critical:
    """`with critical():` defers preemption to the outermost section's end."""

    __slots__ = ()

    def __enter__(self):
        _sched()._in_task()._critical += 1

    def __exit__(self, *exc_info):
        sched = _sched()
        task = sched.current
        task._critical -= 1
        if task._critical == 0 and task._preempt_requested and exc_info[0] is None:
            sched.yield_()


_CRITICAL = _Critical()


def critical() -> _Critical:
    return _CRITICAL


# -- I/O through the scheduler's io_uring ring (runtime.io has the model and the errors) ----
_io = None  # runtime.io, loaded by the first read or write: it brings the io_uring binding


def _load_io():
    global _io
    from . import io

    _io = io
    return io


def read(fd: int, nbytes: int, offset: int = 0) -> bytes:
    """Up to `nbytes` at `offset` of `fd`, like os.pread; the task parks while it is in
    flight. OSError with the kernel's errno on failure; IoUnavailable without io_uring."""
    return (_io or _load_io()).read(fd, nbytes, offset)


def read_into(fd: int, buf, offset: int = 0) -> int:
    """Read into the writable buffer `buf` at `offset` of `fd`, like os.preadv; bytes read."""
    return (_io or _load_io()).read_into(fd, buf, offset)


def write(fd: int, data, offset: int = 0) -> int:
    """Write `data` at `offset` of `fd`, like os.pwrite; bytes written."""
    return (_io or _load_io()).write(fd, data, offset)


def read_async(fd: int, nbytes: int, offset: int = 0) -> Trap:
    """`await read_async(fd, n, offset)` in an `async def` task."""
    return Trap(read, fd, nbytes, offset)


def read_into_async(fd: int, buf, offset: int = 0) -> Trap:
    return Trap(read_into, fd, buf, offset)


def write_async(fd: int, data, offset: int = 0) -> Trap:
    return Trap(write, fd, data, offset)
