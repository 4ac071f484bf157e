"""The workload shim (xhagent-shim) on this host's cgroup2 tree: the workload runs in the task's
leaf and the shim beside it; its output, its end and a failed start land in the task directory
as whole records, and the shim outlives whoever started it."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from xhagent.cgroups.mounts import discover_hierarchy
from xhagent.daemon.api.output_files import MARK
from xhagent.daemon.exec import shim as shim_mod
from xhagent.daemon.exec.shim import ShimError, process_alive, read_status, start_shim
from xhagent.daemon.exec.shim_server import ServedShim, ShimServer

pytestmark = pytest.mark.host
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
LONG = ["sleep", "30"]


@pytest.fixture(params=["one-shot", "served"])
def run(request, leaves, tmp_path):
    """start(argv, **kw) -> ShimStarted in a fresh task directory; every shim reaped at the end.
    Each test runs with a shim of its own (`one-shot`) and with one the shim server forks
    (`served`): the two are the same supervisor."""
    task, shim_leaf = leaves
    started = []
    server = ShimServer(shim_leaf, shim_mod.shim_path()) if request.param == "served" else None

    def start(argv, **kw):
        task_dir = tmp_path / f"task{len(started)}"
        task_dir.mkdir()
        kw.setdefault("env", ENV)
        s = start_shim(task_dir, task, shim_leaf, argv, server=server, **kw)
        assert isinstance(s.process, ServedShim) == (server is not None)
        started.append(s)
        return s, task_dir

    start.served = server is not None
    yield start
    for s in started:
        s.process.kill()
        s.process.wait()
    if server is not None:
        server.close()


def wait_exit(task_dir, timeout=10.0):
    deadline = time.monotonic() + timeout
    while (status := read_status(task_dir)).exit is None:
        assert time.monotonic() < deadline, f"no exit record in {task_dir} after {timeout}s"
        time.sleep(0.01)
    return status.exit


def own_line(text):
    return [line for line in text.splitlines() if line.startswith("0::")]


def rel(group):
    return "0::/" + str(group.path.relative_to(discover_hierarchy().unified.path))


@pytest.mark.parametrize("method", ["clone3", "fork"])
def test_output_status_and_groups(run, leaves, method):
    task, shim_leaf = leaves
    # $PPID is the shim: the workload reports both groups
    script = "echo out; echo err >&2; cat /proc/self/cgroup /proc/$PPID/cgroup; exit 3"
    s, task_dir = run(["sh", "-c", script], method=method)
    end = wait_exit(task_dir)
    assert s.process.wait(5) == 0
    assert (end.exit_code, end.signal, end.error) == (3, None, None)
    assert (end.stdout_dropped, end.stderr_dropped) == (0, 0)
    assert s.spawn_method == method and s.shim_pid == s.process.pid and s.pid != s.shim_pid
    out = (task_dir / "stdout").read_text()
    assert out.startswith("out\n")
    assert own_line(out) == [rel(task), rel(shim_leaf)]
    assert (task_dir / "stderr").read_text() == "err\n"
    assert (task_dir / "stdout").stat().st_mode & 0o777 == 0o640
    assert abs(end.ended_ns - time.time_ns()) < 60e9 and end.ended_ns >= s.started_ns
    names = ["exit", "started", "stderr", "stderr.times", "stdout", "stdout.times"]
    assert sorted(p.name for p in task_dir.iterdir()) == names
    # each stream's time index: a mark (wall time, offset 0) before its first byte
    ((ns, at),) = MARK.iter_unpack((task_dir / "stderr.times").read_bytes())
    assert at == 0 and s.started_ns - 1e9 < ns <= end.ended_ns


def test_cgroup_kill_is_reported_as_signal_9(run, leaves):
    s, task_dir = run(LONG)
    assert process_alive(s.pid, s.start_time)
    leaves[0].kill()
    end = wait_exit(task_dir)
    assert (end.signal, end.exit_code, end.core_dumped) == (9, None, False)
    assert s.process.wait(5) == 0


@pytest.mark.parametrize(
    "argv, kw, stage, err, message",
    [
        (["/bin/nope"], {}, "exec", errno.ENOENT, "exec /bin/nope: No such file or directory"),
        (["no-such-command-xh"], {}, "exec", errno.ENOENT, "exec no-such-command-xh: No such"),
        (["true"], {"cwd": "/nonexistent"}, "cwd", errno.ENOENT, "cwd /nonexistent: No such"),
        (["./data"], {}, "exec", errno.EACCES, "exec ./data: Permission denied"),
    ],
)
def test_a_failed_start_is_an_exit_record_and_an_error(
    leaves, tmp_path, argv, kw, stage, err, message
):
    task, shim_leaf = leaves
    (tmp_path / "data").write_text("not a program\n")  # 0644: not executable even by root
    kw.setdefault("cwd", tmp_path)
    with pytest.raises(ShimError, match=message) as caught:
        start_shim(tmp_path, task, shim_leaf, argv, ENV, **kw)
    assert caught.value.errno == err
    status = read_status(tmp_path)
    assert status.started is None
    assert (status.exit.error, status.exit.errno) == (stage, err)
    assert status.exit.message.startswith(message)
    assert task.events()["populated"] == 0 and shim_leaf.events()["populated"] == 0


def test_a_child_killed_before_its_exec_is_a_failed_start_not_a_run(run, leaves):
    # This kernel (6.18) SIGKILLs every clone3(CLONE_INTO_CGROUP) child of a group that was
    # once cgroup.kill'd, before it runs an instruction: the report pipe closes as on an exec.
    leaves[0].write("cgroup.kill", "1")
    with pytest.raises(ShimError, match="true was killed by signal 9 before its exec .*fresh leaf"):
        run(["true"], method="clone3")


def test_the_fork_way_runs_in_a_leaf_once_killed(run, leaves):
    leaves[0].write("cgroup.kill", "1")
    s, task_dir = run(["true"], method="fork")
    assert wait_exit(task_dir).exit_code == 0


def test_the_shim_outlives_its_starter(leaves, tmp_path):
    task, shim_leaf = leaves
    helper = f"""
