"""A task's states and the only transitions between them: one table, no I/O.

    Pending    -> Pending (reasons rewritten), Starting, Failed, Cancelled
    Starting   -> Running, Pending (start rolled back), Succeeded, Failed, Cancelled
    Running    -> Frozen, Pending (restart or eviction), Succeeded, Failed, Cancelled
    Frozen     -> Running (thawed), Pending (eviction), Failed, Cancelled
    Succeeded, Failed, Cancelled: terminal, nothing leaves them

Pending holds no placement: a task that fits nowhere waits there with typed reasons (the
placement's `InsufficientGPUHardware: node-03 lacks CUDA 12.2 runtime`), and re-evaluation
may rewrite them (Pending -> Pending, the table's only self-loop). There is no Restarting
state: a task restarted under `restartPolicy: OnFailure` gives its placement back and waits
in Pending with a `BackOff` reason until its delay has passed, so the scheduler needs one
queue, not two, and the restart is placed again like any submission (the node may have
changed since). Eviction (preemption by kill, to requeue) takes the same edge. Pending ->
Failed is for a task that can never run (its deadline passed while it waited).

Starting -> Pending is the rollback of a start that never took effect (the shim did not come
up, the placement vanished), the one thing a restarted agent may find half-done there; Starting
ends directly when the workload exited before Running was recorded.
A frozen task cannot exit by itself, but SIGKILL (the OOM killer, `cgroup.kill`) ends it, so
Frozen leads to Failed and Cancelled, not to Succeeded.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BACKOFF",
    "NEEDS_PLACEMENT",
    "TERMINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "TaskState",
    "check_transition",
    "is_legal",
]


class TaskState(StrEnum):
    """The value is what `xhagent ps` shows and what the store keeps."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    FROZEN = "Frozen"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})
# States whose task holds a placement (node, CPUs, GPUs): entering one requires it.
NEEDS_PLACEMENT = frozenset({TaskState.STARTING, TaskState.RUNNING, TaskState.FROZEN})
# The reason kind of a Pending task that waits out a restart delay.
BACKOFF = "BackOff"

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset(
        {TaskState.PENDING, TaskState.STARTING, TaskState.FAILED, TaskState.CANCELLED}
    ),
    TaskState.STARTING: frozenset(
        {
            TaskState.PENDING,
            TaskState.RUNNING,
            TaskState.SUCCEEDED,
            TaskState.FAILED,
            TaskState.CANCELLED,
        }
    ),
    TaskState.RUNNING: frozenset(
        {
            TaskState.PENDING,
            TaskState.FROZEN,
            TaskState.SUCCEEDED,
            TaskState.FAILED,
            TaskState.CANCELLED,
        }
    ),
    TaskState.FROZEN: frozenset(
        {TaskState.PENDING, TaskState.RUNNING, TaskState.FAILED, TaskState.CANCELLED}
    ),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, old: TaskState, new: TaskState, task_id: str | None = None):
        self.old, self.new, self.task_id = old, new, task_id
        who = f"task {task_id}: " if task_id else ""
        super().__init__(f"{who}{old} -> {new} is not a legal transition")


def is_legal(old: TaskState, new: TaskState) -> bool:
    return new in TRANSITIONS[old]


def check_transition(old: TaskState, new: TaskState, task_id: str | None = None) -> None:
    if not is_legal(TaskState(old), TaskState(new)):
        raise IllegalTransition(TaskState(old), TaskState(new), task_id)
