"""`xhagent bench io`: the engine against what a Python user would write instead, on the same
file and the same random 4 KiB offsets, in one run; JSON with ops/s, p50/p99 and ratios."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

import click

from .. import quantity
from ..cgroups.mounts import discover_hierarchy
from ..cliparams import FiniteFloat
from ..fdlimit import room_for_fds
from ..io.aio import AsyncRing
from ..io.batch import RwStream
from ..io.buffers import AlignedBuffer
from ..io.direct import DirectFile
from ..io.files import FileReader, read_file_loop
from ..io.ring import Ring
from ..io.sampler import TRIALS, Sampler

BLOCK = 4096
CHUNK = 256  # os.pread loop: ops between two clock reads
QD = 32
BATCH = 1024  # ops per engine call: Python runs between two calls while the queue drains
SLOTS = (
    2 * QD
)  # the engine's destination: one 4 KiB slot per op in flight (256 KiB, in L2), as fio's buffers
FIO_PAIRS = 3  # engine and fio runs each, alternating
CGROUP_FILES = (
    "cgroup.procs",
    "cgroup.events",
    "cgroup.stat",
    "cpu.stat",
    "cpu.weight",
    "cpu.max",
    "cpu.pressure",
    "memory.current",
    "memory.max",
    "memory.stat",
    "memory.events",
    "memory.pressure",
    "io.stat",
    "io.weight",
    "io.pressure",
    "pids.current",
    "pids.max",
    "cgroup.freeze",
    "cgroup.type",
    "cgroup.controllers",
)
FILE_SETS = ("tree", "proc", "cgroupfs", "cgroup")
BENCH_GROUPS = 16  # the cgroup set: this many groups of the bench's own, every readable file
SAMPLER_RUNS = 3  # the loop, its kept-open peer and the Sampler take turns, this many each


def parse_size(text: str) -> int:
    """`--size`: bytes by the agent's one rule (`xhagent.quantity`: `1G` = 10**9, `1Gi` =
    2**30, `256MiB`, `4096`), at least 1 MiB; ValueError with the reason otherwise."""
    value = quantity.parse_size(text, forms="256Mi, 1G or 1073741824")
    if value < quantity.MiB:
        raise ValueError(f"size {text!r}: at least 1Mi (1048576 bytes)")
    return value


def summarize(ops: int, seconds: float, lat_ns) -> dict:
    """ops/s and the p50/p99 latency of one case (lat_ns: per-op nanoseconds)."""
    lat = sorted(lat_ns)
    pick = (
        (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] / 1000, 2))
        if lat
        else (lambda q: None)
    )
    return {
        "ops_per_s": round(ops / seconds, 1) if seconds > 0 else 0.0,
        "ops": ops,
        "p50_us": pick(0.50),
        "p99_us": pick(0.99),
    }


def ratios(cases: dict) -> dict:
    """Named ratios of the cases present; higher is better except *_p50_ratio (lower is better)."""

    def ops(a, b):
        if a in cases and b in cases and cases[b]["ops_per_s"]:
            return round(cases[a]["ops_per_s"] / cases[b]["ops_per_s"], 3)
        return None

    def cpu_ops(a, b):
        """Per CPU second of the calling thread, where both cases did all their work in it
        (no io-wq worker): a shared machine's other load then does not decide the ratio."""
        if a in cases and b in cases and cases[b].get("ops_per_cpu_s"):
            return round(cases[a]["ops_per_cpu_s"] / cases[b]["ops_per_cpu_s"], 3)
        return None

    def p50(a, b):
        if a in cases and b in cases and cases[b]["p50_us"]:
            return round(cases[a]["p50_us"] / cases[b]["p50_us"], 3)
        return None

    named = {
        "pagecache_engine_qd32_vs_pread": ops("pagecache_engine_qd32", "pagecache_pread"),
        "pagecache_engine_qd32_vs_threadpool": ops(
            "pagecache_engine_qd32", "pagecache_threadpool_qd32"
        ),
        "pagecache_asyncring_vs_threadpool": ops(
            "pagecache_asyncring_qd32", "pagecache_threadpool_qd32"
        ),
        "direct_engine_qd1_vs_pread": ops("direct_engine_qd1", "direct_pread"),
        "direct_engine_qd32_vs_pread": ops("direct_engine_qd32", "direct_pread"),
        "direct_engine_qd32_vs_fio": ops("direct_engine_qd32", "direct_fio_qd32"),
        "pagecache_engine_qd32_vs_fio_psync": ops("pagecache_engine_qd32", "pagecache_fio_psync"),
        "direct_iopoll_qd32_vs_interrupt_qd32": ops("direct_iopoll_qd32", "direct_engine_qd32"),
        "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": p50(
            "direct_iopoll_qd1", "direct_engine_qd1"
        ),
    }
    for name in FILE_SETS:  # read_files as shipped, each of its two ways forced, vs the loop
        for way in ("read_files", "uring", "syscalls"):
            named[f"files_{name}_{way}_vs_loop"] = ops(f"files_{name}_{way}", f"files_{name}_loop")
        # the kept-open Sampler vs reopening every file, and vs a kept-open Python pread loop
        named[f"files_{name}_sampler_vs_loop"] = cpu_ops(
            f"files_{name}_sampler", f"files_{name}_loop"
        )
        for way in ("sampler", "sampler_packed", "sampler_pread"):
            named[f"files_{name}_{way}_vs_kept_pread"] = cpu_ops(
                f"files_{name}_{way}", f"files_{name}_kept_pread"
            )
        # The ceiling of both Sampler ratios: a sample that re-reads every file in one C call
        # and builds nothing pays only the kernel's read of each file and its system call.
        for peer in ("loop", "kept_pread"):
            named[f"files_{name}_reread_vs_{peer}"] = cpu_ops(
                f"files_{name}_sampler_reread", f"files_{name}_{peer}"
            )
    return {k: v for k, v in named.items() if v is not None}


