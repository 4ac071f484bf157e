"""The scheduler loop without root or a kernel: a real store on a plain directory, a fake
executor that stands in for leaves and shims (a workload "exits" when the test says so,
its shim's pidfd becoming readable as a real one would), and a clock the test moves.

What the loop must do is asserted through its public interface and the store's records
and events: a missed deadline reported once per task per run, a preemption by freezing and
the thaw after it, a restart after its backoff, recovery of every kind of intent a kill -9
can leave open, internal errors that surface and clear, and the priority `ps` shows being
the one scheduling uses.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from xhagent.daemon.exec.shim import ShimExit, ShimStarted, ShimStatus
from xhagent.daemon.exec.spares import SpareRunDirs
from xhagent.daemon.loop.faults import Faults
from xhagent.daemon.loop.scheduler import Scheduler
from xhagent.daemon.loop.submission import parse_submission
from xhagent.daemon.metrics import AgentMetrics
from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.signals import StopRequested
from xhagent.daemon.store import Placement, Store, TaskState, WaitReason
from xhagent.node_model import Node

GIB = 1 << 30
T0 = 1_800_000_000 * 10**9


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


@dataclass
class FakeLeaf:
    path: Path
    frozen: bool = False

    def freeze(self, timeout: float) -> None:
        self.frozen = True

    def thaw(self, timeout: float) -> None:
        self.frozen = False


class FakeProcess:
    """A shim as the agent's child: its pidfd (a pipe's read end) is readable once it ends."""

    def __init__(self):
        self.pidfd, self._w = os.pipe2(os.O_CLOEXEC)
        self.returncode = None
        self.pid = os.getpid()

    def end(self) -> None:
        os.write(self._w, b"x")

    def wait(self, timeout=None) -> int:
        return 0

    def close(self) -> None:
        for fd in (self.pidfd, self._w):
            os.close(fd)


@dataclass
class Run:
    attempt: int
    argv: list[str]
    env: dict[str, str]
    started: ShimStarted
    process: FakeProcess
    exit: ShimExit | None = None


@dataclass
class Launched:
    started: ShimStarted

    def wait(self) -> ShimStarted:
        return self.started


@dataclass
class FakeExecutor:
    """The executor's interface over dicts: what the loop asks of leaves and shims."""

    root: Path
    missing: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)  # task id -> its current attempt
    leaves_: dict[str, FakeLeaf] = field(default_factory=dict)
    dead_shims: set[str] = field(default_factory=set)
    fail_status: bool = False  # status() raises: an internal error of the agent's
    cpu_usec: dict[str, int] = field(default_factory=dict)  # a leaf's CPU time at its removal
    cpusets: dict[str, tuple] = field(default_factory=dict)  # (cpus, mems) last set on a leaf
    pids: dict[int, str] = field(default_factory=dict)  # a process's task, as its cgroup says

    def __post_init__(self):
        self.spares = SpareRunDirs(self.root, 0, Path("/nonexistent"))  # (none made)

    def leaf(self, task_id: str) -> FakeLeaf:
        return self.leaves_.get(task_id) or FakeLeaf(self.root / "tasks" / task_id)

    def run_dir(self, task_id: str, attempt: int) -> Path:
        return self.root / "runs" / task_id / str(attempt)

    def start(
        self,
        task_id,
        attempt,
        plan,
        argv,
        env,
        cwd,
        uid,
        gid,
        run_dir=None,
        trace=False,
        trace_stacks="none",
    ):
        if argv and argv[0] == "no-such-program":
            raise FileNotFoundError(2, f"{argv[0]}: no such file")
        self.leaves_[task_id] = FakeLeaf(self.root / "tasks" / task_id)
        process = FakeProcess()
        started = ShimStarted(os.getpid(), 0, os.getpid(), 0, "fake", T0, process=process)
        self.runs[task_id] = Run(attempt, list(argv), dict(env), started, process)
        return started

    def launch(self, *args, **kw):  # a fake shim writes its record at once
        started = self.start(*args, **kw)
        return Launched(started)

    def status(self, task_id: str, attempt: int) -> ShimStatus:
        if self.fail_status:
            raise RuntimeError("the records cannot be read")
        run = self.runs.get(task_id)
        if run is None or run.attempt != attempt:
            return ShimStatus(None, None)
        return ShimStatus(run.started, run.exit)

    def shim_alive(self, started: ShimStarted) -> bool:
        return not any(r.started is started for t, r in self.runs.items() if t in self.dead_shims)

    def oom_kills(self, task_id: str) -> int:
        return 0

    def kill(self, task_id: str, timeout: float = 2.0) -> None:
        run = self.runs.get(task_id)
        if run is not None and run.exit is None:
            run.exit = ShimExit(signal=int(signal.SIGKILL))
            run.process.end()

    def set_cpus(self, task_id: str, cpus, mems) -> None:
        self.cpusets[task_id] = (list(cpus), list(mems))

    def set_frozen(self, task_id: str, frozen: bool, timeout: float = 2.0) -> None:
        if task_id in self.leaves_:
            self.leaves_[task_id].frozen = frozen

    def remove_leaf(self, task_id: str) -> int | None:
        """The leaf's CPU time as the real one reads it: here, what the test set (`cpu_usec`)."""
        self.leaves_.pop(task_id, None)
        return self.cpu_usec.get(task_id)

    def cpu_usage(self, task_id: str) -> int | None:
        """A leaf's CPU time so far: here, what the test set (`cpu_usec`)."""
        return self.cpu_usec.get(task_id, 0) if task_id in self.leaves_ else None

    def leaves(self) -> list[str]:
        return sorted(self.leaves_)

    def task_of_pid(self, pid: int) -> str | None:
        return self.pids.get(pid)

    # -- what the test does to workloads ------------------------------------------------------
    def exit(self, task_id: str, code: int) -> None:
        run = self.runs[task_id]
        run.exit = ShimExit(exit_code=code)
        run.process.end()


