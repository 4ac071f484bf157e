"""Cgroup.spawn on this host's cgroup2 tree: the child is in the group from its first
instruction, by clone3(CLONE_INTO_CGROUP) (with a copy of the caller's memory, and sharing it
until the exec: `shared`) and by the forced fork-then-join fallback; errors come back with the
errno and the path, reaped, with nothing left in the group."""

import errno
import mmap
import os
import signal
import threading
import time

import pytest

from xhagent.cgroups import Cgroup, CgroupError, SpawnError, spawn_method
from xhagent.cgroups import spawn as spawn_mod
from xhagent.cgroups.mounts import discover_hierarchy
from xhagent.signals import signals_held

pytestmark = pytest.mark.host
# "shared": clone3 with share_vm; not for a frozen group, where such a call waits for the thaw
FROZEN_METHODS = ["clone3", "fork"]
METHODS = [*FROZEN_METHODS, "shared"]


@pytest.fixture(autouse=True)
def shared_vm(request, monkeypatch):
    """Under the `shared` method, every spawn is clone3 with share_vm."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("method") != "shared":
        return
    real = Cgroup.spawn

    def spawn(self, argv, method=None, **kw):
        assert method == "shared"
        return real(self, argv, method="clone3", share_vm=True, **kw)

    monkeypatch.setattr(Cgroup, "spawn", spawn)


def within(seconds, fn, *args, **kw):
    """fn(*args, **kw) in a thread: a call that hangs fails the test instead of the suite
    (the fixture's thaw then lets it finish)."""
    result = {}

    def call():
        try:
            result["value"] = fn(*args, **kw)
        except BaseException as exc:  # handed to the test's thread
            result["error"] = exc

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), (
        f"{getattr(fn, '__name__', fn)} still running after {seconds}s: it hangs"
    )
    if "error" in result:
        raise result["error"]
    return result["value"]


def _run(group, argv, method, **kw):
    """Spawn with stdout on a pipe; (returncode, output, the Spawned)."""
    r, w = os.pipe()
    try:
        child = group.spawn(argv, stdout=w, method=method, **kw)
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as out:
        text = out.read().decode()
    return child.wait(timeout=10), text, child


