"""One task's way through the node, from its placement to its end: the one object that
starts, supervises, finishes, evicts and releases tasks, and keeps their deadlines.

`Lifecycle` owns what placed tasks hold: the placement state (`cluster`), the parsed spec of
every task that holds a placement, the shims it supervises (each one's pidfd on the loop's
`Wakeups`) and the deadline bookkeeping. Preemption, migration and recovery change a task
only through its public methods. Its invariants, between two of its calls:

- a task in Starting, Running or Frozen holds its placement in `cluster`; no other does;
- a start is an intent in the store and a Starting record before its leaf exists; its
  outcome (Running, or Failed) is committed once the shim answered (one that a full disk
  refused, by a later step);
- a task leaf exists only for a task in Starting, Running or Frozen;
- a missed deadline is reported once per task per run of the agent.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ...node_model import Node
from ...policy.classes import DEFAULT_WEIGHT, class_weights
from ...policy.placement import Candidate
from ...policy.state import Allocation, Cluster, GpuShare
from ...policy.task import Deadline, Task
from ..exec.executor import Executor, Launch, resolve_run_as
from ..exec.leaf import LeafPlan, plan_leaf
from ..exec.shim import ShimExit, ShimStatus, dropped_message
from ..store import (
    BACKOFF,
    TERMINAL,
    Conflict,
    HeldGpu,
    NotFound,
    Placement,
    Store,
    TaskRecord,
    TaskState,
    WaitReason,
)
from .diskfull import DiskFull

log = logging.getLogger("xhagent")


def allocation_of(rec: TaskRecord) -> Allocation:
    """What the task holds, as its record says: a frozen one keeps its memory, GPUs and TPU
    chips, not its CPUs."""
    placed = rec.placement
    if placed is None:
        return Allocation(rec.id, "", (), 0, ())
    exclusive = placed.exclusive and rec.state != TaskState.FROZEN
    shares = tuple(GpuShare(g.index, g.memory, g.whole) for g in placed.gpus)
    return Allocation(
        rec.id,
        placed.node,
        placed.cpus if exclusive else (),
        placed.memory,
        shares,
        tpus=placed.tpus,
    )


def candidate_of(placement: Placement) -> Candidate:
    """The candidate that would place a task again exactly where `placement` held it."""
    shares = tuple(GpuShare(g.index, g.memory, g.whole) for g in placement.gpus)
    cpus = placement.cpus if placement.exclusive else ()
    return Candidate(placement.node, cpus, placement.memory, shares, 0.0, (), placement.tpus)


def restarts(rec: TaskRecord) -> int:
    """Restarts of its restart policy a task has had: its attempts after the first, but
    for those that followed a preemption (killed and requeued: not a failure of its own)
    or a migration (stopped to start on another device)."""
    return max(0, rec.attempt - 1 - rec.preempted - rec.migrated)


class Deadlines:
    """When each task not yet ended is due (ns since the epoch), and which were reported."""

    def __init__(self):
        self._due: dict[str, int] = {}
        self._reported: set[str] = set()

    def note(self, task_id: str, due: int) -> None:
        self._due.setdefault(task_id, due)  # one dict operation: safe from any thread

    def forget(self, task_id: str) -> None:
        self._due.pop(task_id, None)
        self._reported.discard(task_id)

    def overdue(self, now: int) -> tuple[list[tuple[str, int]], int | None]:
        """The tasks past their deadline not yet reported, each marked reported now, and
        the next time one falls due (None: none will)."""
        late, upcoming = [], None
        for task_id, due in list(self._due.items()):  # submissions add to it meanwhile
            if task_id in self._reported:
                continue
            if now <= due:
                upcoming = due if upcoming is None else min(upcoming, due)
                continue
            self._reported.add(task_id)
            late.append((task_id, due))
        return late, upcoming

    def __len__(self) -> int:
        return len(self._due)

    def due(self, task_id: str) -> int | None:
        return self._due.get(task_id)


class NotHeld(Exception):
    """After a restart, a task whose record cannot hold its placement again (its document
    no longer reads, or its placement is not on this node as it is now): why, in a line."""


@dataclass(frozen=True)
class Outcome:
    """How a start ended, to be committed: its intent, Running or Failed, and the fields."""

    intent: int
    state: TaskState
    fields: dict

    @property
    def word(self) -> str:  # the intent's outcome
        words = {TaskState.RUNNING: "started", TaskState.PENDING: "rolled back"}
        return words.get(self.state, "failed")


@dataclass(frozen=True)
class _End:
    """An attempt's end, its kernel side done, to be committed."""

    rec: TaskRecord
    ex: ShimExit | None
    state: TaskState
    fields: dict


