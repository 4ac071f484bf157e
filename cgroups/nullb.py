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
# that complete 1 ms after submission: 16k IOPS at most, above what the readers issue under
# emulation and so above the io.cost model the bench writes (below), so io.cost throttles.
# Completions after 200 µs (80k IOPS) let the readers' CPU, not io.cost, set more of the
# split in the emulated guest: 500/100 gave 4.1-4.5:1 there, against 4.8-4.9:1 with 1 ms.
BENCH_SETTINGS = {
    "size": 4096,  # MiB
    "blocksize": 4096,
    "queue_mode": 2,  # blk-mq
    "irqmode": 2,  # completions from a timer
    "completion_nsec": 1_000_000,
    "hw_queue_depth": 16,
    "memory_backed": 0,
}
# The io.cost model `bench cgroup-io` writes for the disk it makes is linear, with a
# random-read budget below what the readers issue on this machine, so that io.cost, not the
# disk or the readers' CPU, decides who gets what. That rate is the machine's: a fixed 4,000
# budget sat just under it on the development machines (500/100 gave 5.00-5.05:1 in four
# runs) and above it on one 3-4x slower, where io.cost never throttled and 500/100 split
# 0.70/0.30. Nor is one reader alone the gauge: under emulation it issued ~8,700 reads/s
# with io.cost off, while three readers under io.cost issued 3,700-5,200 together. So the
# bench first runs three readers under io.cost with a budget none reaches (CALIBRATION_IOPS)
# and sets the budget to BUDGET_FRACTION of what they issued together: the 500-weight
# group's reader must be able to issue its 82% of the budget while the others still take
# CPU, also when the host is busy. One reader issued 0.46-0.48 of that total on a quiet
# host; at 0.45 with the vrate fixed (NULLB_QOS), a loaded host gave 500/100 0.70/0.30
# (with the depth split over four reader processes), and at 0.3 it gave 0.831-0.833 /
# 0.167-0.169 in two runs, the groups reading 97-106% of the budget.
BUDGET_FRACTION = 0.3
CALIBRATION_IOPS = 1_000_000
MIN_BUDGET_IOPS = 500  # below this io.cost's own margins are the size of the small shares


def io_cost_model(rand_read_iops: int) -> str:
    """A linear io.cost model whose reads cost as `rand_read_iops` 4 KiB reads a second."""
    return (
        f"ctrl=user model=linear rbps={rand_read_iops * 4000} rseqiops={rand_read_iops} "
        f"rrandiops={rand_read_iops} wbps=80000000 wseqiops=20000 wrandiops=20000"
    )


def io_cost_budget(together_iops: float) -> int:
    """The random-read budget for a disk the readers read at `together_iops` unthrottled."""
    return max(MIN_BUDGET_IOPS, int(together_iops * BUDGET_FRACTION))


# A fixed model of that shape, for tests that write one: 4,000 random reads a second.
NULLB_MODEL = io_cost_model(4000)
# The QoS fixes the vrate at 100% (min=max=100), so the budget is the model's. With max=1000
# io.cost raised it while latencies stayed low, the budget grew past what the 500-weight
# group's reader can issue, and what that group left went to the 100-weight one (4.2:1 for
# 5:1 in one run of four). With min=1, on a host whose CPU was short, late completions cut
# the vrate, the groups read as little as 29% of the budget, the shares drifting toward the
# light groups (500/100/10 gave 0.79/0.19/0.02; on a slower machine nested gave
# 0.484/0.199/0.318 for 0.500/0.167/0.333).
NULLB_QOS = "enable=1 ctrl=user rpct=95.00 rlat=5000 wpct=95.00 wlat=5000 min=100.00 max=100.00"


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
