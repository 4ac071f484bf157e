"""The agent's scheduler loop: tasks from submission to their exit status (restart:
recovery.py; preemption: preempting.py; load-driven moves between devices: migrating.py).

One `Agent` owns the store, the executor and the placement state. Every public method and
every loop step runs under one lock, so there is a single writer, and between steps:

- a task in Starting, Running or Frozen holds its placement in `cluster`; no other does;
- every action is committed before it is taken: a start is an intent in the store and a
  Starting task before its leaf exists, a move between devices an intent `migrate` before
  its stop; the outcome is committed when known;
- a task leaf exists only for a task in Starting, Running or Frozen.

`recover()` re-establishes them after a restart, whatever point a kill -9 interrupted.
The loop wakes on a submission, a cancel, a policy change, a shim's exit (its pidfd) or a
second's timeout; a step collects exits, then starts what fits in priority order (EDF
within a priority) and keeps the rest Pending with a reason per node.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from .. import heap
from ..node_model import Node
from ..policy.explanation import Explanation, explain
from ..policy.placement import Candidate, Demand, Reason, decide_demand
from ..policy.policy import choose
from ..policy.preemption import NO_DEADLINE
from ..policy.state import Cluster
from ..policy.task import Deadline, Task
from ..spec import SpecError
from .executor import Executor, resolve_run_as
from .holdings import allocation_of
from .leaf import (
    CLASS_WEIGHTS,
    DEFAULT_WEIGHT,
    LeafPlan,
    class_weights,
    enforcement_reason,
    plan_leaf,
)
from .lifecycle import BACKOFF, NEEDS_PLACEMENT, TERMINAL
from .lifecycle import TaskState as S
from .preempting import preempt_for, thaw_frozen
from .shim import ShimStatus, process_alive
from .store import Event, Store, TaskRecord

log = logging.getLogger("xhagent")
# The oldest Pending tasks a step looks at; the rest wait for a later step. Only these are
# held parsed, so the agent's memory does not grow with the backlog.
MAX_PENDING_SCAN = 1000
# A start takes milliseconds: a step starting a thousand tasks would leave exits, cancels
# and API calls waiting seconds behind it.
MAX_STARTS_PER_STEP = 16
SAFETY_S = 30.0  # the longest the loop sleeps: a missed wake-up costs at most this
FULL_LOOK_S = 1.0  # under load, how often tasks whose shim has no pidfd are looked at


class InvalidTask(ValueError):
    """A submission the agent refuses: the message is located (FILE:LINE:COL)."""


class Refused(RuntimeError):
    """The request is valid but cannot be done (a task that already ended, ...)."""


@dataclass
class Supervised:
    shim_pid: int
    pidfd: int | None  # readable when the shim exits; None: found by a full look (run)
    process: object | None = None  # our child's Spawned (reaped when it ends); None: adopted


class Agent:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        node: Node,
        parse_tasks: Callable[..., list[Task]],
        policies: Callable[[], list],
        classes: Callable[[], dict] = lambda: dict(CLASS_WEIGHTS),
        clock: Callable[[], int] = time.time_ns,
    ):
        self.store = store
        self.executor = executor
        self.node = node
        # (source, file name, classes or None) -> Tasks; InvalidTask when bad
        self.parse_tasks = parse_tasks
        self.policies = policies  # the SchedulingPolicies in force now
        self.classes = classes  # task class -> (cpu.weight, io.weight), in force now
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified after every change
        self.cluster = Cluster.of([node])
        # Parsed specs: of every task that holds a placement (or waits to restart), and of
        # the Pending tasks the last step looked at; the rest are read again when their
        # turn comes. Deadlines are kept for every task not yet ended: an int each.
        self.tasks: dict[str, Task] = {}
        self._window: dict[str, Task] = {}
        self._deadlines: dict[str, int] = {}  # task id -> its deadline (ns since the epoch)
        self.supervised: dict[str, Supervised] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._late: set[str] = set()  # tasks whose missed deadline was reported
        self._due: int | None = None  # the next time a step has something to do on its own
        self._worked = False  # something happened since the heap was last trimmed
        self._ended: set[str] = set()  # shims that ended before they could be watched
        self._last_full = 0.0  # monotonic time of the last look at every running task
        from .migrating import MigrationController

        self.migration = MigrationController(self)  # acts when a policy has spec.migration

    # -- requests (any thread) ----------------------------------------------------------------
    def submit(self, source: str, file_name: str, key: str = "") -> list[TaskRecord]:
        """Parse and commit; the loop places them. Not under the agent's lock: the store
        serialises its writers, and a submission must not wait for a step that is starting
        tasks (a start takes milliseconds)."""
        tasks = self.parse_tasks(source, file_name, self.classes())
        policies = self.policies()
        out = []
        with self.store.atomic():  # all of a file's tasks, or none
            for i, task in enumerate(tasks):
                out.append(
                    self.store.submit(
                        name=task.name,
                        kind="Task",
                        source=source,
                        source_file=file_name,
                        spec=_summary(i, task, choose(policies, task.label_map)),
                        idempotency_key=f"{key}#{i}" if key else None,
                    )
                )
        for rec, task in zip(out, tasks, strict=True):
            if rec.state not in TERMINAL and task.deadline is not None:
                # one dict operation: atomic in CPython
                self._deadlines.setdefault(rec.id, task.deadline.at(rec.created_ns))
        self.wake()
        return out

    def get(self, task_id: str) -> TaskRecord | None:
        return self.store.get(task_id)

    def list(self, states: Iterable[str], all_: bool, limit: int) -> list[TaskRecord]:
        wanted = [S(s) for s in states] or (None if all_ else [s for s in S if s not in TERMINAL])
        return self.store.list_tasks(wanted, limit=min(limit, 1000))

    def ended(self, task_id: str) -> bool:
        rec = self.get(task_id)
        return rec is None or rec.state in TERMINAL

    def cancel(self, task_id: str) -> TaskRecord:
        with self.lock:
            rec = self.store.get(task_id)
            if rec is None:
                raise KeyError(task_id)
            if rec.state in TERMINAL:
                raise Refused(f"task {task_id} already ended ({rec.state})")
            if rec.state in NEEDS_PLACEMENT:
                intent = self.store.begin_intent(task_id, "kill")
                self.executor.kill(task_id)
                rec = self.finish(rec, self.wait_exit(rec, 3.0), cancelled=True)
                self.store.finish_intent(intent, "killed")
            else:
                rec = self.store.transition(task_id, S.CANCELLED, expect=S.PENDING)
                self._forget(task_id)
            self.changed.notify_all()
            return rec

    def explain(self, task_id: str) -> Explanation:
        with self.lock:
            rec = self.store.get(task_id)
            if rec is None:
                raise KeyError(task_id)
            task = self._parsed(rec)
            return explain(replace(task, name=task_id), self.policies(), self.cluster)

    def last_seq(self) -> int:
        with self.lock:
            return self.store.last_event_seq()

    def wait_events(self, since: int, task_id: str | None, timeout: float) -> list[Event]:
        """Events after `since`, waiting up to `timeout` for the first."""
        with self.lock:
            events = self.store.events(since, task_id=task_id, limit=1000)
            if not events and timeout > 0:
                self.changed.wait(timeout)
                events = self.store.events(since, task_id=task_id, limit=1000)
            return events

    def wait_change(self, timeout: float) -> None:
        with self.lock:
            self.changed.wait(timeout)

    # -- restart ------------------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """See recovery.recover."""
        from .recovery import recover

        return recover(self)

    def records(self, states) -> list[TaskRecord]:
        out, after = [], None
        while True:
            page = self.store.list_tasks(list(states), after=after, limit=1000)
            out += page
            if len(page) < 1000:
                return out
            after = page[-1].id

    # -- the loop -----------------------------------------------------------------------------
    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def run(self) -> None:
        """Step until `stop()`; a step that fails is logged and tried again a second later.

        Idle, the loop sleeps: it wakes for a request, a shim's exit (its pidfd), the next
        time something is due (a backoff, a deadline), and at the latest every SAFETY_S (a
        wake-up costs ~10 ms of CPU on a cold virtual CPU; a poll every second was 2-4%)."""
        timeout, failed = 0.0, True  # the first step looks at everything
        while not self._stopping:
            ready = self._selector.select(timeout=timeout)
            exited = {key.data for key, _ in ready if key.data is not None}
            if any(key.data is None for key, _ in ready):
                _drain(self._wake_r)
            if self._stopping:
                return
            try:
                # a shim's pidfd says which task ended; with no event at all (the safety
                # timeout) every running task is looked at, and at least every FULL_LOOK_S
                # while a supervised task has no pidfd (its end has no event)
                full = failed or not ready or self._unwatched_due()
                self.step(None if full else exited)
                failed = False
                timeout = SAFETY_S
                if self._due is not None:
                    timeout = min(SAFETY_S, max(0.0, (self._due - self.clock()) / 1e9))
                if ready:
                    self._worked = True
                elif self._worked:  # a quiet SAFETY_S after work: give its memory back
                    self._worked = False
                    heap.trim()
            except Exception:
                log.exception("scheduler step failed")
                timeout, failed = 1.0, True  # and then a look at everything again

    def _wake_at(self, ns: int) -> None:
        """Something becomes due at `ns`: the loop steps then, even with nothing else."""
        self._due = ns if self._due is None else min(self._due, ns)

    def _unwatched_due(self) -> bool:
        return time.monotonic() - self._last_full >= FULL_LOOK_S and any(
            sup.pidfd is None for sup in self.supervised.values()
        )

    def step(self, exited: set[str] | None = None) -> None:
        """One round: `exited` names the tasks whose shims ended (None: look at all)."""
        self._due = None
        if exited is None:
            self._last_full = time.monotonic()
            self._ended.clear()
        elif self._ended:
            exited, self._ended = exited | self._ended, set()
        with self.lock:
            self._collect_exits(exited)
            thaw_frozen(self)
            self._place_pending()
            self.migration.round()
            self._note_deadlines()
            self.changed.notify_all()

    # -- exits ----------------------------------------------------------------------------------
    def _collect_exits(self, exited: set[str] | None) -> None:
        # From the records, not from what is supervised: an end that could not be committed
        # (the disk was full) is found again at the next full look.
        if exited is None:
            recs = self.records([S.RUNNING])
        else:
            recs = [r for r in map(self.store.get, exited) if r and r.state == S.RUNNING]
        for rec in recs:
            status = self.executor.status(rec.id, rec.attempt)
            if status.exit is not None:
                self.finish(rec, status)
            elif (exited is not None and rec.id in exited) or (
                exited is None
                and status.started is not None
                and not process_alive(status.started.shim_pid, status.started.shim_start_time)
            ):
                # the shim ended without its record (killed): nothing supervises the
                # workload any more, and its pidfd would stay readable for ever
                self.executor.kill(rec.id)
                self.finish(rec, self.executor.status(rec.id, rec.attempt), lost=True)

    def wait_exit(self, rec: TaskRecord, timeout: float) -> ShimStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.executor.status(rec.id, rec.attempt)
            if status.exit is not None or time.monotonic() > deadline:
                return status
            time.sleep(0.005)

    def finish(
        self, rec: TaskRecord, status: ShimStatus, cancelled: bool = False, lost: bool = False
    ) -> TaskRecord:
        """Record how the workload ended, give back its placement and leaf, and queue it
        again (BackOff) when its restart policy says so."""
        ex = status.exit
        code = ex.exit_code if ex else None
        sig = ex.signal if ex else None
        if ex is None:
            error = (
                "the workload's supervisor (shim) ended without a record"
                if lost
                else "no exit status was recorded"
            )
        else:
            error = ex.message
        oom = self.executor.oom_kills(rec.id)
        self.release(rec.id)
        self.executor.remove_leaf(rec.id)
        fields = {"exit_code": code, "signal": sig, "error": error}
        if oom:
            fields["error"] = "OOMKilled: the task reached its memory.max"
        task = self.tasks.get(rec.id)
        if cancelled:
            state = S.CANCELLED
        elif code == 0 and not oom:
            state = S.SUCCEEDED
        elif task is not None and self._may_restart(task, rec):
            delay = task.restart_policy.delay_ns(_restarts(rec))
            reason = {
                "kind": BACKOFF,
                "node": "",
                "detail": f"restart {_restarts(rec) + 1} of "
                f"{task.restart_policy.max_restarts} in {delay / 1e9:g}s",
            }
            return self.store.transition(
                rec.id,
                S.PENDING,
                expect=rec.state,
                reasons=[reason],
                ended_ns=self.clock(),
                **fields,
            )
        else:
            state = S.FAILED
        self._forget(rec.id)
        return self.store.transition(rec.id, state, expect=rec.state, **fields)

    def _may_restart(self, task: Task, rec: TaskRecord) -> bool:
        policy = task.restart_policy
        return policy.policy == "OnFailure" and _restarts(rec) < policy.max_restarts

    def _backoff_over(self, task: Task, rec: TaskRecord, now: int) -> bool:
        if rec.attempt == 0 or rec.ended_ns is None:
            return True
        ready = rec.ended_ns + task.restart_policy.delay_ns(_restarts(rec))
        if now < ready:
            self._wake_at(ready)
            return False
        return True

    # -- placement --------------------------------------------------------------------------------
    def _place_pending(self) -> None:
        now = self.clock()
        policies = self.policies()
        pending = self.store.list_tasks([S.PENDING], limit=MAX_PENDING_SCAN)
        keyed, window = [], {}
        for rec in pending:
            try:
                task = window[rec.id] = self._parsed(rec)
            except InvalidTask as exc:  # a document this version no longer reads
                self.store.transition(rec.id, S.FAILED, expect=S.PENDING, error=str(exc))
                self._forget(rec.id)
                continue
            keyed.append((self.order_key(rec, task, policies), rec, task))
        self._window = window
        started = 0
        for _, rec, task in sorted(keyed, key=lambda k: k[0]):
            if started == MAX_STARTS_PER_STEP:  # the rest after the exits queued meanwhile
                self._wake_at(now)
                break
            if not self._backoff_over(task, rec, now) or self.migration.busy(rec.id):
                continue  # (busy: between a migration's stop and restart, its hook running)
            why = enforcement_reason(task.enforce, self.executor.missing)
            if why:
                self._keep_pending(
                    rec, [{"kind": "EnforcementUnavailable", "node": self.node.name, "detail": why}]
                )
                continue
            demand = Demand.of(task, choose(policies, task.label_map))
            if task.requests.cpus is None:  # shared: runs on the CPUs nobody holds alone
                demand = replace(demand, cpus=0)
            decision = decide_demand(rec.id, demand, self.cluster)
            placed = decision.placed or preempt_for(self, rec, task, demand, policies)
            if placed is None:
                self._keep_pending(rec, list(decision.reasons))
            else:
                self._start(rec, task, placed)
                started += 1

    def order_key(self, rec: TaskRecord, task: Task, policies) -> tuple:
        priority, deadline = self.standing(rec, task, policies)
        return (-priority, deadline, rec.id)

    def standing(self, rec: TaskRecord, task: Task, policies) -> tuple[int, int]:
        """(priority, deadline in ns since the epoch) of a task: its own priority, else its
        winning policy's, else 50."""
        priority = task.priority
        if priority is None:
            match = choose(policies, task.label_map)
            priority = match.policy.priority if match.policy else 50
        deadline = task.deadline.at(rec.created_ns) if task.deadline else NO_DEADLINE
        return priority, deadline

    def _note_deadlines(self) -> None:
        """A task still waiting or running past its deadline is an event, once per run of
        the agent (a restart may say it again)."""
        now = self.clock()
        for task_id, due in list(self._deadlines.items()):  # submissions add to it meanwhile
            if task_id in self._late:
                continue
            if now <= due:
                self._wake_at(due + 1)
                continue
            rec = self.store.get(task_id)
            if rec is None or rec.state in TERMINAL:
                self._deadlines.pop(task_id, None)
                continue
                self._late.add(task_id)
            late_ms = (now - due) / 1e6
            self.store.add_event(
                "DeadlineMissed",
                f"{rec.state} {late_ms:.0f} ms past its deadline",
                task_id=task_id,
                detail={"deadline_ns": due, "state": rec.state.value},
            )

    def _keep_pending(self, rec: TaskRecord, reasons: list) -> None:
        as_dicts = [r if isinstance(r, dict) else _reason_dict(r) for r in reasons]
        if [dict(r) for r in rec.reasons] != as_dicts:
            self.store.transition(rec.id, S.PENDING, expect=S.PENDING, reasons=as_dicts)

    def leaf_plan(self, task: Task, cpus) -> LeafPlan:
        """The limits of `task`'s leaf on `cpus`: its cpuset, memory and class weights."""
        missing = dict(self.executor.missing)
        try:
            weights = class_weights(task.task_class, self.classes())
        except KeyError as exc:  # its class was removed since it was submitted: said, not hidden
            weights = (DEFAULT_WEIGHT, DEFAULT_WEIGHT)
            for controller in ("cpu", "io"):
                missing.setdefault(controller, f"{exc.args[0]}: the default weight applies")
        return plan_leaf(
            cpus=cpus,
            mems=self._mems_of(cpus),
            memory=task.requests.memory,
            weights=weights,
            missing=missing,
        )

    def _start(self, rec: TaskRecord, task: Task, placed: Candidate) -> None:
        cpus = placed.cpus or self._shared_cpus()
        plan = self.leaf_plan(task, cpus)
        placement = {
            "node": placed.node,
            "cpus": list(cpus),
            "exclusive": bool(placed.cpus),
            "memory": placed.memory,
            "gpus": [self._gpu_uuid(g.index) for g in placed.gpus],
            "gpu_shares": [[g.index, g.memory, g.whole] for g in placed.gpus],
            "tpus": list(placed.tpus),
            "unenforced": [u.to_json() for u in plan.unenforced],
        }
        self.tasks[rec.id] = task
        leaf = self.executor.leaf(rec.id)
        with self.store.atomic():
            intent = self.store.begin_intent(rec.id, "start", {"node": placed.node})
            rec = self.store.transition(
                rec.id, S.STARTING, expect=S.PENDING, placement=placement, cgroup=str(leaf.path)
            )
        self.cluster.commit(allocation_of(rec))
        env = dict(task.env)
        if placed.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(placement["gpus"])
        if placed.tpus:
            # the model numbers TPU chips 0..N-1 in accel-minor (PCI) order, as libtpu does
            env["TPU_VISIBLE_CHIPS"] = ",".join(str(i) for i in sorted(placed.tpus))
        try:
            uid, gid = resolve_run_as(task.user) if task.user else (None, None)
            started = self.executor.start(
                rec.id,
                rec.attempt,
                plan,
                list(task.command or ()),
                env,
                task.working_dir,
                uid,
                gid,
                trace=task.trace,
            )
        except (OSError, ValueError) as exc:  # the workload's own failure, not the agent's
            self.release(rec.id)
            with self.store.atomic():
                self.store.transition(rec.id, S.FAILED, expect=S.STARTING, error=str(exc))
                self.store.finish_intent(intent, "failed")
            self._forget(rec.id)
            return
        with self.store.atomic():
            self.store.transition(
                rec.id, S.RUNNING, expect=S.STARTING, started_ns=started.started_ns
            )
            self.store.finish_intent(intent, "started")
        self.supervise(rec.id, started.shim_pid, started.process)

    def release(self, task_id: str) -> None:
        try:
            self.cluster.release(task_id)
        except KeyError:
            pass
        sup = self.supervised.pop(task_id, None)
        if sup is None:
            return
        if sup.pidfd is not None:
            self._selector.unregister(sup.pidfd)
            os.close(sup.pidfd)
        if sup.process is not None:  # our child: reap it (it exits right after its record)
            try:
                sup.process.wait(timeout=2.0)
            except Exception:
                log.warning(
                    "shim %d of task %s did not exit after its record", sup.shim_pid, task_id
                )

    def supervise(self, task_id: str, shim_pid: int, process) -> None:
        """Watch the shim's pidfd: our child's own (valid even once it is reaped, which
        `start_shim` does for a workload that ended at once), else one opened by pid."""
        pidfd = None
        if process is not None and process.returncode is not None:
            # start_shim reaped it: the workload ended at once, its records are final
            self._ended.add(task_id)
            self._wake_at(self.clock())
        else:
            try:
                if process is not None and process.pidfd is not None:
                    pidfd = os.dup(process.pidfd)
                else:
                    pidfd = os.pidfd_open(shim_pid)
                self._selector.register(pidfd, selectors.EVENT_READ, task_id)
            except ProcessLookupError:  # not our child, and gone already
                self._ended.add(task_id)
                self._wake_at(self.clock())
            except OSError:  # no pidfd (EMFILE...): found by the next full look
                if pidfd is not None:
                    os.close(pidfd)
                    pidfd = None
                self._wake_at(self.clock())
        self.supervised[task_id] = Supervised(shim_pid, pidfd, process)

    def _shared_cpus(self) -> tuple[int, ...]:
        held = {c for _, a in self.cluster.placed() for c in a.cpus}
        cpus = self.node.allocatable_cpus
        return tuple(c for c in cpus if c not in held) or cpus

    def _mems_of(self, cpus: Iterable[int]) -> list[int]:
        want = set(cpus)
        return [n.id for n in self.node.numa if want & set(n.cpus)]

    def _gpu_uuid(self, index: int) -> str:
        for g in self.node.gpus:
            if g.index == index:
                return getattr(g, "uuid", None) or str(index)
        return str(index)

    def _parsed(self, rec: TaskRecord) -> Task:
        """The task's spec: kept while it holds a placement or was in the last step's
        window, else read again from its document."""
        return self.tasks.get(rec.id) or self._window.get(rec.id) or self.task_of(rec)

    def note_deadline(self, rec: TaskRecord) -> None:
        """Keep a task's deadline in mind (after a restart): from its record's summary,
        else (a record an older version wrote) from its document."""
        if "deadline" in rec.spec:
            deadline = rec.spec["deadline"] and Deadline(*rec.spec["deadline"])
        else:
            deadline = self._parsed(rec).deadline
        if deadline:
            self._deadlines.setdefault(rec.id, deadline.at(rec.created_ns))

    def _forget(self, task_id: str) -> None:
        """The task ended: nothing of it stays in memory."""
        self.tasks.pop(task_id, None)
        self._window.pop(task_id, None)
        self._deadlines.pop(task_id, None)
        self._late.discard(task_id)

    def task_of(self, rec: TaskRecord) -> Task:
        return self.parse_tasks(rec.source, rec.source_file, None)[rec.spec["document"]]


def _summary(document: int, task: Task, match) -> dict:
    """What `get` and `ps` show of a task without reading its document again (the policy
    and priority as they were at submission); the document itself (`document`: its index
    in the submitted text) stays the truth."""
    priority = task.priority
    if priority is None:
        priority = match.policy.priority if match.policy else 50
    return {
        "document": document,
        "class": task.task_class,
        "priority": priority,
        "policy": match.policy.name if match.policy else "",
        "device_type": task.device_type,
        "labels": dict(task.labels),
        # [ns, relative]: a restart knows every deadline without parsing every document
        "deadline": [task.deadline.ns, task.deadline.relative] if task.deadline else None,
    }


def _reason_dict(r: Reason) -> dict:
    return {"kind": r.kind, "node": r.node, "detail": str(r)}


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


__all__ = ["Agent", "InvalidTask", "Refused", "SpecError"]


def _restarts(rec: TaskRecord) -> int:
    """Restarts of its restart policy a task has had: its attempts after the first, but
    for those that followed a preemption (killed and requeued: not a failure of its own)
    or a migration (stopped to start on another device)."""
    return max(0, rec.attempt - 1 - rec.preempted - rec.migrated)
