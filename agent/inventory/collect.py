"""The whole inventory of a node, and the resource model built from it."""

from __future__ import annotations

from dataclasses import dataclass

from .. import node_model as model
from ..config import AgentConfig
from .accel import AccelInventory, read_accel
from .block import BlockDevice, read_block
from .cpus import CpuInventory, read_cpus
from .gpus import GpuInventory, read_gpus
from .memory import MemoryInfo, read_memory
from .numa import NumaInfo, read_numa
from .pci import PciDevice, PciIds, read_pci
from .sysfs import LIVE_ROOTS, Roots


@dataclass(frozen=True)
class Inventory:
    config: AgentConfig
    cpu: CpuInventory
    numa: tuple[NumaInfo, ...]
    memory: MemoryInfo
    pci: tuple[PciDevice, ...]
    gpu: GpuInventory
    block: tuple[BlockDevice, ...]
    accel: AccelInventory = AccelInventory()


SECTIONS = ("cpu", "numa", "memory", "pci", "gpu", "accel", "block", "labels")


def discover_node(
    roots: Roots = LIVE_ROOTS,
    config: AgentConfig | None = None,
    *,
    gpus: bool = True,
    pci_ids: PciIds | None = None,
) -> Inventory:
    config = config or AgentConfig()
    ids = pci_ids if pci_ids is not None else PciIds.load()
    return Inventory(
        config=config,
        cpu=read_cpus(roots, config.reserved_cpus),
        numa=tuple(read_numa(roots)),
        memory=read_memory(roots),
        pci=tuple(read_pci(roots, ids)),
        gpu=read_gpus(roots) if gpus else GpuInventory(False, "not probed"),
        block=tuple(read_block(roots)),
        accel=read_accel(roots, ids),
    )


def _l3_key(inv: Inventory, cpu) -> tuple[int, int]:
    """(L3 id, size); a machine without an L3 in sysfs gets one domain per package."""
    cache = inv.cpu.cache_of(cpu, "L3")
    return (cache.id, cache.size_bytes) if cache else (cpu.package or 0, 0)


def _accelerators(inv: Inventory, numa_ids) -> tuple[model.Accelerator, ...]:
    """Numbered per kind in the inventory's order (accel class minor, then PCI address)."""
    counts: dict[str, int] = {}
    out = []
    for d in inv.accel.devices:
        index = counts[d.kind] = counts.get(d.kind, -1) + 1
        out.append(
            model.Accelerator(
                index,
                d.kind,
                d.name,
                d.model,
                d.pci_address or "",
                d.numa_node if d.numa_node in numa_ids else None,
                d.device_nodes,
            )
        )
    return tuple(out)


def build_model(inv: Inventory) -> model.Node:
    """Allocatable = online CPUs minus those the config reserves, grouped NUMA > L3 > core."""
    reserved = set(inv.cpu.reserved)
    by_id = {c.id: c for c in inv.cpu.cpus}
    numa_of = {c: n.id for n in inv.numa for c in n.cpus}
    grouped: dict[int, dict[tuple[int, int], dict[tuple[int, int], list[int]]]] = {
        n.id: {} for n in inv.numa
    }
    for cpu in inv.cpu.cpus:
        if not cpu.online or cpu.id in reserved:
            continue
        node = numa_of.get(cpu.id, cpu.numa_node or 0)
        core = grouped.setdefault(node, {}).setdefault(_l3_key(inv, cpu), {})
        core.setdefault(
            (cpu.package or 0, cpu.core if cpu.core is not None else cpu.id), []
        ).append(cpu.id)
    numa_info = {n.id: n for n in inv.numa}
    numa = []
    for node_id, domains in sorted(grouped.items()):
        info = numa_info.get(node_id)
        l3 = tuple(
            model.L3Domain(
                l3_id,
                model.Bytes(size),
                tuple(
                    model.Core(core_id, package, tuple(sorted(cpus)), by_id[cpus[0]].siblings)
                    for (package, core_id), cpus in sorted(cores.items(), key=lambda kv: min(kv[1]))
                ),
            )
            for (l3_id, size), cores in sorted(domains.items())
        )
        numa.append(
            model.NumaNode(
                node_id,
                model.Bytes(info.memory_total if info else 0),
                model.Bytes(info.memory_free if info else 0),
                dict(info.distances) if info else {},
                l3,
            )
        )
    mem = inv.memory
    gpu_cuda = inv.gpu.cuda_driver_version or model.Version(0, 0)
    return model.Node(
        name=inv.config.node_name,
        labels=inv.config.labels,
        reserved_cpus=tuple(sorted(reserved & {c.id for c in inv.cpu.cpus})),
        numa=tuple(numa),
        memory=model.Memory(
            model.Bytes(mem.total),
            model.Bytes(mem.available),
            tuple(
                model.HugePages(model.Bytes(h.size_bytes), h.total, h.free) for h in mem.hugepages
            ),
        ),
        gpus=tuple(
            model.Gpu(
                g.index,
                g.uuid,
                g.name,
                model.Bytes(g.memory_total),
                model.Bytes(g.memory_free),
                gpu_cuda,
                g.compute_capability,
                g.numa_node if g.numa_node in numa_info else None,
                g.pci_bus_id,
                tuple(g.nvlink_links),
            )
            for g in inv.gpu.gpus
        ),
        io=tuple(
            model.BlockIo(
                d.name,
                d.dev,
                d.rotational,
                bool(d.io_poll),
                d.poll_queues,
                model.Bytes(d.size_bytes),
                d.numa_node if d.numa_node in numa_info else None,
            )
            for d in inv.block
            if not d.virtual
        ),
        accelerators=_accelerators(inv, numa_info),
    )
