"""Fair share on the node without root: the loop's fakes (test_daemon_loop.py), a leaf's
CPU time set by the test (`cpu_usec`, what cpu.stat usage_usec would say) and a clock it
moves.

Asserted: vruntime is charged from the leaves' CPU time weighted by priority, as the
simulator's FairShare charges it; a running task keeps its place until its TWFS slice is
over, and then gives it to a waiting task of less vruntime, Pending or Frozen; the loop
wakes at the slice's end while a task waits, and not at all when none does; a move is
charged its penalty; without `fair` nothing of it is kept.
"""

from __future__ import annotations

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.loop.fairness import NODE_MIN_SLICE_NS, Fairness
from xhagent.daemon.loop.migration import MigrationController
from xhagent.daemon.loop.wakeups import SAFETY_S
from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.store import TaskState
from xhagent.sched.fair import NICE_0, FairShare, twfs_slice_ns
from xhagent.sched.job import Job, weight_of

ONE_CPU = "  requests: {cpus: 1}\n"


def fair_policy(preemption: str = "queueing") -> object:
    text = (
        "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: fair}\n"
        f"spec:\n  preemption: {preemption}\n  queueing: {{algorithm: fair}}\n"
        "  matchRules:\n    - selector: {matchLabels: {app: x}}\n"
    )
    return parse_source(text, "fair.yaml")[0].value


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(cpus=1), Clock())
    made.policies = [fair_policy()]
    yield made
    made.close()


def ran(loop, task_id: str, seconds: float) -> None:
    """`task_id`'s workload used `seconds` more of CPU time while the clock moved as much."""
    loop.executor.cpu_usec[task_id] = loop.executor.cpu_usec.get(task_id, 0) + int(seconds * 1e6)
    loop.clock.advance(seconds)


def transitions(loop, task_id: str) -> list[str]:
    return [e.message for e in loop.store.events(0, task_id=task_id) if e.kind == "Transition"]


def vruntime_ms(loop, task_id: str) -> float:
    return loop.scheduler.fairness.vruntime_ns(task_id) / 1e6


def test_cpu_time_is_charged_by_weight_and_slices_switch_to_the_least_vruntime(loop):
    (low,) = loop.submit(task("low", "  priority: 40\n" + ONE_CPU))
    loop.step()
    assert loop.state(low) == TaskState.RUNNING
    (high,) = loop.submit(task("high", "  priority: 60\n" + ONE_CPU))
    loop.step()
    # a full node: a 100 ms slice, which `low` runs out before anything takes its place
    assert loop.state(high) == TaskState.PENDING
    assert loop.scheduler.wakeups.timeout() == pytest.approx(0.1, abs=1e-3)
    ran(loop, low, 0.05)
    loop.step()
    assert loop.state(low) == TaskState.RUNNING  # half its slice: not a victim yet
    ran(loop, low, 0.05)
    loop.step()
    # 100 ms at weight 512 (priority 40) is 200 ms of vruntime; `high` joined at 0
    assert vruntime_ms(loop, low) == pytest.approx(100 * NICE_0 / weight_of(40))
    assert loop.state(low) == TaskState.FROZEN and loop.executor.leaf(low).frozen
    assert loop.state(high) == TaskState.RUNNING
    assert transitions(loop, low)[-1] == (
        f"Running -> Frozen: slice ended at vruntime 200.0 ms: preempted by {high}"
    )
    # no use waking before `high` could have caught up with `low`: 200 ms of vruntime is
    # 400 ms of its CPU time
    assert loop.scheduler.wakeups.timeout() == pytest.approx(0.4, abs=1e-3)
    # `high` (weight 2048) runs 400 ms before its vruntime reaches `low`'s 200 ms, slice
    # after slice; at a tie the earlier submission goes first
    for _ in range(3):
        ran(loop, high, 0.1)
        loop.step()
        assert loop.state(high) == TaskState.RUNNING, vruntime_ms(loop, high)
    ran(loop, high, 0.1)
    loop.step()
    assert vruntime_ms(loop, high) == pytest.approx(400 * NICE_0 / weight_of(60))
    assert loop.state(high) == TaskState.FROZEN and loop.executor.leaf(high).frozen
    assert loop.state(low) == TaskState.RUNNING and not loop.executor.leaf(low).frozen
    assert transitions(loop, low)[-1] == "Frozen -> Running: resumed"
    assert transitions(loop, high)[-1].startswith("Running -> Frozen: slice ended at vruntime")
    assert loop.store.open_intents() == []