import json, sys, time
from xhagent.cgroups import Cgroup
from xhagent.daemon.exec.shim import start_shim
s = start_shim({str(tmp_path)!r}, Cgroup({str(task.path)!r}), Cgroup({str(shim_leaf.path)!r}),
               ["sh", "-c", "sleep 2; exit 7"], {ENV!r})
print(json.dumps([s.shim_pid, s.shim_start_time]), flush=True)
time.sleep(60)
"""
    starter = subprocess.Popen([sys.executable, "-c", helper], stdout=subprocess.PIPE)
    try:
        shim_pid, shim_start = json.loads(starter.stdout.readline())
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
    assert read_status(tmp_path).exit is None  # the workload still sleeps
    assert process_alive(shim_pid, shim_start)
    end = wait_exit(tmp_path)
    assert (end.exit_code, end.error) == (7, None)
    deadline = time.monotonic() + 5  # then it ends, reaped by whoever adopted it
    while process_alive(shim_pid, shim_start):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_output_beyond_the_cap_is_counted_and_never_blocks_the_workload(run):
    s, task_dir = run(["head", "-c", str(1 << 20), "/dev/zero"], log_cap=64 << 10)
    end = wait_exit(task_dir)
    assert end.exit_code == 0
    assert (task_dir / "stdout").stat().st_size == 64 << 10
    assert end.stdout_dropped == (1 << 20) - (64 << 10)
    assert end.stderr_dropped == 0


def test_a_stream_gets_its_file_at_its_first_byte(run):
    s, task_dir = run(["sh", "-c", "echo err >&2"])
    end = wait_exit(task_dir)
    assert end.exit_code == 0 and end.output_errno == 0
    assert sorted(p.name for p in task_dir.iterdir()) == [
        "exit",
        "started",
        "stderr",
        "stderr.times",
    ]
    assert (task_dir / "stderr").read_text() == "err\n"


def test_a_file_there_before_the_start_is_appended_to_within_the_cap(leaves, tmp_path):
    task, shim_leaf = leaves
    task_dir = tmp_path / "t"
    task_dir.mkdir()
    (task_dir / "stdout").write_bytes(b"x" * 10)
    start_shim(task_dir, task, shim_leaf, ["echo", "0123456789"], ENV, log_cap=16).process.wait(5)
    end = wait_exit(task_dir)
    assert (task_dir / "stdout").read_bytes() == b"x" * 10 + b"012345"
    assert end.stdout_dropped == 5


@pytest.mark.parametrize("link", ["-s", "-P"])  # a symbolic link, a hard link
def test_a_name_planted_before_the_first_byte_is_never_written_through(run, tmp_path, link):
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched\n")
    script = 'ln "$0" "$1" "$2/stdout" && echo written'  # (task0: the directory run makes)
    s, task_dir = run(["sh", "-c", script, link, str(victim), str(tmp_path / "task0")])
    end = wait_exit(task_dir)
    assert end.exit_code == 0, (task_dir / "stderr").read_text()
    assert victim.read_bytes() == b"untouched\n"
    assert end.output_errno == errno.EEXIST and end.stdout_dropped == len("written\n")


def test_the_workload_gets_the_oom_score_adj_asked_for_and_the_shim_keeps_its_own(
    raised_oom_score_adj, run
):
    script = "cat /proc/self/oom_score_adj /proc/$PPID/oom_score_adj"  # its own, its shim's
    s, task_dir = run(["sh", "-c", script], oom_score_adj=0, uid=65534, gid=65534)
    assert wait_exit(task_dir).exit_code == 0
    assert (task_dir / "stdout").read_text() == f"0\n{raised_oom_score_adj}\n"
    s, task_dir = run(["cat", "/proc/self/oom_score_adj"])  # none asked: the shim's
    assert wait_exit(task_dir).exit_code == 0
    assert (task_dir / "stdout").read_text() == f"{raised_oom_score_adj}\n"
    if not int(_status_field("self", "CapEff"), 16) >> 24 & 1:  # no CAP_SYS_RESOURCE: < 0 refused
        with pytest.raises(ShimError, match=r"oom_score_adj -5: Permission denied"):
            run(["true"], oom_score_adj=-5)


def test_a_grandchild_holding_stdout_does_not_hold_the_exit_record(run, leaves):
    t0 = time.monotonic()
    s, task_dir = run(["sh", "-c", "echo before; sleep 30 & exit 0"])
    end = wait_exit(task_dir)
    took = time.monotonic() - t0
    assert end.exit_code == 0 and took < 5, f"exit record after {took:.1f}s"
    assert (task_dir / "stdout").read_text() == "before\n"
    assert s.process.wait(5) == 0
    assert leaves[0].events()["populated"] == 1  # the sleep is still there (the fixture kills it)


def test_sigterm_to_the_shim_reaches_the_workload(run):
    s, task_dir = run(LONG)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        os.kill(s.shim_pid, sig)  # ignored: neither the shim nor the workload ends
    time.sleep(0.2)
    assert read_status(task_dir).exit is None and s.process.poll() is None
    s.process.terminate()
    end = wait_exit(task_dir)
    assert end.signal == signal.SIGTERM
    assert s.process.wait(5) == 0


def _status_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":"))


def _raw_sigaction(sig: int, handler: int) -> int:
    """Set a disposition with the kernel's own call (glibc refuses its reserved 32 and 33,
    which a library may still have set); returns the old handler."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    new, old = (ctypes.c_uint64 * 4)(handler, 0, 0, 0), (ctypes.c_uint64 * 4)()
    assert libc.syscall(13, sig, new, old, 8) == 0, ctypes.get_errno()  # SYS_rt_sigaction
    return old[0]


