"""The run queues across processes: a stress of concurrent push, pop and steal in which
every item must come out exactly once, a sleeping worker woken by another process's push,
and the figures for the report (run with -s to see them)."""

import multiprocessing
import os
import random
import shutil
import statistics
import struct
import subprocess
import tempfile
import time
from array import array
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.runtime.queues import SharedQueues

FORK = multiprocessing.get_context("fork")
WORKERS, PER_WORKER, SUBMITTED = 3, 40_000, 80_000
TOTAL = WORKERS * PER_WORKER + SUBMITTED  # 200k


def payload(i: int) -> bytes:
    # Lengths and contents vary with the id, so a slot read after its reuse would show.
    return struct.pack("<I", i) + bytes([i % 251]) * (i % 57)


def check(item: bytes) -> int:
    (i,) = struct.unpack_from("<I", item)
    assert item == payload(i), f"item {i} came out altered"
    return i


def stress_worker(fd, w, done, stolen, out):
    q = SharedQueues.attach(fd)
    rng, seen = random.Random(w), array("I")
    nxt, end = w * PER_WORKER, (w + 1) * PER_WORKER
    while True:
        for _ in range(rng.randrange(5)):  # bursts, so that rings fill and get stolen from
            if nxt < end and q.push_local(w, payload(nxt)):
                nxt += 1
        if w == 0 and rng.random() < 0.5:
            continue  # a busy worker: its ring grows, and the others steal from it
        item = q.pop_local(w)
        if item is None:
            item = q.pop_global()
        if item is None:
            victim = rng.randrange(WORKERS)
            if victim != w and (n := q.steal(w, victim)):
                stolen[w] += n
                item = q.pop_local(w)
        if item is not None:
            seen.append(check(item))
            done[w] = len(seen)
        elif nxt >= end:
            if sum(done) == TOTAL:
                break
            q.wait(w, 0.01)
    Path(out).write_bytes(seen.tobytes())


def submitter(fd):
    q = SharedQueues.attach(fd)
    for i in range(WORKERS * PER_WORKER, TOTAL):
        while not q.push_global(payload(i)):
            time.sleep(0.0002)


def test_items_pushed_popped_and_stolen_by_several_processes_come_out_exactly_once(tmp_path):
    # Small rings and fewer slots than cells: full rings, exhausted slots and many laps.
    with SharedQueues.create(WORKERS, ring_size=64, slots=160, slot_size=64) as q:
        done, stolen = FORK.RawArray("q", WORKERS), FORK.RawArray("q", WORKERS)
        outs = [tmp_path / f"w{w}" for w in range(WORKERS)]
        procs = [
            FORK.Process(target=stress_worker, args=(q.fd, w, done, stolen, outs[w]))
            for w in range(WORKERS)
        ] + [FORK.Process(target=submitter, args=(q.fd,))]
        start = time.monotonic()
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(1, 60 - (time.monotonic() - start)))
        elapsed = time.monotonic() - start
        for p in procs:
            if p.is_alive():
                p.kill()
        assert [p.exitcode for p in procs] == [0] * len(procs), list(done)
        counts = Counter()
        for out in outs:
            counts.update(array("I", out.read_bytes()))
        assert len(counts) == TOTAL and set(counts) == set(range(TOTAL))
        assert counts.most_common(1)[0][1] == 1
        assert q.lengths() == ([0] * WORKERS, 0) and q.free_slots() == q.slots
        print(f"\nstress: {TOTAL} items, 4 processes, {elapsed:.1f} s; taken", list(done))
        print("  of which stolen", list(stolen))
        assert sum(stolen) > 0 and elapsed < 30


# One op: ("push", n) n pushes to the own ring, ("global", n), ("pop",), ("pop_global",),
# ("steal", victim); each process runs its script from one start, the parent drains the rest.
OPS = st.one_of(
    st.tuples(st.just("push"), st.integers(1, 12)),
    st.tuples(st.just("global"), st.integers(1, 12)),
    st.tuples(st.sampled_from(["pop", "pop_global"])),
    st.tuples(st.just("steal"), st.integers(0, WORKERS - 1)),
)


def scripted(fd, w, script, barrier, out):
    q = SharedQueues.attach(fd)
    pushed, popped, n = array("I"), array("I"), 0
    barrier.wait()
    for _ in range(200):  # repeated, so that the processes overlap for a while
        for op in script:
            if op[0] in ("push", "global"):
                for _ in range(op[1]):
                    item, n = ((w << 24) | n), n + 1
                    ok = (
                        q.push_local(w, payload(item))
                        if op[0] == "push"
                        else q.push_global(payload(item))
                    )
                    if ok:
                        pushed.append(item)
            elif op[0] == "steal":
                if op[1] != w:
                    q.steal(w, op[1])
            elif (got := q.pop_local(w) if op[0] == "pop" else q.pop_global()) is not None:
                popped.append(check(got))
    Path(out).write_bytes(struct.pack("<I", len(pushed)) + pushed.tobytes() + popped.tobytes())


