"""The start pipeline without root: the loop's fakes (test_daemon_loop.py) over a real store.

Asserted through the store's commits and events: an end a step sees while it starts other
tasks is committed by that step, right after their outcomes; an end is collected
from its shim's pidfd alone, in one transaction, without a look at every running task;
`start_many` commits every intent before it spawns any shim, spawns every shim before it
awaits any, and commits every outcome in one transaction; a batch whose intents cannot be
committed starts none and holds no placement.
"""

from __future__ import annotations

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.store import Conflict, StoreError, TaskState
from xhagent.policy.placement import Candidate


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(cpus=4), Clock())
    yield made
    made.close()


def commits(loop) -> list[list]:
    """Every commit from now on, as the list of what it wrote."""
    seen: list[list] = []
    observe = loop.store.on_commit

    def counted(written):
        seen.append(list(written))
        observe(written)

    loop.store.on_commit = counted
    return seen


def transition_seq(loop, task_id: str, to: TaskState) -> int:
    (event,) = [
        e
        for e in loop.store.events(0, task_id=task_id)
        if e.kind == "Transition" and e.detail["to"] == to.value
    ]
    return event.seq


def test_an_end_seen_while_a_step_starts_tasks_is_committed_by_that_step(loop):
    first, second, third = loop.submit(task("a"), task("b"), task("c"))
    spawn = loop.executor.start

    def start(task_id, *args, **kw):  # the first workload ends while the second starts
        started = spawn(task_id, *args, **kw)
        if task_id == second:
            loop.executor.exit(first, 0)
        return started

    loop.executor.start = start
    loop.step()  # one step starts all three, together
    assert [loop.state(t) for t in (first, second, third)] == [
        TaskState.SUCCEEDED,
        TaskState.RUNNING,
        TaskState.RUNNING,
    ]
    ended = transition_seq(loop, first, TaskState.SUCCEEDED)
    # every intent before any process, then the outcomes, then the end seen meanwhile
    assert transition_seq(loop, third, TaskState.STARTING) < transition_seq(
        loop, first, TaskState.RUNNING
    )
    assert transition_seq(loop, third, TaskState.RUNNING) < ended


def test_an_end_is_collected_from_its_pidfd_in_one_transaction_without_a_full_look(loop):
    running, other = loop.submit(task("a"), task("b"))
    loop.step()
    assert loop.state(running) == TaskState.RUNNING == loop.state(other)

    def no_full_look(*args, **kw):
        raise AssertionError("every running task was looked at")

    loop.store.each_task = no_full_look
    seen = commits(loop)
    loop.executor.exit(running, 3)
    assert loop.scheduler.wakeups.exited_now() == {running}  # its pidfd alone says so
    assert loop.scheduler.wakeups.exited_now() == {running}  # and looking does not use it up
    loop.scheduler.lifecycle.collect_noticed()
    rec = loop.store.get(running)
    assert rec.state == TaskState.FAILED and rec.exit_code == 3
    assert len(seen) == 1  # the end, its event and its record: one commit
    assert loop.state(other) == TaskState.RUNNING
    assert loop.scheduler.wakeups.exited_now() == frozenset()  # no longer watched


def candidate() -> Candidate:
    return Candidate("n1", (), 0, (), 0.0, ())


