"""O_DIRECT through the engine on this host: data, alignment errors explained, the IOPOLL
fallback (this host's ext4 completes polled reads with -EOPNOTSUPP), registered file and
buffers and a registration the kernel refuses, and streams of batches."""

import errno
import mmap
import os
import random

import pytest

from xhagent.io import AlignedBuffer, DirectFile, UringError

pytestmark = pytest.mark.host
BLOCK = 4096


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "direct"  # tmp_path is on ext4 here (O_DIRECT capable)
    data = random.Random(3).randbytes(1 << 20)
    path.write_bytes(data)
    return str(path), data


def test_direct_read_qd32_on_interrupt_ring(data_file):
    path, data = data_file
    offsets = [o * BLOCK for o in random.Random(5).sample(range(256), 200)]
    with DirectFile(path, poll="auto") as f, AlignedBuffer(len(offsets) * BLOCK) as buf:
        assert not f.polled and not f.device_polls  # ext4 on vda: queue/io_poll = 0
        f.read(offsets, BLOCK, buf.view, depth=32).check()
        for i, o in enumerate(offsets):
            assert buf.view[i * BLOCK : (i + 1) * BLOCK] == data[o : o + BLOCK]
        assert f.stats["interrupt_ops"] == 200 and f.stats["polled_ops"] == 0


def test_forced_iopoll_falls_back_and_still_delivers(data_file):
    path, data = data_file
    offsets = [0, 5 * BLOCK, 9 * BLOCK]
    with DirectFile(path, poll=True) as f, AlignedBuffer(3 * BLOCK) as buf:
        assert f.polled
        result = f.read(offsets, BLOCK, buf.view, depth=2, latencies=True).check()
        assert list(result.res) == [BLOCK] * 3
        assert bytes(buf.view) == b"".join(data[o : o + BLOCK] for o in offsets)
        assert f.stats["fallbacks"] == 1 and f.stats["fallback_ops"] == 3
        assert not f.polled and "EOPNOTSUPP" in f.fallback_reason
        f.read([BLOCK], BLOCK, buf.view).check()  # stays on the interrupt ring
        assert f.stats["fallbacks"] == 1 and f.stats["interrupt_ops"] == 4


def test_direct_write_and_read_back(tmp_path):
    path = tmp_path / "w"
    path.write_bytes(bytes(8 * BLOCK))
    payload = os.urandom(4 * BLOCK)
    with DirectFile(str(path), write=True, poll=False) as f, AlignedBuffer(4 * BLOCK) as buf:
        buf.view[:] = payload
        f.write([4 * BLOCK, 5 * BLOCK, 6 * BLOCK, 7 * BLOCK], BLOCK, buf.view).check()
    assert path.read_bytes()[4 * BLOCK :] == payload


@pytest.mark.parametrize(
    "offset,length,misalign_buffer,what",
    [
        (100, BLOCK, False, "offset 100"),
        (0, 1000, False, "length 1000"),
        (0, BLOCK, True, "buffer address"),
    ],
)
def test_misaligned_direct_io_is_explained(data_file, offset, length, misalign_buffer, what):
    with DirectFile(data_file[0], poll=False) as f, AlignedBuffer(2 * BLOCK) as buf:
        view = buf.view[1 : 1 + length] if misalign_buffer else buf.view[:length]
        with pytest.raises(UringError) as info:
            f.read([offset], length, view)
    assert info.value.errno == errno.EINVAL and what in info.value.strerror
    assert (
        "O_DIRECT needs block-aligned I/O" in info.value.strerror
        and info.value.filename == data_file[0]
    )


def test_direct_short_read_at_eof_is_reported_not_retried(tmp_path):
    path = tmp_path / "odd"
    path.write_bytes(b"z" * (BLOCK + 100))
    with DirectFile(str(path)) as f, AlignedBuffer(2 * BLOCK) as buf:
        result = f.read([0, BLOCK], BLOCK, buf.view)
    assert list(result.res) == [BLOCK, 100] and result.short() == [1]


def test_registered_file_and_buffers_read_the_right_bytes(data_file):
    path, data = data_file
    offsets = [o * BLOCK for o in random.Random(6).sample(range(256), 64)]
    with (
        DirectFile(path, poll=False) as f,
        AlignedBuffer(64 * BLOCK) as buf,
        AlignedBuffer(BLOCK) as other,
    ):
        assert f.registration_notes == [] and f._interrupt.files == [f.fd]
        f.register_buffers([buf.view])
        f.read(offsets, BLOCK, buf.view).check()
        assert bytes(buf.view) == b"".join(data[o : o + BLOCK] for o in offsets)
        assert f.stats["fixed_file_ops"] == 64 and f.stats["fixed_buffer_ops"] == 64
        f.read([BLOCK], BLOCK, other.view).check()  # not registered: a plain buffer, counted
        assert bytes(other.view) == data[BLOCK : 2 * BLOCK]
        assert f.stats["plain_buffer_ops"] == 1 and f.stats["registration_refusals"] == 0


