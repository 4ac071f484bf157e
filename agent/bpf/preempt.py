"""preempt.bpf.o: preemption points for the coroutine pool. An armed thread gets
SIGURG once it has run on-CPU longer than its slice since it was armed or reset,
then again after each further slice; a sleeping thread accumulates nothing.

One BPF object serves every armed thread: arm(tid, slice) opens a cpu-clock perf
event on that thread and attaches the program to it; disarm closes it.
"""

from __future__ import annotations

import errno
import os
import signal
import struct
from dataclasses import dataclass

from ..errors import errno_name
from .layout import Mirror, Record, pick
from .loader import (
    PERF_COUNT_SW_CPU_CLOCK,
    PERF_TYPE_SOFTWARE,
    BpfObject,
    Link,
    ProgramLoader,
    perf_event_open,
)

SIGNAL = signal.SIGURG
# ebpf/preempt.h; checked against the object's BTF by tests/unit/test_bpf_layout.py.
STATE = Record(
    "slice_state",
    (("slice_ns", "Q"), ("runtime_ns", "Q"), ("sent", "Q"), ("failed", "Q"), ("last_error", "Q")),
)
SENT, FAILED, FAILED_EBUSY, LAST_ERROR = 0, 1, 2, 3
MIRROR = Mirror(
    "preempt",
    records=(STATE,),
    enums={"xh_preempt_count": pick(globals(), "SENT FAILED FAILED_EBUSY LAST_ERROR")},
)
MAX_TICK_NS, MIN_TICK_NS = 1_000_000, 50_000


def tick_ns(slice_ns: int) -> int:
    """cpu-clock sample period: a fifth of the slice (a signal lands at most one tick
    late), within [50 us, 1 ms] so that long slices do not cost interrupts."""
    return max(MIN_TICK_NS, min(MAX_TICK_NS, slice_ns // 5))


@dataclass(frozen=True)
class Counters:
    sent: int
    failed: int
    failed_ebusy: int
    last_error: int  # positive errno of the last failure, 0 if none

    @property
    def last_error_name(self) -> str:
        return errno_name(self.last_error) if self.last_error else ""


@dataclass(frozen=True)
class ThreadState:
    slice_ns: int
    runtime_ns: int
    sent: int
    failed: int
    last_error: int


class Preempter(ProgramLoader):
    """with Preempter() as p: p.arm(tid, 5_000_000) ... p.disarm(tid)"""

    def __init__(self):
        self.obj = BpfObject("preempt")
        try:
            self._armed = self.obj.map("armed")
            self._counts = self.obj.map("counts")
            self._prog = self.obj.program("on_cpu_clock")
        except BaseException:
            self.obj.close()
            raise
        self._links: dict[int, Link] = {}

    def arm(self, tid: int, slice_ns: int) -> None:
        """Signal `tid` after every `slice_ns` of its CPU time (re-arming resets it)."""
        if slice_ns <= 0:
            raise ValueError(f"slice must be positive, got {slice_ns} ns")
        self._armed.update(struct.pack("<I", tid), STATE.pack(slice_ns, 0, 0, 0, 0))
        if tid in self._links:
            return
        pfd = perf_event_open(
            PERF_TYPE_SOFTWARE,
            PERF_COUNT_SW_CPU_CLOCK,
            pid=tid,
            cpu=-1,
            sample_period=tick_ns(slice_ns),
        )
        try:
            self._links[tid] = self._prog.attach_perf_event(pfd)  # the link owns pfd
        except BaseException:
            os.close(pfd)
            self._armed.delete(struct.pack("<I", tid))
            raise

    def reset(self, tid: int) -> None:
        """Start the slice over (e.g. at a voluntary yield); keeps the thread's counters."""
        st = self.state(tid)
        if st is None:
            raise KeyError(f"thread {tid} is not armed")
        self._armed.update(
            struct.pack("<I", tid), STATE.pack(st.slice_ns, 0, st.sent, st.failed, st.last_error)
        )

    def disarm(self, tid: int) -> None:
        link = self._links.pop(tid, None)
        if link is not None:
            link.destroy()
        try:
            self._armed.delete(struct.pack("<I", tid))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def state(self, tid: int) -> ThreadState | None:
        raw = self._armed.lookup(struct.pack("<I", tid))
        return None if raw is None else ThreadState(*STATE.unpack(raw))

    def counters(self) -> Counters:
        return Counters(
            *(self._counts.get_int(i) for i in (SENT, FAILED, FAILED_EBUSY, LAST_ERROR))
        )

    def close(self) -> None:
        self._links.clear()
        self.obj.close()  # destroys the links, closing their perf events
