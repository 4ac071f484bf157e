"""Multi-level queues: levels by affinity label; hot work never waits behind cold work."""

from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.sched.job import Job
from xhagent.sched.mlq import Level, MultiLevel
from xhagent.sched.simulator import NodeSpec, Simulation


def test_first_matching_labelled_level_wins_and_unlabelled_jobs_fall_back():
    mlq = MultiLevel(
        (Level("hot", {"tier": "hot"}), Level("normal"), Level("cold", {"tier": "cold"}))
    )
    assert mlq.name_of(Job("a", affinity={"tier": "hot", "zone": "z1"})) == "hot"
    assert mlq.name_of(Job("b", affinity={"tier": "cold"})) == "cold"
    assert mlq.name_of(Job("c", affinity={"tier": "warm"})) == "normal"
    assert mlq.name_of(Job("d")) == "normal"
    only_labelled = MultiLevel((Level("gpu", {"dev": "gpu"}), Level("cpu", {"dev": "cpu"})))
    assert only_labelled.name_of(Job("e")) == "cpu"


@st.composite
def arrivals(draw, tier):
    return [
        Job(
            f"{tier}{i}",
            draw(st.integers(0, 50)),
            draw(st.integers(1, 20)),
            affinity={"tier": tier},
        )
        for i in range(draw(st.integers(1 if tier == "hot" else 0, 6)))
    ]


@settings(max_examples=150, deadline=None)
@given(arrivals("hot"), arrivals("cold"), st.integers(1, 2))
def test_hot_jobs_finish_exactly_as_if_no_cold_job_existed(hot, cold, cpus):
    nodes = [NodeSpec("n", cpus=cpus)]
    alone = {r.job.name: r.finish_ns for r in Simulation(hot, nodes, "mlq").run().records}
    mixed = {r.job.name: r.finish_ns for r in Simulation(hot + cold, nodes, "mlq").run().records}
    assert {n: mixed[n] for n in alone} == alone
