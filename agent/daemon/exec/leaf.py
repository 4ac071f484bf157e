"""What a task's cgroup leaf gets, decided without touching the kernel.

A placed task runs in `tasks/<id>` with its placement's CPUs (and the memory nodes of
their NUMA nodes), its memory request as `memory.max`, and its class's `cpu.weight` and
`io.weight`. Where the node lacks a controller the task still runs, and each setting that
could not be made is listed as unenforced with the reason; a task that names the
controller in `enforce` stays Pending instead (`EnforcementUnavailable`). Never a silent
downgrade.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...cgroups import registry
from ...cpulist import format_cpulist
from ..store.records import Unenforced

CONTROLLERS = ("cpu", "cpuset", "io", "memory", "pids")


@dataclass(frozen=True)
class LeafPlan:
    settings: tuple[tuple[registry.CgroupFile, object], ...]  # written in this order
    unenforced: tuple[Unenforced, ...]


def plan_leaf(
    *,
    cpus: Iterable[int],
    mems: Iterable[int],
    memory: int | None,
    weights: tuple[int, int],
    missing: Mapping[str, str],
) -> LeafPlan:
    """The settings of a leaf; `missing` maps each controller the node cannot enforce in the
    agent's subtree to why (e.g. "cpu is not available in cgroup2 (held by cgroup v1)")."""
    cpu_weight, io_weight = weights
    wanted: list[tuple[str, registry.CgroupFile, object]] = []
    cpus = sorted(set(cpus))
    if cpus:
        wanted.append(("cpuset", registry.CPUSET_CPUS, format_cpulist(cpus)))
        mems = sorted(set(mems))
        if mems:
            wanted.append(("cpuset", registry.CPUSET_MEMS, format_cpulist(mems)))
    if memory:
        wanted.append(("memory", registry.MEMORY_MAX, memory))
        # a limit the task could swap past is no limit (where the kernel has swap at all)
        wanted.append(("memory", registry.MEMORY_SWAP_MAX, 0))
    wanted.append(("cpu", registry.CPU_WEIGHT, cpu_weight))
    wanted.append(("io", registry.IO_WEIGHT, {"default": io_weight}))
    settings, unenforced = [], []
    for controller, f, value in wanted:
        if controller in missing:
            if f is registry.MEMORY_SWAP_MAX:  # said once, by memory.max
                continue
            shown = value["default"] if isinstance(value, dict) else value
            unenforced.append(Unenforced(controller, f"{f.name}={shown}", missing[controller]))
        else:
            settings.append((f, value))
    return LeafPlan(tuple(settings), tuple(unenforced))


def enforcement_reason(enforce: Iterable[str], missing: Mapping[str, str]) -> str | None:
    """The Pending reason when the task demands a controller this node cannot enforce."""
    lacking = [c for c in enforce if c in missing]
    if not lacking:
        return None
    why = "; ".join(f"{c}: {missing[c]}" for c in lacking)
    return f"EnforcementUnavailable: the task demands enforcement this node cannot give ({why})"
