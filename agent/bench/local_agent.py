"""An `xhagent run` child on its own state dir, socket and subtree: for `xhagent bench agent`
and the tests, which must drive the real daemon without touching the node's own agent."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from ..cgroups import Cgroup, CgroupError
from ..cgroups.mounts import discover_hierarchy
from ..daemon.api.client import ApiError, connect


class LocalAgent:
    def __init__(self, base: Path, subtree: str, policies: bool = True, extra: tuple = ()):
        self.base = Path(base)
        self.extra = list(extra)  # more `xhagent run` options, such as ("--pool", "auto")
        self.subtree = subtree
        self.state = self.base / "state"
        self.socket = self.base / "run" / "agent.sock"
        self.policies = self.base / "policies.d" if policies else None
        if self.policies is not None:
            self.policies.mkdir(parents=True, exist_ok=True)
        self.log = self.base / "agent.log"
        self.proc: subprocess.Popen | None = None

    @property
    def subtree_path(self) -> Path:
        return Path(discover_hierarchy().unified.path) / self.subtree

    # Any free loopback port: agents side by side must not want the same one; Health says
    # which one it got (`metrics_url`).
    metrics_addr: str | None = "127.0.0.1:0"

    def metrics_url(self) -> str:
        from ..daemon.api.v1 import agent_pb2 as pb

        with connect(self.socket, timeout=5) as client:
            return client.Health(pb.HealthRequest()).metrics_addr

    def start(self, timeout: float = 60.0) -> None:
        """Start it and wait until it answers Health (its log is in `self.log`)."""
        from ..daemon.api.v1 import agent_pb2 as pb

        args = [
            sys.executable,
            "-m",
            "xhagent.cli",
            "run",
            "--state-dir",
            str(self.state),
            "--socket",
            str(self.socket),
            "--subtree",
            self.subtree,
        ]
        if self.metrics_addr is not None:  # None: agent.yaml's, or the agent's default
            args += ["--metrics-addr", self.metrics_addr]
        if self.policies is not None:
            args += ["--policies-dir", str(self.policies)]
        args += self.extra
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited {self.proc.returncode}: {self.tail()}")
            try:
                with connect(self.socket, timeout=5) as client:
                    client.Health(pb.HealthRequest())
                return
            except ApiError:
                if time.monotonic() > deadline:
                    why = f"the agent did not serve in {timeout:g}s: {self.tail()}"
                    raise RuntimeError(why) from None
                time.sleep(0.05)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def client(self, timeout: float = 30.0):
        return connect(self.socket, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def remove_subtree(self) -> None:
        """Kill whatever runs in the subtree and remove its groups, leaves first."""
        remove_groups(self.subtree_path)


def remove_groups(path: Path) -> None:
    """The group at `path` and every group below it, leaves first, each thawed and its
    processes killed (one that will not go is left)."""
    if not path.is_dir():
        return
    groups = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for group in [*groups, path]:
        cg = Cgroup(group)
        try:
            cg.write("cgroup.freeze", "0")
            cg.remove(kill_first=True)
        except CgroupError:
            pass
