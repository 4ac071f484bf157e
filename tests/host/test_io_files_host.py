"""read_files on real cgroup-like trees, /proc and sysfs: every file's content, long files
completed, an unreadable path that reports its own error while the rest succeed, and the
same bytes whichever way (io_uring chains or system calls) a file is routed."""

import errno
import os
from pathlib import Path

import pytest

from xhagent import mountinfo
from xhagent.cgroups import discover_hierarchy
from xhagent.io import FileReader, read_file_loop, read_files
from xhagent.io.nowait import Router, refuses_nowait

pytestmark = pytest.mark.host


@pytest.fixture
def tree(tmp_path):
    paths = []
    for g in range(30):
        d = tmp_path / f"job-{g}.scope"
        d.mkdir()
        for name in (
            "cgroup.procs",
            "cpu.stat",
            "memory.stat",
            "io.stat",
            "cgroup.events",
            "pids.current",
            "memory.current",
            "cpu.weight",
            "memory.pressure",
            "cgroup.freeze",
        ):
            p = d / name
            p.write_bytes(f"{name} {g}\n".encode() * (g % 4))  # some are empty
            paths.append(p)
    long = tmp_path / "long"
    long.write_bytes(os.urandom(300_000))  # several rounds: 4 KiB, 64 KiB, 1 MiB
    exact = tmp_path / "exact"
    exact.write_bytes(b"e" * 4096)  # fills the first buffer exactly
    return paths + [long, exact]


def test_tree_contents_match(tree):
    got = read_files(tree)
    assert got == [p.read_bytes() for p in tree]


def test_unreadable_paths_report_their_own_error(tree, tmp_path):
    paths = [tree[0], tmp_path / "missing", tree[1], tmp_path, tree[-1]]
    got = read_files(paths)
    assert (
        got[0] == tree[0].read_bytes() and got[2] == tree[1].read_bytes() and got[4] == b"e" * 4096
    )
    assert (
        isinstance(got[1], OSError)
        and got[1].errno == errno.ENOENT
        and got[1].filename == str(tmp_path / "missing")
    )
    assert isinstance(got[3], OSError) and got[3].errno == errno.EISDIR


def test_proc_and_sysfs_pseudo_files():
    pid = os.getpid()
    paths = [
        f"/proc/{pid}/stat",
        f"/proc/{pid}/status",
        "/proc/self/mountinfo",
        "/proc/meminfo",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        f"/proc/{pid}/cmdline",
    ]
    got = read_files(paths)
    assert got[0].startswith(f"{pid} (".encode())
    assert b"\nPid:\t%d\n" % pid in got[1]
    assert (
        got[2] == Path("/proc/self/mountinfo").read_bytes() or got[2].count(b"\n") > 3
    )  # self = reader
    assert got[3].startswith(b"MemTotal:") and got[4].endswith(b"\n")
    assert got[5] == Path(f"/proc/{pid}/cmdline").read_bytes()


def test_many_proc_stat_files_and_reuse_of_one_reader():
    paths = sorted(str(p) for p in Path("/proc").glob("[0-9]*/stat"))
    with FileReader(entries=64) as reader:
        for _ in range(3):
            got = reader.read_files(paths)
            ref = read_file_loop(paths)
            for p, g, r in zip(paths, got, ref, strict=True):
                if isinstance(r, bytes) and isinstance(g, bytes):
                    # the pid is stable between the two reads (a kworker's comm is not)
                    assert g.split(b" (")[0] == r.split(b" (")[0] == p.split("/")[2].encode(), p
                else:  # a process exited in between: both must say so by then, or one did
                    assert isinstance(g, (bytes, OSError))
        assert reader.ring.pending == 0


def test_more_files_than_slots_and_entries(tree):
    with FileReader(entries=8, slots=2) as reader:
        assert reader.read_files(tree * 3) == [p.read_bytes() for p in tree * 3]


def test_the_kernel_names_the_files_io_uring_would_punt(tmp_path):
    own = tmp_path / "f"
    own.write_bytes(b"x")
    fstype = {m.path: m.fstype for m in mountinfo.read()}[Router().mount_point(str(own))]
    assert refuses_nowait(str(own)) is {"ext4": False, "xfs": False, "btrfs": False}[fstype]
    assert refuses_nowait("/proc/self/stat") is True
    assert refuses_nowait("/sys/kernel/mm/transparent_hugepage/enabled") is True
    unified = discover_hierarchy().unified
    assert unified is not None and refuses_nowait(f"{unified.path}/cgroup.controllers") is True
    assert (
        refuses_nowait(str(tmp_path)) is None and refuses_nowait(str(tmp_path / "missing")) is None
    )


@pytest.mark.parametrize("via", ["auto", "uring", "syscalls"])
def test_every_way_reads_the_same_bytes_and_errors(tree, via):
    pid = os.getpid()
    stable = [f"/proc/{pid}/cmdline", "/sys/kernel/mm/transparent_hugepage/enabled"]
    paths = (
        [str(p) for p in tree]
        + stable
        + ["/proc/999999999/stat", "/sys/kernel", str(tree[0]) + "/x"]
    )
    with FileReader(entries=16, slots=3, via=via) as reader:
        got = reader.read_files(paths)
        n = len(tree)
        assert got[: n + 2] == [Path(p).read_bytes() for p in paths[: n + 2]]
        assert [e.errno for e in got[n + 2 :]] == [errno.ENOENT, errno.EISDIR, errno.ENOTDIR]
        assert [e.filename for e in got[n + 2 :]] == paths[n + 2 :]
        by_syscalls = {"auto": 4, "uring": 0, "syscalls": len(paths)}[via]  # /proc and /sys ones
        assert reader.stats == {"syscalls": by_syscalls, "uring": len(paths) - by_syscalls}
        assert reader.ring.pending == 0


def test_bad_via_is_refused():
    with pytest.raises(ValueError, match="via must be one of auto, uring, syscalls"):
        FileReader(via="threads")
