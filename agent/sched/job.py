"""The scheduler's view of a task: what it needs, by when, and how much it matters.

Independent of the policy file format so the algorithms can be tested on their own; the
Task format maps onto it (`from_task`, when `xhagent.policy` provides Task objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEVICE_TYPES = ("cpu", "gpu", "tpu")
NO_DEADLINE = float("inf")


@dataclass(frozen=True)
class Job:
    """One unit of work. Times are integer nanoseconds on the simulation clock.

    `deadline_ns` is absolute (None: no deadline). `priority` 0..100, higher matters more
    (default 50, as in SchedulingPolicy). `holds` are exclusive resources (locks, a
    bandwidth share) the job takes when it first runs and keeps until it completes; a job
    that cannot take them all waits, which is where priority inversion comes from.
    """

    name: str
    arrival_ns: int = 0
    runtime_ns: int = 1_000_000
    deadline_ns: int | None = None
    priority: int = 50
    cls: str = "default"
    device: str = "cpu"
    holds: frozenset[str] = frozenset()
    affinity: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    gpu_memory: int = 0  # bytes wanted on the GPU (DWPS)
    migratable: bool = True
    # Device types it may be moved to run on (seed 003: the TPU runtime supports its
    # operators); empty: only its own.
    runs_on: frozenset[str] = frozenset()

    def __post_init__(self):
        if not 0 <= self.priority <= 100:
            raise ValueError(f"job {self.name}: priority {self.priority} is out of range 0..100")
        if self.device not in DEVICE_TYPES:
            raise ValueError(
                f"job {self.name}: device {self.device!r} is not one of {', '.join(DEVICE_TYPES)}"
            )
        if self.runtime_ns <= 0:
            raise ValueError(f"job {self.name}: runtime must be positive")
        if self.runs_on and self.device not in self.runs_on:
            raise ValueError(f"job {self.name}: runsOn does not include its device {self.device}")

    @property
    def deadline(self) -> float:
        """The deadline as a sort key: jobs without one sort after every real deadline."""
        return NO_DEADLINE if self.deadline_ns is None else self.deadline_ns


def weight_of(priority: int) -> float:
    """Fair-share weight: 1024 at the default priority 50, doubling every 10 points
    (CFS's nice table grows 1.25x per step; ten steps of ~1.07x keep 0..100 within 1/32..32)."""
    return 1024.0 * 2.0 ** ((priority - 50) / 10.0)


def from_task(
    task,
    submitted_ns: int = 0,
    default_runtime_ns: int = 1_000_000,
    *,
    name: str | None = None,
    priority: int | None = None,
    deadline_ns: int | None = None,
) -> Job:
    """A `xhagent.policy.task.Task` as a Job submitted at `submitted_ns`: its class is the
    `app` label, its runtime the estimate (or `default_runtime_ns`), unset priority 50;
    migratable only when it says `migratable: true`, as the daemon moves it. The daemon
    names its jobs by task id and gives them the priority and deadline it ranks them by
    (a policy's priority where the task has none)."""
    labels = dict(task.labels)
    if priority is None:
        priority = 50 if task.priority is None else task.priority
    if deadline_ns is None and task.deadline is not None:
        deadline_ns = task.deadline.at(submitted_ns)
    return Job(
        name=task.name if name is None else name,
        arrival_ns=submitted_ns,
        runtime_ns=task.estimated_runtime_ns or default_runtime_ns,
        deadline_ns=deadline_ns,
        priority=priority,
        cls=labels.get("app", "default"),
        device=task.device_type,
        affinity=labels,
        gpu_memory=task.requests.gpu_memory or 0,
        # as the daemon: only `migratable: true` moves, and then to its runsOn types
        migratable=bool(task.migratable),
        runs_on=frozenset(task.runs_on),
        holds=frozenset(task.resources),
    )
