"""Batches of reads and writes: Python describes them as arrays, C (`xh_rw_batch`) keeps the
ring full, reaps in bulk and resubmits short transfers; Python sees one result per op."""
from __future__ import annotations

import os
from array import array
from dataclasses import dataclass
from typing import Sequence

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
        return [UringError.from_res(r, f"{self.what} @ {self.offsets[i]}")
                for i, r in enumerate(self.res) if r < 0]

    def check(self) -> "BatchResult":
        """Raise the first failed op as an UringError naming the file and offset."""
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


def rw_batch(ring: Ring, fd: int, offsets: Sequence[int] | array, length: int, buf, *, write: bool = False,
             depth: int | None = None, retry_short: bool = True, fixed_buffer: int | None = None,
             fixed_file: bool = False, latencies: bool = False, what: str | None = None,
             only: Sequence[int] | None = None) -> BatchResult:
    """Op i transfers `length` bytes at offsets[i] to/from buf[i*length:(i+1)*length].

    `buf` is anything with a writable buffer (AlignedBuffer.view, bytearray, mmap) of at least
    len(offsets) * length bytes; `depth` caps the ops in flight (default: the ring's entries).
    Short transfers are resubmitted for the rest unless `retry_short` is False (O_DIRECT at
    EOF); a zero-byte completion is EOF and ends that op. `only` runs just those op indexes
    (same offsets and buffer slots; the result has one entry per index in `only`).
    """
    offs = as_offsets(offsets)
    mem = memoryview(buf)
    if mem.nbytes < len(offs) * length:
        raise ValueError(f"buffer holds {mem.nbytes} bytes, {len(offs)} ops of {length} need {len(offs) * length}")
    if only is not None:
        offs = array("Q", (offs[i] for i in only))
    n = len(offs)
    res = array("q", bytes(8 * n))
    lat = array("I", bytes(4 * n)) if latencies else None
    b = ffi.new("struct xh_batch *")
    b.n, b.opcode, b.len, b.stride, b.fd = n, lib.XH_OP_WRITE if write else lib.XH_OP_READ, length, length, fd
    b.depth = max(1, min(depth or ring.entries, ring.entries))
    b.retry_short, b.fixed_file = int(retry_short), int(fixed_file)
    b.buf_index = -1 if fixed_buffer is None else fixed_buffer
    with ffi.from_buffer(mem, require_writable=not write) as base, ffi.from_buffer(offs) as po, \
            ffi.from_buffer(res) as pr:
        b.base, b.offsets, b.res = base, ffi.cast("uint64_t *", po), ffi.cast("int64_t *", pr)
        if only is not None:
            bufs = ffi.new("char *[]", [ffi.cast("char *", base) + i * length for i in only])
            b.bufs = bufs
        if lat is not None:
            keep = ffi.from_buffer(lat)
            b.lat_ns = ffi.cast("uint32_t *", keep)
        err = lib.xh_rw_batch(ring._ring, b)
    if err < 0:
        raise UringError.from_res(err, "io_uring_enter (batch)")
    return BatchResult(res, lat, offs, length, what or f"fd {fd}")


def read_batch(ring: Ring, fd: int, offsets, length: int, buf, **kw) -> BatchResult:
    return rw_batch(ring, fd, offsets, length, buf, write=False, **kw)


def write_batch(ring: Ring, fd: int, offsets, length: int, buf, **kw) -> BatchResult:
    return rw_batch(ring, fd, offsets, length, buf, write=True, **kw)


def read_many(path: str, offsets: Sequence[int], length: int, *, ring: Ring | None = None) -> list[bytes]:
    """Convenience: the bytes at each offset of `path` (short at EOF); errors raise with the path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    own = ring is None
    ring = ring or Ring(64)
    try:
        buf = bytearray(len(offsets) * length)
        result = read_batch(ring, fd, offsets, length, buf, what=path).check()
        return [bytes(buf[i * length:i * length + r]) for i, r in enumerate(result.res)]
    finally:
        os.close(fd)
        if own:
            ring.close()
