"""IOPOLL per block device: what sysfs says (`queue/io_poll`) and what a real polled
O_DIRECT read does, plus a polled read of a regular file for the filesystem case.

The aggregate item `iopoll` is ok when at least one device completed a polled read.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import errno_reason
from ..inventory.block import BlockDevice, block_devices
from ..io import Ring, UringError, aligned_buffer
from .report import Item, fail, ok
from .uring_probe import BLOCK, scratch_file


def polled_read(path: str, length: int = BLOCK, offset: int = 0) -> bytes:
    """One O_DIRECT read through an IOPOLL ring; raises OSError/UringError with the errno."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        with Ring(4, ("iopoll",)) as ring, aligned_buffer(length) as buf:
            n = ring.read_into(fd, buf, offset, what=f"IOPOLL read {path}")
            return bytes(buf[:n])
    finally:
        os.close(fd)


def _device_item(dev: BlockDevice, dev_root: Path) -> Item:
    name = f"iopoll.{dev.name}"
    detail = {"dev": dev.dev, "io_poll": dev.io_poll}
    path = str(dev_root / dev.name)
    try:
        data = polled_read(path, max(BLOCK, dev.logical_block))
    except UringError as exc:
        return fail(
            name, f"queue/io_poll={dev.io_poll}; {errno_reason(exc, 'polled read')}", **detail
        )
    except OSError as exc:
        return fail(
            name, f"queue/io_poll={dev.io_poll}; cannot open {path}: {errno_reason(exc)}", **detail
        )
    return ok(name, bytes=len(data), **detail)


def _file_item() -> Item:
    try:
        with scratch_file() as (path, data):
            got = polled_read(path)
    except OSError as exc:
        return fail("iopoll.file", f"polled O_DIRECT read of a regular file: {errno_reason(exc)}")
    if got != data:
        return fail("iopoll.file", "polled read returned wrong bytes")
    return ok("iopoll.file", bytes=len(got))


def probe(sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> list[Item]:
    devices = [_device_item(d, dev_root) for d in block_devices(sys_root)]
    usable = [i.name.split(".", 1)[1] for i in devices if i.ok]
    if usable:
        summary = ok("iopoll", devices=usable)
    elif devices:
        summary = fail(
            "iopoll",
            "no block device completes a polled read: "
            + "; ".join(f"{i.name.split('.', 1)[1]}: {i.reason}" for i in devices),
        )
    else:
        summary = fail("iopoll", f"no block devices with a medium under {sys_root}/block")
    return [summary, *devices, _file_item()]
