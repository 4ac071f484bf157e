"""`xhagent cgroup`: plan and apply CgroupPolicy files, show, freeze, thaw, kill, run.

Exit status: 0 done; 1 the kernel or the node refused (nothing half-applied is hidden:
the report lists what was applied and what was not); 2 bad input (FILE:LINE:COL).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from .cgroups import CgroupError
from .cgroups import registry as R
from .cgroups.delegation import pending, settle
from .cgroups.io_weight import device_names
from .cgroups.mounts import discover
from .cgroups.policy import Policy, load_policy
from .cgroups.reconcile import Options, Plan, plan as make_plan
from .cgroups.state import apply as apply_plan
from .cgroups.state import read_actual, read_group
from .cgroups.stats import read_stats
from .cgroups.subtree import Subtree, locate
from .spec import SpecError


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"xhagent cgroup: {message}", err=True)
    sys.exit(code)


def _subtree(ctx: click.Context, settled: bool = False) -> Subtree:
    """The discovered subtree; with `settled`, the agent first moves itself into its leaf of a
    delegated unit cgroup (before anything enables controllers or starts processes there)."""
    try:
        sub = locate(ctx.obj["subtree"], ctx.obj["hierarchy"], ctx.obj["delegated"])
        if settled and sub.agent_leaf:
            moved = settle(sub.mount, sub.placement)
            if moved:
                click.echo(f"xhagent cgroup: moved pids {' '.join(map(str, moved))} into "
                           f"{sub.path / sub.agent_leaf} (no processes in the delegated unit cgroup itself)", err=True)
        return sub
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))


def _where(sub: Subtree) -> dict[str, Any]:
    return {"subtree": str(sub.path), **(sub.placement.as_dict() if sub.placement else {})}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@click.group()
@click.option("--subtree", default=None,
              help="The agent's subtree, relative to the cgroup2 root [default: discovered: the systemd unit "
                   "cgroup delegated to the agent, else xhagent.slice].")
@click.option("--delegated/--not-delegated", default=None,
              help="Whether this process's own cgroup is delegated to it [default: systemd's delegate xattr says].")
@click.pass_context
def cgroup(ctx: click.Context, subtree: str | None, delegated: bool | None) -> None:
    """cgroup v2 groups under the agent's subtree, driven by CgroupPolicy files."""
    ctx.obj = {"subtree": subtree, "delegated": delegated, "hierarchy": discover()}


def _policy_options(fn):
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)
    fn = click.option("--enable-io-cost", is_flag=True,
                      help="Enable io.cost in the cgroup2 root's io.cost.qos for devices given per-device weights.")(fn)
    fn = click.option("--own-root", is_flag=True,
                      help="The agent owns the cgroup2 root: it may enable controllers there for its subtree.")(fn)
    fn = click.option("--prune", is_flag=True, help="Remove groups the policy no longer describes (only when empty).")(fn)
    return click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False),
                        help="A CgroupPolicy YAML file.")(fn)


def _plan(ctx: click.Context, path: str, settled: bool = False, **opts: bool) -> tuple[Policy, Subtree, Plan]:
    try:
        policy = load_policy(path)
    except SpecError as exc:
        _fail(str(exc), 2)
    sub = _subtree(ctx, settled)
    try:
        actual = read_actual(sub, policy, ctx.obj["hierarchy"])
        root = actual.groups.get("")
        if root and sub.agent_leaf:  # plan as apply will see it: the agent moved into its leaf
            moving = set(pending(sub.mount, sub.placement))
            root.procs = [p for p in root.procs if p not in moving]
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))
    return policy, sub, make_plan(policy, actual, Options(**opts))


def _plan_dict(policy: Policy, sub: Subtree, p: Plan) -> dict[str, Any]:
    names = device_names()
    return {"policy": policy.name, "subtree": str(sub.path), "where": _where(sub), "errors": p.errors, "warnings": p.warnings,
            "actions": [_jsonable(a.as_dict()) for a in p.actions],
            "drift": [_jsonable(a.as_dict()) for a in p.drift], "undeclared": p.undeclared,
            "enforcers": {dev: {"device": names.get(dev, dev), "enforcer": e.name, "note": e.note}
                          for dev, e in p.enforcers.items()}}


def _print_plan(policy: Policy, sub: Subtree, p: Plan) -> None:
    names = device_names()
    click.echo(f"policy {policy.name or policy.file} -> {sub.path}")
    _print_where(sub)
    for err in p.errors:
        click.echo(f"  error: {err}")
    for a in p.actions:
        click.echo(f"  {a.describe()}")
    if not p.actions and not p.errors:
        click.echo("  (nothing to do: the kernel matches the policy)")
    for dev, e in p.enforcers.items():
        click.echo(f"  io enforcer {names.get(dev, dev)} ({dev}): {e.name} - {e.note}")
    for w in p.warnings:
        click.echo(f"  warning: {w}")
    for u in p.undeclared:
        click.echo(f"  undeclared: {u} (--prune removes it when empty)")


def _print_where(sub: Subtree) -> None:
    if sub.placement:
        click.echo(f"  where: {sub.placement.how}: {sub.placement.why}")
        if sub.agent_leaf:
            pids = pending(sub.mount, sub.placement)
            click.echo(f"  agent leaf: {sub.path / sub.agent_leaf}"
                       + (f" (apply or run moves pids {' '.join(map(str, pids))} there first)" if pids else ""))


