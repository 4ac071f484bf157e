"""Tasks reading and writing through their scheduler's io_uring ring, on this kernel: the
right bytes to the right task, page-cache reads answered inline, requests that wait sent
in one enter per round, errors to their own task, parked tasks beside running ones, the
sleep on the ring woken by completions and by other threads, cancellation, more requests
than the ring holds, and the same in a Pool."""

import concurrent.futures
import errno
import os
import threading
import time
import zlib

import pytest

from xhagent.runtime import api as rt
from xhagent.runtime import io as rio
from xhagent.runtime.pool import Pool
from xhagent.runtime.queues import SharedQueues

pytestmark = pytest.mark.host
CPUS = sorted(os.sched_getaffinity(0))[:2]
T = 60
BLOCK = 4096


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data"
    blob = os.urandom(256 * BLOCK)
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDWR)
    yield fd, blob, path
    os.close(fd)


def test_page_cache_reads_complete_inline_without_parking(data_file):
    fd, blob, _ = data_file
    order = list(range(256))[::-1]

    def reader(k):
        return k, rt.read(fd, BLOCK, k * BLOCK)

    def main():
        tasks = [rt.spawn(reader, k) for k in order]
        got = [t.join() for t in tasks]
        ring = rt._core._running._io
        return got, [t._parks for t in tasks], ring.enters, ring.ops, ring.inline

    got, parks, enters, ops, inline = rt.run(main)
    assert [k for k, _ in got] == order
    for k, data in got:
        assert data == blob[k * BLOCK : (k + 1) * BLOCK]
    assert ops == inline == 256 and enters == 256  # one enter each, answered inside it
    assert parks == [0] * 256  # no reader ever gave its context up


def test_a_request_that_waits_makes_the_next_ones_go_together(data_file):
    """A pipe read cannot complete inside its enter: its task parks, and the next
    EAGER_BACKOFF requests (page-cache reads here) are queued and sent in one enter
    per round; the one after them is tried inline again."""
    fd, blob, _ = data_file
    r, w = os.pipe()
    n = rio.EAGER_BACKOFF
    try:

        def main():
            sched = rt._core._running
            waiter = rt.spawn(rt.read, r, 10, 0)
            rt.sleep(0.01)  # the waiter tried inline, parked
            ring = sched._io
            tried = (ring.inline, ring.inflight, waiter._parks)
            e0 = ring.enters
            batch = [rt.spawn(rt.read, fd, BLOCK, k * BLOCK) for k in range(n)]
            got = [t.join() for t in batch]
            batched = (ring.enters - e0, ring.inline, [t._parks for t in batch])
            last = rt.spawn(rt.read, fd, BLOCK, 0)
            last.join()
            again = (ring.inline, last._parks)
            os.write(w, b"done")
            return tried, got, batched, again, waiter.join()

        tried, got, batched, again, waited = rt.run(main)
        assert tried == (0, 1, 1)
        assert got == [blob[k * BLOCK : (k + 1) * BLOCK] for k in range(n)]
        enters, inline, parks = batched
        assert inline == 0 and parks == [1] * n
        assert enters <= 3  # the round's pump, and the join's sleep on the ring
        assert again == (1, 0)
        assert waited == b"done"
    finally:
        os.close(r)
        os.close(w)


def test_short_read_at_eof_and_sizes(data_file):
    fd, blob, _ = data_file

    def main():
        tail = rt.read(fd, 3 * BLOCK, len(blob) - 100)
        past = rt.read(fd, BLOCK, len(blob) + BLOCK)
        odd = rt.read(fd, 10, 7)
        return tail, past, odd

    tail, past, odd = rt.run(main)
    assert tail == blob[-100:] and past == b"" and odd == blob[7:17]


