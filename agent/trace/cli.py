"""`xhagent trace record|export|stats|heatmap|view`."""

from __future__ import annotations

import json
import os
import stat
import sys

import click

from ..cliparams import FiniteFloat
from .fmt import TraceFile, TraceFormatError

# Exit statuses (docs/cli.md): 1 refused or failed on this node, 2 bad input (options, files).
REFUSED, BAD_INPUT = 1, 2
MAX_DURATION_S = 366 * 86400  # a year: past it, a typo
MAX_BIN_MS = 86400 * 1000  # a day


def _fail(msg: str, code: int = REFUSED):
    click.echo(f"xhagent trace: {msg}", err=True)
    sys.exit(code)


def _open(path: str, allow_truncated: bool = False) -> TraceFile:
    try:
        return TraceFile(path, allow_truncated=allow_truncated)
    except TraceFormatError as exc:
        _fail(str(exc), BAD_INPUT)


def _warn_lost(trace: TraceFile) -> None:
    """What every reader says about a file before using it: lost events, an unfinished
    recording, a truncation read on purpose (--allow-truncated)."""
    if trace.header.lost:
        click.echo(
            f"xhagent trace: {trace.path}: {trace.header.lost} events were LOST while recording "
            "(ring buffer full); statistics undercount",
            err=True,
        )
    for warning in trace.warnings:
        click.echo(f"xhagent trace: {trace.path}: {warning}", err=True)


MAX_VIEW_BYTES = 1 << 30  # what `trace view` serves: the whole file is held in memory


@click.group()
def trace() -> None:
    """Scheduler tracing with eBPF: record, export (perf/ftrace/chrome), stats, heatmap, view."""