def node(cpus: int = 2, gpus: int = 0) -> Node:
    return Node.from_dict(
        {
            "name": "n1",
            "numa": [
                {
                    "id": 0,
                    "l3": [
                        {
                            "id": 0,
                            "cores": [{"id": c, "package": 0, "cpus": [c]} for c in range(cpus)],
                        }
                    ],
                }
            ],
            "memory": {"total": 64 * GIB, "available": 64 * GIB},
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "Model GPU",
                    "memoryTotal": 16 * GIB,
                    "memoryFree": 16 * GIB,
                    "cudaDriverVersion": "12.4",
                    "computeCapability": "9.0",
                    "numaNode": 0,
                    "nvlinkPeers": [],
                }
                for i in range(gpus)
            ],
        }
    )


def task(name: str, spec: str = "", command: str = "[sleep, '60']") -> str:
    return (
        "apiVersion: xh.scheduling/v1\nkind: Task\n"
        f"metadata: {{name: {name}, labels: {{app: x}}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {command}\n" + spec
    )


def policy(priority: int) -> str:
    return (
        "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: p}\n"
        f"spec:\n  priority: {priority}\n"
        "  matchRules:\n    - selector: {matchLabels: {app: x}}\n"
    )


class Loop:
    """A scheduler over the fakes, as the daemon wires one; `policies` is what is in force."""

    def __init__(self, tmp_path: Path, node: Node, clock: Clock, faults: Faults | None = None):
        self.tmp, self.node, self.clock = tmp_path, node, clock
        self.policies: list = []
        self.executor = FakeExecutor(tmp_path)
        self.faults = faults or Faults()
        self.open()

    def open(self) -> None:
        self.store = Store.open(self.tmp / "state", clock=self.clock)
        self.metrics = AgentMetrics(self.store, lambda: [], faults=self.faults)
        self.store.on_commit = self.metrics.observe
        self.scheduler = Scheduler(
            self.store,
            self.executor,
            self.node,
            parse_submission,
            lambda: self.policies,
            clock=self.clock,
            faults=self.faults,
        )

    def restart(self) -> dict[str, int]:
        """A new agent on the same state (the old one killed -9: nothing of it was closed)."""
        self.scheduler.close()
        self.store.close()
        self.open()
        return self.scheduler.recover()

    def submit(self, *docs: str) -> list[str]:
        return [r.id for r in self.scheduler.submit("---\n".join(docs), "t.yaml")]

    def step(self) -> None:
        """One step of the loop as it runs: on what woke it, or a full look."""
        woken = self.scheduler.wakeups.wait(0)
        self.scheduler.step(set(woken.exited) if woken.anything else None)

    def state(self, task_id: str) -> TaskState:
        return self.store.get(task_id).state

    def events(self, kind: str, task_id: str | None = None) -> list:
        return [e for e in self.store.events(0, task_id=task_id) if e.kind == kind]

    def close(self) -> None:
        self.scheduler.close()
        self.store.close()
        for run in self.executor.runs.values():
            run.process.close()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def loop(tmp_path, clock):
    made = Loop(tmp_path, node(), clock)
    yield made
    made.close()


