"""Fair share (seed 003, 3.3) with TWFS time slices (seed 003, chapter 1).

vruntime grows by run time scaled by NICE_0 / weight, so a job of twice the weight gets
twice the processor; the job with the least vruntime runs next. A job that arrives or
wakes starts at the queue's minimum vruntime, not at zero, so it cannot monopolise the
processor to "catch up".

Migration is charged: a job resumed on a farther slot than it last ran on adds
`migration_cost_ns x (distance - LOCAL) / LOCAL` of vruntime, with SLIT-style distances
(10 local, 21 another NUMA node, 40 another machine), so cheap moves happen and far ones
only when the imbalance is worth it.

TWFS slices, as in the seed:
- CPU jobs: 100 ms x (1 + log2(cpu_load)), load in (0, 1]. At load 1 this is 100 ms and it
  reaches 0 at load 0.5, negative below; the slice is therefore clamped to
  [MIN_SLICE_NS, 100 ms] (and load 0 -> MIN_SLICE_NS).
- GPU/TPU jobs: a fixed 10 ms, and their weight is multiplied by 0.95 after every round
  they are scheduled, to damp jitter; the weight stops at ACCEL_WEIGHT_FLOOR of its start
  value so a long accelerator job is slowed, never starved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .job import Job, weight_of

NICE_0 = 1024.0
CPU_BASE_SLICE_NS = 100_000_000
ACCEL_SLICE_NS = 10_000_000
MIN_SLICE_NS = 1_000_000
ACCEL_DECAY = 0.95
ACCEL_WEIGHT_FLOOR = 0.1

LOCAL, REMOTE_NUMA, REMOTE_NODE = 10, 21, 40


def distance(a: tuple[str, int], b: tuple[str, int]) -> int:
    """SLIT-style distance between two (node, numa) places."""
    if a == b:
        return LOCAL
    return REMOTE_NUMA if a[0] == b[0] else REMOTE_NODE


def twfs_slice_ns(job: Job, cpu_load: float) -> int:
    if job.device != "cpu":
        return ACCEL_SLICE_NS
    if cpu_load <= 0:
        return MIN_SLICE_NS
    raw = CPU_BASE_SLICE_NS * (1 + math.log2(min(cpu_load, 1.0)))
    return int(min(max(raw, MIN_SLICE_NS), CPU_BASE_SLICE_NS))


@dataclass
class FairShare:
    migration_cost_ns: int = 2_000_000
    vruntime: dict[str, float] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    min_vruntime: float = 0.0

    def enqueue(self, job: Job) -> None:
        """A job joins (or wakes): it starts no further behind than the current minimum."""
        self.weight.setdefault(job.name, weight_of(job.priority))
        self.vruntime[job.name] = max(self.vruntime.get(job.name, 0.0), self.min_vruntime)

    def charge(self, job: Job, ran_ns: int) -> None:
        """Account `ran_ns` of run time; accelerator jobs' weight decays one round."""
        w = self.weight.setdefault(job.name, weight_of(job.priority))
        self.vruntime[job.name] = (
            self.vruntime.get(job.name, self.min_vruntime) + ran_ns * NICE_0 / w
        )
        if job.device != "cpu":
            floor = weight_of(job.priority) * ACCEL_WEIGHT_FLOOR
            self.weight[job.name] = max(w * ACCEL_DECAY, floor)

    def penalty(self, src: tuple[str, int], dst: tuple[str, int]) -> float:
        """The distance-weighted migration penalty of a move from `src` to `dst` (vruntime)."""
        return self.migration_cost_ns * (distance(src, dst) - LOCAL) / LOCAL

    def migrate(self, job: Job, src: tuple[str, int], dst: tuple[str, int]) -> float:
        """Charge the distance-weighted migration penalty; returns the vruntime added."""
        return self.add(job.name, self.penalty(src, dst))

    def add(self, name: str, penalty: float) -> float:
        """`penalty` of vruntime charged to `name` outside a run (a move's cost)."""
        self.vruntime[name] = self.vruntime.get(name, self.min_vruntime) + penalty
        return penalty

    def advance(self, queued_vruntimes) -> None:
        """min_vruntime only moves forward: to the least vruntime still competing."""
        least = min(queued_vruntimes, default=None)
        if least is not None:
            self.min_vruntime = max(self.min_vruntime, least)

    def forget(self, job: Job) -> None:
        self.vruntime.pop(job.name, None)
        self.weight.pop(job.name, None)

    def key(self, job: Job) -> float:
        return self.vruntime.get(job.name, self.min_vruntime)
