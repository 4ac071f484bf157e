"""Batches on this kernel: every byte checked, more ops than entries, writes, registered
files and buffers, SQPOLL, EOF and short reads, errors with errno and path, close in flight.
Streams (RwStream): successive batches through one C loop that keeps the queue full across
them (a counter from C: the fewest ops in flight at any wait before the final drain)."""

import errno
import os
import random
from array import array

import pytest

from xhagent.io import (
    AlignedBuffer,
    BufferPool,
    Ring,
    RwStream,
    UringError,
    read_batch,
    read_many,
    write_batch,
)
from xhagent.io.ring import ffi

pytestmark = pytest.mark.host
BLOCK = 4096


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("io") / "data"
    data = random.Random(7).randbytes(4 << 20)
    path.write_bytes(data)
    return str(path), data


@pytest.fixture
def fd(data_file):
    fd = os.open(data_file[0], os.O_RDONLY)
    yield fd
    os.close(fd)


def test_stress_more_ops_than_entries_thousands_in_flight(data_file, fd):
    path, data = data_file
    rng = random.Random(1)
    offsets = [rng.randrange(len(data) - BLOCK) for _ in range(20000)]  # unaligned too
    buf = bytearray(len(offsets) * BLOCK)
    with Ring(2048) as ring:
        result = read_batch(
            ring, fd, offsets, BLOCK, buf, depth=2048, latencies=True, what=path
        ).check()
        assert ring.pending == 0
    assert list(result.res) == [BLOCK] * len(offsets)
    view = memoryview(buf)
    for i, o in enumerate(offsets):
        assert view[i * BLOCK : (i + 1) * BLOCK] == data[o : o + BLOCK], f"op {i} at {o}"
    assert all(0 < ns < 10**10 for ns in result.lat_ns)


@pytest.mark.parametrize("flags", [(), ("sqpoll",), ("single_issuer",)])
def test_setup_flags_read_correctly(data_file, fd, flags):
    path, data = data_file
    offsets = [i * BLOCK for i in range(64)]
    buf = bytearray(64 * BLOCK)
    kw = {"sq_thread_idle_ms": 50} if "sqpoll" in flags else {}
    with Ring(16, flags, **kw) as ring:
        read_batch(ring, fd, offsets, BLOCK, buf).check()
    assert bytes(buf) == data[: 64 * BLOCK]


def test_sqpoll_pinned_to_a_cpu(data_file, fd):
    cpu = sorted(os.sched_getaffinity(0))[0]
    with Ring(8, ("sqpoll",), sq_thread_cpu=cpu, sq_thread_idle_ms=50) as ring:
        buf = bytearray(BLOCK)
        read_batch(ring, fd, [BLOCK], BLOCK, buf).check()
    assert bytes(buf) == data_file[1][BLOCK : 2 * BLOCK]


def test_eof_and_short_reads(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 5000)
    fd = os.open(path, os.O_RDONLY)
    try:
        with Ring(8) as ring:
            result = read_batch(ring, fd, [0, 4096, 8192], BLOCK, bytearray(3 * BLOCK))
        assert list(result.res) == [4096, 904, 0] and result.short() == [1, 2]
    finally:
        os.close(fd)
    assert read_many(str(path), [4000, 6000], 2000) == [b"x" * 1000, b""]


def test_short_reads_from_a_pipe_are_resubmitted_until_full():
    r, w = os.pipe()
    try:
        os.write(w, b"a" * 3000)  # a pipe read returns what is there: 3000 of 4096
        with Ring(4) as ring:
            import threading

            threading.Timer(0.2, os.write, (w, b"b" * 1096)).start()
            buf = bytearray(BLOCK)
            result = read_batch(ring, r, [0], BLOCK, buf)  # pipes ignore the offset (-1 too)
        assert list(result.res) == [BLOCK] and bytes(buf) == b"a" * 3000 + b"b" * 1096
    finally:
        os.close(r)
        os.close(w)