TARGETS = {  # ratio -> (bound, "min" or "max")
    "pagecache_engine_qd32_vs_pread": (1.0, "min"),
    "pagecache_engine_qd32_vs_threadpool": (20.0, "min"),
    "pagecache_asyncring_vs_threadpool": (5.0, "min"),
    "direct_engine_qd32_vs_pread": (2.0, "min"),
    "direct_engine_qd32_vs_fio": (0.95, "min"),
    "pagecache_engine_qd32_vs_fio_psync": (1.0, "min"),
    "files_tree_read_files_vs_loop": (2.0, "min"),
    "files_proc_read_files_vs_loop": (2.0, "min"),
    "files_tree_sampler_vs_loop": (3.0, "min"),
    "files_proc_sampler_vs_loop": (3.0, "min"),
    "files_cgroup_sampler_vs_loop": (3.0, "min"),
    "files_tree_sampler_vs_kept_pread": (1.2, "min"),
    "files_proc_sampler_vs_kept_pread": (1.2, "min"),
    "files_cgroup_sampler_vs_kept_pread": (1.2, "min"),
    "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": (1.0, "max"),
}


def targets_met(named: dict) -> dict:
    return {
        k: (named[k] >= bound if kind == "min" else named[k] <= bound)
        for k, (bound, kind) in TARGETS.items()
        if k in named
    }


# -- the cases ----------------------------------------------------------------------------
def _chunks(offsets: array, size: int = CHUNK):
    while True:
        for start in range(0, len(offsets), size):
            yield offsets[start : start + size]


def pread_loop(fd: int, offsets: array, seconds: float, buf=None) -> dict:
    """os.pread (or os.preadv into an aligned buffer for O_DIRECT); half the time untimed for
    ops/s, half with a clock read per op for the latencies."""
    read = (
        (lambda o: os.preadv(fd, [buf], o))
        if buf is not None
        else (lambda o: os.pread(fd, BLOCK, o))
    )
    ops, start = 0, time.perf_counter()
    end = start + seconds / 2
    for chunk in _chunks(offsets):
        for o in chunk:
            read(o)
        ops += len(chunk)
        if time.perf_counter() >= end:
            break
    elapsed = time.perf_counter() - start
    lat, now, end = array("Q"), time.perf_counter_ns, time.perf_counter() + seconds / 2
    for chunk in _chunks(offsets):
        for o in chunk:
            t = now()
            read(o)
            lat.append(now() - t)
        if time.perf_counter() >= end:
            break
    return summarize(ops, elapsed, lat)


