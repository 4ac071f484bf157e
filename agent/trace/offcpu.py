"""Off-CPU time by stack, as libbpf-tools' offcputime counts it: from a task's switch-out
to its next switch-in (blocked, then waiting on a run queue), summed per task and stack at
the switch-out (trace record --stacks kernel|user|both: its kernel frames, then its user
frames). Pure: events in, figures out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .fmt import EV_SWITCH, Event, comm
from .intervals import Selection, by_time
from .stacks import Frame, Stacks


@dataclass(frozen=True)
class OffCpu:
    comm: str
    pid: int
    tgid: int
    frames: tuple[Frame, ...]  # its stack, innermost first: kernel, then user; () for none
    total_ns: int
    count: int

    def to_json(self) -> dict:
        return {
            "comm": self.comm,
            "pid": self.pid,
            "tgid": self.tgid,
            "frames": [f.symbol for f in self.frames],
            "off_cpu_us": self.total_ns // 1000,
            "count": self.count,
        }


def off_cpu(
    events: Iterable[Event],
    stacks: Stacks,
    pids: Iterable[int] = (),
    min_ns: int = 1000,
    filt: dict | None = None,
) -> list[OffCpu]:
    """Per (task, stack): off-CPU time of each block at least `min_ns` long, of the tasks
    whose pid or tgid is in `pids` (all when empty) among those the trace's filter `filt`
    selected (a switch with an unselected task on one side tells nothing of its other
    switches); most time first. A switch-out with no switch-in after it in the trace (still
    off CPU at its end) is not counted, nor is the idle task."""
    events = list(events)
    selection = Selection(events, filt)
    wanted = set(pids)
    out_at: dict[int, Event] = {}
    totals: dict[tuple[str, int, int, int], list[int]] = {}
    for ev in by_time(events):
        if ev.type != EV_SWITCH:
            continue
        if ev.prev_pid:
            out_at[ev.prev_pid] = ev
        went = out_at.pop(ev.next_pid, None) if ev.next_pid else None
        if went is None:
            continue
        took = ev.ts_ns - went.ts_ns
        if took < min_ns or (wanted and not {went.prev_pid, went.prev_tgid} & wanted):
            continue
        if not selection.selected(went.prev_pid, went.prev_tgid):
            continue
        key = (comm(went.prev_comm), went.prev_pid, went.prev_tgid, went.aux, went.ustack)
        acc = totals.setdefault(key, [0, 0])
        acc[0] += took
        acc[1] += 1
    out = [
        OffCpu(name, pid, tgid, tuple(stacks.of(aux, ustack, tgid)), total, n)
        for (name, pid, tgid, aux, ustack), (total, n) in totals.items()
    ]
    return sorted(out, key=lambda o: (-o.total_ns, o.pid, [f.symbol for f in o.frames]))


def folded_lines(blocks: Iterable[OffCpu]) -> list[str]:
    """FlameGraph's folded stacks, `comm;outermost;...;innermost microseconds`, one line per
    distinct comm and stack (tasks of one name merged, as stackcollapse-perf.pl merges them).
    Frames are symbols, without offsets; a block under a microsecond is left out."""
    merged: dict[str, int] = {}
    for b in blocks:
        names = [b.comm.replace(";", "_").replace(" ", "_") or "[unknown]"]
        names += [f.symbol for f in reversed(b.frames)]
        key = ";".join(names)
        merged[key] = merged.get(key, 0) + b.total_ns
    return [f"{k} {ns // 1000}" for k, ns in sorted(merged.items()) if ns >= 1000]


def render(blocks: list[OffCpu], top: int) -> str:
    """offcputime's layout: each stack innermost first, `-  comm (pid)`, its microseconds."""
    lines = []
    for b in blocks[:top]:
        lines += [f"    {f.symbol}" for f in b.frames] or ["    [no stack]"]
        lines.append(f"    {'-':<16} {b.comm} ({b.pid})")
        lines.append(f"        {b.total_ns // 1000} us in {b.count} blocks")
        lines.append("")
    total = sum(b.total_ns for b in blocks)
    left = len(blocks) - min(top, len(blocks))
    lines.append(
        f"{total // 1000} us off CPU in {sum(b.count for b in blocks)} blocks, "
        f"{len(blocks)} stacks" + (f" ({left} not shown, --top)" if left else "")
    )
    return "\n".join(lines)


def in_cgroup(meta: dict, cgroup: str) -> set[int] | None:
    """The processes of a trace that were in `cgroup` (a cgroup v2 path as /proc/PID/cgroup
    names it: "/a/b") or below it when its recorder last saw them (`stacks.cgroups`); None
    when the trace records none (recorded without stacks, or a task's trace)."""
    seen = (meta.get("stacks") or {}).get("cgroups") or {}
    if not seen:
        return None
    base = cgroup.rstrip("/") or "/"
    under = base if base == "/" else base + "/"
    return {
        tgid
        for path, tgids in seen.items()
        if path == base or path.startswith(under) or base == "/"
        for tgid in tgids
    }
