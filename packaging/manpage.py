"""Print xhagent(1) in roff, from the click commands' own help (run by the packaged
interpreter at build time, so the page describes the CLI that ships).

Usage: python manpage.py VERSION
"""

from __future__ import annotations

import sys

import click

from xhagent.cli import main as cli


def roff(text: str) -> str:
    """Escape text for roff: backslashes, and a leading dot or quote on any line."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def commands(group: click.Group, ctx: click.Context, prefix: list[str]):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        path = [*prefix, name]
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield path, cmd, sub
        if isinstance(cmd, click.Group):
            yield from commands(cmd, sub, path)


def page(version: str) -> str:
    ctx = click.Context(cli, info_name="xhagent", terminal_width=78, max_content_width=78)
    out = [
        f'.TH XHAGENT 1 "" "xhagent {version}" "User Commands"',
        ".SH NAME",
        "xhagent \\- node agent of the XingHua scheduler, and its command line",
        ".SH SYNOPSIS",
        ".B xhagent",
        "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        "\\fBxhagent run\\fR is the daemon (the systemd unit \\fIxhagent.service\\fR runs it);",
        "the other commands are its clients over the unix socket, or work on the node",
        "directly (doctor, inventory, policy, cgroup, trace, simulate, bench).",
        "Each command's full help follows, as \\fBxhagent\\fR \\fICOMMAND\\fR \\fB--help\\fR",
        "prints it.",
        ".SH COMMANDS",
    ]
    for path, cmd, sub in commands(cli, ctx, []):
        out += [f".SS xhagent {' '.join(path)}", ".nf", roff(cmd.get_help(sub)), ".fi"]
    out += [
        ".SH FILES",
        ".TP",
        ".I /etc/xhagent/agent.yaml",
        "the agent's config (node name, labels, reserved CPUs, paths)",
        ".TP",
        ".I /etc/xhagent/policies.d/",
        "SchedulingPolicy and CgroupPolicy files, watched by the daemon",
        ".TP",
        ".I /var/lib/xhagent/",
        "tasks, events and outputs",
        ".TP",
        ".I /run/xhagent/xhagent.sock",
        "the gRPC API; members of group \\fIxhagent\\fR may use it",
        ".SH SEE ALSO",
        ".BR systemctl (1),",
        ".BR systemd.resource-control (5)",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(page(sys.argv[1]))