def stream_loop(open_stream, buf, offsets: array, seconds: float) -> dict:
    """open_stream(latencies) -> a sink RwStream (or DirectStream) over `buf`, fed successive
    BATCH-op batches of `offsets`, so the queue never drains until the end. Timed like
    pread_loop: half the time without per-op clock reads for ops/s (the final drain
    included), half with them for the latencies. `min_inflight`: the fewest ops the engine
    had in flight at any wait before its final drain."""

    def one_pass(latencies: bool, duration: float):
        stream, ops, lat = open_stream(latencies), 0, array("I")
        start = time.perf_counter()

        def take(done) -> None:
            nonlocal ops
            if done is not None:
                ops += len(done.check().res)
                if latencies:
                    lat.extend(done.lat_ns)

        for chunk in _chunks(offsets, BATCH):
            take(stream.feed(chunk, buf))
            if time.perf_counter() - start >= duration:
                break
        take(stream.finish())
        return ops, time.perf_counter() - start, lat, stream.min_inflight

    ops, elapsed, _, low = one_pass(False, seconds / 2)
    _, _, lat, low2 = one_pass(True, seconds / 2)
    return {
        **summarize(ops, elapsed, lat),
        "min_inflight": min((x for x in (low, low2) if x is not None), default=None),
    }


# -- fio, the tool an engineer would judge an io_uring engine with ----------------------------
def fio_argv(path: str, *, direct: bool, seconds: float, timed: bool) -> list[str]:
    """One randread job over the whole of `path` (read-only): 4 KiB, uniform offsets with
    replacement (norandommap), the page cache left as it is (invalidate=0). direct: io_uring
    at QD32 with registered buffers and file, as the engine; else psync, one read at a time.
    timed=False drops fio's per-op clock reads (gtod_reduce), as the engine's ops/s pass."""
    argv = [
        "fio",
        "--name=xhagent-bench",
        "--filename=" + path.replace(":", "\\:"),
        "--readonly",
        "--rw=randread",
        f"--bs={BLOCK}",
        "--norandommap",
        "--randrepeat=0",
        "--invalidate=0",
        "--time_based",
        f"--runtime={max(1, round(seconds * 1000))}ms",
        "--output-format=json",
    ]
    argv += (
        ["--ioengine=io_uring", f"--iodepth={QD}", "--direct=1", "--fixedbufs", "--registerfiles"]
        if direct
        else ["--ioengine=psync", "--direct=0"]
    )
    return argv + ([] if timed else ["--gtod_reduce=1"])


def parse_fio(text: str) -> dict:
    """ops, ops/s and clat p50/p99 (µs, None when not measured) of fio's JSON (one job)."""
    report = json.loads(text[text.index("{") :])  # fio may print notes before the JSON
    job = report["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio job error {job['error']}")
    read = job["read"]
    pct = read.get("clat_ns", {}).get("percentile") or {}

    def us(key: str) -> float | None:
        return round(pct[key] / 1000, 2) if key in pct else None

    return {
        "ops_per_s": round(read["iops"], 1),
        "ops": read["total_ios"],
        "p50_us": us("50.000000"),
        "p99_us": us("99.000000"),
    }


def fio_case(path: str, direct: bool, seconds: float) -> dict:
    """Timed like the engine: half the time for ops/s without per-op clocks, half for latencies."""
    out = {}
    for timed in (False, True):
        argv = fio_argv(path, direct=direct, seconds=seconds / 2, timed=timed)
        run = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
        if run.returncode != 0:
            raise OSError(
                f"{' '.join(argv[:1])} exited {run.returncode}: {run.stderr.strip()[-300:]}"
            )
        part = parse_fio(run.stdout)
        out.update(part if not timed else {"p50_us": part["p50_us"], "p99_us": part["p99_us"]})
    return out


