"""`xhagent cgroup`: plan and apply CgroupPolicy files, show, freeze, thaw, kill, run.

Exit status: 0 done; 1 the kernel or the node refused, or something this node lacks (nothing
half-applied is hidden: the report lists what was applied and what was not); 2 bad input
(FILE:LINE:COL, bad option values); `run` passes on its command's status (128+N when signal
N killed it); a command stopped by SIGINT, SIGTERM or SIGHUP exits 128+N.

Commands that change the subtree (apply, freeze, thaw, kill, run) hold its lock
(cgroups.lock) while they do; `--no-wait` fails at once when another one holds it.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import click

from ..cliparams import FiniteFloat
from ..signals import TERMINATING, Terminated, forward_signals, signals_held, terminate_on_signals
from ..spec import SpecError
from . import registry
from .delegation import pending, settle
from .enact import Outcome, apply_policy, plan_policy
from .group import MAX_TIMEOUT, CgroupError
from .io_weight import device_names
from .lock import SubtreeLock
from .mounts import discover_hierarchy
from .policy import CgroupPolicy, load_policy
from .reconcile import Options, Plan
from .spawn import SpawnError
from .state import read_group, vanished
from .stats import read_stats
from .subtree import Subtree, locate


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"xhagent cgroup: {message}", err=True)
    sys.exit(code)


def _subtree(ctx: click.Context) -> Subtree:
    try:
        return locate(ctx.obj["subtree"], ctx.obj["hierarchy"], ctx.obj["delegated"])
    except (CgroupError, ValueError, LookupError) as exc:
        _fail(str(exc))
    except OSError as exc:  # reading /proc/self/cgroup or a delegate mark
        _fail(f"{exc.filename or 'locating the subtree'}: {exc.strerror}")


def _settle(sub: Subtree) -> None:
    """In a delegated unit cgroup the agent first moves itself into its leaf (before anything
    enables controllers or starts processes there); done under the subtree's lock."""
    if sub.agent_leaf:
        _report_settled(sub, settle(sub.mount, sub.placement))


def _report_settled(sub: Subtree, moved: list[int]) -> None:
    if moved:
        click.echo(
            f"xhagent cgroup: moved pids {' '.join(map(str, moved))} into "
            f"{sub.path / sub.agent_leaf} (no processes in the delegated unit cgroup itself)",
            err=True,
        )


def _waiting(sub: Subtree):
    def waiting(pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        click.echo(
            f"xhagent cgroup: waiting for the lock held by {holder} "
            f"on {sub.path} ({SubtreeLock(sub.path).path})",
            err=True,
        )

    return waiting


def _lock(sub: Subtree, no_wait: bool) -> SubtreeLock:
    try:
        return SubtreeLock(sub.path).acquire(wait=not no_wait, on_wait=_waiting(sub))
    except CgroupError as exc:
        _fail(str(exc))


def _where(sub: Subtree) -> dict[str, Any]:
    return {"subtree": str(sub.path), **(sub.placement.as_dict() if sub.placement else {})}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class _Group(click.Group):
    """Every subcommand runs with SIGINT, SIGTERM and SIGHUP raising Terminated, so its cleanup
    (thawing back, releasing the lock, the child's status) runs; `xhagent`'s root command then
    says which signal and exits 128+N."""

    def invoke(self, ctx: click.Context) -> Any:
        with terminate_on_signals():
            return super().invoke(ctx)


_SUBTREE_HELP = (
    "The agent's subtree, relative to the cgroup2 root; one its manager marked delegated "
    "(a unit with Delegate=) gets a leaf for that unit's own processes [default: discovered: "
    "the systemd unit cgroup delegated to the agent, else xhagent.slice]."
)


@click.group(cls=_Group)
@click.option("--subtree", default=None, help=_SUBTREE_HELP)
@click.option(
    "--delegated/--not-delegated",
    default=None,
    help="Whether this process's own cgroup is delegated to it "
    "[default: systemd's delegate xattr says].",
)
@click.pass_context
def cgroup(ctx: click.Context, subtree: str | None, delegated: bool | None) -> None:
    """cgroup v2 groups under the agent's subtree, driven by CgroupPolicy files."""
    ctx.obj = {"subtree": subtree, "delegated": delegated, "hierarchy": discover_hierarchy()}


def _late_subtree(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    given = ctx.obj.get("subtree")
    if given is not None and given != value:
        raise click.BadParameter(
            f"{value!r} differs from --subtree {given!r} given before the subcommand"
        )
    ctx.obj["subtree"] = value


def _subtree_option(fn):
    """`--subtree` is also accepted after the subcommand (`xhagent cgroup show --subtree X`)."""
    return click.option(
        "--subtree", default=None, expose_value=False, callback=_late_subtree, help=_SUBTREE_HELP
    )(fn)


def _mutation_options(fn):
    fn = click.option(
        "--no-wait",
        is_flag=True,
        help="Fail at once (exit 1) when another xhagent is changing the subtree.",
    )(fn)
    return _subtree_option(fn)


def _policy_options(fn):
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)
    fn = click.option(
        "--enable-io-cost",
        is_flag=True,
        help="Let the agent write the cgroup2 root's io.cost files: enable=1 in io.cost.qos "
        "for devices given per-device weights, and the policy's spec.ioCost model and QoS.",
    )(fn)
    fn = click.option(
        "--own-root",
        is_flag=True,
        help="The agent owns the cgroup2 root: it may enable controllers there for its subtree.",
    )(fn)
    fn = click.option(
        "--prune",
        is_flag=True,
        help="Remove groups the policy no longer describes (only when empty).",
    )(fn)
    return click.option(
        "-f",
        "--file",
        "path",
        required=True,
        type=click.Path(dir_okay=False),
        help="A CgroupPolicy YAML file.",
    )(fn)


def _load(path: str) -> CgroupPolicy:
    try:
        return load_policy(path)
    except SpecError as exc:
        _fail(str(exc), 2)


def _plan(ctx: click.Context, sub: Subtree, policy: CgroupPolicy, **opts: bool) -> Plan:
    try:
        return plan_policy(policy, sub, Options(**opts), ctx.obj["hierarchy"])
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))


