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
from array import array
from collections import deque
from pathlib import Path

from .batch import BatchResult, RwStream, as_offsets, rw_batch
from .ring import Ring, UringError, ffi, lib


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
    bad = [
        f"{name} {value} is not a multiple of {block}"
        for name, value in (("offset", offset), ("length", length), ("buffer address", address))
        if value % block
    ]
    return None if not bad else "O_DIRECT needs block-aligned I/O: " + "; ".join(bad)


def _ring(entries: int) -> Ring:
    """An interrupt-driven ring whose completions wait for the loop's next io_uring_enter
    instead of interrupting it (COOP_TASKRUN, as fio sets; the loop always enters to wait),
    or a plain one where the kernel predates that flag (5.19)."""
    try:
        return Ring(entries, ("coop_taskrun",))
    except UringError:
        return Ring(entries)


class DirectFile:
    """`path` opened O_DIRECT; `poll` is "auto" (the device decides), True (try; fall back)
    or False.

    The file is registered with its rings (fixed file) and buffers given to
    register_buffers() become fixed buffers, where the ring allows: a refused registration
    is counted in `stats["registration_refusals"]` and explained in `registration_notes`,
    and the I/O then goes by plain fd or plain buffer. `stats` counts the submissions each
    way (an op redone after an IOPOLL refusal counts twice).
    """

    def __init__(
        self,
        path: str,
        *,
        write: bool = False,
        poll: str | bool = "auto",
        entries: int = 64,
        sys_root: Path = Path("/sys"),
        register: bool = True,
    ):
        self.path = path
        self.fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT | os.O_CLOEXEC)
        try:
            st = os.fstat(self.fd)
            dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
            self.block = logical_block(dev, sys_root)
            self.device_polls = device_polls(dev, sys_root)
            want_poll = self.device_polls if poll == "auto" else bool(poll)
            self._interrupt = _ring(entries)
            self._polled = Ring(entries, ("iopoll",)) if want_poll else None
        except BaseException:
            os.close(self.fd)
            raise
        self.stats = {
            "polled_ops": 0,
            "interrupt_ops": 0,
            "fallbacks": 0,
            "fallback_ops": 0,
            "fixed_file_ops": 0,
            "fixed_buffer_ops": 0,
            "plain_buffer_ops": 0,
            "registration_refusals": 0,
        }
        self.fallback_reason: str | None = None
        self.registration_notes: list[str] = []
        if register:
            for ring in self._rings():
                self._register(ring, "file", ring.register_files, [self.fd])

    @property
    def polled(self) -> bool:
        """True while I/O goes through the IOPOLL ring."""
        return self._polled is not None

    def _rings(self) -> list[Ring]:
        return [r for r in (self._interrupt, self._polled) if r is not None]

    def _register(self, ring: Ring, what: str, call, arg) -> None:
        try:
            call(arg)
        except UringError as exc:
            self.stats["registration_refusals"] += 1
            kind = "IOPOLL" if ring is self._polled else "interrupt"
            self.registration_notes.append(
                f"{what} registration refused on the {kind} ring ({exc.strerror}): "
                f"{'plain fd' if what == 'file' else 'plain buffers'} instead"
            )

    def register_buffers(self, buffers: list) -> None:
        """Make `buffers` (aligned memory the caller keeps alive, e.g. AlignedBuffer.view) the
        fixed buffers of this file's rings; a transfer whose buffer lies inside one uses it."""
        for ring in self._rings():
            if ring.buffers is not None:
                ring.unregister_buffers()
            self._register(ring, "buffer", ring.register_buffers, list(buffers))

    def _check_aligned(self, offsets, length: int, buf) -> None:
        with ffi.from_buffer(buf) as ptr:
            address = int(ffi.cast("uintptr_t", ptr))
        offs = as_offsets(offsets)
        with ffi.from_buffer(offs) as po:
            first = lib.xh_first_misaligned(ffi.cast("uint64_t *", po), len(offs), self.block)
        misaligned = 0 if first < 0 else offs[first]
        problem = alignment_problem(misaligned, length, address, self.block)
        if problem:
            raise UringError(errno.EINVAL, problem, self.path)

    def _args(self, ring: Ring, buf, nbytes: int, ops: int) -> dict:
        """The fd and registrations `ring` offers for `buf`, with the ops counted each way."""
        fixed_file = ring.files is not None
        index = ring.buffer_index(buf, nbytes)
        self.stats["fixed_file_ops"] += ops if fixed_file else 0
        self.stats["fixed_buffer_ops" if index is not None else "plain_buffer_ops"] += ops
        return dict(fd=0 if fixed_file else self.fd, fixed_file=fixed_file, fixed_buffer=index)

    def transfer(
        self,
        offsets,
        length: int,
        buf,
        *,
        write: bool = False,
        depth: int = 32,
        latencies: bool = False,
    ) -> BatchResult:
        self._check_aligned(offsets, length, buf)
        ring = self._polled or self._interrupt
        kw = dict(write=write, depth=depth, retry_short=False, latencies=latencies, what=self.path)
        result = rw_batch(
            ring,
            offsets=offsets,
            length=length,
            buf=buf,
            **self._args(ring, buf, len(offsets) * length, len(offsets)),
            **kw,
        )
        if ring is self._polled:
            if self._redo_refused(result, buf, kw):
                self._drop_polled()
        else:
            self.stats["interrupt_ops"] += len(result.res)
        return result

    def _redo_refused(self, result: BatchResult, buf, kw: dict, slots: int = 0) -> int:
        """Redo on the interrupt ring the ops the IOPOLL ring completed with -EOPNOTSUPP
        (result updated in place; `slots`: buf is a sink stream's); returns how many."""
        redo = [i for i, r in enumerate(result.res) if r == -errno.EOPNOTSUPP]
        self.stats["polled_ops"] += len(result.res) - len(redo)
        if not redo:
            return 0
        self.stats["fallback_ops"] += len(redo)
        self.stats["interrupt_ops"] += len(redo)
        self.fallback_reason = (
            f"IOPOLL completion -EOPNOTSUPP on {self.path}: using the interrupt ring"
        )
        length = result.length
        args = self._args(self._interrupt, buf, (slots or len(result.offsets)) * length, len(redo))
        if slots:
            sink = RwStream(self._interrupt, length=length, slots=slots, **args, **kw)
            sink.feed(array("Q", (result.offsets[i] for i in redo)), buf)
            again = sink.finish()
        else:
            again = rw_batch(
                self._interrupt,
                offsets=result.offsets,
                length=length,
                buf=buf,
                only=redo,
                **args,
                **kw,
            )
        for j, i in enumerate(redo):
            result.res[i] = again.res[j]
            if result.lat_ns is not None:
                result.lat_ns[i] = min(0xFFFFFFFF, result.lat_ns[i] + again.lat_ns[j])
        return len(redo)

    def stream(
        self,
        length: int,
        *,
        write: bool = False,
        depth: int = 32,
        latencies: bool = False,
        submit_batch: int = 1,
        slots: int = 0,
    ) -> DirectStream:
        """An RwStream on this file (see DirectStream): the queue stays full across batches;
        each op goes to the disk as soon as it is prepared (submit_batch=1, as fio does);
        `slots` makes it a sink stream (RwStream)."""
        return DirectStream(
            self,
            length,
            dict(write=write, depth=depth, retry_short=False, latencies=latencies, what=self.path),
            submit_batch,
            slots,
        )

    def read(self, offsets, length: int, buf, **kw) -> BatchResult:
        return self.transfer(offsets, length, buf, write=False, **kw)

    def write(self, offsets, length: int, buf, **kw) -> BatchResult:
        return self.transfer(offsets, length, buf, write=True, **kw)

    def _drop_polled(self) -> None:
        self.stats["fallbacks"] += 1
        self._polled.close()
        self._polled = None

    def close(self) -> None:
        if self.fd >= 0:
            if self._polled is not None:
                self._polled.close()
            self._interrupt.close()
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectStream:
    """Batches of O_DIRECT transfers on a DirectFile through one RwStream: feed(offsets, buf)
    returns the previous batch's result, finish() the last; with the file's registrations.

    On an IOPOLL ring, ops completed with -EOPNOTSUPP are redone on the interrupt ring as
    in transfer(); the stream then drains the polled ring and goes on on the interrupt ring,
    handing out the batch it drained at the next call, so results keep their order.
    """

    def __init__(
        self, file: DirectFile, length: int, kw: dict, submit_batch: int = 1, slots: int = 0
    ):
        self.file, self.length, self._kw, self._submit_batch, self._slots = (
            file,
            length,
            kw,
            submit_batch,
            slots,
        )
        self._bufs: deque = deque()  # buffers of the batches in flight, oldest first
        self._ready: deque[BatchResult] = deque()  # completed ahead of their turn (fallback)
        self._stream = self._open()

    def _open(self) -> RwStream:
        ring = self.file._polled or self.file._interrupt
        fd = 0 if ring.files is not None else self.file.fd
        return RwStream(
            ring,
            fd,
            self.length,
            fixed_file=ring.files is not None,
            submit_batch=self._submit_batch,
            slots=self._slots,
            **self._kw,
        )

    @property
    def min_inflight(self) -> int | None:
        return self._stream.min_inflight

    def feed(self, offsets, buf) -> BatchResult | None:
        f, ring = self.file, self._stream.ring
        f._check_aligned(offsets, self.length, buf)
        index = f._args(ring, buf, (self._slots or len(offsets)) * self.length, len(offsets))[
            "fixed_buffer"
        ]
        done = self._stream.feed(offsets, buf, fixed_buffer=index)
        self._bufs.append(buf)
        if done is not None:
            self._settle(done)
        return self._ready.popleft() if self._ready else None

    def finish(self) -> BatchResult | None:
        done = self._stream.finish()
        if done is not None:
            self._settle(done)
        return self._ready.popleft() if self._ready else None

    def _settle(self, result: BatchResult) -> None:
        f = self.file
        buf = self._bufs.popleft()
        self._ready.append(result)
        if self._stream.ring is not f._polled:
            f.stats["interrupt_ops"] += len(result.res)
        elif f._redo_refused(result, buf, self._kw, self._slots):
            last = self._stream.finish()  # drain the polled ring before it goes
            if last is not None:
                f._redo_refused(last, self._bufs.popleft(), self._kw, self._slots)
                self._ready.append(last)
            f._drop_polled()
            self._stream = self._open()

    def __enter__(self) -> DirectStream:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
