"""runtime.Pool with real worker processes: results, pinning, cgroup leaves, lost workers,
close with work outstanding, and throughput (printed beside ProcessPoolExecutor's)."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups.subtree import locate
from xhagent.runtime import api as rt
from xhagent.runtime.pool import Pool, PoolClosed, TaskLoadError, WorkerLost
from xhagent.runtime.queues import SharedQueues

pytestmark = pytest.mark.host
CPUS = sorted(os.sched_getaffinity(0))[:2]
T = 60  # seconds: generous, the CPUs are shared


# Tasks: module-level, so the workers import them by reference.
def square(x):
    return x * x


def fail(msg):
    raise ValueError(msg)


def unpicklable():
    return lambda: None


def whoami():
    return os.getpid(), os.sched_getaffinity(0)


def hang(path):
    with open(path, "w") as f:  # tells the test which worker runs it
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)


def nap(seconds):
    time.sleep(seconds)
    return seconds


async def a_square(x):
    await rt.yield_async()
    await rt.sleep_async(0.001)
    return x * x


def proc_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()


def test_submit_map_and_exceptions():
    with Pool(CPUS) as pool:
        assert pool.submit(square, 12).result(T) == 144
        assert pool.map(square, range(200)) == [x * x for x in range(200)]
        assert pool.map(square, range(50), chunksize=7) == [x * x for x in range(50)]
        with pytest.raises(ValueError, match="boom"):
            pool.submit(fail, "boom").result(T)
        with pytest.raises(RuntimeError, match="cannot be sent back"):
            pool.submit(unpicklable).result(T)
        # an `async def` function: its coroutine is run in the worker, not sent back
        assert pool.submit(a_square, 7).result(T) == 49
        assert pool.map(a_square, range(20)) == [x * x for x in range(20)]
        stats = pool.stats()
        done = 1 + 200 + 8 + 2 + 1 + 20
        assert stats["pending"] == 0 and sum(w["done"] for w in stats["workers"]) == done


def test_workers_are_pinned_and_gone_after_close():
    with Pool(CPUS) as pool:
        pids = [w.pid for w in pool.workers]
        for w in pool.workers:
            assert proc_field(w.pid, "Cpus_allowed_list") == str(w.cpu)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")


@pytest.fixture
def subtree():
    name = f"xhagent-test-pool-{os.getpid()}"
    sub = locate(name)
    yield name
    path = sub.path
    if path.exists():
        for group in sorted(
            (p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            Cgroup(group).remove(kill_first=True)
        Cgroup(path).remove(kill_first=True)


def test_workers_in_their_own_leaf(subtree):
    sub = locate(subtree)
    with Pool(CPUS, subtree=subtree) as pool:
        assert pool.submit(square, 3).result(T) == 9
        mount = str(sub.mount)
        for w in pool.workers:
            with open(f"/proc/{w.pid}/cgroup") as f:
                rel = f.read().strip().split("::", 1)[1]
            assert mount + rel == str(sub.group(f"pool/{w.cpu}").path)
    assert not (sub.path / "pool").exists()  # the pool's groups are removed with it


def test_workers_in_the_subtree_start_at_oom_score_adj_0(raised_oom_score_adj, subtree):
    # the owner (the agent: -999 under its unit) is spared by the OOM killer; the code its
    # workers run is not
    with Pool(CPUS, subtree=subtree) as pool:
        assert pool.submit(square, 3).result(T) == 9
        for w in pool.workers:
            with open(f"/proc/{w.pid}/oom_score_adj") as f:
                assert f.read().strip() == "0"
    with open("/proc/self/oom_score_adj") as f:
        assert f.read().strip() == str(raised_oom_score_adj)


def test_killed_worker_fails_its_task_and_the_rest_complete(tmp_path):
    with Pool(CPUS) as pool:
        marker = tmp_path / "running"
        stuck = pool.submit(hang, str(marker))
        deadline = time.monotonic() + T
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        pid = int(marker.read_text())
        victim = next(w for w in pool.workers if w.pid == pid)
        others = [pool.submit(square, x) for x in range(100)]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerLost) as lost:
            stuck.result(T)
        msg = str(lost.value)
        assert f"worker {victim.index} (cpu {victim.cpu}, pid {pid}) died with signal 9" in msg
        if len(CPUS) > 1:  # one left to run the rest
            assert [f.result(T) for f in others] == [x * x for x in range(100)]
            assert pool.submit(square, 5).result(T) == 25
        assert not pool.stats()["workers"][victim.index]["alive"]


def test_close_with_tasks_outstanding_fails_them():
    pool = Pool(CPUS)
    pids = [w.pid for w in pool.workers]
    futs = [pool.submit(nap, 0.5) for _ in range(20)]
    time.sleep(0.3)
    t0 = time.monotonic()
    pool.close(timeout=2)
    assert time.monotonic() - t0 < 10
    outcomes = [f.exception(0) for f in futs]
    assert all(e is None or isinstance(e, PoolClosed) for e in outcomes)
    assert any(isinstance(e, PoolClosed) for e in outcomes)
    assert "closed before task" in str(next(e for e in outcomes if e))
    with pytest.raises(PoolClosed):
        pool.submit(square, 1)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")


def test_ten_thousand_small_tasks():
    n = 10_000
    with Pool(CPUS) as pool:
        pool.map(square, range(100))  # warm: workers started and imported
        t0 = time.perf_counter()
        futs = [pool.submit(square, x) for x in range(n)]
        assert [f.result(T) for f in futs] == [x * x for x in range(n)]
        ours = n / (time.perf_counter() - t0)
    with concurrent.futures.ProcessPoolExecutor(len(CPUS)) as ex:
        list(ex.map(square, range(100)))
        t0 = time.perf_counter()
        futs = [ex.submit(square, x) for x in range(n)]
        assert [f.result(T) for f in futs] == [x * x for x in range(n)]
        theirs = n / (time.perf_counter() - t0)
    print(f"\n10k tasks: Pool {ours:.0f}/s, ProcessPoolExecutor({len(CPUS)}) {theirs:.0f}/s")


def rss_kb(pid):
    return int(proc_field(pid, "VmRSS").split()[0])


def test_a_million_tasks_leave_no_trace():
    """After two warm-up rounds, 1M tasks (ten map rounds of 100k, one task per item) in two
    halves: no worker's RSS grows in both halves (what a leak does; ~250k tasks a worker in
    each, so one object kept per task would add 4 MB or more to each half, where a heap
    that settles at a new high-water mark grows once), reuse a handful of task contexts,
    and leave the owner no larger than after warm-up: nothing per task is kept on either side."""
    with Pool(CPUS) as pool:
        for _ in range(2):  # warm: the contexts a round of map needs are made
            assert pool.map(square, range(100_000))[-1] == 99_999**2
        rss = [{w.pid: rss_kb(w.pid) for w in pool.workers}]
        owner = rss_kb(os.getpid())
        for _ in range(2):
            for _ in range(5):
                assert pool.map(square, range(100_000))[-1] == 99_999**2
            rss.append({pid: rss_kb(pid) for pid in rss[0]})
        stats = pool.stats()
        # contexts are reused: a handful per worker (the count comes with the workers'
        # periodic stats, so it may trail by a report), never one per task
        assert all(1 <= w["contexts"] <= 8 for w in stats["workers"]), stats["workers"]
        assert sum(w["done"] for w in stats["workers"]) == 1_200_000
    halves = {pid: (rss[1][pid] - rss[0][pid], rss[2][pid] - rss[1][pid]) for pid in rss[0]}
    print(f"\n1M tasks: workers' RSS grew {halves} kB; owner {rss_kb(os.getpid()) - owner} kB")
    assert all(min(h) < 1024 and sum(h) < 8 * 1024 for h in halves.values()), halves
    assert rss_kb(os.getpid()) - owner < 16 * 1024


def burst(blocks):
    """Allocate `blocks` 4 KiB objects and free them: this worker's RSS in kB with them held
    and after the free."""
    held = [bytes(4096) for _ in range(blocks)]
    with_them = rss_kb(os.getpid())
    del held
    return with_them, rss_kb(os.getpid())


def test_a_worker_keeps_freed_heap_until_it_idles():
    """64 MiB of 4 KiB objects freed stays in the worker's heap (glibc would give the top of
    the heap back at the free), for the next burst; once the worker has idled a while it is
    given back to the kernel."""
    with Pool(CPUS[:1]) as pool:
        pid = pool.workers[0].pid
        with_them, after_free = pool.submit(burst, 16384).result(60)
        assert with_them - after_free < 8 * 1024, (with_them, after_free)
        wait_for(lambda: rss_kb(pid) < with_them - 48 * 1024, "the idle worker's heap trimmed")


def set_process_affinity(cpus):
    """Every thread of this process (as a cpuset change does), not only the calling one."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


