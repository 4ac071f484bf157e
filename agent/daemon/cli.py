"""`xhagent run` (the daemon) and its clients: submit, ps, get, cancel, logs, events, apply,
delete, explain.

Every client finds the agent at `--socket PATH`, else $XHAGENT_SOCKET, else
/run/xhagent/xhagent.sock. Exit status: 0 done; 1 refused or failed (no agent, a task
that already ended; `submit --wait`: a task did not succeed); 2 bad input (the agent's
FILE:LINE:COL errors).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from ..cliparams import FiniteFloat


def _fail(message: str, code: int = 1):
    click.echo(f"xhagent: {message}", err=True)
    sys.exit(code)


def _socket_option(fn):
    return click.option(
        "--socket",
        "socket_path",
        default=None,
        metavar="PATH",
        help="The agent's socket [default: $XHAGENT_SOCKET, else /run/xhagent/xhagent.sock].",
    )(fn)


def _client(socket_path: str | None):
    from .api import ApiError, connect, resolve_socket

    try:
        return connect(resolve_socket(socket_path))
    except ApiError as exc:
        _fail(str(exc), exc.exit_code)


def _call(fn, *args, **kw):
    from .api import ApiError

    try:
        return fn(*args, **kw)
    except ApiError as exc:
        _fail(str(exc), exc.exit_code)


def _pb():
    from .v1 import agent_pb2

    return agent_pb2


def task_json(msg) -> dict:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


# -- the daemon --------------------------------------------------------------------------------
@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Agent config (nodeName, labels, reservedCpus) "
    "[default: /etc/xhagent/agent.yaml when it exists].",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where tasks, events and outputs are kept [default: /var/lib/xhagent as "
    "root, else $XDG_STATE_HOME/xhagent].",
)
@_socket_option
@click.option(
    "--policies-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="SchedulingPolicy and CgroupPolicy files, watched [default: /etc/xhagent/policies.d].",
)
@click.option(
    "--subtree",
    default=None,
    help="The agent's cgroup subtree, relative to the cgroup2 root; one its manager marked "
    "delegated (a unit with Delegate=) gets a leaf for that unit's own processes [default: "
    "discovered: the delegated systemd unit cgroup, else xhagent.slice].",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="One line per event, as text or JSON.",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1:9464",
    show_default=True,
    help="Where Prometheus scrapes /metrics (HOST:PORT; port 0: any free one); off: none.",
)
@click.option(
    "--debug-endpoints",
    type=click.Choice(["off", "on", "heap"]),
    default="off",
    show_default=True,
    help="Serve /debug/stacks, /debug/profile?seconds=N and /debug/heap on the metrics "
    "address; heap also traces allocations (costs memory and time).",
)
@click.option(
    "--pool",
    "pool_cpus",
    default=None,
    metavar="off|auto|CPULIST",
    help="Host a runtime worker pool for other processes' Python work (`agent_pool()`): "
    "auto: every CPU the agent may use but the reserved ones; or a cpu list such as 2-7 "
    "[default: agent.yaml's pool:, else off].",
)
@click.option(
    "--pool-slice-ms",
    type=FiniteFloat(0, 10_000, lo_open=False, unit=" ms"),
    default=None,
    help="The pool's preemption time slice, 0..10000 (0: none) [default: agent.yaml's, else 10].",
)
def run(
    config_path,
    state_dir,
    socket_path,
    policies_dir,
    subtree,
    log_format,
    metrics_addr,
    debug_endpoints,
    pool_cpus,
    pool_slice_ms,
) -> None:
    """Run the agent in the foreground: take tasks, run them in cgroup leaves, serve the API."""
    from ..config import ConfigError, check_reserved, load_config
    from ..inventory import build_model, discover_node
    from ..metrics.exporter import parse_addr
    from .api import BindError, resolve_socket
    from .daemon import DEFAULT_LOG_CAP, DEFAULT_POLICIES, Daemon, Settings, default_state_dir
    from .notify import notify_ready, notify_stopping
    from .store import StoreError

    _logging(log_format)
    # systemd's $NOTIFY_SOCKET is the agent's alone (sd_notify's unset_environment): taken out
    # of the environment so no child (shim, workload, helper) inherits and misuses it.
    manager = {"NOTIFY_SOCKET": os.environ.pop("NOTIFY_SOCKET", "")}
    try:
        metrics = None if metrics_addr == "off" else parse_addr(metrics_addr)
    except ValueError as exc:
        _fail(f"--metrics-addr: {exc}", 2)
    if metrics is None and debug_endpoints != "off":
        _fail("--debug-endpoints: they are served on the metrics address, which is off", 2)
    try:
        config = load_config(config_path)
        inv = discover_node(config=config)
        check_reserved(config, [c.id for c in inv.cpu.cpus])
        node = build_model(inv)
    except ConfigError as exc:
        _fail(str(exc), 2)
    try:
        pool = _pool_settings(config.pool, pool_cpus, pool_slice_ms)
        if pool is not None:  # refused here, before the state dir or the subtree is touched
            from .pooling import pool_cpus as resolve_pool

            resolve_pool(pool, node.reserved_cpus)
    except ValueError as exc:
        _fail(str(exc), 2)
    policies_dir = policies_dir or config.policies_dir
    if policies_dir is None and DEFAULT_POLICIES.is_dir():
        policies_dir = DEFAULT_POLICIES
    settings = Settings(
        state_dir=state_dir or config.state_dir or default_state_dir(),
        socket=resolve_socket(socket_path or (str(config.socket) if config.socket else None)),
        policies_dir=policies_dir,
        node=node,
        subtree=subtree or config.subtree,
        log_cap=config.log_cap or DEFAULT_LOG_CAP,
        metrics_addr=metrics,
        debug_endpoints=debug_endpoints != "off",
        pool=pool,
    )
    if debug_endpoints == "heap":
        import tracemalloc

        tracemalloc.start(25)
    daemon = Daemon(settings)
    try:
        daemon.start()
    except (StoreError, BindError, OSError, ValueError) as exc:
        _fail(f"cannot start: {exc}")
    metrics_note = f", metrics at {daemon.exporter.url}" if daemon.exporter else ""
    click.echo(
        f"xhagent: serving on unix:{settings.socket} (state in {settings.state_dir}"
        f"{metrics_note}); stop with SIGTERM or Ctrl-C",
        err=True,
    )
    # READY=1 only now: start() settled the subtree, recovered the tasks and bound the
    # socket, so `systemctl start` (Type=notify) returns to a client that finds it serving.
    try:
        notify_ready(f"serving on unix:{settings.socket}", manager)
    except OSError as exc:  # the unit waits for it: failing is better than a start timeout
        daemon.close()
        _fail(f"cannot tell the service manager it is ready ({manager['NOTIFY_SOCKET']}): {exc}")
    try:
        daemon.serve_forever()
    finally:
        try:
            notify_stopping(manager)
        except OSError as exc:  # stopping anyway; the manager sees the exit
            logging.getLogger("xhagent").warning("STOPPING=1 not delivered: %s", exc)
        daemon.close()


def _pool_settings(config, cpus: str | None, slice_ms: float | None):
    """agent.yaml's pool (a PoolConfig or None) with --pool and --pool-slice-ms over it."""
    from ..config import PoolConfig
    from ..cpulist import parse_cpulist

    if cpus == "off":
        if slice_ms is not None:
            raise ValueError("--pool-slice-ms is for a pool, and --pool is off")
        return None
    if cpus is None and config is None:
        if slice_ms is not None:
            raise ValueError("--pool-slice-ms is for a pool: name one with --pool or pool:")
        return None
    pool = config or PoolConfig(at="--pool")
    if cpus is not None:
        try:
            wanted = None if cpus == "auto" else tuple(sorted(set(parse_cpulist(cpus))))
        except ValueError as exc:
            raise ValueError(f"--pool {cpus!r}: {exc} (off, auto or a cpu list)") from None
        if wanted == ():
            raise ValueError("--pool: no CPU named (auto: all the agent may use)")
        pool = replace(pool, cpus=wanted, at="--pool")
    if slice_ms is not None:
        pool = replace(pool, slice_ms=slice_ms)
    return pool


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": record.created,
                "level": record.levelname.lower(),
                "message": record.getMessage(),
            }
        )


