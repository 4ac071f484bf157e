"""`xhagent bench pool`: the worker pool against what a Python user would pick instead, in one
run on the same machine; JSON `cases.NAME.{ops_per_s,p50_us,p99_us}`, `ratios.NAME` with each
ratio's target in `targets` and the verdict in `targets_met`.

Every case runs in rounds, the baseline's taken by turns with ours (both sides of a ratio
see the same spells of a shared machine); `ops_per_s` is all ops over all rounds' time,
`p50_us`/`p99_us` are percentiles of the per-op time of each round (round time / ops in
it): the spread between rounds, which on a shared machine is mostly its noise. A ratio
compares the median rounds (p50_us), which one stalled round does not move.

- spawn_vs_asyncio: inside one pool worker (one core), a task spawns 200k trivial subtasks,
  then joins them all; asyncio's create_task + gather of as many of the same coroutine, in
  the same worker process.
- switch_vs_asyncio: `async def` tasks that each await `yield_async()` 10 times against
  asyncio tasks that await sleep(0) 10 times (the same coroutine on both sides), at 20k
  tasks at once (the figure; 5k with --quick) and at 1 task. Plain-function tasks calling
  `yield_()` (a greenlet switch each) are timed in the same rounds (`switch_plain`, their
  ratio in `details.switch`), and raw greenlet switching at the same count as the floor
  under any greenlet scheduler.
- submit_vs_processpool: 2 workers, tasks submitted one by one with a future each, all
  results gathered, by another process (a PoolClient: results come back through the
  pool's owner), against ProcessPoolExecutor(2).submit; the owner submitting the same
  rounds is reported beside it (submit_owner).
- map_vs_mp_pool: Pool.map against multiprocessing.Pool(2).imap_unordered, chunksize 64.
- scaling_2_vs_1: ~1 ms CPU-bound tasks on 2 workers against 1.
- imbalanced_vs_balanced: tasks queued by one worker on its own ring (Pool.fan_out: the
  other steals them) against the same tasks submitted to the global ring; completion time
  ratio. Steal latency (from a worker's look for work to a stolen task in hand) beside it.
- memory: RSS per idle worker, bytes per parked context (a task Blocked on its context),
  contexts made during a 100k-task run after warm-up (0: they are reused).
- preempt_* and io_tasks_vs_engine come from pool_preempt and pool_io when present.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from functools import partial

import click

from ..runtime import api as _rt

TARGETS = {
    "spawn_vs_asyncio": (">=", 5.0),
    "switch_vs_asyncio": (">=", 3.0),
    "submit_vs_processpool": (">=", 10.0),
    "map_vs_mp_pool": (">=", 1.0),
    "scaling_2_vs_1": (">=", 1.8),
    "imbalanced_vs_balanced": ("<=", 1.15),
    "preempt_p99_vs_slice_bpf": ("<=", 2.0),
    "preempt_p99_vs_slice_timer": ("<=", 2.0),
    "preempt_hog_loss": ("<=", 0.03),
    "io_tasks_vs_engine": (">=", 0.7),
}
STEAL_P99_US = 1000.0
YIELDS = 10
CPU_TASK_S = 0.001
STEAL_TASK_S = 0.0002
# Full and --quick sizes.
SIZES = {
    False: {
        "spawn": (3, 200_000),  # rounds, ops per round: 200k subtasks spawned, then joined
        "switch": (4, 20_000),  # rounds, tasks yielding at once
        "switch_one": (10, 2_000),
        "submit": (10, 10_000),
        "map": (5, 40_000),
        "scaling": 300,
        "steal": (5, 2_000),
        "parked": 10_000,
    },
    True: {
        "spawn": (3, 20_000),
        "switch": (2, 5_000),
        "switch_one": (3, 1_000),
        "submit": (3, 2_500),
        "map": (3, 10_000),
        "scaling": 40,
        "steal": (3, 300),
        "parked": 2_000,
    },
}
# module -> its key in the report's `details` and `baseline` (the modules' names before they
# moved to xhagent.bench, kept so the report reads as before), the ratios it provides
EXTERNAL = {
    "xhagent.bench.pool_preempt": (
        "bench_preempt",
        ("preempt_p99_vs_slice_bpf", "preempt_p99_vs_slice_timer", "preempt_hog_loss"),
    ),
    "xhagent.bench.pool_io": ("bench_io", ("io_tasks_vs_engine",)),
}


def summarize(round_s: list[float], ops_per_round: int | list[int]) -> dict:
    """A case's figures from its rounds' durations (seconds) and ops per round."""
    ops = ops_per_round if isinstance(ops_per_round, list) else [ops_per_round] * len(round_s)
    per_op = sorted(s / n * 1e6 for s, n in zip(round_s, ops, strict=True))

    def pct(q: float) -> float:
        return round(per_op[min(len(per_op) - 1, int(q * len(per_op)))], 3)

    return {
        "ops_per_s": round(sum(ops) / sum(round_s)),
        "p50_us": pct(0.5),
        "p99_us": pct(0.99),
        "rounds": len(round_s),
        "ops": sum(ops),
    }


# -- run inside a pool worker (submitted by reference) ----------------------------------------
def _trivial():
    return 1


async def _atrivial():
    return 1


def _yielder():
    yield_ = _rt.yield_  # a module attribute, as asyncio's side reads asyncio.sleep
    for _ in range(YIELDS):
        yield_()


async def _coro_yielder():
    yield_async = _rt.yield_async
    for _ in range(YIELDS):
        await yield_async()


async def _ayielder():
    sleep = asyncio.sleep
    for _ in range(YIELDS):
        await sleep(0)


def _rt_round(fn, n: int) -> float:
    from xhagent.runtime.api import spawn

    t = time.perf_counter()
    handles = [spawn(fn) for _ in range(n)]
    for h in handles:
        h.join()
    return time.perf_counter() - t


def _asyncio_round(loop, coro_fn, n: int) -> float:
    async def main():
        t = time.perf_counter()
        await asyncio.gather(*[asyncio.create_task(coro_fn()) for _ in range(n)])
        return time.perf_counter() - t

    return loop.run_until_complete(main())


def _pair_rounds(fn, coro_fn, rounds: int, n: int, repeat: int = 1, collect=False) -> dict:
    """Rounds of ours and asyncio's, interleaved, after one warm-up round each. `repeat`
    rounds of n tasks are timed as one (for n=1, where a round is too short to time).
    `collect`: each round starts from a collected heap (gc.collect() before it, untimed)."""
    loop = asyncio.new_event_loop()
    try:
        _rt_round(fn, n)
        _asyncio_round(loop, coro_fn, n)
        gc.collect()
        ours, theirs = [], []
        for _ in range(rounds):
            if collect:
                gc.collect()
            ours.append(sum(_rt_round(fn, n) for _ in range(repeat)))
            if collect:
                gc.collect()
            theirs.append(sum(_asyncio_round(loop, coro_fn, n) for _ in range(repeat)))
    finally:
        loop.close()
    return {"runtime": ours, "asyncio": theirs}


def worker_spawn(rounds: int, n: int) -> dict:
    return _pair_rounds(_trivial, _atrivial, rounds, n)


def worker_switch(rounds: int, n: int, repeat: int = 1, plain: bool = False) -> dict:
    """`plain`: plain-function tasks calling yield_(), else async def tasks."""
    # Collected before each round: with 20k tasks alive across a round, the collector's
    # full passes (which walk every live task, coroutine and context) otherwise land in
    # every other round, ours or asyncio's alike, and the rounds alternate ~40% apart.
    try:
        fn = _yielder if plain else _coro_yielder
        return _pair_rounds(fn, _ayielder, rounds, n, repeat, collect=True)
    finally:
        worker_trim()


def worker_greenlet_floor(rounds: int, n: int) -> list[float]:
    """n greenlets switching straight from one to the next, YIELDS times each: no
    scheduling decision at all, the cost of the switches alone at that count."""
    from greenlet import getcurrent, greenlet

    home = getcurrent()
    out = []
    for _ in range(rounds + 1):
        ring: list = []

        def body(i, ring=ring):
            home.switch()
            nxt = ring[(i + 1) % n]
            for _ in range(YIELDS):
                nxt.switch()
            home.switch()

        ring.extend(greenlet(body) for _ in range(n))
        for i, g in enumerate(ring):
            g.switch(i)
        t = time.perf_counter()
        ring[0].switch()
        out.append(time.perf_counter() - t)
        for g in ring:  # end each (the first one back ended the round)
            if not g.dead:
                g.throw()
    return out[1:]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker_parked(n: int) -> dict:
    """RSS growth per task parked on its own context (Blocked), n of them at once."""
    from xhagent.runtime import scheduler
    from xhagent.runtime.api import spawn, yield_

    sched = scheduler._running
    gate = spawn(_nap, 3600.0)
    yield_()  # the gate is parked in its sleep before the waiters come
    gc.collect()
    before = _rss()
    waiters = [spawn(gate.join) for _ in range(n)]
    while sched.pool.parked < n + 1:
        yield_()
    after = _rss()
    gate.cancel()
    for w in waiters:
        try:
            w.join()
        except BaseException:
            pass
    worker_trim()
    return {"bytes_per_parked_context": round((after - before) / n), "parked_contexts": n}


def worker_trim() -> int:
    """End this worker's free contexts now, as its idle timeout would later: a case that
    leaves tens of thousands of them (parked or yielding tasks, one context each) would
    otherwise slow the collector, and so every case after it. How many were ended."""
    from xhagent.runtime import scheduler

    pool = scheduler._running.pool
    pool.trim()  # stamps the contexts released without a clock reading
    return pool.trim(pool.clock() + pool.idle_timeout)


def _nap(seconds: float) -> None:
    from xhagent.runtime.api import sleep

    sleep(seconds)


def small(x: int) -> int:
    return x + 1


def spin_for(iterations: int) -> int:
    x = 0
    for i in range(iterations):
        x += i
    return x


def spin_item(iterations: int, item: int) -> int:
    return spin_for(iterations) + item


# -- the owner's side ---------------------------------------------------------------------
def _calibrate(seconds: float) -> int:
    """Loop iterations of spin_for that take about `seconds` of CPU here."""
    n = 10_000
    while True:
        t = time.thread_time()
        spin_for(n)
        took = time.thread_time() - t
        if took > 0.02:
            return max(1, int(n * seconds / took))
        n *= 2


def _spin_pinned(cpu: int, iterations: int, times: int) -> None:
    os.sched_setaffinity(0, {cpu})
    for _ in range(times):
        spin_for(iterations)


def _machine_scaling(cpus: list[int], iterations: int, n: int) -> float:
    """Throughput of n spins in 2 pinned processes over 1: the ceiling under scaling_2_vs_1."""
    ctx = multiprocessing.get_context("fork")
    took: dict[int, float] = {}
    for _ in range(2):
        for k in (1, 2):  # by turns, best of two each
            procs = [
                ctx.Process(target=_spin_pinned, args=(c, iterations, n // k)) for c in cpus[:k]
            ]
            t = time.perf_counter()
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            took[k] = min(took.get(k, float("inf")), time.perf_counter() - t)
    return round(took[1] / took[2], 3)


def _ratio(ours: dict, theirs: dict) -> float:
    """Median round against median round: one round stalled by a noisy neighbour moves the
    mean (ops_per_s) but not this."""
    return round(theirs["p50_us"] / ours["p50_us"], 3)


def _submit_round(submit, n: int) -> float:
    """Seconds to submit n small tasks one by one and gather every result."""
    t = time.perf_counter()
    _gather([submit(small, i) for i in range(n)])
    return time.perf_counter() - t


class _ClientProcess:
    """Another process with a PoolClient of the pool, doing submit rounds on request."""

    def __init__(self, address):
        code = "from xhagent.bench.pool import client_rounds; client_rounds()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(address)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def round(self, n: int) -> float:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process exited ({self.proc.wait()})")
        return float(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def client_rounds() -> None:
    """The client process's side: a round of n submissions per line read, its seconds out."""
    from ..runtime.clients import PoolClient

    with PoolClient(json.loads(sys.argv[1])) as client:
        for line in sys.stdin:
            print(_submit_round(client.submit, int(line)), flush=True)


