"""The shim server (`xhagent-shim --serve`) on this host's cgroup2 tree: requests sent
before any reply is read each get their own supervisor (whose command line, as ps shows
it, is a one-shot shim's), a server that ended is replaced,
what it cannot take goes to a one-shot shim, a malformed request starts nothing, and the
supervisors outlive the server; and the same server as its unit runs it
(`--serve-at`), which agents connect to. (That a served supervisor is a one-shot shim in every
other way, test_shim_host.py's tests show: each runs both ways.)"""

import errno
import os
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_shim_host import wait_exit

from xhagent.cgroups import Cgroup, Spawned
from xhagent.daemon.exec import shim as shim_mod
from xhagent.daemon.exec.shim import launch_shim, start_shim
from xhagent.daemon.exec.shim_server import REPLY, REQUEST_MAX, ServedShim, ShimServer, encode

pytestmark = pytest.mark.host
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


@pytest.fixture
def groups(group):
    """(a fresh leaf per task, the shims' leaf) under the scratch group, removed afterwards."""
    shims = Cgroup(group.path / "shims").create()
    made = []

    def leaf():
        made.append(Cgroup(group.path / f"task{len(made)}").create())
        return made[-1]

    yield leaf, shims
    for g in [*made, shims]:
        g.remove(kill_first=True)


@pytest.fixture
def server(groups):
    srv = ShimServer(groups[1], shim_mod.shim_path())
    yield srv
    srv.close()


def test_requests_sent_together_each_get_their_own_supervisor(groups, server, tmp_path):
    leaf, shims = groups
    launched = [
        launch_shim(
            tmp_path / f"t{i}",
            leaf(),
            shims,
            ["sh", "-c", f"echo {i}; exit {i}"],
            ENV,
            server=server,
        )  # fmt: skip
        for i in range(20)
    ]  # all sent before any reply is read
    started = [launch.wait() for launch in launched]
    assert server.started == 1 and server.unserved == 0
    assert len({s.shim_pid for s in started}) == 20
    for i, s in enumerate(started):
        assert isinstance(s.process, ServedShim) and s.process.pid == s.shim_pid
        assert wait_exit(tmp_path / f"t{i}").exit_code == i
        assert (tmp_path / f"t{i}" / "stdout").read_text() == f"{i}\n"
        assert s.process.wait(5) == 0 and s.process.pidfd is None  # ended: its pidfd let go


def test_a_server_that_ended_is_replaced_and_its_supervisors_go_on(groups, server, tmp_path):
    leaf, shims = groups
    first = start_shim(tmp_path / "a", leaf(), shims, ["sleep", "0.5"], ENV, server=server)
    with open(f"/proc/{first.shim_pid}/cmdline", "rb") as f:  # what ps shows: its own
        words = f.read().rstrip(b"\0").split(b"\0")
    assert words[1:3] == [b"--dir", os.fsencode(tmp_path / "a")] and words[-2:] == [
        b"sleep",
        b"0.5",
    ]
    old = server._process
    old.kill()
    old.wait()
    second = start_shim(tmp_path / "b", leaf(), shims, ["true"], ENV, server=server)
    assert server.started == 2
    assert isinstance(second.process, ServedShim)
    assert wait_exit(tmp_path / "b").exit_code == 0
    # the supervisor of the first outlived its server and recorded its workload's end
    assert first.process.poll() is None
    assert wait_exit(tmp_path / "a").exit_code == 0


def test_a_server_killed_with_a_reply_unread_still_gives_each_start_its_own(
    groups, server, tmp_path
):
    leaf, shims = groups
    first = launch_shim(tmp_path / "a", leaf(), shims, ["sleep", "0.3"], ENV, server=server)
    assert select.select([server._sock], [], [], 5)[0]  # its reply is in, not read
    server._process.kill()
    server._process.wait()
    second = launch_shim(tmp_path / "b", leaf(), shims, ["true"], ENV, server=server)
    a, b = first.wait(), second.wait()  # (the first's reply came from the server now gone)
    assert server.started == 2
    assert (a.process.pid, b.process.pid) == (a.shim_pid, b.shim_pid) and a.shim_pid != b.shim_pid
    assert wait_exit(tmp_path / "a").exit_code == 0 and wait_exit(tmp_path / "b").exit_code == 0


