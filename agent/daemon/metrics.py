"""The daemon's metrics, for the exporter (`xhagent.metrics.exporter`).

Two sources, so that a scrape reads nothing twice and misses nothing between scrapes:
- what happened, from the store's committed events (`Store.on_commit` -> `observe`):
  queue wait, start latency and run time by class, deadline misses, preemptions, migrations,
  placement decisions, output bytes dropped. Counted once each, after the commit, never for
  a rolled-back change;
- what is, read at scrape time (`_Census.collect`): tasks by state and class, Pending
  tasks by reason, and the managed cgroups' statistics (CPU, memory, io, pressure), read in
  one batch (the files read by io_uring and by its fallbacks counted); the run-queue
  latency of their tasks (`xhagent.bpf.runqlat`, where BPF loads: the groups watched are
  kept in step with the managed ones at each scrape); each task's delays
  (`xhagent.metrics.taskstats`: CPU, block I/O, swap-in, reclaim...) summed over the
  processes in its leaf; whether the state disk is full, and what a full disk refused
  (`loop.diskfull`); plus the agent's own process (`process_*`).

By class, every task counts, those past the cap too: CPU time (`class_cpu.py`: ended
attempts from their records, running ones from their leaves), run-queue latency
(`class_runq.py`: every running leaf watched, ended ones as their leaf's last counts) and
memory in use (the running leaves' memory.current).

Labels are bounded: classes come from policies, reasons and states are typed; the `group`
label names the agent's own groups (`subtree`, `shims`) and the leaves of tasks that run
now (`tasks/ID`), at most `task_series` of them (the oldest first;
`xhagent_metrics_tasks_left_out` counts the rest).
"""

from __future__ import annotations

import os
import platform
import threading
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
from .class_runq import ClassRunq
from .exec.spares import SpareRunDirs
from .loop.diskfull import DiskFull
from .loop.faults import Faults
from .store import TERMINAL, Event, Store, StoreError, TaskRecord, TaskState

