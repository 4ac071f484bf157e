"""On-CPU intervals from sched_switch records: the shared core of the Chrome export,
the statistics and the heatmap."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .fmt import (
    EV_EXIT,
    EV_FORK,
    EV_SWITCH,
    EV_WAKEUP,
    EV_WAKEUP_NEW,
    EV_WAKING,
    Event,
    comm,
)


@dataclass(frozen=True)
class Interval:
    cpu: int
    pid: int
    tgid: int
    comm: str
    start_ns: int
    end_ns: int
    end_state: int | None  # sched_switch prev_state at the end; None if the trace ended first
    end_stack: int = 0  # the switch-out's aux: its kernel stack's id + 1 (0: none)
    end_ustack: int = 0  # the switch-out's ustack: its user stack's id + 1 (0: none)


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
            yield Interval(
                ev.cpu, cur[0], cur[1], cur[2], cur[3], ev.ts_ns, ev.prev_state, ev.aux, ev.ustack
            )
        current[ev.cpu] = (ev.next_pid, ev.next_tgid, comm(ev.next_comm), ev.ts_ns)
    for cpu, (pid, tgid, name, start) in sorted(current.items()):
        if last_ts > start:
            yield Interval(cpu, pid, tgid, name, start, last_ts, None)


def by_time(events: Iterable[Event]) -> list[Event]:
    """Records in timestamp order (the shared ring buffer is ordered by reservation,
    which can differ from timestamp order across CPUs by a little); stable per CPU."""
    return sorted(events, key=lambda e: e.ts_ns)


# Records only a task the filter selected produces: the woken, exiting or forking task
# (and, under a cgroup filter, the child, which starts in its parent's cgroup).
_SUBJECTS = {
    EV_WAKEUP: ("next",),
    EV_WAKING: ("next",),
    EV_WAKEUP_NEW: ("next",),
    EV_EXIT: ("prev",),
    EV_FORK: ("prev", "next"),
}
ROOT_CGROUP_ID = 1  # the cgroup v2 root's id: a filter on it selects every task

# What `trace stats` counts, as it prints it (docs/tracing.md).
RULE_ALL = "every task; a run still going when the trace ends is closed there"
RULE_FILTERED = "only tasks the filter selected, only runs recorded from switch-in to switch-out"


class Selection:
    """The tasks a trace's filter selected, as far as the records show them.

    A switch is recorded when a selected task is on either side of it, so the run of a task
    outside the filter can hide any number of unrecorded switches; counting it would credit
    that task with other tasks' time. With a filter, only selected tasks' runs are counted:
    - pids: the filter's pids and command (matched as pid or tgid, as the BPF filter does)
      and every task they forked (fork records are always kept with this filter);
    - cgroup: tasks named by a record only a selected task produces (wakeup, exit, fork)
      or switched to or from the idle task (which is outside every cgroup but the root)."""

    def __init__(self, events: Iterable[Event], filt: dict | None):
        filt = filt or {}
        kind = filt.get("kind", "all")
        self.everything = kind == "all" or (
            kind == "cgroup" and filt.get("cgroup_id") == ROOT_CGROUP_ID
        )
        self.rule = RULE_ALL if self.everything else RULE_FILTERED
        self.pids: set[int] = set()
        self._tgids: set[int] = set()
        if self.everything:
            return
        if kind == "pids":
            self._tgids = set(filt.get("pids", [])) | (
                {filt["command_pid"]} if "command_pid" in filt else set()
            )
            self.pids = set(self._tgids)
            for ev in events:
                if ev.type == EV_FORK and self.selected(ev.prev_pid, ev.prev_tgid):
                    self.pids.add(ev.next_pid)
            return
        for ev in events:
            for side in _SUBJECTS.get(ev.type, ()):
                self.pids.add(ev.prev_pid if side == "prev" else ev.next_pid)
            if ev.type == EV_SWITCH and 0 in (ev.prev_pid, ev.next_pid):
                self.pids.add(ev.prev_pid or ev.next_pid)
        self.pids.discard(0)

    def selected(self, pid: int, tgid: int) -> bool:
        return self.everything or pid in self.pids or tgid in self._tgids


def runs(events: list[Event], selection: Selection) -> Iterator[Interval]:
    """The on-CPU runs that count under `selection` (see Selection; its `rule` says which)."""
    for iv in on_cpu_intervals(events):
        if selection.everything or (
            iv.end_state is not None and selection.selected(iv.pid, iv.tgid)
        ):
            yield iv
