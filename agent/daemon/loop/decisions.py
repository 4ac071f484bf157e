"""One step's placement decisions, shared by the tasks that ask the same.

Tasks of equal demand (the same `Demand` under the same preemption rule: one `Ask`) get
the same answer from the same placement state, so a step decides each demand once while
the state is unchanged (`Cluster.version`: a start, a stop or a preemption changes it, and
the next task decides again). Nor does a demand that found no victims look for them again
in that state: the step goes in the order of standing, so a later task of the same demand
may take the place of fewer running tasks (a subset of the same ones), and freeing less
never makes a demand fit where freeing more did not. That holds but for demands placed by
their peers (affinity), whose fit a victim's leaving may break: those ask each time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...policy.placement import FRAGMENTED, Candidate, Demand, decide_demand
from ...policy.task import Task
from ..store import TaskRecord, WaitReason
from .fairness import Fairness
from .gpumemory import GpuMemoryModel
from .lifecycle import Lifecycle
from .preemption import preempt_for


@dataclass(frozen=True, eq=False)  # one per distinct demand (PendingWindow.shared): identity
class Ask:
    demand: Demand
    rule: str  # the preemption rule of the task's policy


class StepDecisions:
    def __init__(
        self,
        lc: Lifecycle,
        policies,
        share: Callable[[tuple], tuple] = lambda r: r,
        inherited: Callable[[str], int | None] = lambda task_id: None,
        fairness: Fairness | None = None,
        gpu_memory: GpuMemoryModel | None = None,
    ):
        self._lc = lc
        self._gpu_memory = gpu_memory  # the GPUs' lines under dwps
        self._policies = policies
        self._inherited = inherited  # a holder's deadline lent by its waiter (edf-pic)
        self._fairness = fairness  # whose slices are over (fair)
        self._share = share  # equal reasons as one object, from one step to the next
        self._version: int | None = None  # the placement state the answers below hold for
        self._unfit: dict[Ask, tuple[WaitReason, ...]] = {}
        self._no_victims: set[Ask] = set()

    def place(self, ask: Ask, rec: TaskRecord, task: Task) -> Candidate | tuple[WaitReason, ...]:
        """Where `rec` goes now (its victims already stopped), or why it waits."""
        cluster = self._lc.cluster
        if self._gpu_memory is not None:
            self._gpu_memory.sync()  # the lines as the state holds them, before it is read
        if cluster.version != self._version:
            self._unfit.clear()
            self._no_victims.clear()
            self._version = cluster.version
        reasons = self._unfit.get(ask)
        if reasons is None:
            decision = decide_demand(rec.id, ask.demand, cluster)
            if decision.placed is not None:
                return decision.placed
            reasons = self._share(
                tuple(WaitReason(r.kind, r.node, str(r)) for r in decision.reasons)
            )
            self._unfit[ask] = reasons
        if ask in self._no_victims:
            return reasons
        gpus = self._gpu_memory
        if (
            gpus is not None
            and any(r.kind == FRAGMENTED for r in reasons)
            and gpus.compact(rec, task, ask.demand, self._policies)
        ):
            gpus.sync()
            placed = decide_demand(rec.id, ask.demand, cluster).placed
            if placed is not None:
                return placed
        placed = preempt_for(
            self._lc, rec, task, ask.demand, self._policies, self._inherited, self._fairness
        )
        if placed is not None:
            return placed
        if cluster.version == self._version and not ask.demand.needs_peers:
            self._no_victims.add(ask)
        return reasons
