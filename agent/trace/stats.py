"""Statistics of a trace: per task on-CPU time and switches (voluntary: the task
blocked; involuntary: it was preempted while runnable), run-queue latency (from
wakeup, or from preemption, to running again) in log2 buckets as runqlat prints
them, and per CPU busy percentage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from .fmt import EV_SWITCH, EV_WAKEUP, EV_WAKEUP_NEW, Event, comm
from .intervals import Selection, by_time, runs


def log2_slot(value: int) -> int:
    """runqlat's bucket: 0 and 1 -> slot 1 ("0 -> 1"), 2..3 -> 2, 4..7 -> 3, ..."""
    return max(1, value.bit_length())


def slot_range(slot: int) -> tuple[int, int]:
    low, high = (1 << slot) >> 1, (1 << slot) - 1
    return (low - 1, high) if low == high else (low, high)


@dataclass
class TaskStats:
    pid: int
    tgid: int
    comm: str
    on_cpu_ns: int = 0
    switches: int = 0
    voluntary: int = 0
    involuntary: int = 0
    runq_max_ns: int = 0
    runq_hist_us: dict[int, int] = field(default_factory=dict)  # log2 slot -> count
    raw_comm: bytes = field(default=b"", repr=False)


@dataclass
class TraceStats:
    span_ns: int
    events: int
    lost: int
    tasks: dict[int, TaskStats]
    cpu_busy_pct: dict[int, float]
    runq_hist_us: dict[int, int]
    runq_max_ns: int
    filter_kind: str = "all"
    counted: str = ""  # which runs and tasks count (intervals.RULE_*)

    def to_json(self) -> dict:
        return {
            "span_ns": self.span_ns,
            "events": self.events,
            "lost": self.lost,
            "filter": self.filter_kind,
            "counted": self.counted,
            "cpus": {
                str(c): {"busy_pct": round(p, 3)} for c, p in sorted(self.cpu_busy_pct.items())
            },
            "runq_latency": {"max_ns": self.runq_max_ns, "hist_us": hist_json(self.runq_hist_us)},
            "tasks": [
                dict(
                    {k: v for k, v in asdict(t).items() if k != "raw_comm"},
                    runq_hist_us=hist_json(t.runq_hist_us),
                )
                for t in sorted(self.tasks.values(), key=lambda t: -t.on_cpu_ns)
            ],
        }


def hist_json(hist: dict[int, int]) -> list[dict]:
    return [
        {"low": slot_range(s)[0], "high": slot_range(s)[1], "count": hist[s]} for s in sorted(hist)
    ]


def compute(events: Iterable[Event], lost: int = 0, filt: dict | None = None) -> TraceStats:
    """`filt`: the trace's filter (header metadata). With one, only the tasks it selected
    are counted, and only what the records show whole (intervals.Selection)."""
    events = by_time(events)
    sel = Selection(events, filt)
    tasks: dict[int, TaskStats] = {}
    runq_hist: dict[int, int] = {}
    runq_max = 0
    runnable_since: dict[int, int] = {}

    def task(pid: int, tgid: int, raw_comm: bytes) -> TaskStats | None:
        if not sel.selected(pid, tgid):
            return None  # its switches and waits are only partly recorded
        t = tasks.get(pid)
        if t is None:
            t = tasks[pid] = TaskStats(pid, tgid, comm(raw_comm))
        elif raw_comm != t.raw_comm:  # exec or a rename: the latest name wins
            t.comm = comm(raw_comm)
        t.raw_comm = raw_comm
        return t

    for ev in events:
        if ev.type in (EV_WAKEUP, EV_WAKEUP_NEW):
            if task(ev.next_pid, ev.next_tgid, ev.next_comm):
                runnable_since.setdefault(ev.next_pid, ev.ts_ns)
        elif ev.type == EV_SWITCH:
            t = task(ev.prev_pid, ev.prev_tgid, ev.prev_comm) if ev.prev_pid else None
            if t:
                t.switches += 1
                if ev.prev_state & 0xFF:
                    t.voluntary += 1
                else:  # still runnable (R or R+): preempted, back on the run queue
                    t.involuntary += 1
                    runnable_since[ev.prev_pid] = ev.ts_ns
            t = task(ev.next_pid, ev.next_tgid, ev.next_comm) if ev.next_pid else None
            if t:
                since = runnable_since.pop(ev.next_pid, None)
                if since is not None and ev.ts_ns >= since:
                    lat = ev.ts_ns - since
                    slot = log2_slot(lat // 1000)
                    t.runq_hist_us[slot] = t.runq_hist_us.get(slot, 0) + 1
                    runq_hist[slot] = runq_hist.get(slot, 0) + 1
                    t.runq_max_ns = max(t.runq_max_ns, lat)
                    runq_max = max(runq_max, lat)
    busy: dict[int, int] = {}
    for cpu in {ev.cpu for ev in events if ev.type == EV_SWITCH}:
        busy[cpu] = 0
    for iv in runs(events, sel):
        if iv.pid:
            busy[iv.cpu] += iv.end_ns - iv.start_ns
            tasks[iv.pid].on_cpu_ns += iv.end_ns - iv.start_ns
    span = events[-1].ts_ns - events[0].ts_ns if events else 0
    pct = {cpu: (100.0 * ns / span if span else 0.0) for cpu, ns in busy.items()}
    return TraceStats(
        span,
        len(events),
        lost,
        tasks,
        pct,
        runq_hist,
        runq_max,
        (filt or {}).get("kind", "all"),
        sel.rule,
    )


def render_hist(hist: dict[int, int], unit: str = "usecs") -> list[str]:
    """bcc's print_log2_hist layout."""
    if not hist:
        return [f"     {unit:<19} : count     distribution", "     (no samples)"]
    top = max(hist.values())
    lines = [f"     {unit:<19} : count     distribution"]
    for slot in range(1, max(hist) + 1):
        n = hist.get(slot, 0)
        low, high = slot_range(slot)
        stars = "*" * (n * 40 // top) if top else ""
        lines.append(f"{low:>10} -> {high:<10} : {n:<8} |{stars:<40}|")
    return lines


def render(st: TraceStats, top: int = 20) -> str:
    out = [
        f"span {st.span_ns / 1e9:.3f} s, {st.events} events, {st.lost} lost",
        f"filter {st.filter_kind}; on-CPU time and busy% count {st.counted}",
        "",
        "CPU   busy%",
    ]
    out += [f"{cpu:<5} {p:6.2f}" for cpu, p in sorted(st.cpu_busy_pct.items())]
    out += [
        "",
        f"{'PID':>7} {'TGID':>7} {'COMM':<16} {'ON-CPU ms':>10} {'SWITCHES':>9} "
        f"{'VOL':>8} {'INVOL':>8} {'RUNQ MAX us':>12}",
    ]
    for t in sorted(st.tasks.values(), key=lambda t: -t.on_cpu_ns)[:top]:
        out.append(
            f"{t.pid:>7} {t.tgid:>7} {t.comm:<16} {t.on_cpu_ns / 1e6:>10.3f} {t.switches:>9} "
            f"{t.voluntary:>8} {t.involuntary:>8} {t.runq_max_ns / 1000:>12.1f}"
        )
    if len(st.tasks) > top:
        out.append(f"... {len(st.tasks) - top} more tasks (--json lists all)")
    out += ["", f"run-queue latency (max {st.runq_max_ns / 1000:.1f} us):"] + render_hist(
        st.runq_hist_us
    )
    return "\n".join(out)
