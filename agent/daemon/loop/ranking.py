"""A task's standing and the node's order of Pending tasks.

Standing: its priority (its own, else its winning policy's, else 50) and its deadline, from
the policies in force now; preemption compares by it, and `get`/`ps` show it.

Order: the discipline that `spec.queueing` names among the policies in force (default
`priority`: higher priority first, then the earliest deadline, then submission; `mlq`: its
levels by the task's labels, then the deadline; `fair`: the least vruntime), applied to
each task as a `Job`. The discipline is the simulator's own (xhagent.sched.queues), so
`xhagent simulate` predicts the order the loop starts tasks in: one rule, not two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...policy.policy import choose, deciding_queueing
from ...policy.preemption import NO_DEADLINE
from ...policy.task import Task
from ...sched.fair import FairShare
from ...sched.job import Job, from_task

DEFAULT_PRIORITY = 50
MAX_LABEL_SETS = 4096  # matches a Ranking keeps


@dataclass(frozen=True)
class Standing:
    priority: int
    policy: str  # the SchedulingPolicy that decides for it; "" for none
    deadline_ns: int  # NO_DEADLINE for none


def standing(
    own_priority: int | None,
    labels: Mapping[str, str],
    deadline_ns: int | None,
    policies: Iterable,
    chosen: dict | None = None,
) -> Standing:
    """`chosen`, given, keeps each set of labels' match across calls on the same policies:
    a page of tasks mostly holds a few sets of labels, and matching is the costly part."""
    if chosen is None:
        match = choose(policies, labels)
    else:
        key = tuple(labels.items())
        match = chosen.get(key)
        if match is None:
            match = chosen[key] = choose(policies, labels)
    priority = own_priority
    if priority is None:
        priority = match.policy.priority if match.policy else DEFAULT_PRIORITY
    return Standing(
        priority,
        match.policy.name if match.policy else "",
        NO_DEADLINE if deadline_ns is None else deadline_ns,
    )


def standing_of(task: Task, created_ns: int, policies: Iterable) -> Standing:
    deadline = task.deadline.at(created_ns) if task.deadline else None
    return standing(task.priority, task.label_map, deadline, policies)


def queued_job(task_id: str, task: Task, created_ns: int, s: Standing) -> Job:
    """The task as the disciplines see it: named by its id (ids sort by submission),
    arriving when it was submitted, with the priority and deadline of its standing."""
    deadline = None if s.deadline_ns == NO_DEADLINE else s.deadline_ns
    return from_task(task, created_ns, name=task_id, priority=s.priority, deadline_ns=deadline)


class Ranking:
    """The order under `policies`: `key(...)` sorts the most urgent task first.

    Under `fair` the key is the task's vruntime in `fair` (the node's FairShare, kept by
    fairness.py): a task keyed for the first time joins it at the least vruntime, as a
    job arriving in the simulator does, so its place in the order is fixed from then on
    while it waits."""

    def __init__(self, policies: Sequence, fair: FairShare | None = None):
        self.policies = policies
        queueing, self.decided_by = deciding_queueing(policies)
        self.algorithm = queueing.algorithm
        self._fair = None
        if queueing.algorithm == "fair":
            self._fair = fair if fair is not None else FairShare()
        d = queueing.discipline(fair=self._fair) if self._fair else queueing.discipline()
        self._key, self.preemptive, self.time_sliced = d.key, d.preemptive, d.time_sliced
        self._chosen: dict = {}  # labels -> their match, under these policies

    def key(
        self, task_id: str, task: Task, created_ns: int, inherited_ns: int | None = None
    ) -> tuple:
        """`inherited_ns`: a deadline the task holds for a waiter (edf-pic), where it is
        earlier than its own, as the simulator's effective deadline is."""
        if len(self._chosen) > MAX_LABEL_SETS:  # labels unique to each task: kept bounded
            self._chosen = {}
        deadline = task.deadline.at(created_ns) if task.deadline else None
        if inherited_ns is not None:
            deadline = inherited_ns if deadline is None else min(deadline, inherited_ns)
        s = standing(task.priority, task.label_map, deadline, self.policies, self._chosen)
        job = queued_job(task_id, task, created_ns, s)
        if self._fair is not None and task_id not in self._fair.vruntime:
            self._fair.enqueue(job)
        return self._key(job)