def merge_runs(runs: list[dict]) -> dict:
    """Several runs of one case: ops/s over their total time, the median run's p50/p99."""
    seconds = sum(r["ops"] / r["ops_per_s"] for r in runs if r["ops_per_s"])
    ops = sum(r["ops"] for r in runs)

    def median(key):
        values = sorted(r[key] for r in runs if r.get(key) is not None)
        return values[len(values) // 2] if values else None

    merged = {
        "ops_per_s": round(ops / seconds, 1) if seconds else 0.0,
        "ops": ops,
        "p50_us": median("p50_us"),
        "p99_us": median("p99_us"),
        "runs_ops_per_s": [r["ops_per_s"] for r in runs],
    }
    cpu = [r for r in runs if r.get("ops_per_cpu_s")]
    if cpu and len(cpu) == len(runs):
        used = sum(r["ops"] / r["ops_per_cpu_s"] for r in runs)
        merged["ops_per_cpu_s"] = round(ops / used, 1) if used else 0.0
    lows = [r["min_inflight"] for r in runs if r.get("min_inflight") is not None]
    return {**merged, "min_inflight": min(lows)} if lows else merged


def paired(
    engine, fio, name: str, peer: str, ratio: str, cases: dict, notes: dict, pairs: dict
) -> None:
    """cases[name] from engine(); with fio installed, engine and fio alternate FIO_PAIRS times
    (which goes first alternates too) and cases[peer] holds fio's runs; pairs[ratio] the
    ratio of each pair."""
    if shutil.which("fio") is None:
        cases[name] = engine()
        notes["fio"] = (
            "fio is not installed (Debian package fio, tools/setup-deps): "
            "fio cases and ratios omitted"
        )
        return
    mine, theirs = [], []
    try:
        # engine, fio, fio, engine, ...: a drift (caches warming) favours neither
        for i in range(FIO_PAIRS):
            if i % 2:
                theirs.append(fio())
                mine.append(engine())
            else:
                mine.append(engine())
                theirs.append(fio())
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        notes[peer] = f"fio failed, {peer} omitted: {exc}"
        cases[name] = merge_runs(mine) if mine else engine()
        return
    cases[name], cases[peer] = merge_runs(mine), merge_runs(theirs)
    pairs[ratio] = [
        round(m["ops_per_s"] / t["ops_per_s"], 3) if t["ops_per_s"] else None
        for m, t in zip(mine, theirs, strict=True)  # one of each per pair
    ]


async def _coroutines(read_one, offsets: array, seconds: float) -> dict:
    lat, now = array("Q"), time.perf_counter_ns
    deadline = time.perf_counter() + seconds
    ops = 0

    async def worker(k: int) -> None:
        nonlocal ops
        while time.perf_counter() < deadline:
            for o in offsets[k::QD][:256]:
                t = now()
                await read_one(o)
                lat.append(now() - t)
                ops += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(QD)))
    return summarize(ops, time.perf_counter() - start, lat)


def threadpool_case(fd: int, offsets: array, seconds: float) -> dict:
    async def main():
        loop = asyncio.get_running_loop()  # its default executor, as aiofiles uses
        return await _coroutines(
            lambda o: loop.run_in_executor(None, os.pread, fd, BLOCK, o), offsets, seconds
        )

    return asyncio.run(main())


def asyncring_case(fd: int, offsets: array, seconds: float) -> dict:
    async def main():
        async with AsyncRing(256) as ring:
            return await _coroutines(lambda o: ring.read(fd, BLOCK, o), offsets, seconds)

    return asyncio.run(main())