@trace.command()
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace file to write (replaced only by a finished trace).",
)
@click.option(
    "--duration", type=FiniteFloat(0, MAX_DURATION_S, unit=" s"), help="Stop after S seconds."
)
@click.option(
    "--cgroup", type=click.Path(file_okay=False), help="Trace a cgroup v2 subtree (directory)."
)
@click.option(
    "--pid",
    "pids",
    type=click.IntRange(min=1),
    multiple=True,
    help="Trace this pid/tgid and what it forks (repeatable).",
)
@click.option(
    "--events",
    default="switch,waking,wakeup,wakeup_new,exit,fork",
    show_default=True,
    help="Comma-separated subset of: switch, waking, wakeup, wakeup_new, exit, fork.",
)
@click.option(
    "--stacks",
    type=click.Choice(["none", "kernel", "user", "both"]),
    default="none",
    is_flag=False,
    flag_value="both",
    show_default=True,
    help="Each traced task's stack where it leaves the CPU (at its switch-out): `--stacks` "
    "alone takes both; kernel (named "
    "from /proc/kallsyms when the recording ends), user (named from the ELF symbols of the "
    "files the process had mapped; code without frame pointers gives its innermost frames "
    "only), or both; `export --format perf` prints them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@click.option(
    "--metrics-addr",
    help="While recording, serve /metrics here (HOST:PORT, port 0: any free one): events "
    "recorded and lost (xhagent_trace_*).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output, duration, cgroup, pids, events, stacks, as_json, metrics_addr, command) -> None:
    """Record sched_switch/waking/wakeup/exit/fork into OUTPUT.

    With `-- COMMAND ...`, trace the command and its descendants and stop when it exits,
    exiting with its status; SIGINT/SIGTERM/SIGHUP are passed on to it. Otherwise stop
    after --duration or on Ctrl-C/SIGTERM; the file is finished either way."""
    from ..bpf.loader import BpfError
    from ..bpf.sched_trace import TRACEPOINTS
    from ..outputs import OutputError, OutputFile
    from ..signals import Terminated
    from .recorder import check_cgroup, check_pid
    from .recorder import record as do_record

    chosen = tuple(e.strip() for e in events.split(",") if e.strip())
    unknown = sorted(set(chosen) - set(TRACEPOINTS))
    if unknown or not chosen:
        _fail(
            f"--events: unknown event(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(TRACEPOINTS)}",
            BAD_INPUT,
        )
    if command and not command[0]:
        _fail("the command after -- is empty", BAD_INPUT)
    try:
        from ..metrics.exporter import parse_addr

        metrics_at = parse_addr(metrics_addr) if metrics_addr is not None else None
    except ValueError as exc:
        _fail(f"--metrics-addr: {exc}", BAD_INPUT)
    try:
        cgroup = check_cgroup(cgroup) if cgroup is not None else None
        pids = [check_pid(p) for p in pids]
        OutputFile.check(output)
    except (ValueError, OutputError) as exc:
        _fail(str(exc), BAD_INPUT)

    if os.geteuid() != 0:
        _fail("recording needs root (loading BPF programs)")
    tty = sys.stderr.isatty()

    figures = exporter = None
    if metrics_at is not None:
        from ..metrics.exporter import Exporter
        from .metrics import TraceMetrics

        figures = TraceMetrics()
        try:
            exporter = Exporter(figures.registry, metrics_at)
        except OSError as exc:
            _fail(f"--metrics-addr: cannot serve: {exc.strerror or exc}")
        exporter.start()
        click.echo(f"trace: metrics at {exporter.url}", err=True)

    def progress(events: int, lost: int, elapsed: float) -> None:
        if figures is not None:
            figures.update(events, lost, elapsed)
        line = f"trace: {events} events, {lost} lost, {elapsed:.1f} s"
        click.echo(f"\r{line}" if tty else line, err=True, nl=not tty)

    try:
        res = do_record(
            output,
            duration=duration,
            cgroup=cgroup,
            pids=pids,
            command=list(command) or None,
            progress=progress,
            events=chosen,
            stacks=stacks,
        )
    except OutputError as exc:
        _fail(str(exc), BAD_INPUT)
    except BpfError as exc:
        _fail(str(exc))
    except OSError as exc:  # creating or writing the trace file
        _fail(f"{exc.filename or output}: cannot write: {exc.strerror or exc}")
    except Terminated as exc:
        _fail(f"{exc}; {output} left as it was", exc.exit_code)
    finally:
        if exporter is not None:
            exporter.stop()
    if tty:
        click.echo("", err=True)
    click.echo(
        f"trace: {res.records} events in {res.elapsed_s:.2f} s written to {res.path}, "
        f"{res.lost} lost",
        err=True,
    )
    taken = res.meta.get("stacks") or {}
    if taken.get("lost"):
        click.echo(
            f"xhagent trace: WARNING: {taken['lost']} stacks not recorded (the stack map was "
            "full or a hash bucket held another stack): those switches have none",
            err=True,
        )
    if taken.get("processes_missed"):
        click.echo(
            f"xhagent trace: WARNING: {taken['processes_missed']} processes ended before their "
            "mappings were read: their user frames keep their addresses, unnamed",
            err=True,
        )
    if taken.get("symbols") == "hidden":
        click.echo(
            "xhagent trace: WARNING: /proc/kallsyms hides kernel addresses (kptr_restrict): "
            "frames keep their addresses, unnamed",
            err=True,
        )
    if res.lost:
        click.echo(
            f"xhagent trace: WARNING: {res.lost} events LOST (ring buffer full; per CPU: "
            f"{', '.join(map(str, res.lost_per_cpu))})",
            err=True,
        )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "path": res.path,
                    "records": res.records,
                    "lost": res.lost,
                    "lost_per_cpu": res.lost_per_cpu,
                    "elapsed_s": round(res.elapsed_s, 6),
                    "exit_code": res.exit_code,
                    "filter": res.meta.get("filter"),
                    "stacks": {k: v for k, v in taken.items() if k not in ("offset", "bytes")}
                    or None,
                }
            )
        )
    if res.exit_code:
        sys.exit(res.exit_code if 0 < res.exit_code < 256 else REFUSED)


ALLOW_TRUNCATED = click.option(
    "--allow-truncated",
    is_flag=True,
    help="Read what a truncated trace holds (with a warning) instead of refusing it.",
)


def _write(output: str, write) -> None:
    """Run write(fd) into OUTPUT, replacing it only when all is written (output.py)."""
    from ..outputs import OutputError, atomic_output
    from ..signals import Terminated, terminate_on_signals

    try:
        with terminate_on_signals(), atomic_output(output) as out:  # a stop removes the temporary
            write(out.fd)
    except OutputError as exc:
        _fail(str(exc), BAD_INPUT)
    except OSError as exc:
        _fail(f"{output}: cannot write: {exc.strerror}")
    except Terminated as exc:
        _fail(f"{exc}; {output} left as it was", exc.exit_code)


