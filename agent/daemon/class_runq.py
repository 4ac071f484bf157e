"""Run-queue latency by class, for `xhagent_class_runq_latency_seconds{class}`: a histogram
that holds every task, where per-task series stop at a cap.

Each running task's leaf is watched by the probe (`xhagent.bpf.runqlat`) and read at each
scrape (`seen`); once the leaf is gone, the probe's entry for it is read a last time and its
waits join its class's ended total (`ended`). Invariant: no bucket, count or sum of a class
ever goes back (Prometheus takes a drop for a reset): a reading below a leaf's last one is
dropped (a watched group's counts only grow), and sums are kept in whole nanoseconds, so
that a leaf moving from running to ended moves exactly what it added.

Not counted: a leaf's waits before the first scrape that lists it (the probe watches it
from then on), so a task that starts and ends between two scrapes is missing; and the
waits of a leaf the probe could not watch (its map full).

Not thread-safe: the census calls it from its run-queue step, one scrape at a time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..bpf.runqlat import UPPER_BOUNDS, Histogram

BOUNDS = (*UPPER_BOUNDS, math.inf)


class _Waits(NamedTuple):
    counts: tuple[int, ...]  # cumulative, one per bound of BOUNDS
    sum_ns: int

    @classmethod
    def of(cls, hist: Histogram) -> _Waits:
        # sum_ns / 1e9 and back: exact below 2**51 ns (26 days of waits), monotonic above
        return cls(tuple(n for _, n in hist.buckets), round(hist.sum * 1e9))

    def covers(self, other: _Waits) -> bool:
        return self.sum_ns >= other.sum_ns and all(
            n >= m for n, m in zip(self.counts, other.counts, strict=True)
        )

    def plus(self, other: _Waits) -> _Waits:
        counts = tuple(n + m for n, m in zip(self.counts, other.counts, strict=True))
        return _Waits(counts, self.sum_ns + other.sum_ns)


_NO_WAITS = _Waits((0,) * len(BOUNDS), 0)


class ClassRunq:
    def __init__(self) -> None:
        self._ended: dict[str, _Waits] = {}  # class -> waits of its leaves that went
        self._running: dict[int, tuple[str, _Waits]] = {}  # cgroup id -> (class, last reading)

    def seen(self, cgroup_id: int, task_class: str, hist: Histogram) -> None:
        """A running task's leaf, as the probe counts it at a scrape."""
        now = _Waits.of(hist)
        last = self._running.get(cgroup_id)
        if last is None:
            self._running[cgroup_id] = (task_class, now)
            self._ended.setdefault(task_class, _NO_WAITS)
        elif now.covers(last[1]):
            self._running[cgroup_id] = (last[0], now)

    def ended(self, cgroup_id: int, final: Histogram | None) -> None:
        """The leaf is gone: its final reading (None: the probe had none), or else its last
        one, joins its class's ended total."""
        last = self._running.pop(cgroup_id, None)
        if last is None:
            return  # never read: not one of a task's leaves, or never watched
        task_class, waits = last
        if final is not None and (at_end := _Waits.of(final)).covers(waits):
            waits = at_end
        self._ended[task_class] = self._ended[task_class].plus(waits)

    def totals(self, classes: list[str]) -> dict[str, Histogram]:
        """Every class given and every class seen since the agent started, 0 included."""
        out = dict.fromkeys(classes, _NO_WAITS) | self._ended
        for task_class, waits in self._running.values():
            out[task_class] = out[task_class].plus(waits)
        return {
            c: Histogram(tuple(zip(BOUNDS, w.counts, strict=True)), w.sum_ns / 1e9, w.counts[-1])
            for c, w in sorted(out.items())
        }
