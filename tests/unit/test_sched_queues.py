"""Queue disciplines: EDF is optimal where a schedule exists, priority order holds."""

from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.sched.job import Job
from xhagent.sched.queues import Discipline, ReadyQueue, discipline
from xhagent.sched.simulator import NodeSpec, Simulation

ONE_CPU = [NodeSpec("n", cpus=1)]


@st.composite
def job_sets(draw, deadlines=True, resources=()):
    n = draw(st.integers(1, 7))
    jobs = []
    for i in range(n):
        arrival = draw(st.integers(0, 20))
        runtime = draw(st.integers(1, 8))
        slack = draw(st.integers(0, 15))
        holds = frozenset(draw(st.sets(st.sampled_from(resources)))) if resources else frozenset()
        jobs.append(
            Job(
                f"j{i}",
                arrival,
                runtime,
                arrival + runtime + slack if deadlines else None,
                priority=draw(st.integers(0, 100)),
                holds=holds,
                affinity={"tier": draw(st.sampled_from(["hot", "cold", "x"]))},
            )
        )
    return jobs


def feasible(jobs: list[Job]) -> bool:
    """Horn's condition for one preemptive processor with release times: in every window
    [t1, t2] the work that must fall inside it fits."""
    starts = {j.arrival_ns for j in jobs}
    ends = {j.deadline_ns for j in jobs}
    return all(
        sum(j.runtime_ns for j in jobs if j.arrival_ns >= t1 and j.deadline_ns <= t2) <= t2 - t1
        for t1 in starts
        for t2 in ends
        if t2 >= t1
    )


@settings(max_examples=300, deadline=None)
@given(job_sets())
def test_edf_misses_exactly_when_no_schedule_exists(jobs):
    out = Simulation(jobs, ONE_CPU, "edf").run()
    missed = any(r.missed for r in out.records)
    assert missed == (not feasible(jobs))


@settings(max_examples=200, deadline=None)
@given(job_sets(deadlines=False))
def test_a_job_never_runs_while_a_higher_priority_job_waits(jobs):
    out = Simulation(jobs, ONE_CPU, "priority").run()
    pending = {r.job.name: (r.job.arrival_ns, r.finish_ns, r.job.priority) for r in out.records}
    for _, name, start, end in out.intervals:
        mine = pending[name][2]
        for other, (arrival, finish, prio) in pending.items():
            if prio > mine:
                assert end <= arrival or start >= finish, f"{name} ran while {other} waited"


@settings(max_examples=100, deadline=None)
@given(
    job_sets(resources=("bus", "lock")),
    st.sampled_from(["fifo", "priority", "edf", "edf-pic", "fair", "mlq"]),
)
def test_every_algorithm_runs_every_job_for_exactly_its_runtime(jobs, algorithm):
    out = Simulation(jobs, [NodeSpec("n", cpus=2)], algorithm).run()
    ran = {}
    for _, name, start, end in out.intervals:
        ran[name] = ran.get(name, 0) + end - start
    assert ran == {j.name: j.runtime_ns for j in jobs}
    busy = {}
    for slot, _, start, end in sorted(out.intervals, key=lambda i: (i[0], i[2])):
        assert start >= busy.get(slot, 0), "two jobs on one slot"
        busy[slot] = end
    finish = {r.job.name: r.finish_ns for r in out.records}
    first = {r.job.name: r.first_start_ns for r in out.records}
    for a in jobs:  # jobs sharing a resource never overlap between first start and finish
        for b in jobs:
            if a.name < b.name and a.holds & b.holds:
                assert finish[a.name] <= first[b.name] or finish[b.name] <= first[a.name]


def test_queue_orders_by_discipline_and_refiles_on_update():
    a = Job("a", arrival_ns=0, deadline_ns=50, priority=10)
    b = Job("b", arrival_ns=1, deadline_ns=20, priority=90)
    c = Job("c", arrival_ns=2, priority=50)
    for name, order in (("fifo", "abc"), ("priority", "bca"), ("edf", "bac")):
        q = ReadyQueue(discipline(name))
        for j in (c, a, b):
            q.push(j)
        assert "".join(q.pop().name for _ in range(3)) == order, name
        assert q.pop() is None
    boost = {"a": 50}
    q = ReadyQueue(Discipline("boosted", lambda j: boost.get(j.name, 99), preemptive=True))
    q.push(a), q.push(b)
    assert q.peek().name == "a"
    boost["a"] = 100
    q.update(a)
    assert [q.pop().name, q.pop().name] == ["b", "a"] and len(q) == 0
