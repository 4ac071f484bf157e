"""`xhagent bench cgroup-io`: does io.weight split a disk as the weights say?

Groups with io.weight 500 and 100, then 500/100/10, then a nested pair, read O_DIRECT
from the same disk at the same time (the engine's own stream, random reads, DEPTH in
flight per group); each group's IOPS and share are reported next to the share its weights
give it, with the enforcer (io.cost or BFQ) that held them and io.cost's charge to each
group (io.stat cost.usage). The baseline is one reader alone in the same run. The groups
are set up by the reconciler from a generated CgroupPolicy, in a throwaway subtree, and
everything (io.cost included) is put back afterwards. Reads only: nothing is ever
written to the disk.

`--device nullb` makes a null_blk disk (cgroups/nullb.py) whose queue, not the CPU, limits
it, measures what three readers issue together there under io.cost with a budget none
reaches, writes an io.cost model whose budget is a fraction of that (nullb.io_cost_budget:
below what the readers issue on this machine, however fast or slow, so that io.cost decides
the split; the JSON's `io_cost_budget` says it), and adds a BFQ case; the disk goes
afterwards.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

from ..cgroups import nullb, registry, values
from ..cgroups.enact import apply_policy
from ..cgroups.group import Cgroup, CgroupError
from ..cgroups.io_weight import io_cost_enabled, resolve_device, scheduler
from ..cgroups.nullb import CALIBRATION_IOPS, NULLB_QOS, io_cost_budget, io_cost_model
from ..cgroups.policy import load_policy_text
from ..cgroups.reconcile import Options
from ..cgroups.spawn import Spawned
from ..cgroups.subtree import locate
from ..cliparams import FiniteFloat
from ..signals import Terminated, signals_held, terminate_on_signals

# Each reader is a process (its own cgroup member) running the engine's O_DIRECT sink
# stream: random BLOCK-byte reads with DEPTH of them in flight, the queue kept full across
# batches (fio's randread at iodepth=DEPTH). Once its imports and ring are ready it says so
# and waits for the window, two CLOCK_MONOTONIC times (system-wide, so the same for all
# readers): it reads from its "go" until the window closes and counts only the reads it
# harvested inside the window, so every counted read was made while all readers were
# reading. It prints those reads, their bytes, and how long after the window opened its
# first read went out (negative: before, as it should).
READER = r"""
import os, random, sys, time
from array import array
from xhagent.io import aligned_buffer
from xhagent.io.direct import DirectFile
dev = sys.argv[1]
size, block, depth = (int(a) for a in sys.argv[2:5])
slots = max(depth, 64)
batch = 16  # reads per feed: a read is counted at its batch's harvest, so keep batches small
rng = random.Random(os.getpid())
blocks = size // block
f = DirectFile(dev, poll=False, entries=max(64, 2 * depth))
print("ready", flush=True)
opens, closes = (float(t) for t in sys.stdin.readline().split()[1:3])
ops = nbytes = 0
def take(done):
    global ops, nbytes
    if done is not None:
        done.check()
        if opens <= time.monotonic() <= closes:
            ops += len(done.res)
            nbytes += sum(done.res)
with aligned_buffer(slots * block) as buf:
    stream = f.stream(block, depth=depth, slots=slots)
    first = time.monotonic()
    while time.monotonic() < closes:
        take(stream.feed(array("Q", (rng.randrange(blocks) * block for _ in range(batch))), buf))
    take(stream.finish())
