"""Discrete-event simulation of one algorithm on a set of nodes.

Every slot (a CPU, GPU or TPU of a node) runs one job at a time; a job runs on a slot of
its device type and takes its `holds` resources when it is first dispatched, keeping them
until it completes. Events are arrivals, completions and, for time-sliced algorithms,
slice ends; after each batch of same-time events the ready queues are drained onto free
slots, and preemptive algorithms displace the worst-keyed running job when a waiting one
keys strictly better. A node may give its GPUs memory (`gpu_memory`, bytes each) and
shares (`gpu_shares`, jobs one GPU runs at once): then a GPU job with `gpu_memory` needs a
free share of a GPU *and* a free block of that GPU's memory (gpumem.py), allocated when
it starts and freed when it stops; under `dwps` a request that fails for fragmentation
may evict running jobs that key worse than it (dwps.py). Slot changes are committed
through `snapshot.VersionedSlots`, so the simulator exercises the same compare-and-set path
the agent uses. Nothing is random here: the same jobs give the same outcome.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..policy.policy import Migration, SchedulingPolicy
from . import queues
from .dwps import Dwps
from .fair import FairShare, twfs_slice_ns
from .gpumem import CAPACITY, FITS, FRAGMENTATION, GpuDevice
from .job import Job
from .migration import Move
from .migrator import Migrator
from .mlq import MultiLevel
from .pic import ResourceTable
from .queues import ReadyQueue, worst_first
from .slots import FreeSlots, NodeSpec, Slot, slots_of
from .snapshot import PreemptionDecision, VersionedSlots


class SimulationError(ValueError):
    pass


@dataclass
class JobRecord:
    job: Job
    first_start_ns: int | None = None
    finish_ns: int | None = None
    preemptions: int = 0
    migrations: int = 0

    @property
    def latency_ns(self) -> int:
        return self.finish_ns - self.job.arrival_ns

    @property
    def waiting_ns(self) -> int:
        return self.latency_ns - self.job.runtime_ns

    @property
    def missed(self) -> bool:
        return self.job.deadline_ns is not None and self.finish_ns > self.job.deadline_ns


@dataclass
class Outcome:
    algorithm: str
    records: list[JobRecord]
    slots: dict[str, int]  # device -> slot count
    busy_ns: dict[str, int]  # device -> slot-time spent running jobs
    makespan_ns: int
    preemptions: int = 0
    migrations: int = 0
    commits: int = 0
    intervals: list[tuple[str, str, int, int]] = field(
        default_factory=list
    )  # (slot, job, start, end)
    gpu_memory_modelled: bool = False
    # Jobs that could not start for lack of a large enough free block, counted once per
    # wait: FRAGMENTATION (enough free bytes on a GPU with a free share) or CAPACITY.
    failed_allocations: dict[str, int] = field(
        default_factory=lambda: {FRAGMENTATION: 0, CAPACITY: 0}
    )
    compactions: int = 0  # dwps: fragmentation failures turned into a start by an eviction
    failed_compactions: int = 0  # dwps: above the threshold, but no eviction made room
    threshold_path: list[tuple[int, float]] = field(default_factory=list)  # (ns, threshold)
    migration: Migration | None = None  # the controller's settings, when it ran
    moves: list[tuple[int, Move]] = field(default_factory=list)  # (ns, move) it enacted
    unenacted: int = 0  # moves dropped: the destination GPU's memory was too fragmented


# Events at one instant are all applied before the queues are drained, so their order
# only needs to be fixed for determinism.
_ARRIVE, _DONE, _SLICE, _ROUND = 0, 1, 2, 3


class Simulation:
    def __init__(
        self,
        jobs: list[Job],
        nodes: list[NodeSpec],
        algorithm: str,
        levels: MultiLevel | None = None,
        migration_cost_ns: int = 2_000_000,
        migration: Migration | None = None,
        policies: tuple[SchedulingPolicy, ...] = (),
    ):
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise SimulationError("job names must be unique")
        self.slots = slots_of(nodes)
        memory_of = {n.name: n.gpu_memory for n in nodes}
        self.gpus = {s.gpu: GpuDevice(memory_of[s.node]) for s in self.slots if s.gpu}
        largest_gpu = max((g.total for g in self.gpus.values()), default=0)
        devices = {s.device for s in self.slots}
        for job in jobs:
            if job.device not in devices:
                raise SimulationError(
                    f"job {job.name} needs a {job.device} but the nodes have none"
                )
            if self.gpus and job.device == "gpu" and job.gpu_memory > largest_gpu:
                raise SimulationError(
                    f"job {job.name} wants {job.gpu_memory} bytes of GPU memory, "
                    f"more than the largest GPU has ({largest_gpu})"
                )
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_ns, j.name))
        self.resources = ResourceTable()
        self.fair = FairShare(migration_cost_ns=migration_cost_ns)
        self.discipline = queues.discipline(
            algorithm, resources=self.resources, fair=self.fair, levels=levels
        )
        self.queues = {d: ReadyQueue(self.discipline) for d in devices}
        # The running jobs in key order, so that neither a preemption victim (worst first,
        # per device) nor fair share's least vruntime (best first) needs a scan of them all.
        self.victims = {d: ReadyQueue(worst_first(self.discipline)) for d in devices}
        self.least_running = ReadyQueue(self.discipline)
        self.state = VersionedSlots({s.id: None for s in self.slots})
        self.by_id = {s.id: s for s in self.slots}
        self.records = {j.name: JobRecord(j) for j in jobs}
        self.remaining = {j.name: j.runtime_ns for j in jobs}
        self.running: dict[str, tuple[Job, int]] = {}  # slot id -> (job, running since)
        self.slot_of: dict[str, str] = {}  # job name -> slot id, while it runs
        self.busy: dict[str, int] = {d: 0 for d in devices}  # running jobs per device
        self.free = FreeSlots(self.slots)
        self.finished = 0
        self.last_place: dict[str, tuple[str, int]] = {}
        self.token: dict[str, int] = {}
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0
        self.by_name = {j.name: j for j in jobs}
        self.dwps = Dwps() if algorithm == "dwps" else None
        self.failing: set[str] = set()  # jobs whose failed allocation is already counted
        self.out = Outcome(
            algorithm,
            [],
            {d: sum(s.device == d for s in self.slots) for d in devices},
            {d: 0 for d in devices},
            0,
            gpu_memory_modelled=bool(self.gpus),
        )
        if self.dwps is not None:
            self.out.threshold_path.append((0, self.dwps.threshold.value))
        # The migration controller (migration.py): a round every interval, while jobs remain.
        self.migrator = None
        if migration is not None:
            self.migrator = Migrator(migration, nodes, self.slots, policies, bool(self.gpus))
            self.out.migration = migration

    # -- events -------------------------------------------------------------------------
    def _at(self, t: int, kind: int, name: str, token: int = 0) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), name, token))

    def run(self, progress: Callable[[int, int], None] | None = None) -> Outcome:
        """Simulate every job; `progress(finished, total)` is called now and then."""
        for job in self.jobs:
            self._at(job.arrival_ns, _ARRIVE, job.name)
        if self.migrator is not None and self.jobs:
            start = self.jobs[0].arrival_ns
            self.migrator.last_ns = start
            self._at(start + self.migrator.policy.interval_ns, _ROUND, "")
        by_name = self.by_name
        batches = 0
        while self.events:
            if self.events[0][1] == _ROUND and self.finished == len(self.jobs):
                break  # no job left to move: the round would only stretch the makespan
            batches += 1
            if progress is not None and batches % 4096 == 0:
                progress(self.finished, len(self.jobs))
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, kind, _, name, token = heapq.heappop(self.events)
                if kind == _ROUND:
                    self._round()
                    continue
                job = by_name[name]
                if kind == _ARRIVE:
                    self._ready(job)
                elif self.token.get(name) == token:
                    (self._complete if kind == _DONE else self._slice_end)(job)
            self._dispatch()
        self.out.records = [self.records[j.name] for j in self.jobs]
        self.out.makespan_ns = self.now - (self.jobs[0].arrival_ns if self.jobs else 0)
        self.out.commits = self.state.version
        return self.out

    def _ready(self, job: Job) -> None:
        if self.discipline.time_sliced:
            self.fair.enqueue(job)
        self.queues[job.device].push(job)

    def _complete(self, job: Job) -> None:
        self._stop(job)
        self.records[job.name].finish_ns = self.now
        self.finished += 1
        for woken in self.resources.release(job):
            self._ready(woken)
        self._rekey_holders()
        self.fair.forget(job)
        if self.migrator is not None:
            self.migrator.done(job.name)

    def _slice_end(self, job: Job) -> None:
        slot = self._stop(job)
        queue = self.queues[job.device]
        best = queue.peek()
        if best is not None and self.discipline.key(best) < self.discipline.key(job):
            self.records[job.name].preemptions += 1
            self.out.preemptions += 1
            queue.push(job)
        else:
            self._start(job, slot)

    # -- slots ----------------------------------------------------------------------------
    def _stop(self, job: Job) -> Slot:
        slot_id = self.slot_of.pop(job.name)
        _, since = self.running.pop(slot_id)
        self.busy[job.device] -= 1
        self.victims[job.device].remove(job)
        self.least_running.remove(job)
        self.free.release(self.by_id[slot_id])
        if self._uses_memory(job):
            self.gpus[self.by_id[slot_id].gpu].release(job.name)
        ran = self.now - since
        if self.migrator is not None:
            self.migrator.ran(self.by_id[slot_id], ran)
        if ran:
            self.out.intervals.append((slot_id, job.name, since, self.now))
        self.remaining[job.name] -= ran
        self.out.busy_ns[job.device] += ran
        if self.discipline.time_sliced:
            self.fair.charge(job, ran)
        self.token[job.name] = self.token.get(job.name, 0) + 1
        self.state.commit(PreemptionDecision(evict=(job.name,)), self.state.version)
        return self.by_id[slot_id]

    def _start(self, job: Job, slot: Slot) -> None:
        record = self.records[job.name]
        if record.first_start_ns is None:
            record.first_start_ns = self.now
        previous = self.last_place.get(job.name)
        if previous is not None and previous != slot.place:
            record.migrations += 1
            self.out.migrations += 1
            if self.discipline.time_sliced:
                self.fair.migrate(job, previous, slot.place)
        self.last_place[job.name] = slot.place
        self.state.commit(PreemptionDecision(place={slot.id: job.name}), self.state.version)
        if self._uses_memory(job):
            placed = self.gpus[slot.gpu].allocate(job.name, job.gpu_memory)
            assert placed is not None, f"{job.name} started on {slot.id} without room"
            self.failing.discard(job.name)
        self.running[slot.id] = (job, self.now)
        self.slot_of[job.name] = slot.id
        self.busy[job.device] += 1
        self.victims[job.device].push(job)
        self.least_running.push(job)
        self.free.take(slot)
        token = self.token.get(job.name, 0) + 1
        self.token[job.name] = token
        self._at(self.now + self.remaining[job.name], _DONE, job.name, token)
        if self.discipline.time_sliced:
            quantum = twfs_slice_ns(job, self.busy[job.device] / self.out.slots[job.device])
            if quantum < self.remaining[job.name]:
                self._at(self.now + quantum, _SLICE, job.name, token)

    # -- migration ----------------------------------------------------------------------
    def _round(self) -> None:
        free = {self.slots[i].id for i in self.free.free}
        for move in self.migrator.round(self.now, self.running, free, self.fair):
            self._move(move)
        self._at(self.now + self.migrator.policy.interval_ns, _ROUND, "")

    def _move(self, move: Move) -> None:
        """Stop the job, charge fair share's penalty and the checkpoint, restart it on a
        free slot of the destination device."""
        job = self.by_name[move.task]
        unit = self.migrator.units[self.migrator.by_id[move.dst]]
        dst = next(s for s in unit.slots if self.free.index[s.id] in self.free.free)
        kind = unit.kind
        moved = job if kind == job.device else replace(job, device=kind)
        if self._uses_memory(moved) and self.gpus[dst.gpu].verdict(moved.gpu_memory) != FITS:
            self.out.unenacted += 1
            return
        src = self._stop(job)
        self.by_name[job.name] = moved
        for resource, holder in self.resources.holder.items():
            if holder.name == job.name:
                self.resources.holder[resource] = moved
        self.remaining[job.name] += self.migrator.policy.checkpoint_ns
        self.fair.migrate(moved, src.place, dst.place)
        self.records[job.name].migrations += 1
        self.out.migrations += 1
        self.last_place[job.name] = dst.place  # counted here, not again by _start
        self.out.moves.append((self.now, move))
        self._start(moved, dst)

    def _free_slot(self, job: Job) -> Slot | None:
        """A free slot of the job's device, where it last ran if possible, else on its node
        (the first such in slot order)."""
        last = self.last_place.get(job.name)
        if last is not None:
            slot = self.free.first(job.device, *last) or self.free.first(job.device, last[0])
            if slot is not None:
                return slot
        return self.free.first(job.device)

    def _victim(self, job: Job) -> Slot | None:
        """The running job of the same device that keys worst, if `job` keys strictly better."""
        worst = self.victims[job.device].peek()
        if worst is None or not self.discipline.key(job) < self.discipline.key(worst):
            return None
        slot = self.by_id[self.slot_of[worst.name]]
        if self._uses_memory(job):
            # A job that has a free share waits for memory, which only dwps evicts for; one
            # that has none may take a share whose eviction also leaves room in memory.
            if any(self.free.first("gpu", gpu) for gpu in self.gpus):
                return None
            memory = self.gpus[slot.gpu].memory
            held = self.gpus[slot.gpu].by_owner.get(worst.name)
            room = memory.largest_free() if held is None else memory.hole_without(held)
            if max(room, memory.largest_free()) < job.gpu_memory:
                return None
        return slot

    def _preempt(self, victim: Job) -> None:
        self._stop(victim)
        self.records[victim.name].preemptions += 1
        self.out.preemptions += 1
        self.queues[victim.device].push(victim)

    # -- GPU memory ---------------------------------------------------------------------
    def _uses_memory(self, job: Job) -> bool:
        return job.device == "gpu" and job.gpu_memory > 0 and bool(self.gpus)

    def _place(self, job: Job) -> Slot | None:
        """A free share of the first GPU whose memory has a block for the job; under dwps,
        one made by evicting a worse-keyed job. A job that finds free shares but no block
        counts as one failed allocation until it starts; with no free share it just waits."""
        fragmented, any_share = [], False
        for gpu, device in self.gpus.items():
            slot = self.free.first("gpu", gpu)
            if slot is None:
                continue
            any_share = True
            verdict = device.verdict(job.gpu_memory)
            if verdict == FITS:
                return slot
            if verdict == FRAGMENTATION:
                fragmented.append(slot)
        if self.dwps is not None:
            for slot in fragmented:
                if self._compact(job, slot):
                    return slot
        if any_share and job.name not in self.failing:
            self.failing.add(job.name)
            self.out.failed_allocations[FRAGMENTATION if fragmented else CAPACITY] += 1
        return None

    def _compact(self, job: Job, slot: Slot) -> bool:
        """DWPS on `slot`'s GPU: above the threshold, evict the best-fitting job that keys
        worse than `job` (only those are preemptible here); adapt the threshold."""
        key = self.discipline.key(job)
        memory = self.gpus[slot.gpu].memory
        before = self.dwps.threshold.value
        done = self.dwps.compact(
            memory, job.gpu_memory, lambda owner: key < self.discipline.key(self.by_name[owner])
        )
        if done is None:
            return False
        if done.victim is not None:
            self._preempt(self.by_name[done.victim.owner])
            self.out.compactions += 1
        else:
            self.out.failed_compactions += 1
        if self.dwps.threshold.value != before:
            self.out.threshold_path.append((self.now, self.dwps.threshold.value))
        return done.victim is not None

    def _rekey_holders(self) -> None:
        # Holders' keys move with the deadlines lent to them (edf-pic), queued or running.
        for holder in {h.name: h for h in self.resources.holder.values()}.values():
            self.queues[holder.device].update(holder)
            self.victims[holder.device].update(holder)
            self.least_running.update(holder)

    def _dispatch(self) -> None:
        for queue in self.queues.values():
            while (job := queue.peek()) is not None:
                started = self.records[job.name].first_start_ns is not None
                if not started and self.resources.blockers(job):
                    queue.pop()
                    self.resources.acquire(job)  # registers the wait, lends the deadline
                    self._rekey_holders()
                    continue
                slot = self._place(job) if self._uses_memory(job) else self._free_slot(job)
                if slot is None and self.discipline.preemptive:
                    slot = self._victim(job)
                    if slot is not None:
                        self._preempt(self.running[slot.id][0])
                if slot is None:
                    break
                queue.pop()
                if not started:
                    self.resources.acquire(job)
                self._start(job, slot)
            if self.discipline.time_sliced:
                self.fair.advance(
                    self.fair.key(j)
                    for j in (self.least_running.peek(), queue.peek())
                    if j is not None
                )
