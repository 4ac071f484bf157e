import io
import json
import re

import pytest
from trace_samples import (
    PID_FILTER,
    R,
    S,
    filtered_events,
    sample_events,
    sample_header,
    switch,
    wakeup,
)

from xhagent.trace.export import (
    CPU_TRACKS_PID,
    chrome_events,
    ftrace_line,
    perf_line,
    state_str,
    write_chrome,
    write_ftrace,
    write_perf,
)
from xhagent.trace.fmt import EV_WAKEUP, EV_WAKING, TraceFile, write_trace

# perf script's layout: comm (right-aligned 16), tid, [cpu], secs.usecs: sched:EVENT: payload
PERF_LINE = re.compile(r"^ {0,15}\S.{0,15} +\d+ \[\d{3}\] +\d+\.\d{6}: sched:(\w+): (.*)$")
# /sys/kernel/tracing/trace: TASK-PID [CPU] flags TIMESTAMP: EVENT: payload
FTRACE_LINE = re.compile(
    r"^ *(.+)-(\d+) +\[(\d{3})\] [dN.][.Nn][.hHsS][0-9.][0-9.] +\d+\.\d{6}: (\w+): (.*)$"
)
# the kernel's TP_printk for each event (tracefs events/sched/*/format)
PAYLOAD = {
    "sched_switch": re.compile(
        r"^prev_comm=.* prev_pid=\d+ prev_prio=-?\d+ "
        r"prev_state=(R\+?|[SDTtXZPI](\|[SDTtXZPI])*\+?) "
        r"==> next_comm=.* next_pid=\d+ next_prio=-?\d+$"
    ),
    "sched_wakeup": re.compile(r"^comm=.* pid=\d+ prio=-?\d+ target_cpu=\d{3}$"),
    "sched_waking": re.compile(r"^comm=.* pid=\d+ prio=-?\d+ target_cpu=\d{3}$"),
    "sched_wakeup_new": re.compile(r"^comm=.* pid=\d+ prio=-?\d+ target_cpu=\d{3}$"),
    "sched_process_exit": re.compile(r"^comm=.* pid=\d+ prio=-?\d+ group_dead=(true|false)$"),
    "sched_process_fork": re.compile(r"^comm=.* pid=\d+ child_comm=.* child_pid=\d+$"),
}


def trace(tmp_path):
    path = tmp_path / "t.xht"
    write_trace(path, sample_header(), sample_events())
    return TraceFile(path)


def test_state_letters_match_tp_printk():
    assert state_str(0) == "R"
    assert state_str(0x100) == "R+"
    assert state_str(1) == "S"
    assert state_str(3) == "S|D"
    assert state_str(0x80) == "I"
    assert state_str(0x10) == "X"


def test_perf_lines(tmp_path):
    out = io.StringIO()
    assert write_perf(trace(tmp_path), out) == len(sample_events())
    lines = out.getvalue().splitlines()
    for line in lines:
        m = PERF_LINE.match(line)
        assert m, line
        assert PAYLOAD[m.group(1)].match(m.group(2)), line
    assert lines[3] == (
        "            ping   100 [000]     0.003000: sched:sched_switch: prev_comm=ping "
        "prev_pid=100 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120"
    )
    assert lines[0].startswith("         swapper     0 [000]")


def test_ftrace_lines(tmp_path):
    out = io.StringIO()
    write_ftrace(trace(tmp_path), out)
    text = out.getvalue()
    assert text.startswith("# tracer: nop\n")
    assert "#P:2" in text
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(body) == len(sample_events())
    for line in body:
        m = FTRACE_LINE.match(line)
        assert m, line
        assert PAYLOAD[m.group(4)].match(m.group(5)), line
    assert body[0].lstrip().startswith("<idle>-0 ")
    assert "sched_switch: prev_comm=busy prev_pid=300 prev_prio=120 prev_state=R+ ==>" in text


def test_perf_line_for_each_event_type():
    for ev in sample_events():
        assert perf_line(ev) and ftrace_line(ev)


