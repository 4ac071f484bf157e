"""Time-slice preemption for a pool worker: a signal per slice of the worker thread's CPU
time, whose handler makes the running task yield, but only at a safe point.

The signal source: the BPF Preempter (SIGURG per slice of this thread's on-CPU time) where
it loads, one object for the whole pool, loaded and armed by the owner; else
`setitimer(ITIMER_PROF)` (SIGPROF per slice of the process's CPU time, which is the
worker thread's: a worker runs no other thread).

Safe point: CPython runs a signal handler between two bytecodes of whatever frame the main
thread is in, which may be the scheduler itself, halfway through a switch. The handler
yields only when the interrupted frames, from the top down to the worker's `run_one`,
are all outside the runtime's own modules, and it runs on the current task's greenlet;
otherwise it does nothing and the next slice's signal tries again. Inside `critical()`
the scheduler keeps the request for the section's end (`Scheduler.request_preempt`).
"""

from __future__ import annotations

import signal
import threading

from greenlet import getcurrent

from . import api, context, queues, scheduler, task

_RUNTIME_FILES = frozenset(m.__file__ for m in (api, context, queues, scheduler, task))


def install(worker, slice_ms: float, mode: str = "auto") -> str:
    """Start preempting `worker`'s tasks; `mode` auto (BPF, else itimer), bpf, itimer,
    off, or owner: the pool's owner has armed its one Preempter on this worker's thread,
    so only the handler is needed here. Returns the source used."""
    from . import worker as worker_mod

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
        if sched.request_preempt():
            worker.preempted += 1

    if slice_ms <= 0 or mode == "off":
        return "off"
    slice_ns = int(slice_ms * 1e6)
    if mode == "owner":
        from xhagent.bpf.preempt import SIGNAL

        signal.signal(SIGNAL, on_slice)
        return "bpf"
    try:
        if mode == "itimer":
            raise OSError("itimer asked for")
        from xhagent.bpf.preempt import SIGNAL, Preempter

        signal.signal(SIGNAL, on_slice)  # before arming: a signal may come at once
        worker.preempter = Preempter()
        worker.preempter.arm(threading.get_native_id(), slice_ns)
        return "bpf"
    except Exception:
        if mode == "bpf":
            raise
        # no BPF here (not root, no BTF, an old kernel): CPU-time itimer
        signal.signal(signal.SIGURG, signal.SIG_DFL)
        signal.signal(signal.SIGPROF, on_slice)  # before the timer: SIGPROF's default kills
        signal.setitimer(signal.ITIMER_PROF, slice_ns / 1e9, slice_ns / 1e9)
        return "itimer"
