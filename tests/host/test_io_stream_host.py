"""RwStream on this kernel: successive batches through one C loop that keeps the queue full
across them (a counter from C: the fewest ops in flight at any wait before the final drain),
every byte checked against the file, writes, EOF, errors per op, latencies."""
import errno
import os
import random

import pytest

from xhagent.io import RwStream, Ring, read_batch
from xhagent.io.buffers import AlignedBuffer

pytestmark = pytest.mark.host
BLOCK = 4096


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "data"
    data = random.Random(11).randbytes(4 << 20)
    path.write_bytes(data)
    return str(path), data


@pytest.fixture
def fd(data_file):
    fd = os.open(data_file[0], os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def _check(result, buf, data):
    assert list(result.res) == [BLOCK] * len(result.offsets)
    for i, o in enumerate(result.offsets):
        assert buf[i * BLOCK:(i + 1) * BLOCK] == data[o:o + BLOCK], f"op {i} at {o}"


def test_stream_keeps_the_queue_full_across_batches_and_every_byte_is_right(data_file, fd):
    path, data = data_file
    rng = random.Random(2)
    halves = [bytearray(128 * BLOCK), bytearray(128 * BLOCK)]
    batches = [[rng.randrange(len(data) - BLOCK) for _ in range(128)] for _ in range(64)]  # unaligned too
    checked = 0
    with Ring(64) as ring:
        stream = RwStream(ring, fd, BLOCK, depth=32, latencies=True, what=path)
        for k, offsets in enumerate(batches):
            done = stream.feed(offsets, halves[k % 2])
            assert (done is None) == (k == 0)
            if done is not None:  # the previous batch, in the other half
                assert list(done.offsets) == batches[k - 1]
                _check(done, halves[(k - 1) % 2], data)
                assert all(0 < ns < 10**10 for ns in done.lat_ns)
                checked += 1
            assert ring.pending == stream.depth  # refilled and in the kernel between calls
        last = stream.finish()
        _check(last, halves[(len(batches) - 1) % 2], data)
        assert ring.pending == 0 and stream.finish() is None
    assert checked + 1 == len(batches) and stream.ops == 64 * 128
    assert stream.min_inflight == 32 and stream.waits > 0


def test_batches_smaller_than_the_depth_leave_the_queue_short_and_the_counter_says_so(data_file, fd):
    data = data_file[1]
    bufs = [bytearray(8 * BLOCK), bytearray(8 * BLOCK)]
    with Ring(64) as ring, RwStream(ring, fd, BLOCK, depth=32) as stream:
        for k in range(20):
            done = stream.feed([(k * 8 + i) * BLOCK for i in range(8)], bufs[k % 2])
            if done is not None:
                _check(done, bufs[(k - 1) % 2], data)
    assert 0 < stream.min_inflight <= 16


def test_the_batch_api_is_the_same_loop_and_still_checks_every_op(data_file, fd):
    data = data_file[1]
    offsets = [o * BLOCK for o in random.Random(4).sample(range(1024), 300)]
    buf = bytearray(300 * BLOCK)
    with Ring(16) as ring:
        _check(read_batch(ring, fd, offsets, BLOCK, buf, depth=16).check(), buf, data)


def test_stream_writes_then_reads_back(tmp_path):
    fd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    data = os.urandom(512 * BLOCK)
    try:
        with Ring(32) as ring:
            with RwStream(ring, fd, BLOCK, write=True, depth=16) as stream:
                for k in range(8):  # each batch writes 64 blocks from its own slice of `data`
                    offsets = [(k * 64 + i) * BLOCK for i in range(64)]
                    done = stream.feed(offsets, memoryview(data)[k * 64 * BLOCK:(k + 1) * 64 * BLOCK])
                    assert done is None or list(done.check().res) == [BLOCK] * 64
            assert stream.ops == 512
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)


def test_stream_eof_short_reads_and_per_op_errors(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 5000)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with Ring(8) as ring:
            stream = RwStream(ring, fd, BLOCK, depth=4)
            assert stream.feed([0, 4096, 8192], bytearray(3 * BLOCK)) is None
            first = stream.finish()
            assert list(first.res) == [4096, 904, 0] and first.short() == [1, 2]
            bad = RwStream(ring, 1 << 30, BLOCK, depth=4, what="/some/file")  # EBADF, per op
            bad.feed([0, 4096], bytearray(2 * BLOCK))
            result = bad.finish()
            assert list(result.res) == [-errno.EBADF] * 2
            assert result.errors()[0].filename == "/some/file @ 0"
    finally:
        os.close(fd)


def test_stream_with_registered_file_and_buffer(data_file, fd):
    data = data_file[1]
    with Ring(32) as ring, AlignedBuffer(64 * BLOCK) as buf:
        ring.register_files([fd])
        ring.register_buffers([buf.view])
        halves = [buf.view[:32 * BLOCK], buf.view[32 * BLOCK:]]
        stream = RwStream(ring, 0, BLOCK, depth=8, fixed_file=True, fixed_buffer=0)
        for k in range(10):
            done = stream.feed([((k * 32 + i) % 1024) * BLOCK for i in range(32)], halves[k % 2])
            if done is not None:
                _check(done, halves[(k - 1) % 2], data)
        _check(stream.finish(), halves[1], data)
        assert stream.min_inflight == 8