def _status(name):
    with open("/proc/self/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":"))


def _own_line(text):
    return [line for line in text.splitlines() if line.startswith("0::")]


def _rel(group):
    return "0::/" + str(group.path.relative_to(discover_hierarchy().unified.path))


def test_this_kernel_takes_clone3_into_cgroup():
    # 6.18 here, 6.1 in the guest: both have CLONE_INTO_CGROUP (5.7+)
    assert spawn_method() == "clone3"
    assert spawn_mod.spawn_method_reason() is None


@pytest.mark.parametrize("method", METHODS)
def test_the_child_reads_its_own_group_at_its_first_instruction(group, method):
    code, text, child = _run(group, ["cat", "/proc/self/cgroup"], method)
    assert code == 0 and child.method == {"shared": "clone3"}.get(method, method)
    assert child.started and _own_line(text) == [_rel(group)]
    assert child.pidfd is None  # reaped: the pidfd is closed with it
    assert group.events()["populated"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_pidfd_signals_the_child_and_wait_reports_the_signal(group, method):
    child = group.spawn(["sleep", "60"], method=method)
    try:
        assert child.pidfd is not None and child.started
        assert group.procs() == [child.pid]
        assert child.poll() is None
        with pytest.raises(Exception) as info:
            child.wait(timeout=0.1)
        assert type(info.value).__name__ == "TimeoutExpired"
        child.terminate()
        assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        child.kill()
    assert group.events()["populated"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_environment_is_exactly_the_one_given_and_path_is_searched_in_it(group, method):
    code, text, _ = _run(group, ["env"], method, env={"A": "1", "PATH": "/usr/bin:/bin"})
    assert code == 0 and sorted(text.splitlines()) == ["A=1", "PATH=/usr/bin:/bin"]
    with pytest.raises(SpawnError) as info:
        group.spawn(["env"], env={"PATH": "/nonexistent"}, method=method)
    assert info.value.errno == errno.ENOENT and "env" in str(info.value)


@pytest.mark.parametrize("method", METHODS)
def test_cwd_session_and_fds(group, method, tmp_path):
    keep_r, keep_w = os.pipe()
    leak_r, leak_w = os.pipe()
    try:
        script = "pwd; ls /proc/self/fd; echo sid=$(cut -d' ' -f6 /proc/self/stat) pid=$$"
        code, text, _ = _run(
            group,
            ["sh", "-c", script],
            method,
            cwd=tmp_path,
            pass_fds=[keep_w],
            start_new_session=True,
            stdin=leak_r,
        )
    finally:
        for fd in (keep_r, keep_w, leak_r, leak_w):
            os.close(fd)
    lines = text.splitlines()
    assert code == 0 and lines[0] == str(tmp_path)
    fds = {int(x) for x in lines[1:-1]}
    assert (
        keep_w in fds and leak_w not in fds and {0, 1, 2} <= fds
    )  # one more: ls's own directory fd
    sid, pid = (x.split("=")[1] for x in lines[-1].split())
    assert sid == pid  # a session leader


@pytest.mark.parametrize("method", METHODS)
def test_signal_dispositions_and_mask(group, method):
    # This process blocks SIGUSR1 and ignores SIGPIPE (Python does); SIGHUP ignored stays ignored.
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        code, text, _ = _run(
            group,
            ["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"],
            method,
            sigmask={signal.SIGUSR1},
        )
    finally:
        signal.signal(signal.SIGHUP, old_hup)
    fields = dict(line.split(":\t") for line in text.splitlines())
    blk, ign = int(fields["SigBlk"], 16), int(fields["SigIgn"], 16)
    assert code == 0
    assert blk == 1 << (signal.SIGUSR1 - 1)
    assert ign & (1 << (signal.SIGHUP - 1)) and not ign & (1 << (signal.SIGPIPE - 1))
    with signals_held():  # what the caller blocks for its own section is not the child's mask
        code, text, _ = _run(group, ["grep", "-E", "^SigBlk", "/proc/self/status"], method)
    assert code == 0 and int(text.split(":\t")[1], 16) == 0


@pytest.mark.parametrize("method", METHODS)
def test_a_missing_executable_is_an_error_naming_it_reaped_and_gone_from_the_group(
    group, method, tmp_path
):
    before = set(os.listdir("/proc"))
    with pytest.raises(SpawnError) as info:
        group.spawn(["/nonexistent/xh-no-such-program", "arg"], method=method)
    err = info.value
    assert err.errno == errno.ENOENT and isinstance(err, CgroupError)
    assert str(err) == "/nonexistent/xh-no-such-program: No such file or directory"
    assert "[Errno" not in str(err)
    assert group.events()["populated"] == 0 and group.procs() == []
    zombies = [p for p in set(os.listdir("/proc")) - before if p.isdigit() and _state(p) == "Z"]
    assert zombies == []
    plain = tmp_path / "not-a-program"
    plain.write_text("data\n")
    plain.chmod(0o644)
    with pytest.raises(SpawnError) as info:  # no x bit: EACCES, even for root
        group.spawn([str(plain)], method=method)
    assert info.value.errno == errno.EACCES and str(info.value) == f"{plain}: Permission denied"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "prog").symlink_to(plain)
    with pytest.raises(
        SpawnError
    ) as info:  # a PATH entry that lacks it is skipped; EACCES is the one told
        group.spawn(["prog"], env={"PATH": f"/nonexistent:{bindir}:/usr/bin"}, method=method)
    assert info.value.errno == errno.EACCES and str(info.value) == "prog: Permission denied"
    assert group.events()["populated"] == 0


def _state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.parametrize("method", METHODS)
def test_a_bad_cwd_names_it(group, method):
    with pytest.raises(SpawnError) as info:
        group.spawn(["true"], cwd="/nonexistent-dir", method=method)
    assert info.value.errno == errno.ENOENT
    assert str(info.value) == "true: cwd /nonexistent-dir: No such file or directory"
    assert group.events()["populated"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_a_removed_group_is_a_clear_error(group, method):
    gone = Cgroup(group.path / "gone").create()
    gone.remove()
    with pytest.raises(CgroupError) as info:
        gone.spawn(["true"], method=method)
    assert info.value.errno == errno.ENOENT and str(gone.path) in str(info.value)
    assert "no such group" in str(info.value)


@pytest.mark.parametrize("method", METHODS)
def test_a_group_removed_after_it_was_opened_is_a_clear_error(group, method, monkeypatch):
    # The group goes away between spawn() opening it and the clone: the kernel's own answer
    # (clone3: ENOENT; the child's cgroup.procs write: ENODEV) comes back with the path.
    victim = Cgroup(group.path / "victim").create()
    real_pipe2 = os.pipe2

    def pipe2_after_rmdir(flags):
        victim.remove()
        return real_pipe2(flags)

    monkeypatch.setattr(spawn_mod.os, "pipe2", pipe2_after_rmdir)
    with pytest.raises(CgroupError) as info:
        victim.spawn(["true"], method=method)
    monkeypatch.undo()
    assert info.value.errno in (errno.ENOENT, errno.ENODEV)
    assert str(victim.path) in str(info.value) and "the group was removed" in str(info.value)
    assert group.events()["populated"] == 0


@pytest.mark.parametrize("method", FROZEN_METHODS)
def test_spawn_into_a_frozen_group_returns_at_once_with_the_child_frozen_before_its_exec(
    group, method
):
    group.freeze()
    try:
        r, w = os.pipe()
        t0 = time.monotonic()
        child = within(10, group.spawn, ["cat", "/proc/self/cgroup"], stdout=w, method=method)
        os.close(w)
        assert time.monotonic() - t0 < 5
        assert not child.started and child.poll() is None
        assert group.procs() == [child.pid] and group.events()["frozen"] == 1
        time.sleep(0.2)
        assert not child.started  # still frozen before its exec
        group.thaw()
        assert child.wait(timeout=5) == 0
        assert child.started
        with os.fdopen(r, "rb") as out:
            assert _own_line(out.read().decode()) == [_rel(group)]
    finally:
        group.write("cgroup.freeze", "0")


@pytest.mark.parametrize("method", FROZEN_METHODS)
def test_an_exec_that_fails_after_a_thaw_is_raised_by_wait(group, method):
    group.freeze()
    try:
        child = within(10, group.spawn, ["xh-no-such-program"], method=method)
        assert not child.started
        group.thaw()
        with pytest.raises(SpawnError) as info:
            child.wait(timeout=5)
        assert info.value.errno == errno.ENOENT and "xh-no-such-program" in str(info.value)
        assert child.returncode == 127
    finally:
        group.write("cgroup.freeze", "0")
    assert group.events()["populated"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_the_child_gets_the_oom_score_adj_asked_for_and_else_the_callers(
    raised_oom_score_adj, group, method
):
    code, text, _ = _run(group, ["cat", "/proc/self/oom_score_adj"], method, oom_score_adj=0)
    assert (code, text) == (0, "0\n")
    code, text, _ = _run(group, ["cat", "/proc/self/oom_score_adj"], method, oom_score_adj=-0)
    assert (code, text) == (0, "0\n")
    code, text, _ = _run(group, ["cat", "/proc/self/oom_score_adj"], method, oom_score_adj=1000)
    assert (code, text) == (0, "1000\n")
    code, text, _ = _run(group, ["cat", "/proc/self/oom_score_adj"], method)
    assert (code, text) == (0, f"{raised_oom_score_adj}\n")


def test_an_oom_score_adj_the_kernel_refuses_is_an_error_and_no_child(group):
    lowering = bool(int(_status("CapEff"), 16) >> 24 & 1)  # CAP_SYS_RESOURCE: below 0 allowed
    if lowering:
        code, text, _ = _run(group, ["cat", "/proc/self/oom_score_adj"], "clone3", oom_score_adj=-5)
        assert (code, text) == (0, "-5\n")
        return
    with pytest.raises(SpawnError) as failed:
        group.spawn(["true"], oom_score_adj=-5)
    assert failed.value.errno == errno.EACCES and "true: oom_score_adj:" in str(failed.value)
    assert group.events()["populated"] == 0


def test_bad_arguments_are_refused_before_any_child(group):
    for argv, kw in (
        ([], {}),
        ([""], {}),
        (["a\0b"], {}),
        (["true"], {"env": {"A=B": "1"}}),
        (["true"], {"method": "vfork"}),
        (["true"], {"oom_score_adj": 1001}),
        (["true"], {"oom_score_adj": -1001}),
    ):
        with pytest.raises(ValueError):
            group.spawn(argv, **kw)
    assert group.events()["populated"] == 0


def test_a_stop_while_waiting_for_the_exec_leaves_no_child(group, monkeypatch):
    # e.g. Terminated raised by a handler during the wait: the child is killed and reaped
    def stopped(child, _group):
        raise KeyboardInterrupt

    monkeypatch.setattr(spawn_mod, "_await_exec", stopped)
    before = set(os.listdir("/proc"))
    with pytest.raises(KeyboardInterrupt):
        group.spawn(["sleep", "60"])
    assert group.procs() == [] and group.events()["populated"] == 0
    assert [p for p in set(os.listdir("/proc")) - before if p.isdigit() and _state(p)] == []


def _minor_faults() -> int:
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])


def test_a_shared_vm_spawn_copies_none_of_the_callers_memory(group):
    pages = 16384  # 64 MiB of small pages, resident
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # (a shared mapping is never copied)
    ballast = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=private)
    ballast.madvise(mmap.MADV_NOHUGEPAGE)

    def faults_writing_after(**how) -> int:
        for i in range(pages):
            ballast[i * mmap.PAGESIZE] = 1
        assert group.spawn(["true"], **how).wait(timeout=10) == 0
        before = _minor_faults()
        for i in range(pages):
            ballast[i * mmap.PAGESIZE] = 2
        return _minor_faults() - before

    # a copy write-protects every page until the child's exec: each write after faults once
    assert faults_writing_after(method="clone3") >= pages
    assert faults_writing_after(method="clone3", share_vm=True) < pages // 10
    ballast.close()
