from trace_samples import sample_events

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
    assert [t["pid"] for t in doc["tasks"]][:3] == [300, 100, 200] and "raw_comm" not in doc["tasks"][0]
    assert doc["runq_latency"]["hist_us"][0] == {"low": 512, "high": 1023, "count": 1}


def test_render():
    text = render(compute(sample_events()))
    assert "run-queue latency" in text and "ping" in text
    hist = render_hist({1: 4, 3: 2})
    assert hist[0].strip().startswith("usecs") and hist[1].split(":")[0].split() == ["0", "->", "1"]
    assert hist[1].endswith("|" + "*" * 40 + "|") and "|" + "*" * 20 + " " * 20 + "|" in hist[3]