def _plan_dict(policy: CgroupPolicy, sub: Subtree, p: Plan) -> dict[str, Any]:
    names = device_names()
    return {
        "policy": policy.name,
        "subtree": str(sub.path),
        "where": _where(sub),
        "errors": p.errors,
        "warnings": p.warnings,
        "actions": [_jsonable(a.as_dict()) for a in p.actions],
        "drift": [_jsonable(a.as_dict()) for a in p.drift],
        "undeclared": p.undeclared,
        "enforcers": {
            dev: {"device": names.get(dev, dev), "enforcer": e.name, "note": e.note}
            for dev, e in p.enforcers.items()
        },
    }


def _print_plan(policy: CgroupPolicy, sub: Subtree, p: Plan) -> None:
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


def _print_plan_or_json(policy: CgroupPolicy, sub: Subtree, p: Plan, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(_plan_dict(policy, sub, p), indent=2))
    else:
        _print_plan(policy, sub, p)


def _print_where(sub: Subtree) -> None:
    if sub.placement:
        click.echo(f"  where: {sub.placement.how}: {sub.placement.why}")
        if sub.agent_leaf:
            pids = pending(sub.mount, sub.placement)
            click.echo(
                f"  agent leaf: {sub.path / sub.agent_leaf}"
                + (
                    f" (apply or run moves pids {' '.join(map(str, pids))} there first)"
                    if pids
                    else ""
                )
            )


@cgroup.command()
@_policy_options
@_subtree_option
@click.pass_context
def plan(ctx: click.Context, path: str, as_json: bool, **opts: bool) -> None:
    """Show what `apply` would do, drift included; writes nothing."""
    policy = _load(path)
    sub = _subtree(ctx)
    p = _plan(ctx, sub, policy, **opts)
    _print_plan_or_json(policy, sub, p, as_json)
    sys.exit(1 if p.errors else 0)


@cgroup.command()
@_policy_options
@click.option("--dry-run", is_flag=True, help="Plan only, as `plan` does.")
@_mutation_options
@click.pass_context
def apply(
    ctx: click.Context, path: str, as_json: bool, dry_run: bool, no_wait: bool, **opts: bool
) -> None:
    """Make the kernel match the policy; stops at the first refusal and reports."""
    policy = _load(path)
    sub = _subtree(ctx)
    if dry_run:
        p = _plan(ctx, sub, policy, **opts)
        _print_plan_or_json(policy, sub, p, as_json)
        sys.exit(1 if p.errors else 0)
    outcome = Outcome(Plan())
    try:
        apply_policy(
            policy,
            sub,
            Options(**opts),
            ctx.obj["hierarchy"],
            wait=not no_wait,
            on_wait=_waiting(sub),
            outcome=outcome,
        )
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))
    except Terminated as exc:  # between two actions: say how far it got
        for a in outcome.report.applied:
            click.echo(f"  applied: {a.describe()}")
        for a in outcome.report.not_applied:
            click.echo(f"  not applied: {a.describe()}")
        done, total = len(outcome.report.applied), len(outcome.plan.actions)
        _fail(f"{exc} after {done} of {total} actions", exc.exit_code)
    p, report = outcome.plan, outcome.report
    if not outcome.applied:
        _print_plan_or_json(policy, sub, p, as_json)
        _fail("nothing applied: the policy cannot be applied on this node")
    _report_settled(sub, outcome.settled)
    if as_json:
        click.echo(
            json.dumps(
                {**_plan_dict(policy, sub, p), "apply": _jsonable(report.as_dict())}, indent=2
            )
        )
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


