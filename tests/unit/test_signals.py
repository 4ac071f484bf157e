"""Every stop takes the cleanup path: SIGTERM raises, held sections finish, children hear it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from xhagent.signals import (
    Terminated,
    forward_signals,
    signals_held,
    terminate_on_signals,
    wait_exit_code,
)


def test_sigterm_raises_terminated_and_finally_runs():
    cleaned = []
    with pytest.raises(Terminated) as info:
        with terminate_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises before this returns
            finally:
                cleaned.append(True)
    assert cleaned == [True] and info.value.exit_code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_held_section_finishes_before_the_signal_is_delivered():
    steps = []
    with pytest.raises(Terminated):
        with terminate_on_signals():
            with signals_held():
                os.kill(os.getpid(), signal.SIGHUP)
                steps.append("after kill")  # not cut off by the signal
            steps.append("not reached")
    assert steps == ["after kill"]
    assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_forwarded_signal_reaches_the_child_and_its_status_is_reported():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with forward_signals(child.pid) as received:
        os.kill(os.getpid(), signal.SIGTERM)
        code = wait_exit_code(child.pid)
    child.returncode = code  # reaped here, not by Popen
    assert received == [signal.SIGTERM]
    assert code == 128 + signal.SIGTERM
