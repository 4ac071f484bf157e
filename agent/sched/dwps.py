"""DWPS (seed 003, 3.2): GPU-memory-fragmentation feedback preemption.

GPU memory is a line of bytes with allocations on it; the gaps are free blocks. The
seed's metric, as the issue pins it down:

    F = free_blocks x avg_free_block / total_free

Since avg_free_block = total_free / free_blocks, F is exactly 1 whenever any memory is
free, however it is split, and we define it 0 when nothing is free (no free blocks,
total_free 0: nothing is fragmented, and 0/0 must not reach the comparison). So with the
thresholds below, "F exceeds the threshold" means "there is free memory at all": DWPS
as specified preempts whenever a request fails while memory is free, and the threshold
dynamics only matter for a metric that varies. `Dwps` therefore defaults to
`largest_block_fragmentation` (1 - largest_free / total_free: 0 for one hole, -> 1 for
dust), the usual measure of external fragmentation, which keeps the seed's intent (act
when free memory is too scattered to serve requests) and gives the adaptive threshold a
meaning; the seed's formula stays available as `fragmentation`.

Threshold: 0.65, minus 0.02 for every consecutive failed compaction, never below 0.55; a
successful compaction resets it. Victims are allocations that may move (preemptible, not
pinned), best fit first: evicting one frees its bytes plus the free blocks around it, and
the hole closest to the request (fit = need / hole, 1 is perfect) disturbs least; ties go
to the lowest GPU affinity, then the smallest allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

THRESHOLD_START, THRESHOLD_STEP, THRESHOLD_FLOOR = 65, 2, 55  # hundredths


@dataclass(frozen=True)
class Allocation:
    owner: str
    start: int
    size: int
    affinity: float = 0.5  # 0..1, how much the owner wants to stay on this GPU
    preemptible: bool = True

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class GpuMemory:
    total: int
    allocations: list[Allocation] = field(default_factory=list)

    def __post_init__(self):
        self.allocations.sort(key=lambda a: a.start)
        prev_end = 0
        for a in self.allocations:
            if a.size <= 0 or a.start < prev_end or a.end > self.total:
                raise ValueError(
                    f"allocation {a.owner} at {a.start}+{a.size} overlaps or leaves the GPU"
                )
            prev_end = a.end

    def free_blocks(self) -> list[tuple[int, int]]:
        """(start, size) of every gap, in address order."""
        gaps, cursor = [], 0
        for a in self.allocations:
            if a.start > cursor:
                gaps.append((cursor, a.start - cursor))
            cursor = a.end
        if cursor < self.total:
            gaps.append((cursor, self.total - cursor))
        return gaps

    def largest_free(self) -> int:
        return max((size for _, size in self.free_blocks()), default=0)

    def hole_without(self, victim: Allocation) -> int:
        """Size of the contiguous free block that evicting `victim` would leave."""
        i = self.allocations.index(victim)
        lo = self.allocations[i - 1].end if i > 0 else 0
        hi = self.allocations[i + 1].start if i + 1 < len(self.allocations) else self.total
        return hi - lo


def fragmentation(gpu: GpuMemory) -> float:
    """The seed's F; 1.0 whenever anything is free, 0.0 when nothing is (see module doc)."""
    blocks = [size for _, size in gpu.free_blocks()]
    total_free = sum(blocks)
    if not blocks or total_free == 0:
        return 0.0
    avg_free_block = total_free / len(blocks)
    return len(blocks) * avg_free_block / total_free


def largest_block_fragmentation(gpu: GpuMemory) -> float:
    total_free = sum(size for _, size in gpu.free_blocks())
    return 0.0 if total_free == 0 else 1.0 - gpu.largest_free() / total_free


@dataclass
class Threshold:
    failed_compactions: int = 0

    @property
    def value(self) -> float:
        return (
            max(THRESHOLD_START - THRESHOLD_STEP * self.failed_compactions, THRESHOLD_FLOOR) / 100
        )

    def compaction(self, succeeded: bool) -> None:
        self.failed_compactions = 0 if succeeded else self.failed_compactions + 1


def rank_victims(gpu: GpuMemory, need: int) -> list[tuple[Allocation, float]]:
    """Movable allocations with their fit for a request of `need` bytes, best first.
    Those whose eviction alone leaves too small a hole have fit 0 and come last."""
    scored = []
    for a in gpu.allocations:
        if not a.preemptible or a.affinity >= 1.0:
            continue
        hole = gpu.hole_without(a)
        fit = need / hole if hole >= need and hole > 0 else 0.0
        scored.append((a, fit))
    scored.sort(key=lambda af: (-af[1], af[0].affinity, af[0].size, af[0].owner))
    return scored


@dataclass
class Dwps:
    metric: Callable[[GpuMemory], float] = largest_block_fragmentation
    threshold: Threshold = field(default_factory=Threshold)

    def decide(self, gpu: GpuMemory, need: int) -> list[Allocation]:
        """Allocations to move off the GPU so `need` bytes fit contiguously, best first;
        empty when the request fits already, F is under the threshold, or no single
        eviction would make room."""
        if gpu.largest_free() >= need or self.metric(gpu) <= self.threshold.value:
            return []
        return [a for a, fit in rank_victims(gpu, need) if fit > 0]

    def compaction(self, succeeded: bool) -> None:
        self.threshold.compaction(succeeded)

    def compact(
        self, gpu: GpuMemory, need: int, movable: Callable[[str], bool]
    ) -> Compaction | None:
        """One DWPS round for a request of `need` bytes that no free block of `gpu` holds,
        where only the owners `movable` allows may be evicted: None when the fragmentation
        is not above the threshold (nothing tried, nothing counted); else the allocation to
        evict, the best fit, or none (a failed compaction), and the threshold adapts. The
        simulator and the agent both decide through here."""
        view = GpuMemory(
            gpu.total,
            [replace(a, preemptible=a.preemptible and movable(a.owner)) for a in gpu.allocations],
        )
        fragmentation, threshold = self.metric(view), self.threshold.value
        if fragmentation <= threshold:
            return None
        victims = self.decide(view, need)
        self.compaction(bool(victims))
        return Compaction(victims[0] if victims else None, fragmentation, threshold)


@dataclass(frozen=True)
class Compaction:
    victim: Allocation | None  # None: no single eviction makes room (a failed compaction)
    fragmentation: float  # the metric when it was decided
    threshold: float  # the threshold it was over (before this round adapted it)
