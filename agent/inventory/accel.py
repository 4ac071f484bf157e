"""Accelerators besides NVIDIA GPUs (sysfs): Google TPUs and any device of the kernel's `accel`
class.

Two ways a device shows up:
- the `accel` class (`/sys/class/accel/accelN`, device node `/dev/accel/accelN`; Google's own
  TPU v4+ driver names the node `/dev/accelN`): `device` links to the PCI function;
- a Google TPU (PCI vendor 0x1ae0) outside that class, as TPU v2/v3 hosts hand it to vfio-pci:
  its node is the IOMMU group's `/dev/vfio/N`.

A device of vendor 0x1ae0 is a TPU when its device id is a known TPU chip, or when its PCI class
is 0x12 (processing accelerator); Google's other PCI functions (gVNIC 0x0042, NVMe 0x001f on a
GCE VM) are not. Every other device of the `accel` class is a generic `accelerator`. Finding
none is a fact with its reason, never an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .pci import PciIds
from .sysfs import LIVE_ROOTS, Roots, integer

GOOGLE = 0x1AE0
# PCI device id -> TPU generation (gVisor's pkg/abi/tpu, Google's tpu-info).
TPU_MODELS = {
    0x0027: "TPU v2/v3",
    0x0056: "TPU v4 lite",
    0x005E: "TPU v4",
    0x0062: "TPU v5p",
    0x0063: "TPU v5e",
    0x006F: "TPU v6e",
}
PROCESSING_ACCELERATOR = 0x12  # PCI base class
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True)
class AccelDevice:
    name: str  # accelN from the accel class; the PCI address for a vfio-bound TPU
    kind: str  # "tpu" or "accelerator"
    model: str | None  # "TPU v4", else pci.ids' device name where known
    pci_address: str | None  # None: the device is not on PCI
    vendor_id: int | None
    device_id: int | None
    numa_node: int | None
    driver: str | None
    device_nodes: tuple[str, ...]  # as the task opens them, e.g. /dev/accel/accel0, /dev/vfio/12


@dataclass(frozen=True)
class AccelInventory:
    devices: tuple[AccelDevice, ...] = ()
    reason: str | None = None  # why there are none

    @property
    def tpus(self) -> tuple[AccelDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "tpu")


def _link_name(path: Path) -> str | None:
    return os.path.basename(os.readlink(path)) if path.is_symlink() else None


def _is_tpu(vendor: int | None, device: int | None, klass: int | None) -> bool:
    return vendor == GOOGLE and (
        device in TPU_MODELS or (klass or 0) >> 16 == PROCESSING_ACCELERATOR
    )


def _nodes(dev: Path, *candidates: str) -> tuple[str, ...]:
    """Those of the candidate nodes (relative to /dev) that exist under the dev root."""
    return tuple(f"/dev/{c}" for c in candidates if os.path.lexists(dev / c))


def _device(name: str, pci: Path | None, nodes, ids: PciIds | None) -> AccelDevice:
    address = pci.name if pci is not None and _PCI_ADDRESS.fullmatch(pci.name) else None
    vendor = device = klass = numa = driver = None
    if address is not None:
        vendor, device, klass = (integer(pci / f) for f in ("vendor", "device", "class"))
        numa = integer(pci / "numa_node", -1)
        driver = _link_name(pci / "driver")
    tpu = _is_tpu(vendor, device, klass)
    model = TPU_MODELS.get(device) if tpu else None
    if model is None and ids is not None and vendor is not None:
        model = ids.devices.get((vendor, device or 0))
    return AccelDevice(
        name,
        "tpu" if tpu else "accelerator",
        model,
        address,
        vendor,
        device,
        numa if numa is not None and numa >= 0 else None,
        driver,
        nodes,
    )


def _minor(name: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", name)
    return (int(digits) if digits else -1, name)


def read_accel(roots: Roots = LIVE_ROOTS, ids: PciIds | None = None) -> AccelInventory:
    found: list[AccelDevice] = []
    seen: set[str] = set()  # PCI addresses already found through the accel class
    klass = roots.sys / "class/accel"
    entries = sorted(klass.iterdir(), key=lambda p: _minor(p.name)) if klass.is_dir() else []
    for entry in entries:
        pci = (entry / "device").resolve() if (entry / "device").exists() else None
        # The kernel's accel subsystem: /dev/accel/accelN; Google's TPU v4+ driver: /dev/accelN.
        nodes = _nodes(roots.dev, f"accel/{entry.name}", entry.name)
        dev = _device(entry.name, pci, nodes, ids)
        found.append(dev)
        seen.add(dev.pci_address or "")
    base = roots.sys / "bus/pci/devices"
    google = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if integer(d / "vendor") != GOOGLE:
            continue
        google.append(d.name)
        ident = (integer(d / "device"), integer(d / "class"))
        if d.name in seen or not _is_tpu(GOOGLE, *ident):
            continue
        group = _link_name(d / "iommu_group")
        nodes = _nodes(roots.dev, f"vfio/{group}") if group else ()
        found.append(_device(d.name, d, nodes, ids))
    if found:
        return AccelInventory(tuple(found))
    where = (
        f"{klass} is empty" if klass.is_dir() else f"no {klass}",
        f"no PCI device of vendor 0x{GOOGLE:04x}"
        if not google
        else f"no TPU among the PCI devices of vendor 0x{GOOGLE:04x} ({', '.join(google)})",
    )
    return AccelInventory((), " and ".join(where))
