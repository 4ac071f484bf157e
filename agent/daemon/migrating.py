"""Load-driven migration in the daemon (seed 003, chapter 1; issue 17): the decision is
`xhagent.sched.migration.decide`, this module measures, asks it and enacts its moves.

Every `interval` of the first SchedulingPolicy in force that has `spec.migration`, the
controller (one round per step once the interval has passed; the loop wakes for it):

- measures each GPU's and TPU chip's load: NVML's utilisation where NVML sees the GPU (by
  UUID), else what the agent has booked on it (`booked`: a GPU held whole is 1.0, a shared
  one its reserved memory over its total; a TPU chip 1.0 held, 0.0 free). Every move says
  which source it used;
- hands `decide` the Running tasks that hold exactly one device (with the device types each
  may run on, its `runsOn`), the placement state and the controller's memory (the tasks
  moved last round, the devices each task has left);
- enacts each move of a task whose spec says `migratable: true` (decide moves no other):
  an intent `migrate` in the store first (from, to, the attempt it stops, why), then stop
  (`cgroup.kill` of its leaf, its exit recorded by its shim), give its allocation back,
  run its checkpoint hook (`spec.checkpoint`, argv, no shell, with its timeout), and start
  it again as a new attempt on the target: the same CPUs and memory, the target's GPU share
  or TPU chip, CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS set for it. The old allocation is
  released before the new one is committed, each once. A checkpoint that fails or times
  out cancels the move: the task starts again where it was, and the event says why; the
  controller does not stop it for a move again while the agent runs.

Every move is an event (`Migrated`, or `MigrationAborted` when the task started again where
it was) on the task, in the store's event stream (`xhagent events`, the API's watch):

    {"kind": "Migrated", "task_id": ..., "message": "moved from n/gpu0 to n/gpu1: ...",
     "detail": {"from": "n/gpu0", "to": "n/gpu1", "reason": "n/gpu0 load 1.00 > 0.85, ...",
                "hot_load": 1.0, "target_load": 0.0, "load_source": "booked",
                "checkpoint": "none" | "ok", "attempt": 2, "penalty_ns": 0.0}}

A restart of the agent (kill -9) completes an open `migrate` intent (`recovery.py`): a task
not yet stopped is stopped, its checkpoint is run (again: a hook must bear running twice),
and it starts on the target when placement still admits it there, else where it was, else
it waits in Pending like any task. It runs on one device at most, holding what it runs on.

The checkpoint runs in the task's leaf, made again for it (its memory limit and class
weights, on the CPUs no task holds alone: its own were given back), as the task's user,
under a shim like a workload, its output in the stopped attempt's directory
(`checkpoint/stdout`, `stderr`); when it ends or times out the leaf is killed and removed
with whatever the hook left running. The loop does not wait for it: the task stays Pending
(reason `Migrating`, left alone by the scheduler) while every step looks at the hook's
record (`poll_hooks`, every HOOK_POLL_S while it runs), and the step that sees it end
starts the task. Only recovery runs a hook to its end before it goes on (at most its
timeout, 5 minutes at most), after killing what a run cut by the restart left in the leaf.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..policy.placement import Candidate, Reason
from ..policy.policy import Migration, choose
from ..policy.state import GpuShare, NodeResources
from ..policy.task import Task
from ..sched import migration
from ..sched.fair import FairShare
from . import shim
from .executor import resolve_run_as
from .lifecycle import TaskState as S
from .store import TaskRecord

if TYPE_CHECKING:
    from .core import Agent

log = logging.getLogger("xhagent")

BOOKED, NVML = "booked", "nvml"
MIGRATING = "Migrating"  # the reason of a task between its stop and its restart
STOP_TIMEOUT_S = 3.0
CHECKPOINT = "checkpoint"  # the hook's run directory, in the stopped attempt's
HOOK_POLL_S = 0.05  # how often a step looks at a running checkpoint
OUTPUT_TAIL = 2000  # bytes of a failed checkpoint's output kept in its event


# -- load --------------------------------------------------------------------------------------


def booked_loads(st: NodeResources) -> dict[str, float]:
    """Device id -> the share of it the agent has handed out (0..1)."""
    out = {}
    for g in st.gpus:
        share = 1.0 if g.whole else (g.reserved / g.total if g.total > 0 else 0.0)
        out[f"{st.name}/gpu{g.index}"] = min(1.0, max(0.0, share))
    for t in st.tpus:
        out[f"{st.name}/tpu{t.index}"] = 1.0 if t.holders else 0.0
    return out


def has_room(st: NodeResources, kind: str, index: int) -> bool:
    if kind == "gpu":
        g = st.gpu(index)
        return not g.whole and g.free > 0
    return not st.tpu(index).holders


class NvmlLoad:
    """GPU utilisation through NVML: tried once, and never again once it failed (`error`)."""

    def __init__(self, sys_root: Path = Path("/sys")):
        self.sys_root = sys_root
        self.error: str | None = None
        self._nvml = None

    def sample(self, gpus) -> dict[int, float]:
        """Model GPU index -> utilisation (0..1) of those NVML sees by UUID."""
        if not gpus or self.error is not None:
            return {}
        if self._nvml is None:
            self._nvml = self._init()
            if self._nvml is None:
                return {}
        nvml, out = self._nvml, {}
        for g in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(g.uuid)
                out[g.index] = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            except Exception as exc:  # NVMLError_*: that GPU's load is the booked one
                log.debug("NVML utilisation of GPU %s: %s", g.uuid, exc)
        if not out:
            self.error = self.error or "NVML sees none of the node's GPUs"
        return out

    def _init(self):
        # as the inventory: without the driver bound, NVML sees nothing (and pynvml costs
        # resident memory for nothing)
        if not (self.sys_root / "bus/pci/drivers/nvidia").is_dir():
            self.error = f"no NVIDIA driver: {self.sys_root}/bus/pci/drivers/nvidia absent"
            return None
        try:
            import pynvml as nvml

            nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
            self.error = f"NVML: {type(exc).__name__}: {exc}"
            return None
        return nvml


# -- the controller -----------------------------------------------------------------------------


class MigrationController:
    def __init__(self, agent: Agent, nvml: NvmlLoad | None = None):
        self.agent = agent
        self.nvml = nvml or NvmlLoad()
        self.fair = FairShare()
        self.last_ns: int | None = None
        self.moved: frozenset[str] = frozenset()  # moved in the last round
        self.left: dict[str, set[str]] = {}  # task id -> devices it moved off
        # tasks whose checkpoint failed or timed out: not stopped for a move again (each try
        # kills the workload, and a hook that failed once is likely to again)
        self.refused: set[str] = set()
        self.hooks: dict[str, Hook] = {}  # task id -> its checkpoint, running

    def policy(self) -> Migration | None:
        for p in self.agent.policies():
            if getattr(p, "migration", None) is not None:
                return p.migration
        return None

    def round(self) -> list[dict]:
        """Every step (under the agent's lock): the moves whose checkpoint ended since, then
        a round of decisions when the interval has passed. The moves that ended, as their
        events' details."""
        agent = self.agent
        done = self.poll_hooks()
        policy = self.policy()
        if policy is None:
            self.last_ns = None
            return done
        now = agent.clock()
        if self.last_ns is None:  # the first interval starts now
            self.last_ns = now
        elapsed = now - self.last_ns
        if elapsed < policy.interval_ns:
            agent._wake_at(self.last_ns + policy.interval_ns)
            return done
        running = self.running()
        alive = {r.name for r in running} | set(self.hooks)
        self.left = {t: d for t, d in self.left.items() if t in alive}
        self.refused &= alive
        if not any(r.task.migratable for r in running):
            # nothing could move: no wake-ups of its own until a step starts the next interval
            self.last_ns, self.moved = None, frozenset()
            return done
        self.last_ns = now
        agent._wake_at(now + policy.interval_ns)
        devices, sources = self.devices()
        skip = self.moved | self.refused
        moves = migration.decide(
            devices, running, agent.cluster, policy, self.fair, elapsed, skip, self.left
        )
        self.moved = frozenset(m.task for m in moves)
        loads = {d.id: d.load for d in devices}
        for m in moves:
            detail = {
                "from": m.src,
                "to": m.dst,
                "reason": m.reason,
                "hot_load": round(loads[m.src], 4),
                "target_load": round(loads[m.dst], 4),
                "load_source": sources[m.src][0],
                "penalty_ns": m.penalty_ns,
            }
            if sources[m.src][1]:
                detail["load_note"] = sources[m.src][1]
            out = move(agent, m.task, detail)
            if out is not None:
                self._ended(m.task, out)
                if out.get("moved"):
                    done.append(out)
        return done

    def _ended(self, task_id: str, out: dict) -> None:
        """What the controller keeps of a move that ended: the device a moved task left, a
        task whose checkpoint failed."""
        if out.get("moved"):
            self.left.setdefault(task_id, set()).add(out["from"])
        elif out.get("checkpoint") == "failed":
            self.refused.add(task_id)

    def poll_hooks(self) -> list[dict]:
        """Finish the moves whose checkpoint ended (or ran out of time); the loop is woken
        again for those still running."""
        agent, done = self.agent, []
        now = time.monotonic()
        for task_id, hook in list(self.hooks.items()):
            if not hook.ended() and now < hook.deadline:
                agent._wake_at(agent.clock() + int(1e9 * min(HOOK_POLL_S, hook.deadline - now)))
                continue
            del self.hooks[task_id]
            self.moved = self.moved | {task_id}  # moved or not: not stopped again at once
            try:
                error = hook.result()
            except (OSError, ValueError) as exc:  # the leaf or the records: still restart it
                error = f"checkpoint could not be finished: {exc}"
            out = finish_move(agent, task_id, hook, error)
            self._ended(task_id, out)
            if out.get("moved"):
                done.append(out)
        return done

    def busy(self, task_id: str) -> bool:
        """Whether `task_id` is between its stop and its restart (its checkpoint runs): the
        scheduler leaves it alone meanwhile."""
        return task_id in self.hooks

    def devices(self) -> tuple[list[migration.Device], dict[str, tuple[str, str]]]:
        """The node's accelerators with their loads, and each one's (source, note)."""
        agent = self.agent
        st = agent.cluster.nodes[agent.node.name]
        booked = booked_loads(st)
        measured = self.nvml.sample(agent.node.gpus) if st.gpus else {}
        note = "" if measured else (self.nvml.error or "")
        devices, sources = [], {}
        for g in st.gpus:
            did = f"{st.name}/gpu{g.index}"
            if g.index in measured:
                load, sources[did] = measured[g.index], (NVML, "")
            else:
                why = note or f"NVML does not see GPU {g.index} by its UUID"
                load, sources[did] = booked[did], (BOOKED, why)
            devices.append(
                migration.Device(
                    st.name, "gpu", g.index, load, g.numa or 0, has_room(st, "gpu", g.index)
                )
            )
        for t in st.tpus:
            did = f"{st.name}/tpu{t.index}"
            sources[did] = (BOOKED, "")
            devices.append(
                migration.Device(
                    st.name, "tpu", t.index, booked[did], t.numa or 0, has_room(st, "tpu", t.index)
                )
            )
        return devices, sources

    def running(self) -> list[migration.Running]:
        """The Running tasks that hold exactly one accelerator, named by task id."""
        agent = self.agent
        st = agent.cluster.nodes[agent.node.name]
        policies = agent.policies()
        out = []
        for rec in agent.records([S.RUNNING]):
            task, held = agent.tasks.get(rec.id), st.tasks.get(rec.id)
            if task is None or held is None:
                continue
            devices = [f"gpu{s.index}" for s in held.gpus] + [f"tpu{i}" for i in held.tpus]
            if len(devices) != 1:
                continue
            match = choose(policies, task.label_map)
            named = replace(task, name=rec.id)
            device = f"{st.name}/{devices[0]}"
            out.append(migration.Running(named, match, device, frozenset(task.runs_on)))
        return out


# -- enactment ----------------------------------------------------------------------------------


def move(agent: Agent, task_id: str, detail: dict) -> dict | None:
    """Stop `task_id`, run its checkpoint, start it on `detail["to"]` (or where it was, when
    the checkpoint failed). Returns the event's detail, None when nothing was moved."""
    rec = agent.store.get(task_id)
    task = agent.tasks.get(task_id)
    if rec is None or rec.state != S.RUNNING or task is None or not task.migratable:
        return None
    detail = {**detail, "attempt": rec.attempt, "placement": rec.placement}
    intent = agent.store.begin_intent(task_id, "migrate", detail)
    pending, why = stop(agent, rec, detail)
    if pending is None:
        agent.store.finish_intent(intent, f"not moved: {why}")
        agent.store.add_event(
            "MigrationFailed",
            f"not moved from {detail['from']} to {detail['to']}: {why}",
            task_id=task_id,
            detail=_public(detail) | {"error": why},
        )
        return None
    hook = start_checkpoint(agent, pending, task, detail)
    if isinstance(hook, Hook):  # the loop goes on; poll_hooks restarts the task when it ends
        hook.intent, hook.task, hook.detail = intent, task, detail
        agent.migration.hooks[task_id] = hook
        agent._wake_at(agent.clock() + int(HOOK_POLL_S * 1e9))
        return None
    out = restart(agent, pending, task, detail, hook)
    agent.store.finish_intent(intent, out["outcome"])
    return out


def finish_move(agent: Agent, task_id: str, hook: Hook, error: str | None) -> dict:
    """The checkpoint of a move ended (`error`: None, or why it failed): start the task."""
    pending = agent.store.get(task_id)
    if pending is None or pending.state != S.PENDING or pending.attempt != hook.attempt:
        state = pending.state if pending is not None else "gone"
        agent.store.finish_intent(hook.intent, f"not restarted: the task is {state} now")
        return {"moved": False}
    out = restart(agent, pending, hook.task, hook.detail, error)
    agent.store.finish_intent(hook.intent, out["outcome"])
    return out


def stop(agent: Agent, rec: TaskRecord, detail: dict) -> tuple[TaskRecord | None, str]:
    """Kill the workload and requeue the task (Pending, reason Migrating, its allocation
    given back): the Pending record, or None and why (it ended on its own: recorded as
    such; it could not be stopped: it keeps running where it is)."""
    agent.executor.kill(rec.id)
    status = agent.wait_exit(rec, STOP_TIMEOUT_S)
    ex = status.exit
    if ex is None:
        return None, f"the workload did not stop within {STOP_TIMEOUT_S:g}s"
    if ex.signal != signal.SIGKILL:  # it ended before the kill landed: an end like any other
        agent.finish(rec, status)
        return None, "it ended on its own before it was stopped"
    agent.release(rec.id)
    agent.executor.remove_leaf(rec.id)
    reason = {
        "kind": MIGRATING,
        "node": agent.node.name,
        "detail": f"moving from {detail['from']} to {detail['to']}",
    }
    pending = agent.store.transition(
        rec.id,
        S.PENDING,
        expect=S.RUNNING,
        reasons=[reason],
        note=f"stopped to move from {detail['from']} to {detail['to']}",
        migrated=rec.migrated + 1,
        exit_code=ex.exit_code,
        signal=ex.signal,
    )
    return pending, ""


def restart(agent: Agent, pending: TaskRecord, task: Task, detail: dict, error: str | None) -> dict:
    """After the checkpoint (`error`: None when it succeeded or there is none, else why
    not), start the Pending task on the target, else where it was, else leave it to the
    scheduler; records the event. Returns the event's detail plus `moved` and the intent's
    `outcome`."""
    st = agent.cluster.nodes[agent.node.name]
    out = _public(detail)
    out["checkpoint"] = "none" if task.checkpoint is None else ("ok" if error is None else "failed")
    where = None
    if error is None:
        target = target_placement(agent, task, detail["placement"], detail["to"])
        if isinstance(target, Reason):
            error = f"the target no longer admits it: {target}"
        elif not fits(st, target, pending.id):
            error = "the target is taken"
        else:
            where = target
    moving = where is not None
    if where is None:
        back = _candidate(detail["placement"])
        where = back if fits(st, back, pending.id) else None
    if error is not None:
        out["error"] = error
    if where is None:  # placed again by the scheduler, like any Pending task
        out |= {"moved": False, "outcome": "requeued", "attempt": pending.attempt}
        message = f"stopped on {detail['from']}; waits to be placed again: {error}"
        agent.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
        return out
    agent._start(pending, task, where)
    rec = agent.store.get(pending.id)
    out["attempt"] = rec.attempt
    if rec.state not in (S.RUNNING, S.STARTING):  # the start failed: the task's own failure
        out |= {"moved": False, "outcome": f"start failed: {rec.error}", "error": rec.error}
        message = f"not moved to {detail['to']}: the start failed: {rec.error}"
        agent.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
    elif moving:
        out |= {"moved": True, "outcome": "moved"}
        message = f"moved from {detail['from']} to {detail['to']}: {detail['reason']}"
        agent.store.add_event("Migrated", message, task_id=pending.id, detail=_clean(out))
    else:
        out |= {"moved": False, "outcome": "restarted where it was"}
        message = f"not moved to {detail['to']}, started again on {detail['from']}: {error}"
        agent.store.add_event("MigrationAborted", message, task_id=pending.id, detail=_clean(out))
    return out


def target_placement(agent: Agent, task: Task, old: dict, dst: str) -> Candidate | Reason:
    """The candidate on `dst` (a Device id) for a task no longer in the placement state: the
    device share placement gives it there, its CPUs and memory as they were."""
    node, _, device = dst.partition("/")
    kind = device.rstrip("0123456789")
    index = int(device[len(kind) :])
    st = agent.cluster.nodes.get(node)
    numa = 0
    if st is not None and kind == "gpu" and any(g.index == index for g in st.gpus):
        numa = st.gpu(index).numa or 0
    elif st is not None and kind == "tpu" and any(t.index == index for t in st.tpus):
        numa = st.tpu(index).numa or 0
    match = choose(agent.policies(), task.label_map)
    r = migration.Running(replace(task, name="migrating"), match, "")
    got = migration.placement_on(agent.cluster, r, migration.Device(node, kind, index, 0.0, numa))
    if isinstance(got, Reason):
        return got
    base = _candidate(old)
    return replace(base, gpus=got.gpus, tpus=got.tpus)


def _candidate(placement: dict) -> Candidate:
    shares = tuple(GpuShare(i, m, w) for i, m, w in placement.get("gpu_shares", ()))
    cpus = tuple(placement.get("cpus", ())) if placement.get("exclusive") else ()
    return Candidate(
        placement["node"],
        cpus,
        placement.get("memory", 0),
        shares,
        0.0,
        (),
        tuple(placement.get("tpus", ())),
    )


def fits(st: NodeResources, c: Candidate, task_id: str) -> bool:
    """Whether `c` can be committed on `st` now without taking what another task holds:
    its CPUs free, its memory, a GPU share's memory (a whole one: nobody on that GPU), its
    TPU chips free."""
    if task_id in st.tasks or not set(c.cpus) <= st.free_cpus or c.memory > st.memory_free:
        return False
    for share in c.gpus:
        if not any(g.index == share.index for g in st.gpus):
            return False
        g = st.gpu(share.index)
        if g.whole or (share.whole and g.holders) or share.memory > g.free:
            return False
    for i in c.tpus:
        if not any(t.index == i for t in st.tpus) or st.tpu(i).holders:
            return False
    return True


class Hook:
    """A checkpoint hook running in the task's leaf under a shim of its own: where its
    records are, the monotonic time it must end by, and what its end is for."""

    def __init__(self, agent: Agent, task_id: str, started, run_dir: Path, timeout: float):
        self.agent, self.task_id, self.started = agent, task_id, started
        self.run_dir, self.timeout = run_dir, timeout
        self.deadline = time.monotonic() + timeout
        self.attempt = 0
        self.intent = None
        self.task: Task | None = None
        self.detail: dict = {}

    def ended(self) -> bool:
        return shim.read_status(self.run_dir).exit is not None

    def result(self) -> str | None:
        """Its outcome, once it ended or ran out of time: None, or why it failed. The leaf
        is killed and removed either way, with whatever the hook started and left there."""
        executor = self.agent.executor
        ex = shim.read_status(self.run_dir).exit
        timed_out = ex is None
        if timed_out:
            executor.kill(self.task_id)
            ex = _wait_record(self.run_dir, STOP_TIMEOUT_S)
        executor.remove_leaf(self.task_id)
        _reap(self.started.process)
        output = _tail(self.run_dir)
        if timed_out:
            return f"checkpoint timed out after {self.timeout:g}s{output}"
        if ex.error:
            return f"checkpoint could not run: {ex.message or ex.error}"
        if ex.signal:
            return f"checkpoint failed with signal {ex.signal}{output}"
        if ex.exit_code:
            return f"checkpoint failed with exit code {ex.exit_code}{output}"
        return None


def start_checkpoint(agent: Agent, rec: TaskRecord, task: Task, detail: dict) -> Hook | None | str:
    """Start the task's checkpoint hook in its leaf (made again: its memory limit and class
    weights, on the CPUs no task holds alone), as its user, under a shim: the Hook, None
    when the task has none, or why it could not start."""
    hook = task.checkpoint
    if hook is None:
        return None
    env = dict(task.env)
    placement = detail.get("placement") or {}
    if placement.get("gpus"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(placement["gpus"])
    if placement.get("tpus"):
        env["TPU_VISIBLE_CHIPS"] = ",".join(str(i) for i in sorted(placement["tpus"]))
    env |= {
        "XHAGENT_TASK_ID": rec.id,
        "XHAGENT_MIGRATE_FROM": detail["from"],
        "XHAGENT_MIGRATE_TO": detail["to"],
    }
    run_dir = agent.executor.run_dir(rec.id, rec.attempt) / CHECKPOINT
    if run_dir.exists():  # a run cut by a restart of the agent: this one starts afresh
        shutil.rmtree(run_dir)
    try:
        agent.executor.remove_leaf(rec.id)  # and kills what that run left running
        uid, gid = resolve_run_as(task.user) if task.user else (None, None)
        # its own CPUs were given back at the stop, and may be another task's by now
        plan = agent.leaf_plan(task, agent._shared_cpus())
        started = agent.executor.start(
            rec.id, rec.attempt, plan, list(hook.command), env, task.working_dir, uid, gid, run_dir
        )
    except (OSError, ValueError) as exc:
        return f"checkpoint could not run: {exc}"
    out = Hook(agent, rec.id, started, run_dir, hook.timeout_ns / 1e9)
    out.attempt, out.detail = rec.attempt, detail
    return out


def checkpoint(agent: Agent, rec: TaskRecord, task: Task, detail: dict) -> str | None:
    """Run the task's checkpoint hook to its end (recovery's form, before the loop runs);
    None when it succeeded (or there is none), else why."""
    hook = start_checkpoint(agent, rec, task, detail)
    if not isinstance(hook, Hook):
        return hook
    _wait_record(hook.run_dir, hook.timeout)
    return hook.result()


def _reap(shim_process) -> None:
    """Reap the hook's shim (the agent's child), which ends once it has written the hook's
    exit record; one that does not is killed rather than left a zombie or a stalled step."""
    if shim_process is None:
        return
    try:
        shim_process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("checkpoint shim pid %d did not end: killed", shim_process.pid)
        shim_process.kill()
        shim_process.wait()
    except OSError as exc:
        log.warning("checkpoint shim pid %d: %s", shim_process.pid, exc)


def _wait_record(run_dir: Path, timeout: float):
    """The shim's exit record in `run_dir` once written, within `timeout`; else None."""
    deadline = time.monotonic() + timeout
    while (ex := shim.read_status(run_dir).exit) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ex


def _tail(run_dir: Path) -> str:
    """The end of the hook's output (stdout, then stderr), for its event."""
    parts = []
    for name in ("stdout", "stderr"):
        try:
            data = (run_dir / name).read_bytes()[-OUTPUT_TAIL:].decode("utf-8", "replace")
        except OSError:
            continue
        if data.strip():
            parts.append(data.strip())
    return f": {' '.join(parts)[-OUTPUT_TAIL:]}" if parts else ""


def _public(detail: dict) -> dict:
    return {k: v for k, v in detail.items() if k != "placement"}


def _clean(out: dict) -> dict:
    return {k: v for k, v in out.items() if k not in ("moved", "outcome", "placement")}


# -- after a restart (recovery.py) ----------------------------------------------------------------


def resume_stop(agent: Agent, rec: TaskRecord, args: dict) -> TaskRecord | None:
    """The first half of an open `migrate` intent, before the placements are re-established:
    the task stopped and Pending (to be restarted by `resume_restart`), or None when there is
    nothing left of the move to do (it was restarted, or ended)."""
    attempt = args.get("attempt")
    if rec.attempt != attempt:  # started again already: the start's own intent covers it
        return None
    if rec.state == S.PENDING and (rec.reasons or [{}])[0].get("kind") == MIGRATING:
        return rec
    if rec.state != S.RUNNING:
        return None
    pending, why = stop(agent, rec, args)
    if pending is None:
        log.warning("task %s: a move cut by a restart could not be completed: %s", rec.id, why)
    return pending


def resume_restart(agent: Agent, rec: TaskRecord, args: dict) -> dict:
    """The second half, once every live task holds its placement again."""
    task = agent.tasks.get(rec.id) or agent.task_of(rec)
    agent.tasks[rec.id] = task
    detail = {**args, "recovered": True}
    return restart(agent, rec, task, detail, checkpoint(agent, rec, task, detail))


__all__ = [
    "BOOKED",
    "MIGRATING",
    "NVML",
    "MigrationController",
    "NvmlLoad",
    "booked_loads",
    "fits",
    "move",
    "resume_restart",
    "resume_stop",
]
