"""Trace exports: `perf script` text, ftrace text (as /sys/kernel/tracing/trace
prints it; Perfetto imports it), and Chrome Trace Event JSON with one track per CPU.
Payloads follow the kernel's TP_printk for each event."""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import IO

from .fmt import (
    EV_EXIT,
    EV_FORK,
    EV_SWITCH,
    EV_WAKEUP,
    EV_WAKEUP_NEW,
    EV_WAKING,
    EVENT_NAMES,
    Event,
    TraceFile,
    comm,
)
from .intervals import Interval, Selection, runs
from .stacks import StackFrames

FORMATS = ("perf", "ftrace", "chrome", "folded")
# sched_switch's __print_flags table; 0x100 (TASK_REPORT_MAX) is preemption: "+"
STATE_FLAGS = (
    (0x01, "S"),
    (0x02, "D"),
    (0x04, "T"),
    (0x08, "t"),
    (0x10, "X"),
    (0x20, "Z"),
    (0x40, "P"),
    (0x80, "I"),
)


def state_str(prev_state: int) -> str:
    bits = prev_state & 0xFF
    text = "|".join(letter for bit, letter in STATE_FLAGS if bits & bit) if bits else "R"
    return text + ("+" if prev_state & 0x100 else "")


def payload(ev: Event) -> str:
    if ev.type == EV_SWITCH:
        return (
            f"prev_comm={comm(ev.prev_comm)} prev_pid={ev.prev_pid} prev_prio={ev.prev_prio} "
            f"prev_state={state_str(ev.prev_state)} ==> next_comm={comm(ev.next_comm)} "
            f"next_pid={ev.next_pid} next_prio={ev.next_prio}"
        )
    if ev.type in (EV_WAKING, EV_WAKEUP, EV_WAKEUP_NEW):
        return (
            f"comm={comm(ev.next_comm)} pid={ev.next_pid} prio={ev.next_prio} "
            f"target_cpu={ev.aux:03d}"
        )
    if ev.type == EV_EXIT:
        return (
            f"comm={comm(ev.prev_comm)} pid={ev.prev_pid} prio={ev.prev_prio} "
            f"group_dead={'true' if ev.aux else 'false'}"
        )
    if ev.type == EV_FORK:
        return (
            f"comm={comm(ev.prev_comm)} pid={ev.prev_pid} child_comm={comm(ev.next_comm)} "
            f"child_pid={ev.next_pid}"
        )
    raise ValueError(f"unknown event type {ev.type}")


def _seconds(ts_ns: int) -> str:
    return f"{ts_ns // 1_000_000_000:5d}.{ts_ns % 1_000_000_000 // 1000:06d}"


def perf_line(ev: Event, callchain: bool = False) -> str:
    # the sample's task is `current`: prev (switch), the waker, the exiting task, the parent;
    # perf pads its name to 16 columns, except where samples have call chains
    name = "swapper" if ev.prev_pid == 0 else comm(ev.prev_comm)
    task = name if callchain else f"{name:>16}"
    return (
        f"{task} {ev.prev_pid:5d} [{ev.cpu:03d}] {_seconds(ev.ts_ns)}: "
        f"sched:{EVENT_NAMES[ev.type]}: {payload(ev)}"
    )


FTRACE_HEADER = """\
# tracer: nop
#
# entries-in-buffer/entries-written: {n}/{n}   #P:{ncpu}
#
#                                _-----=> irqs-off/BH-disabled
#                               / _----=> need-resched
#                              | / _---=> hardirq/softirq
#                              || / _--=> preempt-depth
#                              ||| / _-=> migrate-disable
#                              |||| /     delay
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
"""


def ftrace_line(ev: Event) -> str:
    name = "<idle>" if ev.prev_pid == 0 else comm(ev.prev_comm)
    # the scheduler runs these tracepoints with interrupts off and preemption disabled
    return (
        f"{name:>16}-{ev.prev_pid:<7d} [{ev.cpu:03d}] d..2. {_seconds(ev.ts_ns)}: "
        f"{EVENT_NAMES[ev.type]}: {payload(ev)}"
    )


def write_perf(trace: TraceFile, out: IO[str]) -> int:
    """`perf script`'s layout; for a trace with stacks, `perf script` of a `-g` recording:
    each event followed by its stack (a switch's, the task it switched out), a frame a line
    (`\t<addr> <symbol>+0x<offset> (<module>)`, innermost first), and a blank line."""
    stacks = trace.stacks()
    n = 0
    for ev in trace:
        out.write(perf_line(ev, bool(stacks)) + "\n")
        if stacks:
            frames = stacks.of(ev.aux, ev.ustack, ev.prev_tgid) if ev.type == EV_SWITCH else ()
            out.write("".join(f"\t{f.perf()}\n" for f in frames) + "\n")
        n += 1
    return n


