"""Fair share on the node (`spec.queueing: {algorithm: fair}`): each task's vruntime, charged
from the CPU time its leaf really used, and its TWFS time slice.

The vruntimes live in one `sched.fair.FairShare`, the simulator's own: a task joins it at
the least vruntime when the order first ranks it (ranking.py), each step charges the
running tasks what their leaves' `cpu.stat usage_usec` grew by since, weighted by priority
(1024 at 50, doubling every 10 points), and a move the migration controller makes is
charged its distance-weighted penalty (migration.py). So `xhagent simulate --algorithm
fair` and the node rank by the same arithmetic, the node on measured run time.

Slices: a task holding CPUs of its own gets a TWFS slice when it starts or resumes
(`twfs_slice_ns` at the node's load then: 100 ms at full load, shorter below, at least
NODE_MIN_SLICE_NS). Until it ends the task is no victim of the order; once over, a waiting
task of less vruntime takes its place (preemption.py: with `preemption: queueing`,
Pending tasks through placement, Frozen ones taking back their own CPUs when no others are
free), else it runs another slice. The loop wakes when a waiting task may first take a
running one's place (that one's slice over and its vruntime grown past the waiter's): a
queue with nobody to switch to costs no wake-ups. Tasks that share CPUs hold no slot to
give up and are not sliced.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...policy.policy import queueing_in_force
from ...sched.fair import NICE_0, FairShare, twfs_slice_ns
from ...sched.job import Job
from .lifecycle import Lifecycle
from .ranking import queued_job, standing_of

# The shortest slice on the node. TWFS goes down to 1 ms below half load, but a switch
# here is a freeze and a thaw, a step of the loop and its commits each: milliseconds.
NODE_MIN_SLICE_NS = 10_000_000


class Fairness:
    def __init__(self, lc: Lifecycle, wakeups):
        self.share = FairShare()
        self._lc = lc
        self._wakeups = wakeups
        self.active = False  # `fair` is the node's order now
        # task id -> (its attempt, the attempt's leaf's usage_usec charged so far)
        self._charged: dict[str, tuple[int, int]] = {}
        self._slice_end: dict[str, int] = {}  # task id -> the clock's time its slice ends
        # the most vruntime of a task whose slice is over this step (None: none is)
        self._over_at: float | None = None
        self._policies: list = []
        self._jobs: dict[str, tuple[Job | None, int]] = {}  # the step's, by task id

    # -- a step ---------------------------------------------------------------------------
    def begin(self, policies) -> None:
        """Before the step decides anything: charge what the sliced tasks ran since the
        last step, and start a slice for each that has none (it started or resumed)."""
        self._policies = policies
        self.active = queueing_in_force(policies)[0] == "fair"
        self._jobs, self._over_at = {}, None
        if not self.active:  # (another order now: what fair kept is of no use)
            self._charged.clear()
            self._slice_end.clear()
            self.share.vruntime.clear()
            self.share.weight.clear()
            return
        now, load = self._lc.clock(), self.load()
        sliced = self._sliced()
        # a frozen task keeps what it was charged (its leaf's count stays); one that left
        # its place starts again from a fresh leaf
        placed = {a.task for _, a in self._lc.cluster.placed()}
        self._charged = {t: u for t, u in self._charged.items() if t in placed}
        self._slice_end = {t: e for t, e in self._slice_end.items() if t in sliced}
        for task_id in sliced:
            job, attempt = self._job(task_id)
            if job is None:
                continue
            used = self._lc.executor.cpu_usage(task_id)
            if used is not None:
                # each attempt runs in a fresh leaf, counting from 0 (a move is one too)
                seen, before = self._charged.get(task_id, (attempt, 0))
                ran = used - (before if seen == attempt else 0)
                if ran > 0:
                    self.share.charge(job, ran * 1000)
                self._charged[task_id] = (attempt, used)
            end = self._slice_end.setdefault(task_id, now + slice_ns(job, load))
            if end <= now:
                vr = self.share.key(job)
                self._over_at = vr if self._over_at is None else max(self._over_at, vr)

    def due(self, task_id: str) -> bool:
        """Whether `task_id`'s slice is over: the order may give its place to another."""
        end = self._slice_end.get(task_id)
        return self.active and end is not None and end <= self._lc.clock()

    @property
    def displacing(self) -> bool:
        """Whether a slice is over this step: a waiting task may then take a place it could
        not before (`may_displace`)."""
        return self._over_at is not None

    def may_displace(self, key: tuple) -> bool:
        """Whether a waiting task of order `key` (fair's: its vruntime first) is ranked
        before a task whose slice is over: only such a one may take a place this step
        that it could not take before."""
        return self._over_at is not None and key[0] <= self._over_at

    def end(self, waiting: Iterable[str], frozen: Iterable[str]) -> None:
        """After the step: a slice that ran out and kept its task running starts another;
        min_vruntime follows the least vruntime still competing; vruntimes of tasks that
        neither hold a place nor wait (`waiting`: the Pending window) are forgotten. The
        loop wakes when a waiting task (Pending or Frozen) may first take a running one's
        place: its slice over, and its vruntime past the waiter's."""
        if not self.active:
            return
        waiting, frozen = list(waiting), list(frozen)
        now, load = self._lc.clock(), self.load()
        sliced = self._sliced()
        vr = self.share.vruntime
        for task_id in sliced:
            end = self._slice_end.get(task_id)
            job, _ = self._job(task_id)
            if job is not None and (end is None or end <= now):
                self._slice_end[task_id] = now + slice_ns(job, load)
        self.share.advance([vr[t] for t in (*sliced, *waiting[:1]) if t in vr])
        keep = {a.task for _, a in self._lc.cluster.placed()} | set(waiting)
        for task_id in [t for t in vr if t not in keep]:
            self.share.vruntime.pop(task_id, None)
            self.share.weight.pop(task_id, None)
        best = min((vr[t] for t in (*waiting, *frozen) if t in vr), default=None)
        if best is not None:
            wake = [self._displaceable_at(t, best, now) for t in sliced if t in self._slice_end]
            if wake:
                self._wakeups.at(min(wake))

    def _displaceable_at(self, task_id: str, best: float, now: int) -> int:
        """The earliest time a waiter of vruntime `best` may take `task_id`'s place: its
        slice over, and its vruntime grown to `best` (at most as fast as its CPUs run)."""
        behind = best - self.share.vruntime.get(task_id, self.share.min_vruntime)
        cpus = next((len(a.cpus) for _, a in self._lc.cluster.placed() if a.task == task_id), 1)
        weight = self.share.weight.get(task_id, NICE_0)
        catch_up = int(max(0.0, behind) * weight / NICE_0 / max(1, cpus))
        return max(self._slice_end[task_id], now + catch_up)

    # -- what it reads ----------------------------------------------------------------------
    def load(self) -> float:
        """The share of the node's CPUs that tasks hold alone: TWFS's CPU load."""
        cpus = len(self._lc.node.allocatable_cpus)
        held = sum(len(a.cpus) for _, a in self._lc.cluster.placed())
        return held / cpus if cpus else 1.0

    def vruntime_ns(self, task_id: str) -> float | None:
        return self.share.vruntime.get(task_id)

    def moved(self, task_id: str, penalty_ns: float) -> None:
        """A move the migration controller made: its penalty charged as vruntime."""
        if penalty_ns:
            self.share.add(task_id, penalty_ns)

    def _sliced(self) -> list[str]:
        """The tasks holding CPUs of their own (Starting or Running: a frozen task's CPUs
        are given back)."""
        return [a.task for _, a in self._lc.cluster.placed() if a.cpus]

    def _job(self, task_id: str) -> tuple[Job | None, int]:
        """The task as the order sees it (its standing's priority weighs its run time),
        and its attempt."""
        if task_id not in self._jobs:
            task, rec = self._lc.spec(task_id), self._lc.store.get(task_id)
            got: tuple[Job | None, int] = (None, 0)
            if task is not None and rec is not None:
                s = standing_of(task, rec.created_ns, self._policies)
                got = (queued_job(task_id, task, rec.created_ns, s), rec.attempt)
            self._jobs[task_id] = got
        return self._jobs[task_id]


def slice_ns(job: Job, load: float) -> int:
    """A task's slice on the node: TWFS's (`twfs_slice_ns`), at least NODE_MIN_SLICE_NS."""
    return max(NODE_MIN_SLICE_NS, twfs_slice_ns(job, load))