def test_read_into_fills_each_tasks_part_of_one_buffer(data_file):
    fd, blob, _ = data_file
    buf = bytearray(64 * BLOCK)
    view = memoryview(buf)

    def part(k):
        return rt.read_into(fd, view[k * BLOCK : (k + 1) * BLOCK], (63 - k) * BLOCK)

    async def tail():
        return await rt.read_into_async(fd, bytearray(BLOCK), len(blob) - 10)

    def main():
        sizes = [t.join() for t in [rt.spawn(part, k) for k in range(64)]]
        return sizes, rt.spawn(tail).join()

    sizes, short = rt.run(main)
    assert sizes == [BLOCK] * 64 and short == 10
    for k in range(64):
        assert buf[k * BLOCK : (k + 1) * BLOCK] == blob[(63 - k) * BLOCK : (64 - k) * BLOCK]
    with pytest.raises(BufferError):  # the kernel may not write into bytes
        rt.run(rt.read_into, fd, b"read-only", 0)


def test_write_then_read_round_trip(tmp_path):
    fd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT, 0o600)
    try:

        def writer(k):
            return rt.write(fd, bytes([k]) * 1000, k * 1000)

        def main():
            sizes = [t.join() for t in [rt.spawn(writer, k) for k in range(50)]]
            back = rt.read(fd, 50 * 1000, 0)
            n = rt.write(fd, bytearray(b"xyz"), 50 * 1000)  # any bytes-like
            return sizes, back, n

        sizes, back, n = rt.run(main)
        assert sizes == [1000] * 50
        assert back == b"".join(bytes([k]) * 1000 for k in range(50))
        assert n == 3 and os.pread(fd, 3, 50 * 1000) == b"xyz"
    finally:
        os.close(fd)


def test_async_tasks_await_reads_and_writes(tmp_path):
    fd = os.open(tmp_path / "a", os.O_RDWR | os.O_CREAT, 0o600)
    try:

        async def job(k):
            await rt.write_async(fd, b"%04d" % k, 4 * k)
            await rt.yield_async()
            return await rt.read_async(fd, 4, 4 * k)

        def main():
            return [t.join() for t in [rt.spawn(job, k) for k in range(20)]]

        assert rt.run(main) == [b"%04d" % k for k in range(20)]
    finally:
        os.close(fd)


def test_a_bad_fd_fails_its_own_task_only(data_file):
    fd, blob, _ = data_file
    bad = 4000  # a number that names no open file (a closed one could be the ring's next)
    with pytest.raises(OSError):
        os.fstat(bad)

    def main():
        good = [rt.spawn(rt.read, fd, BLOCK, k * BLOCK) for k in range(10)]
        broken = rt.spawn(rt.read, bad, BLOCK, 0)
        bad_write = rt.spawn(rt.write, bad, b"x", 0)
        after = [rt.spawn(rt.read, fd, BLOCK, k * BLOCK) for k in range(10, 20)]
        out = {"good": [t.join() for t in good + after]}
        for name, t in (("read", broken), ("write", bad_write)):
            with pytest.raises(OSError) as info:
                t.join()
            out[name] = info.value
        return out

    out = rt.run(main)
    assert out["good"] == [blob[k * BLOCK : (k + 1) * BLOCK] for k in range(20)]
    for name in ("read", "write"):
        err = out[name]
        assert err.errno == errno.EBADF
        assert f"{name} fd {bad} @ 0" in str(err) and "EBADF" in str(err)


def test_other_tasks_run_while_a_read_waits_and_its_completion_wakes_it():
    r, w = os.pipe()
    events = []
    try:

        def reader():
            data = rt.read(r, 100, 0)  # a pipe: the kernel completes it when data comes
            events.append(("read", data))
            return data

        def other():
            for i in range(3):
                events.append(("tick", i))
                rt.sleep(0.01)
            os.write(w, b"hello")

        def main():
            a = rt.spawn(reader)
            b = rt.spawn(other)
            return a.join(), b.join()

        start = time.monotonic()
        data, _ = rt.run(main)
        assert data == b"hello"
        assert events == [("tick", 0), ("tick", 1), ("tick", 2), ("read", b"hello")]
        assert time.monotonic() - start < 5
    finally:
        os.close(r)
        os.close(w)


