"""`xhagent policy validate` and `xhagent policy explain`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..cpulist import format_cpulist
from ..quantity import human
from .documents import (
    DocumentError,
    Inputs,
    describe_item,
    load_all,
    load_any,
    load_items,
    policy_files,
)
from .explanation import explain as explain_task
from .policy import SchedulingPolicy, policy_warnings
from .state import Cluster
from .task import Task

EXIT_INPUT = 2
EXIT_PENDING = 3


@click.group()
def policy() -> None:
    """XSL scheduling policies, tasks and node models: validate them, explain placements."""


@policy.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {files: {FILE: {ok, items | error, errors}}, warnings} as JSON.",
)
def validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Check input FILES of any kind: SchedulingPolicy, Task, CgroupPolicy and Workload files
    (by `kind`), node models and the agent config. Every error of a file is listed, each
    FILE:LINE:COL. Exit 0 when all are valid, 2 if any is not. A CgroupPolicy's devices
    are looked up on this node."""
    report, policies, failed = {}, [], False
    for path in files:
        try:
            items = load_any(path)
        except DocumentError as exc:
            failed = True
            report[str(path)] = {"ok": False, "error": str(exc), "errors": exc.located()}
            if not as_json:
                click.echo(str(exc), err=True)
            continue
        policies += [i for i in items if isinstance(i, SchedulingPolicy)]
        names = [describe_item(i) for i in items]
        # A well-formed CgroupPolicy may name devices this node lacks: the file is valid,
        # `cgroup plan` refuses it here (exit 1), so say so without failing the file.
        notes = [
            f"{a} (cgroup plan refuses it on this node)"
            for i in items
            for a in getattr(i, "absent", [])
        ]
        report[str(path)] = {"ok": True, "items": names, "notes": notes}
        if not as_json:
            click.echo(f"{path}: ok ({', '.join(names)})")
            for note in notes:
                click.echo(f"  note: {note}")
    warnings = policy_warnings(policies)
    if as_json:
        click.echo(json.dumps({"files": report, "warnings": warnings}, indent=2))
    else:
        for w in warnings:
            click.echo(f"warning: {w}", err=True)
    if failed:
        sys.exit(EXIT_INPUT)


@policy.command(
    epilog="Exit status: 0 every task is placed, 3 at least one is Pending, 2 bad input."
)
@click.option(
    "--task",
    "task_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A Task file (every Task in it is explained).",
)
@click.option(
    "--policies",
    "policy_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help=(
        "A policy file or a directory of them (repeatable); other kinds in a directory are skipped."
    ),
)
@click.option(
    "--nodes",
    "nodes_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A node model file (default: this machine's inventory).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the decision and every node's verdict as JSON."
)
def explain(
    task_file: Path, policy_paths: tuple[Path, ...], nodes_file: Path | None, as_json: bool
) -> None:
    """Where each task would be placed and why, or why not, node by node."""
    try:
        inputs = _inputs(task_file, policy_paths, nodes_file)
    except DocumentError as exc:
        click.echo(f"xhagent policy explain: {exc}", err=True)
        sys.exit(EXIT_INPUT)
    cluster = Cluster.of(inputs.nodes)
    reports = [explain_task(t, inputs.policies, cluster).as_dict() for t in inputs.tasks]
    warnings = policy_warnings(inputs.policies)
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
    tasks = load_items(task_file)
    inputs.tasks = [t for t in tasks if isinstance(t, Task)]
    if not inputs.tasks:
        raise DocumentError(f"{task_file}: no kind: Task document in it")
    for path in policy_paths:
        if path.is_dir():
            for f in policy_files(path):
                inputs.policies += [i for i in load_items(f) if isinstance(i, SchedulingPolicy)]
        else:
            found = [i for i in load_items(path) if isinstance(i, SchedulingPolicy)]
            if not found:
                raise DocumentError(f"{path}: no kind: SchedulingPolicy document in it")
            inputs.policies += found
    if nodes_file is not None:
        inputs.nodes = load_all([nodes_file]).nodes
        if not inputs.nodes:
            raise DocumentError(f"{nodes_file}: not a node model")
    else:
        inputs.nodes = [_this_node()]
    return inputs


def _this_node():
    from ..inventory import build_model, discover_node

    try:
        return build_model(discover_node())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DocumentError(
            f"cannot read this node's inventory ({reason}); give a node model with --nodes FILE"
        ) from None


def _render(r: dict) -> str:
    pol = (
        f"policy {r['policy']} (priority {r['policy_priority']}, preemption {r['preemption']})"
        if r["policy"]
        else "no policy matches (defaults)"
    )
    lines = [f"task {r['task']} ({r['device_type']}): {pol}", f"  needs: {r['demand']}"]
    if r["tied_with"]:
        lines.append(f"  warning: tied with {', '.join(r['tied_with'])} at the same priority")
    if r["placed"]:
        p = r["placed"]
        gpus = ", ".join(
            f"GPU {g['index']} ({'whole' if g['whole'] else human(g['memory'])})" for g in p["gpus"]
        )
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p["parts"].items())
        lines.append(f"  placed on {p['node']}: score {p['score']:.1f} ({parts})")
        cpus = format_cpulist(p["cpus"], empty="none")
        lines.append(f"    cpus {cpus}" + (f", {gpus}" if gpus else ""))
    else:
        lines.append("  Pending: no node satisfies the hard constraints")
    for name, v in r["nodes"].items():
        lines.append(
            f"  {name}: " + (f"feasible, score {v['score']:.1f}" if v["feasible"] else v["reason"])
        )
    return "\n".join(lines)
