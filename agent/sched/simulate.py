"""`xhagent simulate`: run a workload through one algorithm and report how it went."""
from __future__ import annotations

import json
import sys
from collections import Counter

import click

from ..inventory.model import ModelError
from ..spec import SpecError
from . import metrics, nodes as node_model, workload as workload_model
from .queues import ALGORITHMS
from .simulator import Simulation, SimulationError, slots_of


def simulate(workload_path: str, nodes_path: str, algorithm: str, seed: int) -> dict:
    """The report `--json` prints; raises SpecError, ModelError or SimulationError on bad input."""
    w = workload_model.load(workload_path)
    nodes = node_model.load(nodes_path)
    capacity = Counter(slot.device for slot in slots_of(nodes))
    try:
        jobs = w.generate(seed, capacity)
        outcome = Simulation(jobs, nodes, algorithm, levels=w.levels).run()
    except SimulationError as exc:
        raise SimulationError(f"{workload_path}: {exc}") from None
    report = metrics.summarize(outcome, w.slas, w.window_ns)
    return {"schema": 1, "workload": w.name, "seed": seed, **report}


def render(report: dict) -> str:
    lines = [
        f"workload {report['workload']}  algorithm {report['algorithm']}  seed {report['seed']}  jobs {report['jobs']}",
        f"deadline-miss ratio  {report['deadline_miss_ratio']:.4f}",
        "waiting ms           " + "  ".join(f"{k} {v:.3f}" for k, v in report["waiting_ms"].items()),
        f"preemptions          {report['preemptions']}  migrations {report['migrations']}",
        "utilisation          " + "  ".join(f"{d} {u:.1%}" for d, u in report["utilisation"].items()),
        "",
        f"{'class':<16}{'jobs':>7}{'p95 ms':>10}{'SLA p95':>10}{'errors':>9}{'SLA err':>9}{'SLA viol.':>11}  ok",
    ]
    for name, c in report["classes"].items():
        sla_p95 = "-" if c["sla_p95_latency_ms"] is None else f"{c['sla_p95_latency_ms']:.1f}"
        sla_err = "-" if c["sla_error_rate"] is None else f"{c['sla_error_rate']:.2%}"
        lines.append(f"{name:<16}{c['jobs']:>7}{c['p95_latency_ms']:>10.2f}{sla_p95:>10}{c['error_rate']:>9.2%}"
                     f"{sla_err:>9}{c['sla_violation_rate']:>11.1%}  {'yes' if c['meets_sla'] else 'NO'}")
    return "\n".join(lines)


@click.command("simulate")
@click.option("--workload", "workload_path", required=True, metavar="W.yaml", help="Workload file (kind: Workload).")
@click.option("--nodes", "nodes_path", required=True, metavar="N.yaml",
              help="Nodes: the inventory node model, or nodes: [{name, cpus, gpus}].")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default="edf", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True, help="Same seed, same arrivals, same report.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def simulate_command(workload_path: str, nodes_path: str, algorithm: str, seed: int, as_json: bool) -> None:
    """Discrete-event simulation of a workload under one queueing algorithm."""
    try:
        report = simulate(workload_path, nodes_path, algorithm, seed)
    except (SpecError, ModelError, SimulationError) as exc:
        click.echo(f"xhagent simulate: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
