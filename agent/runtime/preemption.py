"""Time-slice preemption for a pool worker: a signal per slice of the worker thread's CPU
time, whose handler makes the running task yield, but only at a safe point.

The signal source, SIGURG either way:
  * bpf: the BPF Preempter (preempt.bpf.o on a per-thread cpu-clock perf event) where it
    loads; one object for the whole pool, loaded and armed by the owner (mode "owner").
  * timer: else a POSIX timer on the worker thread's own CPU-time clock
    (`timer_create(CLOCK_THREAD_CPUTIME_ID)`, SIGEV_THREAD_ID to that thread), created by
    the worker itself. Only the thread's own running advances it, as with BPF, so an idle
    worker gets no signals; its resolution is the kernel's tick (posix CPU timers are
    checked from the scheduler tick), so a signal may land up to a tick after the slice.
SIGURG because its default disposition is to ignore: a signal that comes before the
handler is installed, or while the interpreter is going down, does nothing (SIGPROF's
default would kill the worker).

Safe point: CPython runs a signal handler between two bytecodes of whatever frame the main
thread is in, which may be the scheduler itself, halfway through a switch. The handler
yields only when the interrupted frames, from the top down to the worker's `run_one`,
are all outside the runtime's own modules, and it runs on the current task's greenlet;
otherwise it does nothing and the next slice's signal tries again. Inside `critical()`
the scheduler keeps the request for the section's end (`Scheduler.request_preempt`).
"""

from __future__ import annotations

import atexit
import signal
import threading

from greenlet import getcurrent

from ..errors import KernelError
from . import api, context, queues, scheduler, task

SIGNAL = signal.SIGURG  # the BPF program's too (xhagent.bpf.preempt.SIGNAL)
MODES = ("auto", "bpf", "timer", "off", "owner")
SOURCES = ("bpf", "timer", "off")

_RUNTIME_FILES = frozenset(m.__file__ for m in (api, context, queues, scheduler, task))


class SliceTimer:
    """`signo` to the calling thread after every `slice_ns` of that thread's CPU time, until
    `close()`; a timer of the kernel's, on CLOCK_THREAD_CPUTIME_ID."""

    def __init__(self, signo: int, slice_ns: int):
        from xhagent._runq import lib

        if slice_ns <= 0:
            raise ValueError(f"slice must be positive, got {slice_ns} ns")
        self._lib = lib
        rc = lib.rq_cputimer_create(signo)
        if rc < 0:
            raise KernelError.from_errno(
                rc, "timer_create(CLOCK_THREAD_CPUTIME_ID, SIGEV_THREAD_ID)"
            )
        self.id: int | None = rc
        self.slice_ns = slice_ns
        rc = lib.rq_cputimer_set(self.id, slice_ns, slice_ns)
        if rc < 0:
            self.close()
            raise KernelError.from_errno(rc, f"timer_settime({slice_ns} ns, periodic)")

    def remaining(self) -> tuple[int, int]:
        """(CPU ns to the next signal, interval ns), as the kernel has them."""
        from xhagent._runq import ffi

        if self.id is None:
            raise ValueError("the slice timer is closed")
        out = ffi.new("int64_t[2]")
        rc = self._lib.rq_cputimer_get(self.id, out)
        if rc < 0:
            raise KernelError.from_errno(rc, f"timer_gettime({self.id})")
        return out[0], out[1]

    def close(self) -> None:
        if self.id is not None:
            tid, self.id = self.id, None
            self._lib.rq_cputimer_delete(tid)

    def __enter__(self) -> SliceTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def install(worker, slice_ms: float, mode: str = "auto") -> str:
    """Start preempting `worker`'s tasks; `mode` auto (BPF, else the CPU-time timer), bpf,
    timer, off, or owner: the pool's owner has armed its one Preempter on this worker's
    thread, so only the handler is needed here. Returns the source used: bpf, timer, off.
    Whatever this process creates (a timer, a BPF object) is released when it exits."""
    from . import worker as worker_mod

    if mode not in MODES:
        raise ValueError(f"preempt mode {mode!r} is not one of {', '.join(MODES)}")
    files = _RUNTIME_FILES | {worker_mod.__file__, __file__}
    boundary = type(worker).run_one.__code__

    def on_slice(signum, frame):
        worker.slices += 1
        sched = worker.sched
        current = sched.current
        if current is None or current.fn != worker.run_one:
            return  # the feeder, or the hub: nothing to preempt
        if current._ctx is None or getcurrent() is not current._ctx.greenlet:
            return  # mid-switch: the greenlet running is not the current task's yet
        f = frame
        while f is not None and f.f_code is not boundary:
            if f.f_code.co_filename in files:
                return  # inside the runtime: not a safe point
            f = f.f_back
        if f is None:
            return
        # New work joins the rotation (the feeder gets no turn meanwhile), but only up to a
        # batch in hand: taken tasks cannot be stolen, so a worker busy with long tasks
        # must not hoard the global ring a batch per tick.
        worker.intake(worker.BATCH - (sched._alive - 1))
        worker.flush()  # and results done so far go out, while this task keeps the CPU
        # Sleepers whose time has come queue now, ahead of the task that yields: left to
        # the switch, they would queue behind it and wait one more slice.
        timers = sched._timers
        if timers and timers[0][0] <= sched.clock():
            sched._fire_timers()
        if sched.request_preempt():
            worker.preempted += 1

    if slice_ms <= 0 or mode == "off":
        return "off"
    slice_ns = int(slice_ms * 1e6)
    signal.signal(SIGNAL, on_slice)  # before arming: a signal may come at once
    if mode == "owner":
        return "bpf"
    if mode in ("auto", "bpf"):
        try:
            from xhagent.bpf.preempt import Preempter

            preempter = Preempter()
            try:
                preempter.arm(threading.get_native_id(), slice_ns)
            except BaseException:
                preempter.close()
                raise
        except Exception:
            if mode == "bpf":
                raise
            # No BPF here (not root, no BTF, an old kernel): the kernel's CPU-time timer
        else:
            worker.preempter = preempter
            atexit.register(preempter.close)
            return "bpf"
    worker.preempter = SliceTimer(SIGNAL, slice_ns)
    atexit.register(worker.preempter.close)
    return "timer"