def test_a_task_yielding_in_a_lower_class_does_not_hold_a_completion_back():
    """The reader's read completes in the kernel later (a pipe written by a thread); a
    LOW task that keeps yielding means the scheduler never idles, so only the rounds'
    reaping can wake the NORMAL reader."""
    r, w = os.pipe()
    state = {"done": False, "gave_up": False}
    try:

        def reader():
            data = rt.read(r, 10, 0)
            state["done"] = True
            return data

        def hog():
            end = time.monotonic() + 5
            while not state["done"]:
                if time.monotonic() > end:
                    state["gave_up"] = True  # the read was never reaped
                    return
                rt.yield_()

        def main():
            a = rt.spawn(reader, priority=rt.NORMAL)
            b = rt.spawn(hog, priority=rt.LOW)
            rt.sleep(0.01)  # both started, the read in the kernel
            threading.Timer(0.1, os.write, (w, b"in time")).start()
            b.join()
            return a.join()

        assert rt.run(main) == b"in time"
        assert not state["gave_up"]
    finally:
        os.close(r)
        os.close(w)


def test_sleep_on_the_ring_ends_at_a_completion_from_another_thread():
    """Nothing runnable, one read in flight on a pipe: the scheduler sleeps on the ring;
    another thread's write completes the read, which wakes it at once."""
    r, w = os.pipe()
    try:
        timer = threading.Timer(0.2, os.write, (w, b"late"))
        timer.start()
        start = time.monotonic()
        assert rt.run(rt.read, r, 10, 0) == b"late"
        assert 0.15 < time.monotonic() - start < 2
        timer.join()
    finally:
        os.close(r)
        os.close(w)


def test_a_future_done_by_another_thread_wakes_the_sleep_on_the_ring():
    """A read in flight that only the task waiting on the future will satisfy: if the
    future's completion did not end the sleep on the ring, the run would hang until the
    safety write 10 s later."""
    r, w = os.pipe()
    fut = concurrent.futures.Future()
    safety = threading.Timer(10, os.write, (w, b"safety"))
    try:

        def waiter():
            value = rt.wait_future(fut)
            os.write(w, value)

        def main():
            a = rt.spawn(rt.read, r, 10, 0)
            b = rt.spawn(waiter)
            b.join()
            return a.join()

        threading.Timer(0.1, fut.set_result, (b"future",)).start()
        safety.start()
        start = time.monotonic()
        assert rt.run(main) == b"future"
        assert time.monotonic() - start < 5
    finally:
        safety.cancel()
        os.close(r)
        os.close(w)


def test_a_run_queue_push_ends_the_sleep_on_the_ring():
    """A pool worker with reads in flight sleeps on its ring with a FUTEX_WAIT on its
    run-queue word armed there: a push by another thread (or process) ends the sleep."""
    r, w = os.pipe()
    q = SharedQueues.create(2)
    try:

        def main():
            ring = rio.ring_of(rt._core._running)
            assert ring.futex_wait  # this kernel has IORING_OP_FUTEX_WAIT (Linux 6.7+)
            reader = rt.spawn(rt.read, r, 10, 0)
            rt.sleep(0.01)  # the reader is parked, its read in the kernel
            word = q.wait_begin(0)
            assert word is not None and q.sleepers() == 1
            threading.Timer(0.2, q.push_global, (b"work",)).start()
            start = time.monotonic()
            ring.sleep(10, word)  # without the futex in the ring: 10 s
            slept = time.monotonic() - start
            q.wait_end(0)
            os.write(w, b"done")
            return slept, reader.join(), q.sleepers()

        slept, data, sleepers = rt.run(main)
        assert 0.1 < slept < 3 and data == b"done" and sleepers == 0
        assert q.pop_global() == b"work"
    finally:
        q.close()
        os.close(r)
        os.close(w)


