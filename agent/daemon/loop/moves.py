"""A move between devices, enacted: an intent `migrate` in the store first (from, to, the
attempt it stops, why), then stop (`cgroup.kill` of its leaf, its exit recorded by its
shim), give its allocation back, run its checkpoint hook (checkpoint.py), and start it again
as a new attempt on the target: the same CPUs and memory, the target's GPU share or TPU
chip. The old allocation is released before the new one is committed, each once. A
checkpoint that fails or times out cancels the move: the task starts again where it was,
and the event says why.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace

from ...policy.placement import Candidate, Reason
from ...policy.policy import choose
from ...policy.state import NodeResources
from ...policy.task import Task
from ...sched import migration
from ..store import Placement, TaskRecord, TaskState, WaitReason
from .checkpoint import STOP_TIMEOUT_S, Hook, run_checkpoint, start_checkpoint
from .lifecycle import Lifecycle, candidate_of

log = logging.getLogger("xhagent")

MIGRATING = "Migrating"  # the reason of a task between its stop and its restart


def move(lc: Lifecycle, task_id: str, detail: dict, policies) -> dict | Hook | None:
    """Stop `task_id`, run its checkpoint, start it on `detail["to"]` (or where it was, when
    the checkpoint failed). Returns the event's detail; the Hook when its checkpoint runs
    on (the task is started once it ends: `finish_move`); None when nothing was moved."""
    rec = lc.store.get(task_id)
    task = lc.spec(task_id)
    if rec is None or rec.state != TaskState.RUNNING or task is None or not task.migratable:
        return None
    detail = {**detail, "attempt": rec.attempt, "placement": rec.placement.to_json()}
    intent = lc.store.begin_intent(task_id, "migrate", detail)
    pending, why = stop(lc, rec, detail)
    if pending is None:
        lc.store.finish_intent(intent, f"not moved: {why}")
        lc.store.add_event(
            "MigrationFailed",
            f"not moved from {detail['from']} to {detail['to']}: {why}",
            task_id=task_id,
            detail=_public(detail) | {"error": why},
        )
        return None
    hook = start_checkpoint(lc, pending, task, detail)
    if isinstance(hook, Hook):
        hook.intent, hook.task = intent, task
        return hook
    out = restart(lc, pending, task, detail, hook, policies)
    lc.store.finish_intent(intent, out["outcome"])
    return out


def finish_move(lc: Lifecycle, hook: Hook, error: str | None, policies) -> dict:
    """The checkpoint of a move ended (`error`: None, or why it failed): start the task."""
    pending = lc.store.get(hook.task_id)
    if pending is None or pending.state != TaskState.PENDING or pending.attempt != hook.attempt:
        state = pending.state if pending is not None else "gone"
        lc.store.finish_intent(hook.intent, f"not restarted: the task is {state} now")
        return {"moved": False}
    out = restart(lc, pending, hook.task, hook.detail, error, policies)
    lc.store.finish_intent(hook.intent, out["outcome"])
    return out


def stop(lc: Lifecycle, rec: TaskRecord, detail: dict) -> tuple[TaskRecord | None, str]:
    """Kill the workload and requeue the task (Pending, reason Migrating, its allocation
    given back): the Pending record, or None and why (it ended on its own: recorded as
    such; it could not be stopped: it keeps running where it is)."""
    status = lc.kill(rec, STOP_TIMEOUT_S)
    ex = status.exit
    if ex is None:
        return None, f"the workload did not stop within {STOP_TIMEOUT_S:g}s"
    if ex.signal != signal.SIGKILL:  # it ended before the kill landed: an end like any other
        lc.finish(rec, status)
        return None, "it ended on its own before it was stopped"
    where = f"from {detail['from']} to {detail['to']}"
    reason = WaitReason(MIGRATING, lc.node.name, f"moving {where}")
    pending = lc.evict(rec, status, reason, f"stopped to move {where}", migrated=True)
    return pending, ""


def restart(
    lc: Lifecycle, pending: TaskRecord, task: Task, detail: dict, error: str | None, policies
) -> dict:
    """After the checkpoint (`error`: None when it succeeded or there is none, else why
    not), start the Pending task on the target, else where it was, else leave it to the
    scheduler; records the event. Returns the event's detail plus `moved` and the intent's
    `outcome`."""
    st = lc.cluster.nodes[lc.node.name]
    old = Placement.from_json(detail["placement"])
    out = _public(detail)
    out["checkpoint"] = "none" if task.checkpoint is None else ("ok" if error is None else "failed")
    where = None
    if error is None:
        target = target_placement(lc, task, old, detail["to"], policies)
        if isinstance(target, Reason):
            error = f"the target no longer admits it: {target}"
        elif not fits(st, target, pending.id):
            error = "the target is taken"
        else:
            where = target
    moving = where is not None
    if where is None:
        back = candidate_of(old)
        where = back if fits(st, back, pending.id) else None
    if error is not None:
        out["error"] = error
    if where is None:  # placed again by the scheduler, like any Pending task
        out |= {"moved": False, "outcome": "requeued", "attempt": pending.attempt}
        message = f"stopped on {detail['from']}; waits to be placed again: {error}"
        lc.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
        return out
    rec = lc.start(pending, task, where)
    out["attempt"] = rec.attempt
    if rec.state not in (TaskState.RUNNING, TaskState.STARTING):  # the task's own failure
        out |= {"moved": False, "outcome": f"start failed: {rec.error}", "error": rec.error}
        message = f"not moved to {detail['to']}: the start failed: {rec.error}"
        lc.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
    elif moving:
        out |= {"moved": True, "outcome": "moved"}
        message = f"moved from {detail['from']} to {detail['to']}: {detail['reason']}"
        lc.store.add_event("Migrated", message, task_id=pending.id, detail=_clean(out))
    else:
        out |= {"moved": False, "outcome": "restarted where it was"}
        message = f"not moved to {detail['to']}, started again on {detail['from']}: {error}"
        lc.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
    return out


def target_placement(
    lc: Lifecycle, task: Task, old: Placement, dst: str, policies
) -> Candidate | Reason:
    """The candidate on `dst` (a Device id) for a task no longer in the placement state: the
    device share placement gives it there, its CPUs and memory as they were."""
    node, _, device = dst.partition("/")
    kind = device.rstrip("0123456789")
    index = int(device[len(kind) :])
    st = lc.cluster.nodes.get(node)
    numa = 0
    if st is not None and kind == "gpu" and any(g.index == index for g in st.gpus):
        numa = st.gpu(index).numa or 0
    elif st is not None and kind == "tpu" and any(t.index == index for t in st.tpus):
        numa = st.tpu(index).numa or 0
    match = choose(policies, task.label_map)
    r = migration.Running(replace(task, name="migrating"), match, "")
    got = migration.placement_on(lc.cluster, r, migration.Device(node, kind, index, 0.0, numa))
    if isinstance(got, Reason):
        return got
    return replace(candidate_of(old), gpus=got.gpus, tpus=got.tpus)


def fits(st: NodeResources, c: Candidate, task_id: str) -> bool:
    """Whether `c` can be committed on `st` now without taking what another task holds:
    its CPUs free, its memory, a GPU share's memory (a whole one: nobody on that GPU), its
    TPU chips free."""
    if task_id in st.tasks or not set(c.cpus) <= st.free_cpus or c.memory > st.memory_free:
        return False
    for share in c.gpus:
        if not any(g.index == share.index for g in st.gpus):
            return False
        g = st.gpu(share.index)
        if g.whole or (share.whole and g.holders) or share.memory > g.free:
            return False
    for i in c.tpus:
        if not any(t.index == i for t in st.tpus) or st.tpu(i).holders:
            return False
    return True


def _public(detail: dict) -> dict:
    return {k: v for k, v in detail.items() if k != "placement"}


def _clean(out: dict) -> dict:
    return {k: v for k, v in out.items() if k not in ("moved", "outcome", "placement")}


# -- after a restart (recovery.py) ----------------------------------------------------------------


def resume_stop(lc: Lifecycle, rec: TaskRecord, args: dict) -> TaskRecord | None:
    """The first half of an open `migrate` intent, before the placements are re-established:
    the task stopped and Pending (to be restarted by `resume_restart`), or None when there is
    nothing left of the move to do (it was restarted, or ended)."""
    if rec.attempt != args.get("attempt"):  # started again already: its start's intent says
        return None
    if rec.state == TaskState.PENDING and rec.first_reason == MIGRATING:
        return rec
    if rec.state != TaskState.RUNNING:
        return None
    pending, why = stop(lc, rec, args)
    if pending is None:
        log.warning("task %s: a move cut by a restart could not be completed: %s", rec.id, why)
    return pending


def resume_restart(lc: Lifecycle, rec: TaskRecord, args: dict, policies) -> dict:
    """The second half, once every live task holds its placement again."""
    task = lc.read_spec(rec)
    lc.keep_spec(rec.id, task)
    detail = {**args, "recovered": True}
    return restart(lc, rec, task, detail, run_checkpoint(lc, rec, task, detail), policies)
