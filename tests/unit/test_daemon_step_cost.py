"""A scheduler step's cost does not grow with the backlog: the Pending window is kept between
steps (a step with nothing new reads no Pending row), tasks of one demand are decided once
per placement state (a backlog on a full node makes a handful of decisions a step, not one
per task), and a step's reason changes are one transaction; the order by standing and every
task's reason stay what they were."""

from __future__ import annotations

import pytest
from test_daemon_loop import Clock, Loop, node, policy, task

from xhagent.daemon.loop import decisions as decisions_module
from xhagent.daemon.loop import scheduler as scheduler_module
from xhagent.daemon.store import TaskState


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(), Clock())
    yield made
    made.close()


@pytest.fixture
def counted(monkeypatch):
    """decide_demand and preempt_for calls made by steps."""
    calls = {"decide": 0, "preempt": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for name, attr in (("decide", "decide_demand"), ("preempt", "preempt_for")):
        real = getattr(decisions_module, attr)
        monkeypatch.setattr(decisions_module, attr, counting(name, real))
    return calls


def pending_rows(loop, monkeypatch) -> list[int]:
    """Rows the store hands back for Pending tasks, per call."""
    got: list[int] = []
    real = loop.store.task_page

    def counting(states=None, **kwargs):
        out = real(states, **kwargs)
        if states is not None and TaskState.PENDING in list(states):
            got.append(len(out[0]))
        return out

    monkeypatch.setattr(loop.store, "task_page", counting)
    return got


def whole_node(name: str, extra: str = "") -> str:
    return task(name, "  requests: {cpus: 2}\n" + extra)


def test_a_backlog_of_one_demand_on_a_full_node_is_decided_once_a_step(loop, counted):
    (holder,) = loop.submit(whole_node("holder"))
    loop.step()
    ids = loop.submit(*[whole_node(f"w{i}") for i in range(5000)])
    counted["decide"] = counted["preempt"] = 0
    loop.step()
    # one decision for the demand and one look for victims, not 5,000 (nor 1,000) of each
    assert counted == {"decide": 1, "preempt": 1}
    for _ in range(2):  # nothing freed since: each task's answer stands, none is asked again
        counted["decide"] = counted["preempt"] = 0
        loop.step()
        assert counted == {"decide": 0, "preempt": 0}
    scan = scheduler_module.MAX_PENDING_SCAN
    kinds = [loop.store.get(t).first_reason for t in ids]
    assert set(kinds[:scan]) == {"InsufficientCPU"} and set(kinds[scan:]) == {"Queued"}
    (reason,) = loop.store.get(ids[scan - 1]).reasons
    assert reason.detail == "InsufficientCPU: n1 has 0 free CPUs, task needs 2"
    # the holder ends: the oldest waiting task starts, the rest are decided once again
    loop.executor.exit(holder, 0)
    counted["decide"] = counted["preempt"] = 0
    loop.step()
    assert loop.state(ids[0]) == TaskState.RUNNING
    assert [loop.state(t) for t in ids[1:50]] == [TaskState.PENDING] * 49
    assert counted["decide"] <= 2 and counted["preempt"] == 1
    # the window moves up by one: the task after it is read and says why it waits
    loop.step()
    assert loop.store.get(ids[scan]).first_reason == "InsufficientCPU"
    assert loop.store.get(ids[scan + 1]).first_reason == "Queued"


def visits(monkeypatch) -> list[str]:
    """The Pending tasks a step decides (StepDecisions.place), in order."""
    seen: list[str] = []
    real = decisions_module.StepDecisions.place

    def place(self, ask, rec, task):
        seen.append(rec.id)
        return real(self, ask, rec, task)

    monkeypatch.setattr(decisions_module.StepDecisions, "place", place)
    return seen


def test_a_step_in_an_unchanged_state_decides_only_what_is_new(loop, monkeypatch):
    (holder,) = loop.submit(whole_node("holder"))
    loop.step()
    waiting = loop.submit(*[whole_node(f"w{i}") for i in range(20)])
    seen = visits(monkeypatch)
    loop.step()
    assert seen == waiting  # each once, in the order of standing
    seen.clear()
    (late,) = loop.submit(whole_node("late"))
    (small,) = loop.submit(task("small", "  priority: 10\n  requests: {cpus: 1}\n"))
    loop.step()
    assert seen == [late, small]  # the backlog is not looked at again
    assert loop.store.get(late).first_reason == "InsufficientCPU"
    seen.clear()
    loop.scheduler.step(set())
    assert seen == []
    # the holder ends: the state changed, so every task is decided again, in order; the
    # first of them takes the node
    loop.executor.exit(holder, 0)
    loop.step()
    assert seen[:2] == waiting[:2] and loop.state(waiting[0]) == TaskState.RUNNING
    assert set(waiting[1:]) | {late, small} <= set(seen)
    # a change of policies asks again too
    seen.clear()
    loop.step()
    assert seen == []
    loop.policies = [parse_policy(policy(5))]
    loop.step()
    assert set(seen) == set(waiting[1:]) | {late, small}


def test_a_step_with_nothing_new_reads_no_pending_row(loop, monkeypatch):
    (holder,) = loop.submit(whole_node("holder"))
    loop.step()
    waiting = loop.submit(*[whole_node(f"w{i}") for i in range(20)])
    rows = pending_rows(loop, monkeypatch)
    loop.step()
    assert sum(rows) == 20  # the new ones, once
    rows.clear()
    for _ in range(3):
        loop.scheduler.step(set())
    assert sum(rows) == 0
    (late,) = loop.submit(whole_node("late"))
    loop.step()
    assert sum(rows) == 1  # the submission alone
    assert loop.store.get(late).first_reason == "InsufficientCPU"
    # a task that comes back to Pending (its restart) is not a submission: read again in full
    rows.clear()
    loop.executor.exit(holder, 0)
    loop.step()
    assert loop.state(waiting[0]) == TaskState.RUNNING
    assert sum(rows) == 0  # a start of the step's own: nothing to read again


def test_the_window_is_read_again_when_a_task_comes_back_to_pending(loop, monkeypatch):
    spec = (
        "  requests: {cpus: 2}\n  restartPolicy: {policy: OnFailure, maxRestarts: 1, backoff: 1s}\n"
    )
    (flaky,) = loop.submit(task("flaky", spec))
    loop.step()
    later = loop.submit(*[whole_node(f"w{i}") for i in range(3)])
    loop.step()
    rows = pending_rows(loop, monkeypatch)
    loop.executor.exit(flaky, 3)  # requeued, older than every task waiting
    loop.step()
    assert sum(rows) == 4  # the Pending set changed behind the window: all of it again
    # it waits out its backoff; the CPUs it gave back go to the next in line meanwhile
    assert loop.store.get(flaky).first_reason == "BackOff"
    assert loop.state(later[0]) == TaskState.RUNNING
    assert [loop.store.get(t).first_reason for t in later[1:]] == ["InsufficientCPU"] * 2
    loop.clock.advance(2)
    loop.executor.exit(later[0], 0)
    loop.step()
    assert loop.state(flaky) == TaskState.RUNNING  # the oldest of equal standing goes first


def test_order_by_standing_holds_across_steps_and_policy_changes(loop):
    (holder,) = loop.submit(whole_node("holder"))
    loop.step()
    low = loop.submit(*[whole_node(f"low{i}", "  priority: 10\n") for i in range(3)])
    loop.step()
    (high,) = loop.submit(whole_node("high", "  priority: 40\n"))
    loop.step()
    unset = loop.submit(whole_node("unset"))[0]  # its policy's priority, else 50
    loop.step()
    order = []
    running = holder
    for _ in range(3):
        loop.executor.exit(running, 0)
        loop.step()
        (running,) = [t for t, r in loop.executor.runs.items() if r.exit is None]
        order.append(running)
        if len(order) == 2:  # the policy raises the tasks that have none of their own to 5
            loop.policies = [parse_policy(policy(5))]
    assert order == [unset, high, low[0]]
    # a cancelled task in the window is not started after
    loop.scheduler.cancel(low[1])
    loop.executor.exit(running, 0)
    loop.step()
    assert loop.state(low[1]) == TaskState.CANCELLED and loop.state(low[2]) == TaskState.RUNNING


def parse_policy(text: str):
    from xhagent.daemon.policies.sources import parse_source

    (item,) = parse_source(text, "p.yaml")
    return item.value


def test_a_steps_reason_changes_are_one_transaction(loop):
    (holder,) = loop.submit(whole_node("holder"))
    loop.step()
    waiting = loop.submit(*[whole_node(f"w{i}") for i in range(5)])
    loop.step()
    batches = []
    observe = loop.store.on_commit

    def record(written):
        batches.append([e.detail for e, _ in written if e.kind == "Waiting"])
        observe(written)

    loop.store.on_commit = record
    # the holder ends and a one-CPU task of higher standing takes half the node: every
    # waiting task's reason changes (1 free CPU now), all in one commit
    loop.executor.exit(holder, 0)
    (small,) = loop.submit(task("small", "  priority: 90\n  requests: {cpus: 1}\n"))
    batches.clear()
    loop.step()
    assert loop.state(small) == TaskState.RUNNING
    reasons = [b for b in batches if b]  # Waiting: Pending, with reasons that changed
    assert [len(b) for b in reasons] == [5]
    assert all(d["from"] == d["to"] == "Pending" for d in reasons[0])
    for t in waiting:
        (reason,) = loop.store.get(t).reasons
        assert reason.detail == "InsufficientCPU: n1 has 1 free CPUs, task needs 2"


def test_a_submitted_document_is_parsed_once_and_the_window_holds_at_most_the_offers_cap(
    loop, monkeypatch
):
    parsed = []
    real = loop.scheduler.lifecycle.read_spec

    def reading(rec):
        parsed.append(rec.id)
        return real(rec)

    monkeypatch.setattr(loop.scheduler._pending, "_read_spec", reading)
    monkeypatch.setattr(loop.scheduler._pending, "_offers_max", 3)
    ids = loop.submit(*[whole_node(f"w{i}") for i in range(5)])
    loop.step()
    assert loop.state(ids[0]) == TaskState.RUNNING
    # the three offered came as their submission parsed them; the two past the cap are read
    assert parsed == ids[3:]
    assert [loop.store.get(t).first_reason for t in ids[1:]] == ["InsufficientCPU"] * 4
