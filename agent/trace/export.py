"""Trace exports: `perf script` text, ftrace text (as /sys/kernel/tracing/trace
prints it; Perfetto imports it), and Chrome Trace Event JSON with one track per CPU.
Payloads follow the kernel's TP_printk for each event."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO

from .fmt import (
    EV_EXIT,
    EV_FORK,
    EV_SWITCH,
    EV_WAKEUP,
    EV_WAKEUP_NEW,
    EVENT_NAMES,
    Event,
    TraceFile,
    comm,
)
from .intervals import Selection, runs

FORMATS = ("perf", "ftrace", "chrome")
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
    if ev.type in (EV_WAKEUP, EV_WAKEUP_NEW):
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


def perf_line(ev: Event) -> str:
    # the sample's task is `current`: prev (switch), the waker, the exiting task, the parent
    name = "swapper" if ev.prev_pid == 0 else comm(ev.prev_comm)
    return (
        f"{name:>16} {ev.prev_pid:5d} [{ev.cpu:03d}] {_seconds(ev.ts_ns)}: "
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
    n = 0
    for ev in trace:
        out.write(perf_line(ev) + "\n")
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


def chrome_events(events: Iterable[Event], filt: dict | None = None) -> list[dict]:
    """Trace Event JSON: an `X` slice per on-CPU interval on track tid=cpu of the
    pseudo-process "CPUs"; `M` events name it, each CPU track, and every task. With a
    filter (`filt`, the trace's), slices are the runs `trace stats` counts (Selection)."""
    events = list(events)
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
    for iv in runs(events, Selection(events, filt)):
        if iv.pid == 0:
            continue  # idle is the absence of a slice
        out.append(
            {
                "ph": "X",
                "name": iv.comm,
                "cat": "sched",
                "pid": CPU_TRACKS_PID,
                "tid": iv.cpu,
                "ts": iv.start_ns / 1000,
                "dur": (iv.end_ns - iv.start_ns) / 1000,
                "args": {
                    "pid": iv.tgid,
                    "tid": iv.pid,
                    "comm": iv.comm,
                    "end_state": state_str(iv.end_state) if iv.end_state is not None else "?",
                },
            }
        )
    return out


def write_chrome(trace: TraceFile, out: IO[str]) -> int:
    evs = chrome_events(trace, trace.header.meta.get("filter"))
    # the metadata came from JSON (fmt.TraceFile checks it): its values stay JSON values
    json.dump({"traceEvents": evs, "displayTimeUnit": "ms", "otherData": trace.header.meta}, out)
    return len(evs)


WRITERS = {"perf": write_perf, "ftrace": write_ftrace, "chrome": write_chrome}