def write_ftrace(trace: TraceFile, out: IO[str]) -> int:
    cpus = max((ev.cpu for ev in trace), default=0) + 1
    out.write(FTRACE_HEADER.format(n=len(trace), ncpu=trace.header.meta.get("ncpus", cpus)))
    n = 0
    for ev in trace:
        out.write(ftrace_line(ev) + "\n")
        n += 1
    return n


CPU_TRACKS_PID = 0  # the pseudo-process that holds one thread (track) per CPU
# Finest timestamp grid: 2^-10 us (~1 ns), coarser only past ~101 days of uptime.
MAX_GRID_BITS = 10


def _grid_bits(max_ns: int) -> int:
    """Bits of binary fraction for microsecond timestamps up to max_ns, such that every
    ts, dur and ts + dur stays an integer below 2^53 units: exact in a double. Viewers
    that rebuild begin/end pairs from ts + dur (speedscope) then see a slice end exactly
    where the next one on its track begins; decimal microseconds (x.yyy) drift by an ulp,
    and a slice ending an ulp late swallows its successor as a child."""
    bits = MAX_GRID_BITS
    while bits > 0 and (max_ns << bits) // 1000 >= 1 << 53:
        bits -= 1
    return bits


def chrome_events(
    events: Iterable[Event],
    filt: dict | None = None,
    stacks: dict | None = None,
    frames: StackFrames | None = None,
) -> list[dict]:
    """Trace Event JSON: an `X` slice per on-CPU interval on track tid=cpu of the
    pseudo-process "CPUs", and the same run again on the task's own track (pid=tgid,
    tid=pid, the slice named after its CPU); `M` events name every process and track; a
    wakeup is a flow (`s` -> `f`) from the waker's run to the woken task's next run, both
    on the CPU tracks (wakeup_flows). With a filter (`filt`, the trace's), slices are the
    runs `trace stats` counts (Selection). Timestamps are microseconds on a binary grid
    (_grid_bits). With `stacks` (the trace's) and `frames`, a run that ended in a switch-out
    with a stack carries it as its end stack (`esf`, a node that `frames` keeps)."""
    events = list(events)
    bits = _grid_bits(max((ev.ts_ns for ev in events), default=0))
    scale = float(1 << bits)

    def us(ns: int) -> int:  # grid units, rounded to nearest
        return ((ns << bits) + 500) // 1000

    out: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": CPU_TRACKS_PID,
            "tid": 0,
            "args": {"name": "CPUs"},
        }
    ]
    cpus = sorted({ev.cpu for ev in events})
    for cpu in cpus:
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": CPU_TRACKS_PID,
                "tid": cpu,
                "args": {"name": f"CPU {cpu}"},
            }
        )
        out.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": CPU_TRACKS_PID,
                "tid": cpu,
                "args": {"sort_index": cpu},
            }
        )
    slices: list[dict] = []
    names: dict[tuple[int, int], str] = {}  # (tgid, pid) -> its latest comm
    shown = [iv for iv in runs(events, Selection(events, filt)) if iv.pid != 0]
    for iv in shown:  # idle is the absence of a slice
        start, end = us(iv.start_ns), us(iv.end_ns)
        ts, dur = start / scale, (end - start) / scale
        state = state_str(iv.end_state) if iv.end_state is not None else "?"
        esf = None
        if stacks and frames is not None:
            esf = frames.node(stacks.of(iv.end_stack, iv.end_ustack, iv.tgid))
        ends = {"esf": esf} if esf else {}
        slices.append(
            {
                "ph": "X",
                "name": iv.comm,
                "cat": "sched",
                "pid": CPU_TRACKS_PID,
                "tid": iv.cpu,
                "ts": ts,
                "dur": dur,
                "args": {"pid": iv.tgid, "tid": iv.pid, "comm": iv.comm, "end_state": state},
                **ends,
            }
        )
        # the task's track: when and where it ran; args kept short, as speedscope shows
        # them in each frame's name
        slices.append(
            {
                "ph": "X",
                "name": f"CPU {iv.cpu}",
                "cat": "sched",
                "pid": iv.tgid,
                "tid": iv.pid,
                "ts": ts,
                "dur": dur,
                "args": {"end_state": state},
                **ends,
            }
        )
        names[(iv.tgid, iv.pid)] = iv.comm
    for tgid in sorted({tgid for tgid, _ in names}):
        # a process is named after its main thread, or its lowest tid when that never ran
        leader = names.get((tgid, tgid)) or names[min(k for k in names if k[0] == tgid)]
        out.append(
            {"ph": "M", "name": "process_name", "pid": tgid, "tid": tgid, "args": {"name": leader}}
        )
    for (tgid, pid), name in sorted(names.items()):
        out.append(
            {"ph": "M", "name": "thread_name", "pid": tgid, "tid": pid, "args": {"name": name}}
        )
    flows: list[dict] = []
    for n, (waker, woken, ts_ns) in enumerate(wakeup_flows(events, shown), start=1):
        for ph, iv, at in (("s", waker, ts_ns), ("f", woken, woken.start_ns)):
            flows.append(
                {
                    "ph": ph,
                    "id": n,
                    "name": "wakeup",
                    "cat": "sched",
                    "pid": CPU_TRACKS_PID,
                    "tid": iv.cpu,
                    "ts": us(at) / scale,
                    **({"bp": "e"} if ph == "f" else {}),  # the slice it lies in, not the next
                }
            )
    return out + slices + flows