def _gather(futs) -> None:
    for f in futs:
        f.result(300)


def _rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _pool(cpus, progress):
    from xhagent.runtime.pool import Pool

    pool = Pool(cpus)
    progress(f"pool of {len(cpus)} worker(s) on cpus {cpus} (preemption: {_preempt(pool)})")
    return pool


def _preempt(pool) -> str:
    return ",".join(sorted({str(w["preempt"]) for w in pool.stats()["workers"]}))


def measure(quick: bool, progress) -> dict:
    size = SIZES[quick]
    cpus = sorted(os.sched_getaffinity(0))[:2]
    cases: dict = {}
    details: dict = {}
    memory: dict = {}
    out = {
        "benchmark": "pool",
        "quick": quick,
        "machine": {
            "cpus": os.cpu_count(),
            "cpus_used": cpus,
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpu_model": _cpu_model(),
        },
        "latency": "p50_us/p99_us: per-op time of each round (round time / its ops)",
        "ratio": "ours against the baseline, median round against median round (p50_us)",
        "cases": cases,
        "details": details,
        "memory": memory,
    }
    ratios: dict = {}

    with ExitStack() as stack:
        # The baselines' processes are forked first (before the pool's collector thread
        # exists) and kept up beside the pool: their rounds alternate with ours, so a slow
        # spell of a shared machine lands on both sides of a ratio.
        ex = stack.enter_context(ProcessPoolExecutor(2))
        _gather([ex.submit(small, i) for i in range(4)])
        mp = stack.enter_context(multiprocessing.get_context("fork").Pool(2))
        mp.map(small, range(4))
        pool = stack.enter_context(_pool(cpus, progress))
        time.sleep(0.5)  # the workers settle into their idle wait
        memory["rss_per_idle_worker_bytes"] = round(
            statistics.mean(_rss_of(w.pid) for w in pool.workers)
        )
        progress("memory: parked contexts")
        memory.update(pool.submit(worker_parked, size["parked"]).result(600))

        rounds, n = size["spawn"]
        progress(f"spawn+join: {rounds} x {n} subtasks in one worker, and asyncio's")
        r = pool.submit(worker_spawn, rounds, n).result(600)
        cases["spawn_join"] = summarize(r["runtime"], n)
        cases["spawn_join_asyncio"] = summarize(r["asyncio"], n)
        ratios["spawn_vs_asyncio"] = _ratio(cases["spawn_join"], cases["spawn_join_asyncio"])

        rounds, tasks = size["switch"]
        progress(f"switch: {tasks} tasks x {YIELDS} yields, and asyncio's")
        r = pool.submit(worker_switch, rounds, tasks).result(600)
        ops = tasks * YIELDS
        cases["switch"] = summarize(r["runtime"], ops)
        cases["switch_asyncio"] = summarize(r["asyncio"], ops)
        ratios["switch_vs_asyncio"] = _ratio(cases["switch"], cases["switch_asyncio"])
        # after the figure's rounds: the 20k contexts plain tasks leave made slow the GC of
        # all that came after them, asyncio's included
        r = pool.submit(worker_switch, rounds, tasks, 1, True).result(600)
        cases["switch_plain"] = summarize(r["runtime"], ops)
        cases["switch_plain_asyncio"] = summarize(r["asyncio"], ops)
        floor = pool.submit(worker_greenlet_floor, rounds, tasks).result(600)
        cases["switch_greenlet_floor"] = summarize(floor, ops)
        rounds, repeat = size["switch_one"]
        r = pool.submit(worker_switch, rounds, 1, repeat).result(600)
        cases["switch_1_task"] = summarize(r["runtime"], YIELDS * repeat)
        cases["switch_1_task_asyncio"] = summarize(r["asyncio"], YIELDS * repeat)
        details["switch"] = {
            "tasks": tasks,
            "yields_per_task": YIELDS,
            "what": "switch: async def tasks awaiting yield_async(), which hand their context"
            " over to the next coroutine task (no greenlet switch); switch_plain: plain-function"
            " tasks calling yield_(), a greenlet switch each",
            "plain_function_tasks_vs_asyncio": _ratio(
                cases["switch_plain"], cases["switch_plain_asyncio"]
            ),
            "vs_asyncio_at_1_task": _ratio(cases["switch_1_task"], cases["switch_1_task_asyncio"]),
            "greenlet_floor_vs_asyncio": _ratio(
                cases["switch_greenlet_floor"], cases["switch_asyncio"]
            ),
        }

        rounds, n = size["submit"]
        progress(
            f"submit: {rounds} x {n} tasks one by one from another process, from the owner,"
            " and ProcessPoolExecutor(2)'s"
        )
        client = stack.enter_context(_ClientProcess(pool.address))
        for submit in (client.round, partial(_submit_round, pool.submit)):
            submit(n)  # warm-up, the same run once
        _submit_round(ex.submit, n)
        before = [w["contexts"] for w in pool.stats()["workers"]]
        ours, owner, theirs = [], [], []
        for _ in range(rounds):
            ours.append(client.round(n))
            owner.append(_submit_round(pool.submit, n))
            theirs.append(_submit_round(ex.submit, n))
        after = [w["contexts"] for w in pool.stats()["workers"]]
        cases["submit"] = summarize(ours, n)
        cases["submit_owner"] = summarize(owner, n)
        cases["submit_processpool"] = summarize(theirs, n)
        ratios["submit_vs_processpool"] = _ratio(cases["submit"], cases["submit_processpool"])
        details["submit"] = {
            "submitter": "another process (runtime.clients.PoolClient)",
            "owner_vs_processpool": _ratio(cases["submit_owner"], cases["submit_processpool"]),
            "workers": 2,
        }
        memory["run_tasks"] = rounds * n
        memory["contexts_made_during_run"] = sum(after) - sum(before)

        rounds, n = size["map"]
        progress(f"map: {rounds} x {n} items, chunksize 64, and multiprocessing.Pool(2)'s")
        ours, theirs = [], []
        for _ in range(rounds + 1):
            t = time.perf_counter()
            pool.map(small, range(n), chunksize=64)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in mp.imap_unordered(small, range(n), chunksize=64):
                pass
            theirs.append(time.perf_counter() - t)
        cases["map"] = summarize(ours[1:], n)
        cases["map_mp_pool"] = summarize(theirs[1:], n)
        ratios["map_vs_mp_pool"] = _ratio(cases["map"], cases["map_mp_pool"])

        rounds, n = size["steal"]
        iters = _calibrate(STEAL_TASK_S)
        progress(
            f"stealing: {rounds} x {n} tasks of ~{STEAL_TASK_S * 1e3:g} ms, one ring vs spread"
        )
        pool.steal_latencies_ns()  # only this case's steals count
        bal, imb = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            _gather([pool.submit(spin_item, iters, i) for i in range(n)])
            bal.append(time.perf_counter() - t)
            t = time.perf_counter()
            _gather(pool.fan_out(partial(spin_item, iters), range(n)))
            imb.append(time.perf_counter() - t)
        steals = sorted(pool.steal_latencies_ns())
        cases["steal_balanced"] = summarize(bal, n)
        cases["steal_imbalanced"] = summarize(imb, n)
        ratios["imbalanced_vs_balanced"] = round(statistics.median(imb) / statistics.median(bal), 3)
        details["steal_latency"] = {
            "samples": len(steals),
            "p50_us": round(steals[len(steals) // 2] / 1e3, 1) if steals else None,
            "p99_us": round(steals[int(0.99 * len(steals))] / 1e3, 1) if steals else None,
            "what": "from a worker's look for work (own and global ring empty) to a stolen"
            " task in hand",
        }

    n = size["scaling"]
    iters = _calibrate(CPU_TASK_S)
    progress(f"scaling: {n} tasks of ~{CPU_TASK_S * 1e3:g} ms on 1 worker and on 2, by turns")
    setups = (("scaling_1_worker", cpus[:1]), ("scaling_2_workers", cpus))[: len(cpus)]
    with ExitStack() as stack:
        # Both pools up at once and their rounds taken by turns: a slow spell of a shared
        # machine then lands on both, not on whichever happened to run in it.
        pools = [(key, stack.enter_context(_pool(use, progress))) for key, use in setups]
        took: dict[str, list[float]] = {key: [] for key, _ in pools}
        for _key, pool in pools:
            _gather([pool.submit(spin_for, iters) for _ in range(8)])  # warm
        for _ in range(3):
            for key, pool in pools:
                t = time.perf_counter()
                _gather([pool.submit(spin_for, iters) for _ in range(n)])
                took[key].append(time.perf_counter() - t)
    for key, rounds_s in took.items():
        cases[key] = summarize(rounds_s, n)
    if len(cpus) >= 2:
        ratios["scaling_2_vs_1"] = _ratio(cases["scaling_2_workers"], cases["scaling_1_worker"])
        details["scaling"] = {
            "machine_2_vs_1": _machine_scaling(cpus, iters, n),
            "what": "machine_2_vs_1: the same work in 2 plain processes pinned to the 2 CPUs"
            " against 1, in this run: what this machine gives two busy CPUs at once",
        }
    else:
        ratios["scaling_2_vs_1"] = None
        details["scaling_2_vs_1"] = "not measured: one CPU allowed"

    for module, (key, names) in EXTERNAL.items():
        _merge(out, ratios, module, key, names, quick, progress)

    out["ratios"] = ratios
    out["targets"] = {k: {"op": op, "value": v} for k, (op, v) in TARGETS.items()}
    out["targets"]["steal_p99_us"] = {"op": "<", "value": STEAL_P99_US}
    out["targets"]["contexts_made_during_run"] = {"op": "==", "value": 0}
    met = {}
    for name, (op, value) in TARGETS.items():
        got = ratios.get(name)
        met[name] = None if got is None else (got >= value if op == ">=" else got <= value)
    p99 = details["steal_latency"]["p99_us"]
    met["steal_p99_us"] = None if p99 is None else p99 < STEAL_P99_US
    met["contexts_made_during_run"] = memory["contexts_made_during_run"] == 0
    out["targets_met"] = met
    return out


def _merge(out: dict, ratios: dict, module: str, key: str, names, quick: bool, progress) -> None:
    """Fold another bench module's cases into the report, its other figures under `key`; its
    ratios are null with the reason when the module is absent (built on another branch) or
    fails."""
    if importlib.util.find_spec(module) is None:
        for name in names:
            ratios[name] = None
            out["details"][name] = "not built"
        return
    progress(key)
    try:
        got = importlib.import_module(module).cases(quick)
    except Exception as exc:  # its failure is reported, the rest of the bench stands
        for name in names:
            ratios[name] = None
            out["details"][name] = f"failed: {type(exc).__name__}: {exc}"
        return
    out["cases"].update(got.get("cases", {}))
    for name in names:
        ratios[name] = got.get("ratios", {}).get(name)
    if got.get("baseline") is not None:
        out.setdefault("baseline", {})[key] = got["baseline"]
    for k, v in got.items():
        if k not in ("cases", "ratios", "baseline"):
            out["details"].setdefault(key, {})[k] = v


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _table(report: dict) -> str:
    lines = []
    for name, c in report["cases"].items():
        if isinstance(c, dict) and "ops_per_s" in c:
            lines.append(f"{name:28} {c['ops_per_s']:>12,} ops/s  p50 {c['p50_us']} us")
    for name, value in report["ratios"].items():
        op, target = TARGETS.get(name, ("", ""))
        met = report["targets_met"].get(name)
        verdict = "n/a" if met is None else ("ok" if met else "MISSED")
        lines.append(f"{name:28} {value!s:>12}  target {op} {target}  {verdict}")
    lines.append(f"memory: {json.dumps(report['memory'])}")
    return "\n".join(lines)


@click.command("pool")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--quick", is_flag=True, help="Smaller rounds: a shape check in seconds, noisier.")
def bench_pool(as_json: bool, quick: bool) -> None:
    """The worker pool against asyncio, ProcessPoolExecutor and multiprocessing.Pool: spawn,
    switch, submit, map, scaling, stealing, memory."""

    def progress(msg: str) -> None:
        click.echo(f"bench pool: {msg}", err=True)

    try:
        report = measure(quick, progress)
    except Exception as exc:
        click.echo(f"xhagent bench pool: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    click.echo(json.dumps(report, indent=2) if as_json else _table(report))
