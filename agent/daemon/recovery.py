"""What a restarted agent does first: make the records, the kernel and the shims agree.

Whatever point a kill -9 interrupted: a start that never reached the shim is rolled back
(the task waits again), a kill that was under way is completed (a cancel cancels, a
preemption requeues), a workload that still runs is re-adopted through its shim (pid and
start time checked), one that ended meanwhile is recorded with the status its shim wrote,
one whose shim died without a record is killed and recorded as lost, a leaf's freeze state
is made to match its task's record, a move between devices that was under way is completed
(migrating.py: stopped, checkpointed, started on its target or where it was), and leaves no
task owns are removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .holdings import allocation_of
from .lifecycle import NEEDS_PLACEMENT
from .lifecycle import TaskState as S
from .shim import process_alive
from .store import TaskRecord

if TYPE_CHECKING:
    from .core import Agent


def recover(agent: Agent) -> dict[str, int]:
    """Finish or roll back what a kill -9 interrupted, re-adopt the workloads that still
    run, record those that ended meanwhile with their real status, and remove leaves
    no task owns. Returns counts for the log."""
    from .migrating import resume_restart, resume_stop

    counts = {"adopted": 0, "ended": 0, "rolled_back": 0, "orphan_leaves": 0, "moved": 0}
    moves = []  # (intent, the stopped task): started again once every placement is back
    with agent.lock:
        for intent in agent.store.open_intents():
            rec = agent.store.get(intent.task_id)
            if intent.action == "migrate" and rec is not None:
                stopped = resume_stop(agent, rec, intent.args or {})
                if stopped is not None:
                    moves.append((intent, stopped))
                    continue
            elif intent.action == "start" and rec is not None and rec.state == S.STARTING:
                status = agent.executor.status(rec.id, rec.attempt)
                if status.started is None and status.exit is None:
                    # The shim never said it started: nothing of the workload runs.
                    agent.executor.remove_leaf(rec.id)
                    agent.store.transition(
                        rec.id,
                        S.PENDING,
                        expect=S.STARTING,
                        note="start rolled back after a restart",
                    )
                    counts["rolled_back"] += 1
            elif intent.action == "kill" and rec is not None and rec.state in NEEDS_PLACEMENT:
                complete_kill(agent, rec, (intent.args or {}).get("preempted_by"))
                counts["ended"] += 1
            agent.store.finish_intent(intent.id, "recovered")
        for rec in agent.records(NEEDS_PLACEMENT):
            agent.tasks.setdefault(rec.id, agent.task_of(rec))
            agent.cluster.commit(allocation_of(rec))
            status = agent.executor.status(rec.id, rec.attempt)
            if status.exit is not None:
                agent.finish(rec, status)
                counts["ended"] += 1
            elif status.started is not None and process_alive(
                status.started.shim_pid, status.started.shim_start_time
            ):
                if rec.state == S.STARTING:
                    rec = agent.store.transition(rec.id, S.RUNNING, expect=S.STARTING)
                # a freeze or thaw cut half-way: the kernel is made to match the record
                agent.executor.set_frozen(rec.id, rec.state == S.FROZEN)
                agent.supervise(rec.id, status.started.shim_pid, None)
                counts["adopted"] += 1
            else:  # the shim died without a record: its workload cannot be supervised
                agent.executor.kill(rec.id)
                agent.finish(rec, status, lost=True)
                counts["ended"] += 1
        for intent, stopped in moves:
            out = resume_restart(agent, stopped, intent.args or {})
            agent.store.finish_intent(intent.id, f"recovered: {out['outcome']}")
            counts["moved"] += bool(out.get("moved"))
        live = {r.id for r in agent.records(NEEDS_PLACEMENT)}
        for task_id in agent.executor.leaves():
            if task_id not in live:
                agent.executor.remove_leaf(task_id)
                counts["orphan_leaves"] += 1
        for rec in agent.records([*NEEDS_PLACEMENT, S.PENDING]):
            agent.note_deadline(rec)
    return counts


def complete_kill(agent: Agent, rec: TaskRecord, preempted_by: str | None) -> None:
    """A kill the last run had started: a preemption requeues, a cancel cancels."""
    agent.executor.kill(rec.id)
    status = agent.wait_exit(rec, 3.0)
    if not preempted_by:
        agent.finish(rec, status, cancelled=True)
        return
    agent.executor.remove_leaf(rec.id)
    reason = {
        "kind": "Preempted",
        "node": agent.node.name,
        "detail": f"preempted by {preempted_by}",
    }
    agent.store.transition(
        rec.id, S.PENDING, expect=rec.state, reasons=[reason], preempted=rec.preempted + 1
    )
