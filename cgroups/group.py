"""Operations on one cgroup v2 group: create, move processes, freeze, kill, remove.

Freezing and killing are asynchronous in the kernel; both wait on `cgroup.events`
with a deadline, and a freeze that does not complete is thawed back before the error
is raised, so no group is ever left frozen by a failure.
"""
from __future__ import annotations

import errno
import os
import select
import time
from pathlib import Path
from typing import Any

from . import registry as R
from .registry import CgroupFile


class CgroupError(OSError):
    """A cgroup write or wait failed; the message names the file, the value and the errno."""


class Cgroup:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Cgroup({str(self.path)!r})"

    # -- files ----------------------------------------------------------------------
    def read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError as exc:
            raise CgroupError(exc.errno, f"read {self.path / name}: {os.strerror(exc.errno)}") from None

    def write(self, name: str, value: str) -> None:
        target = self.path / name
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            code = "EOPNOTSUPP" if exc.errno == errno.EOPNOTSUPP else errno.errorcode.get(exc.errno, str(exc.errno))
            raise CgroupError(exc.errno, f"write {value!r} to {target}: {code} ({os.strerror(exc.errno)})") from None

    def get(self, f: CgroupFile) -> Any:
        """A declared file, parsed."""
        return f.parse(self.read(f.name))

    def set(self, f: CgroupFile, value: Any) -> None:
        """A declared file, formatted: one write per line (keyed files take one entry a write)."""
        for line in f.format(value):
            self.write(f.name, line)

    def has(self, f: CgroupFile) -> bool:
        return (self.path / f.name).exists()

    def events(self) -> dict[str, int]:
        return self.get(R.EVENTS)

    def controllers(self) -> list[str]:
        return self.get(R.CONTROLLERS)

    def subtree_control(self) -> list[str]:
        return self.get(R.SUBTREE_CONTROL)

    def procs(self) -> list[int]:
        return self.get(R.PROCS)

    def children(self) -> list["Cgroup"]:
        return [Cgroup(p) for p in sorted(self.path.iterdir()) if p.is_dir()]

    # -- lifetime -------------------------------------------------------------------
    def create(self, exist_ok: bool = False) -> "Cgroup":
        try:
            self.path.mkdir(exist_ok=exist_ok)
        except OSError as exc:
            raise CgroupError(exc.errno, f"mkdir {self.path}: {os.strerror(exc.errno)}") from None
        return self

    def remove(self, kill_first: bool = False, timeout: float = 2.0) -> None:
        """rmdir; the kernel refuses (EBUSY) while processes or child groups remain.
        With kill_first, the processes are killed and waited for first."""
        if kill_first and self.events().get("populated"):
            self.kill(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                # The last task may still be exiting just after `populated 0`: EBUSY briefly.
                if not (kill_first and exc.errno == errno.EBUSY and time.monotonic() < deadline):
                    raise CgroupError(exc.errno, f"rmdir {self.path}: {os.strerror(exc.errno)}") from None
                time.sleep(0.01)

    def add_proc(self, pid: int) -> None:
        self.write(R.PROCS.name, str(pid))

    def add_thread(self, tid: int) -> None:
        self.write(R.THREADS.name, str(tid))

    def move_procs_to(self, leaf: "Cgroup") -> list[int]:
        """Move every process of this group into `leaf` (a child, created if needed)."""
        if not leaf.path.exists():
            leaf.create()
        moved = []
        for pid in self.procs():
            try:
                leaf.add_proc(pid)
                moved.append(pid)
            except CgroupError as exc:
                if exc.errno != errno.ESRCH:  # exited meanwhile
                    raise
        return moved

    def enable_controllers(self, controllers: list[str], leaf: str = "leaf") -> list[int]:
        """`+c` in cgroup.subtree_control, after moving this group's processes into the
        child `leaf` when a domain controller is among them (no internal processes).
        Returns the pids moved."""
        moved: list[int] = []
        if any(c not in R.THREADED_CONTROLLERS for c in controllers) and self.procs():
            moved = self.move_procs_to(Cgroup(self.path / leaf))
        self.write(R.SUBTREE_CONTROL.name, " ".join(f"+{c}" for c in controllers))
        return moved

    # -- freeze and kill --------------------------------------------------------------
    def wait_event(self, key: str, value: int, timeout: float) -> bool:
        """Wait until `cgroup.events` shows `key value`; False on timeout.

        The kernel signals changes to cgroup.events as POLLPRI, so the wait sleeps in poll()
        instead of spinning on the file."""
        deadline = time.monotonic() + timeout
        fd = os.open(self.path / R.EVENTS.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                os.lseek(fd, 0, os.SEEK_SET)
                text = os.read(fd, 4096).decode()
                if f"{key} {value}" in text.splitlines():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(min(left, 0.05) * 1000)
        finally:
            os.close(fd)

    def freeze(self, timeout: float = 2.0) -> None:
        self.write(R.FREEZE.name, "1")
        if not self.wait_event("frozen", 1, timeout):
            self.thaw(timeout)
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} did not reach frozen 1 within {timeout:g}s; thawed back")

    def thaw(self, timeout: float = 2.0) -> None:
        self.write(R.FREEZE.name, "0")
        if not self.wait_event("frozen", 0, timeout):
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} did not thaw within {timeout:g}s")

    def kill(self, timeout: float = 2.0) -> None:
        """SIGKILL every process in the subtree (cgroup.kill) and wait for `populated 0`."""
        self.write(R.KILL.name, "1")
        if not self.wait_event("populated", 0, timeout):
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} still populated {timeout:g}s after cgroup.kill")
