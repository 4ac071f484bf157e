"""The subtree lock: one holder, a waiter told whom it waits for, never a file outside its dir."""

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xhagent.cgroups.lock import LockBusy, SubtreeLock, lock_path


def test_lock_files_are_named_by_the_whole_subtree_path(tmp_path):
    a = lock_path(Path("/sys/fs/cgroup/a-b"), tmp_path)
    b = lock_path(Path("/sys/fs/cgroup/a/b"), tmp_path)
    assert a != b and a.parent == b.parent == tmp_path
    assert a.name == "%2Fsys%2Ffs%2Fcgroup%2Fa-b.lock"
    deep = lock_path(Path("/sys/fs/cgroup/" + "/".join(["x" * 60] * 10)), tmp_path)
    assert deep.parent == tmp_path and len(deep.name) < 255


def test_the_lock_dir_is_made_0700_and_a_writable_one_is_refused(tmp_path):
    locks = tmp_path / "run" / "locks"
    with SubtreeLock(Path("/sys/fs/cgroup/x"), locks).acquire():
        assert stat.S_IMODE(os.stat(locks).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(locks.parent).st_mode) == 0o700
    os.chmod(locks, 0o777)
    with pytest.raises(OSError, match="writable only by it"):
        SubtreeLock(Path("/sys/fs/cgroup/x"), locks).acquire()


HOLD = """
import sys, time
from pathlib import Path
from xhagent.cgroups.lock import SubtreeLock
with SubtreeLock(Path(sys.argv[1]), Path(sys.argv[2])).acquire():
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_no_wait_names_the_holder_and_a_waiter_gets_it_when_it_is_released(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, "/sys/fs/cgroup/x", str(tmp_path), "1.0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LockBusy) as info:
            SubtreeLock(Path("/sys/fs/cgroup/x"), tmp_path).acquire(wait=False)
        assert f"pid {holder.pid}" in str(info.value) and "[Errno" not in str(info.value)
        told = []
        start = time.monotonic()
        with SubtreeLock(Path("/sys/fs/cgroup/x"), tmp_path).acquire(on_wait=told.append) as lock:
            assert told == [holder.pid] and time.monotonic() - start > 0.3
            assert lock.holder() == os.getpid()
    finally:
        holder.kill()
        holder.wait()
    SubtreeLock(Path("/sys/fs/cgroup/y"), tmp_path).acquire(
        wait=False
    ).release()  # another subtree: free
