"""Who may reach the agent's socket: root:GROUP 0660 in a root:GROUP 0750 directory lets a
member of GROUP in and keeps `nobody` out, with the message the CLI prints. Needs root
(groupadd, chown, a client process running as nobody)."""

import grp
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.api.v1 import agent_pb2_grpc as pb_grpc

pytestmark = pytest.mark.host
NOBODY = 65534

CLIENT = """
import site, sys
site.addsitedir(sys.argv[2])  # this venv's packages alone (python -S): none of the system's
from xhagent.daemon.api.client import ApiError, connect
from xhagent.daemon.api.v1 import agent_pb2 as pb
try:
    with connect(sys.argv[1]) as client:
        print(client.Health(pb.HealthRequest()).status)
except ApiError as err:
    print(err)
    sys.exit(err.exit_code)
"""


class Servicer(pb_grpc.AgentServicer):
    def Health(self, request, context):
        return pb.HealthResponse(status="ok")


@pytest.fixture
def group():
    name = f"xhagent-test-{os.getpid()}"
    subprocess.run(["groupadd", "--system", name], check=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], check=True)


@pytest.fixture
def sock():
    # pytest's tmp_path is root's 0700: nobody could not reach any socket there.
    base = Path(tempfile.mkdtemp(prefix="xhagent-api-"))
    os.chmod(base, 0o755)
    yield base / "run" / "xhagent.sock"
    shutil.rmtree(base)


@pytest.fixture(scope="module")
def python():
    """A python nobody may run: this one, else the system's of the same version (pyenv's
    lives under root's 0700 home), which reaches our packages through addsitedir."""
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, system):
        try:
            subprocess.run([exe, "-c", ""], user=NOBODY, group=NOBODY, check=True, timeout=60)
        except (OSError, subprocess.CalledProcessError):
            continue
        return exe
    pytest.skip(f"no python that nobody may run (tried {sys.executable}, {system})")


def as_nobody(python, sock, groups=()):
    return subprocess.run(
        [python, "-S", "-c", CLIENT, str(sock), sysconfig.get_paths()["platlib"]],
        user=NOBODY,
        group=NOBODY,
        extra_groups=list(groups),
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_group_members_get_in_and_others_are_refused(python, sock, group):
    server = bind(Servicer(), sock, group=group.gr_name)
    try:
        st_dir, st_sock = os.stat(sock.parent), os.lstat(sock)
        assert (st_dir.st_uid, st_dir.st_gid, stat.S_IMODE(st_dir.st_mode)) == (
            0,
            group.gr_gid,
            0o750,
        )
        assert (st_sock.st_uid, st_sock.st_gid, stat.S_IMODE(st_sock.st_mode)) == (
            0,
            group.gr_gid,
            0o660,
        )

        member = as_nobody(python, sock, [group.gr_gid])
        assert (member.returncode, member.stdout, member.stderr) == (0, "ok\n", "")

        outsider = as_nobody(python, sock)
        assert outsider.returncode == 1, outsider.stderr
        assert outsider.stdout == (
            f"{sock}: permission denied: run as root or as a member of group xhagent\n"
        )
        assert outsider.stderr == ""
    finally:
        server.stop(None)


def test_without_the_group_only_root_connects(python, sock):
    server = bind(Servicer(), sock, group="xhagent-test-no-such-group")
    try:
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        assert os.stat(sock.parent).st_gid == 0
        # Even with the directory opened to it, nobody is kept out by the socket's own mode.
        os.chmod(sock.parent, 0o755)
        refused = as_nobody(python, sock)
        assert refused.returncode == 1
        assert "permission denied: run as root or as a member of group xhagent" in refused.stdout
    finally:
        server.stop(None)
