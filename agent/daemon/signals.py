"""The daemon's SIGTERM, SIGINT and SIGHUP, from the first line of `xhagent run` to its last.

One object holds the handlers for the whole life of the agent, so that a stop asked for
during start-up (which can take seconds: recovery of many tasks, many policy files) is
not the default action, which would end the agent as a kill -9 does, without a word and
without closing anything. A handler only notes what came: CPython runs it in the main
thread between two bytecodes, whatever that thread is doing (a store transaction, the read
of a policy file), so the agent acts on it where it is safe to: start-up at its next
`checkpoint()` (between two phases, or two items of a long one), the serving loop as soon
as the wakeup pipe (`fileno()`) wakes its selector.
"""

from __future__ import annotations

import os
import signal

STOPS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """A stop came during start-up. A BaseException, so that no `except Exception` on the
    way out of start-up takes it for a fault and goes on."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class DaemonSignals:
    """A context manager: inside it, SIGTERM and SIGINT are a stop (the first one counts)
    and SIGHUP a re-read of the policy directory (several before it is done are one)."""

    def __init__(self):
        self.stop: int | None = None  # the signal of the stop asked for
        self.reload = False  # a SIGHUP not acted on yet
        self._pipe: tuple[int, int] | None = None
        self._old_fd = -1
        self._old: dict[int, object] = {}

    def __enter__(self) -> DaemonSignals:
        self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_fd = signal.set_wakeup_fd(self._pipe[1])
        self._old = {s: signal.signal(s, self._caught) for s in (*STOPS, signal.SIGHUP)}
        # Blocked across the allocator's exec (allocator.py): what came meanwhile is
        # pending, and is caught now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (*STOPS, signal.SIGHUP))
        return self

    def __exit__(self, *_exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_fd)
        for fd in self._pipe:
            os.close(fd)
        self._old, self._pipe = {}, None

    def _caught(self, signum: int, _frame) -> None:
        if signum == signal.SIGHUP:
            self.reload = True
        elif self.stop is None:
            self.stop = signum

    def fileno(self) -> int:
        """Readable once a signal came (for a selector; `drain()` it)."""
        return self._pipe[0]

    def drain(self) -> None:
        try:
            while os.read(self._pipe[0], 4096):
                pass
        except BlockingIOError:
            pass

    def take_reload(self) -> bool:
        """Whether a SIGHUP came since the last call. One that comes between the test and
        the reset is lost, but the re-read the caller then makes starts after it."""
        if not self.reload:
            return False
        self.reload = False
        return True

    def checkpoint(self) -> None:
        """Raise StopRequested when a stop was asked for: start-up calls it where what it
        has done so far is whole, so that it ends there."""
        if self.stop is not None:
            raise StopRequested(self.stop)
