"""`xhagent trace record|export|stats|heatmap`."""
from __future__ import annotations

import json
import os
import sys

import click

from .fmt import TraceFile, TraceFormatError


def _fail(msg: str, code: int = 1):
    click.echo(f"xhagent trace: {msg}", err=True)
    sys.exit(code)


def _open(path: str) -> TraceFile:
    try:
        return TraceFile(path)
    except TraceFormatError as exc:
        _fail(str(exc))


def _warn_lost(trace: TraceFile) -> None:
    h = trace.header
    if h.lost:
        click.echo(f"xhagent trace: {trace.path}: {h.lost} events were LOST while recording "
                   "(ring buffer full); statistics undercount", err=True)
    if not h.complete:
        click.echo(f"xhagent trace: {trace.path}: recording did not finish; "
                   f"{len(trace)} whole records read", err=True)


@click.group()
def trace() -> None:
    """Scheduler tracing with eBPF: record, export (perf/ftrace/chrome), stats, heatmap."""


@trace.command()
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Trace file to write.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), help="Stop after S seconds.")
@click.option("--cgroup", type=click.Path(file_okay=False), help="Trace a cgroup v2 subtree (directory).")
@click.option("--pid", "pids", type=click.IntRange(min=1), multiple=True,
              help="Trace this pid/tgid and what it forks (repeatable).")
@click.option("--events", default="switch,wakeup,wakeup_new,exit,fork", show_default=True,
              help="Comma-separated subset of: switch, wakeup, wakeup_new, exit, fork.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output, duration, cgroup, pids, events, as_json, command) -> None:
    """Record sched_switch/wakeup/exit/fork into OUTPUT.

    With `-- COMMAND ...`, trace the command and its descendants and stop when it exits;
    otherwise stop after --duration or on Ctrl-C."""
    from ..bpf.loader import BpfError
    from ..bpf.sched_trace import TRACEPOINTS
    from .recorder import record as do_record

    chosen = tuple(e.strip() for e in events.split(",") if e.strip())
    unknown = sorted(set(chosen) - set(TRACEPOINTS))
    if unknown or not chosen:
        _fail(f"--events: unknown event(s) {', '.join(unknown) or '(none given)'}; "
              f"choose from {', '.join(TRACEPOINTS)}", 2)

    if os.geteuid() != 0:
        _fail("recording needs root (loading BPF programs)")
    tty = sys.stderr.isatty()

    def progress(events: int, lost: int, elapsed: float) -> None:
        line = f"trace: {events} events, {lost} lost, {elapsed:.1f} s"
        click.echo(f"\r{line}" if tty else line, err=True, nl=not tty)

    try:
        res = do_record(output, duration=duration, cgroup=cgroup, pids=list(pids),
                        command=list(command) or None, progress=progress, events=chosen)
    except (BpfError, OSError) as exc:
        _fail(str(exc))
    if tty:
        click.echo("", err=True)
    click.echo(f"trace: {res.records} events in {res.elapsed_s:.2f} s written to {res.path}, "
               f"{res.lost} lost", err=True)
    if res.lost:
        click.echo(f"xhagent trace: WARNING: {res.lost} events LOST (ring buffer full; per CPU "
                   f"{res.lost_per_cpu})", err=True)
    if as_json:
        click.echo(json.dumps({"path": res.path, "records": res.records, "lost": res.lost,
                               "lost_per_cpu": res.lost_per_cpu, "elapsed_s": round(res.elapsed_s, 6),
                               "exit_code": res.exit_code, "filter": res.meta.get("filter")}))
    if res.exit_code:
        sys.exit(res.exit_code if 0 < res.exit_code < 256 else 1)


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", required=True, type=click.Choice(["perf", "ftrace", "chrome"]))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="'-' for stdout.")
def export(file, fmt, output) -> None:
    """Export FILE as `perf script` text, ftrace text (Perfetto) or Chrome trace JSON."""
    from .export import WRITERS
    from .intervals import by_time

    tr = _open(file)
    _warn_lost(tr)
    ordered = _Sorted(tr, by_time(tr)) if fmt != "chrome" else tr
    try:
        out = sys.stdout if output == "-" else open(output, "w")
    except OSError as exc:
        _fail(f"{output}: cannot write: {exc.strerror}")
    try:
        n = WRITERS[fmt](ordered, out)
    finally:
        if out is not sys.stdout:
            out.close()
    click.echo(f"trace: {n} {fmt} entries written to {output}", err=True)


class _Sorted:
    """A TraceFile view with its events in time order."""

    def __init__(self, tr: TraceFile, events: list):
        self.path, self.header, self._events = tr.path, tr.header, events

    def __iter__(self):
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1), help="Tasks listed.")
def stats(file, as_json, top) -> None:
    """Per task on-CPU time and switches, run-queue latency histogram, per CPU busy %."""
    from .stats import compute, render

    tr = _open(file)
    _warn_lost(tr)
    st = compute(tr, lost=tr.header.lost)
    click.echo(json.dumps(st.to_json(), indent=1) if as_json else render(st, top))


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="OUT.svg or OUT.png")
@click.option("--bin-ms", type=click.FloatRange(min=0, min_open=True), help="Time bin (default: about 200 bins).")
def heatmap(file, output, bin_ms) -> None:
    """CPUs x time bins coloured by busy fraction, as SVG or PNG."""
    from . import heatmap as hm

    kind = os.path.splitext(output)[1].lower()
    if kind not in (".svg", ".png"):
        _fail(f"{output}: the output must end in .svg or .png")
    tr = _open(file)
    _warn_lost(tr)
    try:
        grid = hm.busy_grid(tr, bin_ms, tr.header.meta.get("ncpus"))
    except ValueError as exc:
        _fail(f"{file}: {exc}")
    data = hm.svg(grid).encode() if kind == ".svg" else hm.png(grid)
    try:
        with open(output, "wb") as f:
            f.write(data)
    except OSError as exc:
        _fail(f"{output}: cannot write: {exc.strerror}")
    click.echo(f"trace: heatmap {len(grid.cpus)} CPUs x {grid.bins} bins of {grid.bin_ns / 1e6:g} ms "
               f"written to {output}", err=True)
