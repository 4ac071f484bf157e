"""`xhagent policy validate` and `xhagent policy explain`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..cpulist import format_cpulist
from ..quantity import human
from .documents import InputError, Inputs, describe_item, load, load_all, load_any, policy_files
from .placement import Candidate, Demand, Peers, Reason, decide, evaluate
from .policy import Policy, choose, tie_warnings
from .state import Cluster
from .task import Task

EXIT_INPUT = 2
EXIT_PENDING = 3


@click.group()
def policy() -> None:
    """XSL scheduling policies, tasks and node models: validate them, explain placements."""


@policy.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="Print {files: {FILE: {ok, items | error, errors}}, warnings} as JSON.")
def validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Check input FILES of any kind: SchedulingPolicy, Task, CgroupPolicy and Workload files
    (by `kind`), node models and the agent config. Every error of a file is listed, each
    FILE:LINE:COL. Exit 0 when all are valid, 2 if any is not. A CgroupPolicy's devices
    are looked up on this node."""
    report, policies, failed = {}, [], False
    for path in files:
        try:
            items = load_any(path)
        except InputError as exc:
            failed = True
            report[str(path)] = {"ok": False, "error": str(exc), "errors": exc.located()}
            if not as_json:
                click.echo(str(exc), err=True)
            continue
        policies += [i for i in items if isinstance(i, Policy)]
        names = [describe_item(i) for i in items]
        # A well-formed CgroupPolicy may name devices this node lacks: the file is valid,
        # `cgroup plan` refuses it here (exit 1), so say so without failing the file.
        notes = [f"{a} (cgroup plan refuses it on this node)" for i in items for a in getattr(i, "absent", [])]
        report[str(path)] = {"ok": True, "items": names, "notes": notes}
        if not as_json:
            click.echo(f"{path}: ok ({', '.join(names)})")
            for note in notes:
                click.echo(f"  note: {note}")
    warnings = tie_warnings(policies)
    if as_json:
        click.echo(json.dumps({"files": report, "warnings": warnings}, indent=2))
    else:
        for w in warnings:
            click.echo(f"warning: {w}", err=True)
    if failed:
        sys.exit(EXIT_INPUT)


@policy.command(epilog="Exit status: 0 every task is placed, 3 at least one is Pending, 2 bad input.")
@click.option("--task", "task_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A Task file (every Task in it is explained).")
@click.option("--policies", "policy_paths", multiple=True, type=click.Path(path_type=Path),
              help="A policy file or a directory of them (repeatable); other kinds in a directory are skipped.")
@click.option("--nodes", "nodes_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A node model file (default: this machine's inventory).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision and every node's verdict as JSON.")
def explain(task_file: Path, policy_paths: tuple[Path, ...], nodes_file: Path | None, as_json: bool) -> None:
    """Where each task would be placed and why, or why not, node by node."""
    try:
        inputs = _inputs(task_file, policy_paths, nodes_file)
    except InputError as exc:
        click.echo(f"xhagent policy explain: {exc}", err=True)
        sys.exit(EXIT_INPUT)
    cluster = Cluster.of(inputs.nodes)
    reports = [_explain(t, inputs.policies, cluster) for t in inputs.tasks]
    warnings = tie_warnings(inputs.policies)
    if as_json:
        click.echo(json.dumps({"schema": 2, "tasks": reports, "warnings": warnings}, indent=2))
    else:
        for w in warnings:
            click.echo(f"warning: {w}", err=True)
        for r in reports:
            click.echo(_render(r))
    if any(r["pending"] for r in reports):
        sys.exit(EXIT_PENDING)


def _inputs(task_file: Path, policy_paths, nodes_file) -> Inputs:
    inputs = Inputs()
    tasks = load(task_file)
    inputs.tasks = [t for t in tasks if isinstance(t, Task)]
    if not inputs.tasks:
        raise InputError(f"{task_file}: no kind: Task document in it")
    for path in policy_paths:
        if path.is_dir():
            for f in policy_files(path):
                inputs.policies += [i for i in load(f) if isinstance(i, Policy)]
        else:
            found = [i for i in load(path) if isinstance(i, Policy)]
            if not found:
                raise InputError(f"{path}: no kind: SchedulingPolicy document in it")
            inputs.policies += found
    if nodes_file is not None:
        inputs.nodes = load_all([nodes_file]).nodes
        if not inputs.nodes:
            raise InputError(f"{nodes_file}: not a node model")
    else:
        inputs.nodes = [_this_node()]
    return inputs


