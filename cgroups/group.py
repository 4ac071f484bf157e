"""Operations on one cgroup v2 group: create, move processes, freeze, kill, remove.

Freezing and killing are asynchronous in the kernel; both wait on `cgroup.events`
with a deadline. A freeze that does not complete is thawed back before the error is
raised, and so is one cut by SIGINT, SIGTERM or SIGHUP between the write and the
confirmation (`frozen 1`): no group is ever left frozen by a failure or a stop.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KernelError, errno_reason
from ..signals import TERMINATING, signals_held
from . import registry
from .registry import CgroupFile

if TYPE_CHECKING:
    from .spawn import Spawned

MAX_TIMEOUT = 3600.0  # seconds; a wait on the kernel longer than an hour is a mistake


class CgroupError(KernelError):
    """A cgroup write or wait failed; the message names the file, the value and the errno."""


def check_timeout(value: Any, what: str = "timeout") -> float:
    """Seconds to wait on the kernel: finite, > 0 and at most MAX_TIMEOUT (ValueError otherwise).
    NaN would make every deadline comparison false and poll() fail after the write."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of seconds")
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
        raise ValueError(f"{what} {value:g} is not in (0, {MAX_TIMEOUT:g}] seconds")
    return float(value)


class _SignalsNoted:
    """Inside the block SIGINT, SIGTERM and SIGHUP are only noted (`got`), never raised, so no
    step of a freeze or its undoing can be cut half-way; the caller's wait looks at `got` and
    gives up. On leaving, the process's own handlers are put back and each noted signal is
    raised again under them (the CLI's Terminated, a daemon's handler, the default action).
    Only the main thread can install handlers; elsewhere nothing is noted."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _SignalsNoted:
        if threading.current_thread() is threading.main_thread():
            for s in TERMINATING:
                old = signal.getsignal(s)
                if old not in (signal.SIG_IGN, None):
                    self._old[s] = signal.signal(s, lambda signum, _frame: self.got.append(signum))
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        for s in self.got:
            signal.raise_signal(s)


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
            raise CgroupError(exc.errno, f"read {self.path / name}: {exc.strerror}") from None

    def write(self, name: str, value: str) -> None:
        target = self.path / name
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise CgroupError(
                exc.errno, f"write {value!r} to {target}: {errno_reason(exc)}"
            ) from None

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
        return self.get(registry.EVENTS)

    def controllers(self) -> list[str]:
        return self.get(registry.CONTROLLERS)

    def subtree_control(self) -> list[str]:
        return self.get(registry.SUBTREE_CONTROL)

    def procs(self) -> list[int]:
        return self.get(registry.PROCS)

    def children(self) -> list[Cgroup]:
        return [Cgroup(p) for p in sorted(self.path.iterdir()) if p.is_dir()]

    # -- lifetime -------------------------------------------------------------------
    def create(self, exist_ok: bool = False) -> Cgroup:
        try:
            self.path.mkdir(exist_ok=exist_ok)
        except OSError as exc:
            raise CgroupError(exc.errno, f"mkdir {self.path}: {exc.strerror}") from None
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
                    raise CgroupError(exc.errno, f"rmdir {self.path}: {exc.strerror}") from None
                time.sleep(0.01)

    def add_proc(self, pid: int) -> None:
        self.write(registry.PROCS.name, str(pid))

    def add_thread(self, tid: int) -> None:
        self.write(registry.THREADS.name, str(tid))

    def spawn(self, argv: Sequence[str], **options: Any) -> Spawned:
        """Start `argv` (a list: no shell) as a process that is inside this group from its
        first instruction: clone3(CLONE_INTO_CGROUP) where the kernel has it, else a child
        that joins the group itself before it execs (`spawn_method()` says which; `method`
        forces `clone3` or `fork`).

        The keyword options are those of `cgroups.spawn.spawn`, whose signature is their one
        list (this forwards them unchanged, so the two cannot drift apart): `env` is the
        child's whole environment (None: this process's); `cwd`; `stdin`, `stdout`, `stderr`
        are fds (None: inherited); `pass_fds` stay open, every other fd above 2 is closed;
        `start_new_session`; `sigmask` is the child's signal mask (None: empty, even inside
        the caller's `signals_held()`); `method`. Returns once the command has exec'd, or as
        soon as the group is seen frozen (the child then waits, frozen, before its exec:
        `started` is False). `share_vm`: the child shares this process's memory until its
        exec instead of a copy of its page tables (clone3 on x86_64; elsewhere ignored),
        which a large process starts faster; the call then returns only once the child has
        exec'd or failed, so never ask it for a group that may be frozen. `oom_score_adj`:
        the child's, written before its exec (None: this process's, inherited). A failed join, fd
        setup, chdir or exec raises SpawnError (a CgroupError) with the errno and the path,
        the child already reaped; a group that cannot be opened or entered raises
        CgroupError."""
        from .spawn import spawn

        return spawn(self, argv, **options)

    def move_procs_to(self, leaf: Cgroup) -> list[int]:
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
        if any(c not in registry.THREADED_CONTROLLERS for c in controllers) and self.procs():
            moved = self.move_procs_to(Cgroup(self.path / leaf))
        self.write(registry.SUBTREE_CONTROL.name, " ".join(f"+{c}" for c in controllers))
        return moved

    # -- freeze and kill --------------------------------------------------------------
    def wait_event(
        self, key: str, value: int, timeout: float, stop: Callable[[], bool] | None = None
    ) -> bool:
        """Wait until `cgroup.events` shows `key value`; False on timeout, or as soon as `stop()`
        says so (checked at least every 50 ms).

        The kernel signals changes to cgroup.events as POLLPRI, so the wait sleeps in poll()
        instead of spinning on the file."""
        deadline = time.monotonic() + timeout
        fd = os.open(self.path / registry.EVENTS.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                os.lseek(fd, 0, os.SEEK_SET)
                text = os.read(fd, 4096).decode()
                if f"{key} {value}" in text.splitlines():
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop()):
                    return False
                poller.poll(min(left, 0.05) * 1000)
        finally:
            os.close(fd)

    def freeze(self, timeout: float = 2.0) -> None:
        """Write `cgroup.freeze` 1 and wait for `frozen 1`. On a timeout, an error or a stop
        (SIGINT, SIGTERM, SIGHUP) before that confirmation the group is thawed back first, then
        the error is raised or the signal delivered. A group someone else had already asked
        frozen is waited for but never thawed (this call did not freeze it)."""
        timeout = check_timeout(timeout)
        if self.read(registry.FREEZE.name).strip() == "1":
            if not self.wait_event("frozen", 1, timeout):
                raise CgroupError(
                    errno.ETIMEDOUT,
                    f"{self.path} was already being frozen and did not "
                    f"reach frozen 1 within {timeout:g}s",
                )
            return
        with _SignalsNoted() as noted:
            self.write(registry.FREEZE.name, "1")
            try:
                confirmed = self.wait_event("frozen", 1, timeout, stop=lambda: bool(noted.got))
            except BaseException as exc:
                with signals_held():
                    self._thaw_back(timeout, exc)
                raise
            if noted.got or not confirmed:
                with signals_held():
                    self._thaw_back(timeout)
        # Here a noted signal has been delivered; its handler returned (it only noted it).
        if noted.got:
            raise CgroupError(
                errno.EINTR,
                f"{self.path}: freeze interrupted by "
                f"{signal.Signals(noted.got[0]).name}; thawed back",
            )
        if not confirmed:
            raise CgroupError(
                errno.ETIMEDOUT,
                f"{self.path} did not reach frozen 1 within {timeout:g}s; thawed back",
            )

    def _thaw_back(self, timeout: float, cause: BaseException | None = None) -> None:
        try:
            self.thaw(timeout)
        except CgroupError as exc:
            why = f" after {cause}" if isinstance(cause, Exception) else ""
            raise CgroupError(
                exc.errno, f"{self.path}: thawing back{why} failed: {exc}; it may be left frozen"
            ) from None

    def thaw(self, timeout: float = 2.0) -> None:
        timeout = check_timeout(timeout)
        self.write(registry.FREEZE.name, "0")
        if not self.wait_event("frozen", 0, timeout):
            raise CgroupError(errno.ETIMEDOUT, f"{self.path} did not thaw within {timeout:g}s")

    def kill(self, timeout: float = 2.0) -> None:
        """SIGKILL every process in the subtree (cgroup.kill) and wait for `populated 0`."""
        timeout = check_timeout(timeout)
        self.write(registry.KILL.name, "1")
        if not self.wait_event("populated", 0, timeout):
            raise CgroupError(
                errno.ETIMEDOUT, f"{self.path} still populated {timeout:g}s after cgroup.kill"
            )
