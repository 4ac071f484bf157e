"""Logical CPUs: topology, SMT siblings, caches and which CPUs share each (sysfs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..cpulist import parse_cpulist
from ..quantity import kernel_size
from .sysfs import LIVE_ROOTS, Roots, cpulist, integer, text


@dataclass(frozen=True)
class Cache:
    level: int
    type: str  # Data, Instruction, Unified
    id: int  # sysfs `id`, else the lowest CPU sharing it
    size_bytes: int
    cpus: tuple[int, ...]  # every CPU that shares this cache

    @property
    def name(self) -> str:
        return f"L{self.level}" + {"Data": "d", "Instruction": "i"}.get(self.type, "")


@dataclass(frozen=True)
class Cpu:
    id: int
    online: bool
    package: int | None = None
    die: int | None = None
    core: int | None = None
    numa_node: int | None = None
    siblings: tuple[int, ...] = ()  # SMT siblings, itself included
    caches: tuple[str, ...] = ()  # keys into CpuInventory.caches, e.g. "L3:0"


@dataclass(frozen=True)
class CpuInventory:
    cpus: tuple[Cpu, ...]
    caches: dict[str, Cache]  # "L3:0" -> Cache
    allowed: tuple[int, ...]  # the agent's own affinity (Cpus_allowed_list)
    reserved: tuple[int, ...]  # from the agent config

    def cache_of(self, cpu: Cpu, name: str) -> Cache | None:
        return next((self.caches[k] for k in cpu.caches if self.caches[k].name == name), None)

    @property
    def online(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.cpus if c.online)


def _cpu_numa(cpu_dir: Path) -> int | None:
    nodes = sorted(int(p.name[4:]) for p in cpu_dir.glob("node[0-9]*"))
    return nodes[0] if nodes else None


def _read_caches(cpu_dir: Path, cpu: int, caches: dict[str, Cache]) -> tuple[str, ...]:
    keys = []
    for index in sorted(cpu_dir.glob("cache/index[0-9]*"), key=lambda p: int(p.name[5:])):
        level = integer(index / "level")
        if level is None:
            continue
        sharing = tuple(cpulist(index / "shared_cpu_list")) or (cpu,)
        cache_id = integer(index / "id", min(sharing))
        cache = Cache(
            level,
            text(index / "type", "Unified"),
            cache_id,
            kernel_size(text(index / "size")),
            sharing,
        )
        key = f"{cache.name}:{cache.id}"
        caches.setdefault(key, cache)
        keys.append(key)
    return tuple(keys)


def allowed_cpus(proc_root: Path) -> tuple[int, ...]:
    for line in (text(proc_root / "self/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return tuple(parse_cpulist(line.split(":", 1)[1]))
    return ()


def read_cpus(roots: Roots = LIVE_ROOTS, reserved: tuple[int, ...] = ()) -> CpuInventory:
    base = roots.sys / "devices/system/cpu"
    online = set(cpulist(base / "online"))
    possible = cpulist(base / "present") or sorted(online)
    caches: dict[str, Cache] = {}
    cpus = []
    for cpu in possible:
        d = base / f"cpu{cpu}"
        if cpu not in online:
            cpus.append(Cpu(cpu, False, numa_node=_cpu_numa(d)))
            continue
        topo = d / "topology"
        cpus.append(
            Cpu(
                id=cpu,
                online=True,
                package=integer(topo / "physical_package_id"),
                die=integer(topo / "die_id"),
                core=integer(topo / "core_id"),
                numa_node=_cpu_numa(d),
                siblings=tuple(cpulist(topo / "thread_siblings_list")) or (cpu,),
                caches=_read_caches(d, cpu, caches),
            )
        )
    order = sorted(caches, key=lambda k: (caches[k].level, caches[k].type, caches[k].id))
    return CpuInventory(
        tuple(cpus),
        {k: caches[k] for k in order},
        allowed_cpus(roots.proc),
        tuple(sorted(reserved)),
    )
