"""The `xhagent` command line.

Subcommands live beside the code they drive and are imported only when invoked, so
`xhagent doctor` does not pay for the simulator and `--help` lists everything.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from . import __version__
from .signals import Terminated

# name -> "module:attribute" of a click command or group; one line per subcommand.
COMMANDS = {
    "apply": "xhagent.daemon.api.cli:apply",
    "bench": "xhagent.cli:bench",
    "cancel": "xhagent.daemon.api.cli:cancel",
    "cgroup": "xhagent.cgroups.cli:cgroup",
    "crd": "xhagent.crd:crd_command",
    "delete": "xhagent.daemon.api.cli:delete",
    "events": "xhagent.daemon.api.cli:events",
    "explain": "xhagent.daemon.api.cli:explain",
    "get": "xhagent.daemon.api.cli:get",
    "health": "xhagent.daemon.api.cli:health",
    "inventory": "xhagent.inventory.cli:inventory",
    "logs": "xhagent.daemon.api.cli:logs",
    "policy": "xhagent.policy.cli:policy",
    "ps": "xhagent.daemon.api.cli:ps",
    "run": "xhagent.daemon.run:run",
    "simulate": "xhagent.sched.simulate:simulate_command",
    "submit": "xhagent.daemon.api.cli:submit",
    "trace": "xhagent.trace.cli:trace",
}
# `xhagent bench NAME`, likewise.
BENCHMARKS: dict[str, str] = {
    "agent": "xhagent.bench.agent:bench_agent",
    "cgroup-io": "xhagent.bench.cgroup_io:bench_cgroup_io",
    "io": "xhagent.bench.io:bench_io",
    "metrics": "xhagent.bench.metrics:bench_metrics",
    "pool": "xhagent.bench.pool:bench_pool",
    "sched": "xhagent.bench.sched:bench_sched",
    "streams": "xhagent.bench.streams:bench_streams",
    "trace": "xhagent.bench.trace:bench_trace",
}


class LazyGroup(click.Group):
    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | self.lazy.keys())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


class RootGroup(LazyGroup):
    """A stop by signal ends every command the same way: its cleanup has run (commands
    that change state use xhagent.signals), one line says which signal, and the exit
    status is the shell's 128+N, not a traceback or click's "Aborted!" with status 1.

    A reader of the output that went away (`xhagent ps | head`) ends a command as it ends
    `cat`: silently, with the status of SIGPIPE's default action, 128+13."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Terminated(signal.SIGINT) from None
        except BrokenPipeError:  # before click's own handling, which exits 1
            # nothing more reaches the pipe, not even the flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(128 + signal.SIGPIPE)

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except Terminated as exc:
            click.echo(f"xhagent: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=RootGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xhagent")
def main() -> None:
    """Node agent of the XingHua scheduler."""


@click.group(cls=LazyGroup, lazy=BENCHMARKS)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmarks: JSON out, the baseline measured in the same run, results as ratios."""
    from .signals import terminate_on_signals

    # a stop runs the benchmark's cleanup: its scratch agent stopped, its groups and files
    # removed (SIGTERM and SIGHUP would otherwise end this process past every `finally`)
    ctx.with_resource(terminate_on_signals())


def _doctor_items(incomplete: str) -> list[str]:
    from .doctor import item_names

    return [name for name in item_names() if name.startswith(incomplete)]


@main.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the report as JSON (stable keys, see docs/operations.md).",
)
@click.option(
    "--require",
    "required",
    multiple=True,
    metavar="ITEM",
    shell_complete=lambda ctx, param, incomplete: _doctor_items(incomplete),
    help="Exit 1 if ITEM is not ok (repeatable), e.g. --require iopoll; an unknown ITEM exits 2.",
)
@click.option(
    "--subtree",
    default=None,
    metavar="PATH",
    help="Probe cgroups in this subtree, relative to the cgroup2 root, as `xhagent run "
    "--subtree` would use it [default: the one the agent would discover].",
)
def doctor(as_json: bool, required: tuple[str, ...], subtree: str | None) -> None:
    """Probe the node for everything the agent uses; report what works and why not."""
    from .cgroups.subtree import check_group_path
    from .doctor import render, required_problems, run_probes
    from .signals import terminate_on_signals

    if subtree is not None:
        try:
            check_group_path(subtree)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--subtree'") from None
    with terminate_on_signals():  # a stop runs the probes' cleanup (the cgroup probe's group)
        items = run_probes(subtree=subtree)
    click.echo(render.dumps(items) if as_json else render.table(items))
    code, problems = required_problems(items, required)
    for problem in problems:
        click.echo(f"xhagent doctor: {problem}", err=True)
    if code:
        sys.exit(code)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def version(as_json: bool) -> None:
    """The agent's version, and what this installation was built with."""
    import importlib.util
    import json
    import platform
    from importlib import resources

    native = {
        name: importlib.util.find_spec(f"xhagent.{name}") is not None
        for name in ("_uring", "_bpf", "_spawn")
    }
    objects = sorted(
        p.name
        for p in resources.files("xhagent.bpf.objects").iterdir()
        if p.name.endswith(".bpf.o")
    )
    info = {
        "version": __version__,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "native": {k.lstrip("_"): v for k, v in native.items()},
        "bpf_objects": objects,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"xhagent {__version__}")
    click.echo(f"  python {info['python']}, kernel {info['kernel']}")
    click.echo(
        "  native: "
        + ", ".join(f"{k} {'built' if v else 'MISSING'}" for k, v in info["native"].items())
    )
    click.echo(
        f"  bpf objects: {', '.join(objects) or 'none (the package was built without clang)'}"
    )


if __name__ == "__main__":
    main()
