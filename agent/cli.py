"""The `xhagent` command line."""
from __future__ import annotations

import sys

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xhagent")
def main() -> None:
    """Node agent of the XingHua scheduler."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable keys, see README).")
@click.option("--require", "required", multiple=True, metavar="ITEM",
              help="Exit 1 if ITEM is missing or not ok (repeatable), e.g. --require iopoll.")
def doctor(as_json: bool, required: tuple[str, ...]) -> None:
    """Probe the node for everything the agent uses; report what works and why not."""
    from .doctor import missing, run_probes
    from .doctor import render

    items = run_probes()
    click.echo(render.dumps(items) if as_json else render.table(items))
    lacking = missing(items, required)
    if lacking:
        known = {i.name for i in items}
        for name in lacking:
            why = "not ok" if name in known else "unknown item (see `xhagent doctor --json` for names)"
            click.echo(f"xhagent doctor: required item {name!r} is {why}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