@dataclass
class Reserved:
    """A start: what it was given, and how far it got (its intent, once committed)."""

    rec: TaskRecord
    task: Task
    placement: Placement
    plan: LeafPlan
    intent: int = 0
    launch: Launch | None = None  # its shim spawned, its `started` record not awaited yet


@dataclass
class Supervised:
    shim_pid: int
    pidfd: int | None  # readable when the shim exits; None: found by a full look
    process: object | None = None  # our child's Spawned (reaped when it ends); None: adopted


class Lifecycle:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        node: Node,
        parse_tasks: Callable[..., list[Task]],
        classes: Callable[[], Mapping[str, tuple[int, int]]],
        clock: Callable[[], int],
        wakeups,
        disk: DiskFull | None = None,
    ):
        self.store = store
        self.executor = executor
        self.node = node
        self.clock = clock
        self.cluster = Cluster.of([node])  # what every placed task holds
        self.deadlines = Deadlines()
        self._parse_tasks = parse_tasks  # (source, file name, classes or None) -> Tasks
        self._classes = classes
        self._wakeups = wakeups
        self.disk = disk or DiskFull(store.state_dir)  # starts refused for lack of space
        self._specs: dict[str, Task] = {}  # of every task that holds a placement
        self._supervised: dict[str, Supervised] = {}
        self._ended: set[str] = set()  # shims that ended before they could be watched
        self._unsettled: dict[str, Outcome] = {}  # starts whose outcome is not committed yet

    # -- what is known of tasks ------------------------------------------------------------------
    def spec(self, task_id: str) -> Task | None:
        """The parsed spec of a task that holds a placement (or is being moved)."""
        return self._specs.get(task_id)

    def read_spec(self, rec: TaskRecord) -> Task:
        """The task's spec: the one kept, else parsed again from its document."""
        task = self._specs.get(rec.id)
        if task is None:
            task = self._parse_tasks(rec.source, rec.source_file, None)[rec.summary.document]
        return task

    def keep_spec(self, task_id: str, task: Task) -> None:
        self._specs[task_id] = task

    def hold(self, rec: TaskRecord) -> None:
        """After a restart: `rec` holds its placement again, and its spec is kept; NotHeld
        when it cannot, and then it holds nothing."""
        try:
            task = self.read_spec(rec)
        except (ValueError, IndexError) as exc:  # InvalidTask (located), or no such document
            raise NotHeld(f"its document no longer reads: {exc}") from None
        allocation = allocation_of(rec)
        if allocation.node not in self.cluster.nodes:
            raise NotHeld(
                f"its placement is on node {allocation.node!r}, and this node is "
                f"{', '.join(repr(n) for n in self.cluster.nodes)}"
            )
        try:
            self.cluster.commit(allocation)
        except (KeyError, ValueError) as exc:
            raise NotHeld(f"its placement does not fit this node now: {exc}") from None
        self._specs.setdefault(rec.id, task)

    def note_deadline(self, rec: TaskRecord, task: Task | None = None) -> None:
        """Keep a task's deadline in mind: from `task`, else its record's summary, else (a
        record an older version wrote) its document."""
        if task is not None:
            deadline = task.deadline
        elif not rec.summary.legacy:
            deadline = rec.summary.deadline and Deadline(*rec.summary.deadline)
        else:
            deadline = self.read_spec(rec).deadline
        if deadline:
            self.deadlines.note(rec.id, deadline.at(rec.created_ns))

    def report_deadlines(self) -> None:
        """A task still waiting or running past its deadline is an event, once per run of
        the agent (a restart may say it again); the loop wakes for the next one due."""
        now = self.clock()
        late, upcoming = self.deadlines.overdue(now)
        if upcoming is not None:
            self._wakeups.at(upcoming + 1)
        for task_id, due in late:
            rec = self.store.get(task_id)
            if rec is None or rec.state in TERMINAL:
                self.deadlines.forget(task_id)
                continue
            self.store.add_event(
                "DeadlineMissed",
                f"{rec.state} {(now - due) / 1e6:.0f} ms past its deadline",
                task_id=task_id,
                detail={"deadline_ns": due, "state": rec.state.value},
            )

    def forget(self, task_id: str) -> None:
        """The task ended: nothing of it stays in memory."""
        self._specs.pop(task_id, None)
        self.deadlines.forget(task_id)

    def holding(self) -> list[tuple[str, Task]]:
        """(id, spec) of the tasks that hold a placement and name resources: they hold them."""
        out = []
        for _, a in self.cluster.placed():
            task = self._specs.get(a.task)
            if task is not None and task.resources:
                out.append((a.task, task))
        return out

    def weights_of(self, task: Task) -> tuple[int, int]:
        """(cpu.weight, io.weight) of the task's class now (the default for a class removed)."""
        try:
            return class_weights(task.task_class, self._classes())
        except KeyError:
            return DEFAULT_WEIGHT, DEFAULT_WEIGHT

    # -- starting ---------------------------------------------------------------------------------
    def leaf_plan(self, task: Task, cpus: Iterable[int]) -> LeafPlan:
        """The limits of `task`'s leaf on `cpus`: its cpuset, memory and class weights."""
        missing = dict(self.executor.missing)
        try:
            weights = class_weights(task.task_class, self._classes())
        except KeyError as exc:  # its class was removed since it was submitted: said, not hidden
            weights = (DEFAULT_WEIGHT, DEFAULT_WEIGHT)
            for controller in ("cpu", "io"):
                missing.setdefault(controller, f"{exc.args[0]}: the default weight applies")
        cpus = tuple(cpus)
        return plan_leaf(
            cpus=cpus,
            mems=self._mems_of(cpus),
            memory=task.requests.memory,
            weights=weights,
            missing=missing,
        )

    def shared_cpus(self) -> tuple[int, ...]:
        """The CPUs no task holds alone (all of them when every one is held)."""
        held = {c for _, a in self.cluster.placed() for c in a.cpus}
        cpus = self.node.allocatable_cpus
        return tuple(c for c in cpus if c not in held) or cpus

    def start(self, rec: TaskRecord, task: Task, placed: Candidate) -> TaskRecord:
        """Pending -> Starting -> Running on `placed`; Failed (its placement given back) when
        the workload cannot start. The record as its start left it: `start_many` of one."""
        return self.start_many([(rec, task, placed)])[0]

    def start_many(self, items: Sequence[tuple[TaskRecord, Task, Candidate]]) -> list[TaskRecord]:
        """`reserve` each (record, spec, placement) in order, then `start_reserved` them."""
        reserved: list[Reserved] = []
        try:
            for rec, task, placed in items:
                reserved.append(self.reserve(rec, task, placed))
        except BaseException:
            self.unreserve(reserved)
            raise
        return self.start_reserved(reserved)

    def reserve(self, rec: TaskRecord, task: Task, placed: Candidate) -> Reserved:
        """Hold `placed` for a Pending task about to start: the placement state counts it
        (a shared task runs on the CPUs that those reserved before it left), the store does
        not know of it yet. Every reservation is then started or given back (`unreserve`)."""
        cpus = placed.cpus or self.shared_cpus()
        plan = self.leaf_plan(task, cpus)
        gpus = tuple(
            HeldGpu(g.index, g.memory, g.whole, self._gpu_uuid(g.index)) for g in placed.gpus
        )
        placement = Placement(
            node=placed.node,
            cpus=tuple(cpus),
            exclusive=bool(placed.cpus),
            memory=placed.memory,
            gpus=gpus,
            tpus=tuple(placed.tpus),
            unenforced=plan.unenforced,
        )
        held = replace(rec, state=TaskState.STARTING, placement=placement)
        self.cluster.commit(allocation_of(held))
        return Reserved(rec, task, placement, plan)

    def unreserve(self, reserved: Iterable[Reserved]) -> None:
        for b in reserved:
            self.cluster.release(b.rec.id)

    def start_reserved(self, reserved: Sequence[Reserved]) -> list[TaskRecord]:
        """Start what `reserve` held, in three phases: every intent and Starting record
        committed in one transaction, before any of their processes exists; then every leaf
        made and shim spawned, and only then their `started` records awaited, so that the
        shims start side by side; then every outcome in one transaction. The ends the
        shims' pidfds show are committed with the intents and with the outcomes: a step
        starting many tasks records each end when it sees one, not once all its starts are
        done, and a start costs two commits. The records as their starts left them
        (Running, Failed), in order: an end committed with them is not in them."""
        try:
            with self.store.atomic():
                self.collect_noticed()
                self._begin_starts(reserved)
        except BaseException:
            self.unreserve(reserved)
            raise
        begun = reserved
        try:
            for b in begun:
                self._launch(b)
        except BaseException as exc:  # the agent's own fault: what it did not reach is undone
            for b in begun:
                if b.launch is None and b.rec.id not in self._unsettled:
                    self.release(b.rec.id)
                    note = f"start rolled back: {exc!r}"
                    self._unsettled[b.rec.id] = Outcome(b.intent, TaskState.PENDING, {"note": note})
            raise
        finally:  # a spawned shim is awaited and supervised whatever failed after it
            for b in begun:
                self._await(b)
        with self.store.atomic():
            settled = self._settle_many([b.rec.id for b in begun])
            out = [settled.get(b.rec.id) or self.store.get(b.rec.id) or b.rec for b in begun]
            self.collect_noticed(settling=settled.keys())
        return out

    def _begin_starts(self, begun: Sequence[Reserved]) -> None:
        """Each reservation's intent and Starting record committed: all of them or none."""
        with self.store.atomic():
            for b in begun:
                where = {"node": b.placement.node}
                b.intent = self.store.begin_intent(b.rec.id, "start", where)
                b.rec = self.store.transition(
                    b.rec.id,
                    TaskState.STARTING,
                    expect=TaskState.PENDING,
                    placement=b.placement,
                    cgroup=str(self.executor.leaf(b.rec.id).path),
                )
            self.store.after_commit(lambda: self._specs.update((b.rec.id, b.task) for b in begun))

    def _launch(self, b: Reserved) -> None:
        """Its leaf made and its shim spawned; a failure of the workload's own is its outcome."""
        task, rec = b.task, b.rec
        env = dict(task.env) | visible_devices(b.placement)
        try:
            uid, gid = run_as(rec, task)
            b.launch = self.executor.launch(
                rec.id,
                rec.attempt,
                b.plan,
                list(task.command or ()),
                env,
                task.working_dir,
                uid,
                gid,
                trace=task.trace,
                trace_stacks=task.trace_stacks,
            )
        except (OSError, ValueError) as exc:  # the workload's own failure, not the agent's
            self._start_failed(b, exc)

    def _await(self, b: Reserved) -> None:
        """Its shim's `started` record awaited, and its outcome kept to be committed."""
        if b.launch is None:
            return
        launch, b.launch = b.launch, None
        try:
            started = launch.wait()
        except (OSError, ValueError) as exc:
            self._start_failed(b, exc)
            return
        # watched before its Running is committed, which a full disk may refuse: then a
        # later step commits it (and looks at every Running task: a retried step looks at all)
        self.supervise(b.rec.id, started.shim_pid, started.process)
        self._unsettled[b.rec.id] = Outcome(
            b.intent, TaskState.RUNNING, {"started_ns": started.started_ns}
        )

    def _start_failed(self, b: Reserved, exc: Exception) -> None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            self.disk.failed("start", f"{b.rec.id}: {exc}")
        self.release(b.rec.id)
        self._unsettled[b.rec.id] = Outcome(b.intent, TaskState.FAILED, {"error": str(exc)})

    def settle_starts(self) -> None:
        """Commit the outcomes of starts that could not be committed (a full disk): until
        then the task stays Starting, which no step would look at again."""
        if self._unsettled:
            self._settle_many(list(self._unsettled))

    def _settle_many(self, task_ids: list[str]) -> dict[str, TaskRecord]:
        """The outcomes of `task_ids`' starts committed in one transaction; one cancelled
        meanwhile (its end recorded) is dropped. The records, by id."""
        todo = [(t, self._unsettled[t]) for t in task_ids if t in self._unsettled]
        out: dict[str, TaskRecord] = {}
        gone = []

        def settled() -> None:  # kept until the outcomes are committed, by a later step if need be
            for task_id, o in todo:
                del self._unsettled[task_id]
                if o.state is TaskState.FAILED and task_id not in gone:
                    self.forget(task_id)
                elif o.state is TaskState.PENDING:  # waits again: no spec kept, its deadline is
                    self._specs.pop(task_id, None)

        with self.store.atomic():
            for task_id, o in todo:
                try:
                    out[task_id] = self.store.transition(
                        task_id, o.state, expect=TaskState.STARTING, **o.fields
                    )
                except (Conflict, NotFound):  # cancelled meanwhile: its end is recorded
                    gone.append(task_id)
                    continue
                self.store.finish_intent(o.intent, o.word)
            self.store.after_commit(settled)
        return out

    # -- supervision ------------------------------------------------------------------------------
    def supervise(self, task_id: str, shim_pid: int, process) -> None:
        """Watch the shim's pidfd: our child's own (valid even once it is reaped, which
        `start_shim` does for a workload that ended at once), else one opened by pid."""
        pidfd = None
        if process is not None and process.returncode is not None:
            # start_shim reaped it: the workload ended at once, its records are final
            self._ended_now(task_id)
        else:
            try:
                if process is not None and process.pidfd is not None:
                    pidfd = os.dup(process.pidfd)
                else:
                    pidfd = os.pidfd_open(shim_pid)
                self._wakeups.watch(pidfd, task_id)
            except ProcessLookupError:  # not our child, and gone already
                self._ended_now(task_id)
            except OSError:  # no pidfd (EMFILE...): found by the next full look
                if pidfd is not None:
                    os.close(pidfd)
                    pidfd = None
                self._wakeups.at(self.clock())
        self._supervised[task_id] = Supervised(shim_pid, pidfd, process)

    def _ended_now(self, task_id: str) -> None:
        self._ended.add(task_id)
        self._wakeups.at(self.clock())

    def collect_noticed(self, settling: Collection[str] = ()) -> None:
        """Record the ends of the tasks whose shims' pidfds are readable now, and of those
        whose shims ended before they could be watched, without waiting and without a full
        look; an end whose start is not settled yet (a full disk) is left to the step that
        settles it (`settling`: starts whose outcome the transaction open now holds). Called
        within a step: the loop is woken for another, which places what the ends freed and
        sees a task they queued again (BackOff), as a step does after the exits it collects
        first."""
        unsettled = self._unsettled.keys() - set(settling)
        ended = self.take_ended()
        self._ended = {t for t in ended if t in unsettled}
        exited = (ended | self._wakeups.exited_now()) - unsettled
        if exited:
            self.collect_exits(exited)
            self._wakeups.wake()

    def take_ended(self) -> set[str]:
        """The tasks whose shims ended before they could be watched, since the last call."""
        ended, self._ended = self._ended, set()
        return ended

    def shim_pid(self, task_id: str) -> int | None:
        """The pid of the shim supervising `task_id`'s workload; None when none is."""
        sup = self._supervised.get(task_id)
        return sup.shim_pid if sup else None

    def unwatched(self) -> bool:
        """Whether a supervised shim has no pidfd (its end raises no event)."""
        return any(sup.pidfd is None for sup in self._supervised.values())

    def release(self, task_id: str) -> None:
        """Give back what the task holds and stop supervising its shim (reaped when ours)."""
        try:
            self.cluster.release(task_id)
        except KeyError:
            pass
        sup = self._supervised.pop(task_id, None)
        if sup is None:
            return
        if sup.pidfd is not None:
            self._wakeups.unwatch(sup.pidfd)
            os.close(sup.pidfd)
        if sup.process is not None:  # our child: reap it (it exits right after its record)
            try:
                sup.process.wait(timeout=2.0)
            except Exception:
                log.warning(
                    "shim %d of task %s did not exit after its record", sup.shim_pid, task_id
                )

    # -- ending -----------------------------------------------------------------------------------
    def collect_exits(self, exited: set[str] | None) -> None:
        """Record the ends of Running tasks: of `exited` (their shims' pidfds said so), or,
        with None, of every Running task (a full look). From the records, not from what is
        supervised: an end that could not be committed (a full disk) is found again."""
        if exited is None:
            recs = list(self.store.each_task([TaskState.RUNNING]))
        else:
            got = (self.store.get(t) for t in exited)
            recs = [r for r in got if r and r.state == TaskState.RUNNING]
        ends: list[_End] = []
        try:
            for rec in recs:
                status = self.executor.status(rec.id, rec.attempt)
                if status.exit is not None:
                    ends.append(self._end(rec, status))
                elif (exited is not None and rec.id in exited) or (
                    exited is None
                    and status.started is not None
                    and not self.executor.shim_alive(status.started)
                ):
                    # the shim ended without its record (killed): nothing supervises the
                    # workload any more, and its pidfd would stay readable for ever
                    self.executor.kill(rec.id)
                    status = self.executor.status(rec.id, rec.attempt)
                    ends.append(self._end(rec, status, lost=True))
        finally:  # the ends made so far are committed whatever failed after them
            if ends:
                self._commit_ends(ends)

    def wait_exit(self, rec: TaskRecord, timeout: float) -> ShimStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.executor.status(rec.id, rec.attempt)
            if status.exit is not None or time.monotonic() > deadline:
                return status
            time.sleep(0.005)

    def kill(self, rec: TaskRecord, timeout: float = 3.0) -> ShimStatus:
        """SIGKILL the task's processes and wait (at most `timeout`) for its shim's record."""
        self.executor.kill(rec.id)
        return self.wait_exit(rec, timeout)

    def finish(
        self, rec: TaskRecord, status: ShimStatus, cancelled: bool = False, lost: bool = False
    ) -> TaskRecord:
        """Record how the workload ended, give back its placement and leaf, and queue it
        again (BackOff) when its restart policy says so."""
        return self._commit_ends([self._end(rec, status, cancelled, lost)])[0]

    def _end(
        self, rec: TaskRecord, status: ShimStatus, cancelled: bool = False, lost: bool = False
    ) -> _End:
        """`finish` but for its commit: the placement and leaf given back, and what is to
        be committed of the end."""
        ex = status.exit
        if ex is None:
            error = (
                "the workload's supervisor (shim) ended without a record"
                if lost
                else "no exit status was recorded"
            )
        else:
            error = ex.message
        code = ex.exit_code if ex else None
        oom = self.executor.oom_kills(rec.id)
        self.release(rec.id)
        cpu_usec = self.executor.remove_leaf(rec.id)
        fields = {"exit_code": code, "signal": ex.signal if ex else None, "error": error}
        fields |= {"output_dropped": dropped(ex), "cpu_usec": cpu_usec}
        if oom:
            fields["error"] = "OOMKilled: the task reached its memory.max"
        task = self._specs.get(rec.id)
        if cancelled:
            state = TaskState.CANCELLED
        elif code == 0 and not oom:
            state = TaskState.SUCCEEDED
        elif task is not None and may_restart(task, rec):
            delay = task.restart_policy.delay_ns(restarts(rec))
            reason = WaitReason(
                BACKOFF,
                "",
                f"restart {restarts(rec) + 1} of {task.restart_policy.max_restarts} "
                f"in {delay / 1e9:g}s",
            )
            fields |= {"reasons": [reason], "ended_ns": self.clock()}
            return _End(rec, ex, TaskState.PENDING, fields)
        else:
            state = TaskState.FAILED
        self.forget(rec.id)
        return _End(rec, ex, state, fields)

    def _commit_ends(self, ends: list[_End]) -> list[TaskRecord]:
        """The attempts' ends committed in one transaction, each with an OutputDropped
        event beside it when its shim dropped some of its output (first: it is still the
        running task's)."""
        with self.store.atomic():
            return [self._record_end(end) for end in ends]

    def _record_end(self, end: _End) -> TaskRecord:
        ex, rec = end.ex, end.rec
        if ex is not None and dropped(ex):
            self.store.add_event(
                "OutputDropped",
                dropped_message(ex, self.executor.log_cap),
                task_id=rec.id,
                detail={
                    "bytes": dropped(ex),
                    "stdout": ex.stdout_dropped,
                    "stderr": ex.stderr_dropped,
                    "cap": self.executor.log_cap,
                    "errno": ex.output_errno,
                },
            )
        return self.store.transition(rec.id, end.state, expect=rec.state, **end.fields)

    def evict(
        self,
        rec: TaskRecord,
        status: ShimStatus,
        reason: WaitReason,
        note: str,
        *,
        preempted: bool = False,
        migrated: bool = False,
        intent: tuple[int, str] | None = None,
    ) -> TaskRecord:
        """A stopped task back to Pending (not an end of its own: a preemption or a move),
        its placement and leaf given back, the attempt's outcome kept; `intent` (id,
        outcome) is finished in the same transaction."""
        self.release(rec.id)
        cpu_usec = self.executor.remove_leaf(rec.id)
        ex = status.exit
        with self.store.atomic():
            pending = self.store.transition(
                rec.id,
                TaskState.PENDING,
                expect=rec.state,
                reasons=[reason],
                note=note,
                preempted=rec.preempted + int(preempted),
                migrated=rec.migrated + int(migrated),
                exit_code=ex.exit_code if ex else None,
                signal=ex.signal if ex else None,
                output_dropped=dropped(ex),
                cpu_usec=cpu_usec,
            )
            if intent is not None:
                self.store.finish_intent(*intent)
        return pending

    # -- helpers ----------------------------------------------------------------------------------
    def pin(self, task_id: str, cpus: Iterable[int]) -> None:
        """The task's leaf on `cpus` (and their NUMA nodes' memory), as its placement says."""
        cpus = list(cpus)
        self.executor.set_cpus(task_id, cpus, self._mems_of(cpus))

    def _mems_of(self, cpus: Iterable[int]) -> list[int]:
        want = set(cpus)
        return [n.id for n in self.node.numa if want & set(n.cpus)]

    def _gpu_uuid(self, index: int) -> str:
        for g in self.node.gpus:
            if g.index == index:
                return getattr(g, "uuid", None) or str(index)
        return str(index)


def dropped(ex: ShimExit | None) -> int:
    """Bytes of the attempt's output its shim dropped, stdout and stderr together."""
    return ex.stdout_dropped + ex.stderr_dropped if ex is not None else 0


def may_restart(task: Task, rec: TaskRecord) -> bool:
    policy = task.restart_policy
    return policy.policy == "OnFailure" and restarts(rec) < policy.max_restarts


def run_as(rec: TaskRecord, task: Task) -> tuple[int | None, int | None]:
    """(uid, gid) a task's processes run as: decided at submission for a submitter who is
    no admin (itself), else its document's `user` resolved now, else the agent's own."""
    if rec.owner is not None and rec.owner.run_uid is not None:
        return rec.owner.run_uid, rec.owner.run_gid
    return resolve_run_as(task.user) if task.user else (None, None)


def visible_devices(placement: Placement) -> dict[str, str]:
    """The environment that hands a task its GPUs and TPU chips."""
    env = {}
    if placement.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(placement.gpu_uuids)
    if placement.tpus:
        # the model numbers TPU chips 0..N-1 in accel-minor (PCI) order, as libtpu does
        env["TPU_VISIBLE_CHIPS"] = ",".join(str(i) for i in sorted(placement.tpus))
    return env