def files_case(read, paths: list[str], seconds: float, cpu: bool = False) -> dict:
    """Files read per second, with the per-file latency of each round; cpu: also per CPU
    second of this thread (`ops_per_cpu_s`), for reads whose whole work runs in it."""
    ops, start, lat = 0, time.perf_counter(), array("Q")
    cpu_start = time.thread_time()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter_ns()
        out = read(paths)
        lat.append((time.perf_counter_ns() - t) // max(1, len(paths)))  # per file
        ops += out if isinstance(out, int) else len(out)
    used = time.thread_time() - cpu_start
    out = summarize(ops, time.perf_counter() - start, lat)
    if cpu:
        out["ops_per_cpu_s"] = round(ops / used, 1) if used > 0 else 0.0
    return out


# -- setup ----------------------------------------------------------------------------------
def _make_data_file(directory: str, size: int) -> str:
    fd, path = tempfile.mkstemp(prefix="xhagent-bench-io-", dir=directory)
    chunk = os.urandom(1 << 20)
    with os.fdopen(fd, "wb") as f:
        for _ in range(size >> 20):
            f.write(chunk)
        f.write(chunk[: size % len(chunk)])  # `--size 256M` is 256 * 10**6 bytes: not whole MiB
        # Pages still under writeback make nonblocking (io_uring inline) reads punt to io-wq.
        f.flush()
        os.fsync(f.fileno())
    return path


def _make_tree(directory: str, files: int = 1000) -> list[str]:
    root = Path(tempfile.mkdtemp(prefix="xhagent-bench-tree-", dir=directory))
    paths = []
    for i in range(files):
        group = root / f"job-{i // len(CGROUP_FILES)}.scope"
        group.mkdir(exist_ok=True)
        p = group / CGROUP_FILES[i % len(CGROUP_FILES)]
        p.write_text(f"usage_usec {i * 7919}\nuser_usec {i * 31}\nsystem_usec {i * 17}\n")
        paths.append(str(p))
    return paths


def _device_size(fd: int) -> int:
    return os.lseek(fd, 0, os.SEEK_END)


def run(file: str | None, size: int, seconds: float, progress=lambda m: None) -> dict:
    workdir = tempfile.mkdtemp(prefix="xhagent-bench-io-")
    cases: dict[str, dict] = {}
    notes: dict[str, str] = {}
    pairs: dict[str, list] = {}
    rng = random.Random(42)
    groups: Path | None = None
    try:
        block_device = bool(file) and stat.S_ISBLK(os.stat(file).st_mode)
        data = file if file and not block_device else None
        if data is None:
            progress(f"writing a {quantity.human(size)} data file in {workdir}")
            data = _make_data_file(workdir, size)
        direct_target = file if block_device else data
        fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
        span = _device_size(fd)
        offsets = _offsets(rng, span, 1 << 16)
        progress("warming the page cache")
        with open(data, "rb") as f:
            while f.read(1 << 24):
                pass

        buf = AlignedBuffer(SLOTS * BLOCK)
        with Ring(64) as ring:
            progress("page cache: os.pread loop")
            cases["pagecache_pread"] = pread_loop(fd, offsets, seconds)
            ring.register_files([fd])
            ring.register_buffers([buf.view])
            progress(
                "page cache: engine QD32 (sink stream, registered file and buffer)"
                + (
                    f" alternating with fio psync, {FIO_PAIRS} runs each"
                    if shutil.which("fio")
                    else ""
                )
            )
            paired(
                lambda: stream_loop(
                    lambda lat: RwStream(
                        ring,
                        0,
                        BLOCK,
                        depth=QD,
                        latencies=lat,
                        what=data,
                        fixed_file=True,
                        fixed_buffer=0,
                        slots=SLOTS,
                    ),
                    buf.view,
                    _offsets(rng, span, 1 << 18),
                    seconds,
                ),
                lambda: fio_case(data, False, seconds),
                "pagecache_engine_qd32",
                "pagecache_fio_psync",
                "pagecache_engine_qd32_vs_fio_psync",
                cases,
                notes,
                pairs,
            )
        progress("page cache: asyncio + ThreadPoolExecutor QD32")
        cases["pagecache_threadpool_qd32"] = threadpool_case(fd, offsets, seconds)
        progress("page cache: AsyncRing QD32")
        cases["pagecache_asyncring_qd32"] = asyncring_case(fd, offsets, seconds)
        os.close(fd)
        buf.close()

        _direct_cases(direct_target, span, rng, seconds, cases, notes, pairs, progress)

        live_tree = _cgroupfs_files()  # listed before the bench's own groups exist
        groups, group_files = _make_groups(notes)
        _files_cases(
            {
                "tree": ("files in a cgroupfs-like tree in tmp", _make_tree(workdir)),
                "proc": (
                    "/proc/<pid>/stat files",
                    sorted(str(p) for p in Path("/proc").glob("[0-9]*/stat")),
                ),
                "cgroupfs": ("files of the cgroup2 tree", live_tree),
                "cgroup": (f"files of {BENCH_GROUPS} groups of the bench's own", group_files),
            },
            seconds,
            cases,
            notes,
            progress,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if groups is not None:
            _remove_groups(groups, notes)
    named = ratios(cases)
    return {
        "schema": 1,
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "file": data if not file else file,
        "direct_file": direct_target,
        "size": span,
        "seconds_per_case": seconds,
        "block": BLOCK,
        "queue_depth": QD,
        "cases": cases,
        "ratios": named,
        "targets_met": targets_met(named),
        "ratio_runs": pairs,
        "notes": notes,
    }


def _offsets(rng: random.Random, span: int, count: int) -> array:
    """`count` block-aligned offsets drawn uniformly, with replacement, over `span` bytes."""
    blocks = span // BLOCK
    return array("Q", (rng.randrange(blocks) * BLOCK for _ in range(count)))


def _direct_cases(path, span, rng, seconds, cases, notes, pairs, progress) -> None:
    offsets = _offsets(rng, span, 1 << 14)
    try:
        interrupt = DirectFile(path, poll=False)
    except OSError as exc:
        notes["direct"] = f"O_DIRECT open of {path} failed: {exc}; direct cases skipped"
        return
    buf = AlignedBuffer(SLOTS * BLOCK)
    try:
        with interrupt:
            progress("O_DIRECT: os.preadv loop")
            cases["direct_pread"] = pread_loop(interrupt.fd, offsets, seconds, buf.view[:BLOCK])
            interrupt.register_buffers([buf.view])
            for qd in (1, QD):
                progress(
                    f"O_DIRECT: engine QD{qd} (interrupt ring, sink stream)"
                    + (
                        f" alternating with fio, {FIO_PAIRS} runs each"
                        if qd == QD and shutil.which("fio")
                        else ""
                    )
                )

                def engine(qd: int = qd) -> dict:
                    return stream_loop(
                        lambda lat: interrupt.stream(BLOCK, depth=qd, latencies=lat, slots=SLOTS),
                        buf.view,
                        _offsets(rng, span, 1 << 18),
                        seconds,
                    )

                if qd == QD:
                    paired(
                        engine,
                        lambda: fio_case(path, True, seconds),
                        "direct_engine_qd32",
                        "direct_fio_qd32",
                        "direct_engine_qd32_vs_fio",
                        cases,
                        notes,
                        pairs,
                    )
                else:
                    cases["direct_engine_qd1"] = engine()
            notes["direct"] = (
                f"{path}: fixed file ops {interrupt.stats['fixed_file_ops']}, fixed buffer ops "
                f"{interrupt.stats['fixed_buffer_ops']}, plain buffer ops "
                f"{interrupt.stats['plain_buffer_ops']}"
                + "".join(f"; {n}" for n in interrupt.registration_notes)
            )
            if not interrupt.device_polls:
                notes["iopoll"] = f"{path}: its device has queue/io_poll != 1; IOPOLL cases skipped"
                return
        with DirectFile(path, poll=True) as polled:
            polled.register_buffers([buf.view])
            for qd in (1, QD):
                progress(f"O_DIRECT: engine QD{qd} (IOPOLL ring, sink stream)")
                cases[f"direct_iopoll_qd{qd}"] = stream_loop(
                    lambda lat, qd=qd: polled.stream(BLOCK, depth=qd, latencies=lat, slots=SLOTS),
                    buf.view,
                    offsets,
                    seconds,
                )
            notes["iopoll"] = (
                f"polled ops {polled.stats['polled_ops']}, fallbacks {polled.stats['fallbacks']}"
            )
    finally:
        buf.close()


def _files_cases(sets: dict[str, tuple[str, list[str]]], seconds, cases, notes, progress) -> None:
    """Each set: the Python loop, read_files as shipped ("auto"), and its two ways forced:
    chains through io_uring, and open/read/close from C (the kernel's own work plus the
    result objects: no way that opens, reads and closes every file is much faster). First,
    the kept-open cases (see _sampler_cases)."""
    room_for_fds(4 * max((len(p) for _, p in sets.values()), default=0))
    for name, (what, paths) in sets.items():
        if not paths:
            notes[f"files_{name}"] = f"no {what} here; cases skipped"
            continue
        progress(f"small files: {len(paths)} {what}")
        _sampler_cases(name, paths, seconds, cases, notes)
        for via, way in (("auto", "read_files"), ("uring", "uring"), ("syscalls", "syscalls")):
            with FileReader(via=via) as reader:
                cases[f"files_{name}_{way}"] = files_case(reader.read_files, paths, seconds)
        with FileReader() as reader:
            reader.read_files(paths)
            notes[f"files_{name}"] = (
                f"{len(paths)} {what}; read_files reads {reader.stats['syscalls']} with "
                f"system calls, {reader.stats['uring']} through io_uring"
            )


def kept_pread_reader(paths: list[str]):
    """The peer a Python metrics agent writes (netdata's python.d style): every file held
    open, each re-read with os.pread(fd, 65536, 0) into {path: bytes}, as Sampler.sample()
    returns; a file that fails (an exited process) is left out and closed, as a collector
    drops what the Sampler reports gone. Returns (read, close)."""
    fds = []
    for p in paths:
        try:
            fds.append((p, os.open(p, os.O_RDONLY | os.O_CLOEXEC)))
        except OSError:
            continue
    pread = os.pread

    def read(_paths) -> dict[str, bytes]:
        out, failed = {}, []
        for p, fd in fds:
            try:
                out[p] = pread(fd, 65536, 0)
            except OSError:
                failed.append((p, fd))
        for p, fd in failed:
            fds.remove((p, fd))
            os.close(fd)
        return out

    def close() -> None:
        for _, fd in fds:
            os.close(fd)

    return read, close


def _sampler_cases(name: str, paths: list[str], seconds, cases, notes) -> None:
    """Files held open and re-read: the Sampler as shipped (its dict and its packed form, and
    for comparison with every file read by pread from C) against the Python kept-open pread
    loop and the open/read/close loop. The cases take turns, SAMPLER_RUNS times each, so that
    a shared machine's drift weighs on all of them alike; each case's runs are merged."""
    read_kept, close_kept = kept_pread_reader(paths)
    sampler, by_pread = Sampler(paths), Sampler(paths, via="pread")
    try:
        for s in (sampler, by_pread):
            s.sample()  # buffers sized and fitted before the clock starts
            s.drop(list(s.errors))  # gone before it could be opened: as the peer skips it
            for _ in range(2 * TRIALS + 1):  # its way chosen ("auto" times both first)
                s.sample()
        gone = 0

        def sampled(s: Sampler, packed: bool = False, reread: bool = False):
            def read(_paths):
                nonlocal gone
                if reread:  # the C pass alone, nothing built: what no reader of them beats
                    s._read()
                    out = len(s) if s._complete else sum(1 for n in s._res if n >= 0)
                else:
                    out = s.sample_packed().files_read if packed else s.sample()
                if s.gone:  # what a collector does with an exited process
                    gone += len(s.drop_gone())
                return out

            return read

        turns = {
            "loop": read_file_loop,
            "kept_pread": read_kept,
            "sampler": sampled(sampler),
            "sampler_packed": sampled(sampler, packed=True),
            "sampler_pread": sampled(by_pread),
            "sampler_reread": sampled(sampler, reread=True),
        }
        runs: dict[str, list] = {k: [] for k in turns}
        for _ in range(SAMPLER_RUNS):
            for k, read in turns.items():
                runs[k].append(files_case(read, paths, seconds / SAMPLER_RUNS, cpu=True))
        for k, r in runs.items():
            cases[f"files_{name}_{k}"] = merge_runs(r)
        per_sample = sampler.ways
        notes[f"files_{name}_sampler"] = (
            f"{len(sampler)} files held open; a sample reads {per_sample['uring']} through "
            f"io_uring (registered files) and {per_sample['pread']} with pread, in one C call"
            + {
                None: "",
                True: "; the ring's pass was timed faster than pread's, and kept",
                False: "; the ring's pass was timed slower than pread's: pread for all",
            }[sampler.ring_kept]
            + (f"; files gone meanwhile, dropped: {gone}" if gone else "")
        )
    finally:
        sampler.close()
        by_pread.close()
        close_kept()


def _make_groups(notes: dict) -> tuple[Path | None, list[str]]:
    """BENCH_GROUPS empty groups under a parent of the bench's own in the cgroup2 tree, and
    every readable file in them (what a collector samples per group); (None, []) with a note
    where groups cannot be made."""
    unified = discover_hierarchy().unified
    if unified is None:
        notes["files_cgroup_setup"] = "no cgroup2 mount: cgroup cases skipped"
        return None, []
    top = Path(unified.path) / f"xhagent-bench-io-{os.getpid()}.slice"
    try:
        top.mkdir()
    except OSError as exc:
        notes["files_cgroup_setup"] = f"cannot create {top}: {exc.strerror}; cases skipped"
        return None, []
    paths: list[str] = []
    try:
        for k in range(BENCH_GROUPS):
            group = top / f"g{k}"
            group.mkdir()
            for f in sorted(group.iterdir()):
                if f.stat().st_mode & stat.S_IRUSR:  # cgroup.kill is write-only
                    paths.append(str(f))
    except OSError as exc:
        notes["files_cgroup_setup"] = f"creating groups under {top}: {exc.strerror}"
    return top, paths


def _remove_groups(top: Path, notes: dict) -> None:
    """The groups are empty (no process was put in them), so rmdir takes them; what could not
    be removed is named in the notes rather than left behind unsaid."""
    for group in sorted(top.iterdir()):
        if group.is_dir():
            try:
                group.rmdir()
            except OSError as exc:
                notes["files_cgroup_cleanup"] = f"{group}: {exc.strerror}"
    try:
        top.rmdir()
    except OSError as exc:
        notes["files_cgroup_cleanup"] = f"{top} left behind: {exc.strerror}"


def _cgroupfs_files(limit: int = 1000) -> list[str]:
    """Readable files of the live cgroup2 tree: what the agent reads every period."""
    unified = discover_hierarchy().unified
    if unified is None:
        return []
    out: list[str] = []
    for root, dirs, files in os.walk(unified.path):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                if os.stat(path).st_mode & stat.S_IRUSR:
                    out.append(path)
            except OSError:  # a cgroup removed meanwhile
                continue
        if len(out) >= limit:
            break
    return out[:limit]


def _table(report: dict) -> str:
    lines = [f"{'case':32} {'ops/s':>12} {'p50 us':>9} {'p99 us':>9}"]
    for name, c in report["cases"].items():
        lines.append(
            f"{name:32} {c['ops_per_s']:>12,.0f} {c['p50_us'] or 0:>9.2f} {c['p99_us'] or 0:>9.2f}"
        )
    lines.append("")
    met = report["targets_met"]
    for name, value in report["ratios"].items():
        mark = "" if name not in met else ("  target met" if met[name] else "  target MISSED")
        lines.append(f"{name:48} {value:>8.3f}{mark}")
    lines += [f"note: {k}: {v}" for k, v in report["notes"].items()]
    return "\n".join(lines)


def _check_source(file: str) -> None:
    """A regular file or a block device of at least 1 MiB: the cases read random 4 KiB blocks
    of it until time is up, which a FIFO or /dev/zero cannot serve."""
    try:
        st = os.stat(file)
        kind = (
            "block device"
            if stat.S_ISBLK(st.st_mode)
            else "file"
            if stat.S_ISREG(st.st_mode)
            else None
        )
        if kind is None:
            raise click.BadParameter(
                f"{file}: not a regular file or a block device", param_hint="--file"
            )
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            span = _device_size(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
    if span < 1 << 20:
        raise click.BadParameter(
            f"{file}: {span} bytes; the {kind} must hold at least 1 MiB", param_hint="--file"
        )


def _check_room(nbytes: int) -> None:
    """The data file goes to the temp dir: refuse a size that would fill its file system."""
    tmp = tempfile.gettempdir()
    fs = os.statvfs(tmp)
    free = fs.f_bavail * fs.f_frsize
    if nbytes > free // 2:
        raise click.BadParameter(
            f"{quantity.human(nbytes)} is more than half of the {quantity.human(free)} "
            f"free in {tmp}",
            param_hint="--size",
        )


@click.command("io")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--file",
    "file",
    metavar="PATH",
    help="Read this file or block device (read-only) instead of a temp file.",
)
@click.option(
    "--size",
    default="256Mi",
    show_default=True,
    help=(
        "Size of the temp data file: 256Mi = 256 * 2**20 bytes, "
        "256M = 256 * 10**6, as in every file."
    ),
)
@click.option(
    "--seconds",
    default=2.0,
    show_default=True,
    type=FiniteFloat(0, 600),
    help="Seconds per case (at most 600).",
)
def bench_io(as_json: bool, file: str | None, size: str, seconds: float) -> None:
    """io_uring engine vs os.pread, asyncio+threads and open/read/close loops."""
    try:
        nbytes = parse_size(size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from exc
    if file:
        _check_source(file)
    else:
        _check_room(nbytes)
    try:
        report = run(
            file, nbytes, seconds, progress=lambda m: click.echo(f"bench io: {m}", err=True)
        )
    except OSError as exc:
        click.echo(
            f"xhagent bench io: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}",
            err=True,
        )
        sys.exit(1)
    click.echo(json.dumps(report, indent=2) if as_json else _table(report))
