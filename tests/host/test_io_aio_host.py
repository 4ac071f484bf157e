"""AsyncRing on this kernel: many coroutines on one ring, batched submissions, writes,
read_files, errors, and close with I/O in flight."""

import asyncio
import errno
import os
import random

import pytest

from xhagent.io import AsyncRing, UringError

pytestmark = pytest.mark.host


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "a"
    data = random.Random(9).randbytes(1 << 20)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    yield fd, data
    os.close(fd)


def test_many_coroutines_share_a_ring_and_submissions_batch(data_file):
    fd, data = data_file
    offsets = [random.Random(2).randrange(len(data) - 4096) for _ in range(2000)]

    async def main():
        async with AsyncRing(64) as ring:  # fewer entries than concurrent reads: backlog
            got = await asyncio.gather(*(ring.read(fd, 4096, o) for o in offsets))
            return got, ring.submits

    got, submits = asyncio.run(main())
    assert all(g == data[o : o + 4096] for g, o in zip(got, offsets, strict=True))
    assert submits < len(offsets) / 10  # batched per loop iteration, not one per read


def test_write_then_read_and_eof(data_file):
    fd, data = data_file

    async def main():
        async with AsyncRing() as ring:
            assert await ring.write(fd, b"hello", 100) == 5
            back = await ring.read(fd, 10, 98)
            tail = await ring.read(fd, 4096, len(data) - 10)
            past = await ring.read(fd, 4096, len(data) + 10)
            return back, tail, past

    back, tail, past = asyncio.run(main())
    assert back == data[98:100] + b"hello" + data[105:108]
    assert tail == data[-10:] and past == b""


def test_errors_raise_with_errno():
    async def main():
        async with AsyncRing() as ring:
            await ring.read(1 << 30, 10, 0)

    with pytest.raises(UringError) as info:
        asyncio.run(main())
    assert info.value.errno == errno.EBADF


def test_read_files_on_the_async_ring(tmp_path):
    paths = []
    for i in range(150):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(i * 97))
        paths.append(p)
    paths += [
        tmp_path,
        tmp_path / "missing",
    ]  # the open succeeds and the read fails; the open fails

    async def main():
        async with AsyncRing(32, file_slots=8) as ring:
            both = await asyncio.gather(ring.read_files(paths[:75]), ring.read_files(paths[75:]))
            return both[0] + both[1]

    got = asyncio.run(main())
    assert got[:-2] == [p.read_bytes() for p in paths[:-2]]
    assert (
        isinstance(got[-2], OSError)
        and got[-2].errno == errno.EISDIR
        and got[-2].filename == str(tmp_path)
    )
    assert isinstance(got[-1], OSError) and got[-1].errno == errno.ENOENT


def test_close_with_reads_in_flight_cancels_them():
    r, w = os.pipe()

    async def main():
        ring = AsyncRing(16)
        tasks = [asyncio.ensure_future(ring.read(r, 64, 0)) for _ in range(5)]
        await asyncio.sleep(0.05)  # queued, submitted, waiting on the empty pipe
        assert ring.ring.pending == 5
        ring.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return ring, results

    try:
        ring, results = asyncio.run(main())
    finally:
        os.close(r)
        os.close(w)
    assert ring.ring.closed and ring.ring.pending == 0
    assert all(isinstance(x, UringError) and x.errno == errno.ECANCELED for x in results)
