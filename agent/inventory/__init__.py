"""Node inventory: what this machine has (CPUs, caches, NUMA, memory, PCIe, GPUs, TPUs and
other accelerators, block devices, labels); `build_model` turns what it found into the
resource model the scheduling core consumes (`xhagent.node_model`, which lives on the ground
floor).

`from xhagent.inventory import discover_node, build_model`; readers take a `Roots` so a
recorded sysfs/procfs tree can stand in for the live one.
"""

from __future__ import annotations

from .sysfs import Roots


def __getattr__(name: str):
    # Lazy, so `xhagent.doctor` can import `inventory.block` without the rest.
    if name in ("discover_node", "build_model", "Inventory", "SECTIONS"):
        from . import collect

        return getattr(collect, name)
    raise AttributeError(name)


__all__ = ["Roots", "discover_node", "build_model", "Inventory", "SECTIONS"]
