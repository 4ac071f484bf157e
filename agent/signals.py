"""Signals for commands that change kernel state or wait on a child.

Python turns SIGINT into KeyboardInterrupt, but SIGTERM and SIGHUP kill the process without
running a single `finally`: a group stays frozen, a temporary file stays behind, a child
runs on. These three tools make every stop take the same path as an error:

- `terminate_on_signals()`: inside the block SIGINT, SIGTERM and SIGHUP raise `Terminated`
  (a BaseException, so `except Exception` does not swallow it), and cleanup runs.
- `signals_held()`: a section that must not be cut (thawing back, removing a group): the
  signals stay pending while it runs and are delivered right after it.
- `forward_signals(pid)`: while waiting on a child, what this process is told, the child is
  told; the caller then waits for it and reports its status.

Handlers run only in the main thread (CPython's rule); the tools are for the CLI's main thread.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """A terminating signal arrived; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


@contextmanager
def _handlers(handler: Callable, signals: tuple[int, ...]) -> Iterator[None]:
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def terminate_on_signals(signals: tuple[int, ...] = TERMINATING):
    """Raise Terminated for `signals` inside the block."""

    def handler(signum: int, _frame) -> None:
        raise Terminated(signum)

    return _handlers(handler, signals)


@contextmanager
def signals_held(signals: tuple[int, ...] = TERMINATING) -> Iterator[None]:
    """Block `signals` for the section; one that arrived is delivered when it ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def forward_signals(pid: int, signals: tuple[int, ...] = TERMINATING) -> Iterator[list[int]]:
    """Send `signals` on to `pid`; yields the list of those received, in order."""
    received: list[int] = []

    def handler(signum: int, _frame) -> None:
        received.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # it has exited; the caller's wait reaps it

    with _handlers(handler, signals):
        yield received


def wait_exit_code(pid: int) -> int:
    """Wait for `pid`; its exit status as a shell reports it (128 + signal when killed)."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0: nothing is sent), ours or someone else's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, someone else's
    return True
