"""Inventory output: a JSON-ready dict (per section) and a compact lstopo-like text tree."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import quantity
from ..node_model import Version, nvlink_islands
from .collect import SECTIONS, Inventory
from .pci import PciDevice


def _plain(value: Any) -> Any:
    if isinstance(value, Version):
        return str(value)
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _pci(d: PciDevice) -> dict[str, Any]:
    """The ids stay ints for programs; `pci_id` and `class_code` are the hex lspci -n prints."""
    return {
        **_plain(d),
        "pci_id": f"{d.vendor_id:04x}:{d.device_id:04x}",
        "class_code": f"{d.class_id:06x}",
    }


def _pci_id(vendor: int | None, device: int | None) -> str | None:
    return None if vendor is None or device is None else f"{vendor:04x}:{device:04x}"


def nvlink_matrix(inv: Inventory) -> list[list[int]]:
    """Active NVLinks between each pair of GPUs (row: from, column: to)."""
    gpus = inv.gpu.gpus
    return [[g.nvlink_links.get(p.index, 0) for p in gpus] for g in gpus]


def as_dict(inv: Inventory, section: str | None = None) -> dict[str, Any]:
    gpu = inv.gpu
    full = {
        "cpu": {
            "cpus": _plain(inv.cpu.cpus),
            "caches": _plain(list(inv.cpu.caches.values())),
            "online": list(inv.cpu.online),
            "allowed": list(inv.cpu.allowed),
            "reserved": list(inv.cpu.reserved),
        },
        "numa": _plain(inv.numa),
        "memory": _plain(inv.memory),
        "pci": [_pci(d) for d in inv.pci],
        "gpu": {
            "nvml": {
                "available": gpu.available,
                "reason": gpu.reason,
                "driver_version": gpu.driver_version,
                "cuda_driver_version": _plain(gpu.cuda_driver_version),
            },
            "gpus": [{**_plain(g), "island": gpu.islands()[g.index]} for g in gpu.gpus],
            "nvlink_matrix": nvlink_matrix(inv),
        },
        "accel": {
            "devices": [
                {**_plain(d), "pci_id": _pci_id(d.vendor_id, d.device_id)}
                for d in inv.accel.devices
            ],
            "reason": inv.accel.reason,
        },
        "block": [{**_plain(d), "size_bytes": d.size_bytes} for d in inv.block],
        "labels": {
            "node": inv.config.node_name,
            "labels": inv.config.labels.as_dict(),
            "source": inv.config.source,
        },
    }
    assert set(full) == set(SECTIONS)
    return {section: full[section]} if section else full


def human(n: int) -> str:
    return quantity.human(n, places=1)


def _cpu_lines(inv: Inventory, cpus: list[int], indent: str) -> list[str]:
    """L3 > cores > PUs for the given CPUs."""
    by_id = {c.id: c for c in inv.cpu.cpus}
    reserved = set(inv.cpu.reserved)
    lines, l3_seen, core_seen = [], set(), set()
    for cid in cpus:
        cpu = by_id.get(cid)
        if cpu is None or not cpu.online:
            continue
        l3 = inv.cpu.cache_of(cpu, "L3")
        if l3 and l3.id not in l3_seen:
            l3_seen.add(l3.id)
            lines.append(f"{indent}L3 #{l3.id} ({human(l3.size_bytes)})")
        key = (cpu.package, cpu.core)
        if key in core_seen:
            continue
        core_seen.add(key)
        l2 = inv.cpu.cache_of(cpu, "L2")
        pus = " ".join(f"PU {s}{'*' if s in reserved else ''}" for s in cpu.siblings)
        lines.append(
            f"{indent}  Core {cpu.core}"
            + (f" L2 {human(l2.size_bytes)}" if l2 else "")
            + f": {pus}"
        )
    return lines


def _attached(inv: Inventory, node: int | None, indent: str) -> list[str]:
    lines = []
    islands = inv.gpu.islands()
    for g in inv.gpu.gpus:
        if g.numa_node == node:
            peers = ",".join(str(p) for p in g.nvlink_links) or "-"
            lines.append(
                f"{indent}GPU {g.index} {g.name} ({human(g.memory_total)}, "
                f"cc {g.compute_capability}, "
                f"{g.pci_bus_id}, NVLink peers {peers}, island {islands[g.index]})"
            )
    for a in inv.accel.devices:
        if a.numa_node == node:
            what = "TPU" if a.kind == "tpu" else "Accelerator"
            lines.append(
                f"{indent}{what} {a.name} {a.model or _pci_id(a.vendor_id, a.device_id) or '-'} "
                f"({a.pci_address or 'not on PCI'}, driver {a.driver or '-'}, "
                f"{' '.join(a.device_nodes) or 'no device node'})"
            )
    for d in inv.block:
        if d.numa_node == node and not d.virtual:
            traits = [
                "rotational" if d.rotational else "flash",
                d.scheduler or "-",
                f"io_poll={d.io_poll}" + (f" poll_queues={d.poll_queues}" if d.poll_queues else ""),
            ]
            lines.append(
                f"{indent}Block {d.name} {d.dev} ({human(d.size_bytes)}, {', '.join(traits)})"
            )
    return lines


def tree(inv: Inventory) -> str:
    labels = " ".join(f"{k}={v}" for k, v in inv.config.labels.as_dict().items())
    mem = inv.memory
    out = [
        f"Machine {inv.config.node_name}"
        + (f" [{labels}]" if labels else "")
        + f" ({human(mem.total)}, available {human(mem.available)})"
    ]
    by_id = {c.id: c for c in inv.cpu.cpus}
    packages: dict[int, list] = {}
    for node in inv.numa:
        pkg = next((by_id[c].package for c in node.cpus if c in by_id and by_id[c].online), 0)
        packages.setdefault(pkg or 0, []).append(node)
    for pkg, nodes in sorted(packages.items()):
        out.append(f"  Package {pkg}")
        for node in nodes:
            out.append(
                f"    NUMANode {node.id} ({human(node.memory_total)}, "
                f"free {human(node.memory_free)})"
            )
            out += _cpu_lines(inv, list(node.cpus), "      ")
            out += _attached(inv, node.id, "      ")
    out += _attached(inv, None, "  ")
    if inv.cpu.reserved:
        out.append(f"  (* reserved for the system: {','.join(map(str, inv.cpu.reserved))})")
    if not inv.gpu.available:
        out.append(f"  NVML unavailable: {inv.gpu.reason}")
    if inv.accel.reason:
        out.append(f"  No accelerators: {inv.accel.reason}")
    return "\n".join(out)


def section_text(inv: Inventory, section: str) -> str:
    """One section as indented `key: value` text (the tree covers cpu/numa/gpu/block together)."""
    import yaml

    data = as_dict(inv, section)
    if section == "pci":  # ids in hex, as lspci and pci.ids write them
        data["pci"] = [
            {
                **d,
                "vendor_id": f"0x{d['vendor_id']:04x}",
                "device_id": f"0x{d['device_id']:04x}",
                "class_id": f"0x{d['class_id']:06x}",
            }
            for d in data["pci"]
        ]
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110).rstrip()


__all__ = ["as_dict", "tree", "section_text", "nvlink_matrix", "nvlink_islands"]
