"""Slice preemption measured on a real Pool: a latency task beside a CPU hog on one worker.

The pair: a pure-Python hog that never yields, and a task that sleeps 5 ms
(`runtime.sleep`) and notes how late it ran (wake-to-run latency: when it runs again
minus when its sleep was due), both on the same worker (a pool of one CPU), in the same
priority class. Without preemption the latency task would wait for the hog's end; with
it, it runs at the next slice boundary. Measured for each signal source, BPF and the
CPU-time timer, each in a pool of its own:

  * preempt_p99_vs_slice_<source>: p99 wake-to-run latency / slice (target <= 2.0);
  * preempt_hog_loss: 1 - the hog's throughput beside the latency task / alone (target
    <= 0.03), the worse of the two sources. One run, two conditions: the latency task
    runs in odd 100 ms windows and sleeps through even ones, and each odd window's rate
    is compared with its even neighbours' (the median over windows). Throughput is loop
    iterations per CPU second of the worker's thread, which is what the latency task and
    the switches take from the hog; per wall second (`hog_loss` in `cases`) it also
    counts the time other processes take the worker's CPU, which on a shared machine
    (`worker_cpu_share` < 1) is noise larger than the loss. On a CPU of its own the two
    agree.

The wake-to-run latency is wall time: where other processes share the worker's CPU, a
slice of CPU time takes longer than the slice (`worker_cpu_share` says how much).

The baseline is asyncio with the same pair on one event loop: its hog, which never
awaits, starves the latency task until it ends (`asyncio_wake_p99_us_beside_hog`).

    from xhagent.bench.pool_preempt import cases
    cases(quick=True)  # {"cases": {...}, "ratios": {...}, "baseline": {...}}
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time

SLICE_MS = 10.0
PERIOD = 0.005  # the latency task's sleep
WINDOW = 0.1  # seconds: the latency task runs in odd windows, sleeps through even ones
CHUNK = 200  # hog iterations between two looks at the clock


def hog(start: float, end: float, window: float = WINDOW) -> list:
    """Count in pure Python until `end`. Per `window` after `start` (on time.monotonic,
    which every process shares): (iterations, wall seconds, CPU seconds of this thread)
    of the chunks begun in it, or None if the hog never ran in it."""
    clock, floor, cpu = time.monotonic, math.floor, time.thread_time
    windows = max(1, math.ceil((end - start) / window))
    counts, marks = [0] * windows, [None] * windows
    n, last = 0, -1
    while (now := clock()) < end:
        k = floor((now - start) / window)
        if k != last and k >= 0:
            marks[k], last = (now, cpu()), k  # the clocks only here: they cost a syscall
        for _ in range(CHUNK):
            n += 1
        if k >= 0:
            counts[k] += CHUNK
    marks.append((clock(), cpu()))
    out = []
    for k in range(windows):
        nxt = next((m for m in marks[k + 1 :] if m is not None), None)
        if marks[k] is None or nxt is None:
            out.append(None)
        else:
            out.append((counts[k], nxt[0] - marks[k][0], nxt[1] - marks[k][1]))
    return out


def waker(start: float, end: float, window: float = WINDOW, period: float = PERIOD):
    """Until `end`: in odd windows after `start`, sleep `period` again and again; through
    even windows, one sleep to the next odd one (no sleep crosses into an even window).
    Each wake-to-run latency in seconds."""
    from ..runtime import api as rt

    lat, clock, floor = [], time.monotonic, math.floor
    while True:
        now = clock()
        k = floor((now - start) / window)
        if k % 2 == 1 and now + period <= start + (k + 1) * window:
            due = now + period
        else:
            due = start + max(1, k + 1 + (k % 2 == 1)) * window  # the next odd window
        if due >= end:
            return lat
        rt.sleep(due - now)
        lat.append(clock() - due)


def _pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank): with 100 samples, p99 is the second largest."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def hog_loss(windows: list, clock: int) -> tuple[float, float, float]:
    """From the hog's windows: 1 - (its rate in an odd window / the mean of its rates in the
    two even neighbours), the median over odd windows; and its mean rates in odd and in
    even windows. Rates are per wall second (clock 1) or per CPU second of the worker
    thread (clock 2). Neighbours, because this machine's speed drifts over seconds by more
    than the loss; the median, because a window in which another process took the CPU
    is an outlier."""

    def rate(k):
        w = windows[k]
        return w[0] / w[clock] if w is not None and w[clock] > 0 else None

    # the first window starts with the hog's own start; the last is cut short by `end`
    rates = [rate(k) for k in range(len(windows) - 1)]
    rates[0] = None
    pairs = [
        (rates[k], (rates[k - 1] + rates[k + 1]) / 2)
        for k in range(1, len(rates) - 1, 2)
        if None not in (rates[k - 1], rates[k], rates[k + 1])
    ]
    if len(pairs) < 3:
        raise RuntimeError(f"the hog ran in too few windows to compare: {windows}")
    loss = 1 - statistics.median(odd / even for odd, even in pairs)
    return loss, statistics.mean(p[0] for p in pairs), statistics.mean(p[1] for p in pairs)


def measure_source(mode: str, duration: float, cpu: int, slice_ms: float) -> dict:
    """One pool of one worker with preemption `mode`; the hog and the latency task on it
    for `duration` seconds."""
    from ..runtime.pool import Pool

    with Pool([cpu], slice_ms=slice_ms, preempt=mode) as pool:
        source = pool.stats()["workers"][0]["preempt"]
        warm = time.monotonic()
        pool.submit(hog, warm, warm + 0.2).result()  # imports, contexts
        start = time.monotonic() + 0.05  # both tasks are running by then
        end = start + duration
        h = pool.submit(hog, start, end)
        w = pool.submit(waker, start, end)
        windows, lat = h.result(), w.result()
    if not lat:
        raise RuntimeError(f"preempt={mode}: the latency task never ran beside the hog")
    loss, beside, alone = hog_loss(windows, 1)
    loss_cpu, beside_cpu, alone_cpu = hog_loss(windows, 2)
    return {
        "source": source,
        "lat": lat,
        "loss": loss,
        "beside": beside,
        "alone": alone,
        "loss_cpu": loss_cpu,
        "cpu_share": sum(w[2] for w in windows if w) / sum(w[1] for w in windows if w),
    }


def asyncio_pair(duration: float) -> dict:
    """The same pair on one asyncio loop, the latency task sleeping `PERIOD` again and again
    while the hog counts for `duration`: its wake-to-run latencies."""
    lat: list[float] = []

    async def a_waker(end):
        clock = time.monotonic
        while clock() + PERIOD < end:
            due = clock() + PERIOD
            await asyncio.sleep(PERIOD)
            lat.append(clock() - due)

    async def a_hog(start, end):
        return hog(start, end)

    async def main():
        start = time.monotonic()
        w = asyncio.create_task(a_waker(start + duration))
        await asyncio.sleep(0)  # the latency task is asleep when the hog starts
        windows, _ = await asyncio.gather(a_hog(start, start + duration), w)
        return windows

    done = [w for w in asyncio.run(main()) if w is not None]
    return {"lat": lat, "hog_rate": sum(w[0] for w in done) / sum(w[1] for w in done)}


def _idle_ticks() -> dict[int, int]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                out[int(name[3:])] = int(fields[3]) + int(fields[4])  # idle + iowait
    return out


def quietest_cpu(seconds: float = 0.3) -> int:
    """The allowed CPU that other processes used least over `seconds` (/proc/stat): a
    latency measured in wall time counts every other process that shares the worker's CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    before = _idle_ticks()
    time.sleep(seconds)
    after = _idle_ticks()
    return max(allowed, key=lambda c: (after.get(c, 0) - before.get(c, 0), c))