f.close()
print(ops, nbytes, first - opens)
"""
# From the "go" to the window's opening: the readers' first reads go out and io.cost sees
# every group busy before anything is counted (fio's ramp_time).
RAMP_S = 0.5
CALIBRATION_S = 3.0  # the calibration run: long enough for a steady rate, short for the suite
KILL_WAIT_S = 30  # for a reader to exit after SIGKILL before the run gives up on it
HEAD = (
    "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\n"
    "metadata: {name: bench-cgroup-io}\nspec:\n  groups:\n"
)


@dataclass(frozen=True)
class Group:
    """A group of a case: a reader runs in each group without children."""

    name: str
    weight: int
    children: tuple[Group, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    groups: tuple[Group, ...]
    scheduler: str | None = None  # switch the disk to this scheduler (a made disk only)

    def leaves(self) -> list[tuple[str, Group]]:
        """(path, group) of every group a reader runs in, depth first."""
        out: list[tuple[str, Group]] = []

        def walk(groups: tuple[Group, ...], prefix: str) -> None:
            for g in groups:
                path = f"{prefix}{g.name}"
                if g.children:
                    walk(g.children, path + "/")
                else:
                    out.append((path, g))

        walk(self.groups, "")
        return out

    def shares(self) -> list[float]:
        """What each reader should get by the weights: at each level a group's weight over
        its siblings' sum, multiplied down the tree (every leaf busy, so every group is)."""
        out: list[float] = []

        def walk(groups: tuple[Group, ...], share: float) -> None:
            total = sum(g.weight for g in groups)
            for g in groups:
                if g.children:
                    walk(g.children, share * g.weight / total)
                else:
                    out.append(round(share * g.weight / total, 4))

        walk(self.groups, 1.0)
        return out

    def policy(self, device: str) -> str:
        def lines(groups: tuple[Group, ...], indent: str) -> str:
            text = ""
            for g in groups:
                text += (
                    f"{indent}- name: {g.name}\n"
                    f"{indent}  io: {{weight: {g.weight}, devices: {{{device}: {g.weight}}}}}\n"
                )
                if g.children:
                    text += f"{indent}  children:\n" + lines(g.children, indent + "    ")
            return text

        return HEAD + lines(self.groups, "    ")


def _flat(*weights: int) -> tuple[Group, ...]:
    return tuple(Group(f"w{i}-{w}", w) for i, w in enumerate(weights))


CASES = (
    Case("two", _flat(500, 100)),
    Case("three", _flat(500, 100, 10)),
    # hierarchical: 200/100 at the top, 300/100 under the first: 1/2, 1/6 and 1/3
    Case(
        "nested",
        (
            Group("p0-200", 200, (Group("c0-300", 300), Group("c1-100", 100))),
            Group("p1-100", 100),
        ),
    ),
)
# BFQ enforces io.bfq.weight (systemd's mapping of io.weight), not io.cost: run on a disk
# the bench made, whose scheduler it may change.
BFQ_CASE = Case("bfq", _flat(500, 100), scheduler="bfq")
SOLO = Case("solo", (Group("solo", 100),))
# What the readers issue together under io.cost when it throttles no one: the budget's gauge.
CALIBRATION = Case("calibration", _flat(100, 100, 100))

NULLB_DEVICE = "nullb"