def test_a_missed_deadline_is_one_event_per_task_however_many_steps(loop, clock):
    # 4 CPUs asked of a 2-CPU node: it waits, past its deadline, step after step
    (late,) = loop.submit(task("late", "  requests: {cpus: 4}\n  deadline: 1s\n"))
    (kept,) = loop.submit(task("kept", "  deadline: 60s\n"))
    for _ in range(3):
        loop.step()
    assert loop.events("DeadlineMissed") == []
    clock.advance(2)
    for _ in range(50):
        loop.step()
        clock.advance(0.1)
    (missed,) = loop.events("DeadlineMissed")
    assert missed.task_id == late and missed.message.startswith("Pending ")
    assert missed.detail == {"deadline_ns": T0 + 10**9, "state": "Pending"}
    got = loop.metrics.registry.get_sample_value(
        "xhagent_deadline_misses_total", {"class": "batch"}
    )
    assert got == 1
    assert loop.state(kept) == TaskState.RUNNING and loop.events("DeadlineMissed", kept) == []
    # a restarted agent may say it again, once
    loop.restart()
    for _ in range(5):
        loop.step()
    assert len(loop.events("DeadlineMissed", late)) == 2


def test_a_higher_priority_task_freezes_the_holder_and_it_thaws_after(loop):
    (low,) = loop.submit(task("low", "  priority: 10\n  requests: {cpus: 2}\n"))
    loop.step()
    assert loop.state(low) == TaskState.RUNNING
    (high,) = loop.submit(task("high", "  priority: 90\n  requests: {cpus: 2}\n"))
    loop.step()
    assert loop.state(low) == TaskState.FROZEN and loop.executor.leaf(low).frozen
    assert loop.state(high) == TaskState.RUNNING
    assert loop.executor.runs[high].env == {}
    assert [i.outcome for i in loop.store.open_intents()] == []
    loop.executor.exit(high, 0)
    loop.step()
    assert loop.state(high) == TaskState.SUCCEEDED
    assert loop.state(low) == TaskState.RUNNING and not loop.executor.leaf(low).frozen
    kinds = [e.message for e in loop.store.events(0, task_id=low) if e.kind == "Transition"]
    assert kinds[-2:] == ["Running -> Frozen: preempted by " + high, "Frozen -> Running: resumed"]


def test_preemption_by_kill_requeues_and_does_not_use_up_restarts(loop):
    spec = "  priority: 10\n  requests: {cpus: 2}\n  preemption: kill\n"
    (low,) = loop.submit(task("low", spec + "  restartPolicy: {policy: Never}\n"))
    loop.step()
    (high,) = loop.submit(task("high", "  priority: 90\n  requests: {cpus: 2}\n"))
    loop.step()
    rec = loop.store.get(low)
    assert rec.state == TaskState.PENDING and rec.preempted == 1 and rec.signal == signal.SIGKILL
    assert rec.reasons[0].kind == "Preempted"
    loop.executor.exit(high, 0)
    loop.step()
    assert loop.state(low) == TaskState.RUNNING and loop.store.get(low).attempt == 2


