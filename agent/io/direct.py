"""O_DIRECT files, read (and written) through an IOPOLL ring where the device polls.

Polling is chosen only for O_DIRECT I/O on a block device whose `queue/io_poll` is 1 (a
regular file counts through the disk it lives on). A polled op that completes with
-EOPNOTSUPP is redone on the interrupt-driven ring and the file stays there: the fallback
is counted in `stats`, and the caller gets its data either way.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .batch import BatchResult, rw_batch
from .ring import Ring, UringError


def device_polls(st_dev_or_rdev: int, sys_root: Path = Path("/sys")) -> bool:
    """Whether the disk behind MAJ:MIN has queue/io_poll = 1 (a partition asks its disk)."""
    node = sys_root / "dev/block" / f"{os.major(st_dev_or_rdev)}:{os.minor(st_dev_or_rdev)}"
    for queue in (node / "queue", node / ".." / "queue"):
        try:
            return queue.joinpath("io_poll").read_text().strip() == "1"
        except OSError:
            continue
    return False


def logical_block(st_dev_or_rdev: int, sys_root: Path = Path("/sys")) -> int:
    node = sys_root / "dev/block" / f"{os.major(st_dev_or_rdev)}:{os.minor(st_dev_or_rdev)}"
    for queue in (node / "queue", node / ".." / "queue"):
        try:
            return int(queue.joinpath("logical_block_size").read_text())
        except (OSError, ValueError):
            continue
    return 512


def alignment_problem(offset: int, length: int, address: int, block: int) -> str | None:
    """Why an O_DIRECT transfer would fail with EINVAL, or None when it is aligned."""
    bad = [f"{name} {value} is not a multiple of {block}"
           for name, value in (("offset", offset), ("length", length), ("buffer address", address))
           if value % block]
    return None if not bad else "O_DIRECT needs block-aligned I/O: " + "; ".join(bad)


class DirectFile:
    """`path` opened O_DIRECT; `poll` is "auto" (the device decides), True (try; fall back) or False."""

    def __init__(self, path: str, *, write: bool = False, poll: str | bool = "auto", entries: int = 64,
                 sys_root: Path = Path("/sys")):
        self.path = path
        self.fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT | os.O_CLOEXEC)
        try:
            st = os.fstat(self.fd)
            dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
            self.block = logical_block(dev, sys_root)
            self.device_polls = device_polls(dev, sys_root)
            want_poll = self.device_polls if poll == "auto" else bool(poll)
            self._interrupt = Ring(entries)
            self._polled = Ring(entries, ("iopoll",)) if want_poll else None
        except BaseException:
            os.close(self.fd)
            raise
        self.stats = {"polled_ops": 0, "interrupt_ops": 0, "fallbacks": 0, "fallback_ops": 0}
        self.fallback_reason: str | None = None

    @property
    def polled(self) -> bool:
        """True while I/O goes through the IOPOLL ring."""
        return self._polled is not None

    def _check_aligned(self, offsets, length: int, buf) -> None:
        from .ring import ffi

        with ffi.from_buffer(buf) as ptr:
            address = int(ffi.cast("uintptr_t", ptr))
        misaligned = next((o for o in offsets if o % self.block), 0)
        problem = alignment_problem(misaligned, length, address, self.block)
        if problem:
            raise UringError(errno.EINVAL, problem, self.path)

    def transfer(self, offsets, length: int, buf, *, write: bool = False, depth: int = 32,
                 latencies: bool = False) -> BatchResult:
        self._check_aligned(offsets, length, buf)
        kw = dict(write=write, depth=depth, retry_short=False, latencies=latencies, what=self.path)
        if self._polled is not None:
            result = rw_batch(self._polled, self.fd, offsets, length, buf, **kw)
            redo = [i for i, r in enumerate(result.res) if r == -errno.EOPNOTSUPP]
            self.stats["polled_ops"] += len(result.res) - len(redo)
            if not redo:
                return result
            self._fall_back(len(redo))
            again = rw_batch(self._interrupt, self.fd, result.offsets, length, buf, only=redo, **kw)
            for j, i in enumerate(redo):
                result.res[i] = again.res[j]
                if result.lat_ns is not None:
                    result.lat_ns[i] = min(0xFFFFFFFF, result.lat_ns[i] + again.lat_ns[j])
            return result
        result = rw_batch(self._interrupt, self.fd, offsets, length, buf, **kw)
        self.stats["interrupt_ops"] += len(result.res)
        return result

    def read(self, offsets, length: int, buf, **kw) -> BatchResult:
        return self.transfer(offsets, length, buf, write=False, **kw)

    def write(self, offsets, length: int, buf, **kw) -> BatchResult:
        return self.transfer(offsets, length, buf, write=True, **kw)

    def _fall_back(self, ops: int) -> None:
        self.stats["fallbacks"] += 1
        self.stats["fallback_ops"] += ops
        self.stats["interrupt_ops"] += ops
        self.fallback_reason = f"IOPOLL completion -EOPNOTSUPP on {self.path}: using the interrupt ring"
        self._polled.close()
        self._polled = None

    def close(self) -> None:
        if self.fd >= 0:
            if self._polled is not None:
                self._polled.close()
            self._interrupt.close()
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "DirectFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
