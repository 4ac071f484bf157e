from trace_samples import PID_FILTER, R, S, c, filtered_events, sample_events, switch

from xhagent.trace.fmt import EV_FORK, Event
from xhagent.trace.intervals import RULE_ALL, RULE_FILTERED, Selection
from xhagent.trace.stats import compute, log2_slot, render, render_hist, slot_range


def test_log2_buckets_like_runqlat():
    assert [log2_slot(v) for v in (0, 1, 2, 3, 4, 7, 8, 1000)] == [1, 1, 2, 2, 3, 3, 4, 10]
    assert [slot_range(s) for s in (1, 2, 3, 10)] == [(0, 1), (2, 3), (4, 7), (512, 1023)]


def test_stats_of_sample():
    st = compute(sample_events(), lost=3)
    ping, pong, busy = st.tasks[100], st.tasks[200], st.tasks[300]
    assert ping.comm == "ping" and pong.comm == "pong"
    assert ping.on_cpu_ns == 2_000_000 + 2_996_000
    assert pong.on_cpu_ns == 2_000_000
    assert (ping.switches, ping.voluntary, ping.involuntary) == (2, 2, 0)
    assert (busy.switches, busy.voluntary, busy.involuntary) == (2, 0, 2)
    # pong: woken at 2 ms, ran at 4 ms; ping: woken at 5 ms, ran at 6.004 ms
    assert pong.runq_max_ns == 2_000_000
    assert ping.runq_max_ns == 1_004_000
    assert st.runq_max_ns == 2_000_000
    # busy: preempted (R+) at 4 ms, back on CPU 1 at 6 ms
    assert busy.runq_max_ns == 2_000_000
    assert st.runq_hist_us == {log2_slot(2000): 2, log2_slot(1004): 1}
    assert st.span_ns == 9_000_000
    assert round(st.cpu_busy_pct[0], 3) == round(100 * 4_996_000 / 9_000_000, 3)
    assert st.lost == 3
    doc = st.to_json()
    assert [t["pid"] for t in doc["tasks"]][:3] == [300, 100, 200] and "raw_comm" not in doc[
        "tasks"
    ][0]
    assert doc["runq_latency"]["hist_us"][0] == {"low": 512, "high": 1023, "count": 1}


def test_render():
    text = render(compute(sample_events()))
    assert "run-queue latency" in text and "ping" in text
    hist = render_hist({1: 4, 3: 2})
    assert hist[0].strip().startswith("usecs") and hist[1].split(":")[0].split() == ["0", "->", "1"]
    assert hist[1].endswith("|" + "*" * 40 + "|") and "|" + "*" * 20 + " " * 20 + "|" in hist[3]


def test_a_filter_counts_only_selected_tasks_and_only_whole_runs():
    # migration/0 was credited 3 ms..300 ms of CPU 0 that other, unrecorded tasks had
    st = compute(filtered_events(), filt=PID_FILTER)
    assert set(st.tasks) == {100}
    ping = st.tasks[100]
    assert ping.on_cpu_ns == 2_000_000 + 50_000_000
    assert (ping.switches, ping.voluntary, ping.involuntary) == (2, 1, 1)
    assert ping.runq_max_ns == 197_000_000  # preempted at 3 ms, back at 200 ms
    assert round(st.cpu_busy_pct[0], 3) == round(100 * 52 / 299, 3)
    doc = st.to_json()
    assert doc["filter"] == "pids" and doc["counted"] == RULE_FILTERED
    assert f"filter pids; on-CPU time and busy% count {RULE_FILTERED}" in render(st)


def test_without_a_filter_every_run_counts():
    st = compute(filtered_events())
    assert st.tasks[15].on_cpu_ns == 197_000_000 and st.to_json()["counted"] == RULE_ALL


def test_a_cgroup_filter_selects_tasks_the_records_show_selected():
    events = filtered_events()
    sel = Selection(events, {"kind": "cgroup", "cgroup_id": 4242})
    assert sel.pids == {100}  # woken, and switched to from idle; migration/0 never is
    st = compute(events, filt={"kind": "cgroup", "cgroup_id": 4242})
    assert set(st.tasks) == {100} and st.tasks[100].on_cpu_ns == 52_000_000
    # the v2 root selects everything
    assert Selection(events, {"kind": "cgroup", "cgroup_id": 1}).everything


def test_a_pid_filter_follows_forks_and_threads():
    ms = 1_000_000
    events = [
        Event(1 * ms, 0, EV_FORK, 0, 100, 100, 101, 101, 120, 120, 0, 0, c("ping"), c("child")),
        switch(2 * ms, 1, 0, "swapper/1", R, 101, "child"),
        switch(4 * ms, 1, 101, "child", S, 0, "swapper/1"),
        switch(5 * ms, 1, 0, "swapper/1", R, 300, "other"),
    ]
    threads = [
        switch(6 * ms, 0, 0, "swapper/0", R, 102, "thr")._replace(next_tgid=100),
        switch(7 * ms, 0, 102, "thr", S, 0, "swapper/0")._replace(prev_tgid=100),
    ]
    st = compute(events + threads, filt={"kind": "pids", "pids": [], "command_pid": 100})
    assert set(st.tasks) == {101, 102}  # 100 only forked; 300 is outside the filter
    assert st.tasks[101].on_cpu_ns == 2 * ms and st.tasks[102].on_cpu_ns == ms