def _check_output(output: str) -> None:
    """Refuse an unusable -o before the trace is read."""
    from ..outputs import OutputError, OutputFile

    try:
        OutputFile.check(output)
    except OutputError as exc:
        _fail(str(exc), BAD_INPUT)


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--format", "fmt", required=True, type=click.Choice(["perf", "ftrace", "chrome", "folded"])
)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="'-' for stdout."
)
@ALLOW_TRUNCATED
def export(file, fmt, output, allow_truncated) -> None:
    """Export FILE as `perf script` text, ftrace text (Perfetto), Chrome trace JSON, or folded
    stacks weighted by off-CPU microseconds (flame graphs; a trace with --stacks)."""
    from .export import WRITERS
    from .intervals import by_time

    if output != "-":
        _check_output(output)
    tr = _open(file, allow_truncated)
    _warn_lost(tr)
    ordered = _Sorted(tr, by_time(tr)) if fmt != "chrome" else tr
    count = []

    def write(fd: int) -> None:
        with open(fd, "w", encoding="utf-8", closefd=False) as f:
            count.append(WRITERS[fmt](ordered, f))

    if output == "-":
        try:
            count.append(WRITERS[fmt](ordered, sys.stdout))
            sys.stdout.flush()
        except BrokenPipeError:
            raise  # the reader went away (| head): not a failure to report (cli.RootGroup)
        except OSError as exc:  # a full disk
            # nothing more can reach stdout, not even the flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            _fail(f"standard output: {exc.strerror}")
    else:
        _write(output, write)
    click.echo(f"trace: {count[0]} {fmt} entries written to {output}", err=True)


class _Sorted:
    """A TraceFile view with its events in time order."""

    def __init__(self, tr: TraceFile, events: list):
        self.path, self.header, self._events = tr.path, tr.header, events
        self.stacks = tr.stacks

    def __iter__(self):
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--pid",
    "pids",
    type=click.IntRange(min=1),
    multiple=True,
    help="Only this pid or tgid (repeatable).",
)
@click.option(
    "--min-us",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Leave out blocks shorter than this many microseconds.",
)
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(min=1), help="Stacks listed."
)
@click.option(
    "--cgroup",
    default=None,
    help="Only the processes that were in this cgroup v2 directory (or its cgroup path, "
    "/a/b) or below it when last seen by the recorder (a trace recorded with --stacks notes "
    "each one's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@click.option(
    "--task",
    "task_id",
    default=None,
    help="Instead of FILE, the last finished trace of this agent task (trace: true).",
)
@click.option(
    "--socket",
    "socket_path",
    default=None,
    metavar="PATH",
    help="With --task: the agent's socket [default: $XHAGENT_SOCKET, else "
    "/run/xhagent/xhagent.sock].",
)
@ALLOW_TRUNCATED
def offcpu(file, pids, min_us, top, cgroup, as_json, task_id, socket_path, allow_truncated) -> None:
    """Off-CPU time by task and stack, as offcputime counts it: from each switch-out
    to the task's next switch-in. Stacks come from a trace recorded with --stacks (or a
    task's traceStacks)."""
    from .offcpu import off_cpu, render

    if (file is None) == (task_id is None):
        raise click.UsageError("give a trace FILE or --task ID, one of them")
    if task_id is not None and not task_id:
        raise click.BadParameter("an empty task id", param_hint="--task")
    if task_id is not None:
        from ..daemon.api.cli import task_trace

        file = task_trace(task_id, socket_path)
    tr = _open(file, allow_truncated)
    _warn_lost(tr)
    stacks = tr.stacks()
    if not stacks:
        click.echo(
            f"xhagent trace: {file}: no stacks (recorded without --stacks): "
            "off-CPU time by task only",
            err=True,
        )
    blocks = off_cpu(tr, stacks, pids, min_us * 1000, tr.header.meta.get("filter"))
    if cgroup is not None:
        chosen = _cgroup_tgids(file, tr, cgroup)
        if chosen is not None:
            blocks = [b for b in blocks if b.tgid in chosen]
    if as_json:
        doc = {
            "min_us": min_us,
            "pids": list(pids),
            "total_us": sum(b.total_ns for b in blocks) // 1000,
            "stacks": [b.to_json() for b in blocks[:top]],
            "left_out": max(0, len(blocks) - top),
        }
        click.echo(json.dumps(doc))
        return
    click.echo(render(blocks, top))


def cgroup_path(given: str) -> str:
    """`--cgroup`'s value as /proc/PID/cgroup names a cgroup: a directory of the cgroup2
    mount made relative to it, else the value itself if it is such a path (/a/b)."""
    from ..cgroups.mounts import discover_hierarchy

    unified = discover_hierarchy().unified
    if unified is not None and os.path.isdir(given):
        rel = os.path.relpath(os.path.realpath(given), os.path.realpath(unified.path))
        if rel == "." or not rel.startswith(".."):
            return "/" if rel == "." else "/" + rel
    if not given.startswith("/"):
        raise click.BadParameter(
            f"{given}: neither a directory of the cgroup2 mount nor a cgroup path (/a/b)",
            param_hint="--cgroup",
        )
    return given