def test_refused_buffer_registration_is_counted_and_io_still_delivers(data_file, tmp_path):
    """The kernel will not pin a shared writable mapping of an ext4 file (EFAULT), while
    O_DIRECT reads into it work: the plain path, for real."""
    path, data = data_file
    backing = tmp_path / "backing"
    backing.write_bytes(bytes(4 * BLOCK))
    with (
        open(backing, "r+b") as fh,
        mmap.mmap(fh.fileno(), 4 * BLOCK) as shared,
        DirectFile(path, poll=False) as f,
    ):
        f.register_buffers([memoryview(shared)])
        assert f.stats["registration_refusals"] == 1
        assert "buffer registration refused on the interrupt ring" in f.registration_notes[0]
        f.read([0, 3 * BLOCK], BLOCK, shared).check()
        assert (
            shared[:BLOCK] == data[:BLOCK]
            and shared[BLOCK : 2 * BLOCK] == data[3 * BLOCK : 4 * BLOCK]
        )
        assert f.stats["plain_buffer_ops"] == 2 and f.stats["fixed_buffer_ops"] == 0
        assert f.stats["fixed_file_ops"] == 2


def test_unregistered_file_uses_the_plain_fd(data_file):
    path, data = data_file
    with DirectFile(path, poll=False, register=False) as f, AlignedBuffer(BLOCK) as buf:
        f.read([2 * BLOCK], BLOCK, buf.view).check()
        assert bytes(buf.view) == data[2 * BLOCK : 3 * BLOCK] and f.stats["fixed_file_ops"] == 0


def test_direct_stream_keeps_the_queue_full_with_fixed_buffers(tmp_path):
    path = tmp_path / "big"
    data = random.Random(8).randbytes(16 << 20)
    path.write_bytes(data)
    rng = random.Random(9)
    with DirectFile(str(path), poll=False) as f, AlignedBuffer(512 * BLOCK) as buf:
        f.register_buffers([buf.view])
        halves = [buf.view[: 256 * BLOCK], buf.view[256 * BLOCK :]]
        batches = [[rng.randrange(4096) * BLOCK for _ in range(256)] for _ in range(12)]
        stream = f.stream(BLOCK, depth=8, latencies=True)
        for k, offsets in enumerate(batches + [None]):
            done = stream.feed(offsets, halves[k % 2]) if offsets else stream.finish()
            if done is not None:
                half = halves[(k - 1) % 2]
                assert list(done.check().offsets) == batches[k - 1]
                for i, o in enumerate(batches[k - 1]):
                    assert half[i * BLOCK : (i + 1) * BLOCK] == data[o : o + BLOCK], (
                        f"batch {k - 1} op {i}"
                    )
        assert stream.min_inflight == 8
        assert f.stats["fixed_buffer_ops"] == f.stats["interrupt_ops"] == 12 * 256
        assert f.stats["fixed_file_ops"] == 12 * 256


def test_direct_stream_on_a_refusing_iopoll_ring_falls_back_in_order(data_file):
    path, data = data_file
    batches = [[(k * 16 + i) * BLOCK for i in range(16)] for k in range(5)]
    with DirectFile(path, poll=True) as f, AlignedBuffer(32 * BLOCK) as buf:
        halves = [buf.view[: 16 * BLOCK], buf.view[16 * BLOCK :]]
        stream = f.stream(BLOCK, depth=4)
        got = []
        for k, offsets in enumerate(batches + [None]):
            done = stream.feed(offsets, halves[k % 2]) if offsets else stream.finish()
            if done is not None:
                got.append(list(done.check().offsets))
                assert bytes(halves[(k - 1) % 2]) == b"".join(
                    data[o : o + BLOCK] for o in batches[k - 1]
                )
        assert got == batches
        assert (
            not f.polled and f.stats["fallbacks"] == 1 and f.stats["fallback_ops"] == 32
        )  # two batches in flight
        assert f.stats["interrupt_ops"] == 5 * 16


def test_direct_sink_stream_with_fixed_slots_and_iopoll_fallback(data_file):
    path, data = data_file
    offsets = [o * BLOCK for o in random.Random(10).choices(range(256), k=600)]
    for poll in (False, True):
        with DirectFile(path, poll=poll) as f, AlignedBuffer(16 * BLOCK) as slots:
            f.register_buffers([slots.view])
            stream = f.stream(BLOCK, depth=8, slots=16)
            results = [
                stream.feed(offsets[k : k + 200], slots.view) for k in range(0, 600, 200)
            ] + [stream.finish()]
            assert [len(r.check().res) for r in results if r is not None] == [200, 200, 200]
            blocks = {data[o : o + BLOCK] for o in offsets}
            used = [bytes(slots.view[k * BLOCK : (k + 1) * BLOCK]) for k in range(16)]
            used = [b for b in used if b != bytes(BLOCK)]
            assert len(used) >= 8 and all(
                b in blocks for b in used
            )  # whole blocks of what was read
            assert f.stats["fixed_buffer_ops"] >= 600 and f.stats["plain_buffer_ops"] == 0
            assert f.stats["fallbacks"] == int(poll) and f.stats["interrupt_ops"] == 600
