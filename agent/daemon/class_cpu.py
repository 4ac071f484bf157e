"""CPU time by class, for `xhagent_task_cpu_seconds_total{class}`: a counter that holds
whatever the number of tasks, where per-task series stop at a cap.

Two sources: a running attempt's leaf, read at each scrape (`seen`), and an ended attempt's
record, whose `cpu_usec` the lifecycle read from the leaf just before removing it
(`ended`). Invariant: the total of a class never goes back. A running task counts its
highest reading until its attempt's end is committed, then the larger of that and its
record's figure (a leaf read after the last scrape has used at least as much, and one that
could not be read at its end keeps the last reading). A reading that comes after the end
(a scrape that listed the leaf just before it went) is dropped: only attempts between
`started` and `ended` are read.

Called from the store's commits (`started`, `ended`: the loop's and the API's threads) and
from the exporter's scrape (`seen`, `totals`); one lock.
"""

from __future__ import annotations

import threading


class ClassCpu:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: dict[str, int] = {}  # class -> µs of the attempts that ended
        self._running: dict[str, tuple[str, int]] = {}  # task id -> (class, µs read so far)

    def started(self, task_id: str, task_class: str) -> None:
        """An attempt began running: its leaf's readings count from now."""
        with self._lock:
            self._running.setdefault(task_id, (task_class, 0))
            self._ended.setdefault(task_class, 0)

    def seen(self, task_id: str, usec: int) -> None:
        """A running attempt's leaf read `usec` (cpu.stat usage_usec) at a scrape."""
        with self._lock:
            now = self._running.get(task_id)
            if now is not None and usec > now[1]:
                self._running[task_id] = (now[0], usec)

    def ended(self, task_id: str, usec: int | None) -> None:
        """An attempt's end committed, with its record's figure (None: not read)."""
        with self._lock:
            now = self._running.pop(task_id, None)
            if now is None:
                return  # it never ran (a start that failed), or it was counted already
            task_class, read = now
            self._ended[task_class] = self._ended.get(task_class, 0) + max(usec or 0, read)

    def running(self) -> list[str]:
        """The tasks whose leaves a scrape reads."""
        with self._lock:
            return list(self._running)

    def totals(self) -> dict[str, float]:
        """Seconds by class, every class that ran a task since the agent started."""
        with self._lock:
            out = dict(self._ended)
            for task_class, usec in self._running.values():
                out[task_class] = out.get(task_class, 0) + usec
        return {c: us / 1e6 for c, us in out.items()}