@cgroup.command()
@_policy_options
@click.pass_context
def plan(ctx: click.Context, path: str, as_json: bool, **opts: bool) -> None:
    """Show what `apply` would do, drift included; writes nothing."""
    policy, sub, p = _plan(ctx, path, **opts)
    if as_json:
        click.echo(json.dumps(_plan_dict(policy, sub, p), indent=2))
    else:
        _print_plan(policy, sub, p)
    sys.exit(1 if p.errors else 0)


@cgroup.command()
@_policy_options
@click.option("--dry-run", is_flag=True, help="Plan only, as `plan` does.")
@click.pass_context
def apply(ctx: click.Context, path: str, as_json: bool, dry_run: bool, **opts: bool) -> None:
    """Make the kernel match the policy; stops at the first refusal and reports."""
    policy, sub, p = _plan(ctx, path, settled=not dry_run, **opts)
    if dry_run or p.errors:
        if as_json:
            click.echo(json.dumps(_plan_dict(policy, sub, p), indent=2))
        else:
            _print_plan(policy, sub, p)
        if p.errors:
            _fail("nothing applied: the policy cannot be applied on this node")
        return
    report = apply_plan(p, sub)
    if as_json:
        click.echo(json.dumps({**_plan_dict(policy, sub, p), "apply": _jsonable(report.as_dict())}, indent=2))
    else:
        for a in report.applied:
            click.echo(f"  applied: {a.describe()}")
        for w in p.warnings:
            click.echo(f"  warning: {w}")
        if report.failed:
            click.echo(f"  FAILED: {report.failed[0].describe()}: {report.failed[1]}")
            for a in report.not_applied:
                click.echo(f"  not applied: {a.describe()}")
        elif not report.applied:
            click.echo("  nothing to do: the kernel matches the policy")
    if report.failed:
        _fail(f"stopped at {report.failed[0].describe()}: {report.failed[1]}")


@cgroup.command()
@click.argument("group", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, group: str, as_json: bool) -> None:
    """Values and statistics of GROUP and the groups below it (default: the whole subtree)."""
    sub = _subtree(ctx)
    try:
        base = sub.resolve(group)
        if not base.is_dir():
            _fail(f"no group {group or '<subtree>'} at {base}")
        rels = [group] + [r for r in sub.walk() if not group or r.startswith(group + "/")]
        cgs = [sub.group(r) for r in rels]
        stats = read_stats(cgs)
        out = {}
        for rel, cg, st in zip(rels, cgs, stats):
            state = read_group(cg, list(R.SETTINGS))
            out[rel or "."] = {"path": str(cg.path), "events": cg.events(), "procs": state.procs,
                               "subtree_control": state.subtree_control,
                               "values": _jsonable(state.values), "stats": _jsonable(st)}
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps({"subtree": str(sub.path), "where": _where(sub), "groups": out}, indent=2))
        return
    click.echo(f"subtree {sub.path}")
    _print_where(sub)
    for rel, g in out.items():
        ev = " ".join(f"{k}={v}" for k, v in g["events"].items())
        click.echo(f"{rel}  ({ev}; procs {len(g['procs'])}; +{' +'.join(g['subtree_control']) or ' none'})")
        for name, value in g["values"].items():
            click.echo(f"    {name} = {value}")
        for name, value in g["stats"].items():
            if isinstance(value, dict):
                value = " ".join(f"{k}={v}" for k, v in value.items() if not isinstance(v, dict)) or \
                    "; ".join(f"{k}: " + " ".join(f"{a}={b}" for a, b in v.items()) for k, v in value.items())
            click.echo(f"    {name}: {value}")


def _group_cmd(name: str, doc: str):
    @cgroup.command(name=name, help=doc)
    @click.argument("group")
    @click.option("--timeout", default=2.0, show_default=True, help="Seconds to wait for the kernel.")
    @click.pass_context
    def command(ctx: click.Context, group: str, timeout: float) -> None:
        sub = _subtree(ctx)
        try:
            cg = sub.group(group)
            if not cg.path.is_dir():
                _fail(f"no group {group} at {cg.path}")
            getattr(cg, name)(timeout)
        except (CgroupError, ValueError) as exc:
            _fail(str(exc))
        click.echo(f"{name} {group}: {' '.join(f'{k}={v}' for k, v in cg.events().items())}")
    return command


freeze = _group_cmd("freeze", "Freeze GROUP (waits for `frozen 1`; thaws back on timeout).")
thaw = _group_cmd("thaw", "Thaw GROUP.")
kill = _group_cmd("kill", "SIGKILL every process in GROUP (cgroup.kill) and wait for `populated 0`.")


@cgroup.command(context_settings={"ignore_unknown_options": True})
@click.argument("group")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, group: str, command: tuple[str, ...]) -> None:
    """Start COMMAND inside GROUP and wait for it: `xhagent cgroup run GROUP -- CMD ARGS`."""
    sub = _subtree(ctx, settled=True)
    try:
        cg = sub.group(group)
    except ValueError as exc:
        _fail(str(exc))
    if not cg.path.is_dir():
        _fail(f"no group {group} at {cg.path}")
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child joins the group itself, then execs: no window outside it
        os.close(read_end)
        try:
            cg.add_proc(os.getpid())
            os.execvp(command[0], list(command))
        except OSError as exc:
            os.write(write_end, (str(exc) if isinstance(exc, CgroupError) else f"{command[0]}: {exc.strerror}").encode())
        os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if error:
        _fail(error)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
