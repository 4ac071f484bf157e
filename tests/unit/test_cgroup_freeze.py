"""A freeze that is not confirmed, fails or is stopped by a signal leaves the group thawed.

The group here is a plain directory whose `cgroup.events` never says `frozen 1`, so the
wait runs until its deadline or until a signal cuts it: the moment the real kernel makes
too short to hit on purpose.
"""

import os
import signal
import threading

import pytest

from xhagent.cgroups.group import MAX_TIMEOUT, Cgroup, CgroupError, check_timeout
from xhagent.signals import Terminated, terminate_on_signals


@pytest.fixture
def stuck(tmp_path):
    """A 'group' whose freeze is never confirmed."""
    (tmp_path / "cgroup.freeze").write_text("0\n")
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    return Cgroup(tmp_path)


def freeze_file(cg):
    return (cg.path / "cgroup.freeze").read_text()[0]


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -1.0, 0.0, MAX_TIMEOUT * 2, "2", True]
)
def test_bad_timeouts_are_refused_before_any_write(stuck, value):
    with pytest.raises(ValueError):
        check_timeout(value)
    for op in (stuck.freeze, stuck.thaw, stuck.kill):
        with pytest.raises(ValueError):
            op(value)
    assert freeze_file(stuck) == "0"
    assert not (stuck.path / "cgroup.kill").exists()


def test_an_unconfirmed_freeze_is_thawed_back_and_the_message_has_no_errno_prefix(stuck):
    with pytest.raises(CgroupError) as info:
        stuck.freeze(0.1)
    assert freeze_file(stuck) == "0"
    assert "thawed back" in str(info.value) and "[Errno" not in str(info.value)


def _signal_soon(signum, delay=0.15):
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_the_wait_thaws_back_then_reaches_the_process_handler(stuck, signum):
    timer = _signal_soon(signum)
    with pytest.raises(Terminated) as info:
        with terminate_on_signals():
            stuck.freeze(5.0)
    timer.join()
    assert info.value.signum == signum
    assert freeze_file(stuck) == "0"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_a_handler_that_only_notes_the_signal_still_gets_a_failed_freeze(stuck):
    seen = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        timer = _signal_soon(signal.SIGTERM)
        with pytest.raises(CgroupError) as info:
            stuck.freeze(5.0)
        timer.join()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert seen == [signal.SIGTERM]
    assert "interrupted by SIGTERM" in str(info.value)
    assert freeze_file(stuck) == "0"


def test_a_group_already_asked_frozen_is_never_thawed_by_a_failed_wait(stuck):
    (stuck.path / "cgroup.freeze").write_text("1\n")
    with pytest.raises(CgroupError):
        stuck.freeze(0.1)
    assert freeze_file(stuck) == "1"