def test_a_failed_attempt_restarts_after_its_backoff(loop, clock):
    spec = "  restartPolicy: {policy: OnFailure, maxRestarts: 1, backoff: 2s}\n"
    (t,) = loop.submit(task("flaky", spec))
    loop.step()
    loop.executor.exit(t, 3)
    loop.step()
    rec = loop.store.get(t)
    assert rec.state == TaskState.PENDING and rec.exit_code == 3
    assert rec.reasons == (WaitReason("BackOff", "", "restart 1 of 1 in 2s"),)
    clock.advance(1.9)
    loop.step()
    assert loop.state(t) == TaskState.PENDING  # not before its delay
    assert loop.scheduler.wakeups.timeout() == pytest.approx(0.1, abs=0.01)  # woken for it
    clock.advance(0.2)
    loop.step()
    assert loop.state(t) == TaskState.RUNNING and loop.store.get(t).attempt == 2
    loop.executor.exit(t, 3)
    loop.step()
    rec = loop.store.get(t)
    assert rec.state == TaskState.FAILED and rec.exit_code == 3  # its one restart used


def test_a_workload_that_cannot_start_fails_alone(loop):
    bad, good = loop.submit(task("bad", command="[no-such-program]"), task("good"))
    loop.step()
    rec = loop.store.get(bad)
    assert rec.state == TaskState.FAILED and "no such file" in rec.error
    assert loop.state(good) == TaskState.RUNNING
    assert loop.faults.totals()["scheduler_step"] == 0  # the task's failure, not the agent's


def test_recovery_rolls_back_a_start_the_shim_never_answered(loop):
    (t,) = loop.submit(task("a"))
    placement = Placement("n1", (0, 1), False)
    with loop.store.atomic():  # what a kill -9 between intent and shim leaves
        loop.store.begin_intent(t, "start", {"node": "n1"})
        loop.store.transition(t, TaskState.STARTING, placement=placement, cgroup="x")
    loop.executor.leaves_[t] = FakeLeaf(Path("x"))
    counts = loop.restart()
    assert counts["rolled_back"] == 1 and loop.state(t) == TaskState.PENDING
    assert loop.executor.leaves() == [] and loop.store.open_intents() == []
    loop.step()
    assert loop.state(t) == TaskState.RUNNING


def test_recovery_completes_a_cancel_and_a_preemption_kill(loop):
    cancelled, preempted = loop.submit(task("c"), task("p"))
    loop.step()
    assert loop.state(cancelled) == loop.state(preempted) == TaskState.RUNNING
    loop.store.begin_intent(cancelled, "kill")
    loop.store.begin_intent(preempted, "kill", {"preempted_by": "t0000009"})
    counts = loop.restart()
    assert counts["ended"] == 2 and loop.store.open_intents() == []
    assert loop.state(cancelled) == TaskState.CANCELLED
    rec = loop.store.get(preempted)
    assert rec.state == TaskState.PENDING and rec.preempted == 1
    assert rec.reasons == (WaitReason("Preempted", "n1", "preempted by t0000009"),)


