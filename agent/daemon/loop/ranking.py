"""A task's standing: its priority (its own, else its winning policy's, else 50) and its
deadline, from the policies in force now. The scheduler orders Pending tasks by it,
preemption compares by it, and `get`/`ps` show it: one rule, so what is shown is what
scheduling uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...policy.policy import choose
from ...policy.preemption import NO_DEADLINE
from ...policy.task import Task

DEFAULT_PRIORITY = 50


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


def order_key(task_id: str, task: Task, created_ns: int, policies: Iterable) -> tuple:
    """Highest priority first, then the earliest deadline, then submission order (ids sort
    by it)."""
    s = standing_of(task, created_ns, policies)
    return (-s.priority, s.deadline_ns, task_id)
