"""The daemon's metrics, for the exporter (`xhagent.metrics.exporter`).

Two sources, so that a scrape reads nothing twice and misses nothing between scrapes:
- what happened, from the store's committed events (`Store.on_commit` -> `observe`):
  queue wait, start latency and run time by class, deadline misses, preemptions, migrations,
  placement decisions, output bytes dropped. Counted once each, after the commit, never for
  a rolled-back change;
- what is, read at scrape time (`_Census.collect`): tasks by state and class, Pending
  tasks by reason, and the managed cgroups' statistics (CPU, memory, io, pressure), read in
  one batch (the files read by io_uring and by its fallbacks counted); the run-queue
  latency of their tasks (`xhagent.bpf.runqlat`, where BPF
  loads: the groups watched are kept in step with the managed ones at each scrape); each
  task's delays (`xhagent.metrics.taskstats`: CPU, block I/O, swap-in, reclaim...) summed
  over the processes in its leaf; whether the state disk is full, and what a full disk
  refused (`loop.diskfull`); plus the agent's own process (`process_*`).

CPU time by class (`class_cpu.py`) holds every task, those past the cap too: ended attempts
from their records, running ones from their leaves at each scrape.

Labels are bounded: classes come from policies, reasons and states are typed; the `group`
label names the agent's own groups and the leaves of tasks that run now, at most
`task_series` of them (the oldest first; `xhagent_metrics_tasks_left_out` counts the rest).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .. import __version__
from ..cgroups import Cgroup, CgroupError, registry
from ..cgroups.stats import StatsSampler
from .class_cpu import ClassCpu
from .loop.diskfull import DiskFull
from .loop.faults import Faults
from .store import TERMINAL, Event, Store, TaskRecord, TaskState

READ_PATHS = ("io_uring", "pread", "plain")  # StatsSampler.reads()
# Seconds. Queue waits and starts: a few ms to minutes; runs: up to days.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RUN_BUCKETS = (0.01, 0.1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
DEFAULT_CLASS = "default"
BOOST_ACTIONS = {"Boosted": "boost", "BoostEnded": "restore"}  # loop/boosts.py's events
# loop/moves.py's events -> the result label of xhagent_migrations_total
MIGRATION_RESULTS = {
    "Migrated": "moved",
    "MigrationAborted": "aborted",
    "MigrationFailed": "failed",
}
DELAY_KINDS = ("cpu", "blkio", "swapin", "reclaim", "thrashing", "compact")


class AgentMetrics:
    """The registry the exporter serves; `observe` is the store's on_commit."""

    def __init__(
        self,
        store: Store,
        groups: Callable[[], Iterable[tuple[str, Cgroup]]],
        runq=None,
        taskstats=None,
        faults: Faults | None = None,
        disk: DiskFull | None = None,
        task_series: int = 200,
    ):
        # `*_created` series double the exposition and Prometheus ignores them (process-wide;
        # the agent is the only registry in its process)
        disable_created_metrics()
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        reg = {"registry": self.registry}
        self.queue_wait = Histogram(
            "xhagent_task_queue_wait_seconds",
            "From submission to the first start of a task, by class.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            **reg,
        )
        self.start_latency = Histogram(
            "xhagent_task_start_latency_seconds",
            "From Starting to Running: leaf, shim and the workload's exec, by class.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            **reg,
        )
        self.run_time = Histogram(
            "xhagent_task_run_seconds",
            "From Running to the end of an attempt, by class.",
            ["class"],
            buckets=RUN_BUCKETS,
            **reg,
        )
        self.deadline_misses = Counter(
            "xhagent_deadline_misses",
            "Tasks found past their deadline (each once per run of the agent), by class.",
            ["class"],
            **reg,
        )
        self.preemptions = Counter(
            "xhagent_preemptions",
            "Tasks preempted for a higher-priority one, by class and action (freeze or kill).",
            ["class", "action"],
            **reg,
        )
        self.migrations = Counter(
            "xhagent_migrations",
            "Load-driven moves of a task to another device, by class and result (moved; "
            "aborted: started again where it was or requeued; failed: not stopped).",
            ["class", "result"],
            **reg,
        )
        self.boosts = Counter(
            "xhagent_resource_boosts",
            "Holders of a resource an earlier-deadline task waits for (edf-pic), by class and "
            "action: boost (its leaf given the waiter's weights) or restore (the boost ended).",
            ["class", "action"],
            **reg,
        )
        self.decisions = Counter(
            "xhagent_placement_decisions",
            "Placement decisions that changed a task: placed, or kept Pending with new reasons.",
            ["result"],
            **reg,
        )
        self.output_dropped = Counter(
            "xhagent_task_output_dropped_bytes",
            "Bytes of task output not kept (past the log cap, or after a failed write), by class.",
            ["class"],
            **reg,
        )
        # the gRPC server's calls, under the names grpc-prometheus gives them (what gRPC
        # dashboards query); method names are the service's, a bounded set
        self.calls_started = Counter(
            "grpc_server_started",
            "RPCs started on the agent's socket.",
            ["grpc_service", "grpc_method", "grpc_type"],
            **reg,
        )
        self.calls_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the agent's socket, by status code.",
            ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
            **reg,
        )
        self.call_seconds = Histogram(
            "grpc_server_handling_seconds",
            "From an RPC's start to its end (a stream's whole life), by method.",
            ["grpc_service", "grpc_method", "grpc_type"],
            buckets=LATENCY_BUCKETS,
            **reg,
        )
        self.step_seconds = Histogram(
            "xhagent_scheduler_step_seconds",
            "One scheduler step: exits collected, Pending tasks placed, starts committed.",
            buckets=LATENCY_BUCKETS,
            **reg,
        )
        self.lag_seconds = Histogram(
            "xhagent_scheduler_lag_seconds",
            "How late a scheduler step began after the time it was due (a backoff's end, a "
            "deadline, a start put off to the next step).",
            buckets=LATENCY_BUCKETS,
            **reg,
        )
        self._starting: dict[str, int] = {}  # task id -> when it entered Starting (ns)
        self._class: dict[str, str] = {}  # task id -> class, while it has not ended
        self.cpu = ClassCpu()
        self.census = _Census(store, groups, runq, taskstats, self._class, task_series, self.cpu)
        self.registry.register(self.census)
        uname = os.uname()
        Info(
            "xhagent_build",
            "The agent's version, its interpreter and the kernel it runs on.",
            **reg,
        ).info(
            {"version": __version__, "python": platform.python_version(), "kernel": uname.release}
        )
        if faults is not None:
            self.registry.register(_InternalErrors(faults))
        if disk is not None:
            self.registry.register(_StateDisk(disk))

    def call_started(self, service: str, method: str, kind: str) -> None:
        self.calls_started.labels(service, method, kind).inc()

    def call_ended(self, service: str, method: str, kind: str, code: str, seconds: float) -> None:
        self.calls_handled.labels(service, method, kind, code).inc()
        self.call_seconds.labels(service, method, kind).observe(seconds)

    def observe(self, written: list[tuple[Event, TaskRecord | None]]) -> None:
        for event, rec in written:
            if event.kind == "Transition" and rec is not None:
                self._transition(event, rec)
            elif event.kind == "Waiting":  # kept Pending with new reasons
                if rec is not None:
                    self._class[rec.id] = rec.summary.task_class or DEFAULT_CLASS
                self.decisions.labels("pending").inc()
            elif event.kind == "DeadlineMissed":
                self.deadline_misses.labels(self._class.get(event.task_id, DEFAULT_CLASS)).inc()
            elif event.kind in MIGRATION_RESULTS:
                cls = self._class.get(event.task_id, DEFAULT_CLASS)
                self.migrations.labels(cls, MIGRATION_RESULTS[event.kind]).inc()
            elif event.kind in BOOST_ACTIONS:
                cls = self._class.get(event.task_id, DEFAULT_CLASS)
                self.boosts.labels(cls, BOOST_ACTIONS[event.kind]).inc()
            elif event.kind == "OutputDropped":
                cls = self._class.get(event.task_id, DEFAULT_CLASS)
                self.output_dropped.labels(cls).inc(event.detail["bytes"])

    def _transition(self, event: Event, rec: TaskRecord) -> None:
        old, new = TaskState(event.detail["from"]), rec.state
        cls = rec.summary.task_class or DEFAULT_CLASS
        self._class[rec.id] = cls
        now = event.ts_ns
        if new is TaskState.STARTING:
            self._starting[rec.id] = now
            self.decisions.labels("placed").inc()
            if rec.attempt == 1:
                self.queue_wait.labels(cls).observe(max(0, now - rec.created_ns) / 1e9)
        elif new is TaskState.RUNNING:
            self.cpu.started(rec.id, cls)
        elif new is TaskState.FROZEN:
            self.preemptions.labels(cls, "freeze").inc()
        elif new is TaskState.PENDING and old is TaskState.RUNNING:
            # requeued: killed for a preemptor, not stopped for a move or a restart's backoff
            if rec.first_reason == "Preempted":
                self.preemptions.labels(cls, "kill").inc()
        began = self._starting.pop(rec.id, None) if old is TaskState.STARTING else None
        if began is not None and new is TaskState.RUNNING:
            self.start_latency.labels(cls).observe(max(0, now - began) / 1e9)
        if old in (TaskState.RUNNING, TaskState.FROZEN) and (
            new in TERMINAL or new is TaskState.PENDING
        ):
            self.cpu.ended(rec.id, rec.cpu_usec)
            if rec.started_ns:
                self.run_time.labels(cls).observe(max(0, now - rec.started_ns) / 1e9)
        if new in TERMINAL:
            self._class.pop(rec.id, None)
            self._starting.pop(rec.id, None)


