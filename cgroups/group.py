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
            code = errno.errorcode.get(exc.errno, str(exc.errno))
            raise CgroupError(exc.errno, f"write {value!r} to {target}: {code} ({os.strerror(exc.errno)})") from None

    def events(self) -> dict[str, int]:
        return {k: int(v) for k, v in (line.split() for line in self.read("cgroup.events").splitlines())}

    def controllers(self) -> list[str]:
        return self.read("cgroup.controllers").split()

    def procs(self) -> list[int]:
        return [int(p) for p in self.read("cgroup.procs").split()]

    # -- lifetime -------------------------------------------------------------------
    def create(self, exist_ok: bool = False) -> "Cgroup":
        try:
            self.path.mkdir(exist_ok=exist_ok)
        except OSError as exc:
            raise CgroupError(exc.errno, f"mkdir {self.path}: {os.strerror(exc.errno)}") from None
        return self

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError as exc:
            raise CgroupError(exc.errno, f"rmdir {self.path}: {os.strerror(exc.errno)}") from None

    def add_proc(self, pid: int) -> None:
        self.write("cgroup.procs", str(pid))

    # -- freeze and kill --------------------------------------------------------------
    def wait_event(self, key: str, value: int, timeout: float) -> bool:
        """Wait until `cgroup.events` shows `key value`; False on timeout.

        The kernel signals changes to cgroup.events as POLLPRI, so the wait sleeps in poll()
        instead of spinning on the file."""
        deadline = time.monotonic() + timeout
        fd = os.open(self.path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
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
        self.write("cgroup.freeze", "1")
        if not self.wait_event("frozen", 1, timeout):
            self.thaw(timeout)
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} did not reach frozen 1 within {timeout:g}s; thawed back")

    def thaw(self, timeout: float = 2.0) -> None:
        self.write("cgroup.freeze", "0")
        if not self.wait_event("frozen", 0, timeout):
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} did not thaw within {timeout:g}s")

    def kill(self, timeout: float = 2.0) -> None:
        """SIGKILL every process in the subtree (cgroup.kill) and wait for `populated 0`."""
        self.write("cgroup.kill", "1")
        if not self.wait_event("populated", 0, timeout):
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} still populated {timeout:g}s after cgroup.kill")
