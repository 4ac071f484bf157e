"""On-CPU intervals from sched_switch records: the shared core of the Chrome export,
the statistics and the heatmap."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from .fmt import EV_SWITCH, Event, comm


@dataclass(frozen=True)
class Interval:
    cpu: int
    pid: int
    tgid: int
    comm: str
    start_ns: int
    end_ns: int
    end_state: int | None  # sched_switch prev_state at the end; None if the trace ended first


def on_cpu_intervals(events: Iterable[Event]) -> Iterator[Interval]:
    """Each run of a task on a CPU between its switch-in and switch-out. A run whose
    start the trace does not show (before the first switch on that CPU, or hidden by
    a filter) is left out rather than guessed; runs still going at the end are closed
    at the last timestamp of the trace."""
    current: dict[int, tuple[int, int, str, int]] = {}
    last_ts = 0
    for ev in events:
        last_ts = max(last_ts, ev.ts_ns)
        if ev.type != EV_SWITCH:
            continue
        cur = current.get(ev.cpu)
        if cur is not None and cur[0] == ev.prev_pid and ev.ts_ns >= cur[3]:
            yield Interval(ev.cpu, cur[0], cur[1], cur[2], cur[3], ev.ts_ns, ev.prev_state)
        current[ev.cpu] = (ev.next_pid, ev.next_tgid, comm(ev.next_comm), ev.ts_ns)
    for cpu, (pid, tgid, name, start) in sorted(current.items()):
        if last_ts > start:
            yield Interval(cpu, pid, tgid, name, start, last_ts, None)


def by_time(events: Iterable[Event]) -> list[Event]:
    """Records in timestamp order (the shared ring buffer is ordered by reservation,
    which can differ from timestamp order across CPUs by a little); stable per CPU."""
    return sorted(events, key=lambda e: e.ts_ns)