def test_write_batch_then_read_back(tmp_path):
    fd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT, 0o600)
    data = os.urandom(256 * BLOCK)
    try:
        with Ring(32) as ring:
            offsets = list(range(255 * BLOCK, -1, -BLOCK))
            src = b"".join(data[o : o + BLOCK] for o in offsets)
            assert list(write_batch(ring, fd, offsets, BLOCK, src).check().res) == [BLOCK] * 256
            back = bytearray(len(data))
            read_batch(ring, fd, range(0, len(data), BLOCK), BLOCK, back).check()
        assert bytes(back) == data
    finally:
        os.close(fd)


def test_registered_files_and_pool_as_fixed_buffers(data_file, fd):
    data = data_file[1]
    with Ring(16) as ring, BufferPool(4, BLOCK) as pool:
        pool.register(ring)
        ring.register_files([fd])
        index, view = pool.acquire()
        index2, view2 = pool.acquire()
        read_batch(ring, 0, [8 * BLOCK], BLOCK, view2, fixed_file=True, fixed_buffer=index2).check()
        assert bytes(view2) == data[8 * BLOCK : 9 * BLOCK] and bytes(view) == bytes(BLOCK)
        pool.release(index)
        with pytest.raises(ValueError):
            pool.release(index)


def test_errors_carry_errno_path_and_offset(tmp_path):
    bad_fd = 1 << 30  # beyond any fd table: EBADF (a closed fd's number may be reused)
    with Ring(4) as ring:
        result = read_batch(ring, bad_fd, [0, 4096], BLOCK, bytearray(2 * BLOCK), what="/some/file")
        assert list(result.res) == [-errno.EBADF] * 2
        with pytest.raises(UringError) as info:
            result.check()
    assert info.value.errno == errno.EBADF and info.value.filename == "/some/file @ offset 0"
    with pytest.raises(ValueError, match="buffer holds"):
        read_batch(Ring(4), 0, [0, 1], BLOCK, bytearray(BLOCK))


def test_close_with_io_in_flight_cancels_and_waits():
    r, w = os.pipe()
    try:
        ring = Ring(8)
        buf = bytearray(64)
        ptr = ffi.from_buffer(buf)
        for i in range(3):  # reads of an empty pipe: in flight until cancelled
            assert ring.prep_rw(False, r, ptr, 64, 0, i)
        ring.submit()
        assert ring.pending == 3
        done = ring.cancel_all()
        assert sorted(u for u, _ in done) == [0, 1, 2]
        assert all(res == -errno.ECANCELED for _, res in done)
        assert ring.prep_rw(False, r, ptr, 64, 0, 9)
        ring.submit()
        ring.close()  # the same, from close()
        assert ring.closed and ring.pending == 0
    finally:
        os.close(r)
        os.close(w)


def test_offsets_array_used_as_is(data_file, fd):
    offsets = array("Q", [0, BLOCK])
    buf = bytearray(2 * BLOCK)
    with Ring(4) as ring:
        result = read_batch(ring, fd, offsets, BLOCK, buf)
    assert result.offsets is offsets and bytes(buf) == data_file[1][: 2 * BLOCK]


# -- streams ----------------------------------------------------------------------------------
def _check(result, buf, data):
    assert list(result.res) == [BLOCK] * len(result.offsets)
    for i, o in enumerate(result.offsets):
        assert buf[i * BLOCK : (i + 1) * BLOCK] == data[o : o + BLOCK], f"op {i} at {o}"


def test_stream_keeps_the_queue_full_across_batches_and_every_byte_is_right(data_file, fd):
    path, data = data_file
    rng = random.Random(2)
    halves = [bytearray(128 * BLOCK), bytearray(128 * BLOCK)]
    batches = [
        [rng.randrange(len(data) - BLOCK) for _ in range(128)] for _ in range(64)
    ]  # unaligned too
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


def test_batches_smaller_than_the_depth_leave_the_queue_short_and_the_counter_says_so(
    data_file, fd
):
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
                    done = stream.feed(
                        offsets, memoryview(data)[k * 64 * BLOCK : (k + 1) * 64 * BLOCK]
                    )
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


