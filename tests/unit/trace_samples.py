"""Synthetic traces for the trace unit tests: two CPUs, two ping-pong tasks."""

from xhagent.trace.fmt import EV_EXIT, EV_FORK, EV_SWITCH, EV_WAKEUP, EV_WAKEUP_NEW, Event, Header

S, R, PREEMPTED = 1, 0, 0x100


def c(name: str) -> bytes:
    return name.encode().ljust(16, b"\0")


def switch(ts, cpu, prev, prev_comm, state, nxt, next_comm, prio=120):
    return Event(
        ts,
        cpu,
        EV_SWITCH,
        0,
        prev,
        prev,
        nxt,
        nxt,
        prio if prev else 120,
        prio if nxt else 120,
        state,
        0,
        c(prev_comm),
        c(next_comm),
    )


def wakeup(ts, cpu, waker, waker_comm, pid, name, target, kind=EV_WAKEUP):
    return Event(
        ts, cpu, kind, 0, waker, waker, pid, pid, 120, 120, 0, target, c(waker_comm), c(name)
    )


def sample_events() -> list[Event]:
    """ping (100) on cpu0 and pong (200) on cpu1, each blocking in turn; times in ns."""
    ms = 1_000_000
    return [
        switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        switch(1 * ms + 500, 1, 0, "swapper/1", R, 300, "busy"),
        wakeup(2 * ms, 0, 100, "ping", 200, "pong", 1),
        switch(3 * ms, 0, 100, "ping", S, 0, "swapper/0"),
        switch(4 * ms, 1, 300, "busy", PREEMPTED, 200, "pong"),  # 2 ms run-queue wait
        wakeup(5 * ms, 1, 200, "pong", 100, "ping", 0),
        switch(6 * ms, 1, 200, "pong", S | 0x2, 300, "busy"),  # S|D, for the flags
        switch(6 * ms + 4000, 0, 0, "swapper/0", R, 100, "ping"),  # 1 ms 4 us wait
        Event(7 * ms, 0, EV_FORK, 0, 100, 100, 101, 101, 120, 120, 0, 0, c("ping"), c("ping")),
        wakeup(7 * ms + 10, 0, 100, "ping", 101, "ping", 1, EV_WAKEUP_NEW),
        Event(8 * ms, 0, EV_EXIT, 0, 100, 100, 0, 0, 120, 0, 0, 1, c("ping"), c("")),
        switch(9 * ms, 0, 100, "ping", 0x10, 0, "swapper/0"),
        switch(10 * ms, 1, 300, "busy", R, 0, "swapper/1"),
    ]


def sample_header() -> Header:
    return Header(
        clock_offset_ns=1_700_000_000_000_000_000,
        meta={"filter": {"kind": "all"}, "hostname": "h", "kernel": "6.18", "ncpus": 2},
    )


def trace_bytes(
    header: Header | None = None, events: list[Event] | None = None, complete: bool = True
) -> bytes:
    """A trace file's bytes; `header.meta` may be any JSON value (to craft bad files)."""
    from xhagent.trace.fmt import RECORD

    h = header or sample_header()
    events = sample_events() if events is None else events
    h.records, h.complete = (len(events), True) if complete else (0, False)
    return h.encode() + b"".join(RECORD.pack(*e) for e in events)


def filtered_events() -> list[Event]:
    """As a `--pid 100` trace records it: ping (100) gives CPU 0 to migration/0 (15) at
    3 ms; what runs on CPU 0 after that, until ping is back at 200 ms, involves no
    traced task and is not recorded; the trace ends at 300 ms with ping still running."""
    ms = 1_000_000
    return [
        switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        switch(3 * ms, 0, 100, "ping", PREEMPTED, 15, "migration/0"),
        # unrecorded: migration/0 -> kworker -> ... -> swapper/0
        wakeup(150 * ms, 1, 0, "swapper/1", 100, "ping", 0),
        switch(200 * ms, 0, 15, "migration/0", S, 100, "ping"),
        switch(250 * ms, 0, 100, "ping", S, 0, "swapper/0"),
        wakeup(300 * ms, 1, 0, "swapper/1", 100, "ping", 0),
    ]


PID_FILTER = {"kind": "pids", "pids": [100]}