def test_a_frozen_task_resumes_on_other_free_cpus_when_its_own_are_taken(loop):
    one = "  priority: 10\n  requests: {cpus: 1}\n"
    a, b = loop.submit(task("a", one), task("b", one))
    loop.step()
    (high,) = loop.submit(task("high", "  priority: 90\n  requests: {cpus: 1}\n"))
    loop.step()
    (victim,) = [t for t in (a, b) if loop.state(t) == TaskState.FROZEN]
    other = a if victim == b else b
    own, free = loop.store.get(victim).placement.cpus, loop.store.get(other).placement.cpus
    assert loop.store.get(high).placement.cpus == own
    loop.executor.exit(other, 0)
    loop.step()
    rec = loop.store.get(victim)
    assert rec.state == TaskState.RUNNING and rec.placement.cpus == free != own
    assert not loop.executor.leaf(victim).frozen
    assert loop.executor.cpusets[victim] == (list(free), [0])  # pinned before the thaw
    (cpu,) = free
    messages = [e.message for e in loop.store.events(0, task_id=victim) if e.kind == "Transition"]
    assert messages[-1] == f"Frozen -> Running: resumed on CPUs {cpu}: its own are taken"
    assert {a.task: a.cpus for _, a in loop.scheduler.lifecycle.cluster.placed()} == {
        high: own,
        victim: free,
    }
    assert loop.store.open_intents() == []


def test_a_frozen_task_holding_a_gpu_resumes_only_on_its_own_cpus(tmp_path, clock):
    made = Loop(tmp_path, node(cpus=2, gpus=2), clock)
    try:
        gpu = "  deviceType: gpu\n  requests: {cpus: 1, gpus: 1, gpuMemory: 8GiB}\n"
        one = "  requests: {cpus: 1}\n"
        held, other = made.submit(
            task("g", gpu + "  priority: 10\n").replace("  deviceType: cpu\n", "", 1),
            task("o", one + "  priority: 50\n"),
        )
        made.step()
        (high,) = made.submit(task("high", one + "  priority: 90\n"))
        made.step()
        assert made.state(held) == TaskState.FROZEN  # the lowest priority: the victim
        made.executor.exit(other, 0)
        made.step()
        # a CPU is free, but its work is on its GPU: it waits for its own CPU
        assert made.state(held) == TaskState.FROZEN
        made.executor.exit(high, 0)
        made.step()
        rec = made.store.get(held)
        assert rec.state == TaskState.RUNNING and rec.placement.gpu_uuids == ["GPU-0"]
    finally:
        made.close()


def test_recovery_adopts_what_runs_and_makes_the_freeze_match_the_record(loop):
    running, frozen, dead = loop.submit(task("r"), task("f"), task("d"))
    loop.step()
    # a thaw cut after the kernel thawed the leaf, before its record (Frozen); a freeze cut
    # after the kernel froze the leaf, before its record (Running): the kernel is made to
    # match each record
    loop.store.transition(frozen, TaskState.FROZEN)
    loop.store.begin_intent(frozen, "thaw")
    loop.store.begin_intent(running, "freeze", {"preempted_by": "t0000009"})
    loop.executor.leaves_[running].frozen = True
    loop.executor.dead_shims.add(dead)
    loop.executor.leaves_["t00000zz"] = FakeLeaf(Path("orphan"))
    counts = loop.restart()
    assert counts == {
        "adopted": 2,
        "ended": 1,
        "rolled_back": 0,
        "orphan_leaves": 1,
        "moved": 0,
        "unreadable_intents": 0,
        "not_held": 0,
    }
    assert loop.state(running) == TaskState.RUNNING and loop.executor.leaf(frozen).frozen
    assert not loop.executor.leaf(running).frozen and loop.store.open_intents() == []
    rec = loop.store.get(dead)
    assert rec.state == TaskState.FAILED and "ended without a record" in rec.error
    loop.executor.exit(running, 0)
    loop.step()  # adopted and supervised again: its end is collected
    assert loop.state(running) == TaskState.SUCCEEDED


