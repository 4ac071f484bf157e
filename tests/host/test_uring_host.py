"""The liburing binding against this kernel: reads, registrations, errors with errno."""

import errno
import os

import pytest

from xhagent.io import Ring, UringError, aligned_buffer, supported_ops

pytestmark = pytest.mark.host


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data"
    data = os.urandom(3 * 4096)
    path.write_bytes(data)
    return str(path), data


def test_read_at_offsets_and_short_read_at_eof(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        with Ring(16) as ring, aligned_buffer(8192) as buf:
            assert ring.read_into(fd, buf, 4096) == 8192
            assert bytes(buf) == data[4096:]
            assert ring.read_into(fd, buf, 2 * 4096) == 4096  # short read at EOF
            assert bytes(buf[:4096]) == data[8192:]
            assert ring.read_into(fd, buf, len(data)) == 0
    finally:
        os.close(fd)


def test_fixed_buffers_and_files(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        with Ring(8) as ring, aligned_buffer(4096) as a, aligned_buffer(4096) as b:
            ring.register_buffers([a, b])
            ring.register_files([fd])
            assert ring.read_into(0, b, 4096, fixed_index=1, fixed_file=True) == 4096
            assert bytes(b) == data[4096:8192] and bytes(a) == bytes(4096)
            ring.unregister_files()
            ring.unregister_buffers()
    finally:
        os.close(fd)


def test_completion_error_carries_errno_and_what():
    with Ring(4) as ring, aligned_buffer(4096) as buf:
        r, w = os.pipe()
        os.close(r)
        os.close(w)
        with pytest.raises(UringError) as info:
            ring.read_into(r, buf, 0, what="read closed fd")
    assert info.value.errno == errno.EBADF and info.value.filename == "read closed fd"


def test_many_sqes_beyond_ring_size_complete(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        with Ring(4) as ring, aligned_buffer(4096) as buf:
            from xhagent.io.ring import ffi, lib

            ptr = ffi.cast("void *", ffi.from_buffer(buf))
            for i in range(10):  # more than the 4 entries: sqe() flushes when full
                sqe = ring.sqe()
                lib.io_uring_prep_read(sqe, fd, ptr, 16, i)
                lib.io_uring_sqe_set_data64(sqe, i)
            done = ring.run(10)  # more completions than the 8-entry CQ holds at once
            assert sorted(u for u, _ in done) == list(range(10))
            assert all(res == 16 for _, res in done)
    finally:
        os.close(fd)


def test_unknown_setup_flag_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown io_uring setup flag 'sqpol'"):
        Ring(4, ("sqpol",))


def test_probe_lists_basic_ops():
    ops = supported_ops()
    assert {"NOP", "READ", "WRITE", "OPENAT", "CLOSE"} <= set(ops)