def wait_for(predicate, what, timeout=T):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_workers_follow_the_allowed_cpus():
    """The owner's CPUs shrink (as a cpuset shrink or an offline CPU does to it): the worker
    of the CPU that left retires and the tasks queued meanwhile all complete on the other;
    the CPU comes back: a new worker is pinned to it and takes work."""
    kept, leaving = CPUS[0], CPUS[1]
    before = os.sched_getaffinity(0)
    with Pool(CPUS) as pool:
        old = pool.workers[1]
        assert old.cpu == leaving
        futs = [pool.submit(nap, 0.001) for _ in range(400)]
        try:
            set_process_affinity({kept})
            wait_for(lambda: not pool.stats()["workers"][1]["alive"], "the worker to retire")
            futs += [pool.submit(whoami) for _ in range(200)]
            done = [f.result(T) for f in futs]
            assert done[:400] == [0.001] * 400
            assert {pid for pid, _ in done[400:]} == {pool.workers[0].pid}
            row = pool.stats()["workers"][1]
            assert row["retiring"] and not row["alive"] and row["running"] == 0
        finally:
            set_process_affinity(before)
        wait_for(lambda: pool.stats()["workers"][1]["alive"], "a worker for the CPU back")
        fresh = pool.workers[1]
        assert fresh.pid != old.pid and fresh.cpu == leaving
        wait_for(lambda: fresh.ready, "the new worker to be ready")
        assert proc_field(fresh.pid, "Cpus_allowed_list") == str(leaving)
        # worker 0 sizes its batches by the time its last tasks took (microseconds), so it
        # may take a whole first map of slow tasks before the new worker looks; once it has
        # timed them, it takes fewer, and the new worker gets its share
        pids: set[int] = set()
        for _ in range(5):
            pids |= {pid for pid, _ in pool.map(whoami_slowly, range(40))}
            if fresh.pid in pids:
                break
        assert pids == {pool.workers[0].pid, fresh.pid}
        assert pool.stats()["pending"] == 0


