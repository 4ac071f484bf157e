"""`xhagent bench sched`: algorithm quality from simulation, placement speed from the policy engine.

Quality is measured, not timed, so it does not depend on the machine: the same seeds give
the same figures anywhere. Targets (issue 7): at 80% utilisation with mixed deadlines
EDF's deadline-miss ratio is at most half FIFO's; on a workload with priority inversion
EDF-PIC is compared with EDF on the jobs that wait for a held resource.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import click

from ..cliparams import FiniteFloat
from ..sched import metrics, workload
from ..sched.simulator import NodeSpec, Simulation, slots_of
from ..spec import SpecError
from . import sched_live

LIVE_WORKLOAD = Path(__file__).resolve().parents[2] / "configs/examples/workload-mixed.yaml"

SEEDS = range(1, 6)
NODES = [NodeSpec("sim-node", cpus=2)]

# Tight interactive requests among long batch work with loose deadlines, offered at 80%.
MIXED = """
kind: Workload
metadata: {name: mixed-deadlines-80}
spec:
  duration: 20s
  utilisation: 0.8
  classes:
    - {name: interactive, rate: 50, runtime: {distribution: exponential, mean: 5ms},
       deadlineSlack: {min: 1.5, max: 3}}
    - {name: batch, rate: 10, runtime: {distribution: exponential, mean: 40ms},
       deadlineSlack: {min: 5, max: 20}}
"""

# A low-priority bulk job holds the bus for 30 ms; critical jobs need the bus; medium
# jobs need nothing and have deadlines between the two, so plain EDF lets them preempt
# the holder while a critical job waits.
INVERSION = """
kind: Workload
metadata: {name: priority-inversion}
spec:
  duration: 30s
  classes:
    - {name: bulk, rate: 5, runtime: 30ms, priority: 10, resources: [bus],
       deadlineSlack: {min: 10, max: 20}}
    - {name: critical, rate: 5, runtime: 2ms, priority: 90, resources: [bus], deadline: 50ms}
    - {name: medium, rate: 60, runtime: {distribution: exponential, mean: 8ms},
       deadlineSlack: {min: 3, max: 6}}
