"""Preemption in the daemon: the policy core chooses the victims (`choose_victims`), this
module stops them and brings frozen ones back.

A victim is frozen (`cgroup.freeze`, thawed back when it cannot be confirmed or recorded:
never a group left frozen without a record) or killed and requeued, each under an intent;
a frozen task keeps its memory and GPUs and gives its CPUs to the preemptor, and resumes,
highest standing first, once its CPUs are free again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...policy.placement import Candidate, Demand, decide_demand
from ...policy.policy import choose
from ...policy.preemption import Standing as Victim
from ...policy.preemption import choose_victims
from ...policy.task import Task
from ..store import TaskRecord, TaskState, WaitReason
from .lifecycle import Lifecycle, allocation_of
from .ranking import Ranking, standing_of

FREEZE_TIMEOUT_S = 2.0
KILL_TIMEOUT_S = 3.0


def preempt_for(
    lc: Lifecycle,
    rec: TaskRecord,
    task: Task,
    demand: Demand,
    policies,
    inherited: Callable[[str], int | None] = lambda task_id: None,
) -> Candidate | None:
    """Freeze or kill the victims the core chooses so that `rec` fits; where it goes, or
    None (nothing to preempt, or a victim could not be stopped: then nothing changed
    for the preemptor, and the victims stopped so far stay stopped until thawed).
    `inherited(id)`: the deadline a running task holds for a waiter under edf-pic (its
    resource's earlier-deadline waiter's), which it stands by as a victim too: a holder
    frozen for a later deadline would keep the waiter waiting."""
    match = choose(policies, task.label_map)
    rule = match.policy.preemption if match.policy else "lower-priority"
    mine = standing_of(task, rec.created_ns, policies)
    # `queueing`: the node's order decides, as the simulator's preemptive disciplines do
    ranking = Ranking(policies) if rule == "queueing" else None
    ranked = ranking is not None and ranking.preemptive
    running = []
    node = lc.cluster.nodes[lc.node.name]
    for other in lc.store.list_tasks([TaskState.RUNNING], limit=1000):
        held = node.tasks.get(other.id)
        other_task = lc.spec(other.id)
        if held is None or other_task is None or not (held.cpus or held.gpus or held.tpus):
            continue  # holds nothing a placement could take (a shared task)
        s = standing_of(other_task, other.created_ns, policies)
        lent = inherited(other.id)
        deadline = s.deadline_ns if lent is None else min(s.deadline_ns, lent)
        rank = ranking.key(other.id, other_task, other.created_ns, lent) if ranked else None
        running.append(
            Victim(held, s.priority, deadline, other_task.preemption, other.started_ns or 0, rank)
        )
    plan = choose_victims(
        rec.id,
        demand,
        lc.cluster,
        running,
        rule=rule,
        priority=mine.priority,
        deadline_ns=mine.deadline_ns,
        rank=ranking.key(rec.id, task, rec.created_ns) if ranked else None,
    )
    if plan is None:
        return None
    for victim in plan.victims:
        if not stop_victim(lc, victim, rec.id):
            return None
    return decide_demand(rec.id, demand, lc.cluster).placed


def stop_victim(lc: Lifecycle, victim: Victim, preemptor: str) -> bool:
    task_id = victim.allocation.task
    rec = lc.store.get(task_id)
    why = f"preempted by {preemptor}"
    if victim.mode == "freeze":
        intent = lc.store.begin_intent(task_id, "freeze", {"preempted_by": preemptor})
        try:
            lc.executor.leaf(task_id).freeze(timeout=FREEZE_TIMEOUT_S)  # thaws back on failure
        except (OSError, ValueError) as exc:
            lc.store.finish_intent(intent, f"failed: {exc}")
            lc.store.add_event("PreemptionFailed", f"{why}: {exc}", task_id=task_id)
            return False
        try:
            with lc.store.atomic():
                lc.store.transition(task_id, TaskState.FROZEN, expect=TaskState.RUNNING, note=why)
                lc.store.finish_intent(intent, "frozen")
        except BaseException:  # not recorded: never leave it frozen
            lc.executor.set_frozen(task_id, False)
            raise
        lc.cluster.release(task_id)
        lc.cluster.commit(replace(victim.allocation, cpus=()))
        return True
    intent = lc.store.begin_intent(task_id, "kill", {"preempted_by": preemptor})
    status = lc.kill(rec, KILL_TIMEOUT_S)
    reason = preempted_reason(lc, preemptor)
    lc.evict(rec, status, reason, why, preempted=True, intent=(intent, "killed"))
    return True


def preempted_reason(lc: Lifecycle, preemptor: str) -> WaitReason:
    return WaitReason("Preempted", lc.node.name, f"preempted by {preemptor}")


def thaw_frozen(lc: Lifecycle, policies) -> None:
    """A frozen task resumes once its CPUs are free again, highest standing first."""
    frozen = lc.store.list_tasks([TaskState.FROZEN], limit=1000)
    if not frozen:
        return
    ranking = Ranking(policies)
    ordered = sorted(frozen, key=lambda r: ranking.key(r.id, lc.spec(r.id), r.created_ns))
    for rec in ordered:
        whole = allocation_of(replace(rec, state=TaskState.RUNNING))
        lc.cluster.release(rec.id)
        try:
            lc.cluster.commit(whole)
        except ValueError:  # still held by its preemptor or another task
            lc.cluster.commit(allocation_of(rec))
            continue
        intent = lc.store.begin_intent(rec.id, "thaw")
        try:
            lc.executor.leaf(rec.id).thaw(timeout=FREEZE_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            lc.cluster.release(rec.id)
            lc.cluster.commit(allocation_of(rec))
            lc.store.finish_intent(intent, f"failed: {exc}")
            lc.store.add_event("ThawFailed", str(exc), task_id=rec.id)
            continue
        with lc.store.atomic():
            lc.store.transition(rec.id, TaskState.RUNNING, expect=TaskState.FROZEN, note="resumed")
            lc.store.finish_intent(intent, "thawed")