def test_cancelled_task_ends_and_its_late_completion_is_dropped():
    r, w = os.pipe()
    try:

        def main():
            stuck = rt.spawn(rt.read, r, 10, 0)
            rt.sleep(0.01)  # it is parked on its read now
            assert stuck.cancel()
            with pytest.raises(concurrent.futures.CancelledError):
                stuck.join()
            os.write(w, b"for nobody")  # completes the cancelled task's request
            fresh = rt.spawn(rt.read, r, 100, 0)
            os.write(w, b"!")
            return fresh.join()

        got = rt.run(main)
        # the cancelled read took "for nobody" in the kernel; the fresh one gets what follows
        assert got == b"!"
    finally:
        os.close(r)
        os.close(w)


def test_more_requests_than_the_ring_holds_wait_their_turn():
    pipes = [os.pipe() for _ in range(20)]
    try:

        def main():
            sched = rt._core._running
            sched._io = rio.TaskRing(sched, entries=4)  # at most 4 in flight
            readers = [rt.spawn(rt.read, r, 10, 0) for r, _ in pipes]
            rt.sleep(0.01)
            seen = sched._io.inflight, len(sched._io._backlog)
            for k, (_, w) in enumerate(pipes):
                os.write(w, b"p%d" % k)
            return seen, [t.join() for t in readers]

        seen, got = rt.run(main)
        assert seen == (4, 16)  # in the kernel, and waiting for room
        assert got == [b"p%d" % k for k in range(20)]
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)


class _NoFastPath:
    """In place of _sched.InlineRead: tries nothing, so every request takes the Python path."""

    reads = 0

    def __init__(self, *args):
        pass

    def read(self, fd, nbytes, offset):
        return None

    def set_slab(self, addr):
        pass

    def close(self):
        pass


def test_small_reads_end_in_c_and_what_does_not_end_alone_is_handed_back(data_file):
    """After the first small read (which makes the ring and its slab), page-cache reads are
    answered by the native fast path; a read that fails, one that has to wait (a pipe) and
    one whose enter also brings another request's completion are finished in Python."""
    fd, blob, _ = data_file
    r, w = os.pipe()
    closed = 999_999  # no file (a freed low number would be the ring's eventfd's next)
    try:

        def main():
            ring_of = rt._core._running
            assert rt.read(fd, BLOCK, 0) == blob[:BLOCK]  # makes the ring: the Python path
            ring = ring_of._io
            fast0 = ring.fast.reads
            got = [rt.read(fd, BLOCK, k * BLOCK) for k in range(1, 9)]
            assert got == [blob[k * BLOCK : (k + 1) * BLOCK] for k in range(1, 9)]
            assert ring.fast.reads - fast0 == 8 and ring.inline == 9 and ring.enters == 9
            assert rt.read(fd, BLOCK, len(blob) - 100) == blob[-100:]  # short, at EOF
            assert rt.read(fd, 10, len(blob)) == b"" and ring.fast.reads - fast0 == 10
            fast0 += 2
            with pytest.raises(OSError) as failed:
                rt.read(closed, 10, 0)
            assert failed.value.errno == errno.EBADF and ring.fast.reads - fast0 == 8
            waiter = rt.spawn(rt.read, r, 10, 0)
            rt.sleep(0.01)  # tried from C, parked by Python
            assert (waiter._parks, ring.inflight) == (1, 1)
            for k in range(rio.EAGER_BACKOFF):  # the reads after a wait are batched
                assert rt.read(fd, 10, k) == blob[k : k + 10]
            assert ring.inflight == 1
            os.write(w, b"late")  # the waiter's completion is posted
            inline, fast = ring.inline, ring.fast.reads
            assert rt.read(fd, 100, 5) == blob[5:105]
            # tried from C, which found the waiter's completion too: finished in Python
            assert (ring.inline - inline, ring.fast.reads - fast, ring.inflight) == (1, 0, 0)
            return waiter.join()

        assert rt.run(main) == b"late"
    finally:
        os.close(r)
        os.close(w)


