"""NUMA nodes: CPUs, memory total/free, SLIT distances (sysfs); one node 0 where the kernel
has none."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .memory import meminfo
from .sysfs import LIVE_ROOTS, Roots, cpulist, text


@dataclass(frozen=True)
class NumaInfo:
    id: int
    cpus: tuple[int, ...]
    memory_total: int
    memory_free: int
    distances: dict[int, int] = field(default_factory=dict, hash=False)


def _node_meminfo(path: Path) -> dict[str, int]:
    # "Node 0 MemTotal:  5335244 kB" -> the same keys as /proc/meminfo
    body = re.sub(r"^Node \d+ ", "", text(path) or "", flags=re.M)
    return meminfo(body)


def read_numa(roots: Roots = LIVE_ROOTS) -> list[NumaInfo]:
    base = roots.sys / "devices/system/node"
    ids = cpulist(base / "online")
    if not ids:
        mem = meminfo(text(roots.proc / "meminfo") or "")
        cpus = tuple(cpulist(roots.sys / "devices/system/cpu/online"))
        return [NumaInfo(0, cpus, mem.get("MemTotal", 0), mem.get("MemFree", 0), {0: 10})]
    nodes = []
    for n in ids:
        d = base / f"node{n}"
        mem = _node_meminfo(d / "meminfo")
        distances = [int(x) for x in (text(d / "distance") or "").split()]
        nodes.append(
            NumaInfo(
                n,
                tuple(cpulist(d / "cpulist")),
                mem.get("MemTotal", 0),
                mem.get("MemFree", 0),
                # A missing or short distance row (a partial recorded tree) leaves those
                # distances unknown rather than failing the inventory.
                dict(zip(ids, distances, strict=False)),
            )
        )
    return nodes
