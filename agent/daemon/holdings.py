"""What a task holds, as its record says: the allocation the placement state gives it."""

from __future__ import annotations

from ..policy.state import Allocation, GpuShare
from .lifecycle import TaskState as S
from .store import TaskRecord


def allocation_of(rec: TaskRecord) -> Allocation:
    """What the task holds: a frozen one keeps its memory, GPUs and TPU chips, not its CPUs."""
    placed = rec.placement or {}
    exclusive = placed.get("exclusive") and rec.state != S.FROZEN
    cpus = tuple(placed.get("cpus", ())) if exclusive else ()
    shares = tuple(GpuShare(i, m, w) for i, m, w in placed.get("gpu_shares", ()))
    tpus = tuple(placed.get("tpus", ()))
    return Allocation(
        rec.id, placed.get("node", ""), cpus, placed.get("memory", 0), shares, tpus=tpus
    )