@settings(max_examples=25, deadline=None)
@given(scripts=st.lists(st.lists(OPS, min_size=1, max_size=30), min_size=WORKERS, max_size=WORKERS))
def test_random_scripts_run_concurrently_by_several_processes_lose_and_double_nothing(scripts):
    with (
        SharedQueues.create(WORKERS, ring_size=16, slots=40, slot_size=64) as q,
        tempfile.TemporaryDirectory() as tmp,
    ):
        barrier = FORK.Barrier(WORKERS)
        outs = [Path(tmp) / f"w{w}" for w in range(WORKERS)]
        procs = [
            FORK.Process(target=scripted, args=(q.fd, w, scripts[w], barrier, outs[w]))
            for w in range(WORKERS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0] * WORKERS
        pushed, popped = Counter(), Counter()
        for out in outs:
            both = array("I", out.read_bytes())
            pushed.update(both[1 : 1 + both[0]])
            popped.update(both[1 + both[0] :])
        for w in range(WORKERS):
            while (item := q.pop_local(w)) is not None:
                popped[check(item)] += 1
        while (item := q.pop_global()) is not None:
            popped[check(item)] += 1
        assert popped == pushed and max(popped.values(), default=1) == 1
        assert q.free_slots() == q.slots


def sleeper(fd, rounds, conn):
    q = SharedQueues.attach(fd)
    latencies = []
    for _ in range(rounds):
        while True:
            item = q.pop_global()
            if item is None and q.steal(0, 1):
                item = q.pop_local(0)
            if item is not None:
                break
            q.wait(0, 5.0)
        latencies.append(time.perf_counter_ns() - struct.unpack("<q", item)[0])
    conn.send(latencies)
    start = time.monotonic()
    conn.send((q.wait(0, 10.0), time.monotonic() - start))  # ended by a wake, no work


def test_a_sleeping_worker_is_woken_by_another_processs_push_or_wake_within_milliseconds():
    rounds = 40
    with SharedQueues.create(workers=2, ring_size=64) as q:
        ours, theirs = FORK.Pipe()
        child = FORK.Process(target=sleeper, args=(q.fd, rounds, theirs))
        child.start()
        try:
            for i in range(rounds):
                deadline = time.monotonic() + 5
                while q.sleepers() == 0:  # it is in FUTEX_WAIT, not in its spin
                    assert time.monotonic() < deadline, "the worker never went to sleep"
                    time.sleep(0.001)
                time.sleep(0.002)
                stamp = struct.pack("<q", time.perf_counter_ns())  # CLOCK_MONOTONIC
                # Either path must wake it: the global ring, or a ring it can steal from.
                assert q.push_global(stamp) if i % 2 else q.push_local(1, stamp)
            assert ours.poll(10)
            latencies = ours.recv()
            while q.sleepers() == 0:
                time.sleep(0.001)
            q.wake(0)
            assert ours.poll(10)
            woken, slept = ours.recv()
            assert woken and slept < 5
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
    assert child.exitcode == 0
    median, worst = statistics.median(latencies), max(latencies)
    print(
        f"\nwake handoff across processes: median {median / 1e3:.0f} us, max {worst / 1e3:.0f} us"
    )
    assert median < 5e6, latencies


def test_round_trip_figures():
    n = 200_000
    with SharedQueues.create(workers=2, ring_size=4096) as q:
        item = b"x" * 100
        start = time.perf_counter_ns()
        for _ in range(n):
            q.push_local(0, item)
            q.pop_local(0)
        local = (time.perf_counter_ns() - start) / n
        start = time.perf_counter_ns()
        for _ in range(n):
            q.push_global(item)
            q.pop_global()
        glob = (time.perf_counter_ns() - start) / n
    print(f"\nfrom Python, push+pop of 100 bytes: local {local:.0f} ns, global {glob:.0f} ns")
    assert local < 20_000 and glob < 20_000


NATIVE = Path(__file__).resolve().parents[2] / "native"
HARNESS = Path(__file__).resolve().parent / "data" / "runq_harness.c"


def build_harness(out: Path, *flags: str) -> Path:
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{NATIVE}", *flags]
    subprocess.run([*cmd, "-o", out, HARNESS, NATIVE / "runq.c", "-lpthread"], check=True)
    return out


def tsan_works(tmp: Path) -> bool:
    (tmp / "t.c").write_text("int main(void) { return 0; }\n")
    cmd = ["cc", "-fsanitize=thread", "-o", tmp / "t", tmp / "t.c"]
    return subprocess.run(cmd, capture_output=True).returncode == 0 and (
        subprocess.run([tmp / "t"], capture_output=True).returncode == 0
    )


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_threads_under_thread_sanitizer_find_no_race_and_lose_nothing(tmp_path):
    if not tsan_works(tmp_path):
        pytest.skip("the C compiler has no working -fsanitize=thread")
    exe = build_harness(tmp_path / "stress", "-O1", "-g", "-fsanitize=thread")
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    res = subprocess.run([exe, "stress"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    total, stolen, free = map(int, res.stdout.split())
    print(f"\nthread sanitizer: {total} items, {stolen} stolen, {free} slots free at the end")
    assert stolen > 0


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_round_trip_figures_in_c(tmp_path):
    exe = build_harness(tmp_path / "bench", "-O2")
    out = subprocess.run([exe, "bench"], check=True, capture_output=True, text=True).stdout
    local, glob = map(float, out.split())
    print(f"\nin C, push+pop of 100 bytes: local {local:.0f} ns, global {glob:.0f} ns")
    assert local < 5_000 and glob < 5_000
