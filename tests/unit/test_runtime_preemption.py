"""The preemption fallback's timer (timer_create on CLOCK_THREAD_CPUTIME_ID, SIGEV_THREAD_ID)
against this kernel: it needs no privilege, so these run anywhere Linux does."""

import errno
import signal
import threading
import time

import pytest

from xhagent.errors import KernelError
from xhagent.runtime import preemption
from xhagent.runtime.preemption import SIGNAL, SliceTimer

SLICE_NS = 5_000_000


def spin(seconds):
    c0, t0 = time.thread_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass
    return time.thread_time() - c0


@pytest.fixture
def hits():
    got = []
    old = signal.signal(SIGNAL, lambda signum, frame: got.append(time.thread_time()))
    yield got
    signal.signal(SIGNAL, old)


def test_a_signal_per_slice_of_cpu_time_and_none_asleep(hits):
    with SliceTimer(SIGNAL, SLICE_NS) as t:
        assert t.remaining()[1] == SLICE_NS
        cpu = spin(0.2)
        time.sleep(0.01)  # a signal sent at the spin's very end is handled here
        spun = len(hits)
        c0 = time.thread_time()
        time.sleep(0.3)  # the thread's clock (nearly) stands still
        asleep, asleep_cpu = len(hits) - spun, time.thread_time() - c0
    # the kernel checks CPU timers at its tick, so a slice may stretch by up to a tick
    assert 0.5 * cpu / 5e-3 <= spun <= cpu / 5e-3 + 1, (spun, cpu)
    # A wall-clock timer would have sent 60. A few may come: this VM charges a sleeping
    # thread some CPU time (3-4 ms per 0.3 s sleep, measured without any timer), and a slice
    # that expired at the spin's end is noticed at a tick while the thread runs.
    assert asleep <= asleep_cpu / 5e-3 + 2 and asleep <= 5, (asleep, asleep_cpu)
    closed = len(hits)
    spin(0.1)
    assert len(hits) - closed <= 2  # closed: the timer is gone (20 slices, one in flight)


def test_the_signal_goes_to_the_thread_that_made_the_timer(hits):
    # Blocked in the spinning thread, the signal stays pending there; a process-wide
    # signal would go to the main thread instead, whose handler records it.
    got = {}

    def thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
        with SliceTimer(SIGNAL, SLICE_NS):
            got["cpu"] = spin(0.05)
            info = signal.sigtimedwait({SIGNAL}, 0)
        got["signo"] = info and info.si_signo
        got["code"] = info and info.si_code

    th = threading.Thread(target=thread)
    th.start()
    th.join()
    time.sleep(0.02)  # the main thread spun nothing: its own clock gave no signal either
    assert got["signo"] == SIGNAL
    assert got["code"] == -2  # SI_TIMER: a POSIX timer sent it
    assert hits == []


def test_close_deletes_the_kernel_timer():
    t = SliceTimer(SIGNAL, SLICE_NS)
    kernel_id = t.id
    t.close()
    t.close()  # a second close does nothing
    with pytest.raises(ValueError, match="closed"):
        t.remaining()
    from xhagent._runq import lib

    assert lib.rq_cputimer_delete(kernel_id) == -errno.EINVAL  # no such timer any more


def test_errors_name_the_call_and_the_errno():
    with pytest.raises(KernelError) as err:
        SliceTimer(0, SLICE_NS)  # signal 0 is no signal
    assert err.value.errno == errno.EINVAL
    assert str(err.value).startswith("timer_create(CLOCK_THREAD_CPUTIME_ID, SIGEV_THREAD_ID)")
    assert "-EINVAL (Invalid argument)" in str(err.value)
    with pytest.raises(ValueError, match="positive"):
        SliceTimer(SIGNAL, 0)


def test_the_signal_is_the_bpf_preempters():
    from xhagent.bpf.preempt import SIGNAL as BPF_SIGNAL

    assert BPF_SIGNAL == SIGNAL


class _Worker:
    slices = preempted = 0
    preempter = None

    def run_one(self):
        pass


def test_install_modes():
    old = signal.getsignal(SIGNAL)
    try:
        with pytest.raises(ValueError, match="itimer.*auto, bpf, timer, off, owner"):
            preemption.install(_Worker(), 10, "itimer")
        w = _Worker()
        assert preemption.install(w, 10, "off") == "off" and w.preempter is None
        assert preemption.install(w, 0, "timer") == "off"
        assert preemption.install(w, 10, "timer") == "timer"
        assert isinstance(w.preempter, SliceTimer) and w.preempter.remaining()[1] == 10_000_000
        assert signal.getsignal(SIGNAL) is not old  # the handler is in place
        w.preempter.close()
    finally:
        signal.signal(SIGNAL, old)
