"""`xhagent bench trace`: the ping-pong workload timed untraced, traced system-wide by
xhagent, and traced by `perf record -e sched:sched_switch -a` where perf works;
slowdown ratios, events/s sustained, lost events. The workload times its own loop,
so recorder start-up and shutdown are not counted.

With --stacks, the same with stacks at each switch-out. Kernel stacks on the Python
ping-pong: xhagent --stacks kernel beside `perf record -g --kernel-callchains` and
libbpf-tools' offcputime, and the floor: xhagent's program taking each stack and recording
nothing, what the kernel's unwinder alone costs. Kernel and user stacks on the C ping-pong
(frame pointers: whole user stacks): xhagent --stacks both beside `perf record -g`,
offcputime (which always takes both) and the same floor."""

from __future__ import annotations

import contextlib
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

from ..trace.workload import build_c

WORKLOAD = [sys.executable, "-m", "xhagent.trace.workload"]
PINS = ("same", "split", "none")
TRACEFS = "/sys/kernel/tracing"


def _workload_result(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"the ping-pong workload printed no result: {stdout[-300:]!r}")


def workload(rounds: int, pin: str, program: list[str] = WORKLOAD) -> list[str]:
    return [*program, str(rounds), "--pin", pin]


def run_untraced(command: list[str]) -> dict:
    res = subprocess.run(command, capture_output=True, text=True, check=True)
    return {"elapsed_s": _workload_result(res.stdout)["elapsed_s"]}


