"""What a restarted agent does first: make the records, the kernel and the shims agree.

Whatever point a kill -9 interrupted: a start that never reached the shim is rolled back
(the task waits again), a kill that was under way is completed (a cancel cancels, a
preemption requeues), a workload that still runs is re-adopted through its shim (pid and
start time checked), one that ended meanwhile is recorded with the status its shim wrote,
one whose shim died without a record is killed and recorded as lost, a leaf's freeze state
is made to match its task's record, a move between devices that was under way is completed
(migration.py: stopped, checkpointed, started on its target or where it was), and leaves no
task owns are removed. A kill and a move each have a branch below; a start's intent says no
more than its task's state (Starting) does, and is rolled back from that.

An intent whose row cannot be read is reported (logged, and an `IntentUnreadable` event) and
finished as unreadable, so that no later start meets it again. What it began is not known:
its task, like every task that holds a placement, is looked at by what its record and its
shim say.

A stop asked for meanwhile ends recovery between two items (`checkpoint` raises): each
item is whole on its own, so what is left is what a kill -9 at that point would leave,
and the next start recovers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..store import (
    NEEDS_PLACEMENT,
    CorruptIntent,
    CorruptTask,
    NotFound,
    Store,
    TaskRecord,
    TaskState,
)
from .lifecycle import Lifecycle, NotHeld
from .migration import MigrationController
from .preemption import KILL_TIMEOUT_S, preempted_reason

log = logging.getLogger("xhagent")
INTENT_UNREADABLE = "IntentUnreadable"  # the event of an intent recovery could not read


def recover(
    lc: Lifecycle, migration: MigrationController, checkpoint: Callable[[], None] = lambda: None
) -> dict[str, int]:
    """Finish or roll back what a kill -9 interrupted, re-adopt the workloads that still
    run, record those that ended meanwhile with their real status, and remove leaves
    no task owns. Returns counts for the log; `checkpoint()` is called before each item."""
    store, executor = lc.store, lc.executor
    counts = dict.fromkeys(
        (
            "adopted",
            "ended",
            "rolled_back",
            "orphan_leaves",
            "moved",
            "unreadable_intents",
            "not_held",
        ),
        0,
    )
    moves = []  # (intent, the stopped task): started again once every placement is back
    for intent in store.open_intents():
        checkpoint()
        if isinstance(intent, CorruptIntent):
            _finish_unreadable(store, intent)
            counts["unreadable_intents"] += 1
            continue
        rec = store.get(intent.task_id)
        if intent.action == "migrate" and rec is not None:
            stopped = migration.resume_stop(rec, intent.args or {})
            if stopped is not None:
                moves.append((intent, stopped))
                continue
        elif intent.action == "kill" and rec is not None and rec.state in NEEDS_PLACEMENT:
            complete_kill(lc, rec, (intent.args or {}).get("preempted_by"))
            counts["ended"] += 1
        store.finish_intent(intent.id, "recovered")
    for rec in store.each_task(NEEDS_PLACEMENT):
        checkpoint()
        status = executor.status(rec.id, rec.attempt)
        if rec.state == TaskState.STARTING and status.started is None and status.exit is None:
            # The shim never said it started: nothing of the workload runs. Here, not by its
            # intent: one whose row cannot be read leaves the same task to roll back.
            executor.remove_leaf(rec.id)
            store.transition(
                rec.id,
                TaskState.PENDING,
                expect=TaskState.STARTING,
                note="start rolled back after a restart",
            )
            counts["rolled_back"] += 1
            continue
        try:
            lc.hold(rec)
        except NotHeld as exc:
            _not_held(lc, rec, status, str(exc))
            counts["not_held"] += 1
            continue
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


def _not_held(lc: Lifecycle, rec: TaskRecord, status, why: str) -> None:
    """A task whose record cannot hold its placement again is that task's problem alone:
    the agent starts all the same. One that ended meanwhile is recorded as it ended; one that
    still runs is stopped, as its resources cannot be accounted for (it would run unseen
    beside what is placed next), and recorded Failed with why."""
    log.error("task %s: not recovered: %s", rec.id, why)
    if status.exit is not None:
        lc.finish(rec, status)
        return
    lc.executor.kill(rec.id)
    lc.executor.remove_leaf(rec.id)
    lc.store.transition(
        rec.id,
        TaskState.FAILED,
        expect=rec.state,
        error=f"not recovered after a restart: {why}",
        note="not recovered after a restart",
    )


def _finish_unreadable(store: Store, corrupt: CorruptIntent) -> None:
    """Report an intent whose row cannot be read, once (a log line and an event, its task's
    where that reads), and finish it as unreadable."""
    message = f"{corrupt}; finished as unreadable"
    log.error("%s", message)
    detail = {"intent": corrupt.intent_id, "column": corrupt.column}
    with store.atomic():
        try:
            store.add_event(INTENT_UNREADABLE, message, task_id=corrupt.task_id, detail=detail)
        except NotFound:  # the id it holds is no task's
            store.add_event(INTENT_UNREADABLE, message, detail=detail)
        store.finish_intent(
            corrupt.intent_id, f"unreadable: column {corrupt.column}: {corrupt.problem}"
        )


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