def _readers(
    groups: list[Cgroup], dev: str, size: int, block: int, depth: int, seconds: float
) -> list[tuple[int, int]]:
    """(reads, bytes) of one reader per group over the same `seconds`-long window. Each
    reader is started inside its group (Cgroup.spawn), so none of its reads is charged
    elsewhere; once all are ready, one line on stdin gives them the window, RAMP_S ahead."""
    argv = [sys.executable, "-c", READER, dev, str(size), str(block), str(depth)]
    readers: list[tuple[Spawned, object, object]] = []
    try:
        for group in groups:
            go_r, go_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            try:
                child = group.spawn(argv, stdin=go_r, stdout=out_w)
            except BaseException:
                for fd in (go_w, out_r):
                    os.close(fd)
                raise
            finally:
                os.close(go_r)
                os.close(out_w)
            readers.append((child, os.fdopen(go_w, "w"), os.fdopen(out_r, "r")))
        deadline = time.monotonic() + 60
        ready = [_ready(result, deadline) for _, _, result in readers]
        opens = time.monotonic() + RAMP_S
        for _, go, _ in readers:  # without a window (one reader failed) the others end too
            try:
                go.write(f"go {opens!r} {opens + seconds!r}\n" if all(ready) else "")
                go.close()
            except BrokenPipeError:
                pass  # that reader is already gone: its exit status says why
        deadline = opens + seconds + 60
        try:
            for child, _, _ in readers:  # each prints one line: it fits the pipe, so wait first
                child.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"a reader was still running {seconds + 60:g} s after its go"
            ) from None
        out = [result.read() for _, _, result in readers]
    finally:
        stuck = []
        for child, go, result in readers:
            if child.returncode is None:
                child.kill()
                try:
                    child.wait(timeout=KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    stuck.append(f"{child.pid} ({_where(child.pid)})")
            go.close()
            result.close()
        if stuck:  # never wait for ever on a process the kernel holds
            raise RuntimeError(
                f"reader(s) {', '.join(stuck)} still there {KILL_WAIT_S} s after SIGKILL: "
                "held in the kernel (their I/O never completed)"
            )
    if any(child.returncode for child, _, _ in readers) or not all(ready):
        raise RuntimeError(
            f"a reader failed: exit statuses {[child.returncode for child, _, _ in readers]}"
        )
    done = [o.split() for o in out]
    for group, (_, _, late) in zip(groups, done, strict=True):
        if float(late) > 0:
            raise RuntimeError(
                f"the reader in {group.path} began {float(late) * 1000:.0f} ms after the "
                f"measured window opened ({RAMP_S} s after its go): its figures would count "
                "time the others read alone"
            )
    return [(int(ops), int(nbytes)) for ops, nbytes, _ in done]


def _where(pid: int) -> str:
    """Where the kernel holds a process: its state and wait channel."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError:
        return "gone"
    return f"state {state}, wchan {wchan}"


def _ready(result, deadline: float) -> bool:
    """Wait for a reader's "ready" line; False when it ended (or stayed silent) before."""
    if not select.select([result], [], [], max(deadline - time.monotonic(), 0))[0]:
        return False
    return result.readline() == "ready\n"


def _split(done: list[tuple[int, int]], case: Case, seconds: float, usage: list) -> dict:
    iops = [round(ops / seconds, 1) for ops, _ in done]
    mibps = [round(nbytes / seconds / 2**20, 2) for _, nbytes in done]
    total = sum(iops) or 1.0
    first, last = iops[0], iops[-1]
    weights = [g.weight for _, g in case.leaves()]
    want = case.shares()
    return {
        "case": case.name,
        "groups": [path for path, _ in case.leaves()],
        "weights": weights,
        "IOPS": iops,
        "MiBps": mibps,
        "total_IOPS": round(sum(iops), 1),
        "share": [round(x / total, 4) for x in iops],
        "weight_share": want,
        "achieved_ratio_first_to_last": round(first / last, 3) if last else None,
        "weight_ratio_first_to_last": round(want[0] / want[-1], 3),
        "cost_usage_us": usage,  # io.stat cost.usage per group (io.cost only)
    }


def _block(_ctx: click.Context, _param: click.Parameter, value: int) -> int:
    if value % 512:
        raise click.BadParameter(f"{value} is not a multiple of 512 (O_DIRECT)")
    return value


@click.command()
@click.option(
    "--device",
    default="nvme0n1",
    show_default=True,
    help="Block device to read (read-only), or `nullb`: a null_blk disk the bench makes, "
    "with an io.cost model whose budget is measured in the same run, and removes afterwards.",
)
@click.option(
    "--seconds",
    default=6.0,
    show_default=True,
    type=FiniteFloat(0.5, 600, lo_open=False, unit=" s"),
    help="Per run, 0.5..600.",
)
@click.option(
    "--block",
    default=4096,
    show_default=True,
    type=click.IntRange(512, 64 << 20),
    callback=_block,
    help="Bytes per random O_DIRECT read, a multiple of 512.",
)
@click.option(
    "--depth",
    default=32,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Reads in flight per group.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON only (it is the default output anyway)."
)
def bench_cgroup_io(device: str, seconds: float, block: int, depth: int, as_json: bool) -> None:
    """How io.weight groups split a disk against what their weights say, with the enforcer
    (io.cost or BFQ): two groups 500/100, three 500/100/10, and a nested pair; on `nullb`
    also BFQ. SIGINT, SIGTERM or SIGHUP end it after the readers are killed, the groups
    removed and io.cost, the root's controllers and a made disk put back (exit 128+N)."""
    try:
        with terminate_on_signals():
            _bench(device, seconds, block, depth)
    except Terminated as exc:
        click.echo(
            f"xhagent bench cgroup-io: {exc}; groups removed, io.cost and controllers put back",
            err=True,
        )
        sys.exit(exc.exit_code)


def _fail(msg: str) -> NoReturn:
    click.echo(f"xhagent bench cgroup-io: {msg}", err=True)
    sys.exit(1)


def _bench(device: str, seconds: float, block: int, depth: int) -> None:
    if os.geteuid() != 0:
        _fail("needs root (cgroup writes, O_DIRECT on a block device)")
    if device != NULLB_DEVICE:
        dev_path = Path("/dev") / device
        if not dev_path.is_block_device():
            _fail(
                f"{dev_path} is not a block device here (the guest VM of tools/vmtest has "
                f"nvme0n1; `--device {NULLB_DEVICE}` makes a null_blk disk)"
            )
        _measure(device, seconds, block, depth, io_cost=False, cases=CASES)
        return
    nullb.load_module()
    try:
        with nullb.null_blk(f"xhagent-bench-{os.getpid()}", nullb.BENCH_SETTINGS) as disk:
            (Path("/sys/block") / disk.disk / "queue/scheduler").write_text("none")
            _measure(disk.disk, seconds, block, depth, io_cost=True, cases=(*CASES, BFQ_CASE))
    except nullb.NullBlkError as exc:
        _fail(str(exc))


def _measure(device: str, seconds: float, block: int, depth: int, io_cost: bool, cases) -> None:
    """Every case on `device`; `io_cost`: write the disk's io.cost model and QoS, with a
    budget from the baseline (a disk the bench made)."""
    try:
        majmin = resolve_device(device)
        sub = locate(f"xhagent-bench-{os.getpid()}.slice")
    except (ValueError, CgroupError) as exc:
        _fail(str(exc))
    top = sub.top
    if "io" not in top.controllers():
        _fail(f"the io controller is not available in cgroup2 at {top.path}")
    if io_cost and not top.has(registry.IO_COST_MODEL):
        _fail(f"this kernel has no io.cost ({top.path / registry.IO_COST_MODEL.name} is absent)")
    size = int((Path("/sys/block") / device / "size").read_text()) * 512
    had_io = "io" in top.subtree_control()
    qos_before = top.read(registry.IO_COST_QOS.name) if top.has(registry.IO_COST_QOS) else ""
    out: dict = {
        "benchmark": "cgroup-io",
        "device": device,
        "majmin": majmin,
        "scheduler": scheduler(majmin),
        "seconds": seconds,
        "block": block,
        "depth_per_group": depth,
        "runs": [],
    }
    sched_file = Path("/sys/block") / device / "queue/scheduler"
    try:
        click.echo("bench cgroup-io: baseline, one reader alone", err=True)
        solo = _one_run(sub, device, SOLO, size, block, depth, seconds, out)
        out["baseline_solo_IOPS"] = solo["IOPS"][0]
        if io_cost:
            out["io_cost_budget"] = _calibrate(sub, top, device, majmin, size, block, depth)
            out["io_cost_model"] = top.read(registry.IO_COST_MODEL.name)
            out["io_cost_qos"] = top.read(registry.IO_COST_QOS.name)
        for case in cases:
            if case.scheduler is not None:
                sched_file.write_text(case.scheduler)
                if io_cost:  # BFQ alone holds the weights in this case
                    top.write(registry.IO_COST_QOS.name, f"{majmin} enable=0")
            weights = "/".join(str(w) for w in (g.weight for _, g in case.leaves()))
            click.echo(f"bench cgroup-io: {case.name} ({weights}), all at once", err=True)
            run = _one_run(sub, device, case, size, block, depth, seconds, out)
            run["scheduler"] = scheduler(majmin)
            run["total_vs_solo"] = (
                round(run["total_IOPS"] / solo["IOPS"][0], 3) if solo["IOPS"][0] else None
            )
            out["runs"].append(run)
    except OSError as exc:
        _fail(f"{exc.filename}: {exc.strerror}")
    except (CgroupError, RuntimeError) as exc:
        _fail(str(exc))
    finally:
        with signals_held():
            _restore(sub, top, majmin, had_io, qos_before)
    model_file = Path("/sys/block") / device / "device" / "model"
    out["device_model"] = model_file.read_text().strip() if model_file.exists() else None
    if out["device_model"] and "QEMU" in out["device_model"]:
        out["note"] = (
            "emulated disk: the emulator's CPU, not a device queue, is the bottleneck, so "
            "io.cost rarely throttles and small weights get more than their share; "
            f"`--device {NULLB_DEVICE}` shows the split on a disk with a real queue"
        )
    click.echo(json.dumps(out, indent=2))


def _calibrate(sub, top: Cgroup, device, majmin, size, block, depth) -> dict:
    """Run three readers under io.cost with a budget none reaches, then write the model whose
    budget is a fraction of what they issued together; what was measured and chosen."""
    seconds = CALIBRATION_S
    click.echo("bench cgroup-io: calibration, three readers under io.cost unthrottled", err=True)
    top.write(registry.IO_COST_MODEL.name, f"{majmin} {io_cost_model(CALIBRATION_IOPS)}")
    top.write(registry.IO_COST_QOS.name, f"{majmin} {NULLB_QOS}")
    run = _one_run(sub, device, CALIBRATION, size, block, depth, seconds, {})
    budget = io_cost_budget(run["total_IOPS"])
    top.write(registry.IO_COST_MODEL.name, f"{majmin} {io_cost_model(budget)}")
    return {
        "rand_read_iops": budget,
        "calibration_IOPS": run["total_IOPS"],
        "calibration_seconds": seconds,
        "fraction": nullb.BUDGET_FRACTION,
        "why": "below what the readers issue together on this machine under io.cost, so that "
        "io.cost, not their CPU, decides the split",
    }


def _one_run(
    sub, device: str, case: Case, size: int, block: int, depth: int, seconds: float, out: dict
) -> dict:
    """The case's groups made by the reconciler, one reader in each leaf, then removed."""
    policy = load_policy_text(case.policy(device), "<bench>")
    # io.cost for the weighted cases, unless the case is another enforcer's (BFQ)
    cost = case is not SOLO and case is not CALIBRATION and case.scheduler is None
    outcome = apply_policy(policy, sub, Options(own_root=True, enable_io_cost=cost))
    p, report = outcome.plan, outcome.report
    if p.errors:
        raise RuntimeError("; ".join(p.errors))
    if report.failed:
        raise CgroupError(0, f"{report.failed[0].describe()}: {report.failed[1]}")
    if case is not SOLO:
        out.setdefault("enforcer", {})[case.name] = {d: e.name for d, e in p.enforcers.items()}
    leaves = [sub.group(path) for path, _ in case.leaves()]
    majmin = resolve_device(device)
    try:
        done = _readers(leaves, str(Path("/dev") / device), size, block, depth, seconds)
        usage = [_cost_usage(g, majmin) for g in leaves]
        return _split(done, case, seconds, usage)
    finally:
        for rel in reversed(sub.walk()):
            if rel:
                sub.group(rel).remove(kill_first=True)


def _cost_usage(group: Cgroup, majmin: str) -> int | None:
    """io.cost's charge to the group for the device (µs of device time), if it has one."""
    stat = group.read(registry.IO_STAT.name) if group.has(registry.IO_STAT) else ""
    value = values.parse_nested_keyed(stat).get(majmin, {}).get("cost.usage")
    return value if isinstance(value, int) else None


def _restore(sub, top: Cgroup, majmin: str, had_io: bool, qos_before: str) -> None:
    """Put back io.cost and the root's controllers as they were; remove the bench subtree."""
    for rel in reversed(sub.walk()):
        sub.group(rel).remove(kill_first=True)
    if sub.path.exists():
        sub.root.remove()
    if majmin not in io_cost_enabled(qos_before) and top.has(registry.IO_COST_QOS):
        top.write(registry.IO_COST_QOS.name, f"{majmin} enable=0")
    if not had_io:
        try:
            top.write(registry.SUBTREE_CONTROL.name, "-io")
        except CgroupError:
            pass  # other groups use io now; leaving it enabled is harmless
