"""The agent's scheduler loop: tasks from submission to their exit status.

One `Agent` owns the store, the executor and the placement state. Every public method and
every loop step runs under one lock, so there is a single writer and these invariants hold
between steps (a restart re-establishes them in `recover()`):

- a task in Starting, Running or Frozen has its placement in `cluster`, and no other does;
- every transition is committed before it is acted on: `start` is an intent in the store
  before the leaf exists; the outcome is committed when known;
- a task leaf exists only for a task in Starting, Running or Frozen (others are removed).

The loop wakes on a submission, a cancel, a policy change, a shim's exit (its pidfd) or a
second's timeout, and then: collects exits, starts what fits, keeps the rest Pending with
their reasons.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import selectors
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..node_model import Node
from ..policy.explanation import Explanation, explain
from ..policy.placement import Demand, decide_demand
from ..policy.policy import choose
from ..policy.state import Allocation, Cluster
from ..policy.task import Task
from .executor import Executor
from .leaf import class_weights, enforcement_reason, plan_leaf
from .lifecycle import TaskState as S
from .store import Store, TaskRecord

log = logging.getLogger("xhagent")

ACTIVE = (S.STARTING, S.RUNNING, S.FROZEN)


class InvalidTask(ValueError):
    """A submission the agent refuses: the message is located (FILE:LINE:COL)."""


class Refused(RuntimeError):
    """The request is valid but cannot be done now (a finished task cancelled, ...)."""


@dataclass
class Running:
    shim_pid: int
    pidfd: int | None  # readable when the shim exits; None: polled each second


class Agent:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        node: Node,
        parse_tasks: Callable[[str, str], list[Task]],
        policies: Callable[[], list],
        clock: Callable[[], int] = time.time_ns,
    ):
        self.store = store
        self.executor = executor
        self.node = node
        self.parse_tasks = parse_tasks  # (source, file name) -> Tasks, InvalidTask if bad
        self.policies = policies  # the SchedulingPolicies in force now
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified after every step
        self.cluster = Cluster.of([node])
        self.tasks: dict[str, Task] = {}  # parsed spec of every non-terminal task
        self.running: dict[str, Running] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False

    # -- requests ---------------------------------------------------------------------------
    def submit(self, source: str, file_name: str, key: str = "") -> list[TaskRecord]:
        tasks = self.parse_tasks(source, file_name)
        with self.lock:
            out = []
            for i, task in enumerate(tasks):
                rec = self.store.submit(
                    name=task.name,
                    source=source,
                    file_name=file_name,
                    spec={"document": i},
                    idempotency_key=f"{key}#{i}" if key else None,
                )
                if rec.state == S.PENDING and rec.id not in self.tasks:
                    self.tasks[rec.id] = task
                out.append(rec)
            self.wake()
            return out

    def get(self, task_id: str) -> TaskRecord | None:
        with self.lock:
            return self.store.get(task_id)

    def cancel(self, task_id: str) -> TaskRecord:
        with self.lock:
            rec = self.store.get(task_id)
            if rec is None:
                raise KeyError(task_id)
            if rec.state in (S.SUCCEEDED, S.FAILED, S.CANCELLED):
                raise Refused(f"task {task_id} already ended ({rec.state.value})")
            if rec.state in ACTIVE:
                intent = self.store.begin_intent(task_id, "kill", {})
                self.executor.kill(task_id)
                status = self._wait_exit(task_id, 2.0)
                rec = self._finish(rec, status, cancelled=True)
                self.store.finish_intent(intent, "done")
            else:
                rec = self.store.transition(task_id, S.CANCELLED, expect=rec.state,
                                            ended_ns=self.clock())
                self.tasks.pop(task_id, None)
            self.changed.notify_all()
            return rec

    def explain(self, task_id: str) -> Explanation:
        with self.lock:
            rec = self.store.get(task_id)
            if rec is None:
                raise KeyError(task_id)
            task = self.tasks.get(task_id) or self._task_of(rec)
            return explain(replace(task, name=task_id), self.policies(), self.cluster)

    # -- restart ----------------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """After a start (or a kill -9 at any point): finish or roll back half-done actions,
        re-adopt the workloads still running, record those that ended meanwhile, and
        remove leaves no task owns. Returns counts for the log."""
        counts = {"adopted": 0, "ended": 0, "rolled_back": 0, "orphans": 0}
        with self.lock:
            for intent in self.store.open_intents():
                rec = self.store.get(intent.task_id)
                if intent.action == "start" and rec is not None and rec.state == S.STARTING:
                    status = self.executor.status(rec.id)
                    if status.started is None and status.exit is None:
                        # The shim never said it started: nothing of the workload runs.
                        self.executor.kill(rec.id)
                        self.executor.remove_leaf(rec.id)
                        self.store.transition(rec.id, S.PENDING, expect=S.STARTING,
                                              reasons=[], placement=None)
                        counts["rolled_back"] += 1
                self.store.finish_intent(intent.id, "recovered")
            for rec in self.store.list_tasks(states=list(ACTIVE), limit=100_000):
                task = self.tasks.setdefault(rec.id, self._task_of(rec))
                status = self.executor.status(rec.id)
                placed = rec.placement or {}
                alloc = Allocation(rec.id, placed.get("node", self.node.name),
                                   tuple(placed.get("cpus", ())) if placed.get("exclusive") else (),
                                   placed.get("memory", 0))
                self.cluster.commit(alloc)
                if status.exit is not None:
                    self._finish(rec, status, cancelled=False)
                    counts["ended"] += 1
                elif status.started and status.alive():
                    if rec.state == S.STARTING:
                        self.store.transition(rec.id, S.RUNNING, expect=S.STARTING,
                                              started_ns=status.started["started_ns"],
                                              pid=status.started["workload_pid"])
                    self._watch(rec.id, status.started["shim_pid"])
                    counts["adopted"] += 1
                else:  # the shim is gone without a record: its workload cannot be supervised
                    self.executor.kill(rec.id)
                    self._finish(rec, status)
                    counts["ended"] += 1
                del task
            live = {r.id for r in self.store.list_tasks(states=list(ACTIVE), limit=100_000)}
            for task_id in self.executor.leaves():
                if task_id not in live:
                    self.executor.remove_leaf(task_id)
                    counts["orphans"] += 1
            for rec in self.store.list_tasks(states=[S.PENDING], limit=100_000):
                self.tasks.setdefault(rec.id, self._task_of(rec))
        return counts

    # -- the loop ---------------------------------------------------------------------------
    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already awake

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def run(self) -> None:
        """Step until `stop()`; exceptions of a step are logged and the loop goes on."""
        while not self._stopping:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
            if self._stopping:
                break
            try:
                self.step()
            except Exception:
                log.exception("scheduler step failed")

    def step(self) -> None:
        with self.lock:
            self._collect_exits()
            self._place_pending()
            self.changed.notify_all()

    # -- exits ------------------------------------------------------------------------------
    def _collect_exits(self) -> None:
        for task_id in list(self.running):
            status = self.executor.status(task_id)
            if status.exit is None:
                continue
            rec = self.store.get(task_id)
            if rec is not None and rec.state in ACTIVE:
                self._finish(rec, status)

    def _wait_exit(self, task_id: str, timeout: float):
        deadline = time.monotonic() + timeout
        status = self.executor.status(task_id)
        while status.exit is None and time.monotonic() < deadline:
            time.sleep(0.01)
            status = self.executor.status(task_id)
        return status

    def _finish(self, rec: TaskRecord, status, cancelled: bool = False) -> TaskRecord:
        """Record how the workload ended, release its placement and leaf, restart it if its
        policy says so."""
        ex = status.exit or {}
        code, sig, error = ex.get("exit_code"), ex.get("signal"), ex.get("message")
        oom = self._oom_kills(rec.id)
        self._release(rec.id)
        self.executor.remove_leaf(rec.id)
        now = self.clock()
        if cancelled:
            state = S.CANCELLED
        elif code == 0:
            state = S.SUCCEEDED
        else:
            state = S.FAILED
        reasons = ["OOMKilled: the task's memory.max was reached"] if oom else []
        rec = self.store.transition(
            rec.id, state, expect=rec.state, exit_code=code, signal=sig,
            error=error or (None if status.exit else "the workload ended without a status"),
            reasons=reasons, ended_ns=now,
        )
        task = self.tasks.get(rec.id)
        if state == S.FAILED and task is not None and self._may_restart(task, rec):
            rec = self.store.transition(rec.id, S.PENDING, expect=S.FAILED,
                                        attempt=rec.attempt + 1)
        elif state != S.PENDING:
            self.tasks.pop(rec.id, None)
        return rec

    def _may_restart(self, task: Task, rec: TaskRecord) -> bool:
        policy = task.restart_policy
        return policy.policy == "OnFailure" and rec.attempt < policy.max_restarts

    def _backoff_over(self, task: Task, rec: TaskRecord, now: int) -> bool:
        if rec.attempt == 0 or rec.ended_ns is None:
            return True
        return now >= rec.ended_ns + task.restart_policy.delay_ns(rec.attempt - 1)

    def _oom_kills(self, task_id: str) -> int:
        leaf = self.executor.leaf(task_id)
        try:
            return int(leaf.get_events_file("memory.events").get("oom_kill", 0))
        except Exception:
            return 0

    # -- placement ----------------------------------------------------------------------------
    def _place_pending(self) -> None:
        now = self.clock()
        pending = self.store.list_tasks(states=[S.PENDING], limit=10_000)
        policies = self.policies()
        order = sorted(pending, key=lambda r: self._order_key(r, policies))
        for rec in order:
            task = self.tasks.get(rec.id)
            if task is None:
                task = self.tasks[rec.id] = self._task_of(rec)
            if not self._backoff_over(task, rec, now):
                continue
            why = enforcement_reason(task.enforce, self.executor.missing)
            if why:
                self._keep_pending(rec, [why])
                continue
            match = choose(policies, task.label_map)
            demand = Demand.of(task, match)
            if task.requests.cpus is None:  # shared: runs on the CPUs nobody holds alone
                demand = replace(demand, cpus=0)
            decision = decide_demand(rec.id, demand, self.cluster)
            if decision.pending:
                self._keep_pending(rec, [str(r) for r in decision.reasons])
                continue
            self._start(rec, task, decision.placed)

    def _order_key(self, rec: TaskRecord, policies) -> tuple:
        task = self.tasks.get(rec.id) or self._task_of(rec)
        priority = task.priority
        if priority is None:
            match = choose(policies, task.label_map)
            priority = match.policy.priority if match.policy else 50
        deadline = task.deadline.at(rec.created_ns) if task.deadline else 1 << 63
        return (-priority, deadline, rec.created_ns)

    def _keep_pending(self, rec: TaskRecord, reasons: list[str]) -> None:
        if list(rec.reasons) != reasons:
            self.store.transition(rec.id, S.PENDING, expect=S.PENDING, reasons=reasons)

    def _start(self, rec: TaskRecord, task: Task, placed) -> None:
        cpus = placed.cpus or self._shared_cpus()
        alloc = Allocation(rec.id, placed.node, placed.cpus, placed.memory, placed.gpus)
        placement = {"node": placed.node, "cpus": list(cpus), "exclusive": bool(placed.cpus),
                     "memory": placed.memory, "gpus": [g.index for g in placed.gpus]}
        plan = plan_leaf(
            cpus=cpus,
            mems=self._mems_of(cpus),
            memory=task.requests.memory,
            weights=class_weights(task.task_class),
            missing=self.executor.missing,
        )
        intent = self.store.begin_intent(rec.id, "start", placement)
        rec = self.store.transition(
            rec.id, S.STARTING, expect=S.PENDING, placement=placement, reasons=[],
            unenforced=[u.to_json() for u in plan.unenforced],
        )
        self.cluster.commit(alloc)
        env = dict(task.env)
        if placed.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._gpu_uuid(g.index) for g in placed.gpus)
        try:
            started = self.executor.start(
                rec.id, plan, list(task.command), env, task.working_dir, *self._ids(task)
            )
        except Exception as exc:  # the workload could not start: its own error, not the agent's
            self._release(rec.id)
            self.store.transition(rec.id, S.FAILED, expect=S.STARTING, error=str(exc),
                                  ended_ns=self.clock())
            self.store.finish_intent(intent, "failed")
            self.tasks.pop(rec.id, None)
            return
        self.store.transition(rec.id, S.RUNNING, expect=S.STARTING, started_ns=self.clock(),
                              pid=started.workload_pid)
        self.store.finish_intent(intent, "done")
        self._watch(rec.id, started.shim_pid)

    def _release(self, task_id: str) -> None:
        try:
            self.cluster.release(task_id)
        except KeyError:
            pass
        running = self.running.pop(task_id, None)
        if running and running.pidfd is not None:
            self._selector.unregister(running.pidfd)
            os.close(running.pidfd)

    def _watch(self, task_id: str, shim_pid: int) -> None:
        try:
            pidfd = os.pidfd_open(shim_pid)
            self._selector.register(pidfd, selectors.EVENT_READ, task_id)
        except OSError:  # gone already, or no pidfd here: the second's poll finds the exit
            pidfd = None
        self.running[task_id] = Running(shim_pid, pidfd)

    def _shared_cpus(self) -> tuple[int, ...]:
        held = {c for _, a in self.cluster.placed() for c in a.cpus}
        return tuple(c for c in self.node.cpus if c not in held) or tuple(self.node.cpus)

    def _mems_of(self, cpus: Iterable[int]) -> list[int]:
        want = set(cpus)
        return [n.id for n in self.node.numa if want & set(n.cpus)]

    def _gpu_uuid(self, index: int) -> str:
        for g in self.node.gpus:
            if g.index == index:
                return g.uuid or str(index)
        return str(index)

    def _ids(self, task: Task) -> tuple[int | None, int | None]:
        return resolve_run_as(task.user) if task.user else (None, None)

    def _task_of(self, rec: TaskRecord) -> Task:
        return self.parse_tasks(rec.source, rec.file_name)[rec.spec["document"]]


def resolve_run_as(run_as) -> tuple[int, int]:
    """(uid, gid) of a Task's `user`, resolved now (at start, as the README says); a name
    this node does not know is the task's error (it fails to start), not the agent's."""
    user, group = run_as.user, run_as.group
    if isinstance(user, int):
        uid, gid = user, user
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"user {user!r}: no such user on this node") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if isinstance(group, int):
        gid = group
    elif group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"group {group!r}: no such group on this node") from None
    return uid, gid
