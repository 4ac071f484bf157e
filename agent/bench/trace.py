"""`xhagent bench trace`: the ping-pong workload timed untraced, traced system-wide by
xhagent, and traced by `perf record -e sched:sched_switch -a` where perf works;
slowdown ratios, events/s sustained, lost events. The workload times its own loop,
so recorder start-up and shutdown are not counted. With --stacks, the same with kernel
stacks at each switch: xhagent --stacks kernel beside `perf record -g --kernel-callchains`
and libbpf-tools' offcputime (kernel and user stacks, aggregated in the kernel)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import click

WORKLOAD = [sys.executable, "-m", "xhagent.trace.workload"]
PINS = ("same", "split", "none")
TRACEFS = "/sys/kernel/tracing"


def _workload_result(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"the ping-pong workload printed no result: {stdout[-300:]!r}")


def run_untraced(rounds: int, pin: str) -> dict:
    res = subprocess.run(
        [*WORKLOAD, str(rounds), "--pin", pin], capture_output=True, text=True, check=True
    )
    return {"elapsed_s": _workload_result(res.stdout)["elapsed_s"]}


def run_xhagent(
    rounds: int,
    path: str,
    pin: str,
    events: tuple[str, ...] | None = None,
    stacks: str = "none",
) -> dict:
    from ..trace.recorder import record

    with tempfile.TemporaryFile("w+") as out:
        res = record(
            path,
            command=[*WORKLOAD, str(rounds), "--pin", pin],
            system_wide=True,
            command_stdout=out,
            events=events,
            stacks=stacks,
        )
        out.seek(0)
        work = _workload_result(out.read())
    result = {
        "elapsed_s": work["elapsed_s"],
        "events": res.records,
        "lost": res.lost,
        "events_per_s": round(res.records / work["elapsed_s"]) if work["elapsed_s"] else 0,
    }
    if stacks != "none":
        result["stacks_lost"] = res.meta["stacks"]["lost"]
    return result


OFFCPUTIME_ATTACH_S = 1.0  # offcputime says nothing once attached: give its load this long


def run_offcputime(rounds: int, pin: str) -> dict:
    """The workload under libbpf-tools' offcputime (all threads, kernel and user stacks),
    started first and stopped (SIGINT, then it prints its summary) after it."""
    tool = subprocess.Popen(
        [shutil.which("offcputime"), "--stack-storage-size", "16384"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(OFFCPUTIME_ATTACH_S)
        if tool.poll() is not None:
            raise RuntimeError(f"offcputime exited {tool.returncode}: {tool.stderr.read()[-400:]}")
        result = run_untraced(rounds, pin)
    finally:
        tool.send_signal(signal.SIGINT)
        tool.wait(timeout=60)
    return result


CALLCHAINS = {"none": [], "kernel": ["-g", "--kernel-callchains"], "both": ["-g"]}


def perf_command(perf: str, data: str, command: list[str], stacks: str = "none") -> list[str]:
    """perf needs tracefs for sched:sched_switch; mount it in a private mount
    namespace when the host has not (nothing changes outside that namespace).
    `stacks`: "kernel", `-g --kernel-callchains`, the kernel call chain with each event (what
    xhagent's --stacks kernel takes); "both", `-g`, the kernel's and the user's."""
    # 8 MiB per CPU: perf's default buffer loses events on a loaded 2-CPU machine, and a
    # baseline that drops events would flatter neither side. Not -q: its "lost" lines count.
    cmd = [
        perf,
        "record",
        "-m",
        "2048",
        "-e",
        "sched:sched_switch",
        "-a",
        *CALLCHAINS[stacks],
        "-o",
        data,
        "--",
        *command,
    ]
    if os.path.isdir(os.path.join(TRACEFS, "events")):
        return cmd
    return [
        "unshare",
        "-m",
        "--",
        "sh",
        "-c",
        f'mount -t tracefs nodev {TRACEFS} && exec "$@"',
        "sh",
        *cmd,
    ]


def perf_missing() -> str | None:
    """Why perf cannot be the baseline here, or None."""
    if shutil.which("perf") is None:
        return "perf not installed (Debian package linux-perf)"
    if shutil.which("unshare") is None and not os.path.isdir(os.path.join(TRACEFS, "events")):
        return "tracefs is not mounted and unshare(1) is missing"
    return None


def run_perf(rounds: int, data: str, pin: str, stacks: str = "none") -> dict:
    workload = [*WORKLOAD, str(rounds), "--pin", pin]
    res = subprocess.run(
        perf_command(shutil.which("perf"), data, workload, stacks),
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"perf record failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    work = _workload_result(res.stdout)
    lost = sum(int(n) for n in re.findall(r"lost (\d+) chunks", res.stderr))
    count = perf_switches(data)
    return {
        "elapsed_s": work["elapsed_s"],
        "events": count,
        "lost": lost,
        "events_per_s": round(count / work["elapsed_s"]) if work["elapsed_s"] else 0,
    }


def _stacks_ratios(out: dict) -> dict:
    """xhagent's added slowdown with stacks against each peer's (None: the peer shows none
    above the noise, or did not run)."""
    x = out["xhagent_stacks"]["slowdown"] - 1
    ratios: dict = {}
    for peer in ("perf_g", "offcputime"):
        slowdown = out.get(peer, {}).get("slowdown")
        overhead = slowdown - 1 if slowdown is not None else None
        ratios[f"overhead_ratio_xhagent_stacks_to_{peer}"] = (
            round(x / overhead, 4) if overhead and overhead > 0 else None
        )
    peer = ratios["overhead_ratio_xhagent_stacks_to_perf_g"]
    ratios["target_stacks_overhead_at_most_half_of_perf_g"] = None if peer is None else peer <= 0.5
    return ratios


def perf_switches(data: str) -> int:
    res = subprocess.run(
        ["perf", "script", "-i", data, "-F", "event"], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"perf script failed: {res.stderr.strip()[-400:]}")
    return sum(1 for line in res.stdout.splitlines() if "sched_switch" in line)


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


@click.command("trace")
@click.option("--rounds", default=50_000, show_default=True, type=click.IntRange(min=100))
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--pin",
    default="same",
    show_default=True,
    type=click.Choice(PINS),
    help="Ping and pong on one CPU, on two, or unpinned (bimodal timings).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON only (it is the default output anyway)."
)
@click.option(
    "--stacks",
    is_flag=True,
    help="Also with kernel stacks at each switch: xhagent --stacks kernel, perf -g "
    "--kernel-callchains and offcputime.",
)
def bench_trace(rounds: int, repeat: int, pin: str, as_json: bool, stacks: bool) -> None:
    """Ping-pong slowdown under xhagent tracing vs perf record; events/s; lost events."""
    if os.geteuid() != 0:
        click.echo("xhagent bench trace: needs root (BPF, perf -a)", err=True)
        sys.exit(1)
    why_no_perf = perf_missing()
    why_no_offcputime = (
        None
        if shutil.which("offcputime")
        else ("offcputime not installed (Debian package libbpf-tools)")
    )
    # "xhagent" records what perf records (sched_switch, system-wide); "xhagent_all"
    # adds sched_waking, sched_wakeup(_new), exit and fork, the default of `xhagent trace record`.
    runs: dict[str, list[dict]] = {"untraced": [], "xhagent": [], "xhagent_all": [], "perf": []}
    if stacks:
        runs |= {"xhagent_stacks": [], "perf_g": [], "offcputime": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):  # interleaved, so that background noise hits all modes
            click.echo(f"bench trace: round {i + 1}/{repeat}", err=True)
            runs["untraced"].append(run_untraced(rounds, pin))
            runs["xhagent"].append(
                run_xhagent(rounds, os.path.join(tmp, "x.xht"), pin, ("switch",))
            )
            runs["xhagent_all"].append(run_xhagent(rounds, os.path.join(tmp, "x.xht"), pin))
            if why_no_perf is None:
                runs["perf"].append(run_perf(rounds, os.path.join(tmp, "perf.data"), pin))
            if not stacks:
                continue
            runs["xhagent_stacks"].append(
                run_xhagent(rounds, os.path.join(tmp, "x.xht"), pin, ("switch",), "kernel")
            )
            if why_no_perf is None:
                data = os.path.join(tmp, "perf.data")
                runs["perf_g"].append(run_perf(rounds, data, pin, stacks="kernel"))
            if why_no_offcputime is None:
                runs["offcputime"].append(run_offcputime(rounds, pin))
    base = _median(runs["untraced"], "elapsed_s")
    out: dict = {
        "benchmark": "trace",
        "rounds": rounds,
        "repeat": repeat,
        "pin": pin,
        "untraced_s": base,
        "runs": runs,
    }
    for mode, mode_runs in runs.items():
        if mode != "untraced" and mode_runs:
            t = _median(mode_runs, "elapsed_s")
            out[mode] = {"elapsed_s": t, "slowdown": round(t / base, 4)}
            if "events_per_s" in mode_runs[0]:
                out[mode]["events_per_s"] = _median(mode_runs, "events_per_s")
                out[mode]["lost"] = sum(r["lost"] for r in mode_runs)
            if "stacks_lost" in mode_runs[0]:
                out[mode]["stacks_lost"] = sum(r["stacks_lost"] for r in mode_runs)
    if why_no_perf:
        out["perf"] = {"skipped": why_no_perf}
        if stacks:
            out["perf_g"] = {"skipped": why_no_perf}
    if stacks and why_no_offcputime:
        out["offcputime"] = {"skipped": why_no_offcputime}
    if stacks:
        out |= _stacks_ratios(out)
    x, p = out["xhagent"], out.get("perf", {})
    if "slowdown" in p:
        overhead_x, overhead_p = x["slowdown"] - 1, p["slowdown"] - 1
        out["overhead_ratio_xhagent_to_perf"] = (
            round(overhead_x / overhead_p, 4) if overhead_p > 0 else None
        )
        # undecidable (None) when perf shows no overhead above the noise
        out["target_overhead_at_most_half_of_perf"] = (
            overhead_x <= overhead_p / 2 if overhead_p > 0 else None
        )
    xa = out["xhagent_all"]
    out["target_zero_lost_at_100k_events_per_s"] = (
        x["lost"] == 0 and xa["lost"] == 0 and max(x["events_per_s"], xa["events_per_s"]) >= 100_000
    )
    click.echo(json.dumps(out, indent=None if as_json else 1))