def test_the_node_charges_as_the_simulators_fair_share_does(tmp_path):
    """The same run times through the simulator's FairShare give the node's vruntimes."""
    made = Loop(tmp_path, node(cpus=4), Clock())
    made.policies = [fair_policy()]
    try:
        prios = (30, 50, 80)
        ids = made.submit(*(task(f"t{p}", f"  priority: {p}\n" + ONE_CPU) for p in prios))
        made.step()
        used = dict(zip(ids, (0.25, 0.5, 1.0), strict=True))
        for task_id, seconds in used.items():
            made.executor.cpu_usec[task_id] = int(seconds * 1e6)
        made.clock.advance(1)
        made.step()
        twin = FairShare()
        for (task_id, seconds), p in zip(used.items(), prios, strict=True):
            job = Job(task_id, priority=p)
            twin.enqueue(job)
            twin.charge(job, int(seconds * 1e9))
        fair = made.scheduler.fairness
        assert {t: fair.vruntime_ns(t) for t in ids} == pytest.approx(twin.vruntime)
        assert twin.vruntime[ids[2]] == pytest.approx(1e9 * NICE_0 / weight_of(80))
    finally:
        made.close()


def test_no_waiting_task_no_slice_wake_ups(loop):
    (only,) = loop.submit(task("only", ONE_CPU))
    loop.step()
    assert loop.state(only) == TaskState.RUNNING
    assert loop.scheduler.wakeups.timeout() == SAFETY_S  # nobody waits: no slice end due
    ran(loop, only, 0.3)
    loop.step()
    assert loop.state(only) == TaskState.RUNNING


def test_a_slice_is_shorter_on_a_node_half_held_down_to_the_nodes_floor(tmp_path):
    made = Loop(tmp_path, node(cpus=4), Clock())
    made.policies = [fair_policy()]
    try:
        held, big = made.submit(
            task("a", "  requests: {cpus: 2}\n"), task("b", "  requests: {cpus: 4}\n")
        )
        made.step()
        assert [made.state(t) for t in (held, big)] == [TaskState.RUNNING, TaskState.PENDING]
        # TWFS at load 0.5: 100 ms x (1 + log2 0.5) = 0, at least 1 ms; the node's at least
        # 10 ms (a switch is a freeze and a thaw)
        assert twfs_slice_ns(Job("x"), 0.5) == 1_000_000
        assert made.scheduler.fairness._slice_end == {held: made.clock() + NODE_MIN_SLICE_NS}
        assert made.scheduler.wakeups.timeout() == pytest.approx(0.01, abs=1e-4)
    finally:
        made.close()


def test_without_preemption_queueing_fair_only_orders(tmp_path):
    made = Loop(tmp_path, node(cpus=1), Clock())
    made.policies = [fair_policy("never")]
    try:
        first, second = made.submit(task("a", ONE_CPU), task("b", ONE_CPU))
        made.step()
        ran(made, first, 1.0)
        made.step()
        assert made.state(first) == TaskState.RUNNING and made.state(second) == TaskState.PENDING
    finally:
        made.close()


def test_without_fair_nothing_is_kept(loop):
    loop.submit(task("a", ONE_CPU), task("b", ONE_CPU))
    loop.step()
    assert loop.scheduler.fairness.share.vruntime
    loop.policies = []
    loop.step()
    fair = loop.scheduler.fairness
    assert not fair.active and fair.share.vruntime == {} and fair._slice_end == {}


def test_a_move_is_charged_its_penalty(loop):
    fairness: Fairness = loop.scheduler.fairness
    controller = MigrationController(loop.scheduler.lifecycle, lambda: [], fairness=fairness)
    assert controller.fair is fairness.share  # the moves are ranked by the node's share
    fairness.share.vruntime["t0000001"] = 5.0
    controller._ended("t0000001", {"moved": True, "from": "n1/gpu0", "penalty_ns": 2.2e6})
    assert fairness.vruntime_ns("t0000001") == pytest.approx(5.0 + 2.2e6)
    controller._ended("t0000001", {"moved": False})
    assert fairness.vruntime_ns("t0000001") == pytest.approx(5.0 + 2.2e6)


def test_a_freed_cpu_goes_to_the_least_vruntime_pending_or_frozen(loop):
    """Frozen and Pending tasks take turns in one order: a frozen task of more vruntime
    does not resume ahead of a Pending one of less, nor one of less behind it."""
    low, high = loop.submit(
        task("low", "  priority: 40\n" + ONE_CPU), task("high", "  priority: 60\n" + ONE_CPU)
    )
    loop.step()
    ran(loop, low, 0.1)
    loop.step()
    assert (loop.state(low), loop.state(high)) == (TaskState.FROZEN, TaskState.RUNNING)
    (late,) = loop.submit(task("late", "  priority: 60\n" + ONE_CPU))
    ran(loop, high, 0.05)
    loop.step()
    loop.executor.exit(high, 0)
    loop.step()
    # `late` joined at the least vruntime then (high's 25 ms, under low's 200 ms)
    assert vruntime_ms(loop, late) < vruntime_ms(loop, low)
    assert (loop.state(late), loop.state(low)) == (TaskState.RUNNING, TaskState.FROZEN)
    loop.executor.exit(late, 0)
    loop.step()
    assert loop.state(low) == TaskState.RUNNING  # its turn: nothing ranks before it now
