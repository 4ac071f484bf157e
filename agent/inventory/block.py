"""Block devices with a medium, as sysfs describes them (the one reader; `xhagent doctor` uses
it too)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import errno_reason
from .sysfs import LIVE_ROOTS, Roots, integer, text

# Devices that are not hardware queues a task's IO class could map to.
VIRTUAL = re.compile(r"(loop|ram|zram)\d+$")


@dataclass(frozen=True)
class BlockDevice:
    name: str
    dev: str  # MAJ:MIN
    size_sectors: int
    io_poll: int
    logical_block: int
    rotational: bool = False
    scheduler: str | None = None  # the bracketed one of queue/scheduler
    poll_queues: int = 0
    numa_node: int | None = None
    open_error: str | None = None  # None: the agent can open it (O_RDONLY); else why not

    @property
    def size_bytes(self) -> int:
        return (
            self.size_sectors * 512
        )  # sysfs `size` is in 512-byte sectors whatever the block size

    @property
    def virtual(self) -> bool:
        return VIRTUAL.match(self.name) is not None


def _scheduler(value: str | None) -> str | None:
    m = re.search(r"\[([^\]]+)\]", value or "")
    return m.group(1) if m else (value or None)


def _poll_queues(sys_root: Path, entry: Path, io_poll: int) -> int:
    # Per-device poll queue counts live in debugfs only; NVMe's module parameter is the
    # same for every controller, and io_poll=1 says this device got them.
    if not io_poll or not entry.name.startswith("nvme"):
        return 0
    return integer(sys_root / "module/nvme/parameters/poll_queues", 0)


def _numa_node(entry: Path) -> int | None:
    # nvme0n1/device is the controller (numa_node there); virtio's is one level deeper.
    for rel in ("device/numa_node", "device/device/numa_node"):
        node = integer(entry / rel)
        if node is not None:
            return node if node >= 0 else None
    return None


def _open_error(path: Path) -> str | None:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
    except OSError as exc:
        return f"cannot open {path}: {errno_reason(exc)}"
    return None


def block_devices(sys_root: Path = Path("/sys"), dev_root: Path | None = None) -> list[BlockDevice]:
    """Block devices with a medium (size > 0). With `dev_root`, also whether each opens."""
    devices = []
    for entry in sorted((sys_root / "block").iterdir()):
        size = integer(entry / "size", 0)
        if size == 0:
            continue
        io_poll = integer(entry / "queue/io_poll", 0)
        devices.append(
            BlockDevice(
                name=entry.name,
                dev=text(entry / "dev", ""),
                size_sectors=size,
                io_poll=io_poll,
                logical_block=integer(entry / "queue/logical_block_size", 512),
                rotational=integer(entry / "queue/rotational", 0) == 1,
                scheduler=_scheduler(text(entry / "queue/scheduler")),
                poll_queues=_poll_queues(sys_root, entry, io_poll),
                numa_node=_numa_node(entry),
                open_error=_open_error(dev_root / entry.name) if dev_root is not None else None,
            )
        )
    return devices


def read_block(roots: Roots = LIVE_ROOTS) -> list[BlockDevice]:
    return block_devices(roots.sys, roots.dev)
