"""Victims: the fewest, cheapest first, only those a rule allows, and none when nothing helps."""

from dataclasses import replace

from test_policy_placement import make_node

from xhagent.policy.placement import Demand
from xhagent.policy.preemption import Standing, choose_victims, may_preempt
from xhagent.policy.state import Allocation, Cluster

NODE = make_node(numa=((2,),), smt=1)  # CPUs 0 and 1
GiB = 2**30


def running(*specs):
    """(task, cpus, priority, mode, started_ns) -> the cluster and the standings."""
    allocs = [Allocation(t, "n1", cpus, GiB) for t, cpus, *_ in specs]
    standings = [
        Standing(a, p, mode=mode, started_ns=started)
        for a, (_, _, p, mode, started) in zip(allocs, specs, strict=True)
    ]
    return Cluster.of([NODE], allocs), standings


def test_the_cheapest_victim_goes_first_and_only_what_is_needed():
    cluster, standings = running(
        ("old-low", (0,), 10, "freeze", 1), ("new-low", (1,), 10, "freeze", 2)
    )
    plan = choose_victims(
        "hi", Demand("cpu", cpus=1), cluster, standings, rule="lower-priority", priority=80
    )
    assert [v.allocation.task for v in plan.victims] == ["new-low"]  # least work lost
    assert plan.placed.cpus == (1,)


def test_higher_equal_and_never_are_not_victims_and_then_nothing_is_preempted():
    cluster, standings = running(("a", (0,), 80, "freeze", 1), ("b", (1,), 10, "never", 2))
    demand = Demand("cpu", cpus=1)
    assert (
        choose_victims("t", demand, cluster, standings, rule="lower-priority", priority=80) is None
    )
    assert choose_victims("t", demand, cluster, standings, rule="never", priority=99) is None


def test_a_frozen_victim_keeps_its_memory_a_killed_one_frees_it():
    node_mem = NODE.memory.available
    big = Demand("cpu", cpus=1, memory=node_mem - GiB + 1)  # needs some of the victim's
    for mode, fits in (("freeze", False), ("kill", True)):
        cluster, standings = running(("v", (0, 1), 10, mode, 1))
        plan = choose_victims("t", big, cluster, standings, rule="lower-priority", priority=50)
        assert (plan is not None) == fits, mode


def test_deadline_driven_preempts_later_deadlines_at_equal_priority():
    v = Standing(Allocation("v", "n1", (0,), 0), 50, deadline_ns=200)
    assert may_preempt("deadline-driven", 50, 100, v)
    assert not may_preempt("deadline-driven", 50, 300, v)
    assert not may_preempt("lower-priority", 50, 100, v)


def test_under_queueing_the_nodes_order_decides_whatever_the_priorities():
    cluster, standings = running(("hi", (0,), 90, "freeze", 1), ("lo", (1,), 10, "freeze", 2))
    # ranks as an edf discipline gives them: (deadline, arrival, name); "hi" is due last
    ranked = [
        replace(standings[0], rank=(300, 1, "hi")),
        replace(standings[1], rank=(200, 2, "lo")),
    ]

    def plan(priority: int, rank: tuple):
        one = Demand("cpu", cpus=1)
        return choose_victims(
            "t", one, cluster, ranked, rule="queueing", priority=priority, rank=rank
        )

    got = plan(10, (100, 3, "t"))
    assert [v.allocation.task for v in got.victims] == ["hi"]  # the worst ranked, priority 90
    # ranked after both: no victim; unranked (a discipline that never preempts): none
    assert plan(99, (400, 3, "t")) is None
    assert not may_preempt("queueing", 99, 0, ranked[0], None)
    assert not may_preempt("queueing", 99, 0, standings[0], (100, 3, "t"))
    assert not may_preempt("queueing", 99, 0, replace(ranked[0], mode="never"), (100, 3, "t"))
