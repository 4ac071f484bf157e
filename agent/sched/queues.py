"""Ready queues: one heap, ordered by a discipline's key (smallest runs first).

    fifo      arrival order, never preempts
    priority  higher priority first, then the earliest deadline, then arrival; preemptive
    edf       earliest absolute deadline first (none = last); preemptive
    edf-pic   edf on the deadline inherited through resource waits (pic.py)
    fair      least vruntime first (fair.py); switches only when a slice ends
    mlq       level (mlq.py), then deadline; preemptive across levels
    dwps      edf, plus GPU-memory-fragmentation preemption (dwps.py)

Keys can change while a job waits (a holder is boosted, a vruntime moves): `update`
re-files the job; stale heap entries are skipped when they surface.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .fair import FairShare
from .job import Job
from .mlq import MultiLevel
from .pic import ResourceTable

# What each algorithm does, in a phrase: `simulate --algorithm` help.
DESCRIPTIONS = {
    "fifo": "arrival order, never preempts",
    "priority": "higher priority first (then deadline), preemptive",
    "edf": "earliest deadline first, preemptive",
    "edf-pic": "EDF where a job holding a resource runs with the deadline of a job waiting for it",
    "fair": "least priority-weighted run time first, in time slices",
    "mlq": "the workload's queue levels (queues:) in order, then EDF; earlier levels preempt",
    "dwps": "EDF, and a GPU allocation that fails for fragmentation evicts a later-deadline job",
}
ALGORITHMS = tuple(DESCRIPTIONS)
# What the agent's loop orders its Pending tasks by (a SchedulingPolicy's
# `spec.queueing.algorithm`).
NODE_ALGORITHMS = ("fifo", "priority", "edf", "edf-pic", "fair", "mlq", "dwps")
DEFAULT_NODE_ALGORITHM = "priority"


@dataclass(frozen=True)
class Discipline:
    name: str
    key: Callable[[Job], tuple]
    preemptive: bool  # a better-keyed arrival displaces a running job at once
    time_sliced: bool = False  # running jobs are re-examined when their slice ends


def discipline(
    name: str,
    *,
    resources: ResourceTable | None = None,
    fair: FairShare | None = None,
    levels: MultiLevel | None = None,
) -> Discipline:
    if name == "fifo":
        return Discipline(name, lambda j: (j.arrival_ns, j.name), preemptive=False)
    if name == "priority":
        return Discipline(
            name, lambda j: (-j.priority, j.deadline, j.arrival_ns, j.name), preemptive=True
        )
    if name in ("edf", "dwps"):
        return Discipline(name, lambda j: (j.deadline, j.arrival_ns, j.name), preemptive=True)
    if name == "edf-pic":
        table = resources if resources is not None else ResourceTable()
        return Discipline(
            name, lambda j: (table.effective_deadline(j), j.arrival_ns, j.name), preemptive=True
        )
    if name == "fair":
        share = fair if fair is not None else FairShare()
        return Discipline(
            name, lambda j: (share.key(j), j.arrival_ns, j.name), preemptive=False, time_sliced=True
        )
    if name == "mlq":
        mlq = levels if levels is not None else MultiLevel()
        return Discipline(
            name, lambda j: (mlq.level_of(j), j.deadline, j.arrival_ns, j.name), preemptive=True
        )
    raise ValueError(f"unknown algorithm {name!r}: one of {', '.join(ALGORITHMS)}")


class _Descending:
    """A key that sorts in reverse, so a ReadyQueue can hand out the worst-keyed job."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key


def worst_first(d: Discipline) -> Discipline:
    """`d` in reverse: the job that keys worst comes first (preemption victims)."""
    return Discipline(
        f"{d.name}-reversed", lambda j: _Descending(d.key(j)), d.preemptive, d.time_sliced
    )


class ReadyQueue:
    """Jobs waiting to run, most urgent first under `discipline.key`."""

    def __init__(self, discipline: Discipline):
        self.discipline = discipline
        self._heap: list[tuple[Any, int, Job]] = []
        self._live: dict[str, tuple[Any, int]] = {}  # name -> (key, seq) of its valid entry
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def push(self, job: Job) -> None:
        entry = (self.discipline.key(job), next(self._seq))
        self._live[job.name] = entry
        heapq.heappush(self._heap, (*entry, job))

    def update(self, job: Job) -> None:
        """Re-file `job` under its current key (no-op for jobs not queued)."""
        if job.name in self._live:
            self.push(job)

    def remove(self, job: Job) -> None:
        """Take `job` out wherever it is in the queue (its heap entry goes stale)."""
        self._live.pop(job.name, None)

    def peek(self) -> Job | None:
        while self._heap:
            key, seq, job = self._heap[0]
            if self._live.get(job.name) == (key, seq):
                return job
            heapq.heappop(self._heap)
        return None

    def pop(self) -> Job | None:
        job = self.peek()
        if job is not None:
            heapq.heappop(self._heap)
            del self._live[job.name]
        return job