"""
NODES_INVERSION = [NodeSpec("sim-node", cpus=1)]


def _runs(w: workload.Workload, nodes: list[NodeSpec], algorithm: str) -> list[dict]:
    capacity = Counter(s.device for s in slots_of(nodes))
    return [
        metrics.summarize(
            Simulation(w.generate(seed, capacity), nodes, algorithm, levels=w.levels).run(),
            w.slas,
            w.window_ns,
        )
        for seed in SEEDS
    ]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def edf_vs_fifo() -> dict:
    w = workload.load_workload_text(MIXED, "<bench:mixed>")
    fifo, edf = _runs(w, NODES, "fifo"), _runs(w, NODES, "edf")
    fifo_miss = _mean(r["deadline_miss_ratio"] for r in fifo)
    edf_miss = _mean(r["deadline_miss_ratio"] for r in edf)
    ratio = edf_miss / fifo_miss if fifo_miss else 0.0
    return {
        "workload": w.name,
        "seeds": list(SEEDS),
        "utilisation": _mean(r["utilisation"]["cpu"] for r in fifo),
        "fifo_miss_ratio": fifo_miss,
        "edf_miss_ratio": edf_miss,
        "edf_over_fifo": ratio,
        "target": "<= 0.5",
        "ok": ratio <= 0.5,
    }


def pic_vs_edf() -> dict:
    w = workload.load_workload_text(INVERSION, "<bench:inversion>")
    edf, pic = _runs(w, NODES_INVERSION, "edf"), _runs(w, NODES_INVERSION, "edf-pic")
    waiter = lambda runs: _mean(r["classes"]["critical"]["error_rate"] for r in runs)  # noqa: E731
    overall = lambda runs: _mean(r["deadline_miss_ratio"] for r in runs)  # noqa: E731
    return {
        "workload": w.name,
        "seeds": list(SEEDS),
        "utilisation": _mean(r["utilisation"]["cpu"] for r in edf),
        "edf_critical_miss_ratio": waiter(edf),
        "edf_pic_critical_miss_ratio": waiter(pic),
        "edf_miss_ratio": overall(edf),
        "edf_pic_miss_ratio": overall(pic),
        "ok": waiter(pic) < waiter(edf),
    }


def simulator_speed() -> dict:
    """Jobs simulated per second (informational: wall-clock, so it varies with the machine's
    load)."""
    w = workload.load_workload_text(MIXED, "<bench:mixed>")
    jobs = w.generate(1, {"cpu": 2})
    start = time.perf_counter()
    Simulation(jobs, NODES, "edf").run()
    elapsed = time.perf_counter() - start
    return {"jobs": len(jobs), "seconds": elapsed, "jobs_per_s": len(jobs) / elapsed}


def placement_speed() -> dict:
    from .placement import placement_speed as measure

    return measure()


@click.command("sched")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--live",
    is_flag=True,
    help="Instead: run a workload both simulated and on a scratch agent (root), and compare "
    "deadline misses and waiting times (sched_live.py; JSON).",
)
@click.option(
    "--workload",
    "workload_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=LIVE_WORKLOAD,
    show_default=True,
    help="With --live: the Workload file (xhagent simulate's format).",
)
@click.option(
    "--seconds",
    type=FiniteFloat(1, 3600, lo_open=False, unit=" s"),
    default=60.0,
    show_default=True,
    help="With --live: how long the workload lasts, its every time stretched to fit.",
)
@click.option(
    "--algorithm",
    "algorithms",
    type=click.Choice(sched_live.CHOICES),
    multiple=True,
    help="With --live: the node orders to compare (repeatable) [default: priority, edf and "
    "edf-pic].",
)
@click.option(
    "--cpus",
    type=click.IntRange(1),
    default=None,
    help="With --live: the CPUs of the node, simulated and given to the scratch agent (the "
    "first of this process's; the others reserved) [default: all of this process's].",
)
@click.option("--seed", type=click.IntRange(0), default=1, show_default=True)
def bench_sched(as_json, live, workload_path, seconds, algorithms, cpus, seed) -> None:
    """Scheduling quality (EDF vs FIFO, EDF-PIC vs EDF) and placement speed; with --live,
    the simulator against the live agent."""
    if live:
        try:
            report = sched_live.main(workload_path, seconds, seed, algorithms, cpus)
        except (SpecError, OSError, RuntimeError, ValueError) as exc:
            click.echo(f"xhagent bench sched --live: {exc}", err=True)
            bad = (SpecError, workload.TooManyJobs, sched_live.TooManyCpus)
            sys.exit(2 if isinstance(exc, bad) else 1)
        click.echo(json.dumps(report, indent=2))
        return
    results = {"schema": 1}
    for name, step in (
        ("edf_vs_fifo", edf_vs_fifo),
        ("pic_vs_edf", pic_vs_edf),
        ("simulator_speed", simulator_speed),
        ("placement_speed", placement_speed),
    ):
        click.echo(f"bench sched: {name}...", err=True)
        results[name] = step()
    results["quality_ok"] = results["edf_vs_fifo"]["ok"] and results["pic_vs_edf"]["ok"]
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    q, p = results["edf_vs_fifo"], results["pic_vs_edf"]
    click.echo(
        f"EDF vs FIFO at {q['utilisation']:.0%}: miss {q['edf_miss_ratio']:.4f} "
        f"vs {q['fifo_miss_ratio']:.4f}"
        f" = {q['edf_over_fifo']:.3f}x (target <= 0.5)  {'ok' if q['ok'] else 'FAIL'}"
    )
    click.echo(
        f"EDF-PIC vs EDF, jobs waiting on a held resource: "
        f"miss {p['edf_pic_critical_miss_ratio']:.4f}"
        f" vs {p['edf_critical_miss_ratio']:.4f}  {'ok' if p['ok'] else 'FAIL'}"
    )
    click.echo(f"simulator: {results['simulator_speed']['jobs_per_s']:.0f} jobs/s")
    click.echo(f"placement: {json.dumps(results['placement_speed'])}")
