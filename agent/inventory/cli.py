"""`xhagent inventory`: what this node has, and the resource model the scheduler gets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .sysfs import Roots


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON instead of the text tree (the model: JSON instead of YAML).",
)
@click.option(
    "--section",
    type=click.Choice(["cpu", "numa", "memory", "pci", "gpu", "accel", "block", "labels"]),
    help="Only this part of the inventory.",
)
@click.option(
    "--model", "as_model", is_flag=True, help="Print the resource model the scheduler consumes."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Agent config with labels and reservedCpus (default /etc/xhagent/agent.yaml if present).",
)
@click.option(
    "--sysfs-root",
    type=click.Path(path_type=Path),
    default=Path("/sys"),
    show_default=True,
    help="Read a recorded sysfs tree instead (tests).",
)
@click.option(
    "--procfs-root",
    type=click.Path(path_type=Path),
    default=Path("/proc"),
    show_default=True,
    help="Read a recorded procfs tree instead (tests).",
)
@click.option(
    "--dev-root",
    type=click.Path(path_type=Path),
    default=Path("/dev"),
    show_default=True,
    hidden=True,
)
def inventory(
    as_json: bool,
    section: str | None,
    as_model: bool,
    config_path: Path | None,
    sysfs_root: Path,
    procfs_root: Path,
    dev_root: Path,
) -> None:
    """Discover CPUs, caches, NUMA, memory, PCIe, GPUs (NVML), TPUs and other accelerators
    (the accel class), block devices and labels."""
    from .. import node_model as model
    from ..config import ConfigError, check_reserved, load_config
    from .collect import build_model, discover_node
    from .render import as_dict, section_text, tree

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"xhagent inventory: {exc}", err=True)
        sys.exit(2)
    cpus = sysfs_root / "devices/system/cpu"
    if not (cpus / "online").is_file():
        # Nothing to discover: the argument points at no sysfs tree (or this is no Linux).
        click.echo(
            f"xhagent inventory: {sysfs_root} is not a sysfs tree: {cpus}/online is missing",
            err=True,
        )
        sys.exit(2 if sysfs_root != Path("/sys") else 1)
    inv = discover_node(
        Roots(sysfs_root, procfs_root, dev_root), config, gpus=section in (None, "gpu")
    )
    try:
        check_reserved(config, [c.id for c in inv.cpu.cpus])
    except ConfigError as exc:
        click.echo(f"xhagent inventory: {exc}", err=True)
        sys.exit(2)
    if as_model:
        try:
            node = build_model(inv)
        except model.ModelError as exc:
            click.echo(
                f"xhagent inventory: the discovered node does not form a valid model: {exc}",
                err=True,
            )
            sys.exit(1)
        click.echo(model.dumps_json(node) if as_json else model.dumps_yaml(node).rstrip())
    elif as_json:
        click.echo(json.dumps(as_dict(inv, section), indent=2))
    else:
        click.echo(section_text(inv, section) if section else tree(inv))
