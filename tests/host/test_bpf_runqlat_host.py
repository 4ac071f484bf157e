"""Run-queue latency per cgroup (xhagent.bpf.runqlat) on this kernel, for real: CPU hogs
pinned to one CPU in cgroup2 groups of this host wait for each other, and only the
watched groups' waits land in their histograms."""

import errno
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from xhagent.bpf import BpfError
from xhagent.bpf.runqlat import MAX_GROUPS, RunqLatency, cgroup_id
from xhagent.cgroups import Cgroup
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

# Pinned to CPU 0, so that every hog waits while the others run.
HOG = [sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"]


@pytest.fixture
def groups():
    """make(name, parent=None) -> a fresh cgroup2 group under this test's own slice;
    hog(group) starts a pinned CPU hog inside it. Everything is killed, reaped and
    removed afterwards."""
    root = discover_hierarchy().unified
    assert root is not None, "this host has a cgroup2 mount"
    top = Cgroup(os.path.join(root.path, f"xhagent-test-runqlat-{os.getpid()}")).create()
    made, procs = [], []

    def make(name, parent=None):
        g = Cgroup((parent or top).path / name).create()
        made.append(g)
        return g

    def hog(group):
        p = group.spawn(HOG)
        procs.append(p)
        return p

    yield SimpleNamespace(make=make, hog=hog)
    if top.events()["populated"]:
        top.kill()  # cgroup.kill takes the whole subtree
    for p in procs:
        p.wait(5)
    for g in reversed(made):
        g.remove()
    top.remove()


def _well_formed(h):
    les = [le for le, _ in h.buckets]
    counts = [n for _, n in h.buckets]
    assert les == sorted(les) and les[-1] == float("inf")
    assert counts == sorted(counts) and counts[-1] == h.count


def test_contending_groups_get_their_own_waits(groups):
    """Three hogs share one CPU, two in `a` and one in `b`: at any moment two of them
    wait, so the groups' summed waits approach twice the time they ran, split 2:1."""
    a, b = groups.make("a"), groups.make("b")
    with RunqLatency() as rq:
        assert rq.watch(a.path) == os.stat(a.path).st_ino
        rq.watch(b.path)
        start = time.monotonic()
        for g in (a, a, b):
            groups.hog(g)
        time.sleep(1.5)
        ha, hb = rq.histogram(a.path), rq.histogram(b.path)
        window = time.monotonic() - start
        assert set(rq.histograms()) == {cgroup_id(a.path), cgroup_id(b.path)}
    for h in (ha, hb):
        _well_formed(h)
    # a few hundred preemptions each in 1.5 s (measured ~300 and ~150)
    assert ha.count >= 50 and hb.count >= 25, (ha, hb)
    # no task waits longer than it exists: the groups hold 2 and 1 hogs
    assert ha.sum <= 2 * window and hb.sum <= window, (ha.sum, hb.sum, window)
    # one CPU for three hogs: two of them wait at any time (2 x window in theory)
    assert ha.sum + hb.sum >= window, (ha.sum, hb.sum, window)
    assert ha.sum > 1.3 * hb.sum, (ha.sum, hb.sum)
    # a hog waits out another hog's slice: milliseconds. (Short waits are there too: a
    # kernel thread or another of the host's tasks preempts a hog for a few microseconds.)
    for h, n in ((ha, 20), (hb, 10)):
        within_1ms = next(count for le, count in h.buckets if le >= 0.001)
        assert h.count - within_1ms >= n, h


def test_only_watched_groups_count_by_exact_id(groups):
    """An unwatched sibling and an unwatched child of a watched group get nothing, and
    the child's waits are not added to its parent's."""
    a, c = groups.make("a"), groups.make("c")
    sub = groups.make("sub", parent=a)
    with RunqLatency() as rq:
        rq.watch(a.path)
        start = time.monotonic()
        for g in (a, c, sub):
            groups.hog(g)
        time.sleep(1.0)
        ha = rq.histogram(a.path)
        assert rq.histogram(c.path) is None
        assert rq.histogram(sub.path) is None
        assert set(rq.histograms()) == {cgroup_id(a.path)}
        window = time.monotonic() - start
    assert ha.count >= 20, ha
    # `a` holds one hog; with the child's waits it would reach ~4/3 of the window
    assert 0.3 * window <= ha.sum <= window, (ha.sum, window)


def test_unwatch_stops_counting_and_watch_again_starts_afresh(groups):
    a, b = groups.make("a"), groups.make("b")
    with RunqLatency() as rq:
        rq.watch(a.path)
        rq.watch(b.path)
        groups.hog(a)
        groups.hog(b)
        time.sleep(0.5)
        assert rq.histogram(a.path).count > 0
        assert rq.unwatch(a.path) is True
        assert rq.histogram(a.path) is None
        assert rq.unwatch(a.path) is False
        b1 = rq.histogram(b.path)
        time.sleep(0.5)
        # `b` keeps counting while `a`, still contending, gets no entry back
        assert rq.histogram(a.path) is None
        b2 = rq.histogram(b.path)
        assert b2.count > b1.count
        assert rq.watched() == {cgroup_id(b.path)}
        # watching a watched group keeps its counts
        rq.watch(b.path)
        assert rq.histogram(b.path).count >= b2.count
        # watching `a` again counts only waits that began after it
        again = time.monotonic()
        rq.watch(a.path)
        time.sleep(0.3)
        ha = rq.histogram(a.path)
        since = time.monotonic() - again
        assert 0 < ha.count and ha.sum <= since, (ha, since)


def _bpf_fds() -> dict[int, dict[str, str]]:
    """fdinfo of this process's BPF program and link fds, by fd."""
    out = {}
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                lines = f.read().splitlines()
        except OSError:  # the listing's own fd, closed meanwhile
            continue
        info = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        if "prog_id" in info:
            out[int(fd)] = info
    return out


def test_close_detaches_every_program():
    rq = RunqLatency()
    ours = {_bpf_fds()[p.fd]["prog_id"] for p in rq.obj.programs()}
    links = [info for info in _bpf_fds().values() if "link_id" in info and info["prog_id"] in ours]
    assert sorted(info["tp_name"] for info in links) == [
        "sched_switch",
        "sched_wakeup",
        "sched_wakeup_new",
    ]
    link_ids = [info["link_id"] for info in links]
    rq.close()
    rq.close()  # a second close is harmless
    left = [
        info
        for info in _bpf_fds().values()
        if info["prog_id"] in ours or info.get("link_id") in link_ids
    ]
    assert left == []
    # and the kernel has freed them, not only this process's fds (bpftool is a build
    # tool). The last references go asynchronously (RCU), so within a grace period or so.
    bpftool = shutil.which("bpftool")
    if bpftool is not None:
        for kind, ids in (("link", link_ids), ("prog", sorted(ours))):
            for i in ids:
                deadline = time.monotonic() + 5
                while True:
                    ran = subprocess.run([bpftool, kind, "show", "id", i], capture_output=True)
                    if ran.returncode != 0 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                assert ran.returncode != 0, (kind, i, ran.stdout)


def test_watching_is_bounded_and_refused_clearly():
    with RunqLatency() as rq:
        # ids of no real group: the map does not care, and they cost nothing to undo
        for cgid in range(1 << 40, (1 << 40) + MAX_GROUPS):
            rq.watch(cgid)
        with pytest.raises(BpfError) as exc:
            rq.watch((1 << 40) + MAX_GROUPS)
        assert exc.value.errno == errno.E2BIG
        assert f"{MAX_GROUPS} groups are watched already" in str(exc.value)
        # re-watching one of them is no new entry
        rq.watch(1 << 40)
        rq.unwatch(1 << 40)
        rq.watch((1 << 40) + MAX_GROUPS)


def test_a_cgroup_v1_directory_is_refused():
    v1 = [d for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory") if os.path.isdir(d)]
    assert v1, "this host is hybrid: v1 hierarchies beside /sys/fs/cgroup/unified"
    with RunqLatency() as rq, pytest.raises(ValueError, match="not a cgroup v2 directory"):
        rq.watch(v1[0])


def test_without_privilege_the_error_says_what_is_needed():
    """As `nobody` (a forked child: no exec, so nothing else about it changes)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                RunqLatency()
                text = "loaded"
            except OSError as exc:
                text = f"{type(exc).__name__} {exc.errno} {exc}"
            os.write(w, text.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    assert text.startswith(f"BpfError {errno.EPERM} run-queue latency needs root"), text
    assert "CAP_BPF" in text
