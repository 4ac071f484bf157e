"""The simulator's cost per event does not grow with the number of slots: no event scans
every slot, every running job or the whole node state (a 500-node file took minutes)."""

import pytest

from xhagent.sched import workload
from xhagent.sched.simulator import NodeSpec, Simulation, slots_of


class _NoScanList(list):
    def __iter__(self):
        raise AssertionError("an event scanned every slot")


class _NoScanDict(dict):
    def __iter__(self):
        raise AssertionError("an event scanned a whole mapping")

    def keys(self):
        raise AssertionError("an event scanned a whole mapping")

    def items(self):
        raise AssertionError("an event scanned a whole mapping")

    def values(self):
        raise AssertionError("an event scanned a whole mapping")


# Offered above capacity so jobs queue and preemptive algorithms look for victims.
SATURATED = """
kind: Workload
spec:
  duration: 200ms
  utilisation: 1.2
  classes:
    - {name: a, rate: 100, runtime: {distribution: exponential, mean: 5ms},
       deadlineSlack: {min: 1, max: 4}, priority: {values: [20, 80], weights: [1, 1]},
       affinity: {tier: hot}}
    - {name: r, rate: 2, runtime: 3ms, resources: [bus], deadline: 20ms}
    - {name: b, rate: 100, runtime: {distribution: exponential, mean: 8ms},
       deadlineSlack: {min: 2, max: 6}}
    - {name: g, deviceType: gpu, rate: 20, runtime: 20ms, deadline: 30ms}
"""


@pytest.mark.parametrize("algorithm", ["fifo", "priority", "edf", "edf-pic", "fair", "mlq"])
def test_no_event_scans_every_slot_or_running_job(algorithm):
    nodes = [NodeSpec(f"n{i}", cpus=4, gpus=1, numa_nodes=2) for i in range(20)]
    w = workload.load_workload_text(SATURATED)
    jobs = w.generate(1, {"cpu": 80, "gpu": 20})
    reference = Simulation(jobs, nodes, algorithm, levels=w.levels).run()
    sim = Simulation(jobs, nodes, algorithm, levels=w.levels)
    sim.slots = _NoScanList(sim.slots)
    sim.running = _NoScanDict()
    sim.state._slots = _NoScanDict(sim.state._slots)
    out = sim.run()
    assert out.preemptions == reference.preemptions and [r.finish_ns for r in out.records] == [
        r.finish_ns for r in reference.records
    ]
    assert len(out.records) > 100 and (algorithm in ("fifo", "fair") or out.preemptions > 0)


def test_a_job_resumes_where_it_ran_else_on_its_node_else_the_first_free_slot():
    sim = Simulation([], [NodeSpec("a", cpus=4, numa_nodes=2), NodeSpec("b", cpus=2)], "edf")
    a0, a1, a2, a3, b0, b1 = slots_of([NodeSpec("a", cpus=4, numa_nodes=2), NodeSpec("b", cpus=2)])
    job = workload.Job("j")
    assert sim._free_slot(job) == a0
    sim.last_place["j"] = b1.place
    assert sim._free_slot(job) == b0
    sim.last_place["j"] = a2.place
    sim.free.take(a2)
    assert sim._free_slot(job) == a3
    sim.free.take(a3)
    assert sim._free_slot(job) == a0
    for s in (a0, a1, b0, b1):
        sim.free.take(s)
    assert sim._free_slot(job) is None
    sim.free.release(a3)
    assert sim._free_slot(job) == a3
