"""What tasks call: the runtime API over the scheduler running in this process.

from xhagent.runtime import api as rt
rt.run(main)                      # main and all it spawns, on a new Scheduler
h = rt.spawn(fn, *args, priority=rt.HIGH, deadline=t)
rt.yield_(); rt.sleep(0.01); h.join(); rt.wait_future(f)
with rt.critical(): ...           # preemption waits for the section's end
await rt.sleep_async(0.01); await h    # in async def tasks
"""

from __future__ import annotations

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
    "request_preempt",
    "run",
    "sleep",
    "sleep_async",
    "spawn",
    "wait_future",
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


def yield_() -> None:
    sched = _core._running
    if sched is None:
        sched = _sched()  # raises
    sched.yield_()


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


def sleep_async(seconds: float) -> Trap:
    """`await sleep_async(s)` in an `async def` task."""
    return Trap(sleep, seconds)


def yield_async() -> Trap:
    return Trap(yield_)


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
