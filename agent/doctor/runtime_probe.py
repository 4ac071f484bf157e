"""The worker pool's slice preemption: which signal source this node's pool gets, and why.

The rule is the pool's own (`runtime.pool.Pool`, preempt="auto"): the BPF preempter when
its object loads, else each worker's CPU-time timer (`timer_create` on
CLOCK_THREAD_CPUTIME_ID, SIGEV_THREAD_ID). Both are tried for real on this thread, with the
pool's default slice: armed, then this thread spins until SIGURG comes, so the item also
says whether the source the pool picks delivers. Nothing outlives the process (a BPF link
and a kernel timer are the process's own), so a stop mid-probe leaves nothing behind.
"""

from __future__ import annotations

import signal
import threading
import time

from ..errors import errno_reason
from .report import Item, fail, ok

NAME = "runtime.preempt"
SLICE_MS = 10.0  # the pool's default
WAIT = 1.0  # seconds of spinning before a source is called silent


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno and not exc.strerror:
        return errno_reason(exc)
    return str(exc) or type(exc).__name__


def _spin_for_signal(hits: list) -> float | None:
    """Spin until the handler records a signal: the CPU ms it took, None after WAIT s."""
    c0, deadline = time.thread_time(), time.monotonic() + WAIT
    while not hits and time.monotonic() < deadline:
        pass  # burn CPU: both sources count this thread's CPU time
    return round((hits[0] - c0) * 1e3, 2) if hits else None


def try_bpf(hits: list) -> tuple[bool, float | None, str]:
    """(loads, CPU ms to the first signal or None, why not)."""
    try:
        from ..bpf.preempt import Preempter

        preempter = Preempter()
    except Exception as exc:  # what the pool catches too: it then uses the timer
        return False, None, f"the BPF preempter does not load: {_why(exc)}"
    try:
        try:
            preempter.arm(threading.get_native_id(), int(SLICE_MS * 1e6))
        except Exception as exc:
            return True, None, f"the BPF preempter loads but cannot arm a thread: {_why(exc)}"
        ms = _spin_for_signal(hits)
    finally:
        preempter.close()
    if ms is None:
        c = preempter.counters()
        return True, None, f"no SIGURG within {WAIT:g} s (sent={c.sent}, failed={c.failed})"
    return True, ms, ""


def try_timer(hits: list) -> tuple[float | None, str]:
    """(CPU ms to the first signal or None, why not)."""
    from ..runtime.preemption import SIGNAL, SliceTimer

    try:
        timer = SliceTimer(SIGNAL, int(SLICE_MS * 1e6))
    except Exception as exc:
        return None, _why(exc)
    with timer:
        ms = _spin_for_signal(hits)
    return (ms, "") if ms is not None else (None, f"no SIGURG within {WAIT:g} s")


def decide(bpf: tuple[bool, float | None, str], timer: tuple[float | None, str]) -> Item:
    """The item from the two attempts: the source is the pool's pick (BPF when it loads)."""
    loads, bpf_ms, bpf_why = bpf
    timer_ms, timer_why = timer
    detail = {"slice_ms": SLICE_MS, "bpf_signal_ms": bpf_ms, "timer_signal_ms": timer_ms}
    timer_says = (
        f"the CPU-time timer signalled after {timer_ms} ms of CPU"
        if timer_ms is not None
        else f"the CPU-time timer fails too: {timer_why}"
    )
    if loads:
        if bpf_ms is None:
            return fail(
                NAME,
                f"the pool uses the BPF preempter (it loads), but it does not preempt: "
                f"{bpf_why}; preempt='timer' avoids it ({timer_says})",
                source="bpf",
                **detail,
            )
        return ok(
            NAME,
            source="bpf",
            because=f"the BPF preempter loads and signalled after {bpf_ms} ms of CPU; the"
            f" CPU-time timer is for nodes where BPF does not load (here: {timer_says})",
            **detail,
        )
    if timer_ms is None:
        return fail(NAME, f"no preemption source: {bpf_why}; {timer_says}", source="off", **detail)
    return ok(NAME, source="timer", because=f"{bpf_why}; {timer_says}", **detail)


def probe() -> list[Item]:
    from ..runtime.preemption import SIGNAL

    if threading.current_thread() is not threading.main_thread():
        return [fail(NAME, "must run in the main thread (Python runs signal handlers only there)")]
    hits: list[float] = []
    old = signal.signal(SIGNAL, lambda signum, frame: hits.append(time.thread_time()))
    try:
        bpf = try_bpf(hits)
        hits.clear()
        time.sleep(0.01)  # a late BPF signal lands here, not in the timer's count
        hits.clear()
        timer = try_timer(hits)
    finally:
        signal.signal(SIGNAL, old)
    return [decide(bpf, timer)]
