"""`xhagent run` under a service manager: with $NOTIFY_SOCKET it says READY=1 once its socket
serves and STOPPING=1 on SIGTERM (the unit is Type=notify); the socket here is a real
AF_UNIX datagram socket standing in for systemd's."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from xhagent.bench.local_agent import LocalAgent
from xhagent.daemon.api.client import connect
from xhagent.daemon.api.v1 import agent_pb2 as pb

pytestmark = pytest.mark.host


@pytest.fixture
def manager(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(60)
    yield sock, str(path)
    sock.close()


@pytest.fixture
def local(tmp_path):
    a = LocalAgent(tmp_path, f"xhagent-notify-test-{os.getpid()}.slice", policies=False)
    yield a
    a.remove_subtree()


def messages(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


def test_ready_once_serving_and_stopping_on_sigterm(manager, local):
    sock, path = manager
    env = dict(os.environ, NOTIFY_SOCKET=path)
    args = [sys.executable, "-m", "xhagent.cli", "run", "--state-dir", str(local.state),
            "--socket", str(local.socket), "--subtree", local.subtree,
            "--metrics-addr", "off"]  # fmt: skip
    with open(local.log, "ab") as log:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        ready = messages(sock.recv(4096))
        assert ready["READY"] == "1", local.tail()
        assert ready["MAINPID"] == str(proc.pid)
        assert ready["STATUS"] == f"serving on unix:{local.socket}"
        # The socket serves at the moment READY=1 arrives: no retry loop needed.
        with connect(local.socket, timeout=5) as client:
            client.Health(pb.HealthRequest())
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        assert proc.wait(timeout=30) == 0, local.tail()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