class _InternalErrors:
    """The agent's own failures by where (loop.faults): each place exists from the start."""

    def __init__(self, faults: Faults):
        self.faults = faults

    def collect(self):
        fam = CounterMetricFamily(
            "xhagent_internal_errors",
            "Internal errors of the agent's own loops and API calls (not of tasks or "
            "requests), by where.",
            labels=["where"],
        )
        for where, n in sorted(self.faults.totals().items()):
            fam.add_metric([where], n)
        yield fam


class _StateDisk:
    """The state disk's full condition (loop.diskfull): a gauge, and what it refused."""

    def __init__(self, disk: DiskFull):
        self.disk = disk

    def collect(self):
        yield GaugeMetricFamily(
            "xhagent_state_disk_full",
            "1 while the state dir's disk is full (starts refused, writes failing), else 0.",
            value=int(self.disk.full),
        )
        fam = CounterMetricFamily(
            "xhagent_state_disk_enospc",
            "Starts refused and store writes failed for lack of space in the state dir.",
            labels=["operation"],
        )
        for operation, n in sorted(self.disk.totals().items()):
            fam.add_metric([operation], n)
        yield fam


class _Census:
    """What is, at scrape time."""

    def __init__(
        self,
        store: Store,
        groups,
        runq,
        taskstats,
        classes: dict[str, str],
        task_series: int,
        cpu: ClassCpu,
    ):
        self.store, self.groups, self.classes, self.cpu = store, groups, classes, cpu
        self.task_series = task_series  # task leaves shown at most: series stay bounded
        self.runq, self.taskstats = runq, taskstats
        # the groups' stat files stay open from one scrape to the next, and are opened
        # afresh only when the set of groups changed (a task started or ended)
        self._sampled: tuple[tuple[str, str], ...] = ()
        self._sampler: StatsSampler | None = None
        self._reads = dict.fromkeys(READ_PATHS, 0)  # of samplers already closed

    def collect(self):
        by_state, pending = self.store.census()
        tasks = GaugeMetricFamily(
            "xhagent_tasks",
            "Tasks known to the agent, by state and class.",
            labels=["state", "class"],
        )
        # every state of every class seen, 0 included: a series that vanishes at 0 reads as
        # "no data" to a query, not as none
        classes = sorted({cls or DEFAULT_CLASS for _, cls in by_state} or {DEFAULT_CLASS})
        counts: dict[tuple[str, str], int] = {}
        for (state, cls), n in by_state.items():
            key = (state, cls or DEFAULT_CLASS)
            counts[key] = counts.get(key, 0) + n
        for cls in classes:
            for state in TaskState:
                tasks.add_metric([state.value, cls], counts.get((state.value, cls), 0))
        yield tasks
        reasons = GaugeMetricFamily(
            "xhagent_pending_tasks", "Pending tasks by the kind of their reason.", labels=["reason"]
        )
        for kind, n in sorted(pending.items()):
            reasons.add_metric([kind or "Unknown"], n)
        yield reasons
        groups, left_out = self._shown_groups()
        shown = GaugeMetricFamily(
            "xhagent_metrics_tasks_left_out",
            "Running tasks whose own cgroup series this scrape left out (past --task-series).",
        )
        shown.add_metric([], len(left_out))
        yield shown
        stats = self._stats(groups)
        yield from group_metrics(groups, stats)
        yield self._class_cpu(classes, groups, stats, left_out)
        yield self._file_reads()
        if self.runq is not None:
            yield self._runq(groups)
        if self.taskstats is not None:
            yield self._delays(groups)

    def _shown_groups(self) -> tuple[list[tuple[str, Cgroup]], list[tuple[str, Cgroup]]]:
        """The groups whose series this scrape shows: the subtree's own always, the task
        leaves up to `task_series` (the oldest tasks first: ids sort by submission); and the
        leaves left out."""
        groups, leaves = [], []
        for name, group in self.groups():
            (leaves if name.startswith("tasks/") else groups).append((name, group))
        leaves.sort(key=lambda g: g[0])
        return groups + leaves[: self.task_series], leaves[self.task_series :]

    def _class_cpu(self, classes, groups, stats, left_out) -> CounterMetricFamily:
        """Every running task's leaf read (the shown ones by this scrape's sampler, the
        others here: one file each), then the totals by class (class_cpu.py)."""
        usage: dict[str, int] = {}
        for (name, _), st in zip(groups, stats, strict=True):
            cpu = st.get("cpu.stat") or {}
            if name.startswith("tasks/") and "usage_usec" in cpu:
                usage[name[len("tasks/") :]] = cpu["usage_usec"]
        running = set(self.cpu.running())
        for name, group in left_out:
            task_id = name[len("tasks/") :]
            if task_id in running:
                try:
                    usage[task_id] = int(group.get(registry.CPU_STAT)["usage_usec"])
                except (CgroupError, OSError, KeyError, ValueError):
                    continue  # the leaf went meanwhile: its end will say
        for task_id in running & usage.keys():
            self.cpu.seen(task_id, usage[task_id])
        fam = CounterMetricFamily(
            "xhagent_task_cpu_seconds",
            "CPU time used by tasks, by class: each ended attempt as its leaf counted it at "
            "the end, each running one as its leaf counts it now (cpu.stat usage_usec).",
            labels=["class"],
        )
        totals = self.cpu.totals()
        for cls in sorted(set(classes) | totals.keys()):
            fam.add_metric([cls], totals.get(cls, 0.0))
        return fam

    def _stats(self, groups: list[tuple[str, Cgroup]]) -> list[dict]:
        key = tuple((name, str(g.path)) for name, g in groups)
        if key != self._sampled or self._sampler is None:
            self.close()
            self._sampler = StatsSampler([g for _, g in groups])
            self._sampled = key
        return self._sampler.read()

    def _file_reads(self) -> CounterMetricFamily:
        fam = CounterMetricFamily(
            "xhagent_stats_file_reads",
            "Statistics files read for these metrics, by how: io_uring, or its fallbacks pread "
            "(a file io_uring would hand to its worker threads) and plain (no io engine).",
            labels=["via"],
        )
        now = self._sampler.reads() if self._sampler is not None else {}
        for via in READ_PATHS:
            fam.add_metric([via], self._reads[via] + now.get(via, 0))
        return fam

    def close(self) -> None:
        if self._sampler is not None:
            for via, n in self._sampler.reads().items():
                self._reads[via] += n
            self._sampler.close()
            self._sampler = None

    def _task_class(self, name: str) -> str:
        task_id = name.rpartition("/")[2] if name.startswith("tasks/") else None
        return self.classes.get(task_id, DEFAULT_CLASS) if task_id else ""

    def _delays(self, groups: list[tuple[str, Cgroup]]) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(
            "xhagent_task_delay_seconds",
            "Time a task's live processes waited, by kind (taskstats delay accounting).",
            labels=["group", "class", "kind"],
        )
        for name, group in groups:
            if not name.startswith("tasks/"):
                continue
            try:
                pids = [int(p) for p in (group.path / "cgroup.procs").read_text().split()]
            except (FileNotFoundError, ValueError):
                continue  # the leaf went meanwhile
            totals: dict[str, float] = {}
            for d in self.taskstats.delays_of(pids).values():
                for kind in DELAY_KINDS:
                    delay = getattr(d, kind)
                    if delay is not None:
                        totals[kind] = totals.get(kind, 0.0) + delay.total
            cls = self._task_class(name)
            for kind, total in sorted(totals.items()):
                fam.add_metric([name, cls, kind], total)
        return fam

    def _runq(self, groups: list[tuple[str, Cgroup]]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(
            "xhagent_runq_latency_seconds",
            "Time runnable tasks of a managed group waited for a CPU (BPF, sched_switch).",
            labels=["group", "class"],
        )
        ids: dict[int, str] = {}
        for name, group in groups:
            try:
                ids[os.stat(group.path).st_ino] = name
            except FileNotFoundError:
                continue  # a leaf removed since it was listed
        for gone in self.runq.watched() - ids.keys():
            self.runq.unwatch(gone)
        for cgid in ids.keys() - self.runq.watched():
            try:
                self.runq.watch(cgid)
            except OSError:
                break  # the map is full: the groups already watched go on
        for cgid, hist in sorted(self.runq.histograms().items()):
            name = ids.get(cgid)
            if name is None:
                continue
            cls = self._task_class(name)
            buckets = [(floatToGoString(le), n) for le, n in hist.buckets]
            fam.add_metric([name, cls], buckets, sum_value=hist.sum)
        return fam


def group_metrics(groups: list[tuple[str, Cgroup]], stats: list[dict]):
    """The managed groups' statistics (`stats`, one dict per group, as StatsSampler reads
    them) as metric families (`group` label: the name given)."""
    fam = {
        "cpu": CounterMetricFamily(
            "xhagent_cgroup_cpu_usage_seconds", "CPU time used (cpu.stat).", labels=["group"]
        ),
        "throttled": CounterMetricFamily(
            "xhagent_cgroup_cpu_throttled_seconds",
            "Time throttled by cpu.max (cpu.stat).",
            labels=["group"],
        ),
        "memory": GaugeMetricFamily(
            "xhagent_cgroup_memory_bytes", "Memory in use (memory.current).", labels=["group"]
        ),
        "mem_events": CounterMetricFamily(
            "xhagent_cgroup_memory_events",
            "memory.events counters (oom, oom_kill, max, high, low).",
            labels=["group", "event"],
        ),
        "io_bytes": CounterMetricFamily(
            "xhagent_cgroup_io_bytes",
            "Bytes read and written (io.stat).",
            labels=["group", "device", "direction"],
        ),  # fmt: skip
        "io_ops": CounterMetricFamily(
            "xhagent_cgroup_io_operations",
            "Read and write operations (io.stat).",
            labels=["group", "device", "direction"],
        ),  # fmt: skip
        "psi": CounterMetricFamily(
            "xhagent_cgroup_pressure_stall_seconds",
            "Time some or all tasks stalled on a resource (PSI totals).",
            labels=["group", "resource", "kind"],
        ),
    }
    for (name, _), st in zip(groups, stats, strict=True):
        cpu = st.get("cpu.stat") or {}
        if "usage_usec" in cpu:
            fam["cpu"].add_metric([name], cpu["usage_usec"] / 1e6)
        if "throttled_usec" in cpu:
            fam["throttled"].add_metric([name], cpu["throttled_usec"] / 1e6)
        if isinstance(st.get("memory.current"), int):
            fam["memory"].add_metric([name], st["memory.current"])
        for event, n in sorted((st.get("memory.events") or {}).items()):
            fam["mem_events"].add_metric([name, event], n)
        for device, io in sorted((st.get("io.stat") or {}).items()):
            for direction, b, ops in (("read", "rbytes", "rios"), ("write", "wbytes", "wios")):
                fam["io_bytes"].add_metric([name, device, direction], io.get(b, 0))
                fam["io_ops"].add_metric([name, device, direction], io.get(ops, 0))
        for resource in ("cpu", "io", "memory"):
            for kind, psi in sorted((st.get(f"{resource}.pressure") or {}).items()):
                if isinstance(psi, dict) and "total" in psi:
                    fam["psi"].add_metric([name, resource, kind], psi["total"] / 1e6)
    yield from fam.values()
