"""The agent's scheduler loop: requests from the API, and the steps that take tasks from
submission to their exit status.

One `Scheduler` owns the loop; each task's way from placement to its end is its
`Lifecycle`'s (lifecycle.py), preemption is preemption.py's, load-driven moves between
devices migration.py's, the restart after a kill -9 recovery.py's. Every request that
changes a task and every step runs under one lock, so there is a single writer; the
invariants between steps are the lifecycle's.

The loop wakes (wakeups.py) on a submission, a cancel, a policy change, a shim's exit (its
pidfd) or the time something falls due (a slice's end under `fair`: fairness.py); a step
collects exits, charges the fair share, thaws what may resume, starts what fits in the
node's order (ranking.py: the simulator's discipline that the policies' `spec.queueing`
names) and keeps the rest Pending with a reason per node (a
resource another task holds is one: resources.py), boosts the holders that earlier
deadlines wait for under edf-pic (boosts.py), runs the migration controller and reports
missed deadlines. A step that raises is an internal error (faults.py): counted,
logged when it starts and when it clears, and tried again a second later; but for a full
state disk, which is the node's condition (diskfull.py), looked at again every second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from ... import heap
from ...node_model import Node
from ...policy.classes import CLASS_WEIGHTS
from ...policy.explanation import Explanation, explain
from ...policy.placement import Demand
from ...policy.policy import choose, queueing_in_force
from ...policy.task import Deadline, Task
from ..exec.executor import Executor
from ..exec.leaf import enforcement_reason
from ..store import (
    NEEDS_PLACEMENT,
    TERMINAL,
    Event,
    Owner,
    Store,
    StoreFull,
    TaskRecord,
    TaskState,
    TaskSummary,
    WaitReason,
)
from .boosts import Boosts
from .commits import Commits
from .decisions import Ask, StepDecisions
from .diskfull import RETRY_S, DiskFull
from .fairness import Fairness
from .faults import Faults
from .gpumemory import GpuMemoryModel
from .lifecycle import Lifecycle, restarts
from .migration import MigrationController
from .nvml import Nvml
from .pending import Entry, PendingWindow
from .preemption import FrozenTurns
from .ranking import Ranking, Standing, standing
from .recovery import recover
from .resources import blocker, holders
from .submission import InvalidTask, read_submission
from .wakeups import Wakeups

# The oldest Pending tasks a step looks at; the rest wait for a later step. Only these are
# held parsed, so the agent's memory does not grow with the backlog.
MAX_PENDING_SCAN = 1000
# A start takes milliseconds: a step starting a thousand tasks would leave exits, cancels
# and API calls waiting seconds behind it.
MAX_STARTS_PER_STEP = 16
# What a task waits for until a step looks at it (a long backlog, or a step that reached
# MAX_STARTS_PER_STEP before its turn): every Pending task says why it waits.
QUEUED = "Queued"
QUEUED_DETAIL = f"not looked at yet: steps take the {MAX_PENDING_SCAN} oldest Pending tasks"
RESOURCE_HELD = "ResourceHeld"  # a resource it names (spec.resources) is another's
MAX_LIST_PAGE = 1000  # tasks in one List reply
FULL_LOOK_S = 1.0  # under load, how often tasks whose shim has no pidfd are looked at
STEP = "scheduler_step"  # where the loop's internal errors are counted


class RequestRefused(RuntimeError):
    """The request is valid but cannot be done (a task that already ended, ...)."""


class Scheduler:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        node: Node,
        parse_tasks: Callable[..., list[Task]],
        policies: Callable[[], list],
        classes: Callable[[], Mapping[str, tuple[int, int]]] = lambda: dict(CLASS_WEIGHTS),
        clock: Callable[[], int] = time.time_ns,
        faults: Faults | None = None,
        disk: DiskFull | None = None,
    ):
        self.store = store
        self.executor = executor
        self.node = node
        self.policies = policies  # the SchedulingPolicies in force now
        self.clock = clock
        self.faults = faults or Faults()
        self.disk = disk or DiskFull(store.state_dir)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified after every change
        self.wakeups = Wakeups(clock)
        self._classes = classes  # task class -> (cpu.weight, io.weight), in force now
        # parse_tasks reads a stored task's document again: (source, file name, None) -> Tasks
        self.lifecycle = Lifecycle(
            store, executor, node, parse_tasks, classes, clock, self.wakeups, self.disk
        )
        self.fairness = Fairness(self.lifecycle, self.wakeups)
        nvml = Nvml()  # one for the node: the controller's loads, the memory model's uses
        self.migration = MigrationController(
            self.lifecycle, policies, self.wakeups, nvml=nvml, fairness=self.fairness
        )
        self.gpu_memory = GpuMemoryModel(self.lifecycle, nvml, executor.task_of_pid)
        self.boosts = Boosts(self.lifecycle)
        self.commits = Commits(store, "submissions")
        # The oldest Pending tasks, parsed and in order, kept between steps; the rest are
        # read when their turn comes.
        self._pending = PendingWindow(
            store,
            self.lifecycle.read_spec,
            self._fail_unreadable,
            offers=MAX_PENDING_SCAN,
            ranking=lambda policies: Ranking(policies, self.fairness.share),
        )
        self._listeners: list[Callable[[], None]] = []
        self._stopping = False
        self._worked = False  # something happened since the heap was last trimmed
        self.step_timed: Callable[[float], None] | None = None  # each step's seconds (metrics)
        # how late a step began after the time it was due, in seconds (metrics)
        self.lag_timed: Callable[[float], None] | None = None
        self._last_full = 0.0  # monotonic time of the last look at every running task

    # -- requests (any thread) ----------------------------------------------------------------
    def submit(
        self,
        source: str,
        file_name: str,
        key: str = "",
        owner_of: Callable[[Task], Owner | None] = lambda task: None,
    ) -> list[TaskRecord]:
        """Parse once and commit, each task with its own document; the loop places them.
        Not under the lock: the store serialises its writers, and a submission must not wait
        for a step that is starting tasks. `owner_of` says whose each task is and whom it
        runs as; what it raises refuses the whole submission before anything is queued.
        Submissions arriving together are committed together (commits.py): each one all of
        its tasks or none, acknowledged once its transaction is committed."""
        submitted = read_submission(source, file_name, self._classes())
        owners = [owner_of(sub.task) for sub in submitted]
        queued = [WaitReason(QUEUED, self.node.name, QUEUED_DETAIL)]

        def commit() -> list[TaskRecord]:
            return [
                self.store.submit(
                    name=sub.task.name,
                    kind="Task",
                    source=sub.document,
                    source_file=file_name,
                    summary=summary_of(0, sub.task),  # its source: its document alone
                    idempotency_key=f"{key}#{i}" if key else None,
                    reasons=queued,
                    owner=owner,
                )
                for i, (sub, owner) in enumerate(zip(submitted, owners, strict=True))
            ]

        try:
            out = self.commits.run(commit, len(source))
        except StoreFull as exc:  # refused to the client; counted, and the loop looks for room
            self.disk.failed("write", str(exc))
            self.wakeups.wake()
            raise
        tasks = [sub.task for sub in submitted]
        for rec, task in zip(out, tasks, strict=True):
            if rec.state not in TERMINAL:
                self.lifecycle.note_deadline(rec, task)
            if rec.state is TaskState.PENDING:  # parsed once: the window takes it
                self._pending.offer(rec.id, task)
        self.wakeups.wake()
        return out

    def get(self, task_id: str) -> TaskRecord | None:
        """A task as the API reads it: CorruptTask when its row cannot be read."""
        return self.store.get(task_id, unreadable=True)

    def list(
        self,
        states: Iterable[str],
        all_: bool,
        limit: int,
        page_token: str = "",
        owner_uid: int | None = None,
    ) -> tuple[list[TaskRecord], str, int]:
        """A page of tasks (of `owner_uid` only, when given), newest first: (tasks, the next
        page's token or "" when none follows, how many there are in all). A token is the
        last id of the page before; a row that cannot be read is its CorruptTask."""
        wanted = [TaskState(s) for s in states] or (
            None if all_ else [s for s in TaskState if s not in TERMINAL]
        )
        recs, more = self.store.task_page(
            wanted,
            after=page_token or None,
            limit=min(limit, MAX_LIST_PAGE),
            newest_first=True,
            unreadable=True,
            owner_uid=owner_uid,
        )
        last = recs[-1].id if recs and isinstance(recs[-1], TaskRecord) else ""
        if recs and not last:
            last = recs[-1].task_id
        return recs, last if more else "", self.store.count_tasks(wanted, owner_uid)

    def standings(self, recs: Iterable[TaskRecord]) -> list[Standing]:
        """Each task's priority and deciding policy as scheduling uses them now."""
        policies = self.policies()
        out, chosen = [], {}
        for rec in recs:
            s = rec.summary
            own, labels, deadline = s.priority, s.labels, s.deadline
            if s.legacy:  # a record an older xhagent wrote: its document says
                try:
                    task = self._parsed(rec)
                except InvalidTask:
                    task = None
                if task is not None:
                    own, labels = task.priority, task.label_map
                    deadline = (task.deadline.ns, task.deadline.relative) if task.deadline else None
            due = Deadline(*deadline).at(rec.created_ns) if deadline else None
            out.append(standing(own, labels, due, policies, chosen))
        return out

    def ended(self, task_id: str) -> bool:
        rec = self.get(task_id)
        return rec is None or rec.state in TERMINAL

    def cancel(self, task_id: str) -> TaskRecord:
        with self.lock:
            rec = self.store.get(task_id, unreadable=True)
            if rec is None:
                raise KeyError(task_id)
            if rec.state in TERMINAL:
                raise RequestRefused(f"task {task_id} already ended ({rec.state})")
            if rec.state in NEEDS_PLACEMENT:
                intent = self.store.begin_intent(task_id, "kill")
                rec = self.lifecycle.finish(rec, self.lifecycle.kill(rec), cancelled=True)
                self.store.finish_intent(intent, "killed")
            else:
                with self._pending.leaving(task_id):
                    rec = self.store.transition(
                        task_id, TaskState.CANCELLED, expect=TaskState.PENDING
                    )
                self.lifecycle.forget(task_id)
                self.wakeups.wake()  # a holder it lent its class to runs with its own again
            self._changed()
            return rec

    def explain(self, task_id: str) -> Explanation:
        with self.lock:
            rec = self.store.get(task_id, unreadable=True)
            if rec is None:
                raise KeyError(task_id)
            task = self._parsed(rec)
            return explain(replace(task, name=task_id), self.policies(), self.lifecycle.cluster)

    def last_seq(self) -> int:
        with self.lock:
            return self.store.last_event_seq()

    def wait_events(
        self, since: int, task_id: str | None, timeout: float, owner_uid: int | None = None
    ) -> list[Event]:
        """Events after `since` (of `owner_uid`'s tasks only, when given), waiting up to
        `timeout` for the first."""
        with self.lock:
            events = self.store.events(since, task_id=task_id, limit=1000, owner_uid=owner_uid)
            if not events and timeout > 0:
                self.changed.wait(timeout)
                events = self.store.events(since, task_id=task_id, limit=1000, owner_uid=owner_uid)
            return events

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` after every change (on the thread that made it): for waiters that
        cannot wait on `changed`, such as the API's streams on their event loop."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.changed.notify_all()
        for listener in self._listeners:
            listener()

    def wait_change(self, timeout: float) -> None:
        with self.lock:
            self.changed.wait(timeout)

    def wake(self) -> None:
        """Something changed outside the loop (a policy): a step looks at it."""
        self.wakeups.wake()

    # -- restart ------------------------------------------------------------------------------
    def recover(self, checkpoint: Callable[[], None] = lambda: None) -> dict[str, int]:
        """See recovery.recover."""
        with self.lock:
            return recover(self.lifecycle, self.migration, checkpoint)

    # -- the loop -----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True
        self.wakeups.wake()

    def run(self) -> None:
        """Step until `stop()`.

        Idle, the loop sleeps: it wakes for a request, a shim's exit (its pidfd), the next
        time something is due (a backoff, a deadline), and at the latest every SAFETY_S (a
        wake-up costs ~10 ms of CPU on a cold virtual CPU; a poll every second was 2-4%)."""
        timeout, failed = 0.0, True  # the first step looks at everything
        while not self._stopping:
            due = self.wakeups.due()
            woken = self.wakeups.wait(timeout)
            if self._stopping:
                return
            # A step due at a time (a backoff's end, a deadline) that begins later: the lag
            # is the loop's own (a step before it that ran long, a busy interpreter).
            if due is not None and self.lag_timed is not None and (now := self.clock()) >= due:
                self.lag_timed((now - due) / 1e9)
            # a shim's pidfd says which task ended; with no event at all (the safety
            # timeout) every running task is looked at, and at least every FULL_LOOK_S
            # while a supervised task has no pidfd (its end has no event)
            full = failed or not woken.anything or self._unwatched_due()
            began = time.monotonic()
            try:
                self.step(None if full else set(woken.exited))
            except StoreFull as exc:  # the node's disk, not the agent's fault
                self.disk.failed("write", str(exc))
                timeout, failed = RETRY_S, True
                continue
            except Exception as exc:  # the agent's own fault: a user's never gets here
                self.faults.failed(STEP, exc)
                timeout, failed = 1.0, True  # and then a look at everything again
                continue
            self.faults.cleared(STEP)
            if self.step_timed is not None:
                self.step_timed(time.monotonic() - began)
            failed = False
            timeout = self.wakeups.timeout()
            if self.disk.check():  # still full: looked at again soon, for when it clears
                timeout = min(timeout, RETRY_S)
            if woken.anything:
                self._worked = True
            elif self._worked:  # a quiet SAFETY_S after work: give its memory back
                self._worked = False
                heap.trim()

    def close(self) -> None:
        """After the loop ended: its file descriptors."""
        self.wakeups.close()

    def _unwatched_due(self) -> bool:
        return time.monotonic() - self._last_full >= FULL_LOOK_S and self.lifecycle.unwatched()

    def step(self, exited: set[str] | None = None) -> None:
        """One round: `exited` names the tasks whose shims ended (None: look at all)."""
        self.wakeups.clear_due()
        ended = self.lifecycle.take_ended()
        if exited is None:
            self._last_full = time.monotonic()
        else:
            exited = exited | ended
        with self.lock:
            self.lifecycle.settle_starts()  # before the exits: a start settled Running is seen
            self.lifecycle.collect_exits(exited)
            policies = self.policies()
            self.fairness.begin(policies)
            self.gpu_memory.begin(queueing_in_force(policies)[0])
            window = self._place_pending(FrozenTurns(self.lifecycle, policies, self.fairness))
            if self.fairness.active:
                still = self.store.list_tasks([TaskState.FROZEN], limit=1000)
                waiting = (e.rec.id for e in window if self._pending.get(e.rec.id) is e)
                self.fairness.end(waiting, (r.id for r in still))
            self.boosts.step(queueing_in_force(policies)[0], ((e.rec, e.task) for e in window))
            self.migration.round()
            self.gpu_memory.sync()  # what started this step takes its place before any end
            self.lifecycle.report_deadlines()
            # run directories made ahead once the starts are over (their maker beside them
            # would slow them down)
            if (spares_due := self.executor.spares.tick()) is not None:
                self.wakeups.at(self.clock() + int(spares_due * 1e9) + 1)
            self._changed()

    # -- placement --------------------------------------------------------------------------------
    def _place_pending(self, frozen: FrozenTurns) -> list[Entry]:
        """Start what fits, in the order of standing, and keep every other task of the
        window Pending with its reasons: each demand decided once while the placement state
        stays as it is (decisions.py), the window kept from the last step (pending.py), the
        reasons that changed written together, in one transaction. What fits is reserved
        as it is decided, so that each later decision sees it, and the step's starts are
        made together (lifecycle.start_reserved). A task found waiting in a placement state
        is passed over while that state lasts (`Entry.settled`): a step with nothing freed
        decides only what is new, however long the backlog. The frozen tasks take their
        turns among them, each before the first task it ranks before."""
        now = self.clock()
        policies = self.policies()
        cluster = self.lifecycle.cluster
        decisions = StepDecisions(
            self.lifecycle,
            policies,
            self._shared_reasons,
            self.boosts.inherited,
            self.fairness,
            self.gpu_memory,
        )
        writes: list[tuple[Entry, tuple[WaitReason, ...]]] = []
        reserved = []
        held = holders((tid, t.resources) for tid, t in self.lifecycle.holding())
        window = self._pending.tasks(policies, MAX_PENDING_SCAN)
        # The entries settled in this state, passed over below one by one, are left out at
        # once where nothing would take a turn among them: no frozen task to thaw in order,
        # no slice over (fair). A start in this step only takes room, so one of them found
        # no place in it either; the next step looks again. A step per submission then
        # costs the new entries, not the whole window.
        look = window
        if not frozen.waiting and not self.fairness.displacing:
            look = [e for e in window if e.settled != cluster.version]
        try:
            for entry in look:
                frozen.thaw_before(entry.key)
                if entry.settled == cluster.version and not self.fairness.may_displace(entry.key):
                    continue  # its answer in this state is the one the store holds
                rec, task = entry.rec, entry.task
                # the rest after the exits queued meanwhile
                if len(reserved) == MAX_STARTS_PER_STEP:
                    self.wakeups.at(now)
                    break
                if not self._backoff_over(task, rec, now) or self.migration.busy(rec.id):
                    continue  # (busy: between a migration's stop and restart, its hook running)
                taken = task.resources and blocker(task.resources, held, rec.id)
                if taken:  # not a matter of room: no placement or preemption frees it
                    resource, holder = taken
                    detail = f"{resource} is held by {holder}"
                    wait = WaitReason(RESOURCE_HELD, self.node.name, detail)
                    writes.append((entry, self._shared_reasons((wait,))))
                    continue
                why = task.enforce and enforcement_reason(task.enforce, self.executor.missing)
                if why:
                    unavailable = WaitReason("EnforcementUnavailable", self.node.name, why)
                    writes.append((entry, self._shared_reasons((unavailable,))))
                    continue
                ask = entry.derived or self._ask(entry, policies)
                version = cluster.version
                placed = decisions.place(ask, rec, task)
                if isinstance(placed, tuple):
                    if placed is not entry.said:  # (the same object: known to be what it has)
                        writes.append((entry, placed))
                    # settled unless stopping victims changed the state under the answer,
                    # or its fit depends on peers that may leave without a change of state
                    if cluster.version == version and not ask.demand.needs_peers:
                        entry.settled = version
                    continue
                reserved.append(self.lifecycle.reserve(rec, task, placed))
                held.update(dict.fromkeys(task.resources, rec.id))  # taken with its start
            frozen.thaw_rest()
        except BaseException:
            self.lifecycle.unreserve(reserved)
            raise
        if reserved:
            with self._pending.leaving(*(r.rec.id for r in reserved)):
                self.lifecycle.start_reserved(reserved)
        self._keep_pending(writes)
        return window

    def _shared_reasons(self, reasons: tuple[WaitReason, ...]) -> tuple[WaitReason, ...]:
        return self._pending.shared(reasons, lambda: reasons)

    def _ask(self, entry: Entry, policies) -> Ask:
        """What the entry's task asks of placement under `policies`, shared with the
        entries that ask the same."""
        task = entry.task
        match = choose(policies, task.label_map)
        demand = Demand.of(task, match)
        if task.requests.cpus is None:  # shared: runs on the CPUs nobody holds alone
            demand = replace(demand, cpus=0)
        rule = match.policy.preemption if match.policy else "lower-priority"
        entry.derived = self._pending.shared((demand, rule), lambda: Ask(demand, rule))
        return entry.derived

    def _backoff_over(self, task: Task, rec: TaskRecord, now: int) -> bool:
        if rec.attempt == 0 or rec.ended_ns is None:
            return True
        ready = rec.ended_ns + task.restart_policy.delay_ns(restarts(rec))
        if now < ready:
            self.wakeups.at(ready)
            return False
        return True

    def _keep_pending(self, writes: list[tuple[Entry, tuple[WaitReason, ...]]]) -> None:
        """The reasons that changed, in one transaction; the window holds what it commits."""
        changed = []
        for entry, reasons in writes:
            if entry.rec.reasons == reasons:
                entry.said = reasons
            else:
                changed.append((entry, reasons))
        if not changed:
            return
        kept = []
        try:
            with self.store.atomic():
                for entry, reasons in changed:
                    rec = self.store.transition(
                        entry.rec.id, TaskState.PENDING, expect=TaskState.PENDING, reasons=reasons
                    )
                    kept.append((entry, rec, reasons))
        except BaseException:
            self._pending.invalidate()  # what it holds may be what was rolled back
            raise
        for entry, rec, reasons in kept:
            self._pending.updated(entry, rec, reasons)

    def _parsed(self, rec: TaskRecord) -> Task:
        """The task's spec: kept while it holds a placement or is in the Pending window,
        else read again from its document."""
        entry = self._pending.get(rec.id)
        return entry.task if entry is not None else self.lifecycle.read_spec(rec)

    def _fail_unreadable(self, rec: TaskRecord, exc: InvalidTask) -> None:
        """A Pending task whose document this version no longer reads."""
        self.store.transition(rec.id, TaskState.FAILED, expect=TaskState.PENDING, error=str(exc))
        self.lifecycle.forget(rec.id)


def summary_of(document: int, task: Task) -> TaskSummary:
    """What the store keeps of a task beside its document."""
    return TaskSummary(
        document=document,
        task_class=task.task_class,
        priority=task.priority,
        device_type=task.device_type,
        labels=dict(task.labels),
        # [ns, relative]: a restart knows every deadline without parsing every document
        deadline=(task.deadline.ns, task.deadline.relative) if task.deadline else None,
    )


__all__ = ["RequestRefused", "Scheduler", "summary_of"]