def test_the_shim_is_small_and_the_workload_gets_a_clean_signal_state(run):
    # Signals ignored in the agent's world (nohup, a library's choice, glibc's reserved 32)
    # reach the shim through the cgroup library's spawn, and stop there.
    old = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    old32 = _raw_sigaction(32, 1)  # SIG_IGN
    try:
        s, task_dir = run(LONG)
    finally:
        signal.signal(signal.SIGUSR1, old)
        _raw_sigaction(32, old32)
    shim_ignores = int(_status_field(s.shim_pid, "SigIgn"), 16)
    if not run.served:  # (a served shim has the server's signal state, which began clean)
        assert shim_ignores & (1 << (signal.SIGUSR1 - 1)) and shim_ignores & (1 << 31)
    rss_kib = int(_status_field(s.shim_pid, "VmRSS").split()[0])
    print(f"\nxhagent-shim VmRSS while supervising: {rss_kib} kB")
    assert rss_kib < 1024
    # the shim blocks SIGTERM/SIGHUP/SIGINT and ignores SIGPIPE; none of that is inherited
    for name in ("SigBlk", "SigIgn"):
        assert int(_status_field(s.pid, name), 16) == 0, name


def test_uid_and_gid(run):
    s, task_dir = run(["sh", "-c", "id -u; id -g; id -G"], uid=65534, gid=65534)
    assert wait_exit(task_dir).exit_code == 0
    assert (task_dir / "stdout").read_text() == "65534\n65534\n65534\n"