def test_a_preemption_inside_a_request_waits_for_its_park(data_file, monkeypatch):
    """What the time-slice handler does at a safe point (request_preempt), done halfway
    through queueing a request: it must not switch to another task, which could queue
    its own request over this one's, but leave the yield to the park. (The native fast
    path has no point between bytecodes to be preempted at: it is off here.)"""
    fd, blob, _ = data_file
    monkeypatch.setattr(rio._sched, "InlineRead", _NoFastPath)
    yielded = []
    for name in ("_prep", "_now"):  # queued, or tried inline
        monkeypatch.setattr(rio.TaskRing, name, _preempted(getattr(rio.TaskRing, name), yielded))

    def main():
        tasks = [rt.spawn(rio.read, fd, BLOCK, k * BLOCK) for k in range(8)]
        return [t.join() for t in tasks], [t._preempt_requested for t in tasks]

    got, still_requested = rt.run(main)
    assert yielded == [False] * 8
    assert got == [blob[k * BLOCK : (k + 1) * BLOCK] for k in range(8)]
    assert still_requested == [False] * 8  # the park, or the yield after it, answered it


def _preempted(method, asked: list):
    """`method` with the time-slice handler's request_preempt() made at its start."""

    def preempted(self, *args):
        asked.append(rt.request_preempt())
        return method(self, *args)

    return preempted


def test_a_preemption_asked_during_an_inline_read_yields_when_the_read_returns(
    data_file, monkeypatch
):
    """A read the page cache answers inline never parks: the deferred preemption is honoured
    as critical() does, by a yield on the way out, not dropped."""
    fd, blob, _ = data_file
    asked, order = [], []
    monkeypatch.setattr(rio.TaskRing, "_now", _preempted(rio.TaskRing._now, asked))

    def reader():
        data = rio.read(fd, BLOCK, 0)
        order.append("read returned")
        return data

    def main():
        tasks = [rt.spawn(reader), rt.spawn(order.append, "the other task ran")]
        return [t.join() for t in tasks]

    got, _ = rt.run(main)
    assert asked == [False]  # deferred: inside the request
    assert got == blob[:BLOCK]
    assert order == ["the other task ran", "read returned"]


def test_a_scheduler_without_io_has_no_ring():
    def main():
        rt.sleep(0.001)
        return rt._core._running._io

    assert rt.run(main) is None


def test_read_outside_a_task_is_refused(data_file):
    fd, _, _ = data_file
    with pytest.raises(RuntimeError, match="inside a task"):
        rt.read(fd, 10, 0)


# -- through a real Pool: module-level functions, imported by the workers ------------------
def pool_read(path, offsets):
    fd = os.open(path, os.O_RDONLY)
    try:
        tasks = [rt.spawn(rt.read, fd, BLOCK, o) for o in offsets]
        return [zlib.crc32(t.join()) for t in tasks]  # a result must fit a results slot
    finally:
        os.close(fd)


def pool_read_one(path, offset):
    fd = os.open(path, os.O_RDONLY)
    try:
        return rt.read(fd, BLOCK, offset)
    finally:
        os.close(fd)


def pool_bad_read(fd):
    return rt.read(fd, 10, 0)


def pool_pipe_read(ticks):
    """A read that completes later, while the same worker's other tasks go on."""
    r, w = os.pipe()
    try:
        done = []

        def ticker():
            for _ in range(ticks):
                rt.sleep(0.005)
                done.append(1)
            os.write(w, b"%d" % len(done))

        reader = rt.spawn(rt.read, r, 10, 0)
        rt.spawn(ticker)
        return reader.join()
    finally:
        os.close(r)
        os.close(w)


def pool_fifo_read(path):
    fd = os.open(path, os.O_RDWR)  # a FIFO opened read-write: the open does not block
    try:
        return rt.read(fd, 100, 0)
    finally:
        os.close(fd)


