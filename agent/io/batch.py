"""Batches of reads and writes: Python describes them as arrays, C (`xh_rw_batch`) keeps the
ring full, reaps in bulk and resubmits short transfers; Python sees one result per op.
`RwStream` feeds successive batches to the same C loop, which keeps the queue full across
them instead of draining at the end of each."""

from __future__ import annotations

import errno as _errno
import os
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import errno_reason
from .ring import Ring, UringError, ffi, lib


@dataclass
class BatchResult:
    """Per op: `res[i]` bytes transferred or -errno; `lat_ns[i]` submit-to-completion when asked."""

    res: array
    lat_ns: array | None
    offsets: array
    length: int
    what: str

    def errors(self) -> list[UringError]:
        return [
            UringError.from_res(r, f"{self.what} @ {self.offsets[i]}")
            for i, r in enumerate(self.res)
            if r < 0
        ]

    def check(self) -> BatchResult:
        """Raise the first failed op as an UringError naming the file and offset."""
        if not self.res or min(self.res) >= 0:  # the common case, without a Python loop per op
            return self
        for i, r in enumerate(self.res):
            if r < 0:
                raise UringError.from_res(r, f"{self.what} @ offset {self.offsets[i]}")
        return self

    def short(self) -> list[int]:
        """Indexes of ops that moved fewer than `length` bytes (EOF, or not retried)."""
        return [i for i, r in enumerate(self.res) if 0 <= r < self.length]


def as_offsets(offsets: Sequence[int] | array) -> array:
    if isinstance(offsets, array) and offsets.typecode == "Q":
        return offsets
    return array("Q", offsets)


@dataclass(frozen=True)
class OpOptions:
    """How each op of a batch runs: the keyword options rw_batch and RwStream share, listed
    once here with their defaults so the two cannot drift apart.

    `write`: write instead of read; `retry_short`: resubmit short transfers for the rest
    (False for O_DIRECT at EOF); `fixed_buffer`: the registered buffer index `buf` lies in
    (None: not registered); `fixed_file`: `fd` is an index into the ring's registered files;
    `latencies`: keep each op's submit-to-completion time; `what`: names the file in errors
    (default: the fd)."""

    write: bool = False
    retry_short: bool = True
    fixed_buffer: int | None = None
    fixed_file: bool = False
    latencies: bool = False
    what: str | None = None


class _Ops:
    """One batch described for C (`struct xh_batch`), holding every buffer it points into
    until release(): the kernel may write into them until the batch completes."""

    def __init__(
        self,
        fd: int,
        offsets,
        length: int,
        buf,
        opts: OpOptions,
        *,
        only: Sequence[int] | None = None,
        slots: int = 0,
    ):
        offs = as_offsets(offsets)
        mem = memoryview(buf)
        if mem.nbytes < (slots or len(offs)) * length:
            need = f"{slots} slots" if slots else f"{len(offs)} ops"
            raise ValueError(
                f"buffer holds {mem.nbytes} bytes, {need} of {length} "
                f"need {(slots or len(offs)) * length}"
            )
        if only is not None:
            offs = array("Q", (offs[i] for i in only))
        n = len(offs)
        self.offsets, self.length, self.what = offs, length, opts.what or f"fd {fd}"
        self.res = array("q", bytes(8 * n))
        self.lat = array("I", bytes(4 * n)) if opts.latencies else None
        b = self.b = ffi.new("struct xh_batch *")
        b.n, b.opcode, b.len, b.stride, b.fd = (
            n,
            lib.XH_OP_WRITE if opts.write else lib.XH_OP_READ,
            length,
            length,
            fd,
        )
        b.retry_short, b.fixed_file = int(opts.retry_short), int(opts.fixed_file)
        b.buf_index = -1 if opts.fixed_buffer is None else opts.fixed_buffer
        base = ffi.from_buffer(mem, require_writable=not opts.write)
        self._held = [base, ffi.from_buffer(offs), ffi.from_buffer(self.res)]
        b.base, b.offsets, b.res = (
            base,
            ffi.cast("uint64_t *", self._held[1]),
            ffi.cast("int64_t *", self._held[2]),
        )
        if only is not None:
            self._bufs = ffi.new("char *[]", [ffi.cast("char *", base) + i * length for i in only])
            b.bufs = self._bufs
        if self.lat is not None:
            self._held.append(ffi.from_buffer(self.lat))
            b.lat_ns = ffi.cast("uint32_t *", self._held[-1])

    def result(self) -> BatchResult:
        """The results, with every buffer released to its owner."""
        for held in self._held:
            ffi.release(held)
        self._held = []
        return BatchResult(self.res, self.lat, self.offsets, self.length, self.what)


def rw_batch(
    ring: Ring,
    fd: int,
    offsets: Sequence[int] | array,
    length: int,
    buf,
    *,
    depth: int | None = None,
    only: Sequence[int] | None = None,
    **options,
) -> BatchResult:
    """Op i transfers `length` bytes at offsets[i] to/from buf[i*length:(i+1)*length].

    `buf` is anything with a writable buffer (AlignedBuffer.view, bytearray, mmap) of at least
    len(offsets) * length bytes; `depth` caps the ops in flight (default: the ring's entries).
    Short transfers are resubmitted for the rest unless `retry_short` is False (O_DIRECT at
    EOF); a zero-byte completion is EOF and ends that op. `only` runs just those op indexes
    (same offsets and buffer slots; the result has one entry per index in `only`).
    The other keyword `options` are OpOptions' (write, retry_short, fixed_buffer,
    fixed_file, latencies, what).
    """
    ops = _Ops(fd, offsets, length, buf, OpOptions(**options), only=only)
    ops.b.depth = _depth(ring, depth)
    try:
        err = lib.xh_rw_batch(ring._ring, ops.b)
    finally:
        result = ops.result()
    if err < 0:
        raise UringError.from_res(err, "io_uring_enter (batch)")
    return result