def test_a_request_over_its_limit_goes_to_a_one_shot_shim(groups, server, tmp_path):
    leaf, shims = groups
    env = ENV | {"BIG": "x" * REQUEST_MAX}
    s = start_shim(
        tmp_path / "big", leaf(), shims, ["sh", "-c", "echo ${#BIG}"], env, server=server
    )
    assert isinstance(s.process, Spawned) and server.unserved == 1
    assert wait_exit(tmp_path / "big").exit_code == 0
    assert (tmp_path / "big" / "stdout").read_text() == f"{REQUEST_MAX}\n"
    s.process.wait(5)


def test_a_malformed_request_starts_nothing_and_the_agent_closing_ends_the_server(groups):
    _, shims = groups
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with open(os.devnull, "w") as null:
        proc = shims.spawn(
            [str(shim_mod.shim_path()), "--serve"], env={}, stdin=theirs.fileno(),
            stdout=null.fileno(), stderr=null.fileno(), start_new_session=True,
        )  # fmt: skip
    theirs.close()
    r, w = os.pipe2(os.O_CLOEXEC)
    bad = [
        struct.pack("=I", 3) + b"only\0two\0",  # fewer strings than it says
        b"\1\0\0\0no-final-nul",
        encode(["--dir"], {})[:-1],
    ]
    for message in bad:
        ours.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", w))])
        pid, err = REPLY.unpack(ours.recv(REPLY.size))
        assert (pid, err) == (-1, errno.EBADMSG)
    ours.send(encode(["--dir", "/nonexistent"], {}))  # no pipe with it: refused too
    assert REPLY.unpack(ours.recv(REPLY.size)) == (-1, errno.EBADMSG)
    assert shims.procs() == [proc.pid]  # nothing was forked
    os.close(w)
    assert os.read(r, 1) == b""  # the server kept no copy of the pipes, and nobody else has one
    os.close(r)
    ours.close()
    assert proc.wait(5) == 0  # the server ends with the agent's end of the socket


def test_a_server_that_cannot_start_leaves_each_start_to_a_one_shot_shim(groups, tmp_path):
    leaf, shims = groups
    srv = ShimServer(shims, "/nonexistent/xhagent-shim")
    s = start_shim(tmp_path / "t", leaf(), shims, ["true"], ENV, server=srv)
    assert isinstance(s.process, Spawned) and srv.unserved == 1 and srv.started == 0
    assert wait_exit(tmp_path / "t").exit_code == 0
    s.process.wait(5)


