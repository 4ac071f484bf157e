"""The `xhagent` command line.

Subcommands live beside the code they drive and are imported only when invoked, so
`xhagent doctor` does not pay for the simulator and `--help` lists everything.
"""
from __future__ import annotations

import importlib
import sys

import click

from . import __version__

# name -> "module:attribute" of a click command or group; one line per subcommand.
COMMANDS = {
    "bench": "xhagent.cli:bench",
    "cgroup": "xhagent.cgroup_cli:cgroup",
    "inventory": "xhagent.inventory.cli:inventory",
    "policy": "xhagent.policy.cli:policy",
    "simulate": "xhagent.sched.simulate:simulate_command",
    "trace": "xhagent.trace.cli:trace",
}
# `xhagent bench NAME`, likewise.
BENCHMARKS: dict[str, str] = {
    "cgroup-io": "xhagent.cgroup_bench:bench_cgroup_io",
    "io": "xhagent.io.bench:bench_io",
    "sched": "xhagent.sched.bench:bench_sched",
    "trace": "xhagent.trace.bench:bench_trace",
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


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xhagent")
def main() -> None:
    """Node agent of the XingHua scheduler."""


@click.group(cls=LazyGroup, lazy=BENCHMARKS)
def bench() -> None:
    """Benchmarks: JSON out, the baseline measured in the same run, results as ratios."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable keys, see README).")
@click.option("--require", "required", multiple=True, metavar="ITEM",
              help="Exit 1 if ITEM is not ok (repeatable), e.g. --require iopoll; an unknown ITEM exits 2.")
def doctor(as_json: bool, required: tuple[str, ...]) -> None:
    """Probe the node for everything the agent uses; report what works and why not."""
    from .doctor import missing, render, run_probes
    from .signals import Terminated, terminate_on_signals

    try:
        with terminate_on_signals():  # a stop runs the probes' cleanup (the cgroup probe's group)
            items = run_probes()
    except Terminated as exc:
        click.echo(f"xhagent doctor: {exc}", err=True)
        sys.exit(exc.exit_code)
    click.echo(render.dumps(items) if as_json else render.table(items))
    known = [i.name for i in items]
    unknown = [name for name in required if name not in known]
    for name in unknown:
        click.echo(f"xhagent doctor: --require {name!r}: no such item; the items are: {', '.join(known)}", err=True)
    if unknown:
        sys.exit(2)
    lacking = missing(items, required)
    for name in lacking:
        item = next(i for i in items if i.name == name)
        click.echo(f"xhagent doctor: required item {name!r} is not ok: {item.reason}", err=True)
    if lacking:
        sys.exit(1)


if __name__ == "__main__":
    main()