def _depth(ring: Ring, depth: int | None) -> int:
    return max(1, min(depth or ring.entries, ring.entries))


_STREAM_DEFAULT = object()


class RwStream:
    """Successive batches through one C loop that keeps `depth` ops in flight across them,
    so a long run drains only at finish().

    feed(offsets, buf) queues a batch (the arguments of rw_batch) and returns the previous
    batch's BatchResult once that one is complete (None for the first): from then on its
    buffer is the caller's again, while this batch's buffer belongs to the kernel until the
    next feed() or finish() returns it. Alternating two buffers keeps the queue full.
    `submit_batch` N > 0 hands ops to the kernel every N prepared (fio's iodepth_batch_submit;
    1 suits a disk, which then sees a steady trickle rather than bursts of `depth`); 0 hands
    over everything prepared at once, at the wait (the page cache, where a read completes
    inside the submission).
    `slots` N > 0 makes a sink stream, for reads whose bytes are not kept (a benchmark, a
    device scrub, cache warming; fio's model): `buf` holds N slots of `length` (N >= depth),
    each op in flight gets a slot of its own, reused once it completes; results and latencies
    stay per op, the data does not, and every batch may pass the same `buf`.
    `min_inflight` is the fewest ops in flight at any wait for completions before the final
    drain (equal to `depth` when the queue never ran short), `waits` the number of waits.
    The other keyword `options` are OpOptions', as for rw_batch.
    """

    def __init__(
        self,
        ring: Ring,
        fd: int,
        length: int,
        *,
        depth: int | None = None,
        submit_batch: int = 0,
        slots: int = 0,
        **options,
    ):
        self.ring, self.fd, self.length, self._slots = ring, fd, length, slots
        self._opts = OpOptions(**options)
        self._s = ffi.new("struct xh_stream *")
        lib.xh_stream_init(self._s, _depth(ring, depth))
        self._s.submit_batch = max(0, submit_batch)
        if slots:
            self._free_slots = ffi.new("uint32_t[]", slots)
            if lib.xh_stream_sink(self._s, slots, self._free_slots) < 0:
                raise ValueError(
                    f"slots must be from depth ({self._s.depth}) to 65535, not {slots}"
                )
        self._live: deque[_Ops] = deque()
        self._failed: UringError | None = None

    @property
    def depth(self) -> int:
        return self._s.depth

    @property
    def min_inflight(self) -> int | None:
        return None if self._s.min_inflight == 0xFFFFFFFF else self._s.min_inflight

    @property
    def waits(self) -> int:
        return self._s.waits

    @property
    def ops(self) -> int:
        """Ops completed so far."""
        return self._s.ops

    def feed(
        self,
        offsets: Sequence[int] | array,
        buf,
        *,
        fixed_buffer: int | None | object = _STREAM_DEFAULT,
    ) -> BatchResult | None:
        """`fixed_buffer` (an index, or None for none) overrides the stream's for this batch."""
        opts = (
            self._opts
            if fixed_buffer is _STREAM_DEFAULT
            else replace(self._opts, fixed_buffer=fixed_buffer)
        )
        ops = _Ops(self.fd, offsets, self.length, buf, opts, slots=self._slots)
        return self._run(ops, drain=False)

    def finish(self) -> BatchResult | None:
        """Wait for everything in flight; the last batch's result (None if there is none)."""
        return self._run(None, drain=True)

    def _run(self, ops: _Ops | None, drain: bool) -> BatchResult | None:
        if self._failed is not None:
            raise self._failed
        before = self._s.inflight
        err = lib.xh_stream_run(
            self.ring._ring, self._s, ffi.NULL if ops is None else ops.b, int(drain)
        )
        if err < 0 and self._s.err == 0:  # the batch was refused before anything ran
            ops.result()
            raise (
                MemoryError("RwStream: no memory for the batch")
                if err == -_errno.ENOMEM
                else RuntimeError(errno_reason(err, "RwStream: batch refused"))
            )
        if ops is not None:
            self._live.append(ops)
        self.ring.pending += self._s.inflight - before
        if err < 0:  # io_uring_enter refused; everything in flight is back
            for live in self._live:
                live.result()
            self._live.clear()
            self._failed = UringError.from_res(err, "io_uring_enter (stream)")
            raise self._failed
        keep = 0 if drain else 1
        done = [self._live.popleft().result() for _ in range(len(self._live) - keep)]
        return done[-1] if done else None

    def __enter__(self) -> RwStream:
        return self

    def __exit__(self, *exc) -> None:
        if self._failed is None:
            self.finish()


def read_batch(ring: Ring, fd: int, offsets, length: int, buf, **kw) -> BatchResult:
    return rw_batch(ring, fd, offsets, length, buf, write=False, **kw)


def write_batch(ring: Ring, fd: int, offsets, length: int, buf, **kw) -> BatchResult:
    return rw_batch(ring, fd, offsets, length, buf, write=True, **kw)


def read_many(
    path: str, offsets: Sequence[int], length: int, *, ring: Ring | None = None
) -> list[bytes]:
    """Convenience: the bytes at each offset of `path` (short at EOF); errors raise with the
    path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    own = ring is None
    ring = ring or Ring(64)
    try:
        buf = bytearray(len(offsets) * length)
        result = read_batch(ring, fd, offsets, length, buf, what=path).check()
        return [bytes(buf[i * length : i * length + r]) for i, r in enumerate(result.res)]
    finally:
        os.close(fd)
        if own:
            ring.close()