def whoami_slowly(_):
    time.sleep(0.01)  # long enough that both workers get some
    return os.getpid(), os.sched_getaffinity(0)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two workers")
def test_dead_workers_queue_goes_back_to_the_others(tmp_path):
    """Tasks still on a dead worker's ring are stolen onto the owner's ring and pushed to
    the global ring. Set up with both workers stopped: the test, standing in for worker 0
    (stopped, so it writes nothing), moves submitted tasks from the global ring onto ring 0."""
    with Pool(CPUS) as pool:
        marker = tmp_path / "running"
        stuck = pool.submit(hang, str(marker))
        deadline = time.monotonic() + T
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        dead = next(w for w in pool.workers if w.pid == int(marker.read_text()))
        other = next(w for w in pool.workers if w is not dead)
        for w in pool.workers:
            os.kill(w.pid, signal.SIGSTOP)
        try:
            futs = [pool.submit(square, x) for x in range(10)]
            q = SharedQueues.attach(pool._q.fd)
            while (blob := q.pop_global()) is not None:
                assert q.push_local(dead.index, blob)
            assert q.lengths() == ([10 if i == dead.index else 0 for i in range(3)], 0)
            os.kill(dead.pid, signal.SIGKILL)
            with pytest.raises(WorkerLost):
                stuck.result(T)
            while q.lengths()[1] < 10:  # the collector has moved them back
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert q.lengths()[0][dead.index] == 0
            q.close()
        finally:
            os.kill(other.pid, signal.SIGCONT)
        assert [f.result(T) for f in futs] == [x * x for x in range(10)]