def _show_group(cg, stats: dict[str, Any]) -> dict[str, Any] | None:
    """One group's part of `show`, or None when it vanished while being read."""
    try:
        state = read_group(cg, list(registry.SETTINGS))
        events = cg.events()
    except CgroupError as exc:
        if vanished(exc):
            return None
        raise
    return {
        "path": str(cg.path),
        "events": events,
        "procs": state.procs,
        "subtree_control": state.subtree_control,
        "values": _jsonable(state.values),
        "stats": _jsonable(stats),
    }


# Pressure files: averages are percentages of wall time, `total` is microseconds stalled.
_UNITS = {"avg10": "%", "avg60": "%", "avg300": "%", "total": "µs"}


def _stat_text(name: str, value: Any) -> str:
    if not isinstance(value, dict):
        return str(value)
    pressure = registry.BY_NAME.get(name) in (
        registry.CPU_PRESSURE,
        registry.IO_PRESSURE,
        registry.MEMORY_PRESSURE,
    )
    flat = " ".join(f"{k}={v}" for k, v in value.items() if not isinstance(v, dict))
    return flat or "; ".join(
        f"{k}: " + " ".join(f"{a}={b}{_UNITS.get(a, '') if pressure else ''}" for a, b in v.items())
        for k, v in value.items()
    )


