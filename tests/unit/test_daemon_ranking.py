"""The loop orders its Pending tasks with the simulator's own disciplines: one
implementation, so `xhagent simulate` predicts the order the node starts tasks in."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.daemon.loop.ranking import Ranking
from xhagent.policy.policy import Queueing, Rule, SchedulingPolicy
from xhagent.policy.selector import Selector
from xhagent.policy.task import parse_task
from xhagent.sched import queues
from xhagent.sched.job import from_task
from xhagent.sched.mlq import Level, MultiLevel
from xhagent.sched.pic import ResourceTable
from xhagent.sched.simulator import NodeSpec, Simulation
from xhagent.spec import load_text

RULE = (Rule(Selector((("app", "q"),))),)


def task(name: str, priority: int | None, deadline_s: int | None, tier: str | None = None):
    labels = "app: q" + (f", tier: {tier}" if tier else "")
    text = (
        "apiVersion: xh.scheduling/v1\nkind: Task\n"
        f"metadata: {{name: {name}, labels: {{{labels}}}}}\n"
        'spec:\n  deviceType: cpu\n  command: ["true"]\n'
        + (f"  priority: {priority}\n" if priority is not None else "")
        + (f"  deadline: {deadline_s}s\n" if deadline_s is not None else "")
    )
    return parse_task(load_text(text, "t.yaml")[0])


waiting = st.lists(
    st.tuples(st.none() | st.integers(0, 100), st.none() | st.integers(1, 20)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(waiting, st.sampled_from(queues.NODE_ALGORITHMS), st.integers(0, 100))
def test_the_loop_and_the_simulator_decide_by_the_same_discipline(items, algorithm, pri):
    """The same tasks, all waiting at once: the loop's order and the simulator's start
    order on one CPU are equal, and both asked `sched.queues.discipline` for the key of
    the same jobs (a spy around the one function)."""
    asked: dict[str, list] = {"loop": [], "sim": []}
    real, who = queues.discipline, ["loop"]

    def spy(name, **kw):
        d = real(name, **kw)

        def key(job):
            asked[who[0]].append((name, job.name, job.priority, job.deadline_ns))
            return d.key(job)

        return replace(d, key=key)

    queues.discipline = spy
    try:
        policy = SchedulingPolicy("order", RULE, priority=pri, queueing=Queueing(algorithm))
        tasks = {f"t{i:07d}": task(f"w{i}", p, d) for i, (p, d) in enumerate(items)}
        ranking = Ranking([policy])
        loop_order = sorted(tasks, key=lambda tid: ranking.key(tid, tasks[tid], 0))
        who[0] = "sim"
        jobs = [
            from_task(t, 0, name=tid, priority=pri if t.priority is None else t.priority)
            for tid, t in tasks.items()
        ]
        out = Simulation(jobs, [NodeSpec("n", cpus=1)], algorithm).run()
    finally:
        queues.discipline = real
    sim_order = [r.job.name for r in sorted(out.records, key=lambda r: r.first_start_ns)]
    assert loop_order == sim_order
    assert {a[0] for a in asked["loop"] + asked["sim"]} == {algorithm}
    assert set(asked["loop"]) == set(asked["sim"])  # the same jobs, keyed alike


def test_without_a_queueing_policy_the_order_is_priority_then_deadline_then_submission():
    plain = SchedulingPolicy("plain", RULE, priority=70)
    ranking = Ranking([plain])
    assert (ranking.algorithm, ranking.decided_by) == ("priority", "")
    tasks = {
        "t0000001": task("late", 90, 60),
        "t0000002": task("none", 90, None),
        "t0000003": task("soon", 90, 5),
        "t0000004": task("low", 10, 1),
    }
    order = sorted(tasks, key=lambda tid: ranking.key(tid, tasks[tid], 0))
    assert order == ["t0000003", "t0000001", "t0000002", "t0000004"]


@settings(max_examples=40, deadline=None)
@given(st.none() | st.integers(1, 20), st.integers(1, 20), st.sampled_from(("edf", "edf-pic")))
def test_a_holder_is_ranked_as_a_victim_as_the_simulator_keys_it(own_s, waiter_s, algorithm):
    """Under `preemption: queueing` a running holder's rank is its discipline's key with
    the deadline its waiter lends it: under edf-pic exactly the simulator's key of that
    holder (its ResourceTable's effective deadline), under edf its own deadline's key."""
    policy = SchedulingPolicy("order", RULE, queueing=Queueing(algorithm))
    ranking = Ranking([policy])
    holder = task("holder", None, own_s)
    waiter_ns = waiter_s * 10**9
    rank = ranking.key("t0000001", holder, 0, waiter_ns if algorithm == "edf-pic" else None)
    table = ResourceTable()
    job = replace(from_task(holder, 0, name="t0000001"), holds=frozenset({"bus"}))
    table.acquire(job)
    table.acquire(replace(job, name="t0000002", deadline_ns=waiter_ns))  # waits for the bus
    sim_key = queues.discipline(algorithm, resources=table).key(job)
    assert rank == sim_key


def test_mlq_orders_by_the_policys_levels_as_the_simulator_does():
    levels = (Level("hot", {"tier": "hot"}), Level("normal"), Level("cold", {"tier": "cold"}))
    policy = SchedulingPolicy("tiers", RULE, queueing=Queueing("mlq", levels))

    specs = [("cold", 1), ("hot", 9), (None, 2), ("cold", None), ("hot", 3), (None, None)]
    tasks = {f"t{i:07d}": task(f"w{i}", None, d, tier) for i, (tier, d) in enumerate(specs)}
    ranking = Ranking([policy])
    loop_order = sorted(tasks, key=lambda tid: ranking.key(tid, tasks[tid], 0))
    jobs = [from_task(t, 0, name=tid) for tid, t in tasks.items()]
    out = Simulation(jobs, [NodeSpec("n", cpus=1)], "mlq", levels=MultiLevel(levels)).run()
    sim_order = [r.job.name for r in sorted(out.records, key=lambda r: r.first_start_ns)]
    assert loop_order == sim_order
    # hot first (by deadline), then the rest, cold last, whatever their deadlines
    assert loop_order == ["t0000004", "t0000001", "t0000002", "t0000005", "t0000000", "t0000003"]
