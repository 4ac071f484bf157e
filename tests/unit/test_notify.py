"""agent/daemon/notify.py speaks sd_notify(3): a datagram to $NOTIFY_SOCKET."""

import os
import socket

import pytest

from xhagent.daemon.notify import notify, notify_ready, notify_stopping


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    yield sock, str(path)
    sock.close()


def test_ready_reaches_the_manager_with_pid_and_status(listener):
    sock, path = listener
    assert notify_ready("serving on unix:/run/xhagent/xhagent.sock", {"NOTIFY_SOCKET": path})
    lines = sock.recv(4096).decode().split("\n")
    assert lines == [
        "READY=1",
        f"MAINPID={os.getpid()}",
        "STATUS=serving on unix:/run/xhagent/xhagent.sock",
    ]


def test_stopping(listener):
    sock, path = listener
    assert notify_stopping({"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"STOPPING=1"


def test_abstract_socket_name():
    name = f"xhagent-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1"


def test_without_a_manager_nothing_is_sent():
    assert notify_ready(env={}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": ""}) is False


def test_process_environment_is_the_default(listener, monkeypatch):
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify("WATCHDOG=1")
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_a_socket_that_is_gone_is_an_error_not_silence(tmp_path):
    with pytest.raises(OSError):
        notify_ready(env={"NOTIFY_SOCKET": str(tmp_path / "absent")})
    with pytest.raises(OSError, match="neither a path nor an abstract name"):
        notify_ready(env={"NOTIFY_SOCKET": "relative/name"})