@cgroup.command()
@click.argument("group", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_subtree_option
@click.pass_context
def show(ctx: click.Context, group: str, as_json: bool) -> None:
    """Values and statistics of GROUP and the groups below it (default: the whole subtree).
    Groups created or removed while it reads are shown or left out; that is not an error."""
    sub = _subtree(ctx)
    try:
        base = sub.resolve(group)
        if not base.is_dir():
            _fail(f"no group {group or '<subtree>'} at {base}")
        rels = [group] + [r for r in sub.walk() if not group or r.startswith(group + "/")]
        cgs = [sub.group(r) for r in rels]
        out = {}
        for rel, cg, st in zip(rels, cgs, read_stats(cgs), strict=True):
            shown = _show_group(cg, st)
            if shown is not None:
                out[rel or "."] = shown
        if not out:
            _fail(f"no group {group or '<subtree>'} at {base}")
    except (CgroupError, ValueError) as exc:
        _fail(str(exc))
    if as_json:
        click.echo(
            json.dumps({"subtree": str(sub.path), "where": _where(sub), "groups": out}, indent=2)
        )
        return
    click.echo(f"subtree {sub.path}")
    _print_where(sub)
    for rel, g in out.items():
        ev = " ".join(f"{k}={v}" for k, v in g["events"].items())
        enabled = (
            "controllers for children: " + " ".join(g["subtree_control"])
            if g["subtree_control"]
            else "no controllers enabled for children"
        )
        click.echo(f"{rel}  ({ev}; procs {len(g['procs'])}; {enabled})")
        for name, value in g["values"].items():
            click.echo(f"    {name} = {value}")
        for name, value in g["stats"].items():
            click.echo(f"    {name}: {_stat_text(name, value)}")


def _group_cmd(name: str, doc: str):
    @cgroup.command(name=name, help=doc)
    @click.argument("group")
    @click.option(
        "--timeout",
        default=2.0,
        show_default=True,
        type=FiniteFloat(0, MAX_TIMEOUT, unit=" s"),
        help=f"Seconds to wait for the kernel (0 < S <= {MAX_TIMEOUT:g}).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @_mutation_options
    @click.pass_context
    def command(
        ctx: click.Context, group: str, timeout: float, as_json: bool, no_wait: bool
    ) -> None:
        sub = _subtree(ctx)
        cg = _existing_group(sub, group)
        froze = False  # this command froze the group: a stop before it reports thaws it back
        try:
            with _lock(sub, no_wait):
                froze = name == "freeze" and cg.read(registry.FREEZE.name).strip() == "0"
                getattr(cg, name)(timeout)
                events = cg.events()
                with signals_held():  # reported and no longer to be undone, as one step
                    if as_json:
                        click.echo(
                            json.dumps(
                                {
                                    "action": name,
                                    "group": group,
                                    "path": str(cg.path),
                                    "events": events,
                                }
                            )
                        )
                    else:
                        click.echo(
                            f"{name} {group}: {' '.join(f'{k}={v}' for k, v in events.items())}"
                        )
                    froze = False  # from here a stop leaves it as reported, and says so
        except (CgroupError, ValueError) as exc:
            _fail(str(exc))
        except Terminated as exc:
            if froze:
                with signals_held():
                    _thaw_quietly(cg, timeout)
            state = _events_text(cg)
            _fail(f"{name} {group}: {exc}" + (f"; now {state}" if state else ""), exc.exit_code)

    return command


def _existing_group(sub: Subtree, group: str):
    try:
        cg = sub.group(group)
    except ValueError as exc:
        _fail(str(exc))
    if not cg.path.is_dir():
        _fail(f"no group {group} at {cg.path}")
    return cg


def _thaw_quietly(cg, timeout: float) -> None:
    try:
        cg.thaw(timeout)
    except CgroupError as exc:
        click.echo(f"xhagent cgroup: thawing {cg.path} back failed: {exc}", err=True)


def _events_text(cg) -> str:
    try:
        return " ".join(f"{k}={v}" for k, v in cg.events().items())
    except CgroupError:
        return ""


freeze = _group_cmd(
    "freeze",
    "Freeze GROUP: wait for `frozen 1`; on a timeout, an error or a stop "
    "(SIGINT, SIGTERM, SIGHUP) before that, thaw it back.",
)
thaw = _group_cmd("thaw", "Thaw GROUP.")
kill = _group_cmd(
    "kill", "SIGKILL every process in GROUP (cgroup.kill) and wait for `populated 0`."
)


@cgroup.command(context_settings={"ignore_unknown_options": True})
@click.argument("group")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--thaw", "thaw_first", is_flag=True, help="Thaw GROUP first when it is frozen (else refused)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="After the command, print its status as JSON."
)
@_mutation_options
@click.pass_context
def run(
    ctx: click.Context,
    group: str,
    command: tuple[str, ...],
    thaw_first: bool,
    as_json: bool,
    no_wait: bool,
) -> None:
    """Start COMMAND inside GROUP and wait for it: `xhagent cgroup run GROUP -- CMD ARGS`.

    SIGINT, SIGTERM and SIGHUP are passed on to COMMAND; the exit status is COMMAND's
    (128+N when a signal N killed it)."""
    if not command or not command[0]:
        _fail("empty command: give one after `--`", 2)
    sub = _subtree(ctx)
    cg = _existing_group(sub, group)
    lock = _lock(sub, no_wait)
    try:
        _settle(sub)
        asked = cg.read(registry.FREEZE.name).strip() == "1"  # frozen or being frozen itself
        if asked or cg.events().get("frozen"):  # ... or through a group above it
            if not thaw_first:
                _fail(
                    f"{group} is frozen: a command started there would not run "
                    "(pass --thaw to thaw it first)"
                )
            if not asked:
                _fail(f"{group} is frozen through a group above it: --thaw thaws only {group}")
            cg.thaw()
        # Blocked from before the child exists until the forwarding is in place: a signal
        # arriving in between is passed on, not lost; the child gets the mask from before.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATING)
        try:
            child = cg.spawn(list(command), sigmask=mask)  # inside GROUP from its first instruction
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
    except CgroupError as exc:  # SpawnError too: the exec's or the join's, the child already reaped
        lock.release()
        _fail(str(exc))
    with forward_signals(child.pid) as received:
        signal.pthread_sigmask(
            signal.SIG_SETMASK, mask
        )  # one that came since the spawn is passed on now
        lock.release()
        try:
            child.wait()
        except (
            SpawnError
        ) as exc:  # the group was frozen after the check: its exec failed at the thaw
            _fail(str(exc))
    # Killed by signal N: 128+N, as a shell reports it (an exit(137) is not a SIGKILL, though).
    killed = signal.Signals(-child.returncode) if child.returncode < 0 else None
    code = 128 + killed if killed else child.returncode
    if as_json:
        click.echo(
            json.dumps(
                {
                    "group": group,
                    "path": str(cg.path),
                    "command": list(command),
                    "pid": child.pid,
                    "exit_code": code,
                    "signal": killed.name if killed else None,
                    "forwarded": [signal.Signals(s).name for s in received],
                }
            )
        )
    sys.exit(code)