def test_start_many_commits_every_intent_before_a_spawn_and_every_outcome_at_once(loop):
    ids = loop.submit(task("a"), task("b"), task("c"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    order: list[tuple] = []
    launch = loop.executor.launch

    def launched(task_id, *args, **kw):
        states = [loop.state(t) for t in ids]
        opened = sorted(i.task_id for i in loop.store.open_intents() if i.action == "start")
        order.append(("launch", task_id, states, opened))
        got = launch(task_id, *args, **kw)
        wait = got.wait
        got.wait = lambda: (order.append(("wait", task_id)), wait())[1]
        return got

    loop.executor.launch = launched
    seen = commits(loop)
    recs = lc.start_many(items)
    starting = [TaskState.STARTING] * 3
    assert order == [
        ("launch", ids[0], starting, sorted(ids)),
        ("launch", ids[1], starting, sorted(ids)),
        ("launch", ids[2], starting, sorted(ids)),
        ("wait", ids[0]),
        ("wait", ids[1]),
        ("wait", ids[2]),
    ]
    assert len(seen) == 2  # the intents and Starting records; then the outcomes
    assert [r.state for r in recs] == [TaskState.RUNNING] * 3
    assert [r.id for r in recs] == ids
    assert loop.store.open_intents() == []
    assert {a.task for _, a in lc.cluster.placed()} == set(ids)


def test_a_start_many_item_that_cannot_start_fails_alone_and_gives_back_its_placement(loop):
    ids = loop.submit(task("a"), task("bad", command="[no-such-program]"), task("c"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    recs = lc.start_many(items)
    assert [r.state for r in recs] == [TaskState.RUNNING, TaskState.FAILED, TaskState.RUNNING]
    assert "no such file" in recs[1].error
    assert {a.task for _, a in lc.cluster.placed()} == {ids[0], ids[2]}
    assert loop.store.open_intents() == []
    assert lc.spec(ids[1]) is None  # ended: nothing of it kept


def test_a_batch_whose_intents_cannot_be_committed_starts_none_and_holds_nothing(loop):
    ids = loop.submit(task("a"), task("b"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    loop.store.transition(ids[1], TaskState.CANCELLED, expect=TaskState.PENDING)  # meanwhile
    with pytest.raises(Conflict):
        lc.start_many(items)
    assert loop.state(ids[0]) == TaskState.PENDING  # rolled back with the other
    assert loop.store.open_intents() == []
    assert list(lc.cluster.placed()) == [] and loop.executor.runs == {}


def end_the_first_as_the_second_spawns(loop, ids: list[str]) -> None:
    launch = loop.executor.launch

    def launched(task_id, *args, **kw):
        got = launch(task_id, *args, **kw)
        if task_id == ids[1]:
            loop.executor.exit(ids[0], 0)
        return got

    loop.executor.launch = launched


def test_an_end_during_a_batch_is_committed_when_the_batch_is_done(loop):
    ids = loop.submit(task("a"), task("b"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    end_the_first_as_the_second_spawns(loop, ids)
    seen = commits(loop)
    recs = lc.start_many(items)
    assert [r.state for r in recs] == [TaskState.RUNNING] * 2  # as the starts left them
    assert loop.state(ids[0]) == TaskState.SUCCEEDED  # its end already committed
    assert loop.state(ids[1]) == TaskState.RUNNING
    assert transition_seq(loop, ids[0], TaskState.RUNNING) < transition_seq(
        loop, ids[0], TaskState.SUCCEEDED
    )
    # two commits for the batch: the intents; then the outcomes with the end seen meanwhile
    assert [sorted(e.message for e, _ in written) for written in seen] == [
        ["Pending -> Starting"] * 2,
        ["Running -> Succeeded", "Starting -> Running", "Starting -> Running"],
    ]


def test_outcomes_whose_commit_failed_with_an_end_are_committed_by_a_later_step(loop, monkeypatch):
    ids = loop.submit(task("a"), task("b"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    end_the_first_as_the_second_spawns(loop, ids)
    transition = loop.store.transition

    def refused(task_id, to, **kw):  # the end's write fails: the whole commit with it
        if to is TaskState.SUCCEEDED:
            raise StoreError("database or disk is full")
        return transition(task_id, to, **kw)

    monkeypatch.setattr(loop.store, "transition", refused)
    with pytest.raises(StoreError):
        lc.start_many(items)
    assert [loop.state(t) for t in ids] == [TaskState.STARTING] * 2  # nothing of it stands
    monkeypatch.setattr(loop.store, "transition", transition)
    loop.scheduler.step()  # a failed step's next one looks at everything
    assert [loop.state(t) for t in ids] == [TaskState.SUCCEEDED, TaskState.RUNNING]
    assert loop.store.open_intents() == []


def test_ends_seen_together_are_committed_in_one_transaction(loop):
    ids = loop.submit(task("a"), task("b"), task("c", command="[sh, -c, 'exit 1']"))
    loop.step()
    seen = commits(loop)
    loop.executor.exit(ids[0], 0)
    loop.executor.exit(ids[2], 1)
    loop.scheduler.lifecycle.collect_noticed()
    assert [loop.state(t) for t in ids] == [
        TaskState.SUCCEEDED,
        TaskState.RUNNING,
        TaskState.FAILED,
    ]
    assert len(seen) == 1
    ended = {rec.id for _, rec in seen[0] if rec is not None}
    assert ended == {ids[0], ids[2]}


def test_an_end_committed_during_a_step_wakes_the_loop_for_its_restart(loop):
    extra = "  restartPolicy: {policy: OnFailure, maxRestarts: 2, backoff: 100ms}\n"
    flaky, other = loop.submit(task("flaky", extra), task("b"))
    spawn = loop.executor.start

    def start(task_id, *args, **kw):  # the first attempt fails while the other starts
        started = spawn(task_id, *args, **kw)
        if task_id == other:
            loop.executor.exit(flaky, 1)
        return started

    loop.executor.start = start
    loop.step()
    assert loop.state(flaky) == TaskState.PENDING  # requeued, BackOff
    woken = loop.scheduler.wakeups.wait(0)
    assert woken.anything and not woken.exited  # woken, but not for a look at every task
    loop.scheduler.step(set())
    assert loop.scheduler.wakeups.timeout() == pytest.approx(0.1, abs=0.01)  # its backoff
    loop.clock.advance(0.2)
    loop.scheduler.step(set())
    rec = loop.store.get(flaky)
    assert rec.state == TaskState.RUNNING and rec.attempt == 2


def test_a_batch_cut_by_an_agent_error_rolls_back_what_it_did_not_reach(loop):
    ids = loop.submit(task("a"), task("b"), task("c"))
    lc = loop.scheduler.lifecycle
    items = [(rec, lc.read_spec(rec), candidate()) for rec in map(loop.store.get, ids)]
    launch = loop.executor.launch

    def launched(task_id, *args, **kw):
        if task_id == ids[1]:
            raise RuntimeError("the agent's own bug")
        return launch(task_id, *args, **kw)

    loop.executor.launch = launched
    with pytest.raises(RuntimeError):
        lc.start_many(items)
    lc.settle_starts()  # as the next step does
    assert [loop.state(t) for t in ids] == [
        TaskState.RUNNING,  # spawned before the error: awaited, supervised, committed
        TaskState.PENDING,
        TaskState.PENDING,
    ]
    assert loop.store.open_intents() == []
    assert {a.task for _, a in lc.cluster.placed()} == {ids[0]}
    assert sorted(loop.executor.runs) == [ids[0]]


def test_a_steps_starts_are_one_batch_whose_placements_see_each_other(loop):
    # four CPUs, three tasks wanting two each: the step reserves two and keeps one waiting
    ids = loop.submit(*(task(n, "  requests: {cpus: 2}\n") for n in "abc"))
    seen = commits(loop)
    loop.step()
    assert [loop.state(t) for t in ids] == [TaskState.RUNNING, TaskState.RUNNING, TaskState.PENDING]
    held = [set(loop.store.get(t).placement.cpus) for t in ids[:2]]
    assert held[0].isdisjoint(held[1]) and len(held[0]) == len(held[1]) == 2
    assert loop.store.get(ids[2]).reasons  # it says why it waits
    intents = [
        {event.task_id for event, _ in written if event.message == "Pending -> Starting"}
        for written in seen
    ]
    assert [ts for ts in intents if ts] == [set(ids[:2])]  # both in one commit
