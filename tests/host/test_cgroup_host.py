"""Freeze, thaw and kill on this host's cgroup2 tree, observed from the workload's side."""

import os
import select
import subprocess
import sys
import time

import pytest

from xhagent.cgroups import CgroupError

pytestmark = pytest.mark.host

TICKER = (
    "import sys, time\n"
    "while True:\n"
    "    sys.stdout.write('t'); sys.stdout.flush(); time.sleep(0.005)\n"
)


def _ticks(fd, seconds):
    """Bytes the ticker writes within `seconds`."""
    got, deadline = 0, time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            got += len(os.read(fd, 65536))
    return got


def test_freeze_stops_the_workload_and_thaw_resumes_it(group):
    child = subprocess.Popen([sys.executable, "-c", TICKER], stdout=subprocess.PIPE)
    try:
        group.add_proc(child.pid)
        fd = child.stdout.fileno()
        assert _ticks(fd, 0.2) > 0
        group.freeze()
        assert group.events()["frozen"] == 1
        _ticks(fd, 0.05)  # what was written before the freeze landed
        assert _ticks(fd, 0.3) == 0
        group.thaw()
        assert group.events()["frozen"] == 0
        assert _ticks(fd, 0.3) > 0
    finally:
        group.kill()
        assert child.wait(timeout=5) == -9
    assert group.events()["populated"] == 0


def test_refused_write_names_file_value_and_errno(group):
    with pytest.raises(CgroupError) as info:
        group.write("cgroup.freeze", "frozen")
    msg = str(info.value)
    assert "cgroup.freeze" in msg and "'frozen'" in msg and "EINVAL" in msg
    with pytest.raises(CgroupError) as info:
        group.add_proc(999_999_999)
    assert info.value.errno in (3, 22)  # ESRCH or EINVAL, by kernel version
