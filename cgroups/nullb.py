"""A null_blk disk made through configfs for as long as a `with` block lasts.

null_blk completes requests on a timer (`irqmode=2`, `completion_nsec`) without touching
memory (`memory_backed=0`), so its speed is set by its queue depth and that delay, not by
the CPU of whatever runs it: on an emulated machine it is the one disk where a device
queue, rather than the emulator, is the bottleneck, which is what io.cost needs to show
that io.weight splits a disk. The device is made with the module's configfs interface
(`/sys/kernel/config/nullb/NAME`), so it never touches a null_blk disk someone else made,
and it is powered off and removed on the way out, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CONFIGFS = Path("/sys/kernel/config")
NULLB = CONFIGFS / "nullb"

# What `bench cgroup-io --device nullb` measures on: 4 GiB, blk-mq, 16 requests in flight
# that complete 1 ms after submission: 16k IOPS at most, above the io.cost model the bench
# writes (4,000 random reads/s at vrate 100% at most), so io.cost throttles. Completions after
# 200 µs (80k IOPS) let the readers' CPU, not io.cost, set more of the split in the
# emulated guest: 500/100 gave 4.1-4.5:1 there, against 4.8-4.9:1 with 1 ms.
BENCH_SETTINGS = {
    "size": 4096,  # MiB
    "blocksize": 4096,
    "queue_mode": 2,  # blk-mq
    "irqmode": 2,  # completions from a timer
    "completion_nsec": 1_000_000,
    "hw_queue_depth": 16,
    "memory_backed": 0,
}
# The io.cost model and QoS that `bench cgroup-io` writes for the disk it makes: a linear
# model whose random-read budget (4,000 IOPS) sits below what the disk and one reader do
# (~5,000 IOPS under emulation, BENCH_SETTINGS), so io.cost, not the disk, decides who gets
# what. The QoS caps the vrate at 100% (max=100): with max=1000 io.cost raised it while
# latencies stayed low, the budget grew past what the 500-weight group's one reader can
# issue, and what that group left went to the 100-weight one (4.2:1 for 5:1 in one run of
# four, with a 2,000 IOPS model; with a budget wholly above the disk's capacity, 3.7:1). A
# 2,000 IOPS model under the cap gave the 10-weight group of 500/100/10 more than the 100
# one in one run of four: its share, 20 IOPS, is within io.cost's own margins.
NULLB_MODEL = (
    "ctrl=user model=linear rbps=16000000 rseqiops=4000 rrandiops=4000 "
    "wbps=80000000 wseqiops=20000 wrandiops=20000"
)
NULLB_QOS = "enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=1.00 max=100.00"


class NullBlkError(RuntimeError):
    """null_blk cannot be used here; the message says what is missing and how to add it."""


@dataclass(frozen=True)
class NullBlk:
    name: str  # the configfs directory
    disk: str  # the block device name: nullb<index>

    @property
    def dev(self) -> Path:
        return Path("/dev") / self.disk


def available(root: Path | None = None) -> str | None:
    """None when null_blk's configfs interface is here; else why not."""
    root = root or NULLB
    if root.is_dir():
        return None
    if not _mounted(root.parent):
        return f"configfs is not mounted at {root.parent} (mount -t configfs none {root.parent})"
    return "the null_blk module is not loaded (modprobe null_blk nr_devices=0)"


def _mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == str(path) for line in mounts)


def load_module() -> None:
    """`modprobe null_blk nr_devices=0` where configfs is mounted but the module is not
    loaded: it then makes no disk of its own."""
    if available() is None or not _mounted(CONFIGFS):
        return
    modprobe = shutil.which("modprobe", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if modprobe is None:
        return
    subprocess.run(
        [modprobe, "null_blk", "nr_devices=0"], capture_output=True, text=True, timeout=30
    )


@contextmanager
def null_blk(name: str, settings: dict[str, int], root: Path | None = None) -> Iterator[NullBlk]:
    """A powered-on null_blk disk configured with `settings` (configfs attribute -> value),
    powered off and removed afterwards. NullBlkError when null_blk is not usable here."""
    root = root or NULLB
    why = available(root)
    if why is not None:
        raise NullBlkError(f"no null_blk: {why}")
    if "/" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a configfs directory name")
    node = root / name
    try:
        node.mkdir()  # an existing one is not ours: FileExistsError, and nothing is touched
    except FileExistsError:
        raise NullBlkError(f"{node} exists already: it is not this run's") from None
    try:
        for attr, value in settings.items():
            _write(node / attr, value)
        _write(node / "power", 1)
        # Newer kernels name a configfs disk after its directory, older ones nullb<index>.
        disk = _disk_name(name, (node / "index").read_text().strip())
        _wait_for(Path("/dev") / disk)
        yield NullBlk(name, disk)
    finally:
        try:
            if (node / "power").read_text().strip() == "1":
                _write(node / "power", 0)
        finally:
            node.rmdir()


def _disk_name(name: str, index: str, sys_block: Path = Path("/sys/block")) -> str:
    for disk in (name, f"nullb{index}"):
        if (sys_block / disk).exists():
            return disk
    raise NullBlkError(f"null_blk disk {name!r} (index {index}) is not in {sys_block}")


def _write(path: Path, value: int | str) -> None:
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        raise NullBlkError(f"{path}: cannot write {value}: {exc.strerror}") from None


def _wait_for(dev: Path, timeout: float = 10.0) -> None:
    """The block device node appears when udev (or devtmpfs) gets to it."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(dev):
        if time.monotonic() > deadline:
            raise NullBlkError(f"{dev} did not appear within {timeout:g} s of power=1")
        time.sleep(0.02)
