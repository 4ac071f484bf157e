"""O_DIRECT through the engine on this host: data, alignment errors explained, and the
IOPOLL fallback (this host's ext4 completes polled reads with -EOPNOTSUPP)."""
import errno
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
            assert buf.view[i * BLOCK:(i + 1) * BLOCK] == data[o:o + BLOCK]
        assert f.stats["interrupt_ops"] == 200 and f.stats["polled_ops"] == 0


def test_forced_iopoll_falls_back_and_still_delivers(data_file):
    path, data = data_file
    offsets = [0, 5 * BLOCK, 9 * BLOCK]
    with DirectFile(path, poll=True) as f, AlignedBuffer(3 * BLOCK) as buf:
        assert f.polled
        result = f.read(offsets, BLOCK, buf.view, depth=2, latencies=True).check()
        assert list(result.res) == [BLOCK] * 3
        assert bytes(buf.view) == b"".join(data[o:o + BLOCK] for o in offsets)
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
    assert path.read_bytes()[4 * BLOCK:] == payload


@pytest.mark.parametrize("offset,length,misalign_buffer,what", [
    (100, BLOCK, False, "offset 100"), (0, 1000, False, "length 1000"), (0, BLOCK, True, "buffer address")])
def test_misaligned_direct_io_is_explained(data_file, offset, length, misalign_buffer, what):
    with DirectFile(data_file[0], poll=False) as f, AlignedBuffer(2 * BLOCK) as buf:
        view = buf.view[1:1 + length] if misalign_buffer else buf.view[:length]
        with pytest.raises(UringError) as info:
            f.read([offset], length, view)
    assert info.value.errno == errno.EINVAL and what in info.value.strerror
    assert "O_DIRECT needs block-aligned I/O" in info.value.strerror and info.value.filename == data_file[0]


def test_direct_short_read_at_eof_is_reported_not_retried(tmp_path):
    path = tmp_path / "odd"
    path.write_bytes(b"z" * (BLOCK + 100))
    with DirectFile(str(path)) as f, AlignedBuffer(2 * BLOCK) as buf:
        result = f.read([0, BLOCK], BLOCK, buf.view)
    assert list(result.res) == [BLOCK, 100] and result.short() == [1]
