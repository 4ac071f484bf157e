"""The I/O cases of `xhagent bench pool`: tasks reading through their worker's ring against
the engine's own batch of the same reads.

    cases(quick=False) -> {"cases": {...}, "ratios": {"io_tasks_vs_engine": x}, "notes": {...}}

Both run in one pool worker (pinned, as tasks run in production), on the same file and
the same random 4 KiB offsets, from the page cache (the file is written and read once
beforehand):
  * io_engine: `xhagent.io.read_batch` of the N reads, one call whose per-op loop is C;
  * io_engine_each, for reading the figure: the same reads from one C loop, each entered
    alone as a task's inline read is (xh_rt_now), into the engine's destination: what a
    task's read costs the kernel and the ring with no Python, no task and no bytes object;
  * io_tasks: N tasks spawned at once, each `rt.read(fd, 4096, offset)`, all joined;
    ops/s over the whole (spawn to last join), p50/p99 of each read's call-to-return,
    and per pass the enters made and the reads answered inline (without a park);
  * for reading the figure, no ratio: io_tasks_into, the same tasks with
    `rt.read_into` their slice of one buffer (the engine's destination: no 4 KiB bytes
    object made per read), and tasks_noop, the same tasks with no read at all (the
    scheduler's own share of io_tasks' time).
Each case takes the median of ROUNDS timed passes (ops/s from passes without per-op
clock reads, latencies from one pass with them), after a warm-up pass.

`bounds.io_tasks_vs_engine` is what the ratio would be if a reading task cost no more
than a task that does nothing plus the engine's own read (1 / (1/noop + 1/engine), over
the engine): the ceiling that the task's spawn, step and join put on the ratio however
cheap the read path gets. `bounds.io_each_vs_engine` is io_engine_each over io_engine:
the ceiling of a task whose read is entered alone, if the task itself cost nothing.
`budget_ns` says what a task may cost in all at the target (1 / (0.7 x engine)), and how
much of that is left beside a read entered alone.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from array import array

BLOCK = 4096
OPS = 10_000
ROUNDS = 5


def _summary(ops: int, seconds: list[float], lat_ns) -> dict:
    lat = sorted(lat_ns)

    def pick(q):
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] / 1000, 2) if lat else None

    best = statistics.median(seconds)
    return {
        "ops_per_s": round(ops / best, 1),
        "ops": ops,
        "p50_us": pick(0.50),
        "p99_us": pick(0.99),
        "runs_ops_per_s": [round(ops / s, 1) for s in seconds],
    }


def _engine(fd: int, offsets: array, rounds: int) -> dict:
    from xhagent.io import Ring, read_batch

    n = len(offsets)
    buf = bytearray(n * BLOCK)
    with Ring(256) as ring:
        read_batch(ring, fd, offsets, BLOCK, buf).check()  # warm-up
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            read_batch(ring, fd, offsets, BLOCK, buf).check()
            seconds.append(time.perf_counter() - start)
        lat = read_batch(ring, fd, offsets, BLOCK, buf, latencies=True).check().lat_ns
    return _summary(n, seconds, lat)


def _engine_each(fd: int, offsets: array, rounds: int) -> dict:
    from xhagent.io.ring import Ring, UringError, ffi, lib

    n = len(offsets)
    buf = bytearray(n * BLOCK)
    dst, offs = ffi.from_buffer(buf), ffi.from_buffer("uint64_t[]", offsets)

    def one_pass() -> float:
        start = time.perf_counter()
        got = lib.xh_rt_each(ring._ring, fd, dst, offs, n, BLOCK)
        took = time.perf_counter() - start
        if got < 0:
            raise UringError.from_res(got, "io_engine_each")
        if got != n * BLOCK:
            raise RuntimeError("io_engine_each: a short read from the page cache")
        return took

    with Ring(256) as ring:
        one_pass()  # warm-up
        seconds = [one_pass() for _ in range(rounds)]
    return _summary(n, seconds, ())


def _tasks(fd: int, offsets: array, rounds: int, how: str = "read") -> dict:
    """how: "read" (rt.read, bytes back), "into" (rt.read_into the task's slice of one
    buffer, the engine's destination) or "noop" (no read)."""
    from xhagent.runtime import api as rt

    spawn, now = rt.spawn, time.perf_counter_ns
    read = rt.read if how == "read" else rt.read_into
    lat = array("Q")
    with_io = how != "noop"
    buf = memoryview(bytearray(len(offsets) * BLOCK))
    slices = [buf[k * BLOCK : (k + 1) * BLOCK] for k in range(len(offsets))]
    args = (
        list(zip(offsets, slices, strict=True)) if how == "into" else [(o, BLOCK) for o in offsets]
    )

    def plain(o, dest):
        return read(fd, dest, o)

    def noop(o, dest):
        return BLOCK

    def timed(o, dest):
        t = now()
        got = read(fd, dest, o)
        lat.append(now() - t)
        return got

    def one_pass(fn) -> float:
        start = time.perf_counter()
        tasks = [spawn(fn, o, dest) for o, dest in args]
        for t in tasks:
            got = t.join()
            if (got if type(got) is int else len(got)) != BLOCK:
                raise RuntimeError("io_tasks: a short read from the page cache")
        return time.perf_counter() - start

    def main():
        fn = plain if with_io else noop
        one_pass(fn)  # warm-up: contexts made, the ring made
        ring = rt._core._running._io
        before = (ring.enters, ring.ops, ring.inline) if with_io else None
        seconds = [one_pass(fn) for _ in range(rounds)]
        if not with_io:
            return seconds, None
        # per timed pass: the io_uring_enter calls that carried its reads, the reads, and
        # those answered inside their own enter
        now_ = (ring.enters, ring.ops, ring.inline)
        counts = tuple((b - a) / rounds for a, b in zip(before, now_, strict=True))
        one_pass(timed)
        return seconds, counts

    # In a pool worker this is a task already: its subtasks use the worker's ring.
    seconds, counts = main() if rt.current_task() is not None else rt.run(main)
    out = _summary(len(offsets), seconds, lat)
    if counts is not None:
        out["enters_per_pass"], out["reads_per_pass"], out["inline_per_pass"] = counts
    return out


def measure(path: str, ops: int, seed: int, rounds: int) -> dict:
    """The three cases, in the calling process (a pool worker, from `cases`), on `ops`
    offsets drawn from `seed` (a list of them would not fit a run-queue slot)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        rng, blocks = random.Random(seed), os.fstat(fd).st_size // BLOCK
        offs = array("Q", (rng.randrange(blocks) * BLOCK for _ in range(ops)))
        return {
            "io_engine": _engine(fd, offs, rounds),
            "io_engine_each": _engine_each(fd, offs, rounds),
            "io_tasks": _tasks(fd, offs, rounds),
            "io_tasks_into": _tasks(fd, offs, rounds, "into"),
            "tasks_noop": _tasks(fd, offs, rounds, "noop"),
            "cpu": sorted(os.sched_getaffinity(0)),
        }
    finally:
        os.close(fd)


def cases(quick: bool = False, *, ops: int = OPS, in_pool: bool = True) -> dict:
    """The I/O cases and the io_tasks_vs_engine ratio (target >= 0.7). `quick`: fewer
    rounds, a smaller file. `in_pool`: measured in a one-worker Pool (False: here)."""
    rounds = 2 if quick else ROUNDS
    size = (16 if quick else 64) << 20
    with tempfile.TemporaryDirectory(prefix="xhagent-bench-io-") as tmp:
        path = os.path.join(tmp, "data")
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
        with open(path, "rb") as f:  # read once: the page cache holds it
            while f.read(1 << 20):
                pass
        if in_pool:
            from ..runtime.pool import Pool

            cpu = sorted(os.sched_getaffinity(0))[-1]
            with Pool([cpu], preempt="off") as pool:
                got = pool.submit(measure, path, ops, 14, rounds).result(600)
        else:
            got = measure(path, ops, 14, rounds)
    cpus = got.pop("cpu")
    engine, tasks = got["io_engine"]["ops_per_s"], got["io_tasks"]["ops_per_s"]
    noop = got["tasks_noop"]["ops_per_s"]
    each = got["io_engine_each"]["ops_per_s"]
    return {
        "cases": got,
        "ratios": {"io_tasks_vs_engine": round(tasks / engine, 3) if engine else None},
        "targets": {"io_tasks_vs_engine": ">= 0.7"},
        "bounds": {
            "io_tasks_vs_engine": round(1 / (1 / noop + 1 / engine) / engine, 3)
            if engine and noop
            else None,
            "io_each_vs_engine": round(each / engine, 3) if engine else None,
        },
        "budget_ns": {
            "task_at_target": round(1e9 / (0.7 * engine), 1) if engine else None,
            "left_beside_a_read_entered_alone": round(1e9 / (0.7 * engine) - 1e9 / each, 1)
            if engine and each
            else None,
            "task_doing_nothing": round(1e9 / noop, 1) if noop else None,
        },
        "notes": {
            "io": (
                f"{ops} random 4 KiB reads of a {size >> 20} MiB file in the page cache, in "
                f"one pool worker pinned to cpu {cpus}; tasks_noop is the same tasks without "
                "the read (the scheduler's part of io_tasks); io_tasks_into reads into one buffer "
                "as the engine does"
            )
        },
    }