def test_a_task_whose_record_cannot_hold_its_placement_is_its_alone_after_a_restart(loop):
    renamed, unreadable, ended, kept = loop.submit(task("r"), task("u"), task("e"), task("k"))
    loop.step()
    loop.step()
    assert {loop.state(t) for t in (renamed, unreadable, ended, kept)} == {TaskState.RUNNING}
    loop.executor.exit(ended, 3)  # ended while no agent ran
    with sqlite3.connect(loop.store.path) as db:  # a node renamed; a document this agent
        for t in (renamed, ended):  # no longer reads
            db.execute(
                "UPDATE tasks SET placement = json_set(placement, '$.node', 'old') WHERE id = ?",
                (t,),
            )
        db.execute("UPDATE tasks SET source = 'kind: [' WHERE id = ?", (unreadable,))
    counts = loop.restart()
    assert counts["not_held"] == 3 and counts["adopted"] == 1
    r, u, e = (loop.store.get(t) for t in (renamed, unreadable, ended))
    assert r.state == u.state == TaskState.FAILED
    assert r.error == (
        "not recovered after a restart: its placement is on node 'old', and this node is 'n1'"
    )
    assert u.error.startswith("not recovered after a restart: its document no longer reads: ")
    assert (e.state, e.exit_code) == (TaskState.FAILED, 3)  # its own status, as it ended
    # stopped, not left running unseen beside what is placed next
    assert loop.executor.runs[renamed].exit is not None
    assert renamed not in loop.executor.leaves() and unreadable not in loop.executor.leaves()
    assert loop.state(kept) == TaskState.RUNNING
    (late,) = loop.submit(task("late"))
    loop.step()
    assert loop.state(late) == TaskState.RUNNING  # the freed CPUs are placed again


def test_a_stop_ends_recovery_between_two_tasks_and_the_next_start_finishes_it(loop):
    ids = loop.submit(task("a"), task("b"), task("c"))
    loop.step()
    loop.executor.dead_shims.update(ids)  # the node rebooted: every shim is gone
    loop.scheduler.close()
    loop.store.close()
    loop.open()
    calls = []

    def checkpoint():  # a stop comes while the second task is recovered
        calls.append(len(calls))
        if len(calls) == 3:
            raise StopRequested(signal.SIGTERM)

    with pytest.raises(StopRequested):
        loop.scheduler.recover(checkpoint)
    assert [loop.state(t) for t in ids] == [TaskState.FAILED, TaskState.FAILED, TaskState.RUNNING]
    assert loop.restart()["ended"] == 1
    assert [loop.state(t) for t in ids] == [TaskState.FAILED] * 3


def test_recovery_completes_a_move_between_devices(tmp_path, clock):
    loop = Loop(tmp_path, node(cpus=2, gpus=2), clock)
    try:
        gpu = "  deviceType: gpu\n  migratable: true\n  requests: {gpus: 1, gpuMemory: 8GiB}\n"
        (t,) = loop.submit(task("m", gpu).replace("  deviceType: cpu\n", "", 1))
        loop.step()
        rec = loop.store.get(t)
        assert rec.state == TaskState.RUNNING and rec.placement.gpu_uuids == ["GPU-0"]
        detail = {
            "from": "n1/gpu0",
            "to": "n1/gpu1",
            "reason": "test",
            "attempt": rec.attempt,
            "placement": rec.placement.to_json(),
        }
        loop.store.begin_intent(t, "migrate", detail)  # cut before the stop
        counts = loop.restart()
        assert counts["moved"] == 1 and loop.store.open_intents() == []
        rec = loop.store.get(t)
        assert rec.state == TaskState.RUNNING and rec.attempt == 2 and rec.migrated == 1
        assert rec.placement.gpu_uuids == ["GPU-1"]
        assert loop.executor.runs[t].env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
        (moved,) = loop.events("Migrated", t)
        assert moved.detail["from"] == "n1/gpu0" and moved.detail["recovered"] is True
    finally:
        loop.close()


