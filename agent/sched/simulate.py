"""`xhagent simulate`: run a workload through one algorithm and report how it went."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import click

from ..node_model import ModelError
from ..policy.documents import DocumentError, load_items
from ..policy.policy import SchedulingPolicy, deciding_queueing, queueing_in_force
from ..spec import SpecError
from . import metrics
from . import nodes as node_model
from . import workload as workload_model
from .mlq import MultiLevel
from .queues import ALGORITHMS, DESCRIPTIONS
from .simulator import Simulation, SimulationError, slots_of
from .workload import TooManyJobs

# Caps that bound a run's memory and time (about 1 KiB and 30 us per job); the flags raise them.
MAX_JOBS = 500_000
MAX_NODES = 1000
MAX_SLOTS = 250_000  # CPUs, GPUs and TPUs of all nodes: each is a slot the simulator tracks


class OverLimit(Exception):
    """The inputs are valid but this run would exceed a cap: exit 1."""


class Progress:
    """A line on stderr now and then, once a run has taken more than a second."""

    def __init__(self, echo: Callable[[str], None], after_s: float = 1.0, every_s: float = 2.0):
        self.echo, self.after_s, self.every_s = echo, after_s, every_s
        self.start = time.monotonic()
        self.next = self.start + after_s

    def __call__(self, finished: int, total: int) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + self.every_s
            self.echo(
                f"xhagent simulate: {finished} of {total} "
                f"jobs done ({finished / max(total, 1):.0%}), "
                f"{now - self.start:.0f} s"
            )


def simulate(
    workload_path: str,
    nodes_path: str,
    algorithm: str | None,
    seed: int,
    *,
    max_jobs: int = MAX_JOBS,
    max_nodes: int = MAX_NODES,
    max_slots: int = MAX_SLOTS,
    progress: Callable[[int, int], None] | None = None,
    warn: Callable[[str], None] = lambda line: None,
    policy_path: str | None = None,
) -> dict:
    """The report `--json` prints; raises SpecError, ModelError or SimulationError on bad
    input, OverLimit past a cap. `algorithm` None: the order the policies give the node
    (their `spec.queueing`), else DEFAULT_ALGORITHM."""
    policies = load_policies(policy_path, warn) if policy_path else []
    algorithm = _algorithm(algorithm, policies, warn)
    w = workload_model.load_workload(workload_path)
    node_order, _ = deciding_queueing(policies)
    if algorithm == "mlq" and node_order.algorithm == "mlq" and node_order.levels:
        # the node's levels: the order the policies give the node is what is simulated
        w.levels = MultiLevel(node_order.levels)
    elif algorithm == "mlq" and w.levels is None:
        warn(
            f"xhagent simulate: warning: {workload_path} has no queues:, "
            "so mlq uses the default levels "
            "hot (affinity tier: hot), normal (every other job), cold (tier: cold)"
        )
    nodes = node_model.load_node_specs(nodes_path)
    if len(nodes) > max_nodes:
        raise OverLimit(f"{nodes_path}: {len(nodes)} nodes, more than --max-nodes {max_nodes}")
    slots = sum(n.cpus + n.gpus * n.gpu_shares + n.tpus for n in nodes)
    if slots > max_slots:
        raise OverLimit(
            f"{nodes_path}: {slots} CPUs, GPUs and TPUs in all, more than --max-slots {max_slots}"
        )
    if any(n.gpu_memory for n in nodes):
        w.check_gpu_memory(max(n.gpu_memory for n in nodes))
    elif algorithm == "dwps":
        warn(
            f"xhagent simulate: warning: {nodes_path} gives no GPU gpuMemory, "
            "so dwps has no memory to defragment and runs as edf"
        )
    capacity = Counter(slot.device for slot in slots_of(nodes))
    try:
        jobs = w.generate(seed, capacity, max_jobs)
    except TooManyJobs as exc:
        raise OverLimit(f"{workload_path}: {exc}") from None
    migration = next((p.migration for p in policies if p.migration is not None), None)
    try:
        run = partial(Simulation, jobs, nodes, algorithm, levels=w.levels)
        outcome = run(migration=migration, policies=tuple(policies)).run(progress)
        # The same jobs without the controller: what its moves changed.
        without = run().run(progress) if migration is not None else None
    except SimulationError as exc:
        raise SimulationError(f"{workload_path}: {exc}") from None
    report = metrics.summarize(outcome, w.slas, w.window_ns)
    if without is not None:
        report["migration"] = metrics.migration(outcome, without, w.slas, w.window_ns)
    return {"schema": 1, "workload": w.name, "seed": seed, **report}


def _algorithm(asked: str | None, policies: list, warn: Callable[[str], None]) -> str:
    """The algorithm to simulate: the one asked, else the node's order under `policies`
    (the agent's own rule), else DEFAULT_ALGORITHM."""
    node, decider = queueing_in_force(policies)
    if asked is None:
        return node if decider else DEFAULT_ALGORITHM
    if decider and asked != node:
        warn(
            f"xhagent simulate: warning: policy {decider!r} orders the node by {node}; "
            f"simulating --algorithm {asked} instead"
        )
    return asked


def load_policies(path: str, warn: Callable[[str], None]) -> list[SchedulingPolicy]:
    """The file's SchedulingPolicies, highest priority first (ties: by name): their rules are
    the jobs' hard constraints, the first one's `spec.migration` the controller's settings."""
    policies = [p for p in load_items(path) if isinstance(p, SchedulingPolicy)]
    if not policies:
        raise DocumentError(f"{path}: no SchedulingPolicy in the file")
    policies.sort(key=lambda p: (-p.priority, p.name))
    if all(p.migration is None for p in policies):
        warn(
            f"xhagent simulate: warning: {path} has no spec.migration, "
            "so no migration controller runs"
        )
    return policies


def render(report: dict) -> str:
    lines = [
        (
            f"workload {report['workload']}  algorithm {report['algorithm']}  "
            f"seed {report['seed']}  jobs {report['jobs']}"
        ),
        f"deadline-miss ratio  {report['deadline_miss_ratio']:.4f}",
        "waiting ms           "
        + "  ".join(f"{k} {v:.3f}" for k, v in report["waiting_ms"].items()),
        f"preemptions          {report['preemptions']}  migrations {report['migrations']}",
        "utilisation          "
        + "  ".join(f"{d} {u:.1%}" for d, u in report["utilisation"].items()),
        *_gpu_memory_lines(report.get("gpu_memory")),
        *_migration_lines(report.get("migration")),
        "",
        (
            f"{'class':<16}{'jobs':>7}{'p95 ms':>10}{'SLA p95':>10}"
            f"{'errors':>9}{'SLA err':>9}{'SLA viol.':>11}  ok"
        ),
    ]
    for name, c in report["classes"].items():
        sla_p95 = "-" if c["sla_p95_latency_ms"] is None else f"{c['sla_p95_latency_ms']:.1f}"
        sla_err = "-" if c["sla_error_rate"] is None else f"{c['sla_error_rate']:.2%}"
        lines.append(
            f"{name:<16}{c['jobs']:>7}{c['p95_latency_ms']:>10.2f}{sla_p95:>10}{c['error_rate']:>9.2%}"
            f"{sla_err:>9}{c['sla_violation_rate']:>11.1%}  {'yes' if c['meets_sla'] else 'NO'}"
        )
    return "\n".join(lines)


def _gpu_memory_lines(g: dict | None) -> list[str]:
    if g is None:
        return []
    failed = g["failed_allocations"]
    lines = [
        f"failed allocations   fragmentation {failed['fragmentation']}  "
        f"capacity {failed['capacity']}"
    ]
    if g["threshold_path"]:
        path = "  ".join(f"{t:.1f}ms {v:.2f}" for t, v in g["threshold_path"])
        lines += [
            f"dwps                 avoided {g['avoided']}  "
            f"failed compactions {g['failed_compactions']}",
            f"dwps threshold       {path}",
        ]
    return lines


def _migration_lines(m: dict | None) -> list[str]:
    if m is None:
        return []
    w = m["without"]
    lines = [
        f"migration            every {m['interval_ms']:g} ms, hot > {m['hot_above']:g}, "
        f"idle < {m['idle_below']:g}: {len(m['moves'])} moves",
        f"  with / without     deadline-miss ratio {m['deadline_miss_ratio']:.4f} / "
        f"{w['deadline_miss_ratio']:.4f}  missed {m['missed']} / {w['missed']}",
    ]
    for e in m["moves"][:10]:
        lines.append(
            f"  {e['at_ms']:>10.1f} ms  {e['task']}: {e['src']} -> {e['dst']} ({e['reason']})"
        )
    if len(m["moves"]) > 10:
        lines.append(f"  ... {len(m['moves']) - 10} more (--json lists them all)")
    return lines


DEFAULT_ALGORITHM = "edf"  # with no --algorithm and no policy that orders the node
ALGORITHM_HELP = "; ".join(f"{name}: {what}" for name, what in DESCRIPTIONS.items()) + "."


@click.command("simulate")
@click.option(
    "--workload",
    "workload_path",
    required=True,
    metavar="W.yaml",
    help="Workload file (kind: Workload).",
)
@click.option(
    "--nodes",
    "nodes_path",
    required=True,
    metavar="N.yaml",
    help="Nodes: the inventory node model, or nodes: [{name, cpus, gpus}].",
)
@click.option(
    "--algorithm",
    type=click.Choice(ALGORITHMS),
    default=None,
    help=f"{ALGORITHM_HELP} Default: the --policy file's spec.queueing, else {DEFAULT_ALGORITHM}.",
)
@click.option(
    "--seed", type=int, default=1, show_default=True, help="Same seed, same arrivals, same report."
)
@click.option(
    "--max-jobs",
    type=click.IntRange(1, 100_000_000),
    default=MAX_JOBS,
    show_default=True,
    help="Refuse (exit 1) a workload that generates more jobs than this.",
)
@click.option(
    "--max-nodes",
    type=click.IntRange(1, 1_000_000),
    default=MAX_NODES,
    show_default=True,
    help="Refuse (exit 1) a nodes file with more nodes than this.",
)
@click.option(
    "--max-slots",
    type=click.IntRange(1, 100_000_000),
    default=MAX_SLOTS,
    show_default=True,
    help="Refuse (exit 1) nodes with more CPUs, GPUs and TPUs in all than this.",
)
@click.option(
    "--policy",
    "policy_path",
    metavar="P.yaml",
    help="SchedulingPolicy file: its spec.migration runs the migration controller (reported "
    "against the same run without it), its spec.queueing is the algorithm unless "
    "--algorithm says, its rules are the jobs' hard constraints.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def simulate_command(
    workload_path: str,
    nodes_path: str,
    algorithm: str | None,
    seed: int,
    max_jobs: int,
    max_nodes: int,
    max_slots: int,
    policy_path: str | None,
    as_json: bool,
) -> None:
    """Discrete-event simulation of a workload under one queueing algorithm.

    Exit status: 0 ok, 1 refused (past --max-jobs, --max-nodes or --max-slots), 2 bad input."""
    echo = partial(click.echo, err=True)
    try:
        report = simulate(
            workload_path,
            nodes_path,
            algorithm,
            seed,
            max_jobs=max_jobs,
            max_nodes=max_nodes,
            max_slots=max_slots,
            progress=Progress(echo),
            warn=echo,
            policy_path=policy_path,
        )
    except (SpecError, ModelError, SimulationError, DocumentError) as exc:
        echo(f"xhagent simulate: {exc}")
        sys.exit(2)
    except OverLimit as exc:
        echo(f"xhagent simulate: {exc}")
        sys.exit(1)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
