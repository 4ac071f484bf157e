"""Per-task delays read from this kernel over generic netlink: CPU contention, block I/O,
tasks started while accounting was off, reaped pids, privileges; and the doctor's items.

kernel.task_delayacct is a node-wide switch: the module puts back the value it found.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from xhagent.doctor import taskstats_probe
from xhagent.metrics.taskstats import (
    DELAYACCT,
    OFFSETS,
    Delay,
    DelayAcct,
    TaskGone,
    TaskStats,
    delayacct,
    enable_delayacct,
    set_delayacct,
)

pytestmark = pytest.mark.host

# Spins for `cpu` seconds of its own CPU time, says so, then sleeps until stdin closes, so
# its delays are read while it still exists and no longer changes.
SPIN = (
    "import sys, time\n"
    "while time.process_time() < float(sys.argv[1]): pass\n"
    "print('spun', flush=True)\n"
    "sys.stdin.read()\n"
)
# Waits for a line on stdin, reads a file PASSES times with O_DIRECT (every read goes to the
# disk), says how many bytes, then sleeps until stdin closes.
#
# Reads of 1 MiB, not 64 KiB: the kernel counts a block-I/O wait only when the reader is
# taken off its run queue for it, and on a busy CPU a reader that sleeps briefly may be woken
# while the scheduler still holds it queued (a delayed dequeue), which is not counted. Here
# 64 KiB reads beside four CPU spinners were counted 41-128 times in 128, 1 MiB reads 7-8 in 8.
PASSES = 4
DIRECT_READ = (
    "import mmap, os, sys\n"
    "sys.stdin.readline()\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)\n"
    "buf, n = mmap.mmap(-1, 1 << 20), 0\n"
    f"for _ in range({PASSES}):\n"
    "    at = 0\n"
    "    while (got := os.preadv(fd, [buf], at)) > 0: at += got\n"
    "    n += at\n"
    "print(n, flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture(scope="module", autouse=True)
def restore_delayacct():
    found = DELAYACCT.read_text()
    yield
    DELAYACCT.write_text(found)
    assert DELAYACCT.read_text() == found


@pytest.fixture
def ts():
    with TaskStats() as client:
        yield client


def _start(code: str, *args: str, cpu: int | None = None) -> subprocess.Popen:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return subprocess.Popen(
        [*pin, sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _finish(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.stdin.close()
        p.wait(timeout=10)
        p.stdout.close()


def _schedstat(pid: int) -> tuple[int, int, int]:
    """(ns on CPU, ns waiting on a run queue, times run) of the main thread."""
    return tuple(map(int, Path(f"/proc/{pid}/schedstat").read_text().split()))


def test_two_spinners_on_one_cpu_each_wait_for_it(ts):
    enable_delayacct()
    cpu = max(os.sched_getaffinity(0))
    spinners = [_start(SPIN, "0.5", cpu=cpu) for _ in range(2)]
    try:
        for p in spinners:
            assert p.stdout.readline() == "spun\n"
        for p in spinners:
            d = ts.delays(p.pid)
            assert d.pid == p.pid and d.version >= 8
            # Sharing one CPU, each spent about as long runnable as running (~0.5 s).
            assert d.cpu.count > 0 and d.cpu.total > 0.2, d
            # The same figures the scheduler shows in /proc: one thread, not running now.
            ran, run_delay, pcount = _schedstat(p.pid)
            assert d.cpu.count == pcount
            assert d.cpu.total == pytest.approx(run_delay * 1e-9, abs=1e-9)
            assert d.run == pytest.approx(ran * 1e-9, abs=1e-9) and d.run >= 0.5
            for other in (d.blkio, d.swapin, d.reclaim, d.thrashing, d.compact):
                assert other.count >= 0 and other.total >= 0
    finally:
        _finish(*spinners)


@pytest.fixture
def disk_file(tmp_path):
    """8 MiB on a disk-backed filesystem (not tmpfs), so O_DIRECT reads wait for the disk."""
    path = Path(__file__).resolve().parents[2] / f".taskstats-{os.getpid()}.dat"
    path.write_bytes(os.urandom(8 << 20))
    os.sync()
    yield path
    path.unlink()


def test_block_io_is_counted_only_for_tasks_started_while_accounting_is_on(ts, disk_file):
    set_delayacct(False)
    before = _start(DIRECT_READ, str(disk_file))  # forked while off: gets no delay record
    try:
        assert enable_delayacct() == DelayAcct("on", changed=True)
        after = _start(DIRECT_READ, str(disk_file))
        try:
            for p in (before, after):
                p.stdin.write("go\n")
                p.stdin.flush()
                assert int(p.stdout.readline()) == PASSES * (8 << 20)
            started_on, started_off = ts.delays(after.pid), ts.delays(before.pid)
        finally:
            _finish(after)
    finally:
        _finish(before)
    assert started_on.blkio.count > 0 and started_on.blkio.total > 0, started_on
    # Read the same bytes while accounting was on, but forked while it was off.
    assert started_off.blkio == Delay(0, 0.0), started_off
    assert started_off.cpu.count > 0  # the scheduler's figure is there regardless


def test_a_reaped_pid_is_gone_and_delays_of_leaves_it_out(ts):
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(TaskGone) as err:
        ts.delays(child.pid)
    assert isinstance(err.value, ProcessLookupError) and err.value.errno == 3
    assert f"process {child.pid}: no such task: -ESRCH" in str(err.value)
    assert set(ts.delays_of([os.getpid(), child.pid])) == {os.getpid()}


def test_one_thread_or_its_whole_group(ts):
    spun, stop = threading.Event(), threading.Event()
    tids = []

    def spin():
        tids.append(threading.get_native_id())
        while time.thread_time() < 0.2:
            pass
        spun.set()
        stop.wait()

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        assert spun.wait(timeout=10)
        thread = ts.delays(tids[0], thread=True)
        group = ts.delays(os.getpid())
    finally:
        stop.set()
        worker.join()
    assert thread.pid == tids[0] and group.pid == os.getpid()
    assert 0.15 <= thread.run < group.run  # the group adds the main thread's time


def test_threads_may_share_one_client(ts):
    children = [_start(SPIN, "0") for _ in range(3)]
    pids = [os.getpid(), *(c.pid for c in children)]
    wrong = []

    def ask(pid):
        for _ in range(300):
            if ts.delays(pid).pid != pid:
                wrong.append(pid)

    try:
        for c in children:
            assert c.stdout.readline() == "spun\n"
        threads = [threading.Thread(target=ask, args=(pid,)) for pid in pids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _finish(*children)
    assert wrong == []


RUN = "import json, sys\nfrom xhagent.metrics import taskstats as t\n"


def _without(caps: str, code: str) -> dict:
    res = subprocess.run(
        ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_without_cap_net_admin_the_error_names_it():
    got = _without(
        "-net_admin",
        RUN + "try:\n    t.TaskStats().delays(1)\nexcept t.TaskStatsError as e:\n"
        "    print(json.dumps([type(e).__name__, e.errno, str(e)]))\n",
    )
    assert got == [
        "TaskStatsPermissionError",
        1,
        "taskstats of process 1: TASKSTATS_CMD_GET needs CAP_NET_ADMIN: -EPERM "
        "(Operation not permitted)",
    ]


def test_enable_without_cap_sys_admin_says_why_and_changes_nothing():
    set_delayacct(False)
    got = _without("-sys_admin", RUN + "print(json.dumps(t.enable_delayacct().__dict__))\n")
    assert got["state"] == "off" and not got["changed"]
    assert got["reason"] == (
        "write 1 to /proc/sys/kernel/task_delayacct: -EPERM (Operation not permitted)"
    )
    assert delayacct().state == "off"


def test_doctor_items_follow_the_sysctl_and_leave_it_as_found():
    set_delayacct(False)
    items = {i.name: i for i in taskstats_probe.probe()}
    assert items["taskstats"].ok and items["taskstats"].detail["version"] >= 8
    item = items["taskstats.delayacct"]
    assert item.ok and item.detail["state"] == "off" and item.detail["can_enable"]
    assert DELAYACCT.read_text() == "0\n"  # the write-back probe changed nothing

    set_delayacct(True)
    (_, item) = taskstats_probe.probe()
    assert item.ok and item.detail["state"] == "on"

    set_delayacct(False)
    got = _without(
        "-sys_admin",
        "import json\nfrom xhagent.doctor import taskstats_probe as p\n"
        "print(json.dumps([[i.ok, i.reason, i.detail] for i in p.probe()]))\n",
    )
    (ts_ok, _, _), (ok, reason, detail) = got
    assert ts_ok  # reading delays needs CAP_NET_ADMIN, not CAP_SYS_ADMIN
    assert not ok and detail == {"state": "off", "can_enable": False}
    assert "may not set it (write 0 to /proc/sys/kernel/task_delayacct: -EPERM" in reason


def test_the_offsets_read_are_this_kernels_struct_taskstats():
    bpftool = shutil.which("bpftool")
    assert bpftool, "bpftool (Debian package bpftool, tools/setup-deps) reads the kernel's BTF"
    dump = subprocess.run(
        [bpftool, "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "raw"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    body = re.search(r"STRUCT 'taskstats' size=\d+ vlen=\d+\n((?:\t.*\n)+)", dump)
    assert body, "struct taskstats is in the kernel's BTF"
    members = {
        m[1]: int(m[2]) // 8
        for m in re.finditer(r"\t'(\w+)' type_id=\d+ bits_offset=(\d+)", body[1])
    }
    assert {name: members[name] for name in OFFSETS} == OFFSETS