def _cgroup_tgids(file: str, tr, given: str) -> set[int] | None:
    """The processes of trace `tr` in cgroup `given`; None: all the trace selected (a trace
    recorded in that cgroup or below, a task's). Exit 2 when the trace cannot say."""
    from .offcpu import in_cgroup

    path = cgroup_path(given)
    chosen = in_cgroup(tr.header.meta, path)
    if chosen is not None:
        return chosen
    filt = tr.header.meta.get("filter") or {}
    if filt.get("kind") == "cgroup":
        recorded = cgroup_path(filt["cgroup"]) if os.path.isdir(filt["cgroup"]) else None
        if recorded is not None and (path == "/" or (recorded + "/").startswith(path + "/")):
            return None
    click.echo(
        f"xhagent trace: {file}: says no process's cgroup (recorded without --stacks, or "
        f"only of a cgroup outside {path})",
        err=True,
    )
    sys.exit(2)


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(min=1), help="Tasks listed."
)
@ALLOW_TRUNCATED
def stats(file, as_json, top, allow_truncated) -> None:
    """Per task on-CPU time and switches, run-queue latency histogram, per CPU busy %."""
    from .stats import compute, render

    tr = _open(file, allow_truncated)
    _warn_lost(tr)
    st = compute(tr, lost=tr.header.lost, filt=tr.header.meta.get("filter"))
    click.echo(json.dumps(st.to_json(), indent=1) if as_json else render(st, top))


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="OUT.svg or OUT.png"
)
@click.option(
    "--bin-ms",
    type=FiniteFloat(0, MAX_BIN_MS, unit=" ms"),
    help="Time bin (default: about 200 bins).",
)
@ALLOW_TRUNCATED
def heatmap(file, output, bin_ms, allow_truncated) -> None:
    """CPUs x time bins coloured by busy fraction, as SVG or PNG."""
    from ..outputs import write_all
    from .heatmap import busy_grid, png, svg

    kind = os.path.splitext(output)[1].lower()
    if kind not in (".svg", ".png"):
        _fail(f"{output}: the output must end in .svg or .png", BAD_INPUT)
    _check_output(output)
    tr = _open(file, allow_truncated)
    _warn_lost(tr)
    try:
        grid = busy_grid(tr, bin_ms, tr.header.meta.get("ncpus"), tr.header.meta.get("filter"))
    except ValueError as exc:
        _fail(f"{file}: {exc}", BAD_INPUT)
    data = svg(grid).encode() if kind == ".svg" else png(grid)
    _write(output, lambda fd: write_all(fd, data))
    click.echo(
        f"trace: heatmap {len(grid.cpus)} CPUs x {grid.bins} bins of {grid.bin_ns / 1e6:g} ms "
        f"written to {output}",
        err=True,
    )


@trace.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port on 127.0.0.1 (0: any free one).",
)
@click.option(
    "--speedscope",
    "speedscope_dir",
    type=click.Path(file_okay=False),
    help="speedscope's dist/release directory (default: $XHAGENT_SPEEDSCOPE, then the "
    "checkout's .cache/speedscope from tools/setup-viewer).",
)
@ALLOW_TRUNCATED
def view(file, port, speedscope_dir, allow_truncated) -> None:
    """Open FILE in speedscope, served on 127.0.0.1 with no network: prints the URL,
    serves until Ctrl-C. FILE is an xhagent trace (shown as its Chrome export: a track
    per CPU and per task) or any profile speedscope reads."""
    from .fmt import MAGIC
    from .view import ViewError, ViewServer, chrome_json, find_speedscope

    try:
        root = find_speedscope(speedscope_dir)
    except ViewError as exc:
        _fail(str(exc), BAD_INPUT if speedscope_dir else REFUSED)
    try:
        st = os.stat(file)
        if not stat.S_ISREG(st.st_mode):
            _fail(f"{file}: not a regular file (a trace or a profile to view)", BAD_INPUT)
        if st.st_size == 0:
            _fail(f"{file}: empty: nothing to view", BAD_INPUT)
        if st.st_size > MAX_VIEW_BYTES:
            _fail(
                f"{file}: {st.st_size} bytes, more than the {MAX_VIEW_BYTES >> 20} MiB "
                "this viewer serves (a browser would not load it either)",
                BAD_INPUT,
            )
        with open(file, "rb") as f:
            is_trace = f.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        _fail(f"{file}: cannot read: {exc.strerror}", BAD_INPUT)
    name = os.path.basename(file)
    if is_trace:
        _warn_lost(_open(file, allow_truncated))
        profile, name = chrome_json(file, allow_truncated), name + ".json"
    else:
        with open(file, "rb") as f:
            profile = f.read()
    try:
        server = ViewServer(root, name, profile, "127.0.0.1", port)
    except OSError as exc:
        _fail(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}")
    click.echo(server.url())
    sys.stdout.flush()
    click.echo("trace: serving speedscope on loopback; Ctrl-C stops", err=True)
    with server:
        server.serve_forever()