def test_chrome_trace(tmp_path):
    out = io.StringIO()
    write_chrome(trace(tmp_path), out)
    doc = json.loads(out.getvalue())
    evs = doc["traceEvents"]
    assert {e["ph"] for e in evs} <= {"X", "M", "s", "f"}
    slices = [e for e in evs if e["ph"] == "X"]
    named_threads = {
        (e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    named_procs = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    by_track: dict = {}
    for s in slices:
        assert (
            isinstance(s["ts"], (int, float))
            and isinstance(s["dur"], (int, float))
            and s["dur"] >= 0
        )
        assert (s["pid"], s["tid"]) in named_threads and s["pid"] in named_procs
        by_track.setdefault((s["pid"], s["tid"]), []).append(s)
    for track in by_track.values():
        track.sort(key=lambda s: s["ts"])
        for a, b in zip(track, track[1:], strict=False):  # neighbours
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-9
    on_cpus = cpu_slices(evs)
    # ping ran on CPU 0 from 1 ms to 3 ms, then from 6.004 ms to its exit at 9 ms
    ping = [(s["ts"], s["dur"]) for s in on_cpus if s["args"]["tid"] == 100]
    assert ping == [(1000.0, 2000.0), (6004.0, 2996.0)]
    # pong ran from 4 ms to 6 ms on CPU 1
    assert [(s["tid"], s["ts"], s["dur"]) for s in on_cpus if s["args"]["tid"] == 200] == [
        (1, 4000.0, 2000.0)
    ]
    # the same runs on each task's own track, named after the CPU they ran on
    assert [(s["name"], s["ts"], s["dur"]) for s in task_slices(evs, 100)] == [
        ("CPU 0", 1000.0, 2000.0),
        ("CPU 0", 6004.0, 2996.0),
    ]
    assert [(s["name"], s["ts"]) for s in task_slices(evs, 200)] == [("CPU 1", 4000.0)]
    assert [(s["name"], s["ts"]) for s in task_slices(evs, 300)] == [
        ("CPU 1", 1000.5),
        ("CPU 1", 6000.0),
    ]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in evs
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    assert names[(100, 100)] == "ping" and names[(200, 200)] == "pong"
    assert names[(300, 300)] == "busy" and names[(CPU_TRACKS_PID, 0)] == "CPU 0"


def flows(evs: list[dict]) -> list[tuple]:
    """Each flow as ((track, ts) of its start, (track, ts) of its end), by id."""
    ends: dict[int, dict] = {}
    for e in evs:
        if e["ph"] in ("s", "f"):
            assert e["name"] == "wakeup" and e["cat"] == "sched"
            assert e["ph"] not in ends.setdefault(e["id"], {}), e  # one start, one end
            ends[e["id"]][e["ph"]] = ((e["pid"], e["tid"]), e["ts"], e.get("bp"))
    return [(f["s"][:2], f["f"][:2]) for _, f in sorted(ends.items()) if f["s"][2] is None]


def waking(ts, cpu, waker, waker_comm, pid, name, target):
    return wakeup(ts, cpu, waker, waker_comm, pid, name, target, EV_WAKING)


def test_chrome_wakeups_are_flows_from_the_wakers_run_to_the_woken_tasks_next():
    # sched_wakeup's current need not be the waker (a wakeup queued to an idle CPU runs
    # under its idle task): flows come from sched_waking, and a trace without it has none
    assert flows(chrome_events(sample_events())) == []
    evs = chrome_events(
        [e._replace(type=EV_WAKING) if e.type == EV_WAKEUP else e for e in sample_events()]
    )
    # ping (CPU 0, 1-3 ms) wakes pong at 2 ms, which runs on CPU 1 at 4 ms; pong wakes ping
    # at 5 ms, which runs on CPU 0 at 6.004 ms; the child forked at 7 ms never ran: no flow
    assert flows(evs) == [
        (((CPU_TRACKS_PID, 0), 2000.0), ((CPU_TRACKS_PID, 1), 4000.0)),
        (((CPU_TRACKS_PID, 1), 5000.0), ((CPU_TRACKS_PID, 0), 6004.0)),
    ]
    # each end lies within a slice of its track (a flow end binds to the enclosing slice)
    slices = cpu_slices(evs)
    for e in (e for e in evs if e["ph"] in ("s", "f")):
        assert e.get("bp") == ("e" if e["ph"] == "f" else None)
        assert any(
            s["tid"] == e["tid"] and s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in slices
        ), e


def test_chrome_a_wakeup_with_no_run_at_either_end_is_no_flow():
    ms = 1_000_000
    evs = [
        switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        switch(1 * ms, 1, 0, "swapper/1", R, 200, "pong"),
        waking(2 * ms, 1, 0, "swapper/1", 100, "ping", 0),  # from idle: no waker's run
        waking(2 * ms, 1, 200, "pong", 100, "ping", 0),  # ping still on CPU 0: not off it
        switch(3 * ms, 0, 100, "ping", S, 0, "swapper/0"),
        switch(3 * ms, 1, 200, "pong", S, 0, "swapper/1"),
        waking(4 * ms, 1, 0, "swapper/1", 100, "ping", 0),  # from an interrupt on idle
        switch(5 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        waking(5 * ms + 1000, 0, 100, "ping", 200, "pong", 1),  # the first of two: pong's flow
        waking(5 * ms + 2000, 0, 100, "ping", 200, "pong", 1),
        switch(6 * ms, 1, 0, "swapper/1", R, 200, "pong"),
        switch(7 * ms, 0, 100, "ping", S, 0, "swapper/0"),
        switch(8 * ms, 1, 200, "pong", S, 0, "swapper/1"),
    ]
    assert flows(chrome_events(evs)) == [
        (((CPU_TRACKS_PID, 0), 5001.0), ((CPU_TRACKS_PID, 1), 6000.0)),
    ]
    # under a filter on ping alone, pong's runs are not shown: the flow has no end
    assert flows(chrome_events(evs, {"kind": "pids", "pids": [100]})) == []


def test_chrome_skips_runs_without_a_start():
    # the first switch on a CPU shows only its end: no slice is invented for it
    evs = sample_events()
    assert all(e["args"]["tid"] != 0 for e in cpu_slices(chrome_events(evs)))
    assert all(e["tid"] != 0 for e in chrome_events(evs) if e["ph"] == "X" and e["pid"] != 0)


def test_chrome_other_data_holds_json_values_not_python_reprs(tmp_path):
    out = io.StringIO()
    write_chrome(trace(tmp_path), out)
    other = json.loads(out.getvalue())["otherData"]
    assert other["filter"] == {"kind": "all"} and other["ncpus"] == 2


def test_chrome_slices_under_a_filter_are_the_runs_stats_counts():
    evs = chrome_events(filtered_events(), PID_FILTER)
    runs = [(100, 1000.0, 2000.0), (100, 200000.0, 50000.0)]
    assert [(s["args"]["tid"], s["ts"], s["dur"]) for s in cpu_slices(evs)] == runs
    assert [(s["tid"], s["ts"], s["dur"]) for s in evs if s["ph"] == "X" and s["pid"]] == runs


def cpu_slices(evs: list[dict]) -> list[dict]:
    return [e for e in evs if e["ph"] == "X" and e["pid"] == CPU_TRACKS_PID]


def task_slices(evs: list[dict], pid: int) -> list[dict]:
    return sorted(
        (e for e in evs if e["ph"] == "X" and e["tid"] == pid and e["pid"] != CPU_TRACKS_PID),
        key=lambda e: e["ts"],
    )


def speedscope_nesting(slices: list[dict]) -> list[tuple[float, float]]:
    """Overlaps between neighbours on one track as speedscope computes them: every ts
    shifted by the track's first, each end taken as ts + dur, all in doubles."""
    slices = sorted(slices, key=lambda e: e["ts"])
    first = slices[0]["ts"]
    bad = []
    for a, b in zip(slices, slices[1:], strict=False):
        end, start = (a["ts"] - first) + a["dur"], b["ts"] - first
        if end > start:
            bad.append((end, start))
    return bad


@pytest.mark.parametrize("uptime_days", [0.3, 40, 150, 2000])
def test_chrome_back_to_back_runs_do_not_nest_in_speedscope(uptime_days):
    # two tasks taking turns on one CPU at arbitrary nanoseconds: each run ends exactly
    # where the next begins, which a viewer rebuilding begin/end pairs must see as equal
    base = int(uptime_days * 86400e9) + 123_456_789
    evs = [switch(base, 0, 0, "swapper/0", R, 100, "ping")]
    ts, prev, step = base, 100, 0
    for _ in range(400):
        step = (step * 7919 + 104_729) % 999_983 + 1  # irregular, ns resolution
        ts += step
        nxt = 200 if prev == 100 else 100
        evs.append(switch(ts, 0, prev, "ping" if prev == 100 else "pong", S, nxt, "x"))
        prev = nxt
    out = chrome_events(evs)
    for track in ((0, 0), (100, 100), (200, 200)):
        slices = [e for e in out if e["ph"] == "X" and (e["pid"], e["tid"]) == track]
        assert len(slices) >= 199
        assert speedscope_nesting(slices) == []
    # still nanosecond-close to the recorded times (the grid is 2^-10 us up to ~101 days)
    cpu = cpu_slices(out)
    tolerance_us = 0.0005 if uptime_days < 100 else 0.05
    assert all(
        abs(s["ts"] - e.ts_ns / 1000) <= tolerance_us for s, e in zip(cpu, evs, strict=False)
    )
