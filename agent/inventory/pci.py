"""PCIe devices (sysfs), with vendor/device/class names where a pci.ids database is installed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .sysfs import LIVE_ROOTS, Roots, integer, text

PCI_IDS = (
    Path("/usr/share/misc/pci.ids"),
    Path("/usr/share/hwdata/pci.ids"),
    Path("/usr/share/pci.ids"),
)


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:18:00.0
    class_id: int  # 0x030200
    vendor_id: int
    device_id: int
    numa_node: int | None
    driver: str | None
    link_speed: str | None  # "16.0 GT/s PCIe"
    link_width: int | None
    max_link_speed: str | None
    max_link_width: int | None
    vendor_name: str | None = None
    device_name: str | None = None
    class_name: str | None = None


@dataclass(frozen=True)
class PciIds:
    vendors: dict[int, str]
    devices: dict[tuple[int, int], str]
    classes: dict[tuple[int, int], str]  # (class, subclass); subclass -1 for the class itself

    @classmethod
    def parse(cls, body: str) -> PciIds:
        vendors, devices, classes = {}, {}, {}
        vendor = klass = None
        for line in body.splitlines():
            if not line or line.startswith("#") or line.startswith("\t\t"):
                continue
            try:
                if line.startswith("C "):
                    klass = int(line[2:4], 16)
                    classes[(klass, -1)] = line[4:].strip()
                    vendor = None
                elif line.startswith("\t"):
                    ident, name = line[1:5], line[5:].strip()
                    if vendor is not None:
                        devices[(vendor, int(ident, 16))] = name
                    elif klass is not None:
                        classes[(klass, int(ident[:2], 16))] = line[3:].strip()
                else:
                    vendor, klass = int(line[:4], 16), None
                    vendors[vendor] = line[4:].strip()
            except ValueError:
                continue  # the database's tail (e.g. "List of known device classes") and odd lines
        return cls(vendors, devices, classes)

    @classmethod
    def load(cls, candidates: tuple[Path, ...] = PCI_IDS) -> PciIds | None:
        for path in candidates:
            try:
                return cls.parse(path.read_text(errors="replace"))
            except OSError:
                continue
        return None


def _width(value: int | None) -> int | None:
    # Devices without a link (root complex integrated) report 0 or 255.
    return value if value and value < 64 else None


def read_pci(roots: Roots = LIVE_ROOTS, ids: PciIds | None = None) -> list[PciDevice]:
    base = roots.sys / "bus/pci/devices"
    if not base.is_dir():
        return []
    devices = []
    for d in sorted(base.iterdir()):
        numa = integer(d / "numa_node", -1)
        vendor, device, klass = (
            integer(d / "vendor", 0),
            integer(d / "device", 0),
            integer(d / "class", 0),
        )
        driver = (
            os.path.basename(os.readlink(d / "driver")) if (d / "driver").is_symlink() else None
        )
        devices.append(
            PciDevice(
                d.name,
                klass,
                vendor,
                device,
                numa if numa >= 0 else None,
                driver,
                text(d / "current_link_speed"),
                _width(integer(d / "current_link_width")),
                text(d / "max_link_speed"),
                _width(integer(d / "max_link_width")),
                ids.vendors.get(vendor) if ids else None,
                ids.devices.get((vendor, device)) if ids else None,
                (
                    ids.classes.get((klass >> 16, (klass >> 8) & 0xFF))
                    or ids.classes.get((klass >> 16, -1))
                )
                if ids
                else None,
            )
        )
    return devices


def pci_numa_node(roots: Roots, bus_id: str) -> int | None:
    """NUMA node of a device by bus id; NVML writes the domain with 8 digits (00000000:18:00.0)."""
    domain, _, rest = bus_id.lower().partition(":")
    node = integer(
        roots.sys / "bus/pci/devices" / f"{int(domain, 16):04x}:{rest}" / "numa_node", -1
    )
    return node if node is not None and node >= 0 else None
