"""Preemption in the daemon: the policy core chooses the victims (`choose_victims`), this
module stops them and brings frozen ones back.

A victim is frozen (`cgroup.freeze`, thawed back when it cannot be confirmed or recorded:
never a group left frozen without a record) or killed and requeued, each under an intent;
a frozen task keeps its memory and GPUs and gives its CPUs to the preemptor, and resumes,
highest priority first, once its CPUs are free again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..policy.placement import Demand, decide_demand
from ..policy.policy import choose
from ..policy.preemption import Standing, choose_victims
from ..policy.task import Task
from .holdings import allocation_of
from .lifecycle import TaskState as S
from .store import TaskRecord

if TYPE_CHECKING:
    from .core import Agent


def preempt_for(agent: Agent, rec: TaskRecord, task: Task, demand: Demand, policies):
    """Freeze or kill the victims the core chooses so that `rec` fits; where it goes, or
    None (nothing to preempt, or a victim could not be stopped: then nothing changed
    for the preemptor, and the victims stopped so far stay stopped until thawed)."""
    match = choose(policies, task.label_map)
    rule = match.policy.preemption if match.policy else "lower-priority"
    priority, deadline = agent.standing(rec, task, policies)
    running = []
    for other in agent.store.list_tasks([S.RUNNING], limit=1000):
        held = agent.cluster.nodes[agent.node.name].tasks.get(other.id)
        other_task = agent.tasks.get(other.id)
        if held is None or other_task is None or not (held.cpus or held.gpus or held.tpus):
            continue  # holds nothing a placement could take (a shared task)
        p, d = agent.standing(other, other_task, policies)
        running.append(Standing(held, p, d, other_task.preemption, other.started_ns or 0))
    plan = choose_victims(
        rec.id,
        demand,
        agent.cluster,
        running,
        rule=rule,
        priority=priority,
        deadline_ns=deadline,
    )
    if plan is None:
        return None
    for victim in plan.victims:
        if not stop_victim(agent, victim, rec.id):
            return None
    decision = decide_demand(rec.id, demand, agent.cluster)
    return decision.placed


def stop_victim(agent: Agent, victim: Standing, preemptor: str) -> bool:
    task_id = victim.allocation.task
    rec = agent.store.get(task_id)
    why = f"preempted by {preemptor}"
    if victim.mode == "freeze":
        intent = agent.store.begin_intent(task_id, "freeze", {"preempted_by": preemptor})
        try:
            agent.executor.leaf(task_id).freeze(timeout=2.0)  # thaws back on failure
        except (OSError, ValueError) as exc:
            agent.store.finish_intent(intent, f"failed: {exc}")
            agent.store.add_event("PreemptionFailed", f"{why}: {exc}", task_id=task_id)
            return False
        try:
            with agent.store.atomic():
                agent.store.transition(task_id, S.FROZEN, expect=S.RUNNING, note=why)
                agent.store.finish_intent(intent, "frozen")
        except BaseException:  # not recorded: never leave it frozen
            agent.executor.set_frozen(task_id, False)
            raise
        agent.cluster.release(task_id)
        agent.cluster.commit(replace(victim.allocation, cpus=()))
        return True
    intent = agent.store.begin_intent(task_id, "kill", {"preempted_by": preemptor})
    agent.executor.kill(task_id)
    status = agent.wait_exit(rec, 3.0)
    agent.release(task_id)
    agent.executor.remove_leaf(task_id)
    ex = status.exit
    reason = {"kind": "Preempted", "node": agent.node.name, "detail": why}
    with agent.store.atomic():
        agent.store.transition(
            task_id,
            S.PENDING,
            expect=S.RUNNING,
            reasons=[reason],
            note=why,
            preempted=rec.preempted + 1,
            exit_code=ex.exit_code if ex else None,
            signal=ex.signal if ex else None,
        )
        agent.store.finish_intent(intent, "killed")
    return True


def thaw_frozen(agent: Agent) -> None:
    """A frozen task resumes once its CPUs are free again, highest priority first."""
    frozen = agent.store.list_tasks([S.FROZEN], limit=1000)
    policies = agent.policies()
    for rec in sorted(frozen, key=lambda r: agent.order_key(r, agent.tasks[r.id], policies)):
        whole = allocation_of(replace(rec, state=S.RUNNING))
        agent.cluster.release(rec.id)
        try:
            agent.cluster.commit(whole)
        except ValueError:  # still held by its preemptor or another task
            agent.cluster.commit(allocation_of(rec))
            continue
        intent = agent.store.begin_intent(rec.id, "thaw")
        try:
            agent.executor.leaf(rec.id).thaw(timeout=2.0)
        except (OSError, ValueError) as exc:
            agent.cluster.release(rec.id)
            agent.cluster.commit(allocation_of(rec))
            agent.store.finish_intent(intent, f"failed: {exc}")
            agent.store.add_event("ThawFailed", str(exc), task_id=rec.id)
            continue
        with agent.store.atomic():
            agent.store.transition(rec.id, S.RUNNING, expect=S.FROZEN, note="resumed")
            agent.store.finish_intent(intent, "thawed")