def _this_node():
    from ..inventory import build_model, discover
    try:
        return build_model(discover())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot read this node's inventory ({reason}); give a node model with --nodes FILE") from None


def _explain(task: Task, policies: list[Policy], cluster: Cluster) -> dict:
    match = choose(policies, task.label_map)
    demand = Demand.of(task, match)
    decision = decide(task, match, cluster)
    peers = Peers(cluster) if demand.needs_peers else None
    nodes = {}
    for name, st in cluster.nodes.items():
        verdict = evaluate(demand, st, peers)
        if decision.placed is None or isinstance(verdict, Reason):
            verdict = next((r for r in decision.reasons if r.node == name), verdict)
        nodes[name] = ({"feasible": False, "kind": verdict.kind, "reason": str(verdict)} if isinstance(verdict, Reason)
                       else {"feasible": True, "score": verdict.score})
    pol = match.policy
    return {
        "task": task.name,
        "device_type": task.device_type,
        "policy": pol.name if pol else None,
        "policy_priority": pol.priority if pol else None,
        "preemption": pol.preemption if pol else None,
        "tied_with": list(match.tied_with),
        "demand": describe(demand),
        "pending": decision.placed is None,
        "placed": _candidate(decision.placed) if decision.placed else None,
        "nodes": nodes,
    }


def _candidate(c: Candidate) -> dict:
    return {"node": c.node, "cpus": list(c.cpus), "memory": c.memory,
            "gpus": [{"index": g.index, "memory": g.memory, "whole": g.whole} for g in c.gpus],
            "score": c.score, "parts": dict(c.parts)}


def describe(d: Demand) -> str:
    parts = [f"{d.cpus} CPU{'' if d.cpus == 1 else 's'}" + (" on whole cores" if d.smt_exclusive else "") + (" on one NUMA node" if d.numa_single else "")]
    if d.memory:
        parts.append(f"{human(d.memory)} memory")
    if d.gpus:
        each = f" with {human(d.gpu_memory)} free" if d.gpu_memory is not None else " (whole)"
        parts.append(f"{d.gpus} GPU{'s' if d.gpus > 1 else ''}{each}")
    if d.min_cuda:
        parts.append(f"CUDA >= {d.min_cuda[0]}.{d.min_cuda[1]}")
    if d.gpu_model:
        parts.append(f"GPU model {d.gpu_model}")
    if d.numa_affinity != "none":
        parts.append(f"NUMA affinity {d.numa_affinity}")
    if d.io_class:
        parts.append(f"IO class {d.io_class}")
    if d.zone:
        parts.append(f"zone {d.zone}")
    if d.rack_affinity:
        parts.append(f"rack {d.rack_affinity} as {d.rack_peers}")
    if d.same_node_as:
        parts.append(f"on a node running {d.same_node_as}")
    if d.away_from:
        parts.append(f"away from {d.away_from}")
    if d.device_type == "tpu":
        parts.append("a TPU")
    return ", ".join(parts)


def _render(r: dict) -> str:
    pol = (f"policy {r['policy']} (priority {r['policy_priority']}, preemption {r['preemption']})"
           if r["policy"] else "no policy matches (defaults)")
    lines = [f"task {r['task']} ({r['device_type']}): {pol}", f"  needs: {r['demand']}"]
    if r["tied_with"]:
        lines.append(f"  warning: tied with {', '.join(r['tied_with'])} at the same priority")
    if r["placed"]:
        p = r["placed"]
        gpus = ", ".join(f"GPU {g['index']} ({'whole' if g['whole'] else human(g['memory'])})" for g in p["gpus"])
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p["parts"].items())
        lines.append(f"  placed on {p['node']}: score {p['score']:.1f} ({parts})")
        cpus = format_cpulist(p["cpus"], empty="none")
        lines.append(f"    cpus {cpus}" + (f", {gpus}" if gpus else ""))
    else:
        lines.append("  Pending: no node satisfies the hard constraints")
    for name, v in r["nodes"].items():
        lines.append(f"  {name}: " + (f"feasible, score {v['score']:.1f}" if v["feasible"] else v["reason"]))
    return "\n".join(lines)

