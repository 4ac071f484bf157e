"""The daemon's signal handlers (xhagent.daemon.signals): real signals sent to this process,
noted without acting, acted on at a checkpoint; the handlers before them are put back."""

import logging
import os
import select
import signal

import pytest

from xhagent.daemon.daemon import Daemon, Settings
from xhagent.daemon.signals import DaemonSignals, StopRequested


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_stop_is_noted_and_raised_at_the_next_checkpoint():
    with DaemonSignals() as signals:
        signals.checkpoint()  # nothing asked: goes on
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.stop == signal.SIGTERM  # noted, and this process still runs
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt; the first stop counts
        with pytest.raises(StopRequested) as stop:
            signals.checkpoint()
        assert stop.value.signum == signal.SIGTERM and str(stop.value) == "SIGTERM"
        with pytest.raises(StopRequested):  # and at every checkpoint after it
            signals.checkpoint()


def test_sighups_are_one_reload_and_the_pipe_wakes_a_selector():
    with DaemonSignals() as signals:
        assert not readable(signals.fileno()) and not signals.take_reload()
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)
        assert readable(signals.fileno())
        signals.drain()
        assert not readable(signals.fileno())
        assert signals.take_reload() and not signals.take_reload()
        assert signals.stop is None
        signals.checkpoint()  # a SIGHUP is no stop


def test_the_handlers_before_are_put_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    old_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(old_fd)
    with DaemonSignals() as signals:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        fd = signals.fileno()
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(old_fd) == old_fd
    with pytest.raises(OSError):
        os.fstat(fd)  # the pipe is closed


def test_a_stop_before_start_opens_nothing_and_says_stopping(tmp_path, caplog):
    settings = Settings(state_dir=tmp_path / "state", socket=tmp_path / "s", policies_dir=None,
                        node=None)  # fmt: skip
    with DaemonSignals() as signals, caplog.at_level(logging.INFO, "xhagent"):
        os.kill(os.getpid(), signal.SIGTERM)
        assert Daemon(settings, signals).start() is False
    assert not settings.state_dir.exists()
    assert caplog.messages == ["Stopping: SIGTERM during start-up: workloads keep running"]


def test_a_stop_that_came_while_blocked_across_the_allocators_exec_is_caught_on_entry():
    # what allocator.settle() leaves the new image: the signals blocked, one of them pending
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGHUP))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.SIGTERM in signal.sigpending()
        with DaemonSignals() as signals:
            assert signals.stop == signal.SIGTERM and not signals.reload
            assert not {signal.SIGTERM, signal.SIGHUP} & signal.pthread_sigmask(
                signal.SIG_BLOCK, ()
            )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGHUP))