def _logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("xhagent")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


# -- clients -----------------------------------------------------------------------------------
@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--wait", is_flag=True, help="Wait until every task ended; exit 1 unless all succeeded."
)
@click.option(
    "--key", default="", help="Idempotency key: submitting again with it makes no duplicate."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_socket_option
def submit(files, wait, key, as_json, socket_path) -> None:
    """Submit the Task documents of FILES ('-' for standard input)."""
    from ..spec import SpecError, read_text

    pb = _pb()
    client = _client(socket_path)
    tasks = []
    for name in files:
        try:
            source = read_text(name)
        except SpecError as exc:
            _fail(str(exc), 2)
        reply = _call(
            client.Submit,
            pb.SubmitRequest(
                source=source, file_name=name, idempotency_key=f"{key}:{name}" if key else ""
            ),
        )
        tasks += reply.tasks
    if not as_json:
        for t in tasks:
            click.echo(f"{t.id} {t.name} {t.state}")
    if wait:
        tasks = [_wait_ended(client, t.id) for t in tasks]
    if as_json:
        click.echo(json.dumps([task_json(t) for t in tasks], indent=2))
    elif wait:
        for t in tasks:
            click.echo(f"{t.id} {t.name} {t.state}{_outcome(t)}")
    if wait and any(t.state != "Succeeded" for t in tasks):
        sys.exit(1)


def _wait_ended(client, task_id: str):
    pb = _pb()
    while True:
        task = _call(client.Get, pb.GetRequest(id=task_id)).task
        if task.state in ("Succeeded", "Failed", "Cancelled"):
            return task
        time.sleep(0.1)


def _outcome(t) -> str:
    if t.HasField("exit_code"):
        return f" (exit {t.exit_code})"
    if t.HasField("signal"):
        return f" (signal {t.signal})"
    return f" ({t.error})" if t.error else ""


@click.command()
@click.option("--all", "all_", is_flag=True, help="Ended tasks too.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_socket_option
def ps(all_, as_json, socket_path) -> None:
    """The agent's tasks: id, name, state, where, and why a Pending task waits."""
    pb = _pb()
    tasks = _call(_client(socket_path).List, pb.ListRequest(all=all_, limit=1000)).tasks
    if as_json:
        click.echo(json.dumps([task_json(t) for t in tasks], indent=2))
        return
    click.echo(f"{'ID':<10} {'NAME':<24} {'STATE':<10} {'CPUS':<10} NOTE")
    for t in tasks:
        note = "; ".join(r.detail for r in t.reasons) or _outcome(t).strip(" ()")
        if t.unenforced and not note:
            note = "not enforced: " + ", ".join(u.limit.split("=")[0] for u in t.unenforced)
        cpus = ",".join(map(str, t.cpus)) or "-"
        click.echo(f"{t.id:<10} {t.name[:24]:<24} {t.state:<10} {cpus[:10]:<10} {note}")


@click.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_socket_option
def get(task_id, as_json, socket_path) -> None:
    """One task in full: state, placement, limits not enforced and why, outcome."""
    t = _call(_client(socket_path).Get, _pb().GetRequest(id=task_id)).task
    if as_json:
        click.echo(json.dumps(task_json(t), indent=2))
        return
    click.echo(f"{t.id} {t.name}: {t.state}{_outcome(t)} (attempt {t.attempt})")
    if t.node:
        click.echo(f"  node {t.node}, cpus {','.join(map(str, t.cpus))}")
    for r in t.reasons:
        click.echo(f"  waiting: {r.detail}")
    for u in t.unenforced:
        click.echo(f"  not enforced: {u.limit}: {u.reason}")
    if t.error:
        click.echo(f"  error: {t.error}")


@click.command()
@click.argument("task_id")
@_socket_option
def cancel(task_id, socket_path) -> None:
    """Stop a task: kill its processes (cgroup.kill) and remove its leaf."""
    t = _call(_client(socket_path).Cancel, _pb().CancelRequest(id=task_id)).task
    click.echo(f"{t.id} {t.name} {t.state}{_outcome(t)}")


@click.command()
@click.argument("task_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the task ends.")
@click.option(
    "--stream", type=click.Choice(["both", "stdout", "stderr"]), default="both", show_default=True
)
@_socket_option
def logs(task_id, follow, stream, socket_path) -> None:
    """A task's output (its current attempt's stdout and stderr)."""
    pb = _pb()
    which = {
        "both": pb.LOG_STREAM_BOTH,
        "stdout": pb.LOG_STREAM_STDOUT,
        "stderr": pb.LOG_STREAM_STDERR,
    }[stream]
    client = _client(socket_path)
    chunks = _call(client.Logs, pb.LogsRequest(id=task_id, stream=which, follow=follow))
    from .api import ApiError

    try:
        for chunk in chunks:
            out = sys.stderr if chunk.stream == pb.LOG_STREAM_STDERR else sys.stdout
            out.buffer.write(chunk.data)
            out.flush()
    except ApiError as exc:
        _fail(str(exc), exc.exit_code)


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@click.option("--task", "task_id", default="", help="Only this task's events.")
@click.option("--since", type=int, default=0, show_default=True, help="After this sequence number.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_socket_option
def events(follow, task_id, since, as_json, socket_path) -> None:
    """The agent's event stream: submissions, transitions, policy changes."""
    from .api import ApiError

    pb = _pb()
    client = _client(socket_path)
    request = pb.WatchRequest(since_seq=since, task_id=task_id, follow=follow)
    stream = _call(client.Watch, request)
    try:
        for ev in stream:
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "seq": ev.seq,
                            "ts_ns": ev.ts_ns,
                            "task_id": ev.task_id,
                            "kind": ev.kind,
                            "message": ev.message,
                            "detail": json.loads(ev.detail_json or "{}"),
                        }
                    )
                )
            else:
                when = time.strftime("%H:%M:%S", time.localtime(ev.ts_ns / 1e9))
                click.echo(f"{ev.seq:>6} {when} {ev.task_id or '-':<9} {ev.kind}: {ev.message}")
    except ApiError as exc:
        _fail(str(exc), exc.exit_code)


