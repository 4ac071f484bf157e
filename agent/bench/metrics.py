"""`xhagent bench metrics`: what one scrape of the agent's metrics costs in CPU time.

The agent's own collectors over a scratch store of N tasks (Running, Pending with reasons,
ended; three classes, with their histograms filled by real transitions) and G cgroups the
bench creates in a scratch subtree (and removes). Reported, as JSON:

- `cases.scrape`: CPU time of one whole exposition (`generate_latest`), p50/p99 over the
  rounds, the series and bytes it had;
- `baseline.read_loop`: the same cgroup files read with open/read/close in a Python loop,
  the least a scrape of them must do; `ratios.scrape_vs_read_loop`;
- `targets_met.scrape_p99_ms`: p99 < 50 ms (for 100 groups and 500 tasks).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

TARGET_MS = 50.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fill(store, tasks: int) -> None:
    from ..daemon.store import Placement, TaskState, TaskSummary, WaitReason

    classes = ("latency", "batch", "besteffort")
    placed = Placement("bench", (0,), exclusive=True)
    for i in range(tasks):
        rec = store.submit(
            name=f"t{i}",
            kind="cpu",
            source=f"kind: Task\nmetadata: {{name: t{i}}}\n",
            source_file="bench.yaml",
            summary=TaskSummary(0, classes[i % 3], None, device_type="cpu"),
            idempotency_key=None,
        )
        if i % 5 == 0:
            reason = WaitReason(("Insufficient", "Unschedulable")[i % 2], "bench")
            store.transition(rec.id, TaskState.PENDING, reasons=[reason])
            continue
        store.transition(rec.id, TaskState.STARTING, placement=placed)
        store.transition(rec.id, TaskState.RUNNING)
        if i % 2:
            store.transition(rec.id, TaskState.SUCCEEDED, exit_code=0)


def _read_loop(paths: list[Path]) -> None:
    for p in paths:
        try:
            with open(p, "rb") as f:
                f.read()
        except OSError:
            pass


def _cpu_ms(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.thread_time()
        fn()
        out.append((time.thread_time() - t0) * 1e3)
    return out


@click.command("metrics")
@click.option("--groups", default=100, show_default=True, help="Cgroups to create and scrape.")
@click.option("--tasks", default=500, show_default=True, help="Tasks in the scratch store.")
@click.option("--rounds", default=50, show_default=True, help="Scrapes measured.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what this bench prints anyway).")
def bench_metrics(groups, tasks, rounds, as_json) -> None:
    """CPU time of one scrape of the agent's metrics: N tasks, G cgroups."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from ..cgroups import Cgroup, registry
    from ..cgroups.mounts import discover_hierarchy
    from ..daemon.metrics import AgentMetrics
    from ..daemon.store import Store

    if os.geteuid() != 0:
        click.echo("xhagent bench metrics: needs root (it creates cgroups)", err=True)
        sys.exit(1)
    root = Path(discover_hierarchy().unified.path) / f"xhagent-bench-metrics-{os.getpid()}.slice"
    base = Path(tempfile.mkdtemp(prefix="xhagent-bench-metrics-"))
    made: list[Path] = []
    store = None
    try:
        click.echo(f"bench metrics: {groups} groups, {tasks} tasks", err=True)
        root.mkdir()
        made.append(root)
        cgroups = []
        for i in range(groups):
            (root / f"g{i}").mkdir()
            made.append(root / f"g{i}")
            cgroups.append((f"g{i}", Cgroup(root / f"g{i}")))
        store = Store.open(base / "state")
        metrics = AgentMetrics(store, lambda: cgroups)
        store.on_commit = metrics.observe
        _fill(store, tasks)
        body = generate_latest(metrics.registry)  # warm: imports, first reads
        series = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
        scrape = _cpu_ms(lambda: generate_latest(metrics.registry), rounds)
        files = [g.path / f.name for _, g in cgroups for f in registry.STATS]
        loop = _cpu_ms(lambda: _read_loop(files), rounds)
    finally:
        if store is not None:
            store.close()
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError as exc:
                click.echo(f"bench metrics: could not remove {path}: {exc}", err=True)
        shutil.rmtree(base, ignore_errors=True)
    p99 = _pct(scrape, 0.99)
    out = {
        "benchmark": "metrics",
        "cpus": os.cpu_count(),
        "groups": groups,
        "tasks": tasks,
        "cases": {
            "scrape": {
                "rounds": rounds,
                "series": series,
                "bytes": len(body),
                "p50_ms": round(statistics.median(scrape), 2),
                "p99_ms": round(p99, 2),
            }
        },
        "baseline": {
            "read_loop": {
                "files": len(files),
                "p50_ms": round(statistics.median(loop), 2),
                "p99_ms": round(_pct(loop, 0.99), 2),
            }
        },
        "ratios": {
            "scrape_vs_read_loop": round(statistics.median(scrape) / statistics.median(loop), 2)
        },
        "targets": {"scrape_p99_ms": TARGET_MS},
        "targets_met": {"scrape_p99_ms": p99 < TARGET_MS},
    }
    click.echo(json.dumps(out, indent=2))
