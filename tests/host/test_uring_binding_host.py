"""The raw `xhagent._uring` calls the engine is built on, each against this kernel."""

import os
import select
import stat

import pytest

from xhagent.io import Ring, aligned_buffer
from xhagent.io.ring import ffi, lib

pytestmark = pytest.mark.host


def test_linked_openat_read_close_through_a_fixed_slot(tmp_path):
    path = tmp_path / "cgroup.procs"
    path.write_bytes(b"1\n42\n")
    with Ring(8) as ring, aligned_buffer(4096) as buf:
        ring.register_files([-1])  # one empty slot for the opened file
        cpath = ffi.new("char[]", os.fsencode(path))
        with ffi.from_buffer(buf) as ptr:
            sqe = ring.sqe()
            lib.io_uring_prep_openat_direct(sqe, lib.AT_FDCWD, cpath, lib.O_RDONLY, 0, 0)
            lib.io_uring_sqe_set_flags(sqe, lib.IOSQE_IO_LINK)
            lib.io_uring_sqe_set_data64(sqe, 1)
            sqe = ring.sqe()
            lib.io_uring_prep_read(sqe, 0, ptr, len(buf), 0)
            # A short read (the file is smaller than the buffer) breaks a plain link and
            # cancels the close; a hard link keeps the chain going.
            lib.io_uring_sqe_set_flags(sqe, lib.IOSQE_IO_HARDLINK | lib.IOSQE_FIXED_FILE)
            lib.io_uring_sqe_set_data64(sqe, 2)
            sqe = ring.sqe()
            lib.io_uring_prep_close_direct(sqe, 0)
            lib.io_uring_sqe_set_data64(sqe, 3)
            done = dict(ring.run(3))
    assert done == {1: 0, 2: 5, 3: 0}


def test_statx(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1234)
    out = ffi.new("struct statx *")
    with Ring(4) as ring:
        lib.io_uring_prep_statx(
            ring.sqe(),
            lib.AT_FDCWD,
            ffi.new("char[]", os.fsencode(path)),
            0,
            lib.STATX_BASIC_STATS,
            out,
        )
        assert ring.run(1)[0][1] == 0
    assert out.stx_size == 1234 and stat.S_ISREG(out.stx_mode)


def test_writev_then_readv(tmp_path):
    fd = os.open(tmp_path / "v", os.O_RDWR | os.O_CREAT, 0o600)
    parts = [b"alpha-", b"beta-", b"gamma"]
    try:
        with Ring(4) as ring:
            keep = [ffi.from_buffer(p) for p in parts]
            iov = ffi.new("struct iovec[]", len(parts))
            for i, p in enumerate(parts):
                iov[i].iov_base, iov[i].iov_len = keep[i], len(p)
            lib.io_uring_prep_writev(ring.sqe(), fd, iov, len(parts), 0)
            assert ring.run(1)[0][1] == 16
            back = [bytearray(6), bytearray(10)]
            keep = [ffi.from_buffer(b) for b in back]
            iov = ffi.new("struct iovec[]", 2)
            for i, b in enumerate(back):
                iov[i].iov_base, iov[i].iov_len = keep[i], len(b)
            lib.io_uring_prep_readv(ring.sqe(), fd, iov, 2, 0)
            assert ring.run(1)[0][1] == 16
        assert bytes(back[0]) + bytes(back[1]) == b"alpha-beta-gamma"
    finally:
        os.close(fd)


def test_eventfd_signals_completions_and_peek():
    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        with Ring(4) as ring:
            ring.register_eventfd(efd)
            cqe = ffi.new("struct io_uring_cqe **")
            assert lib.io_uring_peek_cqe(ring._ring, cqe) == -11  # -EAGAIN: nothing yet
            lib.io_uring_prep_nop(ring.sqe())
            lib.io_uring_submit(ring._ring)
            assert select.select([efd], [], [], 2.0)[0] == [efd]
            assert os.eventfd_read(efd) >= 1
            assert lib.io_uring_wait_cqe(ring._ring, cqe) == 0
            assert cqe[0].res == 0
            lib.io_uring_cqe_seen(ring._ring, cqe[0])
            lib.io_uring_unregister_eventfd(ring._ring)
    finally:
        os.close(efd)