@click.command()
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    help="A SchedulingPolicy or CgroupPolicy file.",
)
@_socket_option
def apply(path, socket_path) -> None:
    """Apply policies through the agent (kept until `xhagent delete policy NAME`)."""
    from ..spec import SpecError, read_text

    try:
        source = read_text(path)
    except SpecError as exc:
        _fail(str(exc), 2)
    reply = _call(
        _client(socket_path).ApplyPolicy, _pb().ApplyPolicyRequest(source=source, file_name=path)
    )
    for p in reply.policies:
        click.echo(f"applied {p.kind} {p.name} (version {p.version})")


@click.group()
def delete() -> None:
    """Remove something the agent keeps."""


@delete.command("policy")
@click.argument("name")
@click.option("--kind", type=click.Choice(["SchedulingPolicy", "CgroupPolicy"]), default=None)
@_socket_option
def delete_policy(name, kind, socket_path) -> None:
    """Remove a policy applied through the API."""
    reply = _call(
        _client(socket_path).RemovePolicy, _pb().RemovePolicyRequest(kind=kind or "", name=name)
    )
    click.echo(f"removed {reply.removed.kind} {reply.removed.name}")


@click.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_socket_option
def explain(task_id, as_json, socket_path) -> None:
    """Where a task goes or why it waits: every node's verdict."""
    reply = _call(_client(socket_path).Explain, _pb().ExplainRequest(id=task_id))
    if as_json:
        click.echo(reply.detail_json)
        return
    click.echo(
        f"{task_id}: {'Pending' if reply.pending else 'placed'}"
        + (f" (policy {reply.policy})" if reply.policy else "")
    )
    for v in reply.verdicts:
        click.echo(f"  {v.node}: " + (f"fits (score {v.score:.3f})" if v.fits else v.reason))
