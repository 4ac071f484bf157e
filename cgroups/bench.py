"""`xhagent bench cgroup-io`: does io.weight split a disk's bandwidth as the weights say?

Groups with io.weight 500 and 100 (then 500/100/10) read O_DIRECT from the same disk at
the same time; the achieved bandwidth split is reported next to the weight ratio, with
the enforcer (io.cost or BFQ) that held the weights. The baseline is one reader alone in
the same run. The groups are set up by the reconciler from a generated CgroupPolicy, in
a throwaway subtree, and everything (io.cost included) is restored afterwards. Reads
only: nothing is ever written to the disk.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from ..cliparams import FiniteFloat
from ..signals import Terminated, signals_held, terminate_on_signals
from . import registry as R
from .enact import apply_policy
from .group import Cgroup, CgroupError
from .io_weight import io_cost_enabled, resolve_device, scheduler
from .policy import load_policy_text
from .reconcile import Options
from .spawn import Spawned
from .subtree import locate

# Each reader is a process (its own cgroup member) with THREADS threads of blocking
# O_DIRECT reads, so every group keeps several requests in flight.
READER = r"""
import os, sys, threading, time
from xhagent.io import aligned_buffer
dev = sys.argv[1]
size, block, threads = (int(a) for a in sys.argv[2:5])
seconds = float(sys.argv[5])
sys.stdin.readline()  # go: every reader is up (each started inside its own group)
done = [0] * threads
deadline = time.monotonic() + seconds
def read(i):
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    with aligned_buffer(block) as buf:
        off = (i * size // threads) // block * block
        while time.monotonic() < deadline:
            done[i] += os.preadv(fd, [buf], off)
            off = (off + block) % (size - block)
    os.close(fd)
ts = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(sum(done))
"""
HEAD = (
    "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\n"
    "metadata: {name: bench-cgroup-io}\nspec:\n  groups:\n"
)


def _policy(device: str, weights: list[int]) -> str:
    return HEAD + "".join(
        f"    - name: w{i}-{w}\n      io: {{weight: {w}, devices: {{{device}: {w}}}}}\n"
        for i, w in enumerate(weights)
    )


def _readers(
    groups: list[Cgroup], dev: str, size: int, block: int, threads: int, seconds: float
) -> list[float]:
    """MiB/s of one reader per group, all reading at the same time. Each reader is started
    inside its group (Cgroup.spawn), so none of its reads is charged elsewhere; a line on
    stdin starts them together once all are up."""
    argv = [sys.executable, "-c", READER, dev, str(size), str(block), str(threads), str(seconds)]
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
        for _, go, _ in readers:
            try:
                go.write("go\n")
                go.close()
            except BrokenPipeError:
                pass  # that reader is already gone: its exit status says why
        deadline = time.monotonic() + seconds + 60
        for child, _, _ in readers:  # each prints one number: it fits the pipe, so wait first
            child.wait(timeout=max(deadline - time.monotonic(), 0.001))
        out = [result.read() for _, _, result in readers]
    finally:
        for child, go, result in readers:
            if child.returncode is None:
                child.kill()
                child.wait()
            go.close()
            result.close()
    if any(child.returncode for child, _, _ in readers):
        raise RuntimeError(
            f"a reader failed: exit statuses {[child.returncode for child, _, _ in readers]}"
        )
    return [round(int(o) / seconds / 2**20, 2) for o in out]


def _split(mibps: list[float], weights: list[int]) -> dict:
    total = sum(mibps) or 1.0
    share = [round(m / total, 4) for m in mibps]
    want = [round(w / sum(weights), 4) for w in weights]
    return {
        "weights": weights,
        "MiBps": mibps,
        "total_MiBps": round(sum(mibps), 2),
        "share": share,
        "weight_share": want,
        "achieved_ratio_first_to_last": round(mibps[0] / mibps[-1], 3) if mibps[-1] else None,
        "weight_ratio_first_to_last": round(weights[0] / weights[-1], 3),
    }


def _block(_ctx: click.Context, _param: click.Parameter, value: int) -> int:
    if value % 512:
        raise click.BadParameter(f"{value} is not a multiple of 512 (O_DIRECT)")
    return value


@click.command()
@click.option(
    "--device", default="nvme0n1", show_default=True, help="Block device to read (read-only)."
)
@click.option(
    "--seconds",
    default=4.0,
    show_default=True,
    type=FiniteFloat(0.5, 600, lo_open=False, unit=" s"),
    help="Per run, 0.5..600.",
)
@click.option(
    "--block",
    default=131072,
    show_default=True,
    type=click.IntRange(512, 64 << 20),
    callback=_block,
    help="Bytes per O_DIRECT read, a multiple of 512.",
)
@click.option(
    "--threads",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Reads in flight per group.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON only (it is the default output anyway)."
)
def bench_cgroup_io(device: str, seconds: float, block: int, threads: int, as_json: bool) -> None:
    """Bandwidth split between io.weight groups against the weight ratio, with the enforcer.
    SIGINT, SIGTERM or SIGHUP end it after the readers are killed, the groups removed and
    io.cost and the root's controllers put back (exit 128+N)."""
    try:
        with terminate_on_signals():
            _bench(device, seconds, block, threads)
    except Terminated as exc:
        click.echo(
            f"xhagent bench cgroup-io: {exc}; groups removed, io.cost and controllers put back",
            err=True,
        )
        sys.exit(exc.exit_code)


def _bench(device: str, seconds: float, block: int, threads: int) -> None:
    def fail(msg: str) -> None:
        click.echo(f"xhagent bench cgroup-io: {msg}", err=True)
        sys.exit(1)

    if os.geteuid() != 0:
        fail("needs root (cgroup writes, O_DIRECT on a block device)")
    dev_path = Path("/dev") / device
    if not dev_path.is_block_device():
        fail(f"{dev_path} is not a block device here (the guest VM of tools/vmtest has nvme0n1)")
    try:
        majmin = resolve_device(device)
        sub = locate(f"xhagent-bench-{os.getpid()}.slice")
    except (ValueError, CgroupError) as exc:
        fail(str(exc))
    top = sub.top
    if "io" not in top.controllers():
        fail(f"the io controller is not available in cgroup2 at {top.path}")
    size = int((Path("/sys/block") / device / "size").read_text()) * 512
    had_io = "io" in top.subtree_control()
    qos_before = top.read(R.IO_COST_QOS.name) if top.has(R.IO_COST_QOS) else ""
    out: dict = {
        "benchmark": "cgroup-io",
        "device": device,
        "majmin": majmin,
        "scheduler": scheduler(majmin),
        "seconds": seconds,
        "block": block,
        "threads_per_group": threads,
        "runs": [],
    }
    try:
        click.echo("bench cgroup-io: baseline, one reader alone", err=True)
        solo = _one_run(sub, device, [100], size, block, threads, seconds, out, enable_cost=False)
        out["baseline_solo_MiBps"] = solo["MiBps"][0]  # no io.cost: what the disk gives one group
        for weights in ([500, 100], [500, 100, 10]):
            click.echo(f"bench cgroup-io: weights {weights}, all at once", err=True)
            run = _one_run(sub, device, weights, size, block, threads, seconds, out)
            run["total_vs_solo"] = (
                round(run["total_MiBps"] / solo["MiBps"][0], 3) if solo["MiBps"][0] else None
            )
            out["runs"].append(run)
    except (CgroupError, RuntimeError) as exc:
        fail(str(exc))
    finally:
        with signals_held():
            _restore(sub, top, majmin, had_io, qos_before)
    model_file = Path("/sys/block") / device / "device" / "model"
    out["device_model"] = model_file.read_text().strip() if model_file.exists() else None
    if out["device_model"] and "QEMU" in out["device_model"]:
        out["note"] = (
            "emulated disk: the emulator's CPU, not a device queue, is the bottleneck; "
            "io.cost still throttles by weight, but a group's share is floored by what its own "
            "reader can issue, so small weights get more than their share"
        )
    click.echo(json.dumps(out, indent=2))


def _one_run(
    sub,
    device: str,
    weights: list[int],
    size: int,
    block: int,
    threads: int,
    seconds: float,
    out: dict,
    enable_cost: bool = True,
) -> dict:
    policy = load_policy_text(_policy(device, weights), "<bench>")
    outcome = apply_policy(policy, sub, Options(own_root=True, enable_io_cost=enable_cost))
    p, report = outcome.plan, outcome.report
    if p.errors:
        raise RuntimeError("; ".join(p.errors))
    if report.failed:
        raise CgroupError(0, f"{report.failed[0].describe()}: {report.failed[1]}")
    out["enforcer"] = {dev: e.name for dev, e in p.enforcers.items()} or out.get("enforcer")
    groups = [sub.group(g.path) for g in policy.groups]
    try:
        return _split(
            _readers(groups, str(Path("/dev") / device), size, block, threads, seconds), weights
        )
    finally:
        for g in groups:
            g.remove(kill_first=True)


def _restore(sub, top: Cgroup, majmin: str, had_io: bool, qos_before: str) -> None:
    """Put back io.cost and the root's controllers as they were; remove the bench subtree."""
    for rel in reversed(sub.walk()):
        sub.group(rel).remove(kill_first=True)
    if sub.path.exists():
        sub.root.remove()
    if majmin not in io_cost_enabled(qos_before) and top.has(R.IO_COST_QOS):
        top.write(R.IO_COST_QOS.name, f"{majmin} enable=0")
    if not had_io:
        try:
            top.write(R.SUBTREE_CONTROL.name, "-io")
        except CgroupError:
            pass  # other groups use io now; leaving it enabled is harmless
