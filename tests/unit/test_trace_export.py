import io
import json
import re

from trace_samples import PID_FILTER, filtered_events, sample_events, sample_header

from xhagent.trace.export import (
    chrome_events,
    ftrace_line,
    perf_line,
    state_str,
    write_chrome,
    write_ftrace,
    write_perf,
)
from xhagent.trace.fmt import TraceFile, write_trace

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
    assert {e["ph"] for e in evs} <= {"X", "M"}
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
    # ping ran on CPU 0 from 1 ms to 3 ms, then from 6.004 ms to its exit at 9 ms
    ping = [(s["ts"], s["dur"]) for s in slices if s["args"]["tid"] == 100]
    assert ping == [(1000.0, 2000.0), (6004.0, 2996.0)]
    # pong ran from 4 ms to 6 ms on CPU 1
    assert [(s["tid"], s["ts"], s["dur"]) for s in slices if s["args"]["tid"] == 200] == [
        (1, 4000.0, 2000.0)
    ]


def test_chrome_skips_runs_without_a_start():
    # the first switch on a CPU shows only its end: no slice is invented for it
    evs = sample_events()
    assert all(e["args"]["tid"] != 0 for e in chrome_events(evs) if e["ph"] == "X")


def test_chrome_other_data_holds_json_values_not_python_reprs(tmp_path):
    out = io.StringIO()
    write_chrome(trace(tmp_path), out)
    other = json.loads(out.getvalue())["otherData"]
    assert other["filter"] == {"kind": "all"} and other["ncpus"] == 2


def test_chrome_slices_under_a_filter_are_the_runs_stats_counts():
    slices = [e for e in chrome_events(filtered_events(), PID_FILTER) if e["ph"] == "X"]
    assert [(s["args"]["tid"], s["ts"], s["dur"]) for s in slices] == [
        (100, 1000.0, 2000.0),
        (100, 200000.0, 50000.0),
    ]
