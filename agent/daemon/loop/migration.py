"""Load-driven migration in the daemon: the decision is `xhagent.sched.migration.decide`;
this module measures the devices' loads and asks it, moves.py enacts its moves and
checkpoint.py runs a moving task's checkpoint hook.

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

A restart of the agent (kill -9) completes an open `migrate` intent (recovery.py, through
`resume_stop` and `resume_restart`): a task not yet stopped is stopped, its checkpoint is
run (again: a hook must bear running twice), and it starts on the target when placement
still admits it there, else where it was, else it waits in Pending like any task. It runs
on one device at most, holding what it runs on.

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
import time
from dataclasses import replace

from ...policy.policy import Migration, choose
from ...policy.state import NodeResources
from ...sched import migration
from ...sched.fair import FairShare
from ..store import TaskRecord, TaskState
from . import moves
from .checkpoint import Hook
from .fairness import Fairness
from .lifecycle import Lifecycle
from .nvml import Nvml

log = logging.getLogger("xhagent")

BOOKED, NVML = "booked", "nvml"
MIGRATING = moves.MIGRATING
HOOK_POLL_S = 0.05  # how often a step looks at a running checkpoint


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


# -- the controller -----------------------------------------------------------------------------


class MigrationController:
    def __init__(
        self,
        lc: Lifecycle,
        policies=list,
        wakeups=None,
        nvml: Nvml | None = None,
        fairness: Fairness | None = None,
    ):
        self.lc = lc
        self.policies = policies  # the SchedulingPolicies in force now
        self.wakeups = wakeups
        self.nvml = nvml or Nvml()
        # the node's fair share: its penalties rank the moves, and a move is charged its own
        self.fairness = fairness
        self.fair = fairness.share if fairness is not None else FairShare()
        self.last_ns: int | None = None
        self.moved: frozenset[str] = frozenset()  # moved in the last round
        self.left: dict[str, set[str]] = {}  # task id -> devices it moved off
        # tasks whose checkpoint failed or timed out: not stopped for a move again (each try
        # kills the workload, and a hook that failed once is likely to again)
        self.refused: set[str] = set()
        self.hooks: dict[str, Hook] = {}  # task id -> its checkpoint, running

    def policy(self) -> Migration | None:
        for p in self.policies():
            if getattr(p, "migration", None) is not None:
                return p.migration
        return None

    def round(self) -> list[dict]:
        """Every step (under the scheduler's lock): the moves whose checkpoint ended since,
        then a round of decisions when the interval has passed. The moves that ended, as
        their events' details."""
        lc = self.lc
        done = self.poll_hooks()
        policy = self.policy()
        if policy is None:
            self.last_ns = None
            return done
        now = lc.clock()
        if self.last_ns is None:  # the first interval starts now
            self.last_ns = now
        elapsed = now - self.last_ns
        if elapsed < policy.interval_ns:
            self.wakeups.at(self.last_ns + policy.interval_ns)
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
        self.wakeups.at(now + policy.interval_ns)
        devices, sources = self.devices()
        skip = self.moved | self.refused
        decided = migration.decide(
            devices, running, lc.cluster, policy, self.fair, elapsed, skip, self.left
        )
        self.moved = frozenset(m.task for m in decided)
        loads = {d.id: d.load for d in devices}
        for m in decided:
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
            out = moves.move(lc, m.task, detail, self.policies())
            if isinstance(out, Hook):  # the loop goes on; poll_hooks restarts the task
                self.hooks[m.task] = out
                self.wakeups.at(lc.clock() + int(HOOK_POLL_S * 1e9))
            elif out is not None:
                self._ended(m.task, out)
                if out.get("moved"):
                    done.append(out)
        return done

    def _ended(self, task_id: str, out: dict) -> None:
        """What the controller keeps of a move that ended: the device a moved task left, a
        task whose checkpoint failed."""
        if out.get("moved"):
            self.left.setdefault(task_id, set()).add(out["from"])
            if self.fairness is not None:
                self.fairness.moved(task_id, out.get("penalty_ns") or 0.0)
        elif out.get("checkpoint") == "failed":
            self.refused.add(task_id)

    def poll_hooks(self) -> list[dict]:
        """Finish the moves whose checkpoint ended (or ran out of time); the loop is woken
        again for those still running."""
        lc, done = self.lc, []
        now = time.monotonic()
        for task_id, hook in list(self.hooks.items()):
            if not hook.ended() and now < hook.deadline:
                wait = min(HOOK_POLL_S, hook.deadline - now)
                self.wakeups.at(lc.clock() + int(1e9 * wait))
                continue
            del self.hooks[task_id]
            self.moved = self.moved | {task_id}  # moved or not: not stopped again at once
            try:
                error = hook.result()
            except (OSError, ValueError) as exc:  # the leaf or the records: still restart it
                error = f"checkpoint could not be finished: {exc}"
            out = moves.finish_move(lc, hook, error, self.policies())
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
        lc = self.lc
        st = lc.cluster.nodes[lc.node.name]
        booked = booked_loads(st)
        measured = self.nvml.utilisation(lc.node.gpus) if st.gpus else {}
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
        lc = self.lc
        st = lc.cluster.nodes[lc.node.name]
        policies = self.policies()
        out = []
        for rec in lc.store.each_task([TaskState.RUNNING]):
            task, held = lc.spec(rec.id), st.tasks.get(rec.id)
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

    # -- after a restart (recovery.py) ------------------------------------------------------------
    def resume_stop(self, rec: TaskRecord, args: dict) -> TaskRecord | None:
        """See moves.resume_stop."""
        return moves.resume_stop(self.lc, rec, args)

    def resume_restart(self, rec: TaskRecord, args: dict) -> dict:
        """See moves.resume_restart."""
        return moves.resume_restart(self.lc, rec, args, self.policies())


__all__ = [
    "BOOKED",
    "MIGRATING",
    "NVML",
    "MigrationController",
    "booked_loads",
    "has_room",
]
