"""One GPU's memory as the simulator sees it: a line of `total` bytes with allocations on it.

The layout is `dwps.GpuMemory` (allocations in address order; the free blocks are the
gaps between them), so fragmentation is exactly what dwps.py computes, and freeing an
allocation merges it with the free blocks on either side by construction: there is no
free list to get out of step.

Placement is first fit: the lowest-addressed free block large enough. It is deterministic,
costs one pass over the blocks, and keeps the low addresses packed; best fit would fill
small holes first and leave slivers too small for anything, which hides less
fragmentation than it makes. A request that fits in no single block is a failed
allocation: `fragmentation` when the free bytes would suffice if they were contiguous,
`capacity` when they would not.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from .dwps import Allocation, GpuMemory

FITS, FRAGMENTATION, CAPACITY = "fits", "fragmentation", "capacity"


class GpuDevice:
    """A GPU's memory with first-fit allocation and free by owner."""

    def __init__(self, total: int):
        if total <= 0:
            raise ValueError(f"GPU memory must be positive, got {total}")
        self.memory = GpuMemory(total)
        self.by_owner: dict[str, Allocation] = {}

    @property
    def total(self) -> int:
        return self.memory.total

    @property
    def used(self) -> int:
        return sum(a.size for a in self.memory.allocations)

    @property
    def free(self) -> int:
        return self.total - self.used

    def verdict(self, size: int) -> str:
        """FITS, FRAGMENTATION (enough free bytes, no block large enough) or CAPACITY."""
        if self.memory.largest_free() >= size:
            return FITS
        return FRAGMENTATION if self.free >= size else CAPACITY

    def allocate(self, owner: str, size: int) -> Allocation | None:
        """Place `size` bytes for `owner` in the first free block that holds them; None
        when none does (see `verdict` for why)."""
        if size <= 0:
            raise ValueError(f"allocation for {owner}: size must be positive, got {size}")
        if owner in self.by_owner:
            raise ValueError(f"{owner} already holds memory on this GPU")
        for start, block in self.memory.free_blocks():
            if block >= size:
                a = Allocation(owner, start, size)
                allocations = self.memory.allocations
                allocations.insert(bisect.bisect([x.start for x in allocations], start), a)
                self.by_owner[owner] = a
                return a
        return None

    def resize(self, owner: str, size: int) -> bool:
        """`owner`'s allocation grown (or shrunk) to `size`: in place where the bytes after
        it are free, else moved to the first block that holds it whole, as a reallocation
        would be; False, and left as it was, where no block does."""
        old = self.by_owner[owner]
        if size <= 0:
            raise ValueError(f"allocation for {owner}: size must be positive, got {size}")
        allocations = self.memory.allocations
        i = allocations.index(old)
        limit = allocations[i + 1].start if i + 1 < len(allocations) else self.total
        if old.start + size <= limit:
            allocations[i] = self.by_owner[owner] = replace(old, size=size)
            return True
        self.release(owner)
        if self.allocate(owner, size) is None:
            allocations.insert(i, old)
            self.by_owner[owner] = old
            return False
        return True

    def release(self, owner: str) -> Allocation:
        a = self.by_owner.pop(owner)
        self.memory.allocations.remove(a)
        return a
