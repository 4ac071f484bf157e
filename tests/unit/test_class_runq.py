"""Run-queue latency by class (daemon/class_runq.py): running leaves' readings plus the
ended leaves' last ones, never going back."""

from hypothesis import given
from hypothesis import strategies as st

from xhagent.bpf.runqlat import RUNQ_SLOTS, Histogram
from xhagent.daemon.class_runq import ClassRunq


def hist(slots: dict[int, int], sum_ns: int = 0) -> Histogram:
    """A probe reading: {slot: waits} (the rest 0)."""
    return Histogram.from_slots([slots.get(k, 0) for k in range(RUNQ_SLOTS)], sum_ns)


def counts(h: Histogram) -> tuple[int, ...]:
    return tuple(n for _, n in h.buckets)


def test_a_class_sums_its_running_leaves_and_keeps_an_ended_ones_final_counts():
    runq = ClassRunq()
    runq.seen(11, "latency", hist({0: 2}, 1_000))
    runq.seen(12, "latency", hist({3: 1}, 9_000))
    runq.seen(21, "batch", hist({5: 4}, 80_000))
    got = runq.totals(["latency", "batch", "idle"])
    assert list(got) == ["batch", "idle", "latency"]  # every class given, 0 included
    assert got["latency"].count == 3 and got["latency"].sum == 10e-6
    assert got["idle"].count == 0 and got["idle"].buckets == hist({}).buckets
    assert got["batch"].buckets == hist({5: 4}).buckets
    # the leaf went: its entry read a last time, after more waits than its last scrape saw
    runq.ended(11, hist({0: 2, 1: 1}, 1_500))
    assert runq.totals([])["latency"].count == 4
    # one gone before the probe's entry could be read: its last reading stands
    runq.ended(12, None)
    assert runq.totals([])["latency"].sum == 10.5e-6
    assert runq.totals([])["latency"].count == 4  # nothing counted twice


def test_a_reading_below_the_last_and_an_unknown_end_change_nothing():
    runq = ClassRunq()
    runq.seen(7, "batch", hist({2: 3}, 5_000))
    before = runq.totals([])
    runq.seen(7, "batch", hist({2: 1}, 9_000))  # a bucket went back: not this leaf's growth
    assert runq.totals([]) == before
    runq.seen(7, "latency", hist({2: 3}, 5_000))  # a leaf's class is its first one
    assert runq.totals([]) == before
    runq.ended(99, hist({0: 5}, 1))  # never seen: no class to put it in
    assert runq.totals([]) == before


def test_sums_move_from_running_to_ended_exactly():
    runq = ClassRunq()
    # sums whose seconds do not add up exactly in floating point
    for cgid, sum_ns in enumerate((100_000_001, 200_000_003, 300_000_007)):
        runq.seen(cgid, "c", hist({0: 1}, sum_ns))
    running = runq.totals([])["c"].sum
    for cgid in range(3):
        runq.ended(cgid, None)
        assert runq.totals([])["c"].sum == running == 0.600000011


readings = st.dictionaries(
    st.integers(0, RUNQ_SLOTS - 1), st.integers(0, 10**6), max_size=RUNQ_SLOTS
).flatmap(lambda slots: st.tuples(st.just(slots), st.integers(0, 10**17)))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("seen"), st.integers(0, 5), st.sampled_from("ab"), readings),
        st.tuples(st.just("ended"), st.integers(0, 5), st.none(), st.none() | readings),
    ),
    max_size=40,
)


@given(steps)
def test_no_bucket_count_or_sum_of_a_class_ever_goes_back(steps):
    runq = ClassRunq()
    last: dict = {}
    for what, cgid, task_class, reading in steps:
        h = hist(*reading) if reading is not None else None
        if what == "seen":
            runq.seen(cgid, task_class, h)
        else:
            runq.ended(cgid, h)
        now = runq.totals(["a"])
        for c, before in last.items():
            assert now[c].sum >= before.sum
            assert all(n >= m for n, m in zip(counts(now[c]), counts(before), strict=True))
            assert now[c].count == counts(now[c])[-1]
        last = now