def test_empty_batches_in_a_stream_complete_at_once(data_file, fd):
    with Ring(8) as ring:
        stream = RwStream(ring, fd, BLOCK, depth=4)
        assert stream.feed([], bytearray()) is None
        assert list(stream.feed([], bytearray()).res) == []
        assert list(stream.feed([0], bytearray(BLOCK)).res) == []
        assert list(stream.finish().res) == [BLOCK] and ring.pending == 0


def test_stream_with_registered_file_and_buffer(data_file, fd):
    data = data_file[1]
    with Ring(32) as ring, AlignedBuffer(64 * BLOCK) as buf:
        ring.register_files([fd])
        ring.register_buffers([buf.view])
        halves = [buf.view[: 32 * BLOCK], buf.view[32 * BLOCK :]]
        stream = RwStream(ring, 0, BLOCK, depth=8, fixed_file=True, fixed_buffer=0)
        for k in range(10):
            done = stream.feed([((k * 32 + i) % 1024) * BLOCK for i in range(32)], halves[k % 2])
            if done is not None:
                _check(done, halves[(k - 1) % 2], data)
        _check(stream.finish(), halves[1], data)
        assert stream.min_inflight == 8


def _pattern_file(tmp_path, blocks: int) -> str:
    """Block k holds k + 1, eight bytes at a time: a slot names the block it holds (0: unused)."""
    path = tmp_path / "pattern"
    path.write_bytes(b"".join((k + 1).to_bytes(8, "little") * (BLOCK // 8) for k in range(blocks)))
    return str(path)


def test_sink_stream_gives_each_op_in_flight_a_slot_of_its_own(tmp_path):
    path = _pattern_file(tmp_path, 1024)
    rng = random.Random(12)
    batches = [[rng.randrange(1024) * BLOCK for _ in range(1000)] for _ in range(20)]
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with Ring(64) as ring, AlignedBuffer(40 * BLOCK) as slots:
            stream = RwStream(ring, fd, BLOCK, depth=32, slots=40)
            for offsets in batches:  # every batch passes the same 40 slots
                done = stream.feed(offsets, slots.view)
                assert done is None or list(done.res) == [BLOCK] * 1000
            assert list(stream.finish().res) == [BLOCK] * 1000
            read, used = {o // BLOCK + 1 for o in batches[-1]}, 0
            for k in range(40):  # a used slot holds one whole block, last read by the last batch
                block = slots.view[k * BLOCK : (k + 1) * BLOCK]
                number = int.from_bytes(block[:8], "little")
                assert block == number.to_bytes(8, "little") * (BLOCK // 8) and (
                    number in read or number == 0
                )
                used += number != 0
            assert used >= 32  # a slot for each op in flight
        assert stream.ops == 20 * 1000 and stream.min_inflight == 32
    finally:
        os.close(fd)


def test_sink_slots_are_not_shared_by_ops_in_flight():
    """Four reads of an empty pipe wait in flight at once; four distinct chunks then arrive:
    had two of them shared a slot, a chunk would be missing from the slots."""
    r, w = os.pipe()
    try:
        with Ring(8) as ring, AlignedBuffer(4 * BLOCK) as slots:
            stream = RwStream(ring, r, BLOCK, depth=4, slots=4)
            import threading

            def writer():
                for letter in b"abcd":
                    os.write(w, bytes([letter]) * BLOCK)

            threading.Timer(0.2, writer).start()
            stream.feed([0, 0, 0, 0], slots.view)
            assert list(stream.finish().res) == [BLOCK] * 4
            chunks = sorted(bytes(slots.view[k * BLOCK : (k + 1) * BLOCK]) for k in range(4))
        assert chunks == [bytes([c]) * BLOCK for c in b"abcd"]
    finally:
        os.close(r)
        os.close(w)


def test_sink_stream_needs_a_slot_per_op_in_flight(fd):
    with Ring(16) as ring:
        with pytest.raises(ValueError, match="slots must be from depth"):
            RwStream(ring, fd, BLOCK, depth=8, slots=4)
        with pytest.raises(ValueError, match="buffer holds"):
            RwStream(ring, fd, BLOCK, depth=4, slots=4).feed([0], bytearray(2 * BLOCK))
