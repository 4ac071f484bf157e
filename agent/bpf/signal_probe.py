"""signal_probe.bpf.o: SIGURG sent to one thread from a per-thread cpu-clock perf
event, i.e. a signal every `period_ns` of that thread's CPU time. This is how a
CPU-bound Python main thread is preempted: its SIGURG handler runs between bytecodes."""

from __future__ import annotations

import os
import signal

from .layout import Mirror, pick
from .loader import (
    PERF_COUNT_SW_CPU_CLOCK,
    PERF_TYPE_SOFTWARE,
    BpfObject,
    ProgramLoader,
    perf_event_open,
)

SIGNAL = signal.SIGURG
# enum xh_signal_result of ebpf/signal_probe.h; checked by tests/unit/test_bpf_layout.py.
SENT, FAILED, LAST_ERROR = 0, 1, 2
MIRROR = Mirror(
    "signal_probe", enums={"xh_signal_result": pick(globals(), "SENT FAILED LAST_ERROR")}
)


class SignalProbe(ProgramLoader):
    """Attached on construction to a cpu-clock event on thread `tid`."""

    def __init__(self, tid: int, period_ns: int = 1_000_000):
        self.tid = tid
        self.obj = BpfObject("signal_probe")
        try:
            self._results = self.obj.map("results")
            self.obj.map("target").set_u32(0, tid)
            pfd = perf_event_open(
                PERF_TYPE_SOFTWARE,
                PERF_COUNT_SW_CPU_CLOCK,
                pid=tid,
                cpu=-1,
                sample_period=period_ns,
            )
            try:
                self.obj.program("on_tick").attach_perf_event(pfd)  # the link owns pfd now
            except BaseException:
                os.close(pfd)
                raise
        except BaseException:
            self.obj.close()
            raise

    def results(self) -> tuple[int, int, int]:
        """(signals sent, helper failures, last helper errno)."""
        return tuple(self._results.get_int(i) for i in (SENT, FAILED, LAST_ERROR))
