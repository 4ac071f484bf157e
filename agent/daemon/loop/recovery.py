"""What a restarted agent does first: make the records, the kernel and the shims agree.

Whatever point a kill -9 interrupted: a start that never reached the shim is rolled back
(the task waits again), a kill that was under way is completed (a cancel cancels, a
preemption requeues), a workload that still runs is re-adopted through its shim (pid and
start time checked), one that ended meanwhile is recorded with the status its shim wrote,
one whose shim died without a record is killed and recorded as lost, a leaf's freeze state
is made to match its task's record, a move between devices that was under way is completed
(migration.py: stopped, checkpointed, started on its target or where it was), and leaves no
task owns are removed. Each kind of intent has one branch below.

A stop asked for meanwhile ends recovery between two items (`checkpoint` raises): each
item is whole on its own, so what is left is what a kill -9 at that point would leave,
and the next start recovers it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..store import NEEDS_PLACEMENT, CorruptTask, TaskRecord, TaskState
from .lifecycle import Lifecycle
from .migration import MigrationController
from .preemption import KILL_TIMEOUT_S, preempted_reason


def recover(
    lc: Lifecycle, migration: MigrationController, checkpoint: Callable[[], None] = lambda: None
) -> dict[str, int]:
    """Finish or roll back what a kill -9 interrupted, re-adopt the workloads that still
    run, record those that ended meanwhile with their real status, and remove leaves
    no task owns. Returns counts for the log; `checkpoint()` is called before each item."""
    store, executor = lc.store, lc.executor
    counts = {"adopted": 0, "ended": 0, "rolled_back": 0, "orphan_leaves": 0, "moved": 0}
    moves = []  # (intent, the stopped task): started again once every placement is back
    for intent in store.open_intents():
        checkpoint()
        rec = store.get(intent.task_id)
        if intent.action == "migrate" and rec is not None:
            stopped = migration.resume_stop(rec, intent.args or {})
            if stopped is not None:
                moves.append((intent, stopped))
                continue
        elif intent.action == "start" and rec is not None and rec.state == TaskState.STARTING:
            status = executor.status(rec.id, rec.attempt)
            if status.started is None and status.exit is None:
                # The shim never said it started: nothing of the workload runs.
                executor.remove_leaf(rec.id)
                store.transition(
                    rec.id,
                    TaskState.PENDING,
                    expect=TaskState.STARTING,
                    note="start rolled back after a restart",
                )
                counts["rolled_back"] += 1
        elif intent.action == "kill" and rec is not None and rec.state in NEEDS_PLACEMENT:
            complete_kill(lc, rec, (intent.args or {}).get("preempted_by"))
            counts["ended"] += 1
        store.finish_intent(intent.id, "recovered")
    for rec in store.each_task(NEEDS_PLACEMENT):
        checkpoint()
        lc.hold(rec)
        status = executor.status(rec.id, rec.attempt)
        if status.exit is not None:
            lc.finish(rec, status)
            counts["ended"] += 1
        elif status.started is not None and executor.shim_alive(status.started):
            if rec.state == TaskState.STARTING:
                rec = store.transition(rec.id, TaskState.RUNNING, expect=TaskState.STARTING)
            # a freeze or thaw cut half-way: the kernel is made to match the record
            executor.set_frozen(rec.id, rec.state == TaskState.FROZEN)
            lc.supervise(rec.id, status.started.shim_pid, None)
            counts["adopted"] += 1
        else:  # the shim died without a record: its workload cannot be supervised
            executor.kill(rec.id)
            lc.finish(rec, status, lost=True)
            counts["ended"] += 1
    for intent, stopped in moves:
        checkpoint()
        out = migration.resume_restart(stopped, intent.args or {})
        store.finish_intent(intent.id, f"recovered: {out['outcome']}")
        counts["moved"] += bool(out.get("moved"))
    live = {r.id for r in store.each_task(NEEDS_PLACEMENT)}
    for task_id in executor.leaves():
        checkpoint()
        if task_id not in live and not _unreadable(store, task_id):
            executor.remove_leaf(task_id)
            counts["orphan_leaves"] += 1
    for rec in store.each_task([*NEEDS_PLACEMENT, TaskState.PENDING]):
        checkpoint()
        lc.note_deadline(rec)
    return counts


def _unreadable(store, task_id: str) -> bool:
    """Its row cannot be read: whether it owns its leaf is unknown, so the leaf (and what
    runs in it) is kept, not removed as an orphan's."""
    try:
        store.get(task_id, unreadable=True)
    except CorruptTask:
        return True
    return False


def complete_kill(lc: Lifecycle, rec: TaskRecord, preempted_by: str | None) -> None:
    """A kill the last run had started: a preemption requeues, a cancel cancels."""
    status = lc.kill(rec, KILL_TIMEOUT_S)
    if not preempted_by:
        lc.finish(rec, status, cancelled=True)
        return
    reason = preempted_reason(lc, preempted_by)
    lc.evict(rec, status, reason, f"preempted by {preempted_by}", preempted=True)