def test_an_internal_error_is_counted_surfaces_in_health_and_clears(loop, caplog):
    # the real loop, on its own thread: a step that raises is the agent's fault, counted
    # once per try, logged when it starts and when it clears, and tried again a second later
    (t,) = loop.submit(task("a"))
    loop.step()
    loop.executor.fail_status = True  # every look at a running task raises
    thread = threading.Thread(target=loop.scheduler.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: loop.faults.totals()["scheduler_step"] >= 2, "a retry of the step")
        assert loop.faults.health().startswith("scheduler_step: the records cannot be read (")
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "internal error in scheduler_step" in errors[0].getMessage()
        loop.executor.exit(t, 0)
        loop.executor.fail_status = False
        wait_for(lambda: loop.state(t) == TaskState.SUCCEEDED, "the step to work again")
        wait_for(lambda: loop.faults.health() is None, "the fault to clear")
    finally:
        loop.scheduler.stop()
        thread.join(timeout=5)
    assert not thread.is_alive()
    cleared = [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]
    assert len(cleared) == 1 and "the records cannot be read" in cleared[0]
    n = loop.faults.totals()["scheduler_step"]
    got = loop.metrics.registry.get_sample_value(
        "xhagent_internal_errors_total", {"where": "scheduler_step"}
    )
    assert got == n >= 2
    assert (
        loop.metrics.registry.get_sample_value(
            "xhagent_internal_errors_total", {"where": "policy_reload"}
        )
        == 0
    )  # every place exists from the start


def test_a_step_that_begins_after_its_due_time_is_counted_as_lag(loop, clock):
    # Something fell due 5 s ago on the loop's clock (which this test holds still): the
    # loop's next step is 5 s late. A step woken by a request before its due time is not.
    lag = loop.metrics.registry.get_sample_value
    loop.scheduler.lag_timed = loop.metrics.lag_seconds.observe  # as the daemon wires them
    loop.scheduler.step_timed = loop.metrics.step_seconds.observe
    loop.scheduler.wakeups.at(clock() - int(5e9))
    thread = threading.Thread(target=loop.scheduler.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: lag("xhagent_scheduler_lag_seconds_count") == 1, "the late step")
        loop.scheduler.wakeups.at(clock() + int(60e9))
        steps = lag("xhagent_scheduler_step_seconds_count") or 0
        loop.scheduler.wake()
        wait_for(lambda: (lag("xhagent_scheduler_step_seconds_count") or 0) > steps, "a step")
    finally:
        loop.scheduler.stop()
        thread.join(timeout=5)
    assert lag("xhagent_scheduler_lag_seconds_count") == 1
    assert lag("xhagent_scheduler_lag_seconds_sum") == pytest.approx(5.0)


def wait_for(done, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_what_ps_shows_is_the_priority_scheduling_uses_now(loop):
    loop.policies = [parse_source(policy(70), "p.yaml")[0].value]
    own, inherited = loop.submit(task("own", "  priority: 20\n"), task("inherited"))
    recs = [loop.store.get(own), loop.store.get(inherited)]
    assert [(s.priority, s.policy) for s in loop.scheduler.standings(recs)] == [
        (20, "p"),
        (70, "p"),
    ]
    loop.policies = [parse_source(policy(90), "p.yaml")[0].value]  # the policy changed
    assert [s.priority for s in loop.scheduler.standings(recs)] == [20, 90]
    loop.policies = []
    assert [(s.priority, s.policy) for s in loop.scheduler.standings(recs)] == [(20, ""), (50, "")]


def test_cancel_of_a_running_and_of_a_pending_task(loop):
    running, waiting = loop.submit(
        task("r", "  requests: {cpus: 2}\n"), task("w", "  requests: {cpus: 2}\n")
    )
    loop.step()
    assert loop.state(waiting) == TaskState.PENDING
    assert loop.scheduler.cancel(running).state == TaskState.CANCELLED
    assert loop.executor.runs[running].exit.signal == signal.SIGKILL
    assert loop.scheduler.cancel(waiting).state == TaskState.CANCELLED
    from xhagent.daemon.loop.scheduler import RequestRefused

    with pytest.raises(RequestRefused, match="already ended"):
        loop.scheduler.cancel(running)
    assert loop.store.open_intents() == [] and loop.executor.leaves() == []
