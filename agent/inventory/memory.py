"""Memory: total, available, hugepages per size (/proc/meminfo, /sys/kernel/mm/hugepages)."""

from __future__ import annotations

from dataclasses import dataclass

from .sysfs import LIVE_ROOTS, Roots, integer, text


@dataclass(frozen=True)
class HugePageInfo:
    size_bytes: int
    total: int
    free: int


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    available: int
    free: int
    hugepages: tuple[HugePageInfo, ...]


def meminfo(body: str) -> dict[str, int]:
    """`Key:  123 kB` lines -> {Key: bytes}; counts without a unit stay counts."""
    out = {}
    for line in body.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def read_memory(roots: Roots = LIVE_ROOTS) -> MemoryInfo:
    mem = meminfo(text(roots.proc / "meminfo") or "")
    pages = []
    hp = roots.sys / "kernel/mm/hugepages"
    if hp.is_dir():
        for d in hp.glob("hugepages-*kB"):
            pages.append(
                HugePageInfo(
                    int(d.name[10:-2]) * 1024,
                    integer(d / "nr_hugepages", 0),
                    integer(d / "free_hugepages", 0),
                )
            )
    return MemoryInfo(
        mem.get("MemTotal", 0),
        mem.get("MemAvailable", mem.get("MemFree", 0)),
        mem.get("MemFree", 0),
        tuple(sorted(pages, key=lambda p: p.size_bytes)),
    )
