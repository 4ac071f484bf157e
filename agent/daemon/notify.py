"""systemd's readiness protocol (sd_notify(3)), without libsystemd: one datagram to the
unix socket named by $NOTIFY_SOCKET.

With it the unit can be `Type=notify`: `systemctl start xhagent` returns once the agent
says READY=1 (its subtree settled, its socket serving), so a client started right after
finds the socket, and a start that fails fails `systemctl start` itself. Outside systemd
(no $NOTIFY_SOCKET) every call is a no-op that returns False.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send `state` (newline-separated KEY=VALUE lines) to the service manager.

    True when it was sent; False when there is no manager to tell. An unreachable socket
    raises OSError: the unit said it wants to hear, so silence would hang its start.
    """
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        raise OSError(f"NOTIFY_SOCKET={address!r}: neither a path nor an abstract name")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True


def notify_ready(status: str = "serving", env: dict[str, str] | None = None) -> bool:
    """READY=1, with the pid (so NotifyAccess=main accepts it from any thread) and a
    status line that `systemctl status` shows."""
    return notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS={status}", env)


def notify_stopping(env: dict[str, str] | None = None) -> bool:
    """STOPPING=1: the agent is shutting down (workloads keep running)."""
    return notify("STOPPING=1", env)
