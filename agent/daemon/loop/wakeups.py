"""What wakes the scheduler loop: a request (`wake`), a shim's exit (its pidfd, watched by
task id) and the time the next thing falls due (`at`). One object owns the selector, the
wake-up pipe and the due time; the loop's `wait` says which of them woke it.
"""

from __future__ import annotations

import os
import selectors
from collections.abc import Callable
from dataclasses import dataclass

SAFETY_S = 30.0  # the longest the loop sleeps: a missed wake-up costs at most this


@dataclass(frozen=True)
class Woken:
    """Why `wait` returned: `exited` names the tasks whose shims' pidfds became readable;
    `anything` is False when nothing at all woke it (the timeout passed)."""

    anything: bool
    exited: frozenset[str]


class Wakeups:
    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._due: int | None = None

    def wake(self) -> None:
        """From any thread: the loop steps as soon as it can."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def at(self, ns: int) -> None:
        """Something falls due at `ns` (the clock's time): the loop steps then at the latest."""
        self._due = ns if self._due is None else min(self._due, ns)

    def due(self) -> int | None:
        """The clock's time the next thing falls due (None: nothing is)."""
        return self._due

    def clear_due(self) -> None:
        """A step begins: whatever is still due is set again while it runs."""
        self._due = None

    def timeout(self) -> float:
        """Seconds until the next due time, at most SAFETY_S."""
        if self._due is None:
            return SAFETY_S
        return min(SAFETY_S, max(0.0, (self._due - self._clock()) / 1e9))

    def watch(self, fd: int, task_id: str) -> None:
        """`fd` (a shim's pidfd) readable means `task_id`'s shim ended."""
        self._selector.register(fd, selectors.EVENT_READ, task_id)

    def unwatch(self, fd: int) -> None:
        self._selector.unregister(fd)

    def exited_now(self) -> frozenset[str]:
        """The tasks whose shims' pidfds are readable now, without waiting: for a step busy
        starting tasks, which would otherwise see these ends only once it is over. A pending
        wake-up stays pending (the pipe is not drained)."""
        ready = self._selector.select(timeout=0)
        return frozenset(key.data for key, _ in ready if key.data is not None)

    def wait(self, timeout: float) -> Woken:
        ready = self._selector.select(timeout=timeout)
        exited = frozenset(key.data for key, _ in ready if key.data is not None)
        if any(key.data is None for key, _ in ready):
            _drain(self._wake_r)
        return Woken(bool(ready), exited)

    def close(self) -> None:
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
