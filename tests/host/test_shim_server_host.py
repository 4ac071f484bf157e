"""The shim server (`xhagent-shim --serve`) on this host's cgroup2 tree: requests sent
before any reply is read each get their own supervisor (whose command line, as ps shows
it, is a one-shot shim's), a server that ended is replaced,
what it cannot take goes to a one-shot shim, a malformed request starts nothing, and the
supervisors outlive the server. (That a served supervisor is a one-shot shim in every
other way, test_shim_host.py's tests show: each runs both ways.)"""

import errno
import os
import select
import socket
import struct

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