def wakeup_flows(
    events: Iterable[Event], shown: list[Interval]
) -> list[tuple[Interval, Interval, int]]:
    """(the waker's run, the woken task's next run, the wakeup's time) for each sched_waking
    whose two ends are runs the export shows. sched_waking, not sched_wakeup: only it is
    recorded in the waker's context (a wakeup queued to an idle CPU completes there, under
    the idle task), so a trace without it has no flows. A wakeup from idle or an interrupt
    on an idle CPU, or by or of a task outside the filter, has no slice to start or end at.
    A run is the end of one flow at most, the first wakeup before it (a later one found it
    runnable already)."""
    by_cpu: dict[int, list[Interval]] = {}
    by_pid: dict[int, list[Interval]] = {}
    for iv in sorted(shown, key=lambda iv: iv.start_ns):
        by_cpu.setdefault(iv.cpu, []).append(iv)
        by_pid.setdefault(iv.pid, []).append(iv)
    starts = {cpu: [iv.start_ns for iv in ivs] for cpu, ivs in by_cpu.items()}
    pid_starts = {pid: [iv.start_ns for iv in ivs] for pid, ivs in by_pid.items()}
    wakeups = sorted((ev for ev in events if ev.type == EV_WAKING), key=lambda e: e.ts_ns)
    flows: list[tuple[Interval, Interval, int]] = []
    ended: set[tuple[int, int]] = set()  # (pid, index in by_pid) of the runs a flow ends at
    for ev in wakeups:
        own = by_pid.get(ev.next_pid, [])
        i = bisect_left(pid_starts.get(ev.next_pid, []), ev.ts_ns)
        # a task woken still on its CPU (before it could switch out) never left it
        if i == len(own) or (ev.next_pid, i) in ended or (i and own[i - 1].end_ns > ev.ts_ns):
            continue
        j = bisect_right(starts.get(ev.cpu, []), ev.ts_ns)
        waker = by_cpu[ev.cpu][j - 1] if j else None
        if waker is None or waker.pid != ev.prev_pid or waker.end_ns < ev.ts_ns:
            continue
        ended.add((ev.next_pid, i))
        flows.append((waker, own[i], ev.ts_ns))
    return flows


def write_chrome(trace: TraceFile, out: IO[str]) -> int:
    frames = StackFrames()
    evs = chrome_events(trace, trace.header.meta.get("filter"), trace.stacks(), frames)
    # the metadata came from JSON (fmt.TraceFile checks it): its values stay JSON values
    doc = {"traceEvents": evs, "displayTimeUnit": "ms", "otherData": trace.header.meta}
    if frames.nodes:
        doc["stackFrames"] = frames.nodes
    json.dump(doc, out)
    return len(evs)


def write_folded(trace: TraceFile, out: IO[str]) -> int:
    """Folded stacks weighted by off-CPU microseconds (offcpu.py), for flame graphs."""
    from .offcpu import folded_lines, off_cpu

    filt = trace.header.meta.get("filter")
    lines = folded_lines(off_cpu(trace, trace.stacks(), min_ns=0, filt=filt))
    out.write("".join(line + "\n" for line in lines))
    return len(lines)


WRITERS = {
    "perf": write_perf,
    "ftrace": write_ftrace,
    "chrome": write_chrome,
    "folded": write_folded,
}
