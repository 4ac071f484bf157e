"""Sampler on real files, real cgroups and real processes: every sample is the files' content
now (kernfs and procfs regenerate it at offset 0), buffers grow and are capped, each file is
read the way its mount calls for, and a removed cgroup or an exited process is reported gone,
never shown with its last bytes; a cgroup re-created under the same name is read afresh."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, discover_hierarchy
from xhagent.cgroups.stats import StatsSampler
from xhagent.io import Sampler
from xhagent.io.nowait import refuses_nowait

pytestmark = pytest.mark.host


@pytest.fixture
def tree(tmp_path):
    paths = []
    for g in range(20):
        d = tmp_path / f"job-{g}.scope"
        d.mkdir()
        for name in ("cpu.stat", "memory.stat", "io.stat", "cgroup.events", "pids.current"):
            p = d / name
            p.write_bytes(f"{name} {g}\n".encode() * (g % 3))  # some are empty
            paths.append(str(p))
    return paths


@pytest.fixture
def slice_dir():
    """A parent group of this test's own under the host's cgroup2 tree; whatever a test left
    below it is removed afterwards."""
    root = discover_hierarchy().unified
    assert root is not None, "this host has a cgroup2 mount"
    top = Path(root.path) / f"xhagent-test-sampler-{os.getpid()}"
    top.mkdir()
    yield top
    for d in sorted(top.glob("**/"), key=lambda p: -len(p.parts)):
        if d != top:
            d.rmdir()
    top.rmdir()


def contents(paths):
    return {p: Path(p).read_bytes() for p in paths}


def test_tree_contents_and_changes_show_in_the_next_sample(tree):
    with Sampler(tree) as s:
        assert s.sample() == contents(tree)
        Path(tree[3]).write_bytes(b"changed\n")
        Path(tree[7]).write_bytes(b"")
        Path(tree[9]).write_bytes(b"x" * 100_000)  # past its fitted buffer and 64 KiB: grows
        got = s.sample()
        assert got == contents(tree)
        assert got[tree[9]] == b"x" * 100_000 and s.stats["regrown"] >= 1
        assert not s.gone and not s.errors and not s.replaced


def test_ways_agree_and_auto_routes_by_mount(tree):
    proc = f"/proc/{os.getpid()}/stat"
    paths = tree + [proc, "/proc/self/status"]
    got = {}
    for via in ("auto", "uring", "pread"):
        with Sampler(paths, via=via) as s:
            out = s.sample()
            got[via] = {p: v for p, v in out.items() if not p.startswith("/proc")}
            assert out[proc].startswith(f"{os.getpid()} (".encode())
            if via == "auto":  # /proc would be punted; the tmp tree as its mount says
                inline = 0 if refuses_nowait(tree[0]) else len(tree)
                assert s.stats["uring"] == inline and s.stats["pread"] == len(paths) - inline
            elif via == "pread":
                assert s.stats["uring"] == 0
    assert got["auto"] == got["uring"] == got["pread"] == contents(tree)


def test_buffers_are_capped_and_binary_content_is_exact(tmp_path):
    big, exact, binary = tmp_path / "big", tmp_path / "exact", tmp_path / "binary"
    big.write_bytes(b"b" * 70_000)
    exact.write_bytes(b"e" * 4096)  # fills the first buffer exactly: read again to be sure
    binary.write_bytes(b"a\0b\0\0c" * 1000)  # NULs: the packed form cannot split it at NUL
    small = tmp_path / "small"
    small.write_bytes(b"ok\n")
    with Sampler([big, exact, binary, small], max_bytes=65536) as s:
        got = s.sample()
        assert str(big) not in got and s.errors[str(big)].errno == errno.EFBIG
        assert got == {
            str(exact): b"e" * 4096,
            str(binary): binary.read_bytes(),
            str(small): b"ok\n",
        }
        big.write_bytes(b"b" * 100)  # back under the cap: read again
        assert s.sample()[str(big)] == b"b" * 100 and not s.errors


def test_packed_snapshot_matches_and_outlives_the_next_sample(tree):
    with Sampler(tree) as s:
        snap = s.sample_packed()
        assert len(snap) == len(tree) and snap.paths == tuple(tree)
        assert [snap[s.index(p)] for p in tree] == [Path(p).read_bytes() for p in tree]
        assert dict(snap.items()) == contents(tree)
        before = snap[0]
        Path(tree[0]).write_bytes(b"later\n")
        s.sample()
        assert snap[0] == before and s.sample_packed()[0] == b"later\n"


def test_missing_file_is_an_error_until_reopened_on_request(tmp_path, tree):
    late = tmp_path / "late"
    with Sampler(tree + [late]) as s:
        got = s.sample()
        assert str(late) not in got and s.errors[str(late)].errno == errno.ENOENT
        assert len(got) == len(tree) and not s.gone
        late.write_bytes(b"here\n")
        assert str(late) not in s.sample()  # not looked for again by itself
        assert s.reopen() == [str(late)]
        assert s.sample()[str(late)] == b"here\n" and not s.errors


def test_kernfs_content_is_regenerated_at_each_sample(slice_dir):
    cg = slice_dir / "g"
    cg.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Sampler([cg / "cgroup.procs", cg / "cgroup.events"]) as s:
            first = s.sample()
            assert first[str(cg / "cgroup.procs")] == b""
            assert b"populated 0" in first[str(cg / "cgroup.events")]
            (cg / "cgroup.procs").write_text(str(child.pid))
            now = s.sample()
            assert now[str(cg / "cgroup.procs")] == f"{child.pid}\n".encode()
            assert b"populated 1" in now[str(cg / "cgroup.events")]
    finally:
        child.kill()
        child.wait()


def test_removed_cgroup_is_gone_and_a_recreated_one_is_read_afresh(slice_dir):
    a, b = slice_dir / "a", slice_dir / "b"
    a.mkdir()
    b.mkdir()
    paths = [str(g / f) for g in (a, b) for f in ("cgroup.stat", "cgroup.events", "cpu.stat")]
    with Sampler(paths) as s:
        assert set(s.sample()) == set(paths)
        b.rmdir()
        got = s.sample()
        b_files = {p for p in paths if p.startswith(str(b) + "/")}
        assert set(got) == set(paths) - b_files and s.gone == b_files and not s.errors
        assert set(s.sample()) == set(paths) - b_files and s.gone == b_files  # stays gone
        assert s.reopen(sorted(b_files)) == [] and s.gone == b_files  # nothing to re-open yet
        b.mkdir()  # the same name, another inode: re-opened without being asked
        got = s.sample()
        assert set(got) == set(paths) and s.replaced == b_files and not s.gone
        assert b"populated 0" in got[str(b / "cgroup.events")]
        assert set(s.sample()) == set(paths) and not s.replaced  # reported once


def test_cgroup_recreated_between_two_samples_is_never_shown_stale(slice_dir):
    g = slice_dir / "g"
    g.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (g / "cgroup.procs").write_text(str(child.pid))
        with Sampler([g / "cgroup.procs", g / "cgroup.events"]) as s:
            assert s.sample()[str(g / "cgroup.procs")] == f"{child.pid}\n".encode()
            (slice_dir / "cgroup.procs").write_text(str(child.pid))  # out, then remove, re-create
            ino = g.stat().st_ino
            g.rmdir()
            g.mkdir()
            assert g.stat().st_ino != ino
            got = s.sample()
            assert got[str(g / "cgroup.procs")] == b""  # the new group's, not the old pid
            assert b"populated 0" in got[str(g / "cgroup.events")]
            assert s.replaced == {str(g / "cgroup.procs"), str(g / "cgroup.events")}
            assert not s.gone
    finally:
        child.kill()
        child.wait()


def test_exited_process_is_gone_and_dropped_on_request():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mine, theirs = f"/proc/{os.getpid()}/stat", f"/proc/{child.pid}/stat"
    with Sampler([mine, theirs]) as s:
        assert s.sample()[theirs].startswith(f"{child.pid} (python".encode())
        child.kill()
        child.wait()  # reaped: its /proc entry goes
        got = s.sample()
        assert theirs not in got and s.gone == {theirs} and mine in got and not s.errors
        assert s.drop_gone() == [theirs]
        assert s.paths == (mine,) and not s.gone and list(s.sample()) == [mine]


def test_stats_sampler_reads_groups_and_forgets_a_removed_one(slice_dir):
    groups = [Cgroup(slice_dir / n).create() for n in ("x", "y")]
    with StatsSampler(groups) as stats:
        first = stats.read()
        assert all("cgroup.stat" in g and "cpu.pressure" in g for g in first)
        assert first[0]["cgroup.stat"]["nr_descendants"] == 0
        (slice_dir / "x" / "sub").mkdir()
        groups[1].remove()
        second = stats.read()
        assert second[0]["cgroup.stat"]["nr_descendants"] == 1  # read now, not at open
        assert second[1] == {}  # removed: no statistics rather than the last ones


def test_stats_sampler_counts_its_reads_by_how_and_plain_reads_where_the_engine_is_missing(
    slice_dir, monkeypatch
):
    from xhagent.cgroups import stats as stats_module

    groups = [Cgroup(slice_dir / n).create() for n in ("x", "y")]
    with StatsSampler(groups) as stats:
        assert stats.reads() == {"io_uring": 0, "pread": 0}
        stats.read()
        stats.read()
        once = sum(stats.reads().values())
        assert once > 0 and once % 2 == 0  # two passes over the same open files
    monkeypatch.setattr(stats_module, "_sampler_class", lambda: None)
    with StatsSampler(groups) as plain:
        plain.read()
        assert plain.reads() == {"plain": once // 2}