def _lat_case(lat: list[float], seconds: float, **extra) -> dict:
    return {
        "ops_per_s": round(len(lat) / seconds, 1),  # wakes
        "p50_us": round(_pct(lat, 50) * 1e6, 1),
        "p99_us": round(_pct(lat, 99) * 1e6, 1),
        "max_us": round(max(lat) * 1e6, 1),
        "samples": len(lat),
        **extra,
    }


def cases(quick: bool = False, slice_ms: float = SLICE_MS, cpu: int | None = None) -> dict:
    """Run the preemption cases on `cpu` (the quietest allowed one by default): `cases`,
    `ratios` and `baseline` as `xhagent bench pool` reports them. ~20 s; `quick` ~6 s."""
    duration = 2.0 if quick else 6.0
    if cpu is None:
        cpu = quietest_cpu()
    out_cases, ratios, losses = {}, {}, []
    for mode in ("bpf", "timer"):
        try:
            m = measure_source(mode, duration, cpu, slice_ms)
        except OSError as exc:
            # A node without BPF (not root, no BTF) still gets the timer's figures; the
            # BPF ones say why there are none.
            if mode != "bpf":
                raise
            out_cases["preempt_bpf"] = {"error": str(exc)}
            ratios["preempt_p99_vs_slice_bpf"] = None
            continue
        if m["source"] != mode:
            raise RuntimeError(f"preempt={mode} gave a worker preempted by {m['source']}")
        losses.append(m["loss_cpu"])
        out_cases[f"preempt_{mode}"] = _lat_case(
            m["lat"],
            duration,
            slice_ms=slice_ms,
            hog_loss=round(m["loss"], 4),
            hog_loss_per_cpu_s=round(m["loss_cpu"], 4),
            hog_ops_per_s_beside=round(m["beside"]),
            hog_ops_per_s_alone=round(m["alone"]),
            worker_cpu_share=round(m["cpu_share"], 3),
        )
        ratios[f"preempt_p99_vs_slice_{mode}"] = round(_pct(m["lat"], 99) * 1e3 / slice_ms, 3)
    ratios["preempt_hog_loss"] = round(max(losses), 4)
    a = asyncio_pair(duration)
    out_cases["asyncio_beside_hog"] = _lat_case(
        a["lat"], duration, hog_ops_per_s=round(a["hog_rate"])
    )
    return {
        "cases": out_cases,
        "ratios": ratios,
        "baseline": {"asyncio_wake_p99_us_beside_hog": out_cases["asyncio_beside_hog"]["p99_us"]},
        "targets": {
            "preempt_p99_vs_slice_bpf": "<= 2.0",
            "preempt_p99_vs_slice_timer": "<= 2.0",
            "preempt_hog_loss": "<= 0.03",
        },
        "setup": {
            "cpu": cpu,
            "slice_ms": slice_ms,
            "period_ms": PERIOD * 1e3,
            "duration_s": duration,
            "window_s": WINDOW,
        },
    }


if __name__ == "__main__":
    import json
    import sys

    # The tasks must travel as xhagent.bench.pool_preempt.*, not __main__.*
    from xhagent.bench.pool_preempt import cases as run

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
