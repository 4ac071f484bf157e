"""`xhagent run`: the agent daemon in the foreground, its settings from the flags and
agent.yaml, its readiness told to systemd."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import click

from ..cliparams import FiniteFloat
from .api.cli import fail, socket_option
from .signals import DaemonSignals

# What an option not given takes when agent.yaml has no field for it either.
DEFAULT_METRICS = "127.0.0.1:9464"
DEFAULT_MAX_STREAMS = 1024
DEFAULT_TASK_SERIES = 200


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
@socket_option
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
    default=None,
    help="One line per event, as text or JSON [default: agent.yaml's logFormat, else text].",
)
@click.option(
    "--metrics-addr",
    default=None,
    help="Where Prometheus scrapes /metrics (HOST:PORT; port 0: any free one); off: none "
    f"[default: agent.yaml's metricsAddr, else {DEFAULT_METRICS}].",
)
@click.option(
    "--debug-endpoints",
    type=click.Choice(["off", "on", "heap"]),
    default=None,
    help="Serve /debug/stacks, /debug/profile?seconds=N and /debug/heap on the metrics "
    "address; heap also traces allocations (costs memory and time) [default: agent.yaml's "
    "debugEndpoints, else off].",
)
@click.option(
    "--admin-group",
    default=None,
    metavar="GROUP",
    help="Members of GROUP may do through the API all that root may; '' for none "
    "[default: agent.yaml's adminGroup, else xhagent-admin].",
)
@click.option(
    "--max-streams",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Following Watch and Logs streams one caller (uid) may hold open at once "
    "[default: agent.yaml's maxStreams, else 1024].",
)
@click.option(
    "--task-series",
    type=click.IntRange(0, 100_000),
    default=None,
    help="Tasks whose own cgroup series /metrics shows at most (the oldest running first); "
    "xhagent_metrics_tasks_left_out says how many more run [default: agent.yaml's "
    "taskSeries, else 200].",
)
@click.option(
    "--spare-run-dirs",
    type=click.IntRange(0, 1 << 20),
    default=None,
    help="Run directories kept made ahead on the state disk, made while the node is idle, "
    "for the first starts of a burst (16 KiB each; 0: none, every start makes its own) "
    "[default: agent.yaml's spareRunDirs, else 1024].",
)
@click.option(
    "--shim-server",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="SOCKET",
    help="Start workloads from the `xhagent-shim --serve-at SOCKET` already running (the "
    "packaged xhagent-workloads.service), not from a shim server of the agent's own, so that "
    "they are none of the agent's descendants [default: agent.yaml's shimServer, else none].",
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
@click.option(
    "--allocator",
    type=click.Choice(["malloc", "pymalloc"]),
    default="malloc",
    show_default=True,
    help="The agent's memory allocator for Python objects: malloc gives memory freed after a "
    "peak back to the kernel (about 5% more CPU in bursts of tasks); pymalloc, CPython's own, "
    "can keep it resident.",
)
def run(
    allocator,
    config_path,
    state_dir,
    socket_path,
    policies_dir,
    subtree,
    log_format,
    metrics_addr,
    debug_endpoints,
    admin_group,
    max_streams,
    task_series,
    spare_run_dirs,
    shim_server,
    pool_cpus,
    pool_slice_ms,
) -> None:
    """Run the agent in the foreground: take tasks, run them in cgroup leaves, serve the API."""
    from .allocator import settle

    # Before anything is opened: this may execute the agent again with its allocator set.
    try:
        memory = settle(allocator)
    except ValueError as exc:
        fail(str(exc), 2)
    # First of all, before the imports below (a quarter of a second) and the state dir:
    # a stop from here on ends the agent the one orderly way, never by the default action.
    signals = click.get_current_context().with_resource(DaemonSignals())
    from ..config import ConfigError, check_reserved, load_config
    from ..inventory import build_model, discover_node
    from ..metrics.exporter import parse_addr
    from .api.access import DEFAULT_ADMIN_GROUP
    from .api.client import resolve_socket
    from .api.transport import BindError
    from .daemon import DEFAULT_LOG_CAP, DEFAULT_POLICIES, Daemon, Settings, default_state_dir
    from .exec.spares import DEFAULT_SPARES
    from .notify import notify_ready
    from .store import StoreError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        fail(str(exc), 2)
    # an option given wins over the file, the file over the built-in default
    log_format = _first(log_format, config.log_format, "text")
    metrics_addr = _first(metrics_addr, config.metrics_addr, DEFAULT_METRICS)
    debug_endpoints = _first(debug_endpoints, config.debug_endpoints, "off")
    max_streams = _first(max_streams, config.max_streams, DEFAULT_MAX_STREAMS)
    task_series = _first(task_series, config.task_series, DEFAULT_TASK_SERIES)
    spare_run_dirs = _first(spare_run_dirs, config.spare_run_dirs, DEFAULT_SPARES)
    _logging(log_format)
    # systemd's $NOTIFY_SOCKET is the agent's alone (sd_notify's unset_environment): taken out
    # of the environment so no child (shim, workload, helper) inherits and misuses it.
    manager = {"NOTIFY_SOCKET": os.environ.pop("NOTIFY_SOCKET", "")}
    try:
        metrics = None if metrics_addr == "off" else parse_addr(metrics_addr)
    except ValueError as exc:
        fail(f"--metrics-addr: {exc}", 2)
    if metrics is None and debug_endpoints != "off":
        fail("--debug-endpoints: they are served on the metrics address, which is off", 2)
    try:
        inv = discover_node(config=config)
        check_reserved(config, [c.id for c in inv.cpu.cpus])
        node = build_model(inv)
    except ConfigError as exc:
        fail(str(exc), 2)
    try:
        pool = pool_settings(config.pool, pool_cpus, pool_slice_ms)
        if pool is not None:  # refused here, before the state dir or the subtree is touched
            from .exec.pooling import pool_cpus as resolve_pool

            resolve_pool(pool, node.reserved_cpus)
    except ValueError as exc:
        fail(str(exc), 2)
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
        admin_group=_first(admin_group, config.admin_group, DEFAULT_ADMIN_GROUP),
        max_streams=max_streams,
        task_series=task_series,
        spare_run_dirs=spare_run_dirs,
        metrics_addr=metrics,
        debug_endpoints=debug_endpoints != "off",
        pool=pool,
        allocator=memory,
        shim_server=shim_server or config.shim_server,
    )
    if debug_endpoints == "heap":
        import tracemalloc

        tracemalloc.start(25)
    daemon = Daemon(settings, signals)
    try:
        serving = daemon.start()
    except (StoreError, BindError, OSError, ValueError) as exc:
        fail(f"cannot start: {exc}")
    if not serving:  # stopped during start-up: said, and closed already
        _stopping(manager)
        return
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
        fail(f"cannot tell the service manager it is ready ({manager['NOTIFY_SOCKET']}): {exc}")
    try:
        daemon.serve_forever()
    finally:
        _stopping(manager)
        daemon.close()


def _stopping(manager: dict[str, str]) -> None:
    from .notify import notify_stopping

    try:
        notify_stopping(manager)
    except OSError as exc:  # stopping anyway; the manager sees the exit
        logging.getLogger("xhagent").warning("STOPPING=1 not delivered: %s", exc)


def pool_settings(config, cpus: str | None, slice_ms: float | None):
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


def _first(*values):
    """The first value that was given (an empty string is given: it means none)."""
    return next(v for v in values if v is not None)
