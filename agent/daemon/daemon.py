"""`xhagent run`: the parts put together, in the order that keeps every promise.

1. the state dir's lock and database (a second agent on it is refused before anything);
2. the cgroup subtree (`locate()`); when it is a delegated unit cgroup, that unit's own
   processes moved into its leaf (the agent itself when it runs in that unit; the holder
   of xhagent-workloads.service, the package's layout, when the subtree is named);
3. the task leaves' controllers (what the node cannot enforce is said once, here);
4. policies from the directory, CgroupPolicies reconciled;
5. `recover()`: the tasks of the last run re-adopted or finished;
6. the worker pool, when configured (pooling.py): its workers in `pool/<cpu>` leaves;
7. the socket, then the loop.

SIGTERM and SIGINT stop the agent and leave workloads running (their shims record them):
serving, or during start-up, which then ends at its next checkpoint (between two of the
steps above, or two files or two tasks of steps 4 and 5) and closes what it opened; either
way the agent exits 0. SIGHUP re-reads the policy directory (signals.py holds the handlers
from the first line of `xhagent run`). The loop runs in its own thread; the main thread
waits for signals and the policy directory's changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cgroups.delegation import settle
from ..cgroups.lock import SubtreeLock
from ..cgroups.subtree import locate
from ..config import PoolConfig
from ..node_model import Node
from .api import transport
from .api.access import Directory
from .api.service import AgentService
from .exec.executor import Executor
from .exec.spares import DEFAULT_SPARES
from .loop.faults import Faults
from .loop.scheduler import Scheduler
from .loop.submission import parse_submission
from .policies.enact import enact
from .policies.policy_set import PolicySet
from .policies.watch import DirectoryWatch
from .signals import DaemonSignals, StopRequested
from .store import Store

log = logging.getLogger("xhagent")
DEFAULT_POLICIES = Path("/etc/xhagent/policies.d")
DEFAULT_LOG_CAP = 16 << 20
RELOAD = "policy_reload"  # where a failed reload of the policy directory is counted


@dataclass
class Settings:
    state_dir: Path
    socket: Path
    policies_dir: Path | None
    node: Node
    subtree: str | None = None
    log_cap: int = DEFAULT_LOG_CAP
    admin_group: str = "xhagent-admin"  # "" for none: root and the agent's user only
    max_streams: int = 1024  # following API streams per caller
    task_series: int = 200  # tasks whose own cgroup series /metrics shows, at most
    metrics_addr: tuple[str, int] | None = None  # None: no metrics endpoint
    debug_endpoints: bool = False  # /debug/ on the metrics port
    pool: PoolConfig | None = None  # the worker pool to host; None: none
    shim_server: Path | None = None  # `xhagent-shim --serve-at` socket; None: the agent's own
    spare_run_dirs: int = DEFAULT_SPARES  # run directories made ahead (exec/spares.py)
    allocator: str = ""  # what allocator.settle() said the agent runs with
    extra: dict = field(default_factory=dict)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/xhagent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(base) / "xhagent"


def _few_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own heap arena (up to 8 per CPU); the API
    threads would each keep one, megabytes of resident memory for a daemon mostly asleep.
    Set before any thread starts (mallopt M_ARENA_MAX; ignored where it is not glibc)."""
    try:
        ctypes.CDLL(None).mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


