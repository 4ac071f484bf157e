"""Priority-inversion compensation: the holder runs with the waiter's deadline, then its own."""

from pathlib import Path

from xhagent.sched import workload
from xhagent.sched.job import Job
from xhagent.sched.pic import ResourceTable
from xhagent.sched.simulator import NodeSpec, Simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"


def test_holder_inherits_the_waiters_deadline_until_it_releases():
    low = Job("low", deadline_ns=100, holds=frozenset({"bus"}))
    high = Job("high", deadline_ns=10, holds=frozenset({"bus"}))
    table = ResourceTable()
    assert table.acquire(low)
    assert table.effective_deadline(low) == 100
    assert not table.acquire(high)
    assert table.blockers(high) == {"bus"}
    assert table.effective_deadline(low) == 10
    assert table.holders_boosted_by(high) == [low]
    assert table.release(low) == [high]
    assert table.effective_deadline(low) == 100
    assert table.acquire(high) and table.effective_deadline(high) == 10


def test_boost_is_the_earliest_waiter_and_follows_chains():
    holder = Job("h", deadline_ns=500, holds=frozenset({"a"}))
    w1 = Job("w1", deadline_ns=300, holds=frozenset({"a"}))
    w2 = Job("w2", deadline_ns=200, holds=frozenset({"a"}))
    table = ResourceTable()
    table.acquire(holder)
    table.acquire(w1), table.acquire(w2)
    assert table.effective_deadline(holder) == 200
    # An incremental locker: x holds b and waits for a; y waits for b with deadline 50.
    x = Job("x", deadline_ns=900, holds=frozenset({"b"}))
    table.acquire(x)
    table.acquire(Job("x", deadline_ns=900, holds=frozenset({"a", "b"})))
    table.acquire(Job("y", deadline_ns=50, holds=frozenset({"b"})))
    assert table.effective_deadline(x) == 50
    assert table.effective_deadline(holder) == 50


def _inversion():
    w = workload.load_workload(EXAMPLES / "workload-inversion.yaml")
    return w.generate(1, {"cpu": 1})


def test_edf_lets_the_medium_job_delay_the_waiter_and_pic_does_not():
    jobs = _inversion()
    edf = {r.job.name: r for r in Simulation(jobs, [NodeSpec("n", cpus=1)], "edf").run().records}
    pic = {
        r.job.name: r for r in Simulation(jobs, [NodeSpec("n", cpus=1)], "edf-pic").run().records
    }
    ms = 1_000_000
    assert edf["high"].finish_ns == 32 * ms and edf["high"].missed
    assert pic["low"].finish_ns == 10 * ms and pic["low"].preemptions == 0
    assert pic["high"].finish_ns == 12 * ms and not pic["high"].missed
    assert not any(r.missed for r in pic.values())