READ_PATHS = ("io_uring", "pread", "plain")  # StatsSampler.reads()
# Seconds. Queue waits and starts: a few ms to minutes; runs: up to days.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RUN_BUCKETS = (0.01, 0.1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
DEFAULT_CLASS = "default"
SUBTREE = "subtree"  # the `group` of the agent's whole subtree (its root cgroup)
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
        report: Callable[[str, str], None] | None = None,
        spares: SpareRunDirs | None = None,
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
        self.compactions = Counter(
            "xhagent_gpu_compactions",
            "Tasks evicted from a GPU's memory for a request its fragmentation kept out (dwps), "
            "by the class of the request.",
            ["class"],
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
        # the tasks the agent recovered before these metrics existed: their leaves count in
        # their own class, not in the default one
        for rec in store.each_task([s for s in TaskState if s not in TERMINAL]):
            self._class[rec.id] = rec.summary.task_class or DEFAULT_CLASS
        self.cpu = ClassCpu()
        self.census = _Census(
            store, groups, runq, taskstats, self._class, task_series, self.cpu, report
        )
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
        if spares is not None:
            self.registry.register(_Spares(spares))

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
            elif event.kind == "GpuCompacted":  # loop/gpumemory.py's
                self.compactions.labels(self._class.get(event.task_id, DEFAULT_CLASS)).inc()
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


class _Spares:
    """The spare run directories (exec/spares.py): how many are ready, how many were taken."""

    def __init__(self, spares: SpareRunDirs):
        self.spares = spares

    def collect(self):
        yield GaugeMetricFamily(
            "xhagent_spare_run_dirs",
            "Run directories made ahead and ready for a start (of spareRunDirs kept).",
            value=self.spares.ready(),
        )
        yield CounterMetricFamily(
            "xhagent_spare_run_dirs_taken",
            "Starts that took a run directory made ahead instead of making their own.",
            value=self.spares.taken,
        )


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
        report: Callable[[str, str], None] | None,
    ):
        self.store, self.groups, self.classes, self.cpu = store, groups, classes, cpu
        self.task_series = task_series  # task leaves shown at most: series stay bounded
        self.runq, self.taskstats, self.report = runq, taskstats, report
        self.class_runq = ClassRunq()
        # scrapes may overlap (a thread each): watching, reading and ending the leaves is one
        # step, so that no reading from before a leaf's end lands after it
        self._runq_step = threading.Lock()
        self._unwatched_said = False  # the probe's map is full, and an event said so
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
        yield self._class_memory(classes, groups, stats, left_out)
        yield self._file_reads()
        if self.runq is not None:
            yield from self._runq(classes, groups, left_out)
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

    def _class_memory(self, classes, groups, stats, left_out) -> GaugeMetricFamily:
        """memory.current of every running task's leaf (the shown ones as this scrape's
        sampler read them, the others here: one file each), summed by class."""
        current = {
            name: st["memory.current"]
            for (name, _), st in zip(groups, stats, strict=True)
            if isinstance(st.get("memory.current"), int)
        }
        for name, group in left_out:
            try:
                current[name] = int(group.get(registry.MEMORY_CURRENT))
            except (CgroupError, ValueError):
                continue  # the leaf went meanwhile, or has no memory controller
        totals = dict.fromkeys(classes, 0)
        for name, used in current.items():
            task_class = self._running_class(name)
            if task_class is not None:
                totals[task_class] = totals.get(task_class, 0) + used
        fam = GaugeMetricFamily(
            "xhagent_class_memory_bytes",
            "Memory in use by the running tasks of each class: memory.current of every "
            "task's leaf, those past --task-series too.",
            labels=["class"],
        )
        for task_class, used in sorted(totals.items()):
            fam.add_metric([task_class], used)
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

    def _running_class(self, name: str) -> str | None:
        """The class of a task leaf's task; None for a group that is not a task's leaf, or
        whose task has ended (its leaf is about to go)."""
        return self.classes.get(name[len("tasks/") :]) if name.startswith("tasks/") else None

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

    def _runq(self, classes, groups, left_out):
        """Every listed group watched, as far as the probe's map holds: the shown ones have
        their own series, every task leaf counts in its class (class_runq.py)."""
        per_group = HistogramMetricFamily(
            "xhagent_runq_latency_seconds",
            "Time runnable tasks of a managed group waited for a CPU (BPF, sched_switch).",
            labels=["group"],
        )
        by_class = HistogramMetricFamily(
            "xhagent_class_runq_latency_seconds",
            "Time runnable tasks waited for a CPU, by class (BPF, sched_switch): every task's "
            "leaf, those past --task-series too, a running one as of this scrape, an ended "
            "one as of its removal. Not counted: a leaf's waits before the first scrape that "
            "lists it, and the waits of leaves the probe could not watch (its map full: a "
            "NotObserved event says so).",
            labels=["class"],
        )
        # The probe counts a process in its own group, and the subtree's own group holds none
        # (cgroup v2 keeps processes out of a group whose controllers its children use).
        groups = [(name, g) for name, g in groups if name != SUBTREE]
        shown = {name for name, _ in groups}
        with self._runq_step:
            ids = self._watch([*groups, *left_out])
            for cgid, hist in sorted(self.runq.histograms().items()):
                if ids[cgid] in shown:
                    per_group.add_metric([ids[cgid]], _buckets(hist), sum_value=hist.sum)
                task_class = self._running_class(ids[cgid])
                if task_class is not None:
                    self.class_runq.seen(cgid, task_class, hist)
            totals = self.class_runq.totals(classes)
        for task_class, hist in totals.items():
            by_class.add_metric([task_class], _buckets(hist), sum_value=hist.sum)
        yield per_group
        yield by_class

    def _watch(self, groups: list[tuple[str, Cgroup]]) -> dict[int, str]:
        """The probe made to watch `groups`, in their order while its map has room; the
        groups gone since the last scrape unwatched, their final counts read first.
        Returns {cgroup id: name} of the groups still there."""
        ids: dict[int, str] = {}
        for name, group in groups:
            try:
                ids[os.stat(group.path).st_ino] = name
            except FileNotFoundError:
                continue  # a leaf removed since it was listed
        for gone in self.runq.watched() - ids.keys():
            self.class_runq.ended(gone, self.runq.histogram(gone))
            self.runq.unwatch(gone)
        watched = self.runq.watched()
        missing = [cgid for cgid in ids if cgid not in watched]
        for i, cgid in enumerate(missing):
            try:
                self.runq.watch(cgid)
            except OSError as exc:  # the map is full: the groups already watched go on
                self._say_unwatched(len(missing) - i, exc)
                break
        else:
            self._unwatched_said = False
        return ids

    def _say_unwatched(self, count: int, why: OSError) -> None:
        """Once while the probe's map stays full."""
        if self._unwatched_said or self.report is None:
            return
        self._unwatched_said = True
        try:
            self.report(
                "NotObserved",
                f"run-queue latency of {count} groups: {why}; their waits are not counted "
                "until they are watched",
            )
        except StoreError:
            pass  # the state disk is full: the scrape goes on (Daemon.report logs first)


def _buckets(hist) -> list[tuple[str, int]]:
    return [(floatToGoString(le), n) for le, n in hist.buckets]


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