def run_xhagent(
    command: list[str], path: str, events: tuple[str, ...] | None = None, stacks: str = "none"
) -> dict:
    from ..trace.recorder import record

    with tempfile.TemporaryFile("w+") as out:
        res = record(
            path,
            command=command,
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


def run_stacks_floor(command: list[str], user: bool) -> dict:
    """The workload while xhagent's switch program takes each switch-out's kernel stack
    (and user stack with `user`), system-wide, and records nothing: what the stacks alone
    cost, the floor under any tracer that takes them at every switch."""
    from ..bpf.sched_trace import SchedTrace

    with SchedTrace() as st, tempfile.TemporaryFile() as sink:
        st.take_stacks(kernel=True, user=user, only=True)
        st.start(sink.fileno(), ("switch",))
        return run_untraced(command)


OFFCPUTIME_ATTACH_S = 1.0  # offcputime says nothing once attached: give its load this long


@contextlib.contextmanager
def offcputime_attached():
    """libbpf-tools' offcputime (all threads, kernel and user stacks) attached for the body;
    the list it yields gets its summary, which it prints when stopped (SIGINT) after it."""
    tool = subprocess.Popen(
        [shutil.which("offcputime"), "--stack-storage-size", "16384"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    summary: list[str] = []
    try:
        time.sleep(OFFCPUTIME_ATTACH_S)
        if tool.poll() is not None:
            raise RuntimeError(f"offcputime exited {tool.returncode}: {tool.stderr.read()[-400:]}")
        yield summary
    finally:
        tool.send_signal(signal.SIGINT)
        out, _ = tool.communicate(timeout=60)
        summary.append(out)


def run_offcputime(command: list[str]) -> dict:
    """The workload under offcputime, started first and stopped after it."""
    with offcputime_attached():
        return run_untraced(command)


def parse_offcputime(text: str) -> dict[tuple[int, tuple[str, ...]], int]:
    """libbpf-tools offcputime's summary: (pid, kernel frames innermost first, without the
    tracing machinery's) -> microseconds, stacks with the same kernel frames summed."""
    from ..trace.stacks import UNKNOWN, Frame, trim_tracing

    out: dict[tuple[int, tuple[str, ...]], int] = {}
    for block in text.split("\n\n"):
        lines = [ln.strip() for ln in block.strip("\n").splitlines()]
        who = next((i for i, ln in enumerate(lines) if ln.startswith("- ")), None)
        if who is None or who + 1 >= len(lines) or not lines[who + 1].isdigit():
            continue
        m = re.search(r"\((\d+)\)$", lines[who])
        if m is None:
            continue
        names = [ln.split()[0] for ln in lines[:who] if ln and ln != "--"]
        frames = trim_tracing([Frame(0, n, 0, UNKNOWN) for n in names])
        key = (int(m.group(1)), tuple(f.symbol for f in frames))
        out[key] = out.get(key, 0) + int(lines[who + 1])
    return out


AGREEMENT_MIN_SHARE = 0.01  # stacks compared: those holding this much of a thread's time
AGREE_ROUNDS, AGREE_SLEEPS = 20_000, 1_000  # the ping-pong's rounds; the sleeper's
LONG_BLOCK_US = 100


def offcpu_agreement(command: list[str], path: str) -> dict:
    """xhagent (--stacks kernel) and offcputime attached to the same run of the ping-pong
    `command`: each thread's off-CPU time by kernel stack from both, for the stacks holding
    at least 1% of it, and the largest difference relative to offcputime's, over all of them
    and over those whose blocks last 100 us or more on average."""
    from ..trace.fmt import TraceFile
    from ..trace.offcpu import off_cpu
    from ..trace.recorder import record

    with offcputime_attached() as summary, tempfile.TemporaryFile("w+") as out:
        record(path, command=command, command_stdout=out, events=("switch",), stacks="kernel")
        out.seek(0)
        work = _workload_result(out.read())
    pids = (work["ping"], work["pong"])
    theirs = {k: us for k, us in parse_offcputime(summary[0]).items() if k[0] in pids}
    trace = TraceFile(path)
    ours: dict[tuple[int, tuple[str, ...]], list[float]] = {}
    for b in off_cpu(trace, trace.stacks(), pids, 1000, trace.header.meta.get("filter")):
        acc = ours.setdefault((b.pid, tuple(f.symbol for f in b.frames)), [0.0, 0])
        acc[0] += b.total_ns / 1000
        acc[1] += b.count
    stacks = []
    for pid in pids:
        total = sum(us for (p, _), us in theirs.items() if p == pid)
        for (p, frames), us in sorted(theirs.items(), key=lambda kv: -kv[1]):
            if p != pid or us < AGREEMENT_MIN_SHARE * total:
                continue
            mine, blocks = ours.get((p, frames), [0.0, 0])
            stacks.append(
                {"pid": p, "frames": list(frames[:4]), "offcputime_us": us,
                 "xhagent_us": round(mine), "blocks": blocks,
                 "mean_block_us": round(mine / blocks, 1) if blocks else None,
                 "diff": round((mine - us) / us, 4)}
            )  # fmt: skip
    long = [x for x in stacks if (x["mean_block_us"] or 0) >= LONG_BLOCK_US]
    return {
        "rounds": work["rounds"],
        "stacks": stacks,
        "max_abs_diff": max((abs(x["diff"]) for x in stacks), default=None),
        # blocks long beside a tracer's own few us at a switch: what the two count alike
        "max_abs_diff_long_blocks": max((abs(x["diff"]) for x in long), default=None),
    }


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


def run_perf(command: list[str], data: str, stacks: str = "none") -> dict:
    res = subprocess.run(
        perf_command(shutil.which("perf"), data, command, stacks),
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


def _overhead_ratio(out: dict, mode: str, peer: str) -> float | None:
    """`mode`'s added slowdown over `peer`'s (None: the peer shows none above the noise,
    or one of them did not run)."""
    x, p = out.get(mode, {}).get("slowdown"), out.get(peer, {}).get("slowdown")
    if x is None or p is None or p - 1 <= 0:
        return None
    return round((x - 1) / (p - 1), 4)


def _stacks_ratios(out: dict) -> dict:
    """With kernel stacks (the Python ping-pong) and with both (the C one), xhagent's added
    slowdown against each peer's and the floor's against perf -g's: a floor above half of
    perf -g's puts the target past what the kernel's unwinder allows."""
    ratios: dict = {}
    for mode, floor, peers in (
        ("xhagent_stacks", "stacks_floor", ("perf_g", "offcputime")),
        ("xhagent_both_c", "stacks_floor_both_c", ("perf_g_both_c", "offcputime_c")),
    ):
        for peer in peers:
            ratios[f"overhead_ratio_{mode}_to_{peer}"] = _overhead_ratio(out, mode, peer)
        ratios[f"overhead_ratio_{floor}_to_{peers[0]}"] = _overhead_ratio(out, floor, peers[0])
    peer = ratios["overhead_ratio_xhagent_stacks_to_perf_g"]
    ratios["target_stacks_overhead_at_most_half_of_perf_g"] = None if peer is None else peer <= 0.5
    floor = ratios["overhead_ratio_stacks_floor_to_perf_g"]
    ratios["stacks_target_above_floor"] = None if floor is None else floor <= 0.5
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
    help="Also with stacks at each switch-out: kernel stacks (xhagent --stacks kernel, perf -g "
    "--kernel-callchains, offcputime, the unwinder's floor) on the Python ping-pong, and kernel "
    "and user stacks (--stacks both, perf -g, offcputime, the floor) on the C one, built here.",
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
    with tempfile.TemporaryDirectory() as tmp:
        py = workload(rounds, pin)
        xht, data = os.path.join(tmp, "x.xht"), os.path.join(tmp, "perf.data")
        # mode -> (its baseline, how it runs, what it needs); "xhagent" records what perf
        # records (sched_switch, system-wide); "xhagent_all" adds sched_waking,
        # sched_wakeup(_new), exit and fork, the default of `xhagent trace record`
        modes = {
            "untraced": (None, lambda: run_untraced(py), None),
            "xhagent": ("untraced", lambda: run_xhagent(py, xht, ("switch",)), None),
            "xhagent_all": ("untraced", lambda: run_xhagent(py, xht), None),
            "perf": ("untraced", lambda: run_perf(py, data), why_no_perf),
        }
        if stacks:
            try:
                cprog, no_c = build_c(tmp), None
            except RuntimeError as exc:  # the rows on the Python ping-pong still run
                cprog, no_c = ["false"], str(exc)
            c = workload(rounds, pin, cprog)
            modes |= {
                "xhagent_stacks": (
                    "untraced",
                    lambda: run_xhagent(py, xht, ("switch",), "kernel"),
                    None,
                ),
                "stacks_floor": ("untraced", lambda: run_stacks_floor(py, False), None),
                "perf_g": ("untraced", lambda: run_perf(py, data, "kernel"), why_no_perf),
                "offcputime": ("untraced", lambda: run_offcputime(py), why_no_offcputime),
                "untraced_c": (None, lambda: run_untraced(c), no_c),
                "xhagent_both_c": (
                    "untraced_c",
                    lambda: run_xhagent(c, xht, ("switch",), "both"),
                    no_c,
                ),
                "stacks_floor_both_c": ("untraced_c", lambda: run_stacks_floor(c, True), no_c),
                "perf_g_both_c": (
                    "untraced_c",
                    lambda: run_perf(c, data, "both"),
                    no_c or why_no_perf,
                ),
                "offcputime_c": (
                    "untraced_c",
                    lambda: run_offcputime(c),
                    no_c or why_no_offcputime,
                ),
            }
        runs: dict[str, list[dict]] = {m: [] for m, (_, _, why) in modes.items() if why is None}
        for i in range(repeat):  # interleaved, so that background noise hits all modes
            click.echo(f"bench trace: round {i + 1}/{repeat}", err=True)
            for mode in runs:
                runs[mode].append(modes[mode][1]())
        agreement = None
        if stacks and (no_c or why_no_offcputime) is None:
            click.echo("bench trace: off-CPU time beside offcputime", err=True)
            agreement = {
                # blocks of ~25 us: each tracer's own time at a switch is a tenth of one
                "pingpong": offcpu_agreement(workload(AGREE_ROUNDS, pin, cprog), xht),
                # blocks of ~1 ms: what the two count, with that time a few thousandths
                "sleeper_1ms": offcpu_agreement(
                    [*workload(AGREE_SLEEPS, pin, cprog), "--sleep-us", "1000"], xht
                ),
            }
    out: dict = {
        "benchmark": "trace",
        "rounds": rounds,
        "repeat": repeat,
        "pin": pin,
        "untraced_s": _median(runs["untraced"], "elapsed_s"),
        "runs": runs,
    }
    for mode, (base, _, why) in modes.items():
        if why is not None:
            out[mode] = {"skipped": why}
        elif base is None:
            out[mode] = {"elapsed_s": _median(runs[mode], "elapsed_s")}
        else:
            out[mode] = _summary(runs[mode], _median(runs[base], "elapsed_s"))
    if stacks:
        out |= _stacks_ratios(out)
        out["offcpu_agreement"] = agreement or {"skipped": no_c or why_no_offcputime}
        if agreement:
            worst = agreement["sleeper_1ms"]["max_abs_diff_long_blocks"]
            out["target_offcpu_within_5_percent_of_offcputime"] = (
                None if worst is None else worst <= 0.05
            )
    x, p = out["xhagent"], out["perf"]
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


def _summary(mode_runs: list[dict], base: float) -> dict:
    t = _median(mode_runs, "elapsed_s")
    summary = {"elapsed_s": t, "slowdown": round(t / base, 4)}
    if "events_per_s" in mode_runs[0]:
        summary["events_per_s"] = _median(mode_runs, "events_per_s")
        summary["lost"] = sum(r["lost"] for r in mode_runs)
    if "stacks_lost" in mode_runs[0]:
        summary["stacks_lost"] = sum(r["stacks_lost"] for r in mode_runs)
    return summary
