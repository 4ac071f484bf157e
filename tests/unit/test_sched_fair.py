"""Fair share: vruntime by weight, newcomers start at the minimum, migrations cost by distance,
TWFS."""

import pytest

from xhagent.sched.fair import (
    ACCEL_SLICE_NS,
    CPU_BASE_SLICE_NS,
    MIN_SLICE_NS,
    FairShare,
    distance,
    twfs_slice_ns,
)
from xhagent.sched.job import Job, weight_of
from xhagent.sched.simulator import NodeSpec, Simulation


def test_vruntime_grows_inversely_to_weight():
    fs = FairShare()
    heavy, light = Job("heavy", priority=60), Job("light", priority=50)
    fs.enqueue(heavy), fs.enqueue(light)
    fs.charge(heavy, 1000), fs.charge(light, 1000)
    assert weight_of(60) == 2 * weight_of(50)
    assert fs.key(light) == pytest.approx(2 * fs.key(heavy))


def test_a_newcomer_starts_at_min_vruntime_not_zero():
    fs = FairShare()
    old = Job("old")
    fs.enqueue(old)
    fs.charge(old, 5_000)
    fs.advance([fs.key(old)])
    new = Job("new")
    fs.enqueue(new)
    assert fs.key(new) == fs.key(old) > 0
    fs.advance([0.0])  # min_vruntime never moves back
    assert fs.min_vruntime == fs.key(old)


def test_migration_penalty_grows_with_distance():
    fs = FairShare(migration_cost_ns=1_000)
    j = Job("j")
    fs.enqueue(j)
    here, numa, far = ("n1", 0), ("n1", 1), ("n2", 0)
    assert distance(here, here) < distance(here, numa) < distance(here, far)
    assert fs.migrate(j, here, here) == 0
    assert fs.migrate(j, here, numa) == pytest.approx(1_100)
    assert fs.migrate(j, here, far) == pytest.approx(3_000)
    assert fs.key(j) == pytest.approx(4_100)


def test_twfs_slices_cpu_by_load_accelerators_fixed_with_decaying_weight():
    cpu, gpu = Job("c"), Job("g", device="gpu")
    assert twfs_slice_ns(cpu, 1.0) == CPU_BASE_SLICE_NS
    assert twfs_slice_ns(cpu, 0.75) == int(CPU_BASE_SLICE_NS * (1 + -0.4150374992788438))
    assert twfs_slice_ns(cpu, 0.5) == MIN_SLICE_NS  # the formula gives 0 here: clamped
    assert twfs_slice_ns(cpu, 0.0) == MIN_SLICE_NS
    assert twfs_slice_ns(gpu, 0.1) == twfs_slice_ns(gpu, 1.0) == ACCEL_SLICE_NS
    fs = FairShare()
    fs.enqueue(gpu), fs.enqueue(cpu)
    fs.charge(gpu, 10), fs.charge(cpu, 10)
    assert fs.weight["g"] == pytest.approx(1024 * 0.95) and fs.weight["c"] == 1024
    for _ in range(200):
        fs.charge(gpu, 10)
    assert fs.weight["g"] == pytest.approx(102.4)


def test_fair_simulation_shares_by_weight():
    # Two long CPU jobs from time 0 on one CPU: by the time the lighter one finishes, the
    # heavier (2x weight) has had about twice the processor.
    jobs = [
        Job("heavy", 0, 2_000_000_000, priority=60),
        Job("light", 0, 2_000_000_000, priority=50),
    ]
    out = Simulation(jobs, [NodeSpec("n", cpus=1)], "fair").run()
    first_done = min(r.finish_ns for r in out.records)
    ran = {"heavy": 0, "light": 0}
    for _, name, start, end in out.intervals:
        ran[name] += max(0, min(end, first_done) - start)
    assert out.records[0].finish_ns < out.records[1].finish_ns
    assert ran["heavy"] / ran["light"] == pytest.approx(2.0, rel=0.1)