def _start_time(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def test_process_alive_guards_against_dead_and_reused_pids():
    child = subprocess.Popen(LONG)
    try:
        start = _start_time(child.pid)
        assert process_alive(child.pid, start)
        assert not process_alive(child.pid, start + 1)  # same pid, another process
        child.kill()
        time.sleep(0.1)
        assert not process_alive(child.pid, start)  # a zombie has ended
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid, start)


def test_read_status_tolerates_missing_and_unwritten_records_and_refuses_malformed_ones(tmp_path):
    assert read_status(tmp_path) == shim_mod.ShimStatus(None, None)
    (tmp_path / "exit").write_text('{"exit_code": 0, "surprise": 1}\n')
    with pytest.raises(ValueError, match="malformed shim record"):
        read_status(tmp_path)
    (tmp_path / "exit").write_text('{"exit_code": 0, "ended_')
    with pytest.raises(ValueError, match=f"{tmp_path}/exit: malformed"):
        read_status(tmp_path)
    # what a power loss can leave of the unflushed `started`: its reservation's filler alone
    (tmp_path / "exit").unlink()
    for filler in (b" " * 8192, b" " * 133, b"\0" * 133, b""):
        (tmp_path / "started").write_bytes(filler)
        assert read_status(tmp_path) == shim_mod.ShimStatus(None, None), filler[:4]
    (tmp_path / "started").write_bytes(b'{"shim_pid": 1' + b" " * 100)  # but a torn one is not
    with pytest.raises(ValueError, match="started: malformed"):
        read_status(tmp_path)


def test_a_task_directory_serves_once(run, leaves, tmp_path):
    s, task_dir = run(["true"])
    wait_exit(task_dir)
    with pytest.raises(ShimError, match="exists: a task directory serves once"):
        start_shim(task_dir, *leaves, ["true"], ENV)


def test_a_missing_binary_names_its_path_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(shim_mod, "SHIM", tmp_path / "xhagent-shim")
    with pytest.raises(FileNotFoundError, match="xhagent-shim: .*rebuild with make setup"):
        shim_mod.shim_path()


def test_a_shim_that_cannot_exec_is_a_start_error_naming_it(monkeypatch, leaves, tmp_path):
    broken = tmp_path / "xhagent-shim"
    broken.write_bytes(b"\x7fELF not really\n")  # executable, but no program: ENOEXEC
    broken.chmod(0o755)
    monkeypatch.setattr(shim_mod, "SHIM", broken)
    task_dir = tmp_path / "t"
    task_dir.mkdir()
    with pytest.raises(OSError) as info:  # spawned sharing the agent's memory: told at once
        shim_mod.launch_shim(task_dir, *leaves, ["true"], ENV)
    assert info.value.errno == errno.ENOEXEC and str(broken) in str(info.value)
    assert leaves[1].procs() == [] and leaves[0].procs() == []


def test_the_shim_makes_its_directory_and_its_parent_and_names_one_it_cannot_make(leaves, tmp_path):
    task_dir = tmp_path / "task" / "0"
    s = start_shim(task_dir, *leaves, ["true"], ENV)
    assert wait_exit(task_dir).exit_code == 0 and task_dir.is_dir()
    s.process.wait(timeout=10)
    assert oct(task_dir.stat().st_mode & 0o777) == oct(0o750 & ~_umask())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ShimError) as info:  # no record can go there: told on the pipe
        start_shim(blocker / "0", *leaves, ["true"], ENV)
    assert info.value.errno == errno.ENOTDIR
    assert str(info.value) == f"mkdir {blocker / '0'}: Not a directory"


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