@pytest.fixture
def served_at():
    """`xhagent-shim --serve-at SOCKET` as its unit runs it: no agent's child, listening (in
    a directory of /tmp, which another user could reach were it opened)."""
    run = Path(tempfile.mkdtemp(prefix="xhagent-serve-at-"))
    sock = run / "shims.sock"
    proc = subprocess.Popen(
        [str(shim_mod.shim_path()), "--serve-at", str(sock)], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 5
    while not sock.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the server did not listen in 5 s"
        time.sleep(0.01)
    yield sock, proc
    proc.kill()
    proc.wait()
    shutil.rmtree(run)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def test_a_server_at_a_socket_serves_agent_after_agent_and_outlives_each(
    groups, served_at, tmp_path
):
    leaf, shims = groups
    sock, proc = served_at
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    reached = []
    first = ShimServer(shims, shim_mod.shim_path(), at=sock)
    first.on_reach = lambda ok, why: reached.append((ok, why))
    first.start()
    assert shims.procs() == [proc.pid]  # moved into the shims' group: its forks belong there
    a = start_shim(tmp_path / "a", leaf(), shims, ["sleep", "0.5"], ENV, server=first)
    assert isinstance(a.process, ServedShim) and _ppid(a.shim_pid) == proc.pid
    with open(f"/proc/{a.shim_pid}/cmdline", "rb") as f:  # it made room for what ps shows
        assert f.read().split(b"\0")[1:3] == [b"--dir", os.fsencode(tmp_path / "a")]
    # a second agent is served beside the first, and after it went
    second = ShimServer(shims, shim_mod.shim_path(), at=sock)
    b = start_shim(tmp_path / "b", leaf(), shims, ["sleep", "0.5"], ENV, server=second)
    first.close()
    c = start_shim(
        tmp_path / "c", leaf(), shims, ["sh", "-c", "sleep 0.5; exit 4"], ENV, server=second
    )
    assert {_ppid(b.shim_pid), _ppid(c.shim_pid)} == {proc.pid}
    assert [wait_exit(tmp_path / n).exit_code for n in "abc"] == [0, 0, 4]
    second.close()
    assert proc.poll() is None  # agents come and go; the server stays
    assert reached == [(True, f"workloads start from the shim server at {sock} (pid {proc.pid})")]
    # gone: a start is a one-shot shim's, and that is said once
    proc.kill()
    proc.wait()
    third = ShimServer(shims, shim_mod.shim_path(), at=sock)
    third.on_reach = lambda ok, why: reached.append((ok, why))
    for name in ("d", "e"):
        s = start_shim(tmp_path / name, leaf(), shims, ["true"], ENV, server=third)
        assert isinstance(s.process, Spawned)
        assert wait_exit(tmp_path / name).exit_code == 0
        s.process.wait(5)
    assert third.unserved == 2
    assert reached[1:] == [(False, f"the shim server at {sock}: Connection refused")]


def test_a_server_at_a_socket_serves_only_its_own_user(groups, served_at):
    _, shims = groups
    sock, proc = served_at
    os.chmod(sock, 0o666)  # (the unit's socket is 0600 in a root-only directory besides)
    os.chmod(sock.parent, 0o755)
    probe = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.send(b'\\1\\0\\0\\0x\\0')\n"
        "    print(repr(s.recv(64)))\n"
        "except (BrokenPipeError, ConnectionResetError) as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe, str(sock)], capture_output=True, text=True, timeout=10
    )
    assert res.returncode == 0, res.stderr
    # connected, then closed unanswered (before or after the request was sent)
    assert res.stdout.strip() in ("b''", "BrokenPipeError", "ConnectionResetError"), res.stdout
    assert proc.poll() is None and shims.procs() == []  # nothing forked


def test_a_server_at_a_path_taken_says_so_and_leaves_the_file(tmp_path):
    taken = tmp_path / "shims.sock"
    taken.write_text("not mine")
    res = subprocess.run(
        [str(shim_mod.shim_path()), "--serve-at", str(taken)],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert res.returncode == 1
    assert res.stderr == f"xhagent-shim: --serve-at {taken}: bind: Address already in use\n"
    assert taken.read_text() == "not mine"


def test_an_agent_starts_its_workloads_from_the_server_it_is_given(served_at, tmp_path):
    from test_daemon_host import Agent, task_file

    sock, proc = served_at
    agent = Agent(tmp_path, f"xhagent-serve-at-{os.getpid()}.slice", extra=("--shim-server", sock))
    agent.start()
    try:
        # the workload's parent is its supervisor, whose parent is the server, not the agent
        show = ["sh", "-c", "cut -d' ' -f4 /proc/$PPID/stat"]
        tid = agent.submit(task_file(tmp_path, "served", show))
        assert agent.wait(tid)["state"] == "Succeeded"
        assert agent.cli("logs", tid, check=True).stdout == f"{proc.pid}\n"
        assert Cgroup(agent.subtree_path / "shims").procs() == [proc.pid]
        proc.kill()
        proc.wait()
        tid = agent.submit(task_file(tmp_path, "unserved", show))
        assert agent.wait(tid)["state"] == "Succeeded"  # from a shim of the agent's own
        assert agent.cli("logs", tid, check=True).stdout != f"{proc.pid}\n"
        events = agent.cli("events", "--since", "0", check=True).stdout
        reached = f"ShimServer: workloads start from the shim server at {sock} (pid {proc.pid})"
        assert reached in events
        assert events.count("ShimServerUnreachable: ") == 1, events
        assert f"the shim server at {sock}: Connection refused; until it is reached" in events
    finally:
        agent.stop()
        agent.remove_subtree()