class Daemon:
    def __init__(self, settings: Settings, signals: DaemonSignals):
        self.settings = settings
        self.signals = signals  # installed by the caller, before anything here starts
        self.store: Store | None = None
        self.service: AgentService | None = None
        self.server = None
        self.scheduler: Scheduler | None = None
        self.executor: Executor | None = None
        self.faults = Faults()
        self.watch: DirectoryWatch | None = None
        self.exporter = None
        self.runq = None  # the run-queue latency probe, where BPF loads
        self.metrics = None
        self.taskstats = None  # the delay accounting client, where netlink allows
        self.pool = None  # the hosted runtime Pool, when settings.pool asks for one
        self.tracer = None  # the scheduler traces of tasks with `trace: true`
        self._thread: threading.Thread | None = None

    def report(
        self, kind: str, message: str, task_id: str | None = None, detail: dict | None = None
    ) -> None:
        log.info("%s: %s", kind, message)
        if self.store is not None:
            self.store.add_event(kind, message, task_id=task_id, detail=detail)

    def start(self) -> bool:
        """Everything up to serving; False when a stop came first: it was said, and what
        start-up had opened is closed."""
        _few_malloc_arenas()
        try:
            self.signals.checkpoint()
            self.store = Store.open(self.settings.state_dir)
            self._start()
        except StopRequested as stop:
            try:
                self._stopping(stop.signum, " during start-up")
            finally:
                self.close()
            return False
        except BaseException:
            self.close()
            raise
        return True

    def _stopping(self, signum: int, when: str = "") -> None:
        self.report("Stopping", f"{signal.Signals(signum).name}{when}: workloads keep running")

    def _start(self) -> None:
        s, checkpoint = self.settings, self.signals.checkpoint
        checkpoint()
        pool_cpus = None
        if s.pool is not None:  # a pool that cannot be is refused before anything happens
            from .exec.pooling import pool_cpus as resolve_pool

            pool_cpus = resolve_pool(s.pool, s.node.reserved_cpus)
        sub = locate(s.subtree)
        with SubtreeLock(sub.path).acquire():
            if sub.agent_leaf:
                moved = settle(sub.mount, sub.placement)
                if moved:
                    self.report("Settled", f"moved pids {moved} into {sub.path / sub.agent_leaf}")
            executor = self.executor = Executor(
                sub, s.state_dir, s.log_cap, s.shim_server, s.spare_run_dirs
            )
            executor.on_shim_server = self._shim_server_reached
            missing = executor.prepare()
        from .exec.tracing import TaskTracer

        executor.tracer = self.tracer = TaskTracer()
        executor.on_trace = lambda task_id, kind, message, detail=None: self.report(
            kind, message, task_id, detail
        )
        if s.allocator:
            self.report("Allocator", s.allocator)
        self.report("Subtree", f"{sub.path} ({sub.placement.how if sub.placement else 'given'})")
        for controller, why in sorted(missing.items()):
            self.report("NotEnforced", f"{controller}: {why}; tasks run without its limits")
        checkpoint()
        policies = PolicySet(
            s.policies_dir, self.store, time.time_ns, self.report, lambda p: enact(p, sub)
        )
        # many files (a millisecond or more each) must not hold a stop back
        policies.reload(between=checkpoint)
        policies.reconcile()
        checkpoint()
        self.scheduler = Scheduler(
            self.store,
            executor,
            s.node,
            parse_submission,
            policies.scheduling,
            policies.classes,
            faults=self.faults,
        )
        counts = self.scheduler.recover(checkpoint)
        self.report("Recovered", " ".join(f"{k}={v}" for k, v in counts.items()))
        checkpoint()
        if pool_cpus is not None:
            from .exec.pooling import start_pool

            self.pool = start_pool(pool_cpus, s.pool.slice_ms, sub, self.report)
            checkpoint()
        if s.metrics_addr is not None:
            self._serve_metrics(s.metrics_addr, sub, executor)
            checkpoint()
        info = {"socket": s.socket, "state_dir": s.state_dir, **s.extra}
        if self.exporter is not None:
            info["metrics_addr"] = self.exporter.url
        if self.pool is not None:
            from .exec.pooling import describe

            info["pool"] = describe(self.pool)
        self.service = AgentService(
            self.scheduler,
            policies,
            info,
            self.faults,
            Directory(s.admin_group or None),
            max_streams=s.max_streams,
        )
        self.server = transport.bind(
            self.service,
            s.socket,
            health=self.service.health,
            ends=self.service.end_streams,
            calls=self.metrics,
        )
        self.policies = policies
        policies.on_change = self.scheduler.wake
        self.sub = sub
        if s.policies_dir is not None and s.policies_dir.is_dir():
            self.watch = DirectoryWatch(s.policies_dir)
        self._thread = threading.Thread(target=self.scheduler.run, name="xhagent-loop", daemon=True)
        self._thread.start()
        self.scheduler.wake()
        self.report("Serving", f"unix:{s.socket} (state {s.state_dir})")

    def _shim_server_reached(self, reached: bool, why: str) -> None:
        if reached:
            self.report("ShimServer", why)
        else:  # each start then spawns a shim of its own, as the agent's child
            self.report(
                "ShimServerUnreachable",
                f"{why}; until it is reached, workloads start as the agent's descendants, "
                "in its sandbox",
            )

    def _delay_accounting(self) -> None:
        """Before any workload starts: the kernel keeps I/O and memory delays only of tasks
        forked while kernel.task_delayacct is on (xhagent.metrics.taskstats)."""
        from ..metrics.taskstats import enable_delayacct

        acct = enable_delayacct()
        if acct.changed:
            self.report("DelayAccounting", "kernel.task_delayacct switched on")
        elif acct.state != "on":
            self.report("NotObserved", f"task I/O and memory delays: {acct.reason}")

    def _serve_metrics(self, addr: tuple[str, int], sub, executor: Executor) -> None:
        from ..metrics.exporter import Exporter
        from .exec.executor import SHIMS, TASKS
        from .metrics import SUBTREE, AgentMetrics

        def groups():
            yield SUBTREE, sub.root
            yield SHIMS, sub.group(SHIMS)
            for task_id in executor.leaves():
                yield f"{TASKS}/{task_id}", sub.group(f"{TASKS}/{task_id}")

        try:
            from ..bpf.runqlat import RunqLatency

            runq = RunqLatency()
        except (OSError, ImportError) as exc:  # no BPF here: said once, the rest still served
            runq = None
            self.report("NotObserved", f"run-queue latency: {exc}")
        self.runq = runq
        self._delay_accounting()  # before the loop starts any workload
        try:
            from ..metrics.taskstats import TaskStats

            self.taskstats = TaskStats()
        except OSError as exc:
            self.report("NotObserved", f"task delays: {exc}")
        metrics = AgentMetrics(
            self.store,
            groups,
            runq,
            self.taskstats,
            self.faults,
            self.scheduler.disk,
            task_series=self.settings.task_series,
            report=self.report,
            spares=self.executor.spares,
        )
        if self.pool is not None:
            from ..runtime.metrics import PoolCollector

            metrics.registry.register(PoolCollector(self.pool))
        metrics.registry.register(self.tracer)
        self.scheduler.step_timed = metrics.step_seconds.observe
        self.scheduler.lag_timed = metrics.lag_seconds.observe
        self.metrics = metrics
        self.exporter = Exporter(metrics.registry, addr, self.settings.debug_endpoints)
        self.store.on_commit = metrics.observe
        self.exporter.start()
        self.report("Metrics", self.exporter.url)

    def reload(self, names=None) -> None:
        """The policy directory changed (or SIGHUP): its files through the policy set's
        one commit path; a failure of the agent's own is counted, and the agent goes on."""
        try:
            self.policies.reload(names)
        except Exception as exc:  # a file's own errors are events: this is the agent's
            self.faults.failed(RELOAD, exc)
        else:
            self.faults.cleared(RELOAD)
        self.service.health.changed()

    def serve_forever(self) -> None:
        """Until SIGTERM or SIGINT (main thread only). A stop goes before a re-read asked
        for at the same time. A SIGHUP that came during start-up is acted on here, at once:
        start-up may have read the directory before the operator's edit it announces, and
        a file read again unchanged is no change (no event, nothing enacted)."""
        sel = selectors.DefaultSelector()
        sel.register(self.signals, selectors.EVENT_READ)
        if self.watch is not None:
            sel.register(self.watch, selectors.EVENT_READ)
        try:
            while True:
                if self.signals.stop is not None:
                    self._stopping(self.signals.stop)
                    return
                if self.signals.take_reload():
                    self.report("Reload", "SIGHUP: re-reading the policy directory")
                    self.reload(None)
                for key, _ in sel.select():
                    if key.fileobj is self.watch:
                        self.reload(self.watch.changes())
                    else:
                        self.signals.drain()
        finally:
            sel.close()

    def close(self) -> None:
        """Stop serving and the loop; workloads keep running under their shims."""
        if self.server is not None:
            self.server.stop(grace=1.0)
            self.server = None
        if self.service is not None:  # made just before the socket is bound
            self.service.close()
            self.service = None
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None
        if self.metrics is not None:
            self.metrics.census.close()
            self.metrics = None
        if self.runq is not None:
            self.runq.close()
            self.runq = None
        if self.taskstats is not None:
            self.taskstats.close()
            self.taskstats = None
        if self.scheduler is not None:
            self.scheduler.stop()
            if self._thread is not None:
                self._thread.join(timeout=10)
            if self._thread is None or not self._thread.is_alive():  # its selector is free
                self.scheduler.close()
            self._thread = None
            self.scheduler = None
        if self.executor is not None:  # after the loop: no start is under way
            self.executor.close()
            self.executor = None
        if self.pool is not None:  # its clients' pending tasks fail with PoolClosed
            self.pool.close()
            self.pool = None
        if self.tracer is not None:  # running tasks' traces end here; the tasks go on
            self.tracer.close()
            self.tracer = None
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.store is not None:
            self.store.close()
            self.store = None