def test_a_worker_with_a_read_in_flight_still_takes_new_work(tmp_path):
    """One worker, its only task parked on a FIFO read: the worker sleeps on its ring, and
    each new submission ends that sleep (the run-queue futex is armed in the ring)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with Pool(CPUS[:1]) as pool:
        blocked = pool.submit(pool_fifo_read, str(fifo))
        time.sleep(0.2)  # the read is in the kernel, the worker asleep on its ring
        rounds = []
        for x in range(50):
            start = time.monotonic()
            assert pool.submit(square, x).result(T) == x * x
            rounds.append(time.monotonic() - start)
        assert not blocked.done()
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"unblocked")
        os.close(fd)
        assert blocked.result(T) == b"unblocked"
    rounds.sort()
    print(f"submit round trip beside a read in flight: p50 {rounds[25] * 1e6:.0f} us")


def square(x):
    return x * x


def pool_reads_under_preemption(path, tasks, reads):
    """Reads through runtime.io itself (no api frame, which the preemption handler counts as
    runtime code) by tasks that also burn CPU, so slices end inside the read path."""
    fd = os.open(path, os.O_RDONLY)
    try:

        def one(seed):
            bad = 0
            for k in range(reads):
                off = ((seed * 7919 + k * 104729) % 256) * BLOCK
                if rio.read(fd, BLOCK, off) != os.pread(fd, BLOCK, off):
                    bad += 1
                sum(range(2000))
            return bad

        handles = [rt.spawn(one, t) for t in range(tasks)]
        return sum(h.join() for h in handles)
    finally:
        os.close(fd)


def test_reads_stay_right_under_time_slice_preemption(data_file):
    _, _, path = data_file
    with Pool(CPUS[:1], slice_ms=0.5) as pool:
        assert pool.submit(pool_reads_under_preemption, str(path), 40, 100).result(T) == 0
        stats = pool.stats()
    assert stats["workers"][0]["preempt"] in ("bpf", "itimer")


def test_pool_tasks_read_through_their_workers_ring(data_file):
    _, blob, path = data_file
    with Pool(CPUS) as pool:
        futs = [pool.submit(pool_read_one, str(path), k * BLOCK) for k in range(64)]
        for k, f in enumerate(futs):
            assert f.result(T) == blob[k * BLOCK : (k + 1) * BLOCK]
        offsets = [k * BLOCK for k in range(0, 256, 3)]
        many = pool.submit(pool_read, str(path), offsets).result(T)
        assert many == [zlib.crc32(blob[o : o + BLOCK]) for o in offsets]
        with pytest.raises(OSError) as info:
            pool.submit(pool_bad_read, 987).result(T)
        assert info.value.errno == errno.EBADF
        assert pool.submit(pool_pipe_read, 4).result(T) == b"4"
        assert pool.submit(pool_read_one, str(path), 0).result(T) == blob[:BLOCK]


def test_bench_io_cases_report_the_ratio_and_the_batching():
    from xhagent.bench import pool_io

    report = pool_io.cases(quick=True, ops=300, in_pool=False)
    cases = report["cases"]
    for name in ("io_engine", "io_engine_each", "io_tasks", "io_tasks_into", "tasks_noop"):
        assert cases[name]["ops_per_s"] > 0 and cases[name]["ops"] == 300
    assert cases["io_tasks"]["p50_us"] > 0 and cases["io_tasks"]["p99_us"] > 0
    assert cases["io_tasks"]["reads_per_pass"] == 300
    assert cases["io_tasks"]["inline_per_pass"] == 300  # the page cache answers each inline
    bound = report["bounds"]["io_tasks_vs_engine"]
    noop, engine = cases["tasks_noop"]["ops_per_s"], cases["io_engine"]["ops_per_s"]
    assert bound == round(1 / (1 / noop + 1 / engine) / engine, 3)
    ratio = report["ratios"]["io_tasks_vs_engine"]
    assert ratio == round(cases["io_tasks"]["ops_per_s"] / cases["io_engine"]["ops_per_s"], 3)
    each = cases["io_engine_each"]["ops_per_s"]
    assert report["bounds"]["io_each_vs_engine"] == round(each / engine, 3)
    budget = report["budget_ns"]
    assert budget["task_at_target"] == round(1e9 / (0.7 * engine), 1)
    left = budget["task_at_target"] - 1e9 / each
    assert budget["left_beside_a_read_entered_alone"] == pytest.approx(left, abs=0.11)
