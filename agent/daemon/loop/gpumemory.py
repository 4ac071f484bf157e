"""The node's GPU memory as lines of bytes, for `dwps` (a SchedulingPolicy's
`spec.queueing.algorithm: dwps`): the simulator's fragmentation model and its decision,
run on the node.

While dwps is the order in force, each of the node's GPUs is a line of the memory the
inventory found free on it (`sched.gpumem.GpuDevice`, the simulator's): every task holding
a share of the GPU is an allocation on the line, placed first fit when the agent first
sees it hold the share and kept where it is until it gives the share back. Its size is its
reservation, or what NVML says its processes use where that is more (sampled every
USE_SAMPLE_S, each process found in a task by its cgroup): a task that outgrows its place
grows into the free bytes after it, else moves to the first block that holds it, as a
reallocation would. Placement then gives a share of a GPU only where one free block holds
the request (`GpuState.largest_block`); a request that finds the bytes but no block waits
as `GpuMemoryFragmented`.

For such a request (one GPU share) `sched.dwps.Dwps` decides, as it does in the simulator
and with the same adaptive threshold: above it, the Running task whose eviction leaves the
best-fitting block is evicted, of those the node's order (EDF) ranks after the request and
that allow preemption (unless the request's own policy says `preemption: never`); the
request then takes the block. An eviction is a kill and a
requeue (a frozen task would keep its memory), its note says why, and the request gets a
`GpuCompacted` event. Without dwps in force no line is kept and a share needs free bytes
only, as before.

The lines are the agent's model: NVML tells sizes, not where on the GPU the bytes lie. A
restart of the agent lays the holdings out again, first fit in the order it recovers them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...policy.placement import Demand, suitable_gpus
from ...policy.policy import choose
from ...policy.preemption import Standing as Victim
from ...policy.state import NodeResources
from ...policy.task import Task
from ...quantity import human
from ...sched.dwps import Dwps
from ...sched.gpumem import FRAGMENTATION, GpuDevice
from ..store import TaskRecord, TaskState
from .lifecycle import Lifecycle
from .nvml import Nvml
from .preemption import stop_victim
from .ranking import Ranking, standing_of

log = logging.getLogger("xhagent")

ALGORITHM = "dwps"
USE_SAMPLE_S = 1.0  # how often NVML is asked what each task's processes use
COMPACTED = "GpuCompacted"


class GpuMemoryModel:
    def __init__(
        self,
        lc: Lifecycle,
        nvml: Nvml,
        task_of_pid: Callable[[int], str | None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._lc, self._task_of_pid, self._clock = lc, task_of_pid, clock
        self.nvml = nvml
        self.dwps = Dwps()
        self.active = False
        self.lines: dict[int, GpuDevice] = {}  # GPU index -> its line, while active
        self._used: dict[tuple[str, int], int] = {}  # (task, GPU) -> bytes NVML saw it use
        self._sampled = float("-inf")
        self._synced: int | None = None  # the cluster version the lines were last made for
        self._unplaced: set[tuple[str, int]] = set()  # on no line: no block held them

    def _node(self) -> NodeResources:
        return self._lc.cluster.nodes[self._lc.node.name]

    def begin(self, algorithm: str) -> None:
        """At each step: lines kept while `algorithm` (the order in force) is dwps and the
        node has GPUs, NVML sampled when due; dropped otherwise."""
        st = self._node()
        on = algorithm == ALGORITHM and bool(st.gpus)
        if on != self.active:
            self.active, self._synced = on, None
            self.lines.clear()
            self._used.clear()
            self._unplaced.clear()
            for g in st.gpus:
                g.largest_block = None
            self._lc.cluster.touch()
        if on and self._clock() - self._sampled >= USE_SAMPLE_S:
            self.sample()
        self.sync()

    def sync(self) -> None:
        """The lines made to hold what the placement state holds now (once per change)."""
        cluster = self._lc.cluster
        if not self.active or self._synced == cluster.version:
            return
        st = self._node()
        want: dict[int, dict[str, int]] = {g.index: {} for g in st.gpus}
        for a in st.tasks.values():
            for share in a.gpus:
                if not share.whole:
                    used = self._used.get((a.task, share.index), 0)
                    want[share.index][a.task] = max(share.memory, used)
        self._unplaced = {(t, i) for t, i in self._unplaced if t in want.get(i, {})}
        for g in st.gpus:
            line = self.lines.get(g.index)
            if line is None:
                line = self.lines[g.index] = GpuDevice(max(g.base_free, 1))
            wanted = want[g.index]
            for owner in [o for o in line.by_owner if o not in wanted]:
                line.release(owner)
            for owner, size in wanted.items():
                held = line.by_owner.get(owner)
                placed = line.allocate(owner, size) if held is None else held
                if placed is not None and held is not None and held.size != size:
                    line.resize(owner, size)  # False: too big for any block, kept as it was
                if placed is None and (owner, g.index) not in self._unplaced:
                    self._unplaced.add((owner, g.index))
                    log.warning(
                        "dwps: %s's %s on GPU %d fits no free block of the model's line; "
                        "it is left off the line",
                        owner,
                        human(size),
                        g.index,
                    )
            g.largest_block = line.memory.largest_free()
        self._synced = cluster.version

    def sample(self) -> None:
        """What each task's processes use on each GPU, from NVML now (a step does it every
        USE_SAMPLE_S); the lines follow at the next sync."""
        self._sampled = self._clock()
        used: dict[tuple[str, int], int] = {}
        for index, processes in self.nvml.process_memory(self._lc.node.gpus).items():
            for pid, nbytes in processes.items():
                task = self._task_of_pid(pid)
                if task is not None:
                    used[task, index] = used.get((task, index), 0) + nbytes
        if used != self._used:
            self._used = used
            self._lc.cluster.touch()

    def compact(self, rec: TaskRecord, task: Task, demand: Demand, policies) -> bool:
        """DWPS for `rec`, whose request of one GPU share finds the bytes on a GPU but no
        block: evict the task `Dwps.compact` chooses there; True when one was evicted (the
        caller decides again), False when dwps is not in force, the fragmentation is under
        the threshold, or no eviction makes room."""
        if not self.active or demand.gpus != 1 or demand.gpu_memory is None:
            return False
        match = choose(policies, task.label_map)
        if match.policy is not None and match.policy.preemption == "never":
            return False  # its policy lets it take no running task's place
        self.sync()
        suitable = suitable_gpus(demand, self._node())
        if not isinstance(suitable, list):
            return False
        lc, need = self._lc, demand.gpu_memory
        ranking = Ranking(policies)
        mine = ranking.key(rec.id, task, rec.created_ns)

        def movable(owner: str) -> bool:
            other, spec = lc.store.get(owner), lc.spec(owner)
            if other is None or spec is None or other.state != TaskState.RUNNING:
                return False
            return spec.preemption != "never" and ranking.key(owner, spec, other.created_ns) > mine

        for g in sorted(suitable, key=lambda g: g.index):
            line = self.lines.get(g.index)
            if g.whole or line is None or line.verdict(need) != FRAGMENTATION:
                continue
            done = self.dwps.compact(line.memory, need, movable)
            if done is None or done.victim is None:
                continue
            owner = done.victim.owner
            victim_task = lc.spec(owner)
            s = standing_of(victim_task, lc.store.get(owner).created_ns, policies)
            held = self._node().tasks[owner]
            why = (
                f"GPU {g.index} memory fragmented ({done.fragmentation:.2f} over "
                f"{done.threshold:.2f})"
            )
            if not stop_victim(lc, Victim(held, s.priority, s.deadline_ns, "kill"), rec.id, why):
                return False
            lc.store.add_event(
                COMPACTED,
                f"evicted {owner} from GPU {g.index}: {why}, {human(need)} needed in one block",
                task_id=rec.id,
                detail={
                    "gpu": g.index,
                    "evicted": owner,
                    "fragmentation": round(done.fragmentation, 4),
                    "threshold": done.threshold,
                    "need": need,
                },
            )
            return True
        return False