def spin(seconds):
    """Burn CPU without a yield; (start, end) on the shared monotonic clock."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass
    return t0, time.monotonic()


@pytest.mark.parametrize("preempt", ["bpf", "timer"])
def test_cpu_bound_tasks_share_a_worker_by_time_slice(preempt):
    with Pool(CPUS[:1], slice_ms=10, preempt=preempt) as pool:
        assert pool.stats()["workers"][0]["preempt"] == preempt
        a, b = pool.submit(spin, 0.5), pool.submit(spin, 0.5)
        (a0, a1), (b0, b1) = a.result(T), b.result(T)
    assert b0 < a1 and a0 < b1  # each started before the other ended: they interleaved


def forever():
    while True:
        pass


@pytest.mark.parametrize("preempt", ["bpf", "timer"])
def test_a_task_that_never_yields_is_preempted(preempt):
    with Pool(CPUS[:1], slice_ms=10, preempt=preempt) as pool:
        assert pool.stats()["workers"][0]["preempt"] == preempt
        stuck = pool.submit(forever)
        time.sleep(0.1)  # it has the worker by now
        # the same worker runs these only if the endless loop is made to yield
        assert [pool.submit(square, x).result(T) for x in range(3)] == [0, 1, 4]
        assert not stuck.done()
        pool.close(timeout=0.5)  # SIGTERM waits for running tasks: SIGKILL after 0.5 s
    with pytest.raises(PoolClosed):
        stuck.result(0)


def posix_timers(pid):
    """/proc/PID/timers as a list of {field: value}."""
    timers = []
    with open(f"/proc/{pid}/timers") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "ID":
                timers.append({})
            timers[-1][key] = value.strip()
    return timers


def test_the_timer_fallback_is_the_worker_threads_cpu_clock_signalling_that_thread():
    with Pool(CPUS[:1], slice_ms=10, preempt="timer") as pool:
        pid = pool.workers[0].pid
        (timer,) = posix_timers(pid)
        assert timer["signal"].startswith(f"{int(signal.SIGURG)}/")
        assert timer["notify"] == f"signal/tid.{pid}"  # SIGEV_THREAD_ID: its main thread
        assert timer["ClockID"] == "-2"  # CLOCK_THREAD_CPUTIME_ID of the thread that made it
    with Pool(CPUS[:1], slice_ms=10, preempt="bpf") as pool:
        assert posix_timers(pool.workers[0].pid) == []  # BPF only: no timer beside it


def test_without_preemption_a_task_that_never_yields_keeps_its_worker():
    with Pool(CPUS[:1], slice_ms=10, preempt="off") as pool:
        assert pool.stats()["workers"][0]["preempt"] == "off"
        pool.submit(forever)
        time.sleep(0.1)
        with pytest.raises(concurrent.futures.TimeoutError):
            pool.submit(square, 3).result(1)
        pool.close(timeout=0.5)


def spin_critical(seconds):
    with rt.critical():  # preemption waits for the section's end
        return spin(seconds)


@pytest.mark.parametrize("preempt", ["bpf", "timer"])
def test_critical_section_is_not_preempted(preempt):
    with Pool(CPUS[:1], slice_ms=5, preempt=preempt) as pool:
        assert pool.stats()["workers"][0]["preempt"] == preempt
        a, b = pool.submit(spin_critical, 0.3), pool.submit(spin, 0.3)
        (_, a1), (b0, _) = a.result(T), b.result(T)
    assert b0 >= a1


def test_a_payload_over_a_slot_is_refused():
    with Pool(CPUS[:1], slot_size=1024) as pool:
        with pytest.raises(ValueError, match="does not fit a slot"):
            pool.submit(square, b"x" * 2000)
        assert pool.stats()["pending"] == 0
        assert pool.submit(square, 4).result(T) == 16


def refuse_to_load():
    raise ValueError("this argument refuses to load")


class LoadsBadly:
    def __reduce__(self):
        return refuse_to_load, ()


def test_a_task_the_worker_cannot_load_fails_alone(tmp_path):
    """A function whose module only the owner can import, and an argument that raises as it
    is unpickled: each task fails with TaskLoadError naming why; the workers live on."""
    with Pool(CPUS) as pool:
        (tmp_path / "owner_only_module.py").write_text("def double(x):\n    return 2 * x\n")
        sys.path.insert(0, str(tmp_path))  # after the workers started: theirs lacks it
        try:
            import owner_only_module
        finally:
            sys.path.remove(str(tmp_path))
        futures = [pool.submit(owner_only_module.double, i) for i in range(20)]
        bad_arg = pool.submit(square, LoadsBadly())
        for fut in futures:
            with pytest.raises(TaskLoadError, match="No module named 'owner_only_module'"):
                fut.result(T)
        with pytest.raises(TaskLoadError, match="ValueError: this argument refuses to load"):
            bad_arg.result(T)
        assert pool.map(square, range(100)) == [x * x for x in range(100)]
        assert all(w.alive and w.proc.poll() is None for w in pool.workers)
    sys.modules.pop("owner_only_module", None)


def test_an_unknown_preemption_mode_is_refused_before_any_worker_starts(monkeypatch):
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match="preempt 'bogus' is not one of auto, bpf, timer, off"):
        Pool(CPUS, preempt="bogus")
    assert started == []


def test_without_preemption_tasks_run_to_completion():
    with Pool(CPUS[:1], preempt="off") as pool:
        a, b = pool.submit(spin, 0.2), pool.submit(spin, 0.2)
        (_, a1), (b0, _) = a.result(T), b.result(T)
    assert b0 >= a1


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two workers")
def test_task_taken_but_unclaimed_by_a_dead_worker_fails():
    """The window between a worker's pop and its claim, made wide: with both workers
    stopped, the test takes a task off the global ring (as the worker would) and drops it,
    then kills worker 0. Once the pool is quiet the task's future fails."""
    with Pool(CPUS) as pool:
        for w in pool.workers:
            os.kill(w.pid, signal.SIGSTOP)
        dead, other = pool.workers
        try:
            fut = pool.submit(square, 3)
            q = SharedQueues.attach(pool._q.fd)
            assert q.pop_global() is not None
            q.close()
            os.kill(dead.pid, signal.SIGKILL)
        finally:
            os.kill(other.pid, signal.SIGCONT)
        with pytest.raises(WorkerLost, match="lost with a worker .* died with signal 9"):
            fut.result(T)
        assert pool.submit(square, 6).result(T) == 36


