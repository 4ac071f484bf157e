"""A moving task's checkpoint hook (`spec.checkpoint`): run in the task's leaf, made again
for it (its memory limit and class weights, on the CPUs no task holds alone: its own were
given back at the stop), as the task's user, under a shim like a workload, its output in
the stopped attempt's directory (`checkpoint/stdout`, `stderr`). When it ends or times out
the leaf is killed and removed with whatever the hook left running.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path

from ...policy.task import Task
from ..exec import shim
from ..store import Placement, TaskRecord
from .lifecycle import Lifecycle, run_as, visible_devices

log = logging.getLogger("xhagent")

CHECKPOINT = "checkpoint"  # the hook's run directory, in the stopped attempt's
STOP_TIMEOUT_S = 3.0
OUTPUT_TAIL = 2000  # bytes of a failed checkpoint's output kept in its event


class Hook:
    """A checkpoint hook running in the task's leaf under a shim of its own: where its
    records are, the monotonic time it must end by, and what its end is for (the move's
    intent, the task, the move's detail)."""

    def __init__(self, lc: Lifecycle, rec: TaskRecord, started, run_dir: Path, timeout: float):
        self.lc, self.task_id, self.started = lc, rec.id, started
        self.attempt = rec.attempt
        self.run_dir, self.timeout = run_dir, timeout
        self.deadline = time.monotonic() + timeout
        self.intent: int | None = None
        self.task: Task | None = None
        self.detail: dict = {}

    def ended(self) -> bool:
        return shim.read_status(self.run_dir).exit is not None

    def wait(self) -> None:
        """Until it ended or ran out of time."""
        _wait_record(self.run_dir, max(0.0, self.deadline - time.monotonic()))

    def result(self) -> str | None:
        """Its outcome, once it ended or ran out of time: None, or why it failed. The leaf
        is killed and removed either way, with whatever the hook started and left there."""
        executor = self.lc.executor
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


def start_checkpoint(lc: Lifecycle, rec: TaskRecord, task: Task, detail: dict) -> Hook | None | str:
    """Start the task's checkpoint hook: the Hook, None when the task has none, or why it
    could not start."""
    hook = task.checkpoint
    if hook is None:
        return None
    placement = Placement.from_json(detail.get("placement") or {})
    env = dict(task.env) | visible_devices(placement)
    env |= {
        "XHAGENT_TASK_ID": rec.id,
        "XHAGENT_MIGRATE_FROM": detail["from"],
        "XHAGENT_MIGRATE_TO": detail["to"],
    }
    run_dir = lc.executor.run_dir(rec.id, rec.attempt) / CHECKPOINT
    if run_dir.exists():  # a run cut by a restart of the agent: this one starts afresh
        shutil.rmtree(run_dir)
    try:
        lc.executor.remove_leaf(rec.id)  # and kills what that run left running
        uid, gid = run_as(rec, task)
        # its own CPUs were given back at the stop, and may be another task's by now
        plan = lc.leaf_plan(task, lc.shared_cpus())
        started = lc.executor.start(
            rec.id, rec.attempt, plan, list(hook.command), env, task.working_dir, uid, gid, run_dir
        )
    except (OSError, ValueError) as exc:
        return f"checkpoint could not run: {exc}"
    out = Hook(lc, rec, started, run_dir, hook.timeout_ns / 1e9)
    out.detail = detail
    return out


def run_checkpoint(lc: Lifecycle, rec: TaskRecord, task: Task, detail: dict) -> str | None:
    """Run the task's checkpoint hook to its end (recovery's form, before the loop runs);
    None when it succeeded (or there is none), else why."""
    hook = start_checkpoint(lc, rec, task, detail)
    if not isinstance(hook, Hook):
        return hook
    hook.wait()
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
