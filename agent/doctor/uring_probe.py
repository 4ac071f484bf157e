"""io_uring: ring setup, SQPOLL, registered buffers and files, O_DIRECT, supported ops.

Every item does the real thing against a scratch file whose bytes are known, and checks
the bytes that come back.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import errno_reason
from ..io import Ring, UringError, aligned_buffer, supported_ops
from .report import Item, fail, ok

BLOCK = 4096
# The operations the agent's I/O engine is built on.
NEEDED_OPS = ("READ", "WRITE", "READV", "WRITEV", "READ_FIXED", "OPENAT", "CLOSE", "STATX", "NOP")


@contextmanager
def scratch_file(size: int = BLOCK) -> Iterator[tuple[str, bytes]]:
    """A file of `size` known bytes on the filesystem of the temp dir (not page-cache only)."""
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    fd, path = tempfile.mkstemp(prefix="xhagent-doctor-", dir=os.environ.get("XHAGENT_SCRATCH_DIR"))
    try:
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        yield path, data
    finally:
        os.unlink(path)


def _try(name: str, fn) -> Item:
    try:
        return fn()
    except UringError as exc:
        return fail(name, errno_reason(exc, exc.filename or "io_uring"))
    except OSError as exc:
        return fail(name, errno_reason(exc, f"{exc.filename or 'os'}"))


def _check_ring() -> Item:
    with Ring(8) as ring:
        res = ring.nop()
        return ok("io_uring", entries=ring.entries, features=hex(ring.features), nop=res)


def _check_sqpoll() -> Item:
    with Ring(8, ("sqpoll",), sq_thread_idle_ms=10) as ring, scratch_file() as (path, data):
        fd = os.open(path, os.O_RDONLY)
        try:
            with aligned_buffer(BLOCK) as buf:
                n = ring.read_into(fd, buf, 0, what=f"sqpoll read {path}")
                if bytes(buf[:n]) != data:
                    return fail("io_uring.sqpoll", "SQPOLL read returned wrong bytes")
        finally:
            os.close(fd)
        return ok("io_uring.sqpoll", bytes=n)


def _check_registered(fixed_buffer: bool) -> Item:
    name = "io_uring.registered_buffers" if fixed_buffer else "io_uring.registered_files"
    with Ring(8) as ring, scratch_file() as (path, data), aligned_buffer(BLOCK) as buf:
        fd = os.open(path, os.O_RDONLY)
        try:
            if fixed_buffer:
                ring.register_buffers([buf])
                n = ring.read_into(fd, buf, 0, fixed_index=0, what=f"read_fixed {path}")
            else:
                ring.register_files([fd])
                n = ring.read_into(0, buf, 0, fixed_file=True, what=f"fixed-file read {path}")
        finally:
            os.close(fd)
        if bytes(buf[:n]) != data:
            return fail(name, "read through the registration returned wrong bytes")
        return ok(name, bytes=n)


def _check_direct() -> Item:
    with Ring(8) as ring, scratch_file() as (path, data), aligned_buffer(BLOCK) as buf:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n = ring.read_into(fd, buf, 0, what=f"O_DIRECT read {path}")
        finally:
            os.close(fd)
        if bytes(buf[:n]) != data:
            return fail("io_uring.o_direct", "O_DIRECT read returned wrong bytes")
        return ok("io_uring.o_direct", bytes=n, dir=os.path.dirname(path))


def _check_ops() -> Item:
    ops = supported_ops()
    lacking = [op for op in NEEDED_OPS if op not in ops]
    if lacking:
        return fail("io_uring.ops", "kernel lacks " + ", ".join(lacking), supported=len(ops))
    return ok("io_uring.ops", supported=len(ops), ops=ops)


def probe() -> list[Item]:
    first = _try("io_uring", _check_ring)
    if not first.ok:
        # Without a ring nothing else can be tried; say so once per item.
        rest = (
            "io_uring.sqpoll",
            "io_uring.registered_buffers",
            "io_uring.registered_files",
            "io_uring.o_direct",
            "io_uring.ops",
        )
        return [first, *(fail(n, "no io_uring ring: " + first.reason) for n in rest)]
    return [
        first,
        _try("io_uring.sqpoll", _check_sqpoll),
        _try("io_uring.registered_buffers", lambda: _check_registered(True)),
        _try("io_uring.registered_files", lambda: _check_registered(False)),
        _try("io_uring.o_direct", _check_direct),
        _try("io_uring.ops", _check_ops),
    ]