def test_workers_stop_when_their_owner_dies_without_closing(tmp_path):
    script = (
        "import os, sys\n"
        "from xhagent.runtime.pool import Pool\n"
        f"p = Pool({CPUS!r})\n"
        "print(' '.join(str(w.pid) for w in p.workers), flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=T, check=True
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == len(CPUS)
    deadline = time.monotonic() + T
    while any(
        os.path.exists(f"/proc/{pid}") and proc_field(pid, "State")[0] != "Z" for pid in pids
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two workers")
def test_every_future_resolves_when_a_busy_worker_is_killed():
    """Killed mid-stream, wherever it is (running, claiming, popping, stealing): each future
    ends with its result or WorkerLost, none hangs, and no result is wrong."""
    n = 5000
    with Pool(CPUS) as pool:
        futs = [pool.submit(nap, 0.0005) for _ in range(n // 2)]
        futs += [pool.submit(square, x) for x in range(n // 2)]
        deadline = time.monotonic() + T
        while sum(f.done() for f in futs) < n // 10:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(pool.workers[0].pid, signal.SIGKILL)
        done, not_done = concurrent.futures.wait(futs, timeout=T)
        assert not not_done
        lost = [f for f in futs if isinstance(f.exception(), WorkerLost)]
        assert all(f.exception() is None or f in lost for f in futs)
        assert all(f.result() == x * x for x, f in enumerate(futs[n // 2 :]) if f not in lost)
        print(f"\nkilled mid-stream: {len(lost)} of {n} lost")


def stamp(tag):
    return tag, time.monotonic()


def test_priority_and_deadline_order_a_batch():
    """Tasks taken in one batch run by class, then earliest deadline (the scheduler's order)."""
    with Pool(CPUS[:1]) as pool:
        pid = pool.workers[0].pid
        os.kill(pid, signal.SIGSTOP)  # so that all of them wait in the ring, one batch
        try:
            now = time.monotonic()
            futs = [
                pool.submit(stamp, "low", priority=2),
                pool.submit(stamp, "late", deadline=now + 20),
                pool.submit(stamp, "plain"),
                pool.submit(stamp, "soon", deadline=now + 10),
                pool.submit(stamp, "high", priority=0),
            ]
        finally:
            os.kill(pid, signal.SIGCONT)
        ran = sorted((f.result(T) for f in futs), key=lambda r: r[1])
    assert [tag for tag, _ in ran] == ["high", "soon", "late", "plain", "low"]


def test_a_preempted_worker_does_not_hoard_the_queue():
    """Each tick takes new work only up to a batch in hand (taken tasks cannot be stolen),
    so with long CPU-bound tasks a worker never holds more than a batch of them."""
    with Pool(CPUS[:1], slice_ms=5, preempt="bpf") as pool:
        futs = [pool.submit(spin, 0.02) for _ in range(150)]
        most = 0
        while not all(f.done() for f in futs):
            most = max(most, pool.stats()["workers"][0]["running"])
            time.sleep(0.01)
        [f.result(T) for f in futs]
    assert 0 < most <= 64


@pytest.mark.parametrize("preempt", ["bpf", "timer"])
def test_a_sleeper_beside_a_hog_wakes_within_slices(preempt):
    """The bench's pair (xhagent.bench.pool_preempt) for 3 s: a task sleeping 5 ms
    beside a pure-Python hog on one worker runs again within a few slices of its due time,
    not at the hog's end, and costs the hog little. 3 s, not less: the hog's rate per CPU
    second varies by itself (-0.07..+0.09 of the bound's measure in 1.2 s runs on a slow
    machine of this kind, -0.03..+0.06 in 3 s ones), and the bound is on the cost, not on
    the noise."""
    from xhagent.bench.pool_preempt import measure_source

    m = measure_source(preempt, 3.0, CPUS[0], 10.0)
    assert m["source"] == preempt
    lat = sorted(m["lat"])
    assert len(lat) > 20, lat
    # 5 slices: room for other processes on this CPU; without preemption: the hog's 3 s
    assert lat[len(lat) // 2] < 0.05 and lat[-1] < 0.3, lat
    assert m["loss_cpu"] < 0.1, m["loss_cpu"]


def test_a_task_queued_behind_a_long_one_still_gets_a_slice():
    """A worker that has learnt its tasks are long takes few at a time, but a tick still
    takes a task queued behind a running hog into the time slicing."""
    with Pool(CPUS[:1], slice_ms=5, preempt="bpf") as pool:
        [f.result(T) for f in [pool.submit(spin, 0.02) for _ in range(10)]]
        hog = pool.submit(spin, 0.6)
        time.sleep(0.1)  # the hog has the CPU, the feeder no turn
        _, quick_ran = pool.submit(stamp, "quick").result(T)
        _, hog_end = hog.result(T)
    assert quick_ran < hog_end


def napping(seconds):
    rt.sleep(seconds)  # parks: its context stays bound meanwhile
    return os.getpid()


def test_autoscaling_grows_the_workers_context_cap_under_waits_and_shrinks_it_idle():
    """One worker, at most 2 task contexts to start with: 300 tasks that each park 20 ms.
    Parked tasks leave nothing runnable while others wait for a context, so the cap grows
    at once (the valve) up to max; idle afterwards, it comes back down by halves."""
    scale = {"window_s": 0.05, "cooldown_s": 0.05, "interval_s": 0.02, "shrink_factor": 0.5}
    with Pool(CPUS[:1], min_contexts=1, max_contexts=200, autoscale=scale) as pool:
        start = time.monotonic()
        pids = set(pool.map(napping, [0.02] * 300, timeout=T))
        took = time.monotonic() - start
        grown = pool.stats()["workers"][0]
        # idle, the feeder looks once per 0.5 s futex wait, and shrinks a step a look
        deadline = time.monotonic() + T
        while (shrunk := pool.stats()["workers"][0])["contexts_cap"] > 2:
            assert time.monotonic() < deadline, ("the cap stayed up", grown, shrunk)
            time.sleep(0.1)
        idle_for = time.monotonic() - start - took
    assert pids == {pool.workers[0].pid}
    assert grown["contexts_cap"] > 2 and grown["autoscale_changes"] >= 1, grown
    # 300 naps of 20 ms, 2 at a time, would take 3 s
    assert took < 2.5, (took, grown)
    assert shrunk["autoscale_changes"] > grown["autoscale_changes"]
    assert shrunk["contexts_live"] <= 2 < grown["contexts_live"]
    print(f"took {took:.2f} s, grown {grown}, back down after {idle_for:.1f} s: {shrunk}")


def test_a_bad_context_configuration_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match="min_contexts must be a whole number"):
        Pool(CPUS[:1], min_contexts=-1)
    with pytest.raises(ValueError, match="min <= max"):
        Pool(CPUS[:1], min_contexts=5, max_contexts=2)
    with pytest.raises(ValueError, match="unknown threshold.*bogus"):
        Pool(CPUS[:1], autoscale={"bogus": 1})
    with pytest.raises(ValueError, match="window_s must be a finite number"):
        Pool(CPUS[:1], autoscale={"window_s": -1})


CLIENT = r"""
import json, math, operator, os, sys, time
from xhagent.runtime.clients import PoolClient

address, case = json.loads(sys.argv[1]), sys.argv[2]
out = {"pid": os.getpid()}
with PoolClient(address) as client:
    if case == "relayed":  # no reply fd in the ids: every outcome through the owner
        client._base &= ~(0xFF << 32)
    if case in ("results", "relayed"):
        futs = [client.submit(math.factorial, i) for i in range(1000)]
        out["ok"] = all(f.result(60) == math.factorial(i) for i, f in enumerate(futs))
        err = client.submit(operator.truediv, 1, 0).exception(60)
        out["error"] = [type(err).__name__, str(err)]
        out["pids"] = sorted({f.result(60) for f in [client.submit(os.getpid) for _ in range(200)]})
        out["map"] = client.map(abs, range(-5, 0), timeout=60)
        out["kw"] = client.submit(int, "ff", base=16).result(60)
    elif case == "unclaimed":  # a task the test takes off the ring as a dying worker would
        fut = client.submit(math.factorial, 5)
        print("submitted", flush=True)
        err = fut.exception(60)
        out["error"] = [type(err).__name__, str(err)]
        out["after"] = client.submit(math.factorial, 4).result(60)  # later tasks still run
    else:  # a task that runs until its worker is killed, or the pool closed
        fut = client.submit(time.sleep, 120)
        print("submitted", flush=True)
        err = fut.exception(120)
        out["error"] = [type(err).__name__, str(err)]
print(json.dumps(out), flush=True)
"""


def run_client(pool, case):
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(pool.address), case],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("how", ["results", "relayed"])
def test_another_process_submits_with_futures(how):
    """`results`: the workers push the outcomes to the client; `relayed`: the ids name no
    reply region, and the owner passes every outcome on."""
    with Pool(CPUS) as pool:
        proc = run_client(pool, how)
        got = json.loads(proc.communicate(timeout=T)[0])
        assert proc.returncode == 0
        assert got["ok"] is True and got["kw"] == 255 and got["map"] == [5, 4, 3, 2, 1]
        assert got["error"] == ["ZeroDivisionError", "division by zero"]
        assert set(got["pids"]) <= {w.pid for w in pool.workers} and got["pids"]
        assert pool.stats()["pending"] == 0  # none of it was the owner's
        wait_for(lambda: not pool._relay.clients, "the client's bye")
        routed = pool._relay.routed
        assert routed == 0 if how == "results" else routed == 1000 + 1 + 200 + 1 + 5
        assert not pool._claims  # every claim dropped, by the ends the workers reported


def test_a_clients_task_on_a_killed_worker_fails_with_worker_lost():
    with Pool(CPUS) as pool:
        proc = run_client(pool, "lost")
        assert proc.stdout.readline().strip() == "submitted"

        def running():
            return [w for w in pool.workers if pool.stats()["workers"][w.index]["running"]]

        wait_for(running, "the client's task to run")
        (victim,) = running()
        os.kill(victim.pid, signal.SIGKILL)
        got = json.loads(proc.communicate(timeout=T)[0])
        kind, msg = got["error"]
        assert kind == "WorkerLost" and f"pid {victim.pid}" in msg, got
        assert "died with signal 9" in msg
        if len(CPUS) > 1:
            assert pool.submit(square, 7).result(T) == 49  # the pool goes on


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two workers")
def test_a_clients_task_taken_but_unclaimed_by_a_dead_worker_fails():
    """As the owner's own case above, for another process's task: nobody but the dead
    worker ever knew of it; the owner, once the pool is quiet, tells the client when."""
    with Pool(CPUS) as pool:
        for w in pool.workers:
            os.kill(w.pid, signal.SIGSTOP)
        dead, other = pool.workers
        try:
            proc = run_client(pool, "unclaimed")
            assert proc.stdout.readline().strip() == "submitted"
            q = SharedQueues.attach(pool._q.fd)
            assert q.pop_global() is not None  # taken, and never claimed
            q.close()
            os.kill(dead.pid, signal.SIGKILL)
        finally:
            os.kill(other.pid, signal.SIGCONT)
        got = json.loads(proc.communicate(timeout=T)[0])
        kind, msg = got["error"]
        assert kind == "WorkerLost" and "before reporting it" in msg, got
        assert f"pid {dead.pid}" in msg and "died with signal 9" in msg
        assert got["after"] == 24
        assert pool.stats()["pending"] == 0


def test_a_clients_outstanding_task_fails_when_the_pool_closes():
    pool = Pool(CPUS[:1])
    proc = run_client(pool, "closed")
    assert proc.stdout.readline().strip() == "submitted"
    wait_for(lambda: pool.stats()["workers"][0]["running"] == 1, "the client's task to run")
    pool.close(timeout=1)
    got = json.loads(proc.communicate(timeout=T)[0])
    assert got["error"][0] == "PoolClosed" and "the pool was closed" in got["error"][1]


def test_a_bad_address_is_refused_clearly(tmp_path):
    from xhagent.runtime.clients import ClientError, PoolClient

    junk = tmp_path / "junk"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(ClientError, match="not an xhagent run-queue region"):
        PoolClient((str(junk), str(junk), os.getpid()))
    with pytest.raises(ClientError, match="No such file"):
        PoolClient((str(tmp_path / "none"), str(junk), os.getpid()))
    with pytest.raises(ClientError, match="pool address"):
        PoolClient("nonsense")
